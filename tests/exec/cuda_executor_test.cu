// SPDX-License-Identifier: Apache-2.0
// GPU test: the CUDA executor visits every index once. Skips without a device.
#include <ebbflow/exec/cuda_executor.cuh>
#include <ebbflow/core/half.hpp>

#include <gtest/gtest.h>

#include <vector>

namespace ef = ebbflow;

namespace {
bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
struct add_index {
  int* d_out;
  EBBFLOW_HD void operator()(std::size_t i) const { d_out[i] += static_cast<int>(i); }
};
struct to_half {
  const float* d_in;
  std::uint16_t* d_out;
  EBBFLOW_HD void operator()(std::size_t i) const { d_out[i] = ef::half::from_float(d_in[i]); }
};
}  // namespace

TEST(CudaExecutor, BulkVisitsEveryIndexOnce) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const std::size_t n = (1 << 24) + 3;
  int* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, n * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMemset(d, 0, n * sizeof(int)), cudaSuccess);
  ef::exec::cuda_executor ex;
  ex.bulk(n, add_index{d});
  ex.wait();
  std::vector<int> h(n);
  ASSERT_EQ(cudaMemcpy(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(h[i], static_cast<int>(i));
}

TEST(CudaExecutor, HalfConversionIsBitIdenticalToTheCpu) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  std::vector<float> in;
  for (std::uint32_t b = 0; b < 0x10000u; b += 1)
    in.push_back(ef::half::to_float(static_cast<std::uint16_t>(b)) * 1.0001f);
  float* d_in = nullptr;
  std::uint16_t* d_out = nullptr;
  ASSERT_EQ(cudaMalloc(&d_in, in.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_out, in.size() * 2), cudaSuccess);
  cudaMemcpy(d_in, in.data(), in.size() * 4, cudaMemcpyHostToDevice);
  ef::exec::cuda_executor ex;
  ex.bulk(in.size(), to_half{d_in, d_out});
  ex.wait();
  std::vector<std::uint16_t> out(in.size());
  cudaMemcpy(out.data(), d_out, out.size() * 2, cudaMemcpyDeviceToHost);
  cudaFree(d_in);
  cudaFree(d_out);
  for (std::size_t i = 0; i < in.size(); ++i) ASSERT_EQ(out[i], ef::half::from_float(in[i])) << i;
}
