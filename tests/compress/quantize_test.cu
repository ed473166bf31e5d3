// SPDX-License-Identifier: Apache-2.0
// GPU: int8/int4 stochastic quantisation (Philox) on the CUDA executor ==
// CPU executor, bit for bit, for the same seed and stream.
#include "gpu_compare.cuh"

using namespace gpu_compare;

namespace {
struct philox_fill {
  cx::detail::philox_stream rng;
  std::uint32_t* out;
  __host__ __device__ void operator()(std::size_t i) const {
    const auto r = rng(i);
    out[4 * i] = r.x, out[4 * i + 1] = r.y, out[4 * i + 2] = r.z, out[4 * i + 3] = r.w;
  }
};
}  // namespace

TEST(QuantizeKernelsGpu, PhiloxStreamsMatch) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const std::size_t n = 1 << 16;
  std::vector<std::uint32_t> h(4 * n);
  ef::exec::cpu_executor hx;
  hx.bulk(n, philox_fill{{42, 7}, h.data()});
  dbuf<std::uint32_t> d(4 * n);
  ef::exec::cuda_executor dx;
  dx.bulk(n, philox_fill{{42, 7}, d.p});
  dx.wait();
  EXPECT_EQ(d.host(), h);
}

TEST(QuantizeKernelsGpu, BitIdenticalToCpu) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  compare_codecs(3, cx::int8_codec{}, cx::int4_codec{});
}
