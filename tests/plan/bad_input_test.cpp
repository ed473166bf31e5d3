// SPDX-License-Identifier: Apache-2.0
// Must-show 5: every infeasible or malformed input gets its named error
// (plan::plan_error, a std::invalid_argument, with a plan_errc and the
// worker), and corrupt state received from elsewhere its run-time error
// (plan::plan_fault, an ebbflow::system_error).
#include "plan_error_check.hpp"

#include <ebbflow/plan.hpp>

#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace pl = ebbflow::plan;

namespace {

using workers = std::vector<pl::worker_spec>;
constexpr double nan = std::numeric_limits<double>::quiet_NaN();
constexpr double inf = std::numeric_limits<double>::infinity();

workers good() { return {{10, 0.01, 0.001, 100}, {11, 0.01, 0.002, 100}, {12, 0.0, 0.004, 100}}; }
workers with(std::function<void(workers&)> f) {
  workers w = good();
  f(w);
  return w;
}

struct bad_case {
  std::string name;
  std::function<void()> call;
  pl::plan_errc code;
  std::optional<std::uint64_t> worker;
  std::string says;  // a fragment the message must contain
};

std::vector<bad_case> cases() {
  pl::batch_plan p3 = pl::solve(good(), 30, 5);
  return {
      {"empty_membership", [] { (void)pl::solve(workers{}, 10); }, pl::plan_errc::empty_membership, {}, "no workers"},
      {"zero_batch", [] { (void)pl::solve(good(), 0); }, pl::plan_errc::zero_batch, {}, "at least 1"},
      {"caps_below_batch",
       [] { (void)pl::solve(good(), 301); },
       pl::plan_errc::infeasible,
       {},
       "sum of max_batch 300 < global batch 301"},
      {"minimums_above_batch",
       [] {
         (void)pl::solve(with([](workers& w) {
                           for (auto& x : w) x.min_batch = 5;
                         }),
                         14);
       },
       pl::plan_errc::infeasible,
       {},
       "sum of min_batch 15 > global batch 14"},
      {"nan_speed", [] { (void)pl::solve(with([](workers& w) { w[1].c = nan; }), 10); }, pl::plan_errc::bad_cost, 11,
       "worker 11: seconds per sample c = nan"},
      {"inf_speed", [] { (void)pl::solve(with([](workers& w) { w[2].c = inf; }), 10); }, pl::plan_errc::bad_cost, 12,
       "c = inf"},
      {"zero_speed", [] { (void)pl::solve(with([](workers& w) { w[0].c = 0; }), 10); }, pl::plan_errc::bad_cost, 10,
       "c = 0"},
      // 1 / c overflows: the solver's level would be NaN (and it then took
      // one sample at a time).
      {"batch_beyond_2_53",
       [] {
         workers w = good();
         for (auto& x : w) x.max_batch = std::numeric_limits<std::size_t>::max();
         (void)pl::solve(w, (std::size_t{1} << 53) + 1);
       },
       pl::plan_errc::infeasible,
       {},
       "above 2^53"},
      {"subnormal_speed", [] { (void)pl::solve(with([](workers& w) { w[1].c = 1e-310; }), 10); },
       pl::plan_errc::bad_cost, 11, "1 / c finite"},
      {"negative_speed", [] { (void)pl::solve(with([](workers& w) { w[0].c = -1e-3; }), 10); }, pl::plan_errc::bad_cost,
       10, "c = -0.001"},
      {"negative_fixed", [] { (void)pl::solve(with([](workers& w) { w[2].a = -1; }), 10); }, pl::plan_errc::bad_cost,
       12, "a = -1"},
      {"nan_fixed", [] { (void)pl::solve(with([](workers& w) { w[1].a = nan; }), 10); }, pl::plan_errc::bad_cost, 11,
       "a = nan"},
      {"bad_comm_term", [] { (void)pl::solve(with([](workers& w) { w[1].comm_s = -inf; }), 10); },
       pl::plan_errc::bad_cost, 11, "comm_s"},
      {"min_above_max", [] { (void)pl::solve(with([](workers& w) { w[0].min_batch = 101; }), 150); },
       pl::plan_errc::bad_bounds, 10, "min_batch 101 > max_batch 100"},
      {"duplicate_worker", [] { (void)pl::solve(with([](workers& w) { w[2].id = 10; }), 10); },
       pl::plan_errc::duplicate_worker, 10, "worker 10: appears more than once"},
      {"model_without_data", [] { (void)pl::solve(workers{pl::cost_model{}.spec(4, 10)}, 5); }, pl::plan_errc::bad_cost,
       4, "c = 0"},
      {"nan_observation",
       [] {
         pl::cost_model m;
         m.observe(32, nan);
       },
       pl::plan_errc::bad_observation,
       {},
       "batch 32 took nan"},
      {"non_positive_observation",
       [] {
         pl::cost_model m;
         m.observe(32, 0.0);
       },
       pl::plan_errc::bad_observation,
       {},
       "took 0"},
      {"bad_probe",
       [] {
         const pl::timing_sample s[] = {{8, -1.0}};
         (void)pl::cost_model::from_probe(s);
       },
       pl::plan_errc::bad_observation,
       {},
       "probe"},
      {"weight_of_missing_rank", [p3] { (void)p3.weight(3); }, pl::plan_errc::bad_rank, {}, "rank 3"},
      {"plan_for_other_members", [p3] { (void)pl::predict_step_time(p3, with([](workers& w) { w[1].id = 99; })); },
       pl::plan_errc::membership_mismatch, 99, "worker 99: is at rank 1"},
      {"plan_sizes_outside_bounds",
       [] {
         const std::size_t b[] = {101, 0, 0};
         (void)pl::make_plan(good(), b, 1);
       },
       pl::plan_errc::infeasible, 10, "batch 101 outside [0, 100]"},
      {"empty_dataset", [] { pl::epoch_sampler s(0, 1); }, pl::plan_errc::bad_dataset, {}, "empty"},
      {"slice_rank_outside_plan",
       [p3] { (void)pl::epoch_sampler(1000, 1).slice(p3, 3); },
       pl::plan_errc::bad_rank,
       {},
       "rank 3 outside plan v5"},
      {"batch_beyond_epoch",
       [p3] { (void)pl::epoch_sampler(20, 1).slice(p3, 0); },
       pl::plan_errc::batch_exceeds_epoch,
       {},
       "30 samples does not fit in the 20"},
      {"batch_beyond_dataset_drop",
       [p3] { (void)pl::epoch_sampler(20, 1, pl::last_batch::drop).slice(p3, 0); },
       pl::plan_errc::batch_exceeds_epoch,
       {},
       "larger than the data set"},
      {"stale_plan",
       [p3] {
         pl::epoch_sampler s(1000, 1);
         pl::batch_plan newer = p3;
         newer.version = 6;
         s.commit(newer);
         s.commit(p3);
       },
       pl::plan_errc::stale_plan,
       {},
       "plan v5 is older than the committed plan v6"},
      {"truncated_state",
       [] {
         auto bytes = pl::epoch_sampler(1000, 1).state().encode();
         (void)pl::sampler_state::decode(std::span(bytes).first(20));
       },
       pl::plan_errc::bad_state,
       {},
       "20 bytes"},
      {"corrupt_state",
       [] {
         auto bytes = pl::epoch_sampler(1000, 1).state().encode();
         bytes[0] = std::byte{0};
         (void)pl::sampler_state::decode(bytes);
       },
       pl::plan_errc::bad_state,
       {},
       "magic"},
      {"state_cursor_past_end",
       [] {
         pl::sampler_state st = pl::epoch_sampler(1000, 1).state();
         st.cursor = 1000;
         (void)pl::sampler_state::decode(st.encode());
       },
       pl::plan_errc::bad_state,
       {},
       "cursor 1000"},
      {"resume_from_bad_state",
       [] {
         pl::sampler_state st = pl::epoch_sampler(1000, 1).state();
         st.cursor = 1000;
         pl::epoch_sampler s(st);
       },
       pl::plan_errc::bad_state,
       {},
       "cursor 1000"},
  };
}

TEST(BadInput, EachCaseRaisesItsNamedError) {
  for (const bad_case& c : cases()) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(plan_test::expect_plan_error(c.call, c.code, c.says).worker, c.worker);
  }
}

TEST(BadInput, PlanErrorIsAnInvalidArgument) { EXPECT_THROW((void)pl::solve(workers{}, 1), std::invalid_argument); }

// Corrupt state is a condition found at run time, not the caller's mistake:
// a system_error comparable with errc::bad_message, never an invalid_argument.
TEST(BadInput, CorruptStateIsASystemErrorNotAnInvalidArgument) {
  try {
    (void)pl::sampler_state::decode({});
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    ADD_FAILURE() << "raised as a precondition: " << e.what();
  } catch (const ebbflow::system_error& e) {
    EXPECT_EQ(e.code(), ebbflow::errc::bad_message);
    EXPECT_EQ(e.code(), pl::plan_errc::bad_state);
    EXPECT_EQ(e.code().category(), pl::plan_category());
    EXPECT_EQ(e.code().message(), "bad_state");
  }
  EXPECT_EQ(pl::make_error_code(pl::plan_errc::infeasible), std::errc::invalid_argument);
  for (int v = 1; v <= static_cast<int>(pl::plan_errc::bad_counter); ++v) {
    const auto e = static_cast<pl::plan_errc>(v);
    EXPECT_NE(pl::to_string(e), "unknown") << v;
    EXPECT_EQ(pl::is_fault(e), e == pl::plan_errc::bad_state || e == pl::plan_errc::bad_counter) << v;
  }
}

}  // namespace
