// SPDX-License-Identifier: Apache-2.0
// GPU: fp16/bf16 cast kernels on the CUDA executor == CPU executor, bit for bit.
#include "gpu_compare.cuh"

using namespace gpu_compare;

TEST(CastKernelsGpu, BitIdenticalToCpu) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  compare_codecs(1, cx::fp16_codec{}, cx::bf16_codec{});
}
