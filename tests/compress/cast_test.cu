// SPDX-License-Identifier: Apache-2.0
// GPU: fp16/bf16 cast kernels on the CUDA executor == CPU executor, bit for bit.
#include "gpu_compare.cuh"

using namespace gpu_compare;

TEST(CastKernelsGpu, BitIdenticalToCpu) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  for (std::size_t n : sizes())
    for (bool ef : {false, true}) {
      compare_codec(cx::fp16_codec{}, n, ef, 1);
      compare_codec(cx::bf16_codec{}, n, ef, 2);
    }
}
