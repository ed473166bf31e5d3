// SPDX-License-Identifier: Apache-2.0
//! @file plan_error.hpp
//! The error types of the planner component, one per kind of failure
//! (docs/architecture.md, "Errors"), both naming the cause
//! (`plan::plan_errc`) and, where one is involved, the worker id:
//!
//! * `plan::plan_error`, a `std::invalid_argument`: input to the cost model,
//!   the batch planner, the re-planner, the samplers or work stealing that the
//!   caller could have checked (an infeasible batch, a NaN cost, a stale plan).
//! * `plan::plan_fault`, an `ebbflow::system_error`: what is found at run time
//!   in data from elsewhere, namely encoded state that is truncated, corrupt or
//!   of another version (`bad_state`) and a work-stealing counter in the store
//!   that no valid claim sequence produces (`bad_counter`). Its `code()`
//!   compares equal to the `plan_errc` and to `errc::bad_message`.
//!
//! Each `plan_errc` comes with exactly one of the two types (`is_fault`).
//! `what()` reads e.g.
//! `"infeasible: sum of max_batch 96 < global batch 100 (plan/impl/batch_planner.hpp:57)"`.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/enum_names.hpp>
#include <ebbflow/core/error.hpp>

#include <cstdint>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

EBBFLOW_BEGIN_NAMESPACE
namespace plan {

//! Why a planner-component call failed. `bad_state` and `bad_counter` are
//! run-time conditions (`plan_fault`), every other cause a precondition
//! (`plan_error`).
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
  bad_counter,           //!< a work-stealing counter in the store that no valid claim sequence can produce (last)
};

namespace detail {
inline constexpr auto plan_errc_names = make_enum_names(
    plan_errc::empty_membership, "empty_membership", "zero_batch", "bad_cost", "bad_bounds", "infeasible",
    "duplicate_worker", "bad_observation", "bad_rank", "membership_mismatch", "batch_exceeds_epoch", "stale_plan",
    "bad_dataset", "bad_state", "slice_too_large", "bad_steal_request", "bad_counter");
static_assert(plan_errc_names.last() == plan_errc::bad_counter);
}  // namespace detail

//! Short stable name of a cause ("infeasible", "bad_cost", ...).
constexpr std::string_view to_string(plan_errc e) noexcept { return detail::plan_errc_names(e, "unknown"); }

//! True for the causes found at run time in data from elsewhere
//! (`bad_state`, `bad_counter`), raised as `plan_fault`; false for the
//! preconditions, raised as `plan_error`.
constexpr bool is_fault(plan_errc e) noexcept { return e == plan_errc::bad_state || e == plan_errc::bad_counter; }

namespace detail {
class plan_category_impl final : public std::error_category {
 public:
  const char* name() const noexcept override { return "ebbflow.plan"; }
  std::string message(int v) const override { return std::string(to_string(static_cast<plan_errc>(v))); }
  std::error_condition default_error_condition(int v) const noexcept override {
    if (is_fault(static_cast<plan_errc>(v))) return make_error_condition(errc::bad_message);
    return std::make_error_condition(std::errc::invalid_argument);
  }
};
}  // namespace detail

//! Category of `plan_errc` codes: a fault compares equal to
//! `errc::bad_message`, a precondition to `std::errc::invalid_argument`.
inline const std::error_category& plan_category() noexcept {
  static const detail::plan_category_impl c;
  return c;
}
//! Makes `plan_errc` values convertible to `std::error_code` (found by ADL).
inline std::error_code make_error_code(plan_errc e) noexcept { return {static_cast<int>(e), plan_category()}; }

//! Bad input to the planner component (a precondition the caller could have
//! checked). Thread safety: an ordinary exception value. `code()` says why,
//! `worker()` names the offending worker id when one is involved.
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

//! A run-time condition in the planner component: data received from
//! elsewhere (encoded state, the store's counters) that no valid sender
//! produces. Thread safety: an ordinary exception value. `code()` is
//! `make_error_code(cause())` (equal to `errc::bad_message`), `cause()` the
//! `plan_errc`, `worker()` the worker id when one is involved.
class plan_fault : public system_error {
 public:
  //! `what()` becomes "<to_string(cause)>: <message>", as for `plan_error`.
  plan_fault(plan_errc cause, std::string message, std::optional<std::uint64_t> worker = std::nullopt)
      : system_error(make_error_code(cause), error_context{.operation = "plan", .detail = message}),
        what_(std::string(to_string(cause)) + ": " + message),
        worker_(worker) {}

  //! "<to_string(cause)>: <message>".
  const char* what() const noexcept override { return what_.c_str(); }
  //! The cause (`bad_state` or `bad_counter`).
  [[nodiscard]] plan_errc cause() const noexcept { return static_cast<plan_errc>(code().value()); }
  //! The worker whose data is bad, or nullopt when no single worker is to blame.
  [[nodiscard]] std::optional<std::uint64_t> worker() const noexcept { return worker_; }

 private:
  std::string what_;
  std::optional<std::uint64_t> worker_;
};

namespace detail {
// Throws `plan_error`, or `plan_fault` for a run-time cause, with "msg (file:line)".
[[noreturn]] inline void throw_plan_error(plan_errc code, const char* file, int line, const std::string& msg,
                                          std::optional<std::uint64_t> worker = std::nullopt) {
  std::ostringstream os;
  os << msg << " (" << file << ":" << line << ")";
  if (is_fault(code)) EBBFLOW_THROW((plan_fault(code, os.str(), worker)));
  EBBFLOW_THROW((plan_error(code, os.str(), worker)));
}
}  // namespace detail

}  // namespace plan
EBBFLOW_END_NAMESPACE

// Standard-library opt-in, not part of the documented API.
//! @cond
template <>
struct std::is_error_code_enum<ebbflow::plan::plan_errc> : std::true_type {};
//! @endcond

//! Precondition: throws `plan::plan_error(code, msg + file:line)` when `cond`
//! is false. `msg` is an ostream expression; `code` a constant precondition
//! cause (a run-time cause does not compile: that is EBBFLOW_PLAN_VERIFY).
#define EBBFLOW_PLAN_ENFORCE(cond, code, msg) EBBFLOW_DETAIL_PLAN_CHECK(false, cond, code, std::nullopt, msg)
//! Same, naming the offending worker id.
#define EBBFLOW_PLAN_ENFORCE_W(cond, code, worker_id, msg) \
  EBBFLOW_DETAIL_PLAN_CHECK(false, cond, code, std::uint64_t(worker_id), "worker " << (worker_id) << ": " << msg)

//! Run-time check of data from elsewhere: throws `plan::plan_fault(code,
//! msg + file:line)` when `cond` is false. `code` is a constant run-time
//! cause (`bad_state`, `bad_counter`).
#define EBBFLOW_PLAN_VERIFY(cond, code, msg) EBBFLOW_DETAIL_PLAN_CHECK(true, cond, code, std::nullopt, msg)
//! Same, naming the worker whose data is bad.
#define EBBFLOW_PLAN_VERIFY_W(cond, code, worker_id, msg) \
  EBBFLOW_DETAIL_PLAN_CHECK(true, cond, code, std::uint64_t(worker_id), "worker " << (worker_id) << ": " << msg)

// The four checks above: the cause's kind is checked at compile time.
#define EBBFLOW_DETAIL_PLAN_CHECK(fault, cond, code, worker, msg)                                          \
  do {                                                                                                     \
    static_assert(::ebbflow::plan::is_fault(code) == (fault),                                              \
                  "preconditions use EBBFLOW_PLAN_ENFORCE, run-time causes EBBFLOW_PLAN_VERIFY");          \
    if (!(cond)) {                                                                                         \
      std::ostringstream ebbflow_plan_os_;                                                                 \
      ebbflow_plan_os_ << msg;                                                                             \
      ::ebbflow::plan::detail::throw_plan_error(code, __FILE__, __LINE__, ebbflow_plan_os_.str(), worker); \
    }                                                                                                      \
  } while (0)
