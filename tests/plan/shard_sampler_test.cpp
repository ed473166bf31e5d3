// SPDX-License-Identifier: Apache-2.0
// Sharded mode: exactly-once per epoch across joins, leaves and rolled-back
// steps, each rank reading only shards it owns.
#include <ebbflow/plan/shard_sampler.hpp>

#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <random>
#include <vector>

namespace pl = ebbflow::plan;

namespace {

TEST(ShardSampler, ExactlyOnceAndOwnShardsOnly) {
  std::mt19937_64 rng(77);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<std::uint64_t> sizes;
  std::uint64_t n = 0;
  for (int j = 0; j < 23; ++j) {
    sizes.push_back(20 + static_cast<std::uint64_t>(u(rng) * 200));
    n += sizes.back();
  }
  pl::shard_sampler s(sizes, 5);
  std::vector<std::uint64_t> members = {1, 2, 3, 4};
  std::uint64_t next_id = 5, version = 0;
  auto make = [&] {
    std::vector<pl::worker_spec> w;
    for (std::uint64_t id : members) w.push_back({id, 0.0, 0.001 * (0.25 + 4 * u(rng)), 1000});
    return pl::solve(w, 64 * members.size(), ++version);
  };
  pl::batch_plan plan = make();
  std::map<std::uint64_t, std::vector<int>> seen;
  int rollbacks = 0, changes = 0;
  while (s.epoch() < 3) {
    const double e = u(rng);
    if (e < 0.05) {
      members.push_back(next_id++);
      plan = make();
      ++changes;
    } else if (e < 0.10 && members.size() > 1) {
      members.erase(members.begin() + static_cast<long>(u(rng) * members.size()));
      plan = make();
      ++changes;
    }
    const pl::batch_plan real = s.actual(plan);
    ASSERT_GT(real.global_batch, 0u);
    std::vector<std::vector<pl::shard_range>> parts;
    for (std::size_t r = 0; r < plan.size(); ++r) {
      parts.push_back(s.slice(plan, r));
      std::uint64_t got = 0;
      for (const auto& x : parts.back()) got += x.last - x.first;
      ASSERT_EQ(got, real.batch[r]);
    }
    if (u(rng) < 0.1) {
      ++rollbacks;
      continue;
    }
    const std::uint64_t epoch = s.epoch();
    auto& counts = seen[epoch];
    if (counts.empty()) counts.assign(n, 0);
    const pl::shard_sampler before = s;
    s.commit(plan);
    for (std::size_t r = 0; r < plan.size(); ++r)
      for (const auto& x : parts[r]) {
        // The commit assigned ownership exactly as the slices saw it.
        if (s.epoch() == epoch) {
          ASSERT_EQ(s.owners()[x.shard], plan.worker_ids[r]) << "read a shard it does not own";
        }
        for (std::uint64_t p = x.first; p < x.last; ++p) ++counts[before.index(x.shard, p)];
      }
  }
  for (const auto& [epoch, counts] : seen) {
    if (epoch >= s.epoch()) continue;
    for (std::uint64_t i = 0; i < n; ++i) ASSERT_EQ(counts[i], 1) << "epoch " << epoch << " index " << i;
  }
  EXPECT_GT(rollbacks, 0);
  EXPECT_GT(changes, 0);
}

TEST(ShardSampler, FastWorkersOwnMoreData) {
  pl::shard_sampler s(std::vector<std::uint64_t>(40, 100), 1);
  std::vector<pl::worker_spec> w = {{1, 0, 0.004, 1000}, {2, 0, 0.001, 1000}};
  pl::batch_plan p = pl::solve(w, 500);
  s.rebalance(p);
  std::uint64_t owned[2] = {};
  for (std::uint64_t o : s.owners()) ++owned[o - 1];
  EXPECT_EQ(owned[0], 8u);  // weight 0.2 of 40 shards
  EXPECT_EQ(owned[1], 32u);
}

// A re-plan that gives an owner b_r = 0 mid-epoch (a slow worker, same
// members): its unread shards go to the members that take samples, so the
// epoch still ends with every sample read once (it stalled for good, and
// actual() gave a global batch of 0, before).
TEST(ShardSampler, ShardsOfAnOwnerReplannedToZeroMoveOn) {
  pl::shard_sampler s({10, 10}, 42);
  std::vector<pl::worker_spec> w = {{1, 0.0, 1e-3, 100}, {2, 0.0, 1e-3, 100}};
  const auto p1 = pl::solve(w, 10, 1);
  ASSERT_EQ(p1.batch, (std::vector<std::size_t>{5, 5}));
  std::map<std::uint64_t, int> seen;
  const auto step = [&](const pl::batch_plan& p) {
    const auto act = s.actual(p);
    ASSERT_GT(act.global_batch, 0u);
    for (std::size_t r = 0; r < p.size(); ++r)
      for (const auto& x : s.slice(p, r))
        for (auto k = x.first; k < x.last; ++k) ++seen[s.index(x.shard, k)];
    s.commit(p);
  };
  step(p1);
  w[1].a = 1.0;  // worker 2 became far slower: it gets nothing
  const auto p2 = pl::solve(w, 10, 2);
  ASSERT_EQ(p2.batch, (std::vector<std::size_t>{10, 0}));
  for (int k = 0; k < 4 && s.epoch() == 0; ++k) step(p2);
  EXPECT_EQ(s.epoch(), 1u);
  ASSERT_EQ(seen.size(), 20u);
  for (auto [i, n] : seen) EXPECT_EQ(n, 1) << "sample " << i;
}

TEST(ShardSampler, ReservedIdsAndOverflowingSizesAreNamed) {
  const auto max = std::numeric_limits<std::uint64_t>::max();
  try {
    pl::shard_sampler s({max, 2}, 1);
    ADD_FAILURE();
  } catch (const pl::plan_error& e) {
    EXPECT_EQ(e.code(), pl::plan_errc::bad_dataset);
  }
  pl::shard_sampler s({10, 10}, 1);
  std::vector<pl::worker_spec> w = {{1, 0.0, 1e-3, 100}, {pl::shard_sampler::unowned, 0.0, 1e-3, 100}};
  try {
    s.rebalance(pl::solve(w, 10));
    ADD_FAILURE();
  } catch (const pl::plan_error& e) {
    EXPECT_EQ(e.code(), pl::plan_errc::membership_mismatch);
  }
}

TEST(ShardSampler, IndexOutsideTheDataSetIsAPlanError) {
  const pl::shard_sampler s({10, 10}, 1);
  EXPECT_GE(s.index(1, 9), 10u);  // shard 1 holds indices [10, 20)
  for (auto [shard, pos] : {std::pair<std::uint64_t, std::uint64_t>{5, 0}, {0, 10}, {1, 50}}) {
    try {
      (void)s.index(shard, pos);
      ADD_FAILURE() << shard << ":" << pos;
    } catch (const pl::plan_error& e) {
      EXPECT_EQ(e.code(), pl::plan_errc::bad_rank);
    }
  }
}

}  // namespace
