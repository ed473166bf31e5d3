// SPDX-License-Identifier: Apache-2.0
//! @file error.hpp
//! Error reporting: `std::error_code` categories for ebbflow itself and for
//! each vendor's status type (UCX, CUDA, NCCL), portable conditions the
//! elasticity logic tests against, and `ebbflow::system_error`, whose message
//! names the rank, generation, peer and operation that failed.
//!
//! The convention (docs/architecture.md, "Errors"): a precondition the caller
//! could have checked raises `std::invalid_argument` naming the value and file
//! and line (`EBBFLOW_ENFORCE`); a condition found at run time raises
//! `ebbflow::system_error` (or a type derived from it) with a code comparable
//! to an `errc`. Synchronous calls of the communication and store layers come
//! in pairs, a throwing form and a `noexcept` form taking `std::error_code&`.
//! Nothing throws from destructors, device code or transport callbacks.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/enum_names.hpp>

#include <cstdint>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

EBBFLOW_BEGIN_NAMESPACE

//! Portable error conditions. Compare any `std::error_code` against these:
//! `if (ec == ebbflow::errc::peer_lost) ...` holds for a UCX connection reset,
//! an NCCL remote error and ebbflow's own `error::peer_lost` alike.
enum class errc {
  peer_lost = 1,  //!< a peer died or became unreachable
  timeout,        //!< a deadline passed
  revoked,        //!< the generation/communicator was revoked (membership changed)
  bad_message,    //!< malformed, truncated or oversized message
  unauthorized,   //!< missing or wrong job token
  cancelled,      //!< the operation was cancelled (shutdown)
  invalid_state,  //!< an operation was used in a state that does not allow it
  job_finished,   //!< the elastic job ended before this worker joined it (nothing left to do)
  load_failed,    //!< a data loader failed (the exception that carries this code holds the cause)
};

//! Error codes raised by ebbflow itself (category `ebbflow_category()`); each
//! maps onto the `errc` condition of the same name.
enum class error {
  peer_lost = 1,
  timeout,
  revoked,
  bad_message,
  unauthorized,
  cancelled,
  invalid_state,
  job_finished,
  load_failed,
};

namespace detail {
inline constexpr auto errc_names =
    make_enum_names(errc::peer_lost, "peer lost", "timed out", "revoked", "bad message", "unauthorized", "cancelled",
                    "invalid state", "job finished", "data load failed");
static_assert(errc_names.last() == errc::load_failed &&
              static_cast<int>(error::load_failed) == static_cast<int>(errc::load_failed));
inline constexpr std::string_view errc_name(int v) noexcept {
  return errc_names(static_cast<errc>(v), "unknown ebbflow error");
}

class condition_category_impl final : public std::error_category {
 public:
  const char* name() const noexcept override { return "ebbflow.condition"; }
  std::string message(int v) const override { return std::string(errc_name(v)); }
};

class ebbflow_category_impl final : public std::error_category {
 public:
  const char* name() const noexcept override { return "ebbflow"; }
  std::string message(int v) const override { return std::string(errc_name(v)); }
  std::error_condition default_error_condition(int v) const noexcept override;
};
}  // namespace detail

//! Category of the portable conditions (`errc`).
inline const std::error_category& condition_category() noexcept {
  static const detail::condition_category_impl c;
  return c;
}
//! Category of ebbflow's own error codes (`error`).
inline const std::error_category& ebbflow_category() noexcept {
  static const detail::ebbflow_category_impl c;
  return c;
}
inline std::error_condition detail::ebbflow_category_impl::default_error_condition(int v) const noexcept {
  return {v, condition_category()};
}

//! Makes `errc` values comparable with any `std::error_code` (found by ADL).
inline std::error_condition make_error_condition(errc e) noexcept {
  return {static_cast<int>(e), condition_category()};
}
//! Makes `error` values convertible to `std::error_code` (found by ADL).
inline std::error_code make_error_code(error e) noexcept { return {static_cast<int>(e), ebbflow_category()}; }

namespace detail {
// The messages of vendor statuses this header knows without the vendor's
// headers (a few dozen numbers each, stable ABI values).
struct status_text {
  int code;
  std::string_view text;
};
template <std::size_t N>
constexpr std::optional<std::string_view> status_text_of(const status_text (&table)[N], int v) noexcept {
  for (const status_text& t : table)
    if (t.code == v) return t.text;
  return std::nullopt;
}
// ucs/type/status.h
inline constexpr status_text ucs_texts[] = {{0, "success"},
                                            {-1, "no pending message"},
                                            {-2, "no resources are available to initiate the operation"},
                                            {-3, "input/output error"},
                                            {-4, "out of memory"},
                                            {-5, "invalid parameter"},
                                            {-6, "destination is unreachable"},
                                            {-7, "address not valid"},
                                            {-8, "function not implemented"},
                                            {-9, "message truncated"},
                                            {-10, "no progress"},
                                            {-11, "provided buffer is too small"},
                                            {-12, "no such element"},
                                            {-14, "no such device"},
                                            {-15, "device is busy"},
                                            {-16, "request canceled"},
                                            {-20, "operation timed out"},
                                            {-21, "user-defined limit was reached"},
                                            {-22, "unsupported operation"},
                                            {-23, "operation rejected by remote peer"},
                                            {-24, "endpoint is not connected"},
                                            {-25, "connection reset by remote peer"},
                                            {-80, "endpoint timeout"}};
// cuda_runtime_api.h (cudaError_t)
inline constexpr status_text cuda_texts[] = {{0, "no error"},
                                             {1, "invalid argument"},
                                             {2, "out of memory"},
                                             {35, "CUDA driver version is insufficient for CUDA runtime version"},
                                             {100, "no CUDA-capable device is detected"}};
// nccl.h (ncclResult_t)
inline constexpr status_text nccl_texts[] = {{0, "no error"},
                                             {1, "unhandled cuda error"},
                                             {2, "unhandled system error"},
                                             {3, "internal error"},
                                             {4, "invalid argument"},
                                             {5, "invalid usage"},
                                             {6, "remote process exited or there was a network error"},
                                             {7, "NCCL operation in progress"}};

//! UCX `ucs_status_t` values (stable ABI numbers from ucs/type/status.h), so
//! this header needs no UCX include.
class ucs_category_impl final : public std::error_category {
 public:
  const char* name() const noexcept override { return "ucs"; }
  std::string message(int v) const override {
    if (const auto text = status_text_of(ucs_texts, v)) return std::string(*text);
    if (v <= -40 && v >= -59) return "link failure";
    if (v <= -60 && v >= -89) return "endpoint failure";
    return "UCX status " + std::to_string(v);
  }
  std::error_condition default_error_condition(int v) const noexcept override {
    switch (v) {
      case -16:
        return make_error_condition(errc::cancelled);
      case -20:
        return make_error_condition(errc::timeout);
      case -9:
        return make_error_condition(errc::bad_message);
      // Any failure of a peer's operation means the peer is gone: UCX reports
      // a killed process as reset, unreachable, i/o error or endpoint timeout
      // depending on the transport (ENVIRONMENT-FACTS.md).
      case -3:
      case -6:
      case -23:
      case -24:
      case -25:
        return make_error_condition(errc::peer_lost);
      default:
        if (v <= -40 && v >= -89) return make_error_condition(errc::peer_lost);
        return {v, *this};
    }
  }
};

//! CUDA runtime `cudaError_t` values; messages come from the runtime when
//! the CUDA headers are available, otherwise the number.
class cuda_category_impl final : public std::error_category {
 public:
  const char* name() const noexcept override { return "cuda"; }
  std::string message(int v) const override {
    const auto text = status_text_of(cuda_texts, v);
    return text ? std::string(*text) : "CUDA error " + std::to_string(v);
  }
};

//! NCCL `ncclResult_t` values.
class nccl_category_impl final : public std::error_category {
 public:
  const char* name() const noexcept override { return "nccl"; }
  std::string message(int v) const override {
    const auto text = status_text_of(nccl_texts, v);
    return text ? std::string(*text) : "NCCL result " + std::to_string(v);
  }
  std::error_condition default_error_condition(int v) const noexcept override {
    if (v == 6) return make_error_condition(errc::peer_lost);
    return {v, *this};
  }
};
}  // namespace detail

//! Category for UCX `ucs_status_t` values. Peer failures map to `errc::peer_lost`.
inline const std::error_category& ucs_category() noexcept {
  static const detail::ucs_category_impl c;
  return c;
}
//! Category for CUDA runtime `cudaError_t` values.
inline const std::error_category& cuda_category() noexcept {
  static const detail::cuda_category_impl c;
  return c;
}
//! Category for NCCL `ncclResult_t` values. `ncclRemoteError` maps to `errc::peer_lost`.
inline const std::error_category& nccl_category() noexcept {
  static const detail::nccl_category_impl c;
  return c;
}

//! Where an error happened. Any field may be unknown (-1 / empty).
struct error_context {
  int rank = -1;                 //!< rank that observed the error
  std::int64_t generation = -1;  //!< membership generation
  int peer = -1;                 //!< peer involved, if any
  std::string operation = {};    //!< e.g. "allreduce", "store.get"
  std::string detail = {};       //!< free text (sizes, keys, ...)
};

//! Exception carrying an `std::error_code` plus where it happened.
//! `what()` reads e.g. "allreduce: peer lost [rank 2, generation 3, peer 1]".
class system_error : public std::system_error {
 public:
  //! An error `ec` that happened in `ctx`.
  system_error(std::error_code ec, error_context ctx)
      : std::system_error(ec), what_(format(ec, ctx)), ctx_(std::move(ctx)) {}
  //! An error `ec` without context.
  explicit system_error(std::error_code ec) : system_error(ec, error_context{}) {}

  //! "operation: message (detail) [rank r, generation g, peer p]".
  const char* what() const noexcept override { return what_.c_str(); }
  //! Rank that observed the error, or -1.
  [[nodiscard]] int rank() const noexcept { return ctx_.rank; }
  //! Membership generation, or -1.
  [[nodiscard]] std::int64_t generation() const noexcept { return ctx_.generation; }
  //! Peer involved, or -1.
  [[nodiscard]] int peer() const noexcept { return ctx_.peer; }
  //! Operation that failed (e.g. "allreduce"), or empty.
  [[nodiscard]] std::string_view operation() const noexcept { return ctx_.operation; }
  //! Everything known about where it happened.
  [[nodiscard]] const error_context& context() const noexcept { return ctx_; }

  //! The text `what()` returns for `ec` in context `c`.
  static std::string format(const std::error_code& ec, const error_context& c) {
    std::ostringstream os;
    if (!c.operation.empty()) os << c.operation << ": ";
    os << ec.message();
    if (!c.detail.empty()) os << " (" << c.detail << ")";
    bool any = c.rank >= 0 || c.generation >= 0 || c.peer >= 0;
    if (any) {
      os << " [";
      const char* sep = "";
      if (c.rank >= 0) {
        os << "rank " << c.rank;
        sep = ", ";
      }
      if (c.generation >= 0) {
        os << sep << "generation " << c.generation;
        sep = ", ";
      }
      if (c.peer >= 0) {
        os << sep << "peer " << c.peer;
      }
      os << "]";
    }
    return os.str();
  }

 private:
  std::string what_;
  error_context ctx_;
};

//! Throws `system_error(ec, ctx)` when `ec` holds an error.
inline void throw_if(const std::error_code& ec, error_context ctx = {}) {
  if (ec) EBBFLOW_THROW((system_error(ec, std::move(ctx))));
}

namespace detail {
[[noreturn]] inline void throw_invalid_argument(const char* file, int line, const std::string& what) {
  std::ostringstream os;
  os << what << " (" << file << ":" << line << ")";
#if EBBFLOW_EXCEPTIONS
  throw std::invalid_argument(os.str());
#else
  std::fprintf(stderr, "ebbflow: invalid argument: %s\n", os.str().c_str());
  std::abort();
#endif
}
[[noreturn]] inline void expects_failed(const char* cond, const char* file, int line) {
  std::ostringstream os;
  os << "ebbflow internal invariant violated: " << cond << " (" << file << ":" << line << ")";
#if EBBFLOW_EXCEPTIONS
  throw std::logic_error(os.str());
#else
  std::fprintf(stderr, "%s\n", os.str().c_str());
  std::abort();
#endif
}
}  // namespace detail

EBBFLOW_END_NAMESPACE

// Standard-library opt-ins, not part of the documented API.
//! @cond
template <>
struct std::is_error_condition_enum<ebbflow::errc> : std::true_type {};
template <>
struct std::is_error_code_enum<ebbflow::error> : std::true_type {};
//! @endcond

//! Rejects bad user input: throws `std::invalid_argument` with `msg` (an
//! ostream expression) plus file and line, when `cond` is false.
#define EBBFLOW_ENFORCE(cond, msg)                                                              \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      std::ostringstream ebbflow_enforce_os_;                                                   \
      ebbflow_enforce_os_ << msg;                                                               \
      ::ebbflow::detail::throw_invalid_argument(__FILE__, __LINE__, ebbflow_enforce_os_.str()); \
    }                                                                                           \
  } while (0)

//! Internal invariant; a failure is a bug in ebbflow.
#define EBBFLOW_EXPECTS(cond) ((cond) ? void(0) : ::ebbflow::detail::expects_failed(#cond, __FILE__, __LINE__))
