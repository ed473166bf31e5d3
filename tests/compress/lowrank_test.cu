// SPDX-License-Identifier: Apache-2.0
// GPU: PowerSGD kernels (P = MQ, device Gram-Schmidt, Q = M^T P, residual,
// reconstruction) on the CUDA executor == CPU executor, bit for bit.
#include <ebbflow/compress/kernels/orthogonalize.cuh>

#include "gpu_compare.cuh"

using namespace gpu_compare;

TEST(LowRankKernelsGpu, PowerSgdStepBitIdenticalToCpu) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  for (cx::matrix_shape s :
       {cx::matrix_shape{1, 1}, cx::matrix_shape{37, 5}, cx::matrix_shape{300, 257}, cx::matrix_shape{1031, 64}}) {
    for (std::size_t rank : {1u, 4u, 8u}) {
      cx::powersgd_codec c(rank);
      const std::size_t r = c.rank_for(s);
      const auto m = normal_vec(s.size(), 11);
      ef::exec::cpu_executor hx;
      std::vector<float> hq(s.cols * r), hp(s.rows * r), hq2(s.cols * r), hres(s.size()), hout(s.size());
      c.init_q(hx, hq.data(), s, 99);
      c.compute_p(hx, m.data(), hq.data(), hp.data(), s);
      c.orthogonalize(hx, hp.data(), s);
      c.compute_q(hx, m.data(), hp.data(), hq2.data(), s);
      c.residual(hx, m.data(), hp.data(), hq2.data(), hres.data(), s);
      c.reconstruct(hx, hp.data(), hq2.data(), hout.data(), s);

      ef::exec::cuda_executor dx;
      dbuf<float> dm(m), dq(hq.size()), dp(hp.size()), dq2(hq2.size()), dres(hres.size()), dout(hout.size());
      c.init_q(dx, dq.p, s, 99);
      c.compute_p(dx, dm.p, dq.p, dp.p, s);
      c.orthogonalize(dx, dp.p, s);
      c.compute_q(dx, dm.p, dp.p, dq2.p, s);
      c.residual(dx, dm.p, dp.p, dq2.p, dres.p, s);
      c.reconstruct(dx, dp.p, dq2.p, dout.p, s);
      dx.wait();
      EXPECT_EQ(dq.host(), hq);
      EXPECT_EQ(dp.host(), hp) << s.rows << "x" << s.cols << " r" << r;
      EXPECT_EQ(dq2.host(), hq2);
      EXPECT_EQ(dres.host(), hres);
      EXPECT_EQ(dout.host(), hout);
    }
  }
}
