// SPDX-License-Identifier: Apache-2.0
// prefetcher on the CPU stage: ordering, CPU split, errors, shutdown, stats.
#include <ebbflow/prefetch/prefetcher.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "../thread_names.hpp"

namespace pf = ebbflow::prefetch;
using namespace std::chrono_literals;
using ebbflow::deadline;

namespace {
constexpr std::size_t sample_bytes = 24;  // 3 words: index, index ^ key, index * 3

void fill(std::size_t index, std::span<std::byte> dst) {
  ASSERT_EQ(dst.size(), sample_bytes);
  const std::uint64_t w[3] = {index, index ^ 0x5bd1e995u, index * 3};
  std::memcpy(dst.data(), w, sizeof w);
}
// True when `bytes` holds exactly the samples `indices`, in order.
::testing::AssertionResult holds(std::span<const std::byte> bytes, std::span<const std::size_t> indices) {
  if (bytes.size() != indices.size() * sample_bytes)
    return ::testing::AssertionFailure() << "size " << bytes.size() << " vs " << indices.size() << " samples";
  for (std::size_t i = 0; i < indices.size(); ++i) {
    std::uint64_t w[3];
    std::memcpy(w, bytes.data() + i * sample_bytes, sizeof w);
    const std::uint64_t k = indices[i];
    if (w[0] != k || w[1] != (k ^ 0x5bd1e995u) || w[2] != k * 3)
      return ::testing::AssertionFailure() << "position " << i << " holds sample " << w[0] << ", expected " << k;
  }
  return ::testing::AssertionSuccess();
}
struct fill_load {
  void operator()(std::size_t i, std::span<std::byte> d) const { fill(i, d); }
};
}  // namespace

// ---------------------------------------------------------------- ordering
// (batch size rule: 0 = fixed 7, 1 = varying 1..29), loaders, depth
class Ordering : public ::testing::TestWithParam<std::tuple<int, unsigned, std::size_t>> {};

TEST_P(Ordering, EverySampleDeliveredOnceAndInOrder) {
  const auto [rule, loaders, depth] = GetParam();
  const std::size_t total = 2000, devices = 2;
  auto bs = [rule = rule](std::uint64_t s) -> std::size_t { return rule == 0 ? 7 : 1 + (s * 13 + s / 3) % 29; };
  pf::prefetch_options o{.sample_bytes = sample_bytes, .max_batch_samples = 29, .depth = depth, .loaders = loaders};
  pf::prefetcher p(pf::sequence_source(total, bs, devices), fill_load{}, pf::cpu_stage(devices), o);
  std::size_t expect = 0;
  std::uint64_t step = 0;
  for (;;) {
    auto b = p.next(10s);
    if (!b) break;
    ASSERT_EQ(b.step(), step);
    ASSERT_EQ(b.size(), bs(step));
    for (std::size_t i = 0; i < b.size(); ++i) ASSERT_EQ(b.indices()[i], expect + i);
    std::size_t sum = 0;
    for (std::size_t d = 0; d < devices; ++d) {
      ASSERT_TRUE(holds(b.data(d), b.indices(d))) << "step " << step << " device " << d;
      sum += b.sizes()[d];
    }
    ASSERT_EQ(sum, b.size());
    expect += b.size();
    ++step;
  }
  // The source ends when a whole batch no longer fits: nothing was skipped.
  EXPECT_GT(expect + bs(step), total - 1);
  EXPECT_LE(expect, total);
  const auto st = p.stats();
  EXPECT_EQ(st.steps_delivered, step);
  EXPECT_EQ(st.samples_loaded, expect);
  EXPECT_EQ(st.bytes_loaded, expect * sample_bytes);
  EXPECT_EQ(st.load_errors, 0u);
  EXPECT_LE(st.pool.peak, st.pool.capacity);
  EXPECT_EQ(st.pool.in_use, 0u);
  EXPECT_FALSE(p.next(1s));  // stays at the end
}

INSTANTIATE_TEST_SUITE_P(Prefetch, Ordering,
                         ::testing::Combine(::testing::Values(0, 1), ::testing::Values(1u, 3u),
                                            ::testing::Values(std::size_t{1}, std::size_t{3})));

TEST(Prefetcher, ChunkLevelLoadSeesConsecutivePositions) {
  std::atomic<int> calls{0};
  auto load = [&](std::span<const std::size_t> idx, std::span<std::byte> dst) {
    ++calls;
    ASSERT_EQ(dst.size(), idx.size() * sample_bytes);
    for (std::size_t i = 0; i < idx.size(); ++i) fill(idx[i], dst.subspan(i * sample_bytes, sample_bytes));
  };
  pf::prefetch_options o{.sample_bytes = sample_bytes, .max_batch_samples = 32, .loaders = 2, .chunk_samples = 8};
  pf::prefetcher p(pf::sequence_source(32 * 20, [](auto) { return 32; }), load, pf::cpu_stage(1), o);
  int steps = 0;
  while (auto b = p.next(10s)) {
    ASSERT_TRUE(holds(b.data(0), b.indices()));
    ++steps;
  }
  EXPECT_EQ(steps, 20);
  EXPECT_EQ(calls.load(), 20 * 4);
}

#if defined(__linux__)
// top -H, perf and gdb show what each of the prefetcher's threads is.
TEST(Prefetcher, ItsThreadsAreNamed) {
  pf::prefetch_options o{.sample_bytes = sample_bytes, .max_batch_samples = 8, .loaders = 2};
  // More batches than the ring holds: every thread stays alive, waiting for room.
  pf::prefetcher p(pf::sequence_source(8 * 100'000, [](auto) { return 8; }), fill_load{}, pf::cpu_stage(1), o);
  // Named by the thread that started them, before the constructor returned.
  EXPECT_TRUE(ebbflow_test::has_thread("ebbflow-load0"));
  EXPECT_TRUE(ebbflow_test::has_thread("ebbflow-load1"));
  EXPECT_TRUE(ebbflow_test::has_thread("ebbflow-copy"));
}
#endif

// ---------------------------------------------------------------- CPU split
TEST(Prefetcher, CpuSplitGivesEachDeviceExactlyItsPlannedIndices) {
  std::mt19937_64 rng(7);
  const std::size_t devices = 3;
  std::vector<pf::step_plan> plans;
  for (int s = 0; s < 60; ++s) {
    pf::step_plan p;
    const std::size_t n = rng() % 40;  // includes empty batches
    for (std::size_t i = 0; i < n; ++i) p.indices.push_back(rng() % 100000);
    p.split.assign(devices, 0);
    std::size_t left = n;
    for (std::size_t d = 0; d + 1 < devices; ++d) {
      p.split[d] = left ? rng() % (left + 1) : 0;  // uneven, sometimes zero
      left -= p.split[d];
    }
    p.split[devices - 1] = left;
    plans.push_back(p);
  }
  pf::prefetch_options o{.sample_bytes = sample_bytes, .max_batch_samples = 40, .loaders = 2};
  pf::prefetcher p(pf::list_source(plans), fill_load{}, pf::cpu_stage(devices), o);
  for (std::size_t s = 0; s < plans.size(); ++s) {
    auto b = p.next(10s);
    ASSERT_TRUE(b);
    const auto& plan = plans[s];
    ASSERT_TRUE(std::ranges::equal(b.sizes(), plan.split));
    std::size_t off = 0;
    for (std::size_t d = 0; d < devices; ++d) {
      const auto want = std::span<const std::size_t>(plan.indices).subspan(off, plan.split[d]);
      ASSERT_TRUE(std::ranges::equal(b.indices(d), want)) << "step " << s << " device " << d;
      ASSERT_TRUE(holds(b.data(d), want)) << "step " << s << " device " << d;
      off += plan.split[d];
    }
  }
  EXPECT_FALSE(p.next(1s));
}

// ---------------------------------------------------------------- errors
namespace {
struct throw_at {
  std::size_t bad;
  void operator()(std::size_t i, std::span<std::byte> d) const {
    if (i == bad) throw std::runtime_error("disk read failed");
    fill(i, d);
  }
};
}  // namespace

class LoadError : public ::testing::TestWithParam<pf::error_policy> {};

TEST_P(LoadError, SurfacesAtTheStepOfTheSample) {
  const auto policy = GetParam();
  const std::size_t k = 37;  // batch 10: step 3, position 7
  pf::prefetch_options o{.sample_bytes = sample_bytes, .max_batch_samples = 10, .loaders = 3, .on_error = policy};
  pf::prefetcher p(pf::sequence_source(
                       100, [](auto) { return 10; }, 2),
                   throw_at{k}, pf::cpu_stage(2), o);
  for (std::uint64_t s = 0; s < 3; ++s) {
    auto b = p.next(10s);
    ASSERT_TRUE(b);
    ASSERT_EQ(b.step(), s);
  }
  try {
    (void)p.next(10s);
    FAIL() << "expected load_error";
  } catch (const pf::load_error& e) {
    EXPECT_EQ(e.step(), 3u);
    EXPECT_EQ(e.sample(), k);
    EXPECT_STREQ(e.what(), "prefetch: data load failed (step 3, sample 37: disk read failed)");
    EXPECT_THROW(e.rethrow_cause(), std::runtime_error);
    // A run-time condition: an ebbflow::system_error with errc::load_failed.
    const ebbflow::system_error& as_system = e;
    EXPECT_EQ(as_system.code(), ebbflow::errc::load_failed);
    EXPECT_EQ(as_system.operation(), "prefetch");
  }
  if (policy == pf::error_policy::stop) {
    EXPECT_FALSE(p.next(2s));
  } else {
    for (std::uint64_t s = 4; s < 10; ++s) {
      auto b = p.next(10s);
      ASSERT_TRUE(b);
      ASSERT_EQ(b.step(), s);
      ASSERT_EQ(b.indices()[0], s * 10);
      for (std::size_t d = 0; d < 2; ++d) ASSERT_TRUE(holds(b.data(d), b.indices(d)));
    }
    EXPECT_FALSE(p.next(2s));
  }
  EXPECT_EQ(p.stats().load_errors, 1u);
}
INSTANTIATE_TEST_SUITE_P(Prefetch, LoadError, ::testing::Values(pf::error_policy::stop, pf::error_policy::skip_step));

TEST(Prefetcher, BadPlanSurfacesAsAnErrorOfThatStep) {
  std::vector<pf::step_plan> plans(3, pf::step_plan{{1, 2, 3}, {2, 1}});
  plans[1].split = {2, 2};  // does not sum to the batch size
  pf::prefetch_options o{.sample_bytes = sample_bytes, .max_batch_samples = 8, .on_error = pf::error_policy::skip_step};
  pf::prefetcher p(pf::list_source(plans), fill_load{}, pf::cpu_stage(2), o);
  EXPECT_TRUE(p.next(10s));
  try {
    (void)p.next(10s);
    FAIL();
  } catch (const pf::load_error& e) {
    EXPECT_EQ(e.step(), 1u);
    EXPECT_EQ(e.sample(), pf::load_error::no_sample);
    EXPECT_NE(std::string(e.what()).find("split sums to 4"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(p.next(2s));  // a broken source is never continued past
}

TEST(Prefetcher, RejectsBadOptions) {
  auto make = [](pf::prefetch_options o) {
    pf::prefetcher p(pf::sequence_source(10, [](auto) { return 1; }), fill_load{}, pf::cpu_stage(1), o);
  };
  EXPECT_THROW(make({.sample_bytes = 0, .max_batch_samples = 1}), std::invalid_argument);
  EXPECT_THROW(make({.sample_bytes = 8, .max_batch_samples = 0}), std::invalid_argument);
  EXPECT_THROW(make({.sample_bytes = 8, .max_batch_samples = 4, .depth = 0}), std::invalid_argument);
  EXPECT_THROW(make({.sample_bytes = 8, .max_batch_samples = 4, .pool_bytes = 16}), std::invalid_argument);
  const auto four = [](std::uint64_t) -> std::size_t { return 4; };
  // Per-device weights must be finite and >= 0 (a negative one wrapped to a
  // split of 2^64 - 4 samples).
  EXPECT_THROW(pf::sequence_source(100, four, 2, std::vector<double>{-1.0, 2.0}), std::invalid_argument);
  EXPECT_THROW(pf::sequence_source(100, four, 2, std::vector<double>{std::nan(""), 1.0}), std::invalid_argument);
  EXPECT_THROW(pf::sequence_source(100, four, 2, std::vector<double>{1.0, HUGE_VAL}), std::invalid_argument);
  EXPECT_NO_THROW(pf::sequence_source(100, four, 2, std::vector<double>{0.0, 1.0}));
}

// A first batch larger than the whole data set is a mistake, not an empty
// epoch: the source ended at step 0 and the prefetcher delivered nothing,
// with no error. Later, a remainder smaller than the step's batch is dropped
// (documented); a first batch equal to the data set is one full step.
TEST(Prefetcher, SequenceSourceRefusesAFirstBatchLargerThanTheDataSet) {
  pf::step_plan out;
  pf::sequence_source too_big(10, [](auto) -> std::size_t { return 16; });
  try {
    (void)too_big.plan(0, out);
    FAIL() << "a batch of 16 over 10 samples was accepted";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("16"), std::string::npos) << what;
    EXPECT_NE(what.find("10"), std::string::npos) << what;
  }
  // Through the prefetcher it is step 0's error, not the end of data.
  pf::prefetcher p(pf::sequence_source(10, [](auto) -> std::size_t { return 16; }), fill_load{}, pf::cpu_stage(1),
                   {.sample_bytes = sample_bytes, .max_batch_samples = 16});
  EXPECT_THROW((void)p.next(10s), pf::load_error);

  pf::sequence_source tail(10, [](auto) -> std::size_t { return 4; });
  EXPECT_TRUE(tail.plan(0, out));
  EXPECT_TRUE(tail.plan(1, out));
  EXPECT_FALSE(tail.plan(2, out));  // samples 8 and 9 are dropped
  pf::sequence_source whole(10, [](auto) -> std::size_t { return 10; });
  EXPECT_TRUE(whole.plan(0, out));
  EXPECT_EQ(out.indices.size(), 10u);
  EXPECT_FALSE(whole.plan(1, out));
}

// A timeout beyond the clock's range waits (it timed out at once when the
// deadline's sum overflowed).
TEST(Prefetcher, NextWithAnUnboundedTimeoutWaits) {
  pf::prefetch_options o{.sample_bytes = sample_bytes, .max_batch_samples = 4, .loaders = 1};
  auto slow = [](std::size_t i, std::span<std::byte> d) {
    std::this_thread::sleep_for(20ms);
    fill(i, d);
  };
  pf::prefetcher p(pf::sequence_source(8, [](auto) { return 4; }), slow, pf::cpu_stage(1), o);
  auto b = p.next(std::chrono::seconds::max());
  ASSERT_TRUE(b);
}

// ---------------------------------------------------------------- timeouts, shutdown
namespace {
// A load that blocks until shutdown (honouring the stop token); `blocked`
// counts the loads blocked now.
struct blocking_load {
  std::atomic<int>* blocked;
  void operator()(std::size_t, std::span<std::byte>, std::stop_token tok) const {
    ++*blocked;
    std::mutex m;
    std::condition_variable_any cv;
    std::unique_lock lk(m);
    cv.wait(lk, tok, [] { return false; });
    --*blocked;
  }
};

// A prefetcher of 4-sample steps whose `loaders` loaders all block in their
// first load until it shuts down.
struct blocked_prefetcher {
  std::atomic<int> blocked{0};
  pf::prefetcher<pf::sequence_source, blocking_load> p;
  explicit blocked_prefetcher(unsigned loaders)
      : p(pf::sequence_source(100, [](auto) { return 4; }), blocking_load{&blocked}, pf::cpu_stage(1),
          {.sample_bytes = sample_bytes, .max_batch_samples = 4, .loaders = loaders}) {}
};
template <class Pred>
bool eventually(Pred p, std::chrono::milliseconds within = 5000ms) {
  const auto end = std::chrono::steady_clock::now() + within;
  while (!p()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}
}  // namespace

TEST(Prefetcher, NextTimesOutAndTheStepStaysPending) {
  blocked_prefetcher b(1);
  auto& p = b.p;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    (void)p.next(30ms);
    FAIL();
  } catch (const ebbflow::system_error& e) {
    EXPECT_EQ(e.code(), ebbflow::errc::timeout);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  EXPECT_TRUE(p.close(deadline::after(2s)));
  EXPECT_EQ(b.blocked.load(), 0);
}

TEST(Prefetcher, ShutdownWhileLoadersAreBlockedInLoad) {
  std::atomic<int> blocked{0};
  pf::prefetch_options o{.sample_bytes = sample_bytes, .max_batch_samples = 8, .loaders = 3, .chunk_samples = 1};
  pf::prefetcher p(pf::sequence_source(
                       1000, [](auto) { return 8; }, 2),
                   blocking_load{&blocked}, pf::cpu_stage(2), o);
  ASSERT_TRUE(eventually([&] { return blocked.load() == 3; }));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(p.close(deadline::after(2s)));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  EXPECT_EQ(blocked.load(), 0);
  EXPECT_FALSE(p.next(1s));  // after shutdown: the empty batch, no wait
}

TEST(Prefetcher, ShutdownWhileLoadersWaitForFreeSlots) {
  pf::prefetch_options o{.sample_bytes = sample_bytes, .max_batch_samples = 8, .depth = 2, .loaders = 2};
  pf::prefetcher p(pf::sequence_source(100000, [](auto) { return 8; }), fill_load{}, pf::cpu_stage(1), o);
  auto held = p.next(10s);  // the consumer holds one slot, the ring fills behind it
  ASSERT_TRUE(held);
  ASSERT_TRUE(eventually([&] { return p.stats().queue_depth == 1 && p.stats().in_flight == 2; }));
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(p.stats().steps_planned, 2u);  // bounded: nothing ran ahead of the ring
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(p.close(deadline::after(2s)));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  EXPECT_TRUE(holds(held.data(0), held.indices()));  // a held batch stays valid after shutdown
}

namespace {
// A CPU stage whose copy takes `delay` and says when one is in progress.
struct slow_stage : pf::cpu_stage {
  std::chrono::milliseconds delay;
  std::atomic<int>* copying;
  slow_stage(std::chrono::milliseconds d, std::atomic<int>* c) : pf::cpu_stage(1), delay(d), copying(c) {}
  void copy(std::size_t slot, std::size_t d, std::span<const std::byte> src) {
    ++*copying;
    std::this_thread::sleep_for(delay);
    pf::cpu_stage::copy(slot, d, src);
    --*copying;
  }
};
}  // namespace

TEST(Prefetcher, ShutdownMidCopy) {
  std::atomic<int> copying{0};
  pf::prefetch_options o{.sample_bytes = sample_bytes, .max_batch_samples = 8, .loaders = 2};
  pf::prefetcher p(pf::sequence_source(1000, [](auto) { return 8; }), fill_load{}, slow_stage(150ms, &copying), o);
  ASSERT_TRUE(eventually([&] { return copying.load() == 1; }));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(p.close(deadline::after(2s)));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  EXPECT_EQ(copying.load(), 0);
}

TEST(Prefetcher, ShutdownWhileTheConsumerWaits) {
  blocked_prefetcher b(2);
  auto& p = b.p;
  std::atomic<bool> got_empty{false};
  const auto t0 = std::chrono::steady_clock::now();
  std::thread consumer([&] {
    auto batch = p.next(30s);
    got_empty = !batch;
  });
  ASSERT_TRUE(eventually([&] { return b.blocked.load() > 0; }));
  std::this_thread::sleep_for(20ms);
  p.shutdown();  // from another thread than the consumer
  consumer.join();
  EXPECT_TRUE(got_empty.load());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_TRUE(p.close(deadline::after(2s)));
}

TEST(Prefetcher, ABatchMayOutliveItsPrefetcher) {
  using P = pf::prefetcher<pf::sequence_source, fill_load>;
  P::batch keep;
  {
    P p(pf::sequence_source(100, [](auto) { return 5; }), fill_load{}, pf::cpu_stage(1),
        {.sample_bytes = sample_bytes, .max_batch_samples = 5});
    keep = p.next(10s);
    ASSERT_TRUE(keep);
  }
  EXPECT_TRUE(holds(keep.data(0), keep.indices()));
  keep.release();
  EXPECT_FALSE(keep);
}

// data(d), indices(d) and event(d) dereferenced the shared state unchecked:
// on the empty batch (end of data) a null pointer, and past devices() an
// index out of bounds.
TEST(Prefetcher, BatchAccessorsRefuseTheEmptyBatchAndADeviceOutOfRange) {
  pf::prefetcher p(pf::sequence_source(
                       8, [](auto) -> std::size_t { return 4; }, 2),
                   fill_load{}, pf::cpu_stage(2), {.sample_bytes = sample_bytes, .max_batch_samples = 4});
  const auto names = [](auto&& f, const char* a, const char* b) {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      if (what.find(a) == std::string::npos || what.find(b) == std::string::npos)
        return ::testing::AssertionFailure() << what;
      return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure() << "no std::invalid_argument";
  };
  auto b = p.next(10s);
  ASSERT_TRUE(b);
  ASSERT_EQ(b.devices(), 2u);
  EXPECT_TRUE(holds(b.data(1), b.indices(1)));
  EXPECT_NO_THROW((void)b.event(1));
  EXPECT_THROW((void)b.data(2), std::invalid_argument);
  EXPECT_THROW((void)b.indices(2), std::invalid_argument);
  EXPECT_THROW((void)b.event(2), std::invalid_argument);
  EXPECT_TRUE(names([&] { (void)b.data(2); }, "device 2", "devices() = 2"));
  b.release();
  EXPECT_THROW((void)b.data(0), std::invalid_argument);  // released: empty

  EXPECT_TRUE(p.next(10s));
  auto end = p.next(10s);  // end of data
  ASSERT_FALSE(end);
  EXPECT_THROW((void)end.data(0), std::invalid_argument);
  EXPECT_THROW((void)end.indices(0), std::invalid_argument);
  EXPECT_THROW((void)end.event(0), std::invalid_argument);
  EXPECT_TRUE(names([&] { (void)end.indices(0); }, "empty batch", "end of data"));
  EXPECT_TRUE(end.indices().empty());  // the whole-batch accessors stay empty
  EXPECT_EQ(end.devices(), 0u);
}

TEST(Prefetcher, StatisticsAreReadableWhileRunning) {
  pf::prefetch_options o{.sample_bytes = sample_bytes, .max_batch_samples = 16, .depth = 4, .loaders = 2};
  pf::prefetcher p(pf::sequence_source(
                       16 * 300, [](auto) { return 16; }, 2),
                   fill_load{}, pf::cpu_stage(2), o);
  std::atomic<bool> done{false};
  std::thread reader([&] {
    while (!done.load()) {
      const auto st = p.stats();
      EXPECT_LE(st.queue_depth, 4u);
      EXPECT_LE(st.in_flight, 4u);
      EXPECT_LE(st.pool.in_use, st.pool.capacity);
      std::this_thread::yield();
    }
  });
  std::size_t n = 0;
  while (auto b = p.next(10s)) n += b.size();
  done = true;
  reader.join();
  const auto st = p.stats();
  EXPECT_EQ(n, 16u * 300);
  EXPECT_EQ(st.steps_delivered, 300u);
  EXPECT_GT(st.loader_bytes_per_s, 0.0);
  EXPECT_GE(st.consumer_stall_s, 0.0);
  EXPECT_EQ(st.stage_bytes, 4u * 2 * 16 * sample_bytes);
}
