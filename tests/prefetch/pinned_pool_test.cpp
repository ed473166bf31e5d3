// SPDX-License-Identifier: Apache-2.0
// pinned_pool: fixed bound, leases, waiting with a deadline, cancellation.
#include <ebbflow/prefetch/pinned_pool.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

namespace pf = ebbflow::prefetch;
using namespace std::chrono_literals;

TEST(PinnedPool, LeasesStayWithinTheFixedCapacity) {
  pf::pinned_pool pool(4096);
  EXPECT_EQ(pool.capacity(), 4096u);
  auto a = pool.try_acquire(1000);
  auto b = pool.try_acquire(1000);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->size(), 1024u);  // rounded to the lease alignment
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a->bytes().data()) % pf::pinned_pool::alignment, 0u);
  auto c = pool.try_acquire(2048);
  ASSERT_TRUE(c);
  EXPECT_FALSE(pool.try_acquire(1));  // full: no growth
  auto st = pool.stats();
  EXPECT_EQ(st.in_use, 4096u);
  EXPECT_EQ(st.peak, 4096u);
  EXPECT_EQ(st.leases, 3u);
  EXPECT_EQ(st.allocations, 1u);
  b->reset();
  a->reset();
  // The two freed neighbours coalesce into one range of 2048.
  auto d = pool.try_acquire(2048);
  ASSERT_TRUE(d);
  EXPECT_EQ(pool.stats().in_use, 4096u);
}

TEST(PinnedPool, RejectsRequestsLargerThanThePool) {
  pf::pinned_pool pool(1024);
  EXPECT_THROW((void)pool.try_acquire(1025 + pf::pinned_pool::alignment), std::invalid_argument);
  EXPECT_THROW((void)pool.acquire(1 << 20, ebbflow::deadline::after(1s)), std::invalid_argument);
  EXPECT_THROW(pf::pinned_pool(0), std::invalid_argument);
}

TEST(PinnedPool, AcquireWaitsForSpaceAndTimesOut) {
  pf::pinned_pool pool(1024);
  auto a = pool.acquire(1024, ebbflow::deadline::after(1s));
  const auto t0 = std::chrono::steady_clock::now();
  try {
    (void)pool.acquire(512, ebbflow::deadline::after(50ms));
    FAIL() << "expected a timeout";
  } catch (const ebbflow::system_error& e) {
    EXPECT_EQ(e.code(), ebbflow::errc::timeout);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  std::thread t([&] {
    std::this_thread::sleep_for(20ms);
    a.reset();
  });
  auto b = pool.acquire(512, ebbflow::deadline::after(5s));
  EXPECT_EQ(b.size(), 512u);
  t.join();
}

TEST(PinnedPool, CancelWakesWaiters) {
  pf::pinned_pool pool(1024);
  auto a = pool.acquire(1024, ebbflow::deadline::after(1s));
  std::thread t([&] {
    std::this_thread::sleep_for(20ms);
    pool.cancel();
  });
  try {
    (void)pool.acquire(512, ebbflow::deadline::after(10s));
    FAIL() << "expected cancellation";
  } catch (const ebbflow::system_error& e) {
    EXPECT_EQ(e.code(), ebbflow::errc::cancelled);
  }
  t.join();
}

TEST(PinnedPool, ReportsWhetherTheRegionIsLocked) {
  pf::pinned_pool locked(1 << 16);
  const auto st = locked.stats();
  EXPECT_EQ(st.allocator, "mlock");
  // Either locked, or the reason is spelled out (e.g. RLIMIT_MEMLOCK).
  if (st.locked)
    EXPECT_TRUE(st.lock_status.empty());
  else
    EXPECT_NE(st.lock_status.find("mlock"), std::string::npos) << st.lock_status;

  pf::pinned_pool pageable(1 << 16, pf::pageable_allocator());
  EXPECT_FALSE(pageable.stats().locked);
  EXPECT_FALSE(pageable.stats().lock_status.empty());
}

TEST(PinnedPool, ConcurrentLeasesNeverExceedTheBound) {
  pf::pinned_pool pool(64 * 1024);
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) {
        auto l = pool.acquire(256 * (1 + (i * 7 + t) % 40), ebbflow::deadline::after(10s));
        l.bytes()[0] = std::byte{1};
      }
    });
  for (auto& t : ts) t.join();
  const auto st = pool.stats();
  EXPECT_LE(st.peak, st.capacity);
  EXPECT_EQ(st.in_use, 0u);
  EXPECT_EQ(st.leases, 0u);
}
