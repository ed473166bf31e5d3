// SPDX-License-Identifier: Apache-2.0
//! @file impl/replanner.hpp
//! Definitions for plan/replanner.hpp.
#pragma once

#include <ebbflow/plan/replanner.hpp>

#include <cmath>
#include <utility>

// Compiled into ebbflow::compiled in separate compilation (config.hpp).
#if EBBFLOW_HEADER_ONLY
EBBFLOW_BEGIN_NAMESPACE
namespace plan {

EBBFLOW_DECL const batch_plan& replanner::update(std::span<const worker_spec> workers, std::size_t global_batch) {
  const std::uint64_t next = plan_.version + 1;
  bool same_members = plan_.version != 0 && plan_.size() == workers.size();
  for (std::size_t i = 0; same_members && i < workers.size(); ++i) same_members = plan_.worker_ids[i] == workers[i].id;
  // A plan that breaks a worker's bounds as they are now (max_batch
  // lowered after an out-of-memory error, say) is replaced at once: its
  // predicted time says nothing (it can look faster than any feasible plan).
  bool in_bounds = same_members;
  for (std::size_t i = 0; in_bounds && i < workers.size(); ++i)
    in_bounds = plan_.batch[i] >= workers[i].min_batch && plan_.batch[i] <= workers[i].max_batch;
  if (plan_.version == 0 || !same_members || plan_.global_batch != global_batch || !in_bounds) {
    reason_ = plan_.version == 0                   ? replan_reason::initial
              : !same_members                      ? replan_reason::membership
              : plan_.global_batch != global_batch ? replan_reason::batch
                                                   : replan_reason::bounds;
    plan_ = solve(workers, global_batch, next);
    streak_ = 0;
    gap_ = 0;
    return plan_;
  }
  batch_plan best = solve(workers, global_batch, next);
  const double cur = predict_step_time(plan_, workers);
  gap_ = cur / best.step_time - 1.0;
  if (std::isnan(gap_)) gap_ = 0;  // placeholder models: the uniform split, nothing to compare
  if (gap_ > opts_.threshold) {
    if (++streak_ >= opts_.persist) {
      plan_ = std::move(best);
      reason_ = replan_reason::drift;
      streak_ = 0;
      gap_ = 0;
      return plan_;
    }
  } else {
    streak_ = 0;
  }
  reason_ = replan_reason::kept;
  return plan_;
}

}  // namespace plan
EBBFLOW_END_NAMESPACE
#endif  // EBBFLOW_HEADER_ONLY
