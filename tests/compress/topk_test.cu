// SPDX-License-Identifier: Apache-2.0
// GPU: top-k kernels (sampling, quickselect, count/scan/pack) on the CUDA
// executor == CPU executor, bit for bit (deterministic compaction).
#include "gpu_compare.cuh"

using namespace gpu_compare;

TEST(TopKKernelsGpu, BitIdenticalToCpu) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  compare_codecs(6, cx::topk_codec(0.01), cx::topk_codec(0.2, 256));
}
