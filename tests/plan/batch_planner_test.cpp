// SPDX-License-Identifier: Apache-2.0
// Must-show 1: the planner's step time equals the exhaustive optimum on random
// small instances, including caps, a >> c·b, c·b >> a and a 100x slower worker.
#include <ebbflow/plan/batch_planner.hpp>
#include <ebbflow/plan/replanner.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace pl = ebbflow::plan;

namespace {

// Exhaustive search over every integer split within bounds.
double exhaustive_optimum(const std::vector<pl::worker_spec>& w, std::size_t B) {
  double best = std::numeric_limits<double>::infinity();
  std::vector<std::size_t> b(w.size());
  auto rec = [&](auto&& self, std::size_t i, std::size_t left, double cur) -> void {
    if (cur >= best) return;
    if (i + 1 == w.size()) {
      if (left < w[i].min_batch || left > w[i].max_batch) return;
      best = std::min(best, std::max(cur, w[i].step_time(left)));
      return;
    }
    for (std::size_t x = w[i].min_batch; x <= std::min(w[i].max_batch, left); ++x)
      self(self, i + 1, left - x, std::max(cur, w[i].step_time(x)));
  };
  rec(rec, 0, B, -std::numeric_limits<double>::infinity());
  return best;
}

// Reference for the canonical split: lo_i plus the K smallest increments in
// (value, rank) order, by sorting every increment.
std::vector<std::size_t> reference_split(const std::vector<pl::worker_spec>& w, std::size_t B) {
  struct inc {
    double v;
    std::size_t r;
  };
  std::vector<inc> all;
  std::size_t K = B;
  std::vector<std::size_t> b(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) {
    b[i] = w[i].min_batch;
    K -= w[i].min_batch;
    for (std::size_t x = w[i].min_batch + 1; x <= std::min(w[i].max_batch, B); ++x)
      all.push_back({w[i].step_time(x), i});
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const inc& x, const inc& y) { return x.v < y.v || (x.v == y.v && x.r < y.r); });
  for (std::size_t k = 0; k < K; ++k) ++b[all[k].r];
  return b;
}

void check_valid(const pl::batch_plan& p, const std::vector<pl::worker_spec>& w, std::size_t B) {
  ASSERT_EQ(p.size(), w.size());
  ASSERT_EQ(p.global_batch, B);
  ASSERT_EQ(p.offsets.size(), w.size() + 1);
  std::size_t sum = 0;
  double t = 0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    ASSERT_GE(p.batch[i], w[i].min_batch) << "rank " << i;
    ASSERT_LE(p.batch[i], w[i].max_batch) << "rank " << i;
    ASSERT_EQ(p.offsets[i], sum);
    sum += p.batch[i];
    t = std::max(t, w[i].step_time(p.batch[i]));
  }
  ASSERT_EQ(sum, B);
  ASSERT_EQ(p.step_time, t);
}

enum class family { random, caps, fixed_dominant, per_sample_dominant, one_slow, minimums };

std::string name(family f) {
  switch (f) {
    case family::random:
      return "random";
    case family::caps:
      return "caps";
    case family::fixed_dominant:
      return "fixed_dominant";
    case family::per_sample_dominant:
      return "per_sample_dominant";
    case family::one_slow:
      return "one_100x_slower";
    case family::minimums:
      return "minimums";
  }
  return "?";
}

// A random feasible instance of the family; B is small enough for exhaustive search.
std::pair<std::vector<pl::worker_spec>, std::size_t> instance(family f, std::mt19937_64& rng) {
  std::uniform_int_distribution<std::size_t> nd(1, 6);
  const std::size_t n = nd(rng);
  const std::size_t B_max = n <= 3 ? 40 : n == 4 ? 24 : n == 5 ? 16 : 13;
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<pl::worker_spec> w(n);
  for (std::size_t i = 0; i < n; ++i) {
    w[i].id = 100 + i;
    w[i].c = 0.001 * (0.25 + 4 * u(rng));
    w[i].a = 0.01 * u(rng);
    w[i].max_batch = B_max;
    // Round some values so that exact ties between workers occur.
    if (u(rng) < 0.3) w[i].c = 0.001 * std::floor(1 + 3 * u(rng));
    if (u(rng) < 0.3) w[i].a = 0;
  }
  switch (f) {
    case family::random:
      break;
    case family::caps:
      for (auto& x : w) x.max_batch = 1 + static_cast<std::size_t>(u(rng) * B_max / 2);
      break;
    case family::fixed_dominant:  // a >> c·b
      for (auto& x : w) x.a = 1.0 + 10 * u(rng);
      break;
    case family::per_sample_dominant:  // c·b >> a
      for (auto& x : w) x.a = 1e-7 * u(rng);
      break;
    case family::one_slow:
      w[static_cast<std::size_t>(u(rng) * n) % n].c *= 100;
      break;
    case family::minimums:
      for (auto& x : w) x.min_batch = static_cast<std::size_t>(u(rng) * 3);
      break;
  }
  std::size_t sum_max = 0, sum_min = 0;
  for (auto& x : w) {
    sum_max += x.max_batch;
    sum_min += x.min_batch;
  }
  std::size_t hi = std::min(sum_max, B_max);
  std::size_t lo = std::max<std::size_t>(1, sum_min);
  if (lo > hi) {
    for (auto& x : w) x.min_batch = 0;
    lo = 1;
  }
  std::uniform_int_distribution<std::size_t> bd(lo, hi);
  return {w, bd(rng)};
}

class ExhaustiveOptimum : public ::testing::TestWithParam<family> {};

TEST_P(ExhaustiveOptimum, StepTimeEqualsExhaustiveSearch) {
  std::mt19937_64 rng(0xeb0f10 + static_cast<int>(GetParam()));
  for (int trial = 0; trial < 300; ++trial) {
    auto [w, B] = instance(GetParam(), rng);
    pl::batch_plan p = pl::solve(w, B, 7);
    check_valid(p, w, B);
    EXPECT_EQ(p.version, 7u);
    const double opt = exhaustive_optimum(w, B);
    // Exact: both are the same IEEE value t_i(b) of some worker and batch.
    ASSERT_EQ(p.step_time, opt) << name(GetParam()) << " trial " << trial << " n=" << w.size() << " B=" << B;
    ASSERT_EQ(p.batch, reference_split(w, B)) << "not the canonical split, trial " << trial;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, ExhaustiveOptimum,
                         ::testing::Values(family::random, family::caps, family::fixed_dominant,
                                           family::per_sample_dominant, family::one_slow, family::minimums),
                         [](const auto& info) { return name(info.param); });

// Larger instances: the split is the canonical one (independent of the
// solver's floating-point path), and an optimality certificate holds: at any
// time below the plan's, fewer than B samples fit.
TEST(BatchPlanner, LargeInstancesAreCanonicalAndCertified) {
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (std::size_t n : {7u, 50u, 333u, 2000u}) {
    for (int trial = 0; trial < 4; ++trial) {
      std::vector<pl::worker_spec> w(n);
      const double ratios[] = {1.0, 2.2, 4.0};
      for (std::size_t i = 0; i < n; ++i) {
        w[i] = {i * 3 + 1,
                0.002 * u(rng),
                0.004 / ratios[i % 3] * (0.9 + 0.2 * u(rng)),
                static_cast<std::size_t>(64 + 512 * u(rng)),
                0,
                trial == 3 ? 0.001 * u(rng) : 0.0};
      }
      const std::size_t B = static_cast<std::size_t>(n * (100 + 100 * u(rng)));
      pl::batch_plan p = pl::solve(w, B);
      check_valid(p, w, B);
      if (n <= 333) {
        ASSERT_EQ(p.batch, reference_split(w, B));
      }
      std::size_t below = 0;
      bool lo_binds = false;
      for (const auto& x : w) {
        if (x.step_time(x.min_batch) >= p.step_time) lo_binds = true;
        std::size_t k = x.min_batch;
        while (k < x.max_batch && x.step_time(k + 1) < p.step_time) ++k;
        below += k;
      }
      EXPECT_TRUE(lo_binds || below < B) << "n=" << n << ": a faster split exists";
    }
  }
}

TEST(BatchPlanner, IdenticalInputsGiveIdenticalPlans) {
  std::vector<pl::worker_spec> w = {{5, 0.01, 0.002, 100}, {9, 0.01, 0.002, 100}, {2, 0.0, 0.004, 100}};
  pl::batch_plan p1 = pl::solve(w, 101), p2 = pl::solve(w, 101);
  EXPECT_EQ(p1.batch, p2.batch);
  EXPECT_EQ(p1.step_time, p2.step_time);
  // Ties between equal workers go to the lower rank first.
  EXPECT_GE(p1.batch[0], p1.batch[1]);
}

TEST(BatchPlanner, CapsAndHundredFoldSlowerWorker) {
  std::vector<pl::worker_spec> w = {{1, 0, 0.001, 50}, {2, 0, 0.001, 1000}, {3, 0, 0.1, 1000}};
  pl::batch_plan p = pl::solve(w, 300);
  EXPECT_EQ(p.batch[0], 50u);  // capped
  EXPECT_EQ(p.batch[2], 2u);   // 100x slower: 2 samples cost 0.2 s, like 200 on the fast one
  EXPECT_EQ(p.batch[1], 248u);
}

TEST(BatchPlanner, CommunicationHookShiftsLoad) {
  std::vector<pl::worker_spec> w = {{1, 0, 0.001, 1000}, {2, 0, 0.001, 1000}};
  EXPECT_EQ(pl::solve(w, 200).batch, (std::vector<std::size_t>{100, 100}));
  w[1].comm_s = 0.02;  // a slower link: 20 samples' worth
  EXPECT_EQ(pl::solve(w, 200).batch, (std::vector<std::size_t>{110, 90}));
}

// The loss-scaling contract: mean loss per worker times w_i, summed, is the
// global mean.
TEST(BatchPlanner, WeightedMeansSumToTheGlobalMean) {
  std::vector<pl::worker_spec> w = {
      {1, 0.01, 0.001, 500}, {2, 0.0, 0.0025, 500}, {3, 0.2, 0.01, 500}, {4, 0.001, 0.0004, 500}};
  const std::size_t B = 777;
  pl::batch_plan p = pl::solve(w, B);
  std::mt19937_64 rng(3);
  std::normal_distribution<double> g(0, 1);
  std::vector<double> grads(B);
  for (auto& x : grads) x = g(rng);
  const double global_mean = std::accumulate(grads.begin(), grads.end(), 0.0) / B;
  double sum = 0, wsum = 0;
  for (std::size_t r = 0; r < p.size(); ++r) {
    wsum += p.weight(r);
    if (p.batch[r] == 0) continue;  // contributes a zero gradient
    double local = 0;
    for (std::size_t j = p.offsets[r]; j < p.offsets[r + 1]; ++j) local += grads[j];
    sum += p.weight(r) * (local / static_cast<double>(p.batch[r]));
  }
  EXPECT_NEAR(sum, global_mean, 1e-12);
  EXPECT_NEAR(wsum, 1.0, 1e-12);
  EXPECT_EQ(p.weights().size(), 4u);
}

// One worker with a large fixed cost sets the slowest minimum step; the
// others' counts at it sum far past B. The level is searched below it: the
// plan equals the closed form, for a B that one-sample-at-a-time repair
// would never finish (before: seconds at B = 1e8; here B = 1e13).
TEST(Solve, ALargeFixedCostDoesNotMakeTheRepairLinearInB) {
  const std::size_t B = 10'000'000'000'000;
  std::vector<pl::worker_spec> w;
  w.push_back({0, 0.5, 1e-15, B, 0, 0});
  for (std::uint64_t i = 1; i < 8; ++i) w.push_back({i, 0.01, 1e-15, B, 0, 0});
  const auto p = pl::solve(w, B);
  EXPECT_EQ(p.offsets.back(), B);
  std::size_t sum = 0;
  for (auto b : p.batch) sum += b;
  EXPECT_EQ(sum, B);
  // Workers 1-7 are equal: their sizes differ by at most one.
  const auto [mn, mx] = std::minmax_element(p.batch.begin() + 1, p.batch.end());
  EXPECT_LE(*mx - *mn, 1u);
  EXPECT_EQ(p.batch[0], 0u);  // its first sample would end after 0.5 s, the others' last long before
}

TEST(Replanner, MembershipChangeReplansAtOnceWithNewVersion) {
  pl::replanner rp;
  std::vector<pl::worker_spec> w = {{1, 0, 0.001, 1000}, {2, 0, 0.002, 1000}};
  EXPECT_EQ(rp.update(w, 300).version, 1u);
  EXPECT_EQ(rp.last_reason(), pl::replan_reason::initial);
  EXPECT_EQ(rp.update(w, 300).version, 1u);
  EXPECT_EQ(rp.last_reason(), pl::replan_reason::kept);
  w.push_back({3, 0, 0.001, 1000});
  EXPECT_EQ(rp.update(w, 300).version, 2u);
  EXPECT_EQ(rp.last_reason(), pl::replan_reason::membership);
  EXPECT_EQ(rp.update(w, 400).version, 3u);
  EXPECT_EQ(rp.last_reason(), pl::replan_reason::batch);
  std::swap(w[0], w[1]);  // rank order changed
  EXPECT_EQ(rp.update(w, 400).version, 4u);
  EXPECT_EQ(rp.last_reason(), pl::replan_reason::membership);
}

// Bounds that change under the plan in force (max_batch lowered after an
// out-of-memory error): re-plan at once, not after drift (it was kept for
// good, looking faster than any feasible plan).
TEST(Replanner, APlanOutsideTheWorkersBoundsIsReplacedAtOnce) {
  pl::replanner rp;
  std::vector<pl::worker_spec> w = {{1, 0, 1e-3, 100}, {2, 0, 1e-3, 100}};
  EXPECT_EQ(rp.update(w, 100).batch, (std::vector<std::size_t>{50, 50}));
  w[0].max_batch = 30;
  EXPECT_EQ(rp.update(w, 100).batch, (std::vector<std::size_t>{30, 70}));
  EXPECT_EQ(rp.last_reason(), pl::replan_reason::bounds);
  EXPECT_EQ(pl::to_string(rp.last_reason()), "bounds");
  w[0].max_batch = 100;
  w[1].min_batch = 80;
  EXPECT_EQ(rp.update(w, 100).batch, (std::vector<std::size_t>{20, 80}));
  EXPECT_EQ(rp.last_reason(), pl::replan_reason::bounds);
  EXPECT_EQ(rp.update(w, 100).version, 3u);
  EXPECT_EQ(rp.last_reason(), pl::replan_reason::kept);
}

TEST(Replanner, HysteresisIgnoresNoiseAndFollowsPersistentDrift) {
  pl::replanner rp({.threshold = 0.02, .persist = 3});
  std::vector<pl::worker_spec> w = {{1, 0.01, 0.001, 4000}, {2, 0.01, 0.002, 4000}, {3, 0.01, 0.004, 4000}};
  rp.update(w, 2048);
  std::mt19937_64 rng(11);
  std::normal_distribution<double> noise(0, 0.003);  // 0.3 % model noise: below the threshold
  auto noisy = w;
  for (int s = 0; s < 500; ++s) {
    for (std::size_t i = 0; i < w.size(); ++i) noisy[i].c = w[i].c * (1 + noise(rng));
    rp.update(noisy, 2048);
  }
  EXPECT_EQ(rp.current().version, 1u) << "plans flapped under noise";
  // A persistent slowdown of worker 1 by 30 %: adopted on the third check.
  w[0].c *= 1.3;
  rp.update(w, 2048);
  EXPECT_EQ(rp.current().version, 1u);
  EXPECT_EQ(rp.streak(), 1u);
  rp.update(w, 2048);
  EXPECT_EQ(rp.current().version, 1u);
  rp.update(w, 2048);
  EXPECT_EQ(rp.current().version, 2u);
  EXPECT_EQ(rp.last_reason(), pl::replan_reason::drift);
  EXPECT_EQ(rp.current().batch, pl::solve(w, 2048).batch);
  // A drift that does not persist resets the streak.
  auto fast = w;
  fast[2].c /= 1.5;
  rp.update(fast, 2048);
  rp.update(fast, 2048);
  rp.update(w, 2048);
  rp.update(fast, 2048);
  EXPECT_EQ(rp.current().version, 2u);
}

}  // namespace
