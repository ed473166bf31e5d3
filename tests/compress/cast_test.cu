// SPDX-License-Identifier: Apache-2.0
// GPU: fp16/bf16 cast kernels on the CUDA executor == CPU executor, bit for bit,
// plain and scaled, and the range scan the compressed allreduce scales by.
#include "gpu_compare.cuh"

#include <limits>

using namespace gpu_compare;

TEST(CastKernelsGpu, BitIdenticalToCpu) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  compare_codecs(1, cx::fp16_codec{}, cx::bf16_codec{});
  compare_codecs(3, cx::fp16_codec{}.with_scale(0x1p-3f), cx::bf16_codec{}.with_scale(0x1p20f));
}

TEST(CastKernelsGpu, RangeScanBitIdenticalToCpu) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  for (std::size_t n : sizes()) {
    auto in = normal_vec(n, 5);
    if (n > 2) in[n / 2] = std::numeric_limits<float>::infinity();
    const std::size_t nb = cx::kernels::blocks_of(n);
    std::vector<std::uint32_t> h(2 * nb);
    const cx::kernels::finite_amax host{in.data(), h.data(), n};
    for (std::size_t b = 0; b < nb; ++b) host(b);
    dbuf<float> d_in(in);
    dbuf<std::uint32_t> d(2 * nb);
    ef::exec::cuda_executor dx;
    dx.bulk(nb, cx::kernels::finite_amax{d_in.p, d.p, n});
    dx.wait();
    ASSERT_EQ(d.host(), h) << "n=" << n;
  }
}
