// SPDX-License-Identifier: Apache-2.0
// The prefetcher's memory stays within its configured bound over 10,000 steps
// whose batch sizes change every step: measured through the pool's own
// accounting (bytes leased, peak, number of regions allocated) and through the
// process's resident set size after warm-up.
#include <ebbflow/config.hpp>
#include <ebbflow/prefetch/prefetcher.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <unistd.h>

namespace pf = ebbflow::prefetch;
using namespace std::chrono_literals;

namespace {
std::size_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  std::size_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}
// Quarantines and shadow memory make RSS meaningless under a sanitizer.
constexpr bool sanitized = EBBFLOW_SANITIZE_ADDRESS || EBBFLOW_SANITIZE_THREAD;
}  // namespace

TEST(PrefetchMemory, StaysWithinTheBoundOver10000StepsOfChangingBatchSizes) {
  constexpr std::size_t steps = 10000, sample = 4096, max_batch = 64;
  // A bound smaller than depth * max batch: large batches must wait for space.
  constexpr std::size_t bound = 2 * max_batch * sample;
  auto bs = [](std::uint64_t s) -> std::size_t { return 1 + (s * 37 + (s / 100) * 11) % max_batch; };
  pf::prefetch_options o{
      .sample_bytes = sample, .max_batch_samples = max_batch, .depth = 4, .pool_bytes = bound, .loaders = 2};
  auto load = [](std::size_t i, std::span<std::byte> d) {
    std::memset(d.data(), static_cast<int>(i & 0xff), d.size());
  };
  const std::size_t rss0 = rss_bytes();
  pf::prefetcher p(pf::sequence_source(SIZE_MAX / 2, bs, 2, {}, steps), load, pf::cpu_stage(2), o);
  const std::size_t rss_built = rss_bytes();
  std::size_t rss_warm = 0, rss_max = 0, peak_in_use = 0;
  std::uint64_t n = 0;
  while (auto b = p.next(30s)) {
    ASSERT_EQ(b.size(), bs(b.step()));
    const auto first = b.data(0).empty() ? b.data(1) : b.data(0);
    ASSERT_EQ(first[0], static_cast<std::byte>(b.indices()[0] & 0xff));
    const auto st = p.stats();
    peak_in_use = std::max(peak_in_use, st.pool.in_use);
    ASSERT_LE(st.pool.in_use, bound);
    if (n == 200) rss_warm = rss_bytes();
    if (n > 200 && n % 50 == 0) rss_max = std::max(rss_max, rss_bytes());
    ++n;
  }
  ASSERT_EQ(n, steps);
  const auto st = p.stats();
  EXPECT_EQ(st.pool.capacity, bound);
  EXPECT_LE(st.pool.peak, bound);
  EXPECT_EQ(st.pool.allocations, 1u);  // one region for the whole run: the pool never grew
  EXPECT_GT(st.pool.peak, bound / 2);  // the bound was actually exercised
  std::printf("pool: capacity %zu B, peak in use %zu B (%.1f %%), regions allocated %zu, locked %d%s%s\n",
              st.pool.capacity, st.pool.peak, 100.0 * static_cast<double>(st.pool.peak) / static_cast<double>(bound),
              st.pool.allocations, st.pool.locked ? 1 : 0, st.pool.locked ? "" : ": ", st.pool.lock_status.c_str());
  std::printf(
      "stage buffers: %zu B; RSS: before %zu KiB, after construction %zu KiB, at step 200 %zu KiB, max after %zu KiB\n",
      st.stage_bytes, rss0 >> 10, rss_built >> 10, rss_warm >> 10, rss_max >> 10);
  if (sanitized) {
    // Quarantine and shadow memory make RSS meaningless; the pool's own accounting is checked above.
    std::printf("RSS bound not asserted under a sanitizer\n");
    return;
  }
  // After warm-up the footprint must not creep: allow 1 MiB of allocator noise.
  EXPECT_LE(rss_max, rss_warm + (1u << 20)) << "RSS grew by " << ((rss_max - rss_warm) >> 10) << " KiB after warm-up";
  // Construction costs the pool plus the stage buffers (both touched up front), plus threads' stacks.
  EXPECT_GE(rss_built - rss0 + (1u << 20), bound);
}
