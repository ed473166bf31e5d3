// SPDX-License-Identifier: Apache-2.0
//! @file batch_planner.hpp
//! The exact heterogeneity-aware batch planner.
//!
//! Given per-worker step-time models t_i(b) = a_i + comm_i + c_i·b, memory
//! caps m_i, optional minimums lo_i and a global batch B, `solve` returns the
//! integer split b_i that minimises the step time max_i t_i(b_i) subject to
//! Σ b_i = B and lo_i <= b_i <= m_i. The optimum is exact (no heuristic
//! rounding), and the split is *canonical*: among all optimal splits it
//! returns the one that takes, above the minimums, the B − Σ lo_i smallest
//! "increments" t_i(lo_i+1), t_i(lo_i+2), ... in (value, rank) order. The
//! canonical split depends only on the inputs and on the IEEE results of
//! `worker_spec::step_time`, never on the solver's search path, so every rank
//! that runs the same build on the same inputs computes bit-identical plans.
//!
//! Gradient weights and the loss-scaling contract: a worker that trains on
//! b_i samples computes the *mean* loss over its local batch, back-propagates,
//! and multiplies its gradients by w_i = b_i / B (`batch_plan::weight`). The
//! allreduced SUM over all workers is then Σ_i (b_i/B)·mean_i = the mean-loss
//! gradient of the single global batch of B samples, exactly the update of
//! large-batch SGD. A worker with b_i = 0 contributes a zero gradient (it must
//! still take part in the allreduce).
//!
//! Errors: every call raises `plan::plan_error` (a `std::invalid_argument`)
//! naming the cause and worker; see plan_error.hpp. Thread safety: all
//! functions are pure; distinct calls may run concurrently.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/plan/plan_error.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace plan {

//! One worker as the planner sees it, in rank order. Value type.
struct worker_spec {
  std::uint64_t id = 0;       //!< stable worker id (unique within one membership)
  double a = 0;               //!< fixed seconds per step (>= 0, finite)
  double c = 0;               //!< seconds per sample (> 0, finite)
  std::size_t max_batch = 0;  //!< m_i: largest batch that fits in memory
  std::size_t min_batch = 0;  //!< lo_i: smallest batch this worker must take
  double comm_s = 0;          //!< hook: per-worker communication seconds added to every step (>= 0)
  //! No measured model behind a and c (worker_models' a = 0, c = 1 while
  //! no worker has a fitted one): they still give the uniform split, but a
  //! plan made from them predicts no step time (NaN).
  bool placeholder = false;

  //! Predicted seconds of one step on `b` samples: (a + comm_s) + c·b,
  //! evaluated with one fused multiply-add so every call site and every rank
  //! rounds identically. Every comparison inside the planner uses this.
  [[nodiscard]] double step_time(std::size_t b) const noexcept {
    return std::fma(c, static_cast<double>(b), a + comm_s);
  }
};

//! A split of one global batch over the members, in rank order. Value type.
struct batch_plan {
  std::uint64_t version = 0;              //!< plans of one job are numbered 1, 2, ... (0: none)
  std::size_t global_batch = 0;           //!< B = Σ batch
  std::vector<std::uint64_t> worker_ids;  //!< members in rank order
  std::vector<std::size_t> batch;         //!< b_i per rank
  std::vector<std::size_t> offsets;       //!< prefix sums: offsets[r] = Σ_{j<r} b_j, offsets[n] = B
  //! Predicted max_i t_i(b_i) under the models it was made from; NaN ("not
  //! known": print it as "-") when any of them was a placeholder.
  double step_time = 0;

  //! Number of members.
  [[nodiscard]] std::size_t size() const noexcept { return batch.size(); }
  //! w_r = b_r / B, the factor rank r applies to its mean-loss gradients.
  //! @throws plan_error(bad_rank) when r >= size().
  [[nodiscard]] double weight(std::size_t rank) const;
  //! All weights in rank order (they sum to 1 up to rounding).
  [[nodiscard]] std::vector<double> weights() const;
  //! Rank of worker `id`, or size() when it is not a member.
  [[nodiscard]] std::size_t rank_of(std::uint64_t id) const noexcept;
};

//! Checks a membership: non-empty, unique ids, finite non-negative a and
//! comm_s, finite positive c, min_batch <= max_batch. Does not look at B.
//! @throws plan_error(empty_membership | duplicate_worker | bad_cost | bad_bounds)
EBBFLOW_DECL void validate(std::span<const worker_spec> workers);

//! The exact optimal canonical split of `global_batch` (see the file comment).
//! O(n log n) worst case, O(n) typical; no allocation beyond the result and
//! O(n) scratch. `version` is stored in the result.
//! @throws plan_error: validate()'s causes, zero_batch when global_batch == 0,
//!         infeasible when Σ max_batch < B or Σ min_batch > B.
[[nodiscard]] EBBFLOW_DECL batch_plan solve(std::span<const worker_spec> workers, std::size_t global_batch,
                                      std::uint64_t version = 1);

//! Predicted step time of an existing `plan` under (possibly newer) models:
//! max_r workers[r].step_time(plan.batch[r]).
//! @throws plan_error(membership_mismatch) when the ids differ in value or order.
[[nodiscard]] EBBFLOW_DECL double predict_step_time(const batch_plan& plan, std::span<const worker_spec> workers);

//! Builds a plan from explicit per-rank sizes (for baselines, tests, or a plan
//! received from another rank). step_time is computed from `workers`.
//! @throws plan_error: validate()'s causes; zero_batch when the sizes sum to 0;
//!         infeasible when a size is outside [min_batch, max_batch].
[[nodiscard]] EBBFLOW_DECL batch_plan make_plan(std::span<const worker_spec> workers, std::span<const std::size_t> sizes,
                                          std::uint64_t version);

}  // namespace plan
EBBFLOW_END_NAMESPACE

#include <ebbflow/plan/impl/batch_planner.hpp>
