// SPDX-License-Identifier: Apache-2.0
// plan/work_stealing.hpp: exactly-once claims under concurrency (owners and
// pure thieves, random chunk sizes and delays) over the in-process store,
// exactly-once epoch coverage with the sampler across re-plans and rolled-back
// steps, the chunk policy, and bad input.
#include "plan_error_check.hpp"
#include "work_stealing_check.hpp"

#include <ebbflow/elastic/kv_store.hpp>
#include <ebbflow/plan.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <limits>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace ef = ebbflow;
namespace pl = ebbflow::plan;
namespace el = ebbflow::elastic;
using ws_test::check_exactly_once;
using ws_test::run_step;

namespace {

static_assert(pl::counter_store<el::memory_store>);

//! memory_store with random delays before and after each add, so that the
//! order in which claims reach the store differs from the order they were made.
struct jittery_store {
  el::memory_store inner;
  std::atomic<std::uint64_t> seed{1};
  std::int64_t add(const std::string& k, std::int64_t delta, ef::deadline d) {
    thread_local std::mt19937_64 rng(seed.fetch_add(1));
    nap(rng);
    const std::int64_t r = inner.add(k, delta, d);
    nap(rng);
    return r;
  }
  static void nap(std::mt19937_64& rng) {
    const auto x = rng() % 16;
    if (x < 10) return;
    if (x < 14) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 50));
  }
};
static_assert(pl::counter_store<jittery_store>);

// ------------------------------------------------------------ the checker can fail
TEST(WorkStealing, CheckerDetectsDuplicatesGapsAndOutOfRange) {
  const std::vector<std::size_t> sizes = {4, 3};
  std::vector<pl::chunk> ok = {{0, 0, 2}, {0, 2, 4, true}, {1, 0, 3}};
  EXPECT_EQ(check_exactly_once(sizes, ok), "");
  auto dup = ok;
  dup.push_back({1, 2, 3, true});
  EXPECT_NE(check_exactly_once(sizes, dup), "");
  auto gap = ok;
  gap.pop_back();
  EXPECT_NE(check_exactly_once(sizes, gap), "");
  auto out = ok;
  out.push_back({1, 3, 4, true});
  EXPECT_NE(check_exactly_once(sizes, out), "");
}

// ------------------------------------------------------------ deterministic protocol
TEST(WorkStealing, OwnerFrontThiefBackExactState) {
  el::memory_store store;
  const std::vector<std::size_t> sizes = {100, 0};
  pl::steal_options o;  // first 25, then ceil(rest/4)
  o.tail_reserve = 0;
  o.owner_divisor = 4;
  pl::work_stealer<el::memory_store> owner(store, "t", {7, 3}, sizes, 0, o);
  pl::work_stealer<el::memory_store> thief(store, "t", {7, 3}, sizes, 1, o);
  EXPECT_EQ(owner.key(0), "t/7/3/0");

  pl::chunk c = owner.claim_own();
  EXPECT_EQ(c.first, 0u);
  EXPECT_EQ(c.last, 25u);
  EXPECT_FALSE(c.stolen);
  pl::slice_state s = thief.peek(0);
  EXPECT_EQ(s.front, 25u);
  EXPECT_EQ(s.back, 0u);
  EXPECT_EQ(s.remaining(), 75u);

  c = thief.steal();  // ceil(75/2) = 38 from the back
  EXPECT_EQ(c.rank, 0u);
  EXPECT_TRUE(c.stolen);
  EXPECT_EQ(c.first, 62u);
  EXPECT_EQ(c.last, 100u);

  c = owner.claim_own();  // ceil(75/4) = 19, all still free
  EXPECT_EQ(c.first, 25u);
  EXPECT_EQ(c.last, 44u);
  c = thief.steal_from(0, 1000);  // clamped to the 18 it last saw? it saw 37 remaining: gets the 18 left
  EXPECT_EQ(c.first, 44u);
  EXPECT_EQ(c.last, 62u);
  EXPECT_TRUE(thief.steal().empty());  // everything claimed
  c = owner.claim_own();               // the owner finds its slice exhausted
  EXPECT_TRUE(c.empty());
  EXPECT_TRUE(owner.own_done());
  EXPECT_TRUE(owner.claim_own().empty());
  EXPECT_EQ(owner.processed() + thief.processed(), 100u);
  EXPECT_EQ(thief.stolen(), 56u);
  EXPECT_DOUBLE_EQ(owner.weight(100), 0.44);
  EXPECT_DOUBLE_EQ(thief.weight(100), 0.56);
  // The counter never exceeded its fields: F <= 100 and K small.
  const pl::slice_state end = thief.peek(0);
  EXPECT_LE(end.front, 100u);
  EXPECT_LT(end.back, std::uint64_t{1} << 32);
}

TEST(WorkStealing, KeysOfDifferentAttemptsNeverCollide) {
  el::memory_store store;
  const std::vector<std::size_t> sizes = {10, 10};
  pl::work_stealer<el::memory_store> a(store, "job", {1, 5}, sizes, 0);
  pl::work_stealer<el::memory_store> redo(store, "job", {2, 5}, sizes, 0);  // the same step after a rollback
  while (!a.next().empty()) {
  }
  EXPECT_EQ(a.processed(), 20u);
  // The redone attempt sees fresh counters: it gets every item again.
  while (!redo.next().empty()) {
  }
  EXPECT_EQ(redo.processed(), 20u);
  EXPECT_NE(a.key(0), redo.key(0));
}

TEST(WorkStealing, ChunkPolicy) {
  pl::steal_options o;
  o.min_chunk = 4;
  EXPECT_EQ(pl::owner_request(o, 100, 0), 25u);   // first_fraction 0.25
  EXPECT_EQ(pl::owner_request(o, 100, 25), 71u);  // all but the tail reserve max(ceil(0.03 * 100), min_chunk) = 4
  EXPECT_EQ(pl::owner_request(o, 100, 97), 3u);   // min_chunk 4 > rest: the whole rest
  EXPECT_EQ(pl::owner_request(o, 100, 94), 6u);   // guided 3 would leave 3 < min_chunk behind: all 6
  EXPECT_EQ(pl::owner_request(o, 100, 98), 2u);   // min_chunk, but never beyond the slice
  EXPECT_EQ(pl::owner_request(o, 100, 100), 0u);
  EXPECT_EQ(pl::owner_request(o, 100, 0, 7), 7u);  // capped
  EXPECT_EQ(pl::owner_request(o, 100, 0, 2), 4u);  // min_chunk wins over the cap
  EXPECT_EQ(pl::owner_request(o, 3, 0), 3u);
  EXPECT_EQ(pl::owner_request(o, 1000, 250), 720u);   // reserve 30 of 750
  EXPECT_EQ(pl::owner_request(o, 1000, 970), 15u);    // then guided: ceil(30 / 2)
  EXPECT_EQ(pl::owner_request(o, 1000, 993), 7u);     // 4 would leave 3 < min_chunk behind: all 7
  EXPECT_EQ(pl::owner_request(o, 1000, 993, 1), 4u);  // unless paced: min_chunk, the tail stays for thieves
  pl::steal_options guided = o;
  guided.tail_reserve = 0;  // guided chunks from the start
  EXPECT_EQ(pl::owner_request(guided, 100, 25), 38u);
  EXPECT_EQ(pl::owner_request(guided, 100, 90), 5u);
  EXPECT_EQ(pl::thief_request(o, 0), 0u);
  EXPECT_EQ(pl::thief_request(o, 9), 5u);
  EXPECT_EQ(pl::thief_request(o, 3), 3u);
  EXPECT_EQ(pl::thief_request(o, 100, 10), 10u);
  EXPECT_EQ(pl::thief_request(o, 100, 1), 4u);
  // Claims per step without thieves stay logarithmic in the slice.
  for (std::uint64_t n : {1ul, 7ul, 256ul, 4096ul, 1ul << 20}) {
    std::uint64_t f = 0, claims = 0;
    while (f < n) f += pl::owner_request(o, n, f), ++claims;
    EXPECT_EQ(f, n);
    EXPECT_LE(claims, 2 + 4 * std::log(std::max<double>(1, static_cast<double>(n) / 4)) + 1) << n;
  }
  // Pacing: on plan -> no limit worth speaking of; behind -> 1.
  EXPECT_EQ(pl::paced_owner_cap(1.0, 0.5, 0.01), 50u);
  EXPECT_EQ(pl::paced_owner_cap(1.0, 1.5, 0.01), 1u);
  EXPECT_EQ(pl::paced_owner_cap(1.0, 0.5, 0.0), std::numeric_limits<std::uint64_t>::max());
  // Balance: equal speeds, no overhead -> half; a slow thief takes less; too little left -> 0.
  EXPECT_EQ(pl::balanced_steal(100, 1.0, 1.0, 0.0), 50u);
  EXPECT_EQ(pl::balanced_steal(100, 1.0, 3.0, 0.0), 25u);
  EXPECT_EQ(pl::balanced_steal(100, 1.0, 1.0, 99.0), 0u);
  EXPECT_EQ(pl::balanced_steal(0, 1.0, 1.0, 0.0), 0u);
  // Fair share: 100 items, fleet 10 items/s -> horizon 10 s; a thief at 0.5 s/item takes <= 20, a slow one >= 1.
  EXPECT_EQ(pl::fair_steal_cap(100, 10.0, 0.5), 20u);
  EXPECT_EQ(pl::fair_steal_cap(100, 10.0, 100.0), 1u);
  EXPECT_EQ(pl::fair_steal_cap(100, 10.0, 0.001), 100u);
  EXPECT_EQ(pl::fair_steal_cap(0, 10.0, 0.5), 0u);
  EXPECT_LT(pl::thief_request_limit(pl::max_slice_items, 16) * 16 + pl::max_slice_items, std::uint64_t{1} << 32);
}

// ------------------------------------------------------------ property: many threads
// Owners of random slices (some empty: pure thieves), random caps, random
// delays inside the store: every index of every slice is claimed exactly once.
TEST(WorkStealing, ConcurrentClaimsAreExactlyOnce) {
  jittery_store store;
  std::mt19937_64 rng(12345);
  const int trials = 60;
  std::uint64_t stolen = 0, items = 0;
  for (int t = 0; t < trials; ++t) {
    const std::size_t workers = 2 + rng() % 7;
    std::vector<std::size_t> sizes(workers);
    for (auto& s : sizes) s = rng() % 4 == 0 ? 0 : rng() % 300;
    pl::steal_options o;
    o.first_fraction = 0.05 + 0.95 * static_cast<double>(rng() % 1000) / 1000;
    o.owner_divisor = 1 + static_cast<std::uint32_t>(rng() % 6);
    o.thief_divisor = 1 + static_cast<std::uint32_t>(rng() % 4);
    o.min_chunk = 1 + rng() % 5;
    const auto r =
        run_step(store, "p", {0, static_cast<std::uint64_t>(t)}, sizes, o, rng(), /*max_cap=*/1 + rng() % 40);
    ASSERT_EQ(check_exactly_once(sizes, r.chunks), "") << "trial " << t;
    std::uint64_t total = 0;
    for (auto s : sizes) total += s;
    EXPECT_EQ(r.processed, total);
    stolen += r.stolen;
    items += total;
  }
  // The run must actually have exercised stealing (not only owners).
  EXPECT_GT(stolen, items / 20) << stolen << " of " << items;
}

// ------------------------------------------------------------ with the sampler
// Random re-plans (1..6 workers, random splits and batches) over several
// epochs, with steps sometimes rolled back midway and redone in a new
// generation: the committed steps' data-set indices cover every epoch exactly once.
TEST(WorkStealing, SamplerCoverageAcrossReplansAndRollbacks) {
  el::memory_store store;
  std::mt19937_64 rng(99);
  const std::uint64_t N = 997;
  pl::epoch_sampler sampler(N, 4242);
  std::uint64_t generation = 1, step = 0, version = 0;
  std::vector<int> seen(N, 0);
  int epochs_checked = 0, rollbacks = 0;
  while (epochs_checked < 3) {
    const std::size_t n = 1 + rng() % 6;
    const std::size_t B = sampler.step_size(40 + rng() % 200);
    std::vector<std::size_t> sizes(n, 0);
    for (std::size_t k = 0; k < B; ++k) ++sizes[rng() % n];
    std::vector<pl::worker_spec> w(n);
    for (std::size_t i = 0; i < n; ++i) w[i] = {i + 100, 0.0, 0.001, B, 0, 0};
    const pl::batch_plan plan = pl::make_plan(w, sizes, ++version);
    const std::uint64_t epoch = sampler.epoch();
    if (rng() % 5 == 0) {  // an attempt that is abandoned midway (a failure): not committed
      const auto r = run_step(store, "s", {generation, step}, sizes, {}, rng(), 16, /*stop_after=*/2);
      (void)r;
      ++generation;  // the redo runs in a new generation
      ++rollbacks;
    }
    const auto r = run_step(store, "s", {generation, step}, sizes, {}, rng(), 1 + rng() % 30);
    ASSERT_EQ(check_exactly_once(sizes, r.chunks), "");
    for (const pl::chunk& c : r.chunks)
      for (std::uint64_t idx : pl::samples_of(sampler.state(), plan, c).indices()) ++seen.at(idx);
    sampler.commit(plan);
    ++step;
    if (sampler.epoch() != epoch) {
      for (std::uint64_t i = 0; i < N; ++i) ASSERT_EQ(seen[i], 1) << "index " << i << " epoch " << epoch;
      seen.assign(N, 0);
      ++epochs_checked;
    }
  }
  EXPECT_GT(rollbacks, 0);
}

// ------------------------------------------------------------ policy and driver
TEST(WorkStealing, PolicyFindsTheStragglerByProgress) {
  // Three equal workers, 100 items each, planned 1 s (c = 0.01 s/item, a = 0).
  std::vector<pl::worker_spec> m = {{1, 0, 0.01, 1000, 0, 0}, {2, 0, 0.01, 1000, 0, 0}, {3, 0, 0.01, 1000, 0, 0}};
  const std::vector<std::size_t> sizes = {100, 100, 100};
  const pl::batch_plan plan = pl::make_plan(m, sizes, 1);
  pl::steal_policy p(m, plan, 0, 1e-5, 1e-4);
  EXPECT_EQ(p.own_cap(0.0), 100u);  // on plan: not limited
  p.observe_own(25, 0.75);          // 3x slower than planned
  EXPECT_DOUBLE_EQ(p.s_per_item(), 0.03);
  EXPECT_EQ(p.own_cap(0.75), 8u);  // 0.25 s left at 0.03 s/item
  EXPECT_EQ(p.own_cap(2.0), 1u);   // behind schedule: the smallest claim
  // At t = 1 s: rank 1 requested 90 (on plan, 10 left), rank 2 requested 30 (slow: 70 left).
  std::vector<pl::slice_state> seen = {{100, 100, 0}, {100, 90, 0}, {100, 30, 0}};
  pl::steal_policy thief(m, plan, 0, 1e-5, 1e-4);
  const auto ch = thief.choose(seen, 1.0);
  EXPECT_EQ(ch.victim, 2u);
  EXPECT_GT(ch.items, 0u);
  EXPECT_LE(ch.items, 70u);
  // Everything claimed: stop.
  seen = {{100, 100, 0}, {100, 90, 10}, {100, 30, 70}};
  EXPECT_EQ(thief.choose(seen, 1.0).items, 0u);
}

// `scan` peeks only the slices that can still be the victim and picks the
// victim a full peek would pick: random progress, stale views, many trials.
namespace {
// memory_store without add_many: `scan` then peeks slice by slice.
struct single_add_store {
  el::memory_store* inner;
  std::int64_t add(const std::string& k, std::int64_t d, ef::deadline dl) { return inner->add(k, d, dl); }
};
static_assert(pl::counter_store<single_add_store> && !pl::batch_counter_store<single_add_store>);
static_assert(pl::batch_counter_store<el::memory_store>);

template <bool Batched>
void scan_matches_full_peek(std::uint64_t seed);
}  // namespace

TEST(WorkStealing, ScanPicksTheFullPeekVictimWithFewerReads) {
  scan_matches_full_peek<false>(77);  // bound-pruned peeks, one by one
  scan_matches_full_peek<true>(78);   // one batched read
}

namespace {
template <bool Batched>
void scan_matches_full_peek(std::uint64_t seed) {
  using Store = std::conditional_t<Batched, el::memory_store, single_add_store>;
  std::mt19937_64 rng(seed);
  std::uint64_t scan_reads = 0, full_reads = 0;
  for (int t = 0; t < 300; ++t) {
    el::memory_store mem;
    single_add_store full_view{&mem};
    auto& store = mem;
    Store& thief_store = [&]() -> Store& {
      if constexpr (Batched)
        return mem;
      else
        return full_view;
    }();
    const std::size_t n = 2 + rng() % 14;
    std::vector<pl::worker_spec> m;
    std::vector<std::size_t> sizes;
    for (std::size_t i = 0; i < n; ++i) {
      m.push_back({i, 1e-3 * static_cast<double>(rng() % 4), 1e-3 * static_cast<double>(1 + rng() % 8), 1000, 0, 0});
      sizes.push_back(i > 0 && rng() % 5 == 0 ? 0 : 20 + rng() % 200);
    }
    const pl::batch_plan plan = pl::make_plan(m, sizes, 1);
    const std::uint64_t step = static_cast<std::uint64_t>(t);
    std::vector<std::uint64_t> front(n, 0);
    const auto d = ebbflow::deadline::after(std::chrono::seconds(5));
    auto progress = [&] {  // owners and other thieves move on: F grows (never past the slice), K grows
      for (std::size_t r = 1; r < n; ++r) {
        if (sizes[r] == 0) continue;
        const std::string key = "scan/0/" + std::to_string(step) + "/" + std::to_string(r);
        const std::uint64_t f = std::min<std::uint64_t>(rng() % 2 ? rng() % 60 : 0, sizes[r] - front[r]);
        front[r] += f;
        (void)store.add(key, static_cast<std::int64_t>(f) << 32, d);
        if (rng() % 3 == 0) (void)store.add(key, static_cast<std::int64_t>(rng() % 30), d);
      }
    };
    pl::work_stealer<Store> thief(thief_store, "scan", {0, step}, plan, 0);
    pl::work_stealer<single_add_store> fresh(full_view, "scan", {0, step}, plan, 0);
    const pl::steal_policy pol(m, plan, 0, 1e-5, 1e-4);
    progress();
    (void)pol.scan(thief, 0.05);  // an earlier scan: the thief's views go stale from here on
    progress();
    const double now = 0.05 + 0.001 * static_cast<double>(rng() % 200);
    const std::uint64_t before = thief.store_calls();
    const auto got = pol.scan(thief, now);
    const std::uint64_t reads = thief.store_calls() - before;
    scan_reads += reads;
    std::vector<pl::slice_state> all(n);
    for (std::size_t r = 0; r < n; ++r) all[r] = r == 0 ? fresh.last_seen(0) : fresh.peek(r);
    full_reads += fresh.store_calls();
    EXPECT_LE(reads, fresh.store_calls()) << "trial " << t;
    const auto want = pol.choose(all, now);
    ASSERT_EQ(got.items == 0, want.items == 0) << "trial " << t;
    if (want.items == 0) continue;
    // The same victim, or one whose estimated time left ties with it.
    EXPECT_DOUBLE_EQ(pol.time_left(got.victim, all[got.victim], now), pol.time_left(want.victim, all[want.victim], now))
        << "trial " << t << ": scan picked " << got.victim << ", a full peek " << want.victim;
  }
  EXPECT_LT(scan_reads, full_reads * 3 / 4) << scan_reads << " round trips by scan, " << full_reads << " by full peeks";
}
}  // namespace

// Real threads on the real clock: one worker is 6x slower per item. The
// driver must cover every item exactly once, and the others must take over
// part of the straggler's slice, detected by progress alone.
TEST(WorkStealing, DriverMovesAStragglersTailToOthers) {
  el::memory_store store;
  const std::size_t n = 4;
  const std::vector<std::size_t> sizes(n, 60);
  std::vector<pl::worker_spec> m;
  for (std::size_t i = 0; i < n; ++i) m.push_back({i, 0.0, 200e-6, 1000, 0, 0});  // planned 200 us/item
  const pl::batch_plan plan = pl::make_plan(m, sizes, 1);
  std::vector<pl::chunk> all;
  std::vector<pl::steal_report> rep(n);
  std::mutex mu;
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      pl::steal_options o;
      o.min_chunk = 2;
      pl::work_stealer<el::memory_store> ws(store, "drv", {1, 1}, plan, r, o);
      pl::steal_policy pol(m, plan, r, 5e-6, 20e-6);
      const auto per_item = std::chrono::microseconds(r == 0 ? 1200 : 200);
      rep[r] = pl::run_stealing_step(ws, pol, [&](const pl::chunk& c) {
        std::this_thread::sleep_for(per_item * c.size());
        std::lock_guard lk(mu);
        all.push_back(c);
      });
    });
  for (auto& t : threads) t.join();
  ASSERT_EQ(check_exactly_once(sizes, all), "");
  std::uint64_t total = 0, stolen_from_0 = 0;
  for (auto& r : rep) total += r.processed;
  for (auto& c : all)
    if (c.rank == 0 && c.stolen) stolen_from_0 += c.size();
  EXPECT_EQ(total, 240u);
  EXPECT_GT(stolen_from_0, 15u) << "the straggler kept " << rep[0].processed - rep[0].stolen << " of 60";
  EXPECT_LT(rep[0].processed, 45u);
}

// ------------------------------------------------------------ bad input
using plan_test::expect_plan_error;

TEST(WorkStealing, BadInputHasNamedErrors) {
  el::memory_store store;
  using ws = pl::work_stealer<el::memory_store>;
  const std::vector<std::size_t> none;
  expect_plan_error([&] { ws(store, "b", {}, none, 0); }, pl::plan_errc::empty_membership, "no slices");
  const std::vector<std::size_t> huge = {10, std::size_t{1} << 31};
  EXPECT_EQ(expect_plan_error([&] { ws(store, "b", {}, huge, 0); }, pl::plan_errc::slice_too_large, "2^31").worker,
            std::optional<std::uint64_t>(1));
  const std::vector<std::size_t> negative = {static_cast<std::size_t>(-5)};  // a negative count cast to size_t
  expect_plan_error([&] { ws(store, "b", {}, negative, 0); }, pl::plan_errc::slice_too_large, "exceeds");
  const std::vector<std::size_t> ok = {10, 10};
  const std::vector<std::size_t> max_ok = {pl::max_slice_items, 0};
  EXPECT_NO_THROW(ws(store, "b", {}, max_ok, 0));
  expect_plan_error([&] { ws(store, "b", {}, ok, 2); }, pl::plan_errc::bad_rank, "rank 2");
  pl::steal_options bad;
  bad.first_fraction = 0;
  expect_plan_error([&] { ws(store, "b", {}, ok, 0, bad); }, pl::plan_errc::bad_steal_request, "first_fraction");
  bad = {};
  bad.owner_divisor = 0;
  expect_plan_error([&] { ws(store, "b", {}, ok, 0, bad); }, pl::plan_errc::bad_steal_request, "owner_divisor");
  bad = {};
  bad.min_chunk = 0;
  expect_plan_error([&] { ws(store, "b", {}, ok, 0, bad); }, pl::plan_errc::bad_steal_request, "min_chunk");
  ws w(store, "b", {1, 1}, ok, 0);
  expect_plan_error([&] { (void)w.claim_own(0); }, pl::plan_errc::bad_steal_request, "cap 0");
  expect_plan_error([&] { (void)w.steal(0); }, pl::plan_errc::bad_steal_request, "cap 0");
  expect_plan_error([&] { (void)w.steal_from(0, 5); }, pl::plan_errc::bad_steal_request, "own slice");
  expect_plan_error([&] { (void)w.steal_from(1, 0); }, pl::plan_errc::bad_steal_request, "0 items");
  expect_plan_error([&] { (void)w.steal_from(7, 1); }, pl::plan_errc::bad_rank, "victim 7");
  expect_plan_error([&] { (void)w.peek(9); }, pl::plan_errc::bad_rank, "rank 9");
  expect_plan_error([&] { (void)w.weight(0); }, pl::plan_errc::zero_batch, "global batch 0");
  // A counter that this protocol cannot have written: negative, or an owner
  // count beyond the slice (e.g. a key reused by something else).
  store.add(w.key(1), -5, ef::deadline::never());
  // Found at run time in the store: plan_fault, naming the slice's rank.
  EXPECT_EQ(expect_plan_error([&] { (void)w.peek(1); }, pl::plan_errc::bad_counter, "negative").worker,
            std::optional<std::uint64_t>(1));
  ws w2(store, "b", {1, 2}, ok, 0);
  store.add(w2.key(0), std::int64_t{11} << 32, ef::deadline::never());
  expect_plan_error([&] { (void)w2.claim_own(); }, pl::plan_errc::bad_counter, "owner count");
  // A policy for a plan of another size.
  {
    std::vector<pl::worker_spec> one = {{1, 0, 0.001, 100, 0, 0}};
    const std::vector<std::size_t> ten = {10};
    const pl::batch_plan p1 = pl::make_plan(one, ten, 1);
    std::vector<pl::worker_spec> two = {{1, 0, 0.001, 100, 0, 0}, {2, 0, 0.001, 100, 0, 0}};
    expect_plan_error([&] { pl::steal_policy(two, p1, 0, 0, 0); }, pl::plan_errc::membership_mismatch, "2 models");
    expect_plan_error([&] { pl::steal_policy(one, p1, 1, 0, 0); }, pl::plan_errc::bad_rank, "rank 1");
  }
  // A chunk that lies outside its slice.
  pl::epoch_sampler sampler(100, 1);
  std::vector<pl::worker_spec> spec = {{1, 0, 0.001, 100, 0, 0}, {2, 0, 0.001, 100, 0, 0}};
  const pl::batch_plan plan = pl::make_plan(spec, ok, 1);
  expect_plan_error(
      [&] {
        (void)pl::samples_of(sampler.state(), plan, pl::chunk{1, 5, 11});
      },
      pl::plan_errc::bad_rank, "outside rank 1");
}

}  // namespace
