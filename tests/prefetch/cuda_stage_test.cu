// SPDX-License-Identifier: Apache-2.0
// GPU test: the prefetcher over cuda_stage (cudaHostAlloc staging, one copy
// stream per device, ready/consumed events). Skips without a device.
#include <ebbflow/prefetch/cuda_stage.hpp>
#include <ebbflow/prefetch/prefetcher.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <vector>

namespace pf = ebbflow::prefetch;
using namespace std::chrono_literals;

namespace {
constexpr std::size_t sample_bytes = 4096;
struct fill_load {
  void operator()(std::size_t i, std::span<std::byte> d) const {
    auto* w = reinterpret_cast<std::uint32_t*>(d.data());
    for (std::size_t k = 0; k < d.size() / 4; ++k) w[k] = static_cast<std::uint32_t>(i * 1024 + k);
  }
};
// Overwrites a device buffer on the consumer stream: if the prefetcher reused
// a buffer before this kernel ran, the next batch in that slot would be wrong.
__global__ void scribble(std::uint32_t* p, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = 0xdeadbeefu;
}
}  // namespace

TEST(CudaStage, DeliversEveryStepToEachDeviceWithoutHostSync) {
  if (!pf::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  std::vector<int> ids;
  for (int d = 0; d < std::min(count, 2); ++d) ids.push_back(d);
  const std::size_t devices = ids.size();
  pf::prefetch_options o{.sample_bytes = sample_bytes, .max_batch_samples = 64, .depth = 3, .loaders = 2};
  pf::prefetcher p(pf::sequence_source(
                       64 * 200, [](std::uint64_t s) { return 8 + s % 57; }, devices),
                   fill_load{}, pf::cuda_stage(ids), o);
  EXPECT_EQ(p.stats().pool.allocator, "cudaHostAlloc");
  EXPECT_TRUE(p.stats().pool.locked);
  std::vector<cudaStream_t> compute(devices);
  for (std::size_t d = 0; d < devices; ++d) {
    ASSERT_EQ(cudaSetDevice(ids[d]), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&compute[d], cudaStreamNonBlocking), cudaSuccess);
  }
  std::vector<std::uint32_t> host;
  int steps = 0;
  while (auto b = p.next(30s)) {
    for (std::size_t d = 0; d < devices; ++d) {
      ASSERT_EQ(cudaSetDevice(ids[d]), cudaSuccess);
      b.event(d).wait(compute[d]);
      auto span = b.data(d);
      host.assign(span.size() / 4, 0);
      ASSERT_EQ(cudaMemcpyAsync(host.data(), span.data(), span.size(), cudaMemcpyDeviceToHost, compute[d]),
                cudaSuccess);
      if (!span.empty())
        scribble<<<64, 256, 0, compute[d]>>>(reinterpret_cast<std::uint32_t*>(span.data()), span.size() / 4);
      ASSERT_EQ(cudaStreamSynchronize(compute[d]), cudaSuccess);
      const auto idx = b.indices(d);
      for (std::size_t i = 0; i < idx.size(); ++i)
        for (std::size_t k = 0; k < sample_bytes / 4; k += 97)
          ASSERT_EQ(host[i * sample_bytes / 4 + k], static_cast<std::uint32_t>(idx[i] * 1024 + k))
              << "step " << b.step() << " device " << d << " sample " << i;
    }
    ++steps;
  }
  EXPECT_EQ(steps, p.stats().steps_delivered);
  EXPECT_GT(steps, 100);
  for (auto s : compute) cudaStreamDestroy(s);
}

TEST(CudaStage, HostAllocatorIsPinned) {
  if (!pf::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  pf::pinned_pool pool(1 << 20, pf::cuda_host_allocator());
  const auto st = pool.stats();
  EXPECT_TRUE(st.locked);
  cudaPointerAttributes a{};
  ASSERT_EQ(cudaPointerGetAttributes(&a, pool.data()), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeHost);
}
