// SPDX-License-Identifier: Apache-2.0
// ebbflow 0.1.0: single-include header.
//
// GENERATED FILE, DO NOT EDIT. Made by cmake/amalgamate.cmake from the
// 13 headers under include/ebbflow/ (regenerate: cmake -P cmake/amalgamate.cmake).
// Each ebbflow header appears once, in dependency order. Headers that need an
// optional backend are compiled only when its headers are on the include path
// (EBBFLOW_HAS_ASIO / _UCX / _CUDA / _NCCL, see config.hpp); define
// EBBFLOW_NO_ASIO / _UCX / _CUDA / _NCCL to leave one out. Link the backend's
// libraries yourself (e.g. -lucp -lucs, -lcrypto, -lcudart, -lnccl) and -pthread.
#ifndef EBBFLOW_SINGLE_INCLUDE_HPP
#define EBBFLOW_SINGLE_INCLUDE_HPP
//! Defined when ebbflow comes from the single-include header.
#define EBBFLOW_SINGLE_INCLUDE 1

// ==== begin <ebbflow/config.hpp> ==========================================
// SPDX-License-Identifier: Apache-2.0
//! @file config.hpp
//! Macros shared by every header: the versioned namespace, host/device
//! annotations, feature detection of optional backends and error macros.


// #include <ebbflow/version.hpp>  (inlined here)
// ---- begin <ebbflow/version.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file version.hpp
//! The one source of truth for the ebbflow version (read by CMake, packaging recipes).


//! Major version: incompatible API changes.
#define EBBFLOW_VERSION_MAJOR 0
//! Minor version: compatible additions.
#define EBBFLOW_VERSION_MINOR 1
//! Patch version: fixes.
#define EBBFLOW_VERSION_PATCH 0
//! Encoded as MAJOR * 10000 + MINOR * 100 + PATCH.
#define EBBFLOW_VERSION (EBBFLOW_VERSION_MAJOR * 10000 + EBBFLOW_VERSION_MINOR * 100 + EBBFLOW_VERSION_PATCH)
//! "MAJOR.MINOR.PATCH".
#define EBBFLOW_VERSION_STRING "0.1.0"
// ---- end <ebbflow/version.hpp>

//! Opens `ebbflow::inline v0`: two copies of the headers with different ABI
//! versions cannot silently violate the ODR.
#define EBBFLOW_BEGIN_NAMESPACE \
  namespace ebbflow {           \
  inline namespace v0 {
//! Closes what EBBFLOW_BEGIN_NAMESPACE opened.
#define EBBFLOW_END_NAMESPACE \
  }                           \
  }

//! `__host__ __device__` under nvcc, nothing for a host compiler. Kernel
//! bodies are functors whose call operator carries this annotation.
#if defined(__CUDACC__)
#define EBBFLOW_HD __host__ __device__
//! 1 under nvcc (host and device passes), 0 for a host compiler.
#define EBBFLOW_DEVICE_COMPILER 1
#else
#define EBBFLOW_HD
//! 1 under nvcc (host and device passes), 0 for a host compiler.
#define EBBFLOW_DEVICE_COMPILER 0
#endif

// Optional backends: a header that needs one is only usable when its
// dependency's headers are on the include path.
#if defined(__has_include)
#if __has_include(<ucp/api/ucp.h>) && !defined(EBBFLOW_NO_UCX)
#define EBBFLOW_HAS_UCX 1
#endif
#if __has_include(<boost/asio.hpp>) && __has_include(<openssl/hmac.h>) && !defined(EBBFLOW_NO_ASIO)
#define EBBFLOW_HAS_ASIO 1
#endif
#if __has_include(<cuda_runtime_api.h>) && !defined(EBBFLOW_NO_CUDA)
#define EBBFLOW_HAS_CUDA 1
#endif
#if __has_include(<nccl.h>) && defined(EBBFLOW_HAS_CUDA) && !defined(EBBFLOW_NO_NCCL)
#define EBBFLOW_HAS_NCCL 1
#endif
#endif
#ifndef EBBFLOW_HAS_UCX
#define EBBFLOW_HAS_UCX 0
#endif
#ifndef EBBFLOW_HAS_ASIO
#define EBBFLOW_HAS_ASIO 0
#endif
#ifndef EBBFLOW_HAS_CUDA
#define EBBFLOW_HAS_CUDA 0
#endif
#ifndef EBBFLOW_HAS_NCCL
#define EBBFLOW_HAS_NCCL 0
#endif

//! 1 when exceptions are enabled; EBBFLOW_THROW aborts otherwise.
#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
#define EBBFLOW_EXCEPTIONS 1
#else
#define EBBFLOW_EXCEPTIONS 0
#endif

//! Throws `ex`, or aborts with a message under -fno-exceptions.
#if EBBFLOW_EXCEPTIONS
#define EBBFLOW_THROW(ex) throw ex
#else
#include <cstdio>
#include <cstdlib>
#define EBBFLOW_THROW(ex) (std::fprintf(stderr, "ebbflow: fatal error (exceptions disabled)\n"), std::abort())
#endif

#define EBBFLOW_DETAIL_STR2(x) #x
#define EBBFLOW_DETAIL_STR(x) EBBFLOW_DETAIL_STR2(x)
// ==== end <ebbflow/config.hpp>

// ==== begin <ebbflow/comm/loopback_transport.hpp> =========================
// SPDX-License-Identifier: Apache-2.0
//! @file loopback_transport.hpp
//! An in-process `transport` for unit tests: N threads, one `loopback_transport`
//! each, exchanging messages through a shared `loopback_hub`. The hub can kill
//! a rank (its peers then see `errc::peer_lost`) and delay delivery, so
//! failure handling can be unit-tested. Never the only proof: integration
//! tests run real processes over UCX.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/comm/transport.hpp>  (inlined here)
// ---- begin <ebbflow/comm/transport.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file transport.hpp
//! The point-to-point `transport` concept every collective algorithm is
//! written over: tagged, non-blocking byte messages between the ranks of one
//! generation, completed by `test` or by `wait` with a deadline.
//!
//! Semantics every model guarantees:
//! * Messages between one (source, destination, tag) triple are matched in
//!   the order they were posted (MPI-style non-overtaking).
//! * A receive matches only a message of the same generation: the transport
//!   folds `generation()` into the wire tag, so late traffic of an older
//!   generation can never be consumed by a newer one.
//! * The received message must have exactly the posted size; otherwise the
//!   request fails with `errc::bad_message` naming both sizes.
//! * A peer that died makes its pending and future requests fail with
//!   `errc::peer_lost` (never a hang); `wait` returns `errc::timeout` when
//!   its deadline passes, and the request stays pending (it may be waited on
//!   again, or cancelled by destroying the transport).
//! * Buffers must stay valid until the request completed.
//! * Thread safety: one thread drives a transport at a time.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/deadline.hpp>  (inlined here)
// ---- begin <ebbflow/core/deadline.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file deadline.hpp
//! Deadlines for blocking calls. Every blocking call in ebbflow takes one
//! (or a timeout that is turned into one) and reports `errc::timeout` when it
//! passes.


// #include <ebbflow/config.hpp>  (inlined)

#include <chrono>

EBBFLOW_BEGIN_NAMESPACE

//! The clock of every deadline and timeout in ebbflow.
using steady_clock = std::chrono::steady_clock;

//! A point in time on the steady clock after which a blocking call gives up.
class deadline {
 public:
  //! A deadline `timeout` from now.
  template <class Rep, class Period>
  static deadline after(std::chrono::duration<Rep, Period> timeout) noexcept {
    return deadline(steady_clock::now() + std::chrono::duration_cast<steady_clock::duration>(timeout));
  }
  //! A deadline that never passes (use sparingly: prefer a bound).
  static deadline never() noexcept { return deadline(steady_clock::time_point::max()); }

  //! A deadline at the time point `t`.
  explicit deadline(steady_clock::time_point t) noexcept : at_(t) {}

  //! When it passes.
  [[nodiscard]] steady_clock::time_point at() const noexcept { return at_; }
  //! True once the deadline has passed.
  [[nodiscard]] bool expired() const noexcept { return steady_clock::now() >= at_; }
  //! Time left, zero once expired.
  [[nodiscard]] steady_clock::duration remaining() const noexcept {
    const auto now = steady_clock::now();
    return now >= at_ ? steady_clock::duration::zero() : at_ - now;
  }
  //! The earlier of two deadlines.
  [[nodiscard]] friend deadline min(deadline a, deadline b) noexcept { return a.at_ < b.at_ ? a : b; }

 private:
  steady_clock::time_point at_;
};

EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/core/deadline.hpp>
// #include <ebbflow/core/error.hpp>  (inlined here)
// ---- begin <ebbflow/core/error.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file error.hpp
//! Error reporting: `std::error_code` categories for ebbflow itself and for
//! each vendor's status type (UCX, CUDA, NCCL), portable conditions the
//! elasticity logic tests against, and `ebbflow::system_error`, whose message
//! names the rank, generation, peer and operation that failed.
//!
//! Conventions (STYLE.md §4): synchronous calls come in pairs, a throwing form
//! and a `noexcept` form taking `std::error_code&`. Bad user input raises
//! `std::invalid_argument` naming file and line. Nothing throws from
//! destructors, device code or transport callbacks.


// #include <ebbflow/config.hpp>  (inlined)

#include <cstdint>
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
};

namespace detail {
inline constexpr std::string_view errc_name(int v) noexcept {
  switch (v) {
    case 1: return "peer lost";
    case 2: return "timed out";
    case 3: return "revoked";
    case 4: return "bad message";
    case 5: return "unauthorized";
    case 6: return "cancelled";
    case 7: return "invalid state";
    default: return "unknown ebbflow error";
  }
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
inline std::error_condition make_error_condition(errc e) noexcept { return {static_cast<int>(e), condition_category()}; }
//! Makes `error` values convertible to `std::error_code` (found by ADL).
inline std::error_code make_error_code(error e) noexcept { return {static_cast<int>(e), ebbflow_category()}; }

namespace detail {
//! UCX `ucs_status_t` values (stable ABI numbers from ucs/type/status.h), so
//! this header needs no UCX include.
class ucs_category_impl final : public std::error_category {
 public:
  const char* name() const noexcept override { return "ucs"; }
  std::string message(int v) const override {
    switch (v) {
      case 0: return "success";
      case -1: return "no pending message";
      case -2: return "no resources are available to initiate the operation";
      case -3: return "input/output error";
      case -4: return "out of memory";
      case -5: return "invalid parameter";
      case -6: return "destination is unreachable";
      case -7: return "address not valid";
      case -8: return "function not implemented";
      case -9: return "message truncated";
      case -10: return "no progress";
      case -11: return "provided buffer is too small";
      case -12: return "no such element";
      case -14: return "no such device";
      case -15: return "device is busy";
      case -16: return "request canceled";
      case -20: return "operation timed out";
      case -21: return "user-defined limit was reached";
      case -22: return "unsupported operation";
      case -23: return "operation rejected by remote peer";
      case -24: return "endpoint is not connected";
      case -25: return "connection reset by remote peer";
      case -80: return "endpoint timeout";
      default:
        if (v <= -40 && v >= -59) return "link failure";
        if (v <= -60 && v >= -89) return "endpoint failure";
        return "UCX status " + std::to_string(v);
    }
  }
  std::error_condition default_error_condition(int v) const noexcept override {
    switch (v) {
      case -16: return make_error_condition(errc::cancelled);
      case -20: return make_error_condition(errc::timeout);
      case -9: return make_error_condition(errc::bad_message);
      // Any failure of a peer's operation means the peer is gone: UCX reports
      // a killed process as reset, unreachable, i/o error or endpoint timeout
      // depending on the transport (ENVIRONMENT-FACTS.md).
      case -3: case -6: case -23: case -24: case -25:
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
    switch (v) {
      case 0: return "no error";
      case 1: return "invalid argument";
      case 2: return "out of memory";
      case 35: return "CUDA driver version is insufficient for CUDA runtime version";
      case 100: return "no CUDA-capable device is detected";
      default: return "CUDA error " + std::to_string(v);
    }
  }
};

//! NCCL `ncclResult_t` values.
class nccl_category_impl final : public std::error_category {
 public:
  const char* name() const noexcept override { return "nccl"; }
  std::string message(int v) const override {
    switch (v) {
      case 0: return "no error";
      case 1: return "unhandled cuda error";
      case 2: return "unhandled system error";
      case 3: return "internal error";
      case 4: return "invalid argument";
      case 5: return "invalid usage";
      case 6: return "remote process exited or there was a network error";
      case 7: return "NCCL operation in progress";
      default: return "NCCL result " + std::to_string(v);
    }
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
  int rank = -1;                       //!< rank that observed the error
  std::int64_t generation = -1;        //!< membership generation
  int peer = -1;                       //!< peer involved, if any
  std::string operation = {};          //!< e.g. "allreduce", "store.get"
  std::string detail = {};             //!< free text (sizes, keys, ...)
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
      if (c.rank >= 0) { os << "rank " << c.rank; sep = ", "; }
      if (c.generation >= 0) { os << sep << "generation " << c.generation; sep = ", "; }
      if (c.peer >= 0) { os << sep << "peer " << c.peer; }
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
#define EBBFLOW_ENFORCE(cond, msg)                                                    \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::ostringstream ebbflow_enforce_os_;                                         \
      ebbflow_enforce_os_ << msg;                                                     \
      ::ebbflow::detail::throw_invalid_argument(__FILE__, __LINE__, ebbflow_enforce_os_.str()); \
    }                                                                                 \
  } while (0)

//! Internal invariant; a failure is a bug in ebbflow.
#define EBBFLOW_EXPECTS(cond) \
  ((cond) ? void(0) : ::ebbflow::detail::expects_failed(#cond, __FILE__, __LINE__))
// ---- end <ebbflow/core/error.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <system_error>

EBBFLOW_BEGIN_NAMESPACE
namespace comm {

//! A user tag: 48 bits are available to collectives (the transport reserves
//! the rest for the generation). Collectives compose it from an operation
//! sequence number and a step (see `make_tag`).
using tag_t = std::uint64_t;
//! Bits of a tag available to collectives.
inline constexpr int tag_bits = 48;
//! Mask of the bits available to collectives.
inline constexpr tag_t tag_mask = (tag_t{1} << tag_bits) - 1;

//! Tag for step `step` (< 2^16) of collective number `seq` (wraps at 2^32).
constexpr tag_t make_tag(std::uint64_t seq, std::uint32_t step) noexcept {
  return ((seq & 0xffffffffu) << 16 | (step & 0xffffu)) & tag_mask;
}

template <class T>
concept transport = requires(T& t, const T& ct, int peer, tag_t tag, std::span<const std::byte> out,
                             std::span<std::byte> in, typename T::request& req, deadline d, std::error_code& ec) {
  typename T::request;
  { ct.rank() } -> std::convertible_to<int>;
  { ct.size() } -> std::convertible_to<int>;
  { ct.generation() } -> std::convertible_to<std::int64_t>;
  //! Posts a send / receive; never blocks.
  { t.isend(peer, tag, out) } -> std::same_as<typename T::request>;
  { t.irecv(peer, tag, in) } -> std::same_as<typename T::request>;
  //! Progresses; true once `req` completed (then `ec` holds its outcome).
  { t.test(req, ec) } -> std::same_as<bool>;
  //! Blocks until `req` completed or `d` passed (`errc::timeout`).
  t.wait(req, d, ec);
};

//! Blocking send with a deadline. @throws system_error naming rank, peer, generation.
template <transport T>
void send(T& t, int peer, tag_t tag, std::span<const std::byte> data, deadline d) {
  auto r = t.isend(peer, tag, data);
  std::error_code ec;
  t.wait(r, d, ec);
  throw_if(ec, {.rank = t.rank(), .generation = t.generation(), .peer = peer, .operation = "send",
                .detail = std::to_string(data.size()) + " bytes"});
}

//! Blocking receive with a deadline. @throws system_error naming rank, peer, generation.
template <transport T>
void recv(T& t, int peer, tag_t tag, std::span<std::byte> data, deadline d) {
  auto r = t.irecv(peer, tag, data);
  std::error_code ec;
  t.wait(r, d, ec);
  throw_if(ec, {.rank = t.rank(), .generation = t.generation(), .peer = peer, .operation = "recv",
                .detail = std::to_string(data.size()) + " bytes"});
}

}  // namespace comm
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/comm/transport.hpp>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace comm {

//! Shared mailbox of a group of loopback transports. Thread-safe.
class loopback_hub {
 public:
  //! A hub for ranks 0 .. size-1, all alive.
  explicit loopback_hub(int size) : size_(size), dead_(static_cast<std::size_t>(size), false) {}

  //! Number of ranks.
  [[nodiscard]] int size() const noexcept { return size_; }
  //! Marks `rank` dead: every pending or future operation with it fails with `peer_lost`.
  void kill(int rank) {
    std::lock_guard lk(m_);
    dead_.at(static_cast<std::size_t>(rank)) = true;
    cv_.notify_all();
  }
  //! True once `kill(rank)` was called.
  [[nodiscard]] bool dead(int rank) const {
    std::lock_guard lk(m_);
    return dead_.at(static_cast<std::size_t>(rank));
  }
  //! Every message becomes visible only `d` after it was sent.
  void set_delay(std::chrono::microseconds d) {
    std::lock_guard lk(m_);
    delay_ = d;
  }

 private:
  template <class>
  friend class basic_loopback_transport;
  using key = std::tuple<int, int, std::int64_t, tag_t>;  // src, dst, generation, tag
  struct message {
    std::vector<std::byte> data;
    steady_clock::time_point visible_at;
  };
  int size_;
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::map<key, std::deque<message>> boxes_;
  std::vector<bool> dead_;
  std::chrono::microseconds delay_{0};
};

//! In-process transport over a shared `loopback_hub`, one per rank (thread).
//! Models `comm::transport`; use the alias `loopback_transport`.
//! One instance is used by one thread at a time.
template <class Unused = void>
class basic_loopback_transport {
 public:
  //! A pending operation. Sends complete eagerly (the message is copied).
  struct request {
    bool done = false;        //!< completed (successfully or not)
    bool is_recv = false;     //!< a receive (else a send)
    int peer = -1;            //!< the other rank
    tag_t tag = 0;            //!< user tag
    std::span<std::byte> in;  //!< receive buffer (host memory)
    std::error_code ec;       //!< outcome once done
  };

  //! Rank `rank` of `hub` in generation `generation`.
  //! @throws std::invalid_argument when `rank` is outside the hub.
  basic_loopback_transport(std::shared_ptr<loopback_hub> hub, int rank, std::int64_t generation = 0)
      : hub_(std::move(hub)), rank_(rank), generation_(generation) {
    EBBFLOW_ENFORCE(rank >= 0 && rank < hub_->size(), "loopback rank " << rank << " outside [0, " << hub_->size() << ")");
  }

  //! This transport's rank.
  [[nodiscard]] int rank() const noexcept { return rank_; }
  //! Number of ranks.
  [[nodiscard]] int size() const noexcept { return hub_->size(); }
  //! Generation carried in every message's key.
  [[nodiscard]] std::int64_t generation() const noexcept { return generation_; }
  //! Moves to generation `g`; messages of other generations are not matched.
  void set_generation(std::int64_t g) noexcept { generation_ = g; }

  //! Sends `out` (host memory, copied before returning) to `peer`.
  request isend(int peer, tag_t tag, std::span<const std::byte> out) {
    check_peer(peer);
    request r;
    r.done = true;
    r.peer = peer;
    r.tag = tag;
    std::lock_guard lk(hub_->m_);
    if (hub_->dead_[static_cast<std::size_t>(peer)] || hub_->dead_[static_cast<std::size_t>(rank_)]) {
      r.ec = make_error_code(error::peer_lost);
      return r;
    }
    hub_->boxes_[{rank_, peer, generation_, tag & tag_mask}].push_back(
        {std::vector<std::byte>(out.begin(), out.end()), steady_clock::now() + hub_->delay_});
    hub_->cv_.notify_all();
    return r;
  }

  //! Posts a receive into `in` (host memory, must outlive the request).
  request irecv(int peer, tag_t tag, std::span<std::byte> in) {
    check_peer(peer);
    request r;
    r.is_recv = true;
    r.peer = peer;
    r.tag = tag & tag_mask;
    r.in = in;
    return r;
  }

  //! Non-blocking: true once `r` completed, with its outcome in `ec`.
  bool test(request& r, std::error_code& ec) {
    std::unique_lock lk(hub_->m_);
    try_complete(r);
    if (r.done) ec = r.ec;
    return r.done;
  }

  //! Blocks until `r` completes or `d` passes (`ec` = errc::timeout).
  void wait(request& r, deadline d, std::error_code& ec) {
    std::unique_lock lk(hub_->m_);
    for (;;) {
      try_complete(r);
      if (r.done) {
        ec = r.ec;
        return;
      }
      if (d.expired()) {
        ec = make_error_code(error::timeout);
        return;
      }
      // Wake at the deadline or at most every millisecond (delayed messages).
      hub_->cv_.wait_until(lk, std::min(d.at(), steady_clock::now() + std::chrono::milliseconds(1)));
    }
  }

 private:
  void check_peer(int peer) const {
    EBBFLOW_ENFORCE(peer >= 0 && peer < size() && peer != rank_,
                    "loopback peer " << peer << " invalid for rank " << rank_ << " of " << size());
  }
  // Called with the hub's mutex held.
  void try_complete(request& r) {
    if (r.done) return;
    auto it = hub_->boxes_.find({r.peer, rank_, generation_, r.tag});
    if (it != hub_->boxes_.end() && !it->second.empty() && it->second.front().visible_at <= steady_clock::now()) {
      auto& msg = it->second.front();
      if (msg.data.size() != r.in.size()) {
        r.ec = make_error_code(error::bad_message);
      } else if (!msg.data.empty()) {
        std::memcpy(r.in.data(), msg.data.data(), msg.data.size());
      }
      it->second.pop_front();
      r.done = true;
      return;
    }
    if (hub_->dead_[static_cast<std::size_t>(r.peer)] || hub_->dead_[static_cast<std::size_t>(rank_)]) {
      r.ec = make_error_code(error::peer_lost);
      r.done = true;
    }
  }

  std::shared_ptr<loopback_hub> hub_;
  int rank_;
  std::int64_t generation_;
};

//! The loopback transport (a class template only so the header stays inline-friendly).
using loopback_transport = basic_loopback_transport<>;
static_assert(transport<loopback_transport>);

//! Runs `f(transport&)` on `n` threads over one hub (gloo's `spawn`), rethrowing
//! the first exception. Returns the hub for inspection.
template <class F>
std::shared_ptr<loopback_hub> spawn_loopback(int n, F&& f, std::int64_t generation = 0) {
  auto hub = std::make_shared<loopback_hub>(n);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        try {
          loopback_transport t(hub, r, generation);
          f(t);
        } catch (...) {
          errors[static_cast<std::size_t>(r)] = std::current_exception();
        }
      });
  }
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return hub;
}

}  // namespace comm
EBBFLOW_END_NAMESPACE
// ==== end <ebbflow/comm/loopback_transport.hpp>

// ==== begin <ebbflow/core/dtype.hpp> ======================================
// SPDX-License-Identifier: Apache-2.0
//! @file dtype.hpp
//! Element types and reduction operators that collectives and codecs accept.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/half.hpp>  (inlined here)
// ---- begin <ebbflow/core/half.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file half.hpp
//! 16-bit floating-point storage types usable on host and device: `half`
//! (IEEE binary16) and `bfloat16`. Arithmetic is done in float; conversions
//! round to nearest even, identically on CPU and GPU (bit-exact).


// #include <ebbflow/config.hpp>  (inlined)

#include <cstdint>
#include <cstring>

EBBFLOW_BEGIN_NAMESPACE

namespace detail {
EBBFLOW_HD inline std::uint32_t float_bits(float f) noexcept {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
EBBFLOW_HD inline float bits_float(std::uint32_t u) noexcept {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}
}  // namespace detail

//! IEEE 754 binary16 storage. Conversions round to nearest even; NaN stays NaN.
struct half {
  std::uint16_t bits = 0;  //!< the binary16 bit pattern

  half() = default;
  //! Rounds `f` to the nearest half.
  EBBFLOW_HD explicit half(float f) noexcept : bits(from_float(f)) {}
  //! The exact float value.
  EBBFLOW_HD explicit operator float() const noexcept { return to_float(bits); }

  //! Bit pattern of `f` rounded to half (nearest even; overflow gives inf).
  EBBFLOW_HD static std::uint16_t from_float(float f) noexcept {
    const std::uint32_t x = detail::float_bits(f);
    const std::uint32_t sign = (x >> 16) & 0x8000u;
    const std::uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {  // inf or nan
      return static_cast<std::uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    }
    if (ax >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow -> inf
    if (ax < 0x38800000u) {  // subnormal or zero in half
      // Shift the float (with implicit bit) into half subnormal position, RNE.
      if (ax < 0x33000000u) return static_cast<std::uint16_t>(sign);  // < 2^-25 rounds to 0
      const std::uint32_t e = ax >> 23;
      const std::uint32_t m = (ax & 0x7fffffu) | 0x800000u;
      const std::uint32_t shift = 126u - e;  // 14 + (127-1) - e ... gives mantissa in 10 bits
      const std::uint32_t r = m >> shift;
      const std::uint32_t rem = m & ((1u << shift) - 1u);
      const std::uint32_t halfway = 1u << (shift - 1u);
      std::uint32_t h = r;
      if (rem > halfway || (rem == halfway && (r & 1u))) ++h;
      return static_cast<std::uint16_t>(sign | h);
    }
    std::uint32_t h = ((ax - 0x38000000u) >> 13);  // rebias exponent 127 -> 15
    const std::uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }

  //! The float value of the bit pattern `h`.
  EBBFLOW_HD static float to_float(std::uint16_t h) noexcept {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t e = (h >> 10) & 0x1fu;
    std::uint32_t m = h & 0x3ffu;
    if (e == 0x1fu) return detail::bits_float(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
      if (m == 0) return detail::bits_float(sign);
      // subnormal: value = m * 2^-24
      const float v = static_cast<float>(m) * 5.9604644775390625e-8f;
      return detail::bits_float(sign | detail::float_bits(v));
    }
    return detail::bits_float(sign | ((e + 112u) << 23) | (m << 13));
  }
};

//! bfloat16 storage (the upper 16 bits of a float). Round to nearest even.
struct bfloat16 {
  std::uint16_t bits = 0;  //!< the bfloat16 bit pattern

  bfloat16() = default;
  //! Rounds `f` to the nearest bfloat16.
  EBBFLOW_HD explicit bfloat16(float f) noexcept : bits(from_float(f)) {}
  //! The exact float value.
  EBBFLOW_HD explicit operator float() const noexcept { return to_float(bits); }

  //! Bit pattern of `f` rounded to bfloat16 (nearest even; NaN stays NaN).
  EBBFLOW_HD static std::uint16_t from_float(float f) noexcept {
    const std::uint32_t x = detail::float_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // quiet NaN
    const std::uint32_t lsb = (x >> 16) & 1u;
    return static_cast<std::uint16_t>((x + 0x7fffu + lsb) >> 16);
  }
  //! The float value of the bit pattern `b`.
  EBBFLOW_HD static float to_float(std::uint16_t b) noexcept {
    return detail::bits_float(static_cast<std::uint32_t>(b) << 16);
  }
};

static_assert(sizeof(half) == 2 && sizeof(bfloat16) == 2);

EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/core/half.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>

EBBFLOW_BEGIN_NAMESPACE

//! Element type of a buffer.
enum class dtype : std::uint8_t { f32, f64, f16, bf16, i32, i64, u8 };

//! Every dtype, for iteration in tests and benchmarks.
inline constexpr dtype all_dtypes[] = {dtype::f32, dtype::f64, dtype::f16, dtype::bf16,
                                       dtype::i32, dtype::i64, dtype::u8};

//! Size of one element in bytes.
constexpr std::size_t size_of(dtype t) noexcept {
  switch (t) {
    case dtype::f64: case dtype::i64: return 8;
    case dtype::f32: case dtype::i32: return 4;
    case dtype::f16: case dtype::bf16: return 2;
    case dtype::u8: return 1;
  }
  return 0;
}

//! Short name ("f32", "bf16", ...), as printed by benchmarks and errors.
constexpr std::string_view name(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return "f32";
    case dtype::f64: return "f64";
    case dtype::f16: return "f16";
    case dtype::bf16: return "bf16";
    case dtype::i32: return "i32";
    case dtype::i64: return "i64";
    case dtype::u8: return "u8";
  }
  return "?";
}

//! Parses a name produced by `name(dtype)`.
constexpr std::optional<dtype> parse_dtype(std::string_view s) noexcept {
  for (dtype t : all_dtypes)
    if (name(t) == s) return t;
  return std::nullopt;
}

//! True for f32, f64, f16 and bf16.
constexpr bool is_floating(dtype t) noexcept {
  return t == dtype::f32 || t == dtype::f64 || t == dtype::f16 || t == dtype::bf16;
}

//! The dtype of a C++ element type; `dtype_of_v<float> == dtype::f32`.
template <class T> struct dtype_of;
template <> struct dtype_of<float> : std::integral_constant<dtype, dtype::f32> {};
template <> struct dtype_of<double> : std::integral_constant<dtype, dtype::f64> {};
template <> struct dtype_of<half> : std::integral_constant<dtype, dtype::f16> {};
template <> struct dtype_of<bfloat16> : std::integral_constant<dtype, dtype::bf16> {};
template <> struct dtype_of<std::int32_t> : std::integral_constant<dtype, dtype::i32> {};
template <> struct dtype_of<std::int64_t> : std::integral_constant<dtype, dtype::i64> {};
template <> struct dtype_of<std::uint8_t> : std::integral_constant<dtype, dtype::u8> {};
//! `dtype_of<T>::value`, ignoring cv-qualifiers.
template <class T> inline constexpr dtype dtype_of_v = dtype_of<std::remove_cv_t<T>>::value;

//! Calls `f(T{})` with the C++ type of `t` (a tag value), returning its result.
template <class F>
constexpr decltype(auto) visit_dtype(dtype t, F&& f) {
  switch (t) {
    case dtype::f32: return f(float{});
    case dtype::f64: return f(double{});
    case dtype::f16: return f(half{});
    case dtype::bf16: return f(bfloat16{});
    case dtype::i32: return f(std::int32_t{});
    case dtype::i64: return f(std::int64_t{});
    case dtype::u8: return f(std::uint8_t{});
  }
  return f(float{});
}

//! Reduction operator of a collective. `avg` is `sum` divided by the world
//! size (integers: truncating division).
enum class reduce_op : std::uint8_t { sum, avg, min, max, prod };

//! Every reduce_op, for iteration in tests and benchmarks.
inline constexpr reduce_op all_reduce_ops[] = {reduce_op::sum, reduce_op::avg, reduce_op::min,
                                               reduce_op::max, reduce_op::prod};

//! Short name ("sum", "avg", ...).
constexpr std::string_view name(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return "sum";
    case reduce_op::avg: return "avg";
    case reduce_op::min: return "min";
    case reduce_op::max: return "max";
    case reduce_op::prod: return "prod";
  }
  return "?";
}

//! Parses a name produced by `name(reduce_op)`.
constexpr std::optional<reduce_op> parse_reduce_op(std::string_view s) noexcept {
  for (reduce_op op : all_reduce_ops)
    if (name(op) == s) return op;
  return std::nullopt;
}

EBBFLOW_END_NAMESPACE
// ==== end <ebbflow/core/dtype.hpp>

// ==== begin <ebbflow/core/env.hpp> ========================================
// SPDX-License-Identifier: Apache-2.0
//! @file env.hpp
//! Configuration from environment variables, validated: a malformed or
//! out-of-range value raises `std::invalid_argument` naming the variable, the
//! value and what was expected; it is never silently replaced by a default.
//!
//! `launch_info::from_environment()` reads where this process sits in the job,
//! from ebbflow's own variables or, when those are absent, from torchrun,
//! Open MPI or Slurm.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/error.hpp>  (inlined)

#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

EBBFLOW_BEGIN_NAMESPACE
namespace env {

//! The raw value, or nullopt when unset or empty.
inline std::optional<std::string> get(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

//! An integer in [lo, hi], or `fallback` when unset.
//! @throws std::invalid_argument when set but not an integer in range.
inline std::int64_t get_int(const char* name, std::int64_t fallback,
                            std::int64_t lo = std::numeric_limits<std::int64_t>::min(),
                            std::int64_t hi = std::numeric_limits<std::int64_t>::max()) {
  auto v = get(name);
  if (!v) return fallback;
  std::int64_t out = 0;
  auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), out);
  EBBFLOW_ENFORCE(ec == std::errc{} && p == v->data() + v->size() && out >= lo && out <= hi,
                  name << "='" << *v << "': expected an integer in [" << lo << ", " << hi << "]");
  return out;
}

//! A number in [lo, hi], or `fallback` when unset.
inline double get_double(const char* name, double fallback, double lo = -std::numeric_limits<double>::max(),
                         double hi = std::numeric_limits<double>::max()) {
  auto v = get(name);
  if (!v) return fallback;
  char* end = nullptr;
  const double out = std::strtod(v->c_str(), &end);
  EBBFLOW_ENFORCE(end == v->c_str() + v->size() && out == out && out >= lo && out <= hi,
                  name << "='" << *v << "': expected a number in [" << lo << ", " << hi << "]");
  return out;
}

//! A boolean (1/0, true/false, yes/no, on/off), or `fallback` when unset.
inline bool get_bool(const char* name, bool fallback) {
  auto v = get(name);
  if (!v) return fallback;
  const std::string& s = *v;
  if (s == "1" || s == "true" || s == "yes" || s == "on" || s == "y") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off" || s == "n") return false;
  EBBFLOW_ENFORCE(false, name << "='" << s << "': expected a boolean (1/0, true/false, yes/no, on/off)");
  return fallback;
}

//! A duration in milliseconds in [lo_ms, hi_ms], or `fallback` when unset.
inline std::chrono::milliseconds get_ms(const char* name, std::chrono::milliseconds fallback,
                                        std::int64_t lo_ms = 0, std::int64_t hi_ms = 24LL * 3600 * 1000) {
  return std::chrono::milliseconds(get_int(name, fallback.count(), lo_ms, hi_ms));
}

//! "host:port" split in two; port in [0, 65535].
struct host_port {
  std::string host;        //!< name or address, never empty
  std::uint16_t port = 0;  //!< port number
};

//! Parses "host:port" or "[v6addr]:port". @throws std::invalid_argument naming `what`.
inline host_port parse_host_port(std::string_view s, std::string_view what) {
  auto colon = s.rfind(':');
  EBBFLOW_ENFORCE(colon != std::string_view::npos && colon > 0 && colon + 1 < s.size(),
                  what << "='" << s << "': expected HOST:PORT");
  std::string host(s.substr(0, colon));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  std::string_view ps = s.substr(colon + 1);
  unsigned port = 0;
  auto [p, ec] = std::from_chars(ps.data(), ps.data() + ps.size(), port);
  EBBFLOW_ENFORCE(ec == std::errc{} && p == ps.data() + ps.size() && port <= 65535,
                  what << "='" << s << "': port must be an integer in [0, 65535]");
  return {std::move(host), static_cast<std::uint16_t>(port)};
}

}  // namespace env

//! Where this process sits in a job, as told by its launcher.
struct launch_info {
  int rank = 0;                 //!< this process's rank in the initial world
  int world_size = 1;           //!< processes in the initial world
  int local_rank = 0;           //!< rank among processes on this host
  std::string store_host = "127.0.0.1";  //!< rendezvous store address
  std::uint16_t store_port = 0;          //!< 0: no store given
  std::string token;            //!< job secret (EBBFLOW_TOKEN); never logged
  std::string source = "default";  //!< which launcher's variables were used

  //! Reads, in order of precedence: ebbflow-run's `EBBFLOW_RANK`,
  //! `EBBFLOW_WORLD_SIZE`, `EBBFLOW_LOCAL_RANK`, `EBBFLOW_STORE`,
  //! `EBBFLOW_TOKEN`; torchrun's `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
  //! `MASTER_ADDR`, `MASTER_PORT`; Open MPI's `OMPI_COMM_WORLD_RANK`,
  //! `OMPI_COMM_WORLD_SIZE`, `OMPI_COMM_WORLD_LOCAL_RANK`; Slurm's
  //! `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`. With the last three the
  //! store still comes from `EBBFLOW_STORE` or `MASTER_ADDR`/`MASTER_PORT`.
  //! @throws std::invalid_argument for malformed or inconsistent values.
  static launch_info from_environment() {
    launch_info li;
    auto pick = [&](const char* r, const char* w, const char* l, const char* src) {
      if (!env::get(r)) return false;
      li.world_size = static_cast<int>(env::get_int(w, 1, 1, 1 << 24));
      li.rank = static_cast<int>(env::get_int(r, 0, 0, li.world_size - 1));
      li.local_rank = static_cast<int>(env::get_int(l, 0, 0, 1 << 24));
      li.source = src;
      return true;
    };
    pick("EBBFLOW_RANK", "EBBFLOW_WORLD_SIZE", "EBBFLOW_LOCAL_RANK", "ebbflow") ||
        pick("RANK", "WORLD_SIZE", "LOCAL_RANK", "torchrun") ||
        pick("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "openmpi") ||
        pick("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "slurm");
    if (auto s = env::get("EBBFLOW_STORE")) {
      auto hp = env::parse_host_port(*s, "EBBFLOW_STORE");
      li.store_host = hp.host;
      li.store_port = hp.port;
    } else if (auto a = env::get("MASTER_ADDR")) {
      li.store_host = *a;
      li.store_port = static_cast<std::uint16_t>(env::get_int("MASTER_PORT", 29500, 1, 65535));
    }
    if (auto t = env::get("EBBFLOW_TOKEN")) li.token = *t;
    return li;
  }
};

EBBFLOW_END_NAMESPACE
// ==== end <ebbflow/core/env.hpp>

// ==== begin <ebbflow/core/handle.hpp> =====================================
// SPDX-License-Identifier: Apache-2.0
//! @file handle.hpp
//! `unique_handle<Traits>`: a move-only owner of a C handle (UCX worker, CUDA
//! stream, NCCL communicator, ...). `Traits` provides `using value_type`,
//! `static value_type null() noexcept` and `static void close(value_type) noexcept`.
//! Closing never throws; a failed close is the traits' job to log.


// #include <ebbflow/config.hpp>  (inlined)

#include <utility>

EBBFLOW_BEGIN_NAMESPACE

//! Move-only owner of one handle of `Traits::value_type`; closes it with
//! `Traits::close` on destruction or reset. Not thread-safe.
template <class Traits>
class unique_handle {
 public:
  using value_type = typename Traits::value_type;  //!< the C handle type

  unique_handle() noexcept : h_(Traits::null()) {}
  //! Takes ownership of `h`.
  explicit unique_handle(value_type h) noexcept : h_(h) {}
  //! Takes `o`'s handle; `o` is left empty.
  unique_handle(unique_handle&& o) noexcept : h_(std::exchange(o.h_, Traits::null())) {}
  //! Closes the current handle and takes `o`'s.
  unique_handle& operator=(unique_handle&& o) noexcept {
    if (this != &o) reset(std::exchange(o.h_, Traits::null()));
    return *this;
  }
  unique_handle(const unique_handle&) = delete;
  unique_handle& operator=(const unique_handle&) = delete;
  ~unique_handle() { reset(); }

  //! The handle, still owned.
  [[nodiscard]] value_type get() const noexcept { return h_; }
  //! True when a handle is owned.
  explicit operator bool() const noexcept { return h_ != Traits::null(); }
  //! Gives up ownership without closing.
  [[nodiscard]] value_type release() noexcept { return std::exchange(h_, Traits::null()); }
  //! Closes the current handle (if any) and takes `h`.
  void reset(value_type h = Traits::null()) noexcept {
    value_type old = std::exchange(h_, h);
    if (old != Traits::null()) Traits::close(old);
  }

 private:
  value_type h_;
};

EBBFLOW_END_NAMESPACE
// ==== end <ebbflow/core/handle.hpp>

// ==== begin <ebbflow/core/log.hpp> ========================================
// SPDX-License-Identifier: Apache-2.0
//! @file log.hpp
//! A small leveled logger writing whole lines to stderr. The level comes from
//! `EBBFLOW_LOG` (off, error, warn, info, debug, trace; default warn) and can be
//! changed at run time. Thread-safe: each record is written as one line.
//!
//! Use the macros, which skip formatting when the level is off:
//! `EBBFLOW_LOG_INFO("joined generation " << g);`


// #include <ebbflow/config.hpp>  (inlined)

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

EBBFLOW_BEGIN_NAMESPACE
namespace log {

//! Severity of a record; `EBBFLOW_LOG` selects the highest one printed.
enum class level : int { off = 0, error = 1, warn = 2, info = 3, debug = 4, trace = 5 };

//! Lower-case name ("error", "info", ...), as accepted by `EBBFLOW_LOG`.
constexpr std::string_view name(level l) noexcept {
  switch (l) {
    case level::off: return "off";
    case level::error: return "error";
    case level::warn: return "warn";
    case level::info: return "info";
    case level::debug: return "debug";
    case level::trace: return "trace";
  }
  return "?";
}

//! Parses a name produced by `name(level)`.
constexpr std::optional<level> parse_level(std::string_view s) noexcept {
  for (int i = 0; i <= 5; ++i)
    if (name(static_cast<level>(i)) == s) return static_cast<level>(i);
  return std::nullopt;
}

namespace detail {
inline level level_from_env() noexcept {
  const char* v = std::getenv("EBBFLOW_LOG");
  if (!v || !*v) return level::warn;
  if (auto l = parse_level(v)) return *l;
  std::fprintf(stderr, "[ebbflow] warn: EBBFLOW_LOG='%s' is not one of off,error,warn,info,debug,trace; using warn\n", v);
  return level::warn;
}
inline std::atomic<int>& current() noexcept {
  static std::atomic<int> l{static_cast<int>(level_from_env())};
  return l;
}
inline std::atomic<int>& rank_tag() noexcept {
  static std::atomic<int> r{-1};
  return r;
}
inline std::mutex& out_mutex() noexcept {
  static std::mutex m;
  return m;
}
}  // namespace detail

//! The active level.
inline level get_level() noexcept { return static_cast<level>(detail::current().load(std::memory_order_relaxed)); }
//! Changes the level for the whole process.
inline void set_level(level l) noexcept { detail::current().store(static_cast<int>(l), std::memory_order_relaxed); }
//! Tags every following record with this process's rank (-1: none).
inline void set_rank(int rank) noexcept { detail::rank_tag().store(rank, std::memory_order_relaxed); }
//! True when records of level `l` are printed. Thread-safe.
inline bool enabled(level l) noexcept { return l != level::off && static_cast<int>(l) <= detail::current().load(std::memory_order_relaxed); }

//! Writes one record (no level check; use the macros).
inline void write(level l, std::string_view msg) noexcept {
  try {
    std::ostringstream os;
    os << "[ebbflow";
    if (int r = detail::rank_tag().load(std::memory_order_relaxed); r >= 0) os << " rank " << r;
    os << "] " << name(l) << ": " << msg << '\n';
    const std::string line = os.str();
    std::lock_guard lk(detail::out_mutex());
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fflush(stderr);
  } catch (...) {
  }
}

}  // namespace log
EBBFLOW_END_NAMESPACE

#define EBBFLOW_DETAIL_LOG(lvl, expr)                                    \
  do {                                                                   \
    if (::ebbflow::log::enabled(lvl)) {                                  \
      std::ostringstream ebbflow_log_os_;                                \
      ebbflow_log_os_ << expr;                                           \
      ::ebbflow::log::write(lvl, ebbflow_log_os_.str());                 \
    }                                                                    \
  } while (0)
//! Logs `expr` (an ostream expression: `"x=" << x`) at level error.
#define EBBFLOW_LOG_ERROR(expr) EBBFLOW_DETAIL_LOG(::ebbflow::log::level::error, expr)
//! Logs `expr` at level warn.
#define EBBFLOW_LOG_WARN(expr) EBBFLOW_DETAIL_LOG(::ebbflow::log::level::warn, expr)
//! Logs `expr` at level info.
#define EBBFLOW_LOG_INFO(expr) EBBFLOW_DETAIL_LOG(::ebbflow::log::level::info, expr)
//! Logs `expr` at level debug.
#define EBBFLOW_LOG_DEBUG(expr) EBBFLOW_DETAIL_LOG(::ebbflow::log::level::debug, expr)
//! Logs `expr` at level trace.
#define EBBFLOW_LOG_TRACE(expr) EBBFLOW_DETAIL_LOG(::ebbflow::log::level::trace, expr)
// ==== end <ebbflow/core/log.hpp>

// ==== begin <ebbflow/core/memory.hpp> =====================================
// SPDX-License-Identifier: Apache-2.0
//! @file memory.hpp
//! Spans that carry their memory space, so host and device pointers cannot be
//! mixed up at compile time, plus an untyped buffer view (pointer, count,
//! dtype, space) for APIs that choose the element type at run time.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/dtype.hpp>  (inlined)

#include <cstddef>
#include <span>
#include <type_traits>

EBBFLOW_BEGIN_NAMESPACE

//! Where a buffer lives. `pinned` is page-locked host memory (host-accessible,
//! usable for asynchronous device copies).
enum class memory_space : std::uint8_t { host, pinned, device };

//! Lower-case name ("host", "pinned", "device").
constexpr std::string_view name(memory_space s) noexcept {
  switch (s) {
    case memory_space::host: return "host";
    case memory_space::pinned: return "pinned";
    case memory_space::device: return "device";
  }
  return "?";
}

//! True when the CPU may dereference memory of this space.
constexpr bool host_accessible(memory_space s) noexcept { return s != memory_space::device; }

//! A `std::span` tagged with its memory space. Converts implicitly from
//! `std::span` only for host memory; device spans must be built explicitly.
template <class T, memory_space Space>
class mspan : public std::span<T> {
 public:
  static constexpr memory_space space = Space;  //!< where the elements live
  using std::span<T>::span;
  constexpr mspan() noexcept = default;
  //! `n` elements at `p`, which must point into `Space`.
  constexpr mspan(T* p, std::size_t n) noexcept : std::span<T>(p, n) {}
  //! Tags `s` as memory of `Space` (the caller vouches for it).
  constexpr explicit mspan(std::span<T> s) noexcept : std::span<T>(s) {}
  //! A span of const elements in the same space.
  template <class U>
    requires std::is_convertible_v<U (*)[], T (*)[]>
  constexpr mspan(mspan<U, Space> o) noexcept : std::span<T>(o.data(), o.size()) {}

  //! Like `std::span::subspan`, keeping the memory space.
  [[nodiscard]] constexpr mspan subspan(std::size_t off, std::size_t n = std::dynamic_extent) const noexcept {
    return mspan(std::span<T>::subspan(off, n));
  }
};

//! Pageable host memory.
template <class T> using host_span = mspan<T, memory_space::host>;
//! Page-locked host memory.
template <class T> using pinned_span = mspan<T, memory_space::pinned>;
//! Device memory: not to be dereferenced on the CPU.
template <class T> using device_span = mspan<T, memory_space::device>;

//! An untyped view: `count` elements of `type` at `data` in `space`.
struct buffer_view {
  void* data = nullptr;                      //!< first element, in `space`
  std::size_t count = 0;                     //!< number of elements
  dtype type = dtype::f32;                   //!< element type
  memory_space space = memory_space::host;   //!< where `data` lives

  //! Size in bytes.
  [[nodiscard]] constexpr std::size_t bytes() const noexcept { return count * size_of(type); }
  //! The bytes of the buffer (in `space`).
  [[nodiscard]] std::span<std::byte> as_bytes() const noexcept {
    return {static_cast<std::byte*>(data), bytes()};
  }
  //! Elements [off, off + n).
  [[nodiscard]] buffer_view slice(std::size_t off, std::size_t n) const noexcept {
    return {static_cast<std::byte*>(data) + off * size_of(type), n, type, space};
  }
};

//! A view over a typed span, keeping its space.
template <class T, memory_space S>
buffer_view view(mspan<T, S> s) noexcept {
  return {const_cast<std::remove_const_t<T>*>(s.data()), s.size(), dtype_of_v<std::remove_const_t<T>>, S};
}
//! A view over host memory.
template <class T>
buffer_view view(std::span<T> s) noexcept {
  return {const_cast<std::remove_const_t<T>*>(s.data()), s.size(), dtype_of_v<std::remove_const_t<T>>,
          memory_space::host};
}

EBBFLOW_END_NAMESPACE
// ==== end <ebbflow/core/memory.hpp>

// ==== begin <ebbflow/exec/executor.hpp> ===================================
// SPDX-License-Identifier: Apache-2.0
//! @file executor.hpp
//! The `executor` concept: runs an `EBBFLOW_HD` functor over an index range
//! in one memory space. `cpu_executor` (this header) runs it as a host loop and
//! is the reference every GPU result is checked against; `cuda_executor`
//! (cuda_executor.cuh, nvcc only) launches it as a kernel on a stream.
//!
//! `bulk(n, f)` calls `f(i)` for every i in [0, n) in unspecified order and
//! possibly concurrently; `f` must not depend on ordering. `wait()` blocks
//! until every bulk submitted before it has finished.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/memory.hpp>  (inlined)

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <thread>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace exec {

namespace detail {
struct probe_fn {
  EBBFLOW_HD void operator()(std::size_t) const noexcept {}
};
}  // namespace detail

template <class E>
concept executor = requires(E& e, std::size_t n) {
  { E::space } -> std::convertible_to<memory_space>;
  e.bulk(n, detail::probe_fn{});
  e.wait();
};

//! Runs functors on the calling thread, or on `threads` threads in contiguous
//! chunks when `threads > 1` and the range is large enough to pay for it.
//! Blocking: `bulk` returns when all calls finished, so `wait()` is a no-op.
class cpu_executor {
 public:
  static constexpr memory_space space = memory_space::host;  //!< functors touch host memory

  constexpr cpu_executor() noexcept = default;
  //! Runs `bulk` on up to `threads` threads (0 counts as 1).
  explicit cpu_executor(unsigned threads) noexcept : threads_(threads == 0 ? 1 : threads) {}

  //! Calls `f(i)` for every i in [0, n); returns when all calls finished.
  template <class F>
  void bulk(std::size_t n, F&& f) const {
    constexpr std::size_t min_per_thread = 1 << 15;
    const std::size_t t = std::min<std::size_t>(threads_, std::max<std::size_t>(1, n / min_per_thread));
    if (t <= 1) {
      for (std::size_t i = 0; i < n; ++i) f(i);
      return;
    }
    std::vector<std::jthread> pool;
    pool.reserve(t - 1);
    const std::size_t chunk = (n + t - 1) / t;
    for (std::size_t k = 1; k < t; ++k) {
      const std::size_t b = k * chunk, e = std::min(n, b + chunk);
      pool.emplace_back([&f, b, e] {
        for (std::size_t i = b; i < e; ++i) f(i);
      });
    }
    for (std::size_t i = 0; i < std::min(n, chunk); ++i) f(i);
  }
  //! No-op: `bulk` is blocking.
  void wait() const noexcept {}
  //! Most threads `bulk` uses.
  [[nodiscard]] unsigned threads() const noexcept { return threads_; }

 private:
  unsigned threads_ = 1;
};
static_assert(executor<cpu_executor>);

}  // namespace exec
EBBFLOW_END_NAMESPACE
// ==== end <ebbflow/exec/executor.hpp>

#endif  // EBBFLOW_SINGLE_INCLUDE_HPP
