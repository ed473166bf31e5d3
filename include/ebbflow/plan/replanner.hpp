// SPDX-License-Identifier: Apache-2.0
//! @file replanner.hpp
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
#include <ebbflow/core/enum_names.hpp>
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

namespace detail {
inline constexpr auto replan_reason_names =
    make_enum_names(replan_reason::kept, "kept", "initial", "membership", "batch", "drift", "bounds");
static_assert(replan_reason_names.last() == replan_reason::bounds);
}  // namespace detail

//! Short stable name of `r` ("kept", "initial", "membership", "batch", "drift", "bounds").
constexpr std::string_view to_string(replan_reason r) noexcept { return detail::replan_reason_names(r); }

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
  //! same specs as the others (their models: `worker_models::decode`), it
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

}  // namespace plan
EBBFLOW_END_NAMESPACE

#include <ebbflow/plan/impl/replanner.hpp>
