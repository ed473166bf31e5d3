// SPDX-License-Identifier: Apache-2.0
//! @file impl/planner_policy.hpp
//! Definitions of elastic/planner_policy.hpp.
#pragma once

#include <ebbflow/elastic/planner_policy.hpp>

// Compiled into ebbflow::compiled in separate compilation (config.hpp).
#if EBBFLOW_HEADER_ONLY
EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

EBBFLOW_DECL void planner_policy::observe(member_id m, std::size_t batch, double seconds) {
  (void)models_.observe(static_cast<std::uint64_t>(m), batch, seconds);
}

EBBFLOW_DECL std::vector<std::size_t> planner_policy::plan(std::span<const member_id> members,
                                                           std::size_t global_batch) {
  auto specs = specs_of(members);
  if (specs.empty()) return uniform_policy{}.plan(members, global_batch);
  return plan::solve(specs, global_batch).batch;
}

EBBFLOW_DECL bool planner_policy::should_replan(std::span<const member_id> members,
                                                std::span<const std::size_t> current, std::size_t global_batch) {
  auto specs = specs_of(members);
  if (specs.empty()) return false;
  // The plan in force is the group's; let the replanner judge it against the best.
  const auto in_force = plan::make_plan(specs, current, 1);
  const double now = plan::predict_step_time(in_force, specs);
  const double best = plan::solve(specs, global_batch).step_time;
  if (now > best * (1 + opts_.replan.threshold)) {
    if (++streak_ >= opts_.replan.persist) {
      streak_ = 0;
      return true;
    }
  } else {
    streak_ = 0;
  }
  return false;
}

EBBFLOW_DECL std::vector<planning_policy::member_model> planner_policy::models(
    std::span<const member_id> members) const {
  std::vector<member_model> out;
  for (auto& s : specs_of(members)) out.push_back({s.a, s.c});
  return out;
}

EBBFLOW_DECL std::vector<plan::worker_spec> planner_policy::specs_of(std::span<const member_id> members) const {
  if (!models_.any_fitted(members)) return {};
  return models_.specs(members, opts_.max_batch);
}

}  // namespace elastic
EBBFLOW_END_NAMESPACE
#endif  // EBBFLOW_HEADER_ONLY
