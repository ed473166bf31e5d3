// SPDX-License-Identifier: Apache-2.0
//! @file plan_error.hpp
//! The one error type of the planner component. Every infeasible or malformed
//! input to the cost model, the batch planner, the re-planner and the samplers
//! raises `plan::plan_error`, which *is a* `std::invalid_argument` (the
//! project-wide convention for bad user input, STYLE.md §4) and additionally
//! names the cause (`plan::plan_errc`) and, where one is involved, the worker
//! id. `what()` reads e.g.
//! `"infeasible: sum of max_batch 96 < global batch 100 (plan/impl/batch_planner.hpp:57)"`.
#pragma once

#include <ebbflow/config.hpp>

#include <cstdint>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

EBBFLOW_BEGIN_NAMESPACE
namespace plan {

//! Why a planner-component call rejected its input.
enum class plan_errc {
  empty_membership = 1,  //!< no workers were given
  zero_batch,            //!< global batch 0 (policy: a step always has at least one sample)
  bad_cost,              //!< a worker's a, c or comm term is NaN, infinite, negative, or c <= 0
  bad_bounds,            //!< a worker's min_batch exceeds its max_batch
  infeasible,            //!< sum of max_batch < global batch, sum of min_batch > global batch, or B > 2^53
  duplicate_worker,      //!< the same worker id appears twice in one membership
  bad_observation,       //!< a cost-model observation with NaN, infinite or non-positive seconds
  bad_rank,              //!< a rank outside the plan
  membership_mismatch,   //!< a plan used with a membership it was not made for
  batch_exceeds_epoch,   //!< a plan's global batch is larger than what is left of the epoch
  stale_plan,            //!< a plan older than one already committed
  bad_dataset,           //!< data-set size 0, or a shard of size 0
  bad_state,             //!< serialized state (sampler, cost model) is truncated, corrupt or of another version
  slice_too_large,       //!< a work-stealing slice beyond 2^31 - 1 items (its claim counter would overflow)
  bad_steal_request,     //!< a work-stealing claim of 0 items, bad steal_options, or stealing from oneself
  bad_counter,           //!< a work-stealing counter in the store that no valid claim sequence can produce
};

//! Short stable name of a cause ("infeasible", "bad_cost", ...).
constexpr std::string_view to_string(plan_errc e) noexcept {
  switch (e) {
    case plan_errc::empty_membership:
      return "empty_membership";
    case plan_errc::zero_batch:
      return "zero_batch";
    case plan_errc::bad_cost:
      return "bad_cost";
    case plan_errc::bad_bounds:
      return "bad_bounds";
    case plan_errc::infeasible:
      return "infeasible";
    case plan_errc::duplicate_worker:
      return "duplicate_worker";
    case plan_errc::bad_observation:
      return "bad_observation";
    case plan_errc::bad_rank:
      return "bad_rank";
    case plan_errc::membership_mismatch:
      return "membership_mismatch";
    case plan_errc::batch_exceeds_epoch:
      return "batch_exceeds_epoch";
    case plan_errc::stale_plan:
      return "stale_plan";
    case plan_errc::bad_dataset:
      return "bad_dataset";
    case plan_errc::bad_state:
      return "bad_state";
    case plan_errc::slice_too_large:
      return "slice_too_large";
    case plan_errc::bad_steal_request:
      return "bad_steal_request";
    case plan_errc::bad_counter:
      return "bad_counter";
  }
  return "unknown";
}

//! Bad input to the planner component. Thread safety: an ordinary exception
//! value. `code()` says why, `worker()` names the offending worker id when one
//! is involved.
class plan_error : public std::invalid_argument {
 public:
  //! `what()` becomes "<to_string(code)>: <message>".
  plan_error(plan_errc code, std::string message, std::optional<std::uint64_t> worker = std::nullopt)
      : std::invalid_argument(std::string(to_string(code)) + ": " + message), code_(code), worker_(worker) {}

  [[nodiscard]] plan_errc code() const noexcept { return code_; }  //!< the cause
  //! The offending worker's id, or nullopt when no single worker is to blame.
  [[nodiscard]] std::optional<std::uint64_t> worker() const noexcept { return worker_; }

 private:
  plan_errc code_;
  std::optional<std::uint64_t> worker_;
};

namespace detail {
[[noreturn]] inline void throw_plan_error(plan_errc code, const char* file, int line, const std::string& msg,
                                          std::optional<std::uint64_t> worker = std::nullopt) {
  std::ostringstream os;
  os << msg << " (" << file << ":" << line << ")";
  EBBFLOW_THROW((plan_error(code, os.str(), worker)));
}
}  // namespace detail

}  // namespace plan
EBBFLOW_END_NAMESPACE

//! Throws `plan::plan_error(code, msg + file:line)` when `cond` is false.
//! `msg` is an ostream expression.
#define EBBFLOW_PLAN_ENFORCE(cond, code, msg)                                                      \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      std::ostringstream ebbflow_plan_os_;                                                         \
      ebbflow_plan_os_ << msg;                                                                     \
      ::ebbflow::plan::detail::throw_plan_error(code, __FILE__, __LINE__, ebbflow_plan_os_.str()); \
    }                                                                                              \
  } while (0)

//! Same, naming the offending worker id.
#define EBBFLOW_PLAN_ENFORCE_W(cond, code, worker_id, msg)                                        \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      std::ostringstream ebbflow_plan_os_;                                                        \
      ebbflow_plan_os_ << "worker " << (worker_id) << ": " << msg;                                \
      ::ebbflow::plan::detail::throw_plan_error(code, __FILE__, __LINE__, ebbflow_plan_os_.str(), \
                                                std::uint64_t(worker_id));                        \
    }                                                                                             \
  } while (0)
