// SPDX-License-Identifier: Apache-2.0
// The planner without the elastic group, as docs/planner.md shows it: cost
// models, replanner and sampler in a plain loop. The minimal loop plans from
// its first step (the models are empty then), moves samples to the faster
// workers as the models fit, and sees every sample at most once; a joiner
// takes the plan in force and carries on from its version.
#include <ebbflow/plan.hpp>
// The headers' and class's former names still compile, for one release.
#include <ebbflow/plan/cost_models.hpp>
#include <ebbflow/plan/replan_policy.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <type_traits>
#include <vector>

namespace pl = ebbflow::plan;

static_assert(std::is_same_v<pl::cost_models, pl::worker_models>, "the old name of worker_models");

namespace {
// Worker i's true step time on b samples.
double true_time(std::size_t i, std::size_t b) {
  static constexpr double c[] = {1e-4, 2e-4, 4e-4};
  return 0.01 + c[i] * static_cast<double>(b);
}
}  // namespace

// The loop of docs/planner.md, run. Empty models used to make the first
// update throw bad_cost (c = 0); a worker given no samples, reporting its
// step time, used to throw bad_observation.
TEST(StandalonePlanner, TheDocumentedLoopPlansFromTheFirstStep) {
  const std::vector<std::uint64_t> ids = {10, 11, 12};
  const std::size_t B = 120, n = ids.size();
  pl::worker_models models;  // one model per worker id, identical on every rank
  pl::replanner planner;
  pl::epoch_sampler sampler(100'000, /*seed=*/42);
  std::set<std::uint64_t> seen;
  std::vector<std::size_t> first, last;
  for (int step = 0; step < 40; ++step) {
    const auto specs = models.specs(ids, /*max_batch=*/1 << 20);
    const pl::batch_plan& plan = planner.update(specs, sampler.step_size(B));
    for (std::size_t r = 0; r < n; ++r)
      for (std::uint64_t idx : sampler.slice(plan, r).indices()) EXPECT_TRUE(seen.insert(idx).second) << idx;
    sampler.commit(plan);
    for (std::size_t i = 0; i < n; ++i) models.observe(ids[i], plan.batch[i], true_time(i, plan.batch[i]));
    if (step == 0) first = plan.batch;
    last = plan.batch;
  }
  EXPECT_EQ(first, (std::vector<std::size_t>{40, 40, 40})) << "no models yet: the uniform split";
  EXPECT_GT(last[0], last[1]);
  EXPECT_GT(last[1], last[2]);
  EXPECT_EQ(seen.size(), 40 * B);
  // A worker with no samples still reports its step time: ignored, not an error.
  EXPECT_FALSE(models.observe(ids[2], 0, 0.01));
  EXPECT_FALSE(models.observe(ids[2], 5, 0.0));
  EXPECT_THROW(models.observe(ids[2], 5, std::numeric_limits<double>::infinity()), pl::plan_error);
}

// A newcomer without a fitted model is planned with the others' mean model,
// so it gets a share at once.
// Before any worker has a fitted model the plan is the uniform split, made
// from placeholder specs (a = 0, c = 1 s a sample): its step_time said 22 s
// for 22 samples a worker (users printed "22000 ms"). It is NaN, "not
// known", until a model fits; then it is a prediction again.
TEST(StandalonePlanner, TheUniformPlanBeforeAnyModelHasNoStepTime) {
  const std::vector<std::uint64_t> ids = {10, 11, 12, 13};
  pl::worker_models models;
  pl::replanner planner;
  const auto specs = models.specs(ids, 1 << 20);
  for (const auto& s : specs) EXPECT_TRUE(s.placeholder);
  const pl::batch_plan& first = planner.update(specs, 88);
  EXPECT_EQ(first.batch, (std::vector<std::size_t>{22, 22, 22, 22}));
  EXPECT_TRUE(std::isnan(first.step_time)) << first.step_time;
  EXPECT_TRUE(std::isnan(pl::solve(specs, 88).step_time));
  const std::vector<std::size_t> sizes = {22, 22, 22, 22};
  EXPECT_TRUE(std::isnan(pl::make_plan(specs, sizes, 1).step_time));
  EXPECT_EQ(planner.last_gap(), 0.0) << "no drift between placeholders";
  // The uniform plan stays in force (no re-plan on a gap that is not a number).
  EXPECT_EQ(&planner.update(specs, 88), &first);
  EXPECT_EQ(planner.last_reason(), pl::replan_reason::kept);
  // One fitted model: the others are planned with its model, a real prediction.
  for (int k = 0; k < 20; ++k) models.observe(ids[0], 10 + k % 5, 0.01 + 1e-3 * (10 + k % 5));
  const auto fitted = models.specs(ids, 1 << 20);
  for (const auto& s : fitted) EXPECT_FALSE(s.placeholder);
  const auto p = pl::solve(fitted, 88);
  EXPECT_FALSE(std::isnan(p.step_time));
  EXPECT_NEAR(p.step_time, 0.01 + 1e-3 * 22, 1e-3);
}

TEST(StandalonePlanner, ANewcomerGetsTheMeanModelOfTheOthers) {
  pl::worker_models models;
  for (int k = 0; k < 5; ++k) {
    models.observe(1, 10 + k, 0.01 + 1e-3 * (10 + k));
    models.observe(2, 10 + k, 0.03 + 3e-3 * (10 + k));
  }
  const std::vector<std::uint64_t> ids = {1, 2, 3};
  const auto specs = models.specs(ids, 1000);
  ASSERT_NE(models.fitted(1), nullptr);
  EXPECT_EQ(models.fitted(3), nullptr);
  EXPECT_DOUBLE_EQ(specs[2].c, (specs[0].c + specs[1].c) / 2);
  EXPECT_DOUBLE_EQ(specs[2].a, (specs[0].a + specs[1].a) / 2);
  EXPECT_EQ(specs[2].id, 3u);
  EXPECT_GT(pl::solve(specs, 90).batch[2], 0u);
  models.erase(1);
  EXPECT_EQ(models.fitted(1), nullptr);
}

// A joiner resumes the sampler from the others' state. Its own replanner
// started at version 1, older than the last committed plan: slice threw
// stale_plan. It adopts the plan in force instead and carries on.
TEST(StandalonePlanner, AJoinerAdoptsThePlanInForce) {
  const std::vector<std::uint64_t> ids = {1, 2};
  pl::worker_models models;
  pl::replanner member;
  pl::epoch_sampler sampler(10'000, 7);
  for (int step = 0; step < 6; ++step) {
    const auto& plan = member.update(models.specs(ids, 1 << 20), 64);
    sampler.commit(plan);
    for (std::size_t i = 0; i < 2; ++i) models.observe(ids[i], plan.batch[i], 0.01 + (i + 1) * 1e-4 * plan.batch[i]);
  }
  const std::vector<std::uint64_t> grown = {1, 2, 3};
  const auto specs = models.specs(grown, 1 << 20);
  const pl::batch_plan& next = member.update(specs, 64);  // the members' plan for the first step with the joiner
  ASSERT_GT(next.version, 1u);

  const pl::epoch_sampler joined(pl::sampler_state::decode(sampler.state().encode()));
  pl::replanner fresh;
  EXPECT_THROW((void)joined.slice(fresh.update(specs, 64), 2), pl::plan_error) << "version 1 is stale";

  pl::replanner joiner;
  joiner.adopt(pl::make_plan(specs, next.batch, next.version));  // sizes and version sent by a member
  const auto& mine = joiner.update(specs, 64);
  EXPECT_EQ(mine.version, next.version);
  EXPECT_EQ(mine.batch, next.batch);
  EXPECT_EQ(joined.slice(mine, 2).first, sampler.slice(next, 2).first);
}

// A model moves between workers bit for bit, and a joiner that takes the
// members' models and plan makes the same plans as they do from then on,
// re-plans included.
TEST(StandalonePlanner, AJoinerTakesTheModelsAndStaysInStep) {
  const std::vector<std::uint64_t> ids = {1, 2, 3};
  pl::worker_models models;
  pl::replanner member;
  auto time_of = [](std::size_t i, std::size_t b, int step) {
    return 0.01 + (i + 1) * 1e-4 * static_cast<double>(b) * (step > 20 && i == 0 ? 3.0 : 1.0);  // worker 1 slows
  };
  for (int step = 0; step < 10; ++step) {
    const auto& plan = member.update(models.specs(ids, 1 << 20), 96);
    for (std::size_t i = 0; i < ids.size(); ++i) models.observe(ids[i], plan.batch[i], time_of(i, plan.batch[i], step));
  }
  const auto bytes = models.encode();
  pl::worker_models joined = pl::worker_models::decode(bytes);
  EXPECT_EQ(joined.encode(), bytes);
  ASSERT_NE(joined.fitted(1), nullptr);
  EXPECT_EQ(joined.fitted(1)->predict(40), models.fitted(1)->predict(40));
  pl::replanner joiner;
  joiner.adopt(member.current());
  int replans = 0;
  for (int step = 10; step < 40; ++step) {
    const auto& a = member.update(models.specs(ids, 1 << 20), 96);
    const auto& b = joiner.update(joined.specs(ids, 1 << 20), 96);
    ASSERT_EQ(a.version, b.version) << "step " << step;
    ASSERT_EQ(a.batch, b.batch) << "step " << step;
    replans += member.last_reason() != pl::replan_reason::kept;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      models.observe(ids[i], a.batch[i], time_of(i, a.batch[i], step));
      joined.observe(ids[i], b.batch[i], time_of(i, b.batch[i], step));
    }
  }
  EXPECT_GE(replans, 1) << "the slowdown of worker 1 should have moved the plan";
}

// Bytes that are not an encoded model are refused (plan_fault, bad_state),
// whatever is cut off or changed: never a crash or a model out of range.
TEST(StandalonePlanner, CorruptModelBytesAreRefused) {
  pl::cost_model m;
  for (int k = 0; k < 12; ++k) m.observe(10 + k % 3, 0.01 + 1e-3 * (10 + k % 3));
  const auto good = m.encode();
  EXPECT_EQ(good.size(), 392u);  // as documented
  EXPECT_EQ(pl::cost_model::decode(good).encode(), good);
  for (std::size_t n = 0; n < good.size(); ++n)
    EXPECT_THROW((void)pl::cost_model::decode(std::span(good).first(n)), pl::plan_fault) << "cut to " << n;
  int refused = 0;
  for (std::size_t at = 0; at < good.size(); ++at) {
    auto bad = good;
    bad[at] ^= std::byte{0x80};
    try {
      (void)pl::cost_model::decode(bad);
    } catch (const pl::plan_fault& e) {
      EXPECT_EQ(e.cause(), pl::plan_errc::bad_state);
      ++refused;
    }
  }
  EXPECT_GT(refused, 0);
  auto set = pl::worker_models();
  set.observe(5, 10, 0.02);
  auto bytes = set.encode();
  bytes.push_back(std::byte{0});
  EXPECT_THROW((void)pl::worker_models::decode(bytes), pl::plan_fault);
  bytes.pop_back();
  bytes.pop_back();
  EXPECT_THROW((void)pl::worker_models::decode(bytes), pl::plan_fault);
}
