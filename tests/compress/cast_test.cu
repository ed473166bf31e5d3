// SPDX-License-Identifier: Apache-2.0
// GPU: fp16/bf16 cast kernels on the CUDA executor == CPU executor, bit for
// bit, and the ring's hop (decode_add_encode).
#include "gpu_compare.cuh"

using namespace gpu_compare;

TEST(CastKernelsGpu, BitIdenticalToCpu) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  compare_codecs(1, cx::fp16_codec{}, cx::bf16_codec{});
}

template <class Codec>
void compare_hop(const Codec& c, std::size_t n, unsigned seed) {
  auto run = normal_vec(n, seed);
  for (auto& x : run) x *= 1e4f;
  const auto own = normal_vec(n, seed + 1), res0 = normal_vec(n, seed + 2);
  const std::size_t eb = c.max_encoded_bytes(n);
  ef::exec::cpu_executor hx;
  std::vector<std::byte> in(eb), h_out(eb);
  c.encode(hx, run.data(), nullptr, in.data(), n);
  std::vector<float> h_res = res0;
  c.decode_add_encode(hx, in.data(), own.data(), h_res.data(), h_out.data(), n);
  ef::exec::cuda_executor dx;
  dbuf<std::byte> d_in(in), d_out(eb);
  dbuf<float> d_own(own), d_res(res0);
  c.decode_add_encode(dx, d_in.p, d_own.p, d_res.p, d_out.p, n);
  dx.wait();
  ASSERT_EQ(d_out.host(), h_out) << c.name() << " n=" << n;
  const auto r = d_res.host();
  EXPECT_EQ(std::memcmp(r.data(), h_res.data(), n * 4), 0) << c.name() << " residual, n=" << n;
}

TEST(CastKernelsGpu, RingHopBitIdenticalToCpu) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  unsigned seed = 7;
  for (std::size_t n : sizes()) {
    compare_hop(cx::fp16_codec{}, n, seed++);
    compare_hop(cx::bf16_codec{}, n, seed++);
  }
}
