// SPDX-License-Identifier: Apache-2.0
// Must-show 2: exactly-once per epoch across random re-plans, joins, leaves,
// failures (rolled-back steps) and changes of the global batch, and every
// worker's slice computable from (state, plan) alone.
#include <ebbflow/plan/batch_planner.hpp>
#include <ebbflow/plan/sampler.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

namespace pl = ebbflow::plan;

namespace {

TEST(EpochPermutation, IsABijectionAndDiffersPerEpoch) {
  for (std::uint64_t n : {1ull, 2ull, 3ull, 5ull, 16ull, 17ull, 1000ull, 4097ull, 65537ull}) {
    pl::epoch_permutation p(n, 1234, 0), q(n, 1234, 1), r(n, 1234, 0);
    std::vector<char> seen(n, 0);
    std::uint64_t same = 0;
    for (std::uint64_t i = 0; i < n; ++i) {
      const std::uint64_t x = p(i);
      ASSERT_LT(x, n);
      ASSERT_FALSE(seen[x]) << "n=" << n << " index " << x << " twice";
      seen[x] = 1;
      same += x == q(i);
      ASSERT_EQ(x, r(i));  // deterministic
    }
    if (n >= 1000) {
      EXPECT_LT(same, n / 50) << "epochs 0 and 1 look alike";
    }
  }
  // Large N without materialising: spot-check range and distinctness.
  pl::epoch_permutation big(std::uint64_t{1} << 40, 9, 3);
  std::set<std::uint64_t> s;
  for (std::uint64_t i = 0; i < 1000; ++i) s.insert(big(i * 1'000'003));
  EXPECT_EQ(s.size(), 1000u);
  EXPECT_LT(*s.rbegin(), std::uint64_t{1} << 40);
}

struct scenario {
  std::uint64_t n;
  pl::last_batch policy;
  std::uint64_t seed;
};

class ExactlyOnce : public ::testing::TestWithParam<scenario> {};

TEST_P(ExactlyOnce, AcrossReplansJoinsLeavesAndRollbacks) {
  const scenario sc = GetParam();
  std::mt19937_64 rng(sc.seed);
  std::uniform_real_distribution<double> u(0, 1);
  pl::epoch_sampler sampler(sc.n, sc.seed * 31 + 7, sc.policy);

  std::vector<std::uint64_t> members = {1, 2, 3};
  std::uint64_t next_id = 4, version = 0;
  std::size_t nominal = 1 + static_cast<std::size_t>(u(rng) * sc.n / 7);
  auto models = [&] {
    std::vector<pl::worker_spec> w;
    for (std::uint64_t id : members)
      w.push_back({id, 0.01 * u(rng), 0.001 * (0.25 + 4 * u(rng)), 1 + static_cast<std::size_t>(u(rng) * sc.n)});
    return w;
  };
  auto make = [&] {
    for (;;) {
      auto w = models();
      std::size_t cap = 0;
      for (auto& x : w) cap += x.max_batch;
      const std::size_t B = sampler.step_size(nominal);
      if (cap >= B) return pl::solve(w, B, ++version);
    }
  };
  pl::batch_plan plan = make();

  std::map<std::uint64_t, std::vector<int>> seen;  // epoch -> count per index
  int events[5] = {};
  std::uint64_t steps = 0;
  while (sampler.epoch() < 4 || steps < 150) {
    const double e = u(rng);
    if (e < 0.10) {  // join
      members.insert(members.begin() + static_cast<long>(u(rng) * (members.size() + 1)), next_id++);
      plan = make();
      ++events[0];
    } else if (e < 0.20 && members.size() > 1) {  // graceful leave
      members.erase(members.begin() + static_cast<long>(u(rng) * members.size()));
      plan = make();
      ++events[1];
    } else if (e < 0.30) {  // re-plan with new models, sometimes a new nominal batch
      if (u(rng) < 0.5) nominal = 1 + static_cast<std::size_t>(u(rng) * sc.n / 5);
      plan = make();
      ++events[2];
    }
    if (plan.global_batch != sampler.step_size(nominal)) plan = make();  // end of epoch: short step

    // Every worker derives its slice from the serialized state and the plan.
    const auto bytes = sampler.state().encode();
    const pl::sampler_state received = pl::sampler_state::decode(bytes);
    ASSERT_EQ(received, sampler.state());
    std::vector<pl::sample_range> slices;
    std::uint64_t total = 0;
    for (std::size_t r = 0; r < plan.size(); ++r) {
      slices.push_back(pl::slice_of(received, plan, r));
      const pl::sample_range mine = sampler.slice(plan, r);
      ASSERT_EQ(mine.first, slices.back().first);
      ASSERT_EQ(mine.last, slices.back().last);
      ASSERT_EQ(mine.size(), plan.batch[r]);
      total += mine.size();
    }
    ASSERT_EQ(total, plan.global_batch);

    if (u(rng) < 0.1) {  // failure mid-step: roll back, the failed worker leaves
      ++events[3];
      if (members.size() > 1) members.erase(members.begin() + static_cast<long>(u(rng) * members.size()));
      plan = make();
      continue;  // not committed: nothing consumed
    }
    for (const pl::sample_range& s : slices) {
      auto& counts = seen[s.epoch];
      if (counts.empty()) counts.assign(sc.n, 0);
      for (std::uint64_t idx : s.indices()) ++counts[idx];
    }
    sampler.commit(plan);
    ++steps;
    ++events[4];
  }
  for (const auto& [epoch, counts] : seen) {
    if (epoch >= sampler.epoch()) continue;  // only finished epochs
    std::uint64_t once = 0;
    for (int c : counts) {
      ASSERT_LE(c, 1) << "epoch " << epoch << ": an index was served twice";
      once += c;
    }
    if (sc.policy == pl::last_batch::short_batch) {
      EXPECT_EQ(once, sc.n) << "epoch " << epoch << ": samples were lost";
    } else {
      EXPECT_GT(once, 0u);
    }
  }
  EXPECT_GE(seen.size(), 4u);
  EXPECT_GT(events[0] + events[1], 0);
  EXPECT_GT(events[3], 0);
  RecordProperty("steps", static_cast<int>(steps));
}

INSTANTIATE_TEST_SUITE_P(
    Random, ExactlyOnce,
    ::testing::Values(scenario{1000, pl::last_batch::short_batch, 1}, scenario{997, pl::last_batch::short_batch, 2},
                      scenario{5003, pl::last_batch::short_batch, 3}, scenario{64, pl::last_batch::short_batch, 4},
                      scenario{1000, pl::last_batch::drop, 5}, scenario{4099, pl::last_batch::drop, 6}));

TEST(EpochSampler, DropPolicySkipsOnlyTheTail) {
  pl::epoch_sampler s(10, 3, pl::last_batch::drop);
  std::vector<pl::worker_spec> w = {{1, 0, 0.001, 10}, {2, 0, 0.001, 10}};
  pl::batch_plan p = pl::solve(w, 4);
  EXPECT_EQ(s.step_size(4), 4u);
  std::set<std::uint64_t> e0;
  for (int i = 0; i < 2; ++i) {
    for (std::uint64_t x : s.step(p).indices()) e0.insert(x);
    s.commit(p);
  }
  EXPECT_EQ(e0.size(), 8u);
  EXPECT_EQ(s.epoch(), 0u);
  EXPECT_EQ(s.step(p).epoch, 1u);  // 2 left < 4: the next step starts epoch 1
  s.commit(p);
  EXPECT_EQ(s.epoch(), 1u);
  EXPECT_EQ(s.cursor(), 4u);
}

TEST(EpochSampler, ShortFinalBatchAndStateRoundTrip) {
  pl::epoch_sampler s(10, 3);
  std::vector<pl::worker_spec> w = {{1, 0, 0.001, 10}, {2, 0, 0.003, 10}};
  s.commit(pl::solve(w, 4, 1));
  s.commit(pl::solve(w, 4, 1));
  EXPECT_EQ(s.step_size(4), 2u);
  pl::batch_plan last = pl::solve(w, s.step_size(4), 2);
  pl::epoch_sampler joiner(pl::sampler_state::decode(s.state().encode()));
  EXPECT_EQ(joiner.slice(last, 0).first, s.slice(last, 0).first);
  EXPECT_EQ(joiner.slice(last, 1).last, 10u);
  s.commit(last);
  EXPECT_EQ(s.epoch(), 1u);
  EXPECT_EQ(s.cursor(), 0u);
  EXPECT_EQ(s.state().plan_version, 2u);
}

}  // namespace
