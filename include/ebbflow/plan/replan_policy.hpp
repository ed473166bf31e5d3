// SPDX-License-Identifier: Apache-2.0
//! @file replan_policy.hpp
//! When to switch to a new plan. A `replanner` holds the plan in force and,
//! at each check, decides from the current models whether to keep it:
//!
//! * membership changed (ids or their rank order differ), or the global batch
//!   changed, or there is no plan yet: re-plan at once;
//! * otherwise solve for the best plan under the current models and compare:
//!   if the plan in force is predicted slower than the best by more than
//!   `threshold` (relative) on `persist` consecutive checks, adopt the best.
//!   Both the threshold and the persistence are hysteresis: noise in the
//!   models that makes the best plan wobble does not make plans flap.
//!
//! Each adopted plan gets version = previous + 1 (the first is 1). The
//! replanner is a deterministic function of its inputs: ranks that feed it the
//! same sequence of models and batches hold the same plan with the same
//! version, so the version names which plan a step uses.
//!
//! Thread safety: none (one instance per rank, used by the training thread).
//! Errors: those of `plan::solve` (plan_error).
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/plan/batch_planner.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>

EBBFLOW_BEGIN_NAMESPACE
namespace plan {

//! Hysteresis of the re-planning policy.
struct replan_options {
  double threshold = 0.01;  //!< re-plan when current / best − 1 exceeds this ...
  unsigned persist = 3;     //!< ... on this many consecutive checks (>= 1)
};

//! Why the last `update` produced the plan it did.
enum class replan_reason {
  kept,        //!< the plan in force stays
  initial,     //!< first plan
  membership,  //!< members or their order changed
  batch,       //!< the global batch changed
  drift,       //!< the models drifted past the threshold for `persist` checks
  bounds,      //!< the plan in force breaks a worker's current min_batch or max_batch
};

//! Short stable name of `r` ("kept", "initial", "membership", "batch", "drift", "bounds").
constexpr std::string_view to_string(replan_reason r) noexcept {
  switch (r) {
    case replan_reason::kept:
      return "kept";
    case replan_reason::initial:
      return "initial";
    case replan_reason::membership:
      return "membership";
    case replan_reason::batch:
      return "batch";
    case replan_reason::drift:
      return "drift";
    case replan_reason::bounds:
      return "bounds";
  }
  return "?";
}

//! Holds the plan in force and applies the policy. Value type (copyable).
class replanner {
 public:
  //! No plan yet; the first `update` plans. `persist` 0 is treated as 1.
  explicit replanner(replan_options opts = {}) : opts_(opts) {
    if (opts_.persist == 0) opts_.persist = 1;
  }

  //! Returns the plan for the next step given the current models (rank
  //! order) and global batch. O(n log n) (one `solve`). @throws plan_error.
  const batch_plan& update(std::span<const worker_spec> workers, std::size_t global_batch);

  //! Makes `p` the plan in force, as if this replanner had produced it: a
  //! worker that joins (or restarts) takes the plan the others use, sent by
  //! one of them (its sizes and version; `make_plan` rebuilds it), and its
  //! next `update` carries on from there with the next version. Fed the
  //! same specs as the others (their models: `cost_models::decode`), it
  //! makes the same plans from then on.
  void adopt(batch_plan p) {
    plan_ = std::move(p);
    reason_ = replan_reason::kept;
    streak_ = 0;
    gap_ = 0;
  }

  //! The plan in force (version 0 and empty before the first update).
  [[nodiscard]] const batch_plan& current() const noexcept { return plan_; }
  //! Why the last update returned what it did.
  [[nodiscard]] replan_reason last_reason() const noexcept { return reason_; }
  //! Consecutive checks the best plan has been better by more than the threshold.
  [[nodiscard]] unsigned streak() const noexcept { return streak_; }
  //! Relative gap current / best − 1 measured at the last update (0 after a re-plan).
  [[nodiscard]] double last_gap() const noexcept { return gap_; }

 private:
  replan_options opts_;
  batch_plan plan_{};
  replan_reason reason_ = replan_reason::kept;
  unsigned streak_ = 0;
  double gap_ = 0;
};

inline const batch_plan& replanner::update(std::span<const worker_spec> workers, std::size_t global_batch) {
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
