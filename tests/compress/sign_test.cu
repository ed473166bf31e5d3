// SPDX-License-Identifier: Apache-2.0
// GPU: 1-bit sign kernels on the CUDA executor == CPU executor, bit for bit.
#include "gpu_compare.cuh"

using namespace gpu_compare;

TEST(SignKernelsGpu, BitIdenticalToCpu) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  compare_codecs(5, cx::sign_codec{});
}
