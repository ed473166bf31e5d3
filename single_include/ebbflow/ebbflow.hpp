// SPDX-License-Identifier: Apache-2.0
// ebbflow 0.1.0: single-include header.
//
// GENERATED FILE, DO NOT EDIT. Made by cmake/amalgamate.cmake from the
// 118 headers under include/ebbflow/ (regenerate: cmake -P cmake/amalgamate.cmake).
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

// Clang's __has_feature, or 0 where the compiler has none (GCC 12).
#if defined(__has_feature)
#define EBBFLOW_DETAIL_HAS_FEATURE(x) __has_feature(x)
#else
#define EBBFLOW_DETAIL_HAS_FEATURE(x) 0
#endif
#if defined(__SANITIZE_ADDRESS__) || EBBFLOW_DETAIL_HAS_FEATURE(address_sanitizer)
//! 1 when compiled with AddressSanitizer (GCC or Clang), else 0.
#define EBBFLOW_SANITIZE_ADDRESS 1
#else
//! 1 when compiled with AddressSanitizer (GCC or Clang), else 0.
#define EBBFLOW_SANITIZE_ADDRESS 0
#endif
#if defined(__SANITIZE_THREAD__) || EBBFLOW_DETAIL_HAS_FEATURE(thread_sanitizer)
//! 1 when compiled with ThreadSanitizer (GCC or Clang), else 0.
#define EBBFLOW_SANITIZE_THREAD 1
#else
//! 1 when compiled with ThreadSanitizer (GCC or Clang), else 0.
#define EBBFLOW_SANITIZE_THREAD 0
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

//! Separate compilation (the `ebbflow::compiled` CMake target, which defines
//! EBBFLOW_SEPARATE_COMPILATION for its users): the elastic group over the
//! TCP store and UCX, the store itself and the planner's solver are compiled
//! once, into that library (its one translation unit includes
//! <ebbflow/impl/compiled.hpp>), and the headers declare them only, so a
//! training loop's translation unit parses and generates far less. Every
//! translation unit of a program uses the same mode. Without the macro,
//! ebbflow is header-only (the default). docs/packaging.md, "Faster rebuilds".
#if defined(EBBFLOW_SEPARATE_COMPILATION) && !defined(EBBFLOW_COMPILING_LIBRARY)
#define EBBFLOW_HEADER_ONLY 0
#else
#define EBBFLOW_HEADER_ONLY 1
#endif
//! The linkage of a function that the compiled library defines: `inline`
//! when header-only, an ordinary (external) definition in separate mode.
#if defined(EBBFLOW_SEPARATE_COMPILATION)
#define EBBFLOW_DECL
#else
#define EBBFLOW_DECL inline
#endif

#define EBBFLOW_DETAIL_STR2(x) #x
#define EBBFLOW_DETAIL_STR(x) EBBFLOW_DETAIL_STR2(x)
// ==== end <ebbflow/config.hpp>

// ==== begin <ebbflow/comm/communicator.hpp> ===============================
// SPDX-License-Identifier: Apache-2.0
//! @file communicator.hpp
//! The `communicator` concept, and `transport_communicator`, its model for
//! host memory: collectives written once over any `comm::transport`
//! (allreduce, broadcast, allgather, reduce_scatter, barrier and
//! point-to-point send/recv), each in a blocking form (throwing, and a
//! `noexcept` twin taking `std::error_code&`) and a non-blocking form
//! returning a `comm::request` (so computation can overlap communication).
//! `nccl_communicator` (comm/nccl_communicator.hpp) models the same concept
//! for device memory: a training loop moves from host to device buffers by
//! changing the communicator's type, not its calls.
//!
//! Algorithms:
//! * allreduce: recursive doubling (with the MPICH fold for rank counts that
//!   are not powers of two) at or below `small_bytes`; above it, when every
//!   peer runs on this host and the transport allows single-copy reads
//!   (`local_peer`, UCX transport on Linux), each rank reduces its segment
//!   reading peers' buffers directly and then copies peers' segments
//!   (`single_copy`); otherwise ring reduce-scatter + ring allgather,
//!   pipelined in `chunk_bytes` chunks with `window` receives in flight,
//!   reducing from cache-resident scratch slots. All give bitwise-identical
//!   results on every rank.
//! * broadcast: binomial tree (small) or chunk-pipelined chain (large).
//! * allgather / reduce_scatter: ring. barrier: dissemination.
//!
//! Every collective takes a deadline (default: `collective_options::timeout`
//! from now) and reports failures as `ebbflow::system_error` (or, in the
//! `std::error_code&` forms, its code) whose message
//! names the operation, this rank, the generation, the peer whose operation
//! failed and the collective's sequence number. Conditions: `errc::peer_lost`
//! (a peer died), `errc::timeout` (deadline passed), `errc::bad_message`
//! (ranks disagree on sizes, when a message of the wrong size arrives; the
//! text names both sizes).
//!
//! Ranks that disagree on sizes get `bad_message` only when they run the
//! same algorithm, and then only the ranks that receive a message of the
//! wrong size (single_copy: every rank, which compares sizes first; the
//! ring: those whose chunks differ); its text names both sizes and the
//! cause. The others, waiting for a peer that gave up, get `errc::timeout`
//! at their deadline, as do all ranks when sizes on both sides of the
//! algorithm choice (`small_bytes`, the element count against the rank
//! count) make them run different algorithms whose messages never match;
//! the timeout's text names this rank's byte count and this possible cause.
//! Detecting it sooner would need the size on the wire or an extra round
//! trip per collective; ebbflow does neither.
//!
//! All ranks must call the same collectives in the same order with matching
//! sizes, dtypes and roots (MPI semantics). Buffers are host memory
//! (`memory_space::host` or `pinned`; a device view is refused with
//! `std::invalid_argument` naming its space). In-place: pass the same view as
//! input and output (for allgather: input at `output.slice(rank * n, n)`).
//!
//! Errors: a call that fails at run time throws
//! `ebbflow::system_error` (conditions `errc::peer_lost`, `timeout`,
//! `bad_message`, ...); its `std::error_code&` twin is `noexcept` and sets
//! the same code. Arguments the caller could have checked (counts, dtypes,
//! memory space, root, peer) raise `std::invalid_argument`; the twin reports
//! them as `std::errc::invalid_argument`.
//!
//! A transport that also offers `int lost_peer() const` (the UCX transport
//! does) lets errors name the peer that died rather than the neighbour whose
//! transfer reported it (in a ring, often a live rank stuck behind the dead
//! one). One that offers `bool probe_peers()` (UCX: is the process of a peer
//! on this host gone?) is asked before a timeout is reported, so a peer that
//! died unnoticed is reported lost, not the live peer this rank waited for.
//! The single-copy allreduce reports a peer's memory that vanished the same
//! way: the peer lost is the one whose process is gone (the peer read from
//! may only have left the collective after its own error).
//!
//! Thread safety: a communicator and its requests are driven by one thread at
//! a time (the thread that drives its transport).


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/comm/detail/collective_task.hpp>  (inlined here)
// ---- begin <ebbflow/comm/detail/collective_task.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file comm/detail/collective_task.hpp
//! What every collective of comm/communicator.hpp runs on: the coroutine
//! task a collective is (`promise`, `task`, `awaiting` one transport
//! request), the set in flight on one communicator, the scratch pool, and
//! the context an error reports.


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
//!   request fails with `errc::bad_message`. A model's request may offer
//!   `std::string error_detail() const`, naming both sizes after such a
//!   failure (both models here do); `send`/`recv` below and the communicator
//!   add it to the error's text.
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
//! Clocks, and deadlines for blocking calls. Every blocking call in ebbflow takes one
//! (or a timeout that is turned into one) and reports `errc::timeout` when it
//! passes.


// #include <ebbflow/config.hpp>  (inlined)

#include <chrono>

EBBFLOW_BEGIN_NAMESPACE

//! The clock of every deadline and timeout in ebbflow.
using steady_clock = std::chrono::steady_clock;

//! Seconds since the Unix epoch on the system clock: the stamp of event and
//! log lines, comparable across processes and hosts (never used for
//! deadlines, which take the steady clock).
[[nodiscard]] inline double wall_seconds() noexcept {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

//! A point in time on the steady clock after which a blocking call gives up.
class deadline {
 public:
  //! A deadline `timeout` from now; saturates (a timeout beyond the clock's
  //! range, e.g. `seconds::max()`, never passes).
  template <class Rep, class Period>
  static deadline after(std::chrono::duration<Rep, Period> timeout) noexcept {
    using seconds = std::chrono::duration<double>;
    const auto now = steady_clock::now();
    const double at = seconds(now.time_since_epoch()).count() + seconds(timeout).count();
    if (at >= seconds(steady_clock::duration::max()).count() - 1) return never();  // 1 s: double rounding
    if (at <= seconds(steady_clock::duration::min()).count() + 1) return deadline(steady_clock::time_point::min());
    return deadline(now + std::chrono::duration_cast<steady_clock::duration>(timeout));
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
//! The convention (docs/architecture.md, "Errors"): a precondition the caller
//! could have checked raises `std::invalid_argument` naming the value and file
//! and line (`EBBFLOW_ENFORCE`); a condition found at run time raises
//! `ebbflow::system_error` (or a type derived from it) with a code comparable
//! to an `errc`. Synchronous calls of the communication and store layers come
//! in pairs, a throwing form and a `noexcept` form taking `std::error_code&`.
//! Nothing throws from destructors, device code or transport callbacks.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/enum_names.hpp>  (inlined here)
// ---- begin <ebbflow/core/enum_names.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file enum_names.hpp
//! `enum_names`: the names of an enum's enumerators as one constexpr table,
//! looked up both ways, in place of a switch per enum. Declare the table
//! next to the enum and tie it to the enum's last enumerator, so that an
//! enumerator added without a name fails to compile:
//!
//! ```cpp
//! enum class color { red, green, blue };
//! inline constexpr auto color_names = make_enum_names(color::red, "red", "green", "blue");
//! static_assert(color_names.last() == color::blue);
//! constexpr std::string_view name(color c) noexcept { return color_names(c); }
//! ```


// #include <ebbflow/config.hpp>  (inlined)

#include <array>
#include <cstddef>
#include <optional>
#include <string_view>
#include <type_traits>

EBBFLOW_BEGIN_NAMESPACE

//! The names of the N enumerators `first`, `first` + 1, ... of `E`, which
//! must have no gaps, in that order. A constexpr value; make one with
//! `make_enum_names`. Thread safety: immutable.
template <class E, std::size_t N>
requires std::is_enum_v<E> &&(N > 0) struct enum_names {
  std::array<std::string_view, N> names;  //!< `names[i]` is the name of `first` + i
  E first;                                //!< the enumerator `names[0]` names

  //! The name of `e`, or `unknown` for a value outside the table. O(1).
  [[nodiscard]] constexpr std::string_view operator()(E e, std::string_view unknown = "?") const noexcept {
    const long long d = value(e) - value(first);
    return d >= 0 && d < static_cast<long long>(N) ? names[static_cast<std::size_t>(d)] : unknown;
  }
  //! The enumerator named `s` (an exact match), or nullopt. O(N).
  [[nodiscard]] constexpr std::optional<E> parse(std::string_view s) const noexcept {
    for (std::size_t i = 0; i < N; ++i)
      if (names[i] == s) return at(i);
    return std::nullopt;
  }
  //! The enumerator of `names[i]` (i < N).
  [[nodiscard]] constexpr E at(std::size_t i) const noexcept {
    return static_cast<E>(value(first) + static_cast<long long>(i));
  }
  //! The enumerator the last name belongs to.
  [[nodiscard]] constexpr E last() const noexcept { return at(N - 1); }
  //! Number of names.
  [[nodiscard]] static constexpr std::size_t size() noexcept { return N; }

 private:
  static constexpr long long value(E e) noexcept { return static_cast<long long>(e); }
};

//! The table naming `first` and the enumerators after it, in order:
//! `make_enum_names(level::off, "off", "error", "warn")`.
template <class E, class... Names>
requires std::is_enum_v<E> &&(sizeof...(Names) > 0) &&
    (std::is_convertible_v<const Names&, std::string_view> && ...)
        [[nodiscard]] constexpr enum_names<E, sizeof...(Names)> make_enum_names(E first,
                                                                                const Names&... names) noexcept {
  return {{std::string_view(names)...}, first};
}

EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/core/enum_names.hpp>

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
// ---- end <ebbflow/core/error.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
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

//! Sequence numbers of collectives wrap at 2^24: the UCX wire keeps 24 bits
//! of one (only collectives in flight at the same time must differ). Every
//! collective on a transport takes its number from the one communicator that
//! drives it (`transport_communicator`), which also hands numbers to
//! collectives written outside it (`next_sequence`), so no two ever share one.
inline constexpr std::uint64_t seq_mask = (std::uint64_t{1} << 24) - 1;

//! Tag for step `step` (< 2^16) of collective number `seq` (wraps at 2^32).
constexpr tag_t make_tag(std::uint64_t seq, std::uint32_t step) noexcept {
  return ((seq & 0xffffffffu) << 16 | (step & 0xffffu)) & tag_mask;
}

//! The highest step a collective may give `make_tag`: steps 0xfffe and
//! 0xffff are reserved (a transport's wire-up handshake, point-to-point
//! messages).
inline constexpr std::uint32_t max_collective_step = 0xfffd;
//! Most ranks the collectives support: a ring allreduce numbers its
//! 2 (n − 1) reduce-scatter and allgather steps apart, all at most
//! `max_collective_step`, so that no two steps of one collective, and no
//! reserved step, share a tag.
inline constexpr int max_collective_ranks = 0x7fff;
static_assert(2 * (max_collective_ranks - 1) <= static_cast<int>(max_collective_step));

//! Refuses a transport of more ranks than the collectives support (or
//! none), naming `who` (the collective's owner) in the error.
//! @throws std::invalid_argument when `size` is outside [1, max_collective_ranks].
inline void check_rank_count(int size, std::string_view who) {
  EBBFLOW_ENFORCE(size >= 1 && size <= max_collective_ranks,
                  who << ": " << size << " ranks; the collectives support 1 to " << max_collective_ranks);
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

namespace detail {
//! `base`, followed by what failed request `r` says about its failure (see
//! `error_detail` above), when its transport tells.
template <class Request>
std::string describe(const Request& r, std::string base) {
  if constexpr (requires {
                  { r.error_detail() } -> std::convertible_to<std::string>;
                }) {
    if (std::string why = r.error_detail(); !why.empty()) base += "; " + why;
  }
  return base;
}

//! Waits for `r` until `d`. @throws system_error naming rank, peer,
//! generation, `operation` and the size of the transfer.
template <transport T>
void finish(T& t, typename T::request& r, int peer, const char* operation, std::size_t bytes, deadline d) {
  std::error_code ec;
  t.wait(r, d, ec);
  if (ec)
    throw_if(ec, {.rank = t.rank(),
                  .generation = t.generation(),
                  .peer = peer,
                  .operation = operation,
                  .detail = describe(r, std::to_string(bytes) + " bytes")});
}
}  // namespace detail

//! Blocking send with a deadline. @throws system_error naming rank, peer, generation.
template <transport T>
void send(T& t, int peer, tag_t tag, std::span<const std::byte> data, deadline d) {
  auto r = t.isend(peer, tag, data);
  detail::finish(t, r, peer, "send", data.size(), d);
}

//! Blocking receive with a deadline. @throws system_error naming rank, peer, generation.
template <transport T>
void recv(T& t, int peer, tag_t tag, std::span<std::byte> data, deadline d) {
  auto r = t.irecv(peer, tag, data);
  detail::finish(t, r, peer, "recv", data.size(), d);
}

}  // namespace comm
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/comm/transport.hpp>
// #include <ebbflow/core/error.hpp>  (inlined)

#include <algorithm>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace comm::detail {

//! Where a request runs; seq/bytes become the error detail only on failure.
struct op_context {
  error_context ctx;
  std::uint64_t seq = 0;
  std::size_t bytes = 0;
  bool describe = false;
  op_context(error_context c) : ctx(std::move(c)) {}  // NOLINT: implicit on purpose
  op_context(error_context c, std::uint64_t s, std::size_t b, bool d)
      : ctx(std::move(c)), seq(s), bytes(b), describe(d) {}
};

//! The elements [first, second) of a `count`-element buffer that rank `r` of
//! `n` reduces (`comm::allreduce_segment`).
[[nodiscard]] constexpr std::pair<std::size_t, std::size_t> segment_of(std::size_t count, int n, int r) noexcept {
  const auto un = static_cast<std::size_t>(n), ur = static_cast<std::size_t>(r);
  return {count * ur / un, count * (ur + 1) / un};
}

//! Reusable scratch buffers (uninitialised), so a collective does not pay
//! page faults for fresh allocations on every call. Single-threaded, like the
//! communicator that owns it.
class scratch_pool {
 public:
  struct lease {
    std::shared_ptr<scratch_pool> pool;
    std::unique_ptr<std::byte[]> buf;
    std::size_t cap = 0;
    lease() = default;
    lease(std::shared_ptr<scratch_pool> p, std::unique_ptr<std::byte[]> b, std::size_t c) noexcept
        : pool(std::move(p)), buf(std::move(b)), cap(c) {}
    lease(lease&&) noexcept = default;
    lease& operator=(lease&&) noexcept = default;
    ~lease() {
      if (pool && buf) pool->give_back(std::move(buf), cap);
    }
    [[nodiscard]] std::byte* data() const noexcept { return buf.get(); }
  };

  static lease take(const std::shared_ptr<scratch_pool>& self, std::size_t bytes) {
    auto& f = self->free_;
    for (std::size_t i = 0; i < f.size(); ++i) {
      if (f[i].cap >= bytes) {
        lease l(self, std::move(f[i].buf), f[i].cap);
        f.erase(f.begin() + static_cast<std::ptrdiff_t>(i));
        return l;
      }
    }
    const std::size_t cap = std::max<std::size_t>(bytes, 64);
    return lease(self, std::unique_ptr<std::byte[]>(new std::byte[cap]), cap);
  }

 private:
  static constexpr std::size_t max_cached = 4;
  struct entry {
    std::size_t cap;
    std::unique_ptr<std::byte[]> buf;
  };
  void give_back(std::unique_ptr<std::byte[]> b, std::size_t cap) noexcept {
    try {
      if (free_.size() >= max_cached) {
        // Keep the largest buffers: they are the expensive ones to fault in.
        auto smallest =
            std::min_element(free_.begin(), free_.end(), [](const entry& x, const entry& y) { return x.cap < y.cap; });
        if (smallest->cap >= cap) return;
        free_.erase(smallest);
      }
      free_.push_back({cap, std::move(b)});
    } catch (...) {
    }
  }
  std::vector<entry> free_;
};

template <transport T>
struct task;

template <transport T>
struct promise {
  typename T::request* awaited = nullptr;  // the transfer the coroutine waits for
  int peer = -1;                           // its peer, for error messages
  std::error_code failed{};                // set by the coroutine before co_return on error
  int failed_peer = -1;
  std::string failed_detail;  // what the failed transfer said (sizes), if anything
  std::exception_ptr exc;
  task<T> get_return_object() noexcept;
  std::suspend_always initial_suspend() const noexcept { return {}; }
  std::suspend_always final_suspend() const noexcept { return {}; }
  void return_void() const noexcept {}
  void unhandled_exception() noexcept { exc = std::current_exception(); }
};

template <transport T>
struct task {
  using promise_type = promise<T>;
  std::coroutine_handle<promise<T>> h;
};

//! The collectives in flight on one communicator.
template <transport T>
struct active_set {
  std::vector<std::coroutine_handle<promise<T>>> hs;
};

template <transport T>
task<T> promise<T>::get_return_object() noexcept {
  return task<T>{std::coroutine_handle<promise<T>>::from_promise(*this)};
}

//! `co_await awaiting(t, req, peer)`: continues at once when `req` already
//! completed successfully, otherwise suspends until the driver saw it complete.
template <transport T>
struct awaiting {
  T& t;
  typename T::request& req;
  int peer;
  bool await_ready() const {
    std::error_code ec;
    return t.test(req, ec) && !ec;
  }
  void await_suspend(std::coroutine_handle<promise<T>> h) const noexcept {
    h.promise().awaited = &req;
    h.promise().peer = peer;
  }
  void await_resume() const noexcept {}
};

inline std::span<const std::byte> cbytes(const std::byte* p, std::size_t n) noexcept { return {p, n}; }
inline std::span<std::byte> mbytes(std::byte* p, std::size_t n) noexcept { return {p, n}; }
inline int mod(long long a, int n) noexcept { return static_cast<int>(((a % n) + n) % n); }

}  // namespace comm::detail
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/comm/detail/collective_task.hpp>
// #include <ebbflow/comm/reduce.hpp>  (inlined here)
// ---- begin <ebbflow/comm/reduce.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file reduce.hpp
//! Element-wise reduction kernels on host memory, used by every collective:
//! `dst[i] = op(a[i], b[i])` for each dtype and `reduce_op`, and the final
//! division of `avg`. f16/bf16 are widened to f32, combined and rounded back
//! (round to nearest even) at every step.
//!
//! The kernels are written as explicit 16-element blocks over GCC/Clang vector
//! extensions, so they vectorise at -O2 (GCC 12 does not vectorise the plain
//! `a[i] += b[i]` loop at -O2). `dst` may equal `a` exactly (in-place); no
//! other overlap is allowed. All pointers are host memory. Never blocks,
//! never throws; thread-safe (no shared state).


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/dtype.hpp>  (inlined here)
// ---- begin <ebbflow/core/dtype.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file dtype.hpp
//! Element types and reduction operators that collectives and codecs accept.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/enum_names.hpp>  (inlined)
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
    if (ax < 0x38800000u) {                                                    // subnormal or zero in half
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
#include <iterator>
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
    case dtype::f64:
    case dtype::i64:
      return 8;
    case dtype::f32:
    case dtype::i32:
      return 4;
    case dtype::f16:
    case dtype::bf16:
      return 2;
    case dtype::u8:
      return 1;
  }
  return 0;
}

namespace detail {
inline constexpr auto dtype_names = make_enum_names(dtype::f32, "f32", "f64", "f16", "bf16", "i32", "i64", "u8");
static_assert(dtype_names.last() == dtype::u8 && dtype_names.size() == std::size(all_dtypes));
}  // namespace detail

//! Short name ("f32", "bf16", ...), as printed by benchmarks and errors.
constexpr std::string_view name(dtype t) noexcept { return detail::dtype_names(t); }

//! Parses a name produced by `name(dtype)`.
constexpr std::optional<dtype> parse_dtype(std::string_view s) noexcept { return detail::dtype_names.parse(s); }

//! True for f32, f64, f16 and bf16.
constexpr bool is_floating(dtype t) noexcept {
  return t == dtype::f32 || t == dtype::f64 || t == dtype::f16 || t == dtype::bf16;
}

//! The dtype of a C++ element type; `dtype_of_v<float> == dtype::f32`.
template <class T>
struct dtype_of;
template <>
struct dtype_of<float> : std::integral_constant<dtype, dtype::f32> {};
template <>
struct dtype_of<double> : std::integral_constant<dtype, dtype::f64> {};
template <>
struct dtype_of<half> : std::integral_constant<dtype, dtype::f16> {};
template <>
struct dtype_of<bfloat16> : std::integral_constant<dtype, dtype::bf16> {};
template <>
struct dtype_of<std::int32_t> : std::integral_constant<dtype, dtype::i32> {};
template <>
struct dtype_of<std::int64_t> : std::integral_constant<dtype, dtype::i64> {};
template <>
struct dtype_of<std::uint8_t> : std::integral_constant<dtype, dtype::u8> {};
//! `dtype_of<T>::value`, ignoring cv-qualifiers.
template <class T>
inline constexpr dtype dtype_of_v = dtype_of<std::remove_cv_t<T>>::value;

//! Calls `f(T{})` with the C++ type of `t` (a tag value), returning its result.
template <class F>
constexpr decltype(auto) visit_dtype(dtype t, F&& f) {
  switch (t) {
    case dtype::f32:
      return f(float{});
    case dtype::f64:
      return f(double{});
    case dtype::f16:
      return f(half{});
    case dtype::bf16:
      return f(bfloat16{});
    case dtype::i32:
      return f(std::int32_t{});
    case dtype::i64:
      return f(std::int64_t{});
    case dtype::u8:
      return f(std::uint8_t{});
  }
  return f(float{});
}

//! Reduction operator of a collective. `avg` is `sum` divided by the world
//! size (integers: truncating division).
enum class reduce_op : std::uint8_t { sum, avg, min, max, prod };

//! Every reduce_op, for iteration in tests and benchmarks.
inline constexpr reduce_op all_reduce_ops[] = {reduce_op::sum, reduce_op::avg, reduce_op::min, reduce_op::max,
                                               reduce_op::prod};

namespace detail {
inline constexpr auto reduce_op_names = make_enum_names(reduce_op::sum, "sum", "avg", "min", "max", "prod");
static_assert(reduce_op_names.last() == reduce_op::prod && reduce_op_names.size() == std::size(all_reduce_ops));
}  // namespace detail

//! Short name ("sum", "avg", ...).
constexpr std::string_view name(reduce_op op) noexcept { return detail::reduce_op_names(op); }

//! Parses a name produced by `name(reduce_op)`.
constexpr std::optional<reduce_op> parse_reduce_op(std::string_view s) noexcept {
  return detail::reduce_op_names.parse(s);
}

EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/core/dtype.hpp>

#include <cstddef>

EBBFLOW_BEGIN_NAMESPACE
namespace comm {

//! `dst[i] = op(a[i], b[i])` for `count` elements of `type` (`avg` combines
//! like `sum`; divide once at the end with `finish_avg`). `dst` may be `a`.
inline void reduce(dtype type, reduce_op op, void* dst, const void* a, const void* b, std::size_t count) noexcept;

//! `dst[i] /= divisor` for `count` elements (integers: truncating division);
//! the last step of `reduce_op::avg`.
inline void finish_avg(dtype type, void* dst, std::size_t count, int divisor) noexcept;

}  // namespace comm
EBBFLOW_END_NAMESPACE

// #include <ebbflow/comm/impl/reduce.hpp>  (inlined here)
// ---- begin <ebbflow/comm/impl/reduce.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file impl/reduce.hpp
//! Definitions for comm/reduce.hpp. Every kernel works on 16-byte vectors
//! (GCC/Clang vector extensions: the SSE2 / NEON width, so no ABI
//! warning without -mavx) in blocks of four vectors, then a scalar tail. Loads and stores go through
//! memcpy, so no alignment is assumed; a whole block is loaded before it is
//! stored, which keeps `dst == a` (in-place) correct.


// #include <ebbflow/comm/reduce.hpp>  (inlined)
// #include <ebbflow/core/half.hpp>  (inlined)

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

EBBFLOW_BEGIN_NAMESPACE
namespace comm::detail {

//! The 16-byte GCC vector of `T` lanes (typedef form: an alias declaration
//! would drop the attribute on a dependent type).
template <class T>
struct vec_of {
  typedef T type __attribute__((vector_size(16)));
};
using v_f32 = vec_of<float>::type;
using v_u32 = vec_of<std::uint32_t>::type;
using v4_u16 = std::uint16_t __attribute__((vector_size(8)));

struct op_sum {
  template <class V>
  static V apply(V a, V b) noexcept {
    return a + b;
  }
};
struct op_prod {
  template <class V>
  static V apply(V a, V b) noexcept {
    return a * b;
  }
};
//! Whether V is a GCC vector of floating-point lanes.
template <class V>
constexpr bool is_float_vector() noexcept {
  if constexpr (requires(V v) { v[0]; })
    return std::is_floating_point_v<std::remove_cvref_t<decltype(std::declval<V>()[0])>>;
  else
    return false;
}

//! min and max must not depend on the order of their operands: each rank
//! combines its own value first, so an asymmetric rule would give ranks
//! different bits. Floating point follows IEEE 754-2019 minimum/maximum: a
//! NaN operand gives the canonical quiet NaN, and -0 is below +0.
template <bool Max>
struct op_minmax {
  template <class V>
  static V apply(V a, V b) noexcept {
    if constexpr (std::is_floating_point_v<V>) {
      if (a != a || b != b) return std::numeric_limits<V>::quiet_NaN();
      if (a == b) return std::signbit(a) == Max ? b : a;  // equal, or +0 and -0
      return (Max ? a < b : b < a) ? b : a;
    } else if constexpr (is_float_vector<V>()) {
      using T = std::remove_cvref_t<decltype(a[0])>;
      using M = decltype(a < b);  // the signed integer vector of V's shape
      const V picked = (Max ? a < b : b < a) ? b : a;
      M pb, ab, bb;
      std::memcpy(&pb, &picked, sizeof pb);
      std::memcpy(&ab, &a, sizeof ab);
      std::memcpy(&bb, &b, sizeof bb);
      // Equal lanes (+0 and -0 among them): -0 wins the min, +0 the max.
      pb = a == b ? (Max ? ab & bb : ab | bb) : pb;
      const V quiet = V{} + std::numeric_limits<T>::quiet_NaN();
      M qb;
      std::memcpy(&qb, &quiet, sizeof qb);
      pb = (a != a) | (b != b) ? qb : pb;
      V r;
      std::memcpy(&r, &pb, sizeof r);
      return r;
    } else {
      return (Max ? a < b : b < a) ? b : a;
    }
  }
};
using op_min = op_minmax<false>;
using op_max = op_minmax<true>;

template <class V>
inline V load(const void* p) noexcept {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class V>
inline void store(void* p, const V& v) noexcept {
  std::memcpy(p, &v, sizeof v);
}

//! Native types: four vectors per block, then scalars.
template <class T, class Op>
inline void reduce_native(T* dst, const T* a, const T* __restrict b, std::size_t n) noexcept {
  using V = typename vec_of<T>::type;
  constexpr std::size_t lanes = sizeof(V) / sizeof(T);
  std::size_t i = 0;
  for (; i + 4 * lanes <= n; i += 4 * lanes) {
    const V a0 = load<V>(a + i), a1 = load<V>(a + i + lanes), a2 = load<V>(a + i + 2 * lanes),
            a3 = load<V>(a + i + 3 * lanes);
    const V b0 = load<V>(b + i), b1 = load<V>(b + i + lanes), b2 = load<V>(b + i + 2 * lanes),
            b3 = load<V>(b + i + 3 * lanes);
    store(dst + i, Op::apply(a0, b0));
    store(dst + i + lanes, Op::apply(a1, b1));
    store(dst + i + 2 * lanes, Op::apply(a2, b2));
    store(dst + i + 3 * lanes, Op::apply(a3, b3));
  }
  for (; i < n; ++i) dst[i] = Op::apply(a[i], b[i]);
}

//! bfloat16: widen 4 lanes to f32 by a shift, combine, round to nearest even
//! (NaN stays a quiet NaN, as `bfloat16::from_float`).
template <class Op>
inline void reduce_bf16(std::uint16_t* dst, const std::uint16_t* a, const std::uint16_t* __restrict b,
                        std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const v_u32 wa = __builtin_convertvector(load<v4_u16>(a + i), v_u32) << 16;
    const v_u32 wb = __builtin_convertvector(load<v4_u16>(b + i), v_u32) << 16;
    v_f32 fa, fb;
    std::memcpy(&fa, &wa, sizeof fa);
    std::memcpy(&fb, &wb, sizeof fb);
    const v_f32 fr = Op::apply(fa, fb);
    v_u32 x;
    std::memcpy(&x, &fr, sizeof x);
    const v_u32 rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    const v_u32 nan = (x >> 16) | 0x40u;
    const v_u32 r = (x & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
    store(dst + i, __builtin_convertvector(r, v4_u16));
  }
  for (; i < n; ++i) {
    const float r = Op::apply(bfloat16::to_float(a[i]), bfloat16::to_float(b[i]));
    dst[i] = bfloat16::from_float(r);
  }
}

//! IEEE half: scalar widening (the bit conversion is branchy), f32 combine.
template <class Op>
inline void reduce_f16(std::uint16_t* dst, const std::uint16_t* a, const std::uint16_t* __restrict b,
                       std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) dst[i] = half::from_float(Op::apply(half::to_float(a[i]), half::to_float(b[i])));
}

template <class Op>
inline constexpr bool wraps = std::is_same_v<Op, op_sum> || std::is_same_v<Op, op_prod>;

//! `reduce_native` on untyped buffers of `T`.
template <class T, class Op>
inline void reduce_as(void* dst, const void* a, const void* b, std::size_t n) noexcept {
  reduce_native<T, Op>(static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), n);
}

template <class Op>
inline void reduce_typed(dtype type, void* dst, const void* a, const void* b, std::size_t n) noexcept {
  // A sum or product of integers past the range wraps (two's complement, in
  // the unsigned type), the same on every rank; signed overflow would be undefined.
  switch (type) {
    case dtype::f32:
      return reduce_as<float, Op>(dst, a, b, n);
    case dtype::f64:
      return reduce_as<double, Op>(dst, a, b, n);
    case dtype::i32:
      return reduce_as<std::conditional_t<wraps<Op>, std::uint32_t, std::int32_t>, Op>(dst, a, b, n);
    case dtype::i64:
      return reduce_as<std::conditional_t<wraps<Op>, std::uint64_t, std::int64_t>, Op>(dst, a, b, n);
    case dtype::u8:
      return reduce_as<std::uint8_t, Op>(dst, a, b, n);
    case dtype::bf16:
      return reduce_bf16<Op>(static_cast<std::uint16_t*>(dst), static_cast<const std::uint16_t*>(a),
                             static_cast<const std::uint16_t*>(b), n);
    case dtype::f16:
      return reduce_f16<Op>(static_cast<std::uint16_t*>(dst), static_cast<const std::uint16_t*>(a),
                            static_cast<const std::uint16_t*>(b), n);
  }
}

template <class T>
inline void divide_native(T* p, std::size_t n, T d) noexcept {
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] / d);
}

}  // namespace comm::detail

namespace comm {

inline void reduce(dtype type, reduce_op op, void* dst, const void* a, const void* b, std::size_t count) noexcept {
  if (count == 0) return;
  switch (op) {
    case reduce_op::sum:
    case reduce_op::avg:
      return detail::reduce_typed<detail::op_sum>(type, dst, a, b, count);
    case reduce_op::prod:
      return detail::reduce_typed<detail::op_prod>(type, dst, a, b, count);
    case reduce_op::min:
      return detail::reduce_typed<detail::op_min>(type, dst, a, b, count);
    case reduce_op::max:
      return detail::reduce_typed<detail::op_max>(type, dst, a, b, count);
  }
}

inline void finish_avg(dtype type, void* dst, std::size_t count, int divisor) noexcept {
  if (count == 0 || divisor == 1) return;
  switch (type) {
    case dtype::f32: {
      // Multiply by the reciprocal would differ from sum / n in the last bit;
      // keep the division so every algorithm gives the same result.
      return detail::divide_native(static_cast<float*>(dst), count, static_cast<float>(divisor));
    }
    case dtype::f64:
      return detail::divide_native(static_cast<double*>(dst), count, static_cast<double>(divisor));
    case dtype::i32:
      return detail::divide_native(static_cast<std::int32_t*>(dst), count, std::int32_t{divisor});
    case dtype::i64:
      return detail::divide_native(static_cast<std::int64_t*>(dst), count, std::int64_t{divisor});
    case dtype::u8: {
      auto* p = static_cast<std::uint8_t*>(dst);
      for (std::size_t i = 0; i < count; ++i) p[i] = static_cast<std::uint8_t>(p[i] / divisor);
      return;
    }
    case dtype::f16: {
      auto* p = static_cast<std::uint16_t*>(dst);
      for (std::size_t i = 0; i < count; ++i)
        p[i] = half::from_float(half::to_float(p[i]) / static_cast<float>(divisor));
      return;
    }
    case dtype::bf16: {
      auto* p = static_cast<std::uint16_t*>(dst);
      for (std::size_t i = 0; i < count; ++i)
        p[i] = bfloat16::from_float(bfloat16::to_float(p[i]) / static_cast<float>(divisor));
      return;
    }
  }
}

}  // namespace comm
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/comm/impl/reduce.hpp>
// ---- end <ebbflow/comm/reduce.hpp>
// #include <ebbflow/comm/transport.hpp>  (inlined)
// #include <ebbflow/core/deadline.hpp>  (inlined)
// #include <ebbflow/core/dtype.hpp>  (inlined)
// #include <ebbflow/core/env.hpp>  (inlined here)
// ---- begin <ebbflow/core/env.hpp>
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

#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

EBBFLOW_BEGIN_NAMESPACE
namespace env {

//! The raw value, or nullopt when unset or empty.
inline std::optional<std::string> get(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

namespace detail {
//! The whole of `v` as an integer, or nullopt when it is not one.
inline std::optional<std::int64_t> parse_int(const std::string& v) {
  std::int64_t out = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc{} || p != v.data() + v.size()) return std::nullopt;
  return out;
}
}  // namespace detail

//! An integer in [lo, hi], or `fallback` when unset.
//! @throws std::invalid_argument when set but not an integer in range.
inline std::int64_t get_int(const char* name, std::int64_t fallback,
                            std::int64_t lo = std::numeric_limits<std::int64_t>::min(),
                            std::int64_t hi = std::numeric_limits<std::int64_t>::max()) {
  auto v = get(name);
  if (!v) return fallback;
  const auto out = detail::parse_int(*v);
  EBBFLOW_ENFORCE(out && *out >= lo && *out <= hi,
                  name << "='" << *v << "': expected an integer in [" << lo << ", " << hi << "]");
  return *out;
}

//! 0 (off), or an integer in [lo, hi]; `fallback` when unset.
//! @throws std::invalid_argument when set to anything else.
inline std::int64_t get_int_or_zero(const char* name, std::int64_t fallback, std::int64_t lo, std::int64_t hi) {
  auto v = get(name);
  if (!v) return fallback;
  const auto out = detail::parse_int(*v);
  EBBFLOW_ENFORCE(out && (*out == 0 || (*out >= lo && *out <= hi)),
                  name << "='" << *v << "': expected 0 or an integer in [" << lo << ", " << hi << "]");
  return *out;
}

//! The value of the choice whose name the variable holds, or `fallback`
//! when unset: `get_choice("X", mode::a, {{"a", mode::a}, {"b", mode::b}})`.
//! @throws std::invalid_argument naming the variable, its value and every choice.
template <class T>
T get_choice(const char* name, T fallback, std::initializer_list<std::pair<std::string_view, T>> choices) {
  auto v = get(name);
  if (!v) return fallback;
  std::string names;
  for (const auto& [n, value] : choices) {
    if (*v == n) return value;
    names += (names.empty() ? "" : ", ") + std::string(n);
  }
  EBBFLOW_ENFORCE(false, name << "='" << *v << "': expected one of " << names);
  return fallback;
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
inline std::chrono::milliseconds get_ms(const char* name, std::chrono::milliseconds fallback, std::int64_t lo_ms = 0,
                                        std::int64_t hi_ms = 24LL * 3600 * 1000) {
  return std::chrono::milliseconds(get_int(name, fallback.count(), lo_ms, hi_ms));
}

//! This host's name (gethostname), or "localhost" when it has none.
inline std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || !buf[0]) return "localhost";
  return buf;
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
  int rank = 0;                          //!< this process's rank in the initial world
  int world_size = 1;                    //!< processes in the initial world
  int local_rank = 0;                    //!< rank among processes on this host
  std::string store_host = "127.0.0.1";  //!< rendezvous store address
  std::uint16_t store_port = 0;          //!< 0: no store given
  std::string token;                     //!< job secret (EBBFLOW_TOKEN); never logged
  std::string source = "default";        //!< which launcher's variables were used

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
// ---- end <ebbflow/core/env.hpp>
// #include <ebbflow/core/error.hpp>  (inlined)
// #include <ebbflow/core/memory.hpp>  (inlined here)
// ---- begin <ebbflow/core/memory.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file memory.hpp
//! Spans that carry their memory space, so host and device pointers cannot be
//! mixed up at compile time, plus an untyped buffer view (pointer, count,
//! dtype, space) for APIs that choose the element type at run time.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/dtype.hpp>  (inlined)
// #include <ebbflow/core/enum_names.hpp>  (inlined)

#include <cstddef>
#include <span>
#include <type_traits>

EBBFLOW_BEGIN_NAMESPACE

//! Where a buffer lives. `pinned` is page-locked host memory (host-accessible,
//! usable for asynchronous device copies).
enum class memory_space : std::uint8_t { host, pinned, device };

namespace detail {
inline constexpr auto memory_space_names = make_enum_names(memory_space::host, "host", "pinned", "device");
static_assert(memory_space_names.last() == memory_space::device);
}  // namespace detail

//! Lower-case name ("host", "pinned", "device").
constexpr std::string_view name(memory_space s) noexcept { return detail::memory_space_names(s); }

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
template <class T>
using host_span = mspan<T, memory_space::host>;
//! Page-locked host memory.
template <class T>
using pinned_span = mspan<T, memory_space::pinned>;
//! Device memory: not to be dereferenced on the CPU.
template <class T>
using device_span = mspan<T, memory_space::device>;

//! An untyped view: `count` elements of `type` at `data` in `space`.
struct buffer_view {
  void* data = nullptr;                     //!< first element, in `space`
  std::size_t count = 0;                    //!< number of elements
  dtype type = dtype::f32;                  //!< element type
  memory_space space = memory_space::host;  //!< where `data` lives

  //! Size in bytes.
  [[nodiscard]] constexpr std::size_t bytes() const noexcept { return count * size_of(type); }
  //! The bytes of the buffer (in `space`).
  [[nodiscard]] std::span<std::byte> as_bytes() const noexcept { return {static_cast<std::byte*>(data), bytes()}; }
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
// ---- end <ebbflow/core/memory.hpp>

#include <chrono>
#include <concepts>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace comm {

//! The elements [first, second) of a `count`-element buffer that rank `r` of
//! `n` reduces in the ring and single_copy allreduce (and holds after the
//! ring's reduce-scatter phase): count·r/n up to count·(r+1)/n. E.g. to shard
//! an optimizer update the way the reduction is sharded, or to check each
//! rank's partial sums.
[[nodiscard]] constexpr std::pair<std::size_t, std::size_t> allreduce_segment(std::size_t count, int n,
                                                                              int r) noexcept {
  return detail::segment_of(count, n, r);
}

//! Allreduce algorithm selection.
enum class allreduce_algorithm : std::uint8_t {
  automatic,           //!< recursive doubling up to `small_bytes`, ring above
  ring,                //!< bandwidth-optimal: 2(n-1)/n of the buffer per rank
  recursive_doubling,  //!< latency-optimal: ceil(log2 n) (+2) steps, full buffer each
  single_copy,         //!< all ranks on one host: direct reads of peers' buffers (Linux CMA)
};

//! Tuning knobs and the default deadline; the defaults suit shared-memory
//! and TCP transports on one host. Every rank must use the same values for
//! the algorithm choice (`allreduce`, `small_bytes`, `chunk_bytes`).
struct collective_options {
  allreduce_algorithm allreduce = allreduce_algorithm::automatic;  //!< allreduce algorithm (see `allreduce_algorithm`)
  std::size_t small_bytes = std::size_t{16} << 10;                 //!< at or below: latency-optimal algorithms
  std::size_t chunk_bytes = std::size_t{128} << 10;                //!< pipelining granularity of ring / chain
  int window = 4;                                                  //!< chunk receives in flight (scratch slots)
  std::size_t copy_chunk_bytes = std::size_t{512} << 10;           //!< single_copy: peer data read per reduction step
  std::chrono::milliseconds timeout{60'000};                       //!< deadline of calls that take none

  //! Defaults overridden by `EBBFLOW_ALLREDUCE_ALGO` (automatic, ring,
  //! recursive_doubling, single_copy), `EBBFLOW_SMALL_BYTES`,
  //! `EBBFLOW_CHUNK_BYTES`, `EBBFLOW_COMM_WINDOW`, `EBBFLOW_COPY_CHUNK_BYTES`,
  //! `EBBFLOW_COMM_TIMEOUT_MS`.
  //! @throws std::invalid_argument for malformed values.
  static collective_options from_environment() {
    collective_options o;
    o.allreduce = env::get_choice("EBBFLOW_ALLREDUCE_ALGO", o.allreduce,
                                  {{"automatic", allreduce_algorithm::automatic},
                                   {"ring", allreduce_algorithm::ring},
                                   {"recursive_doubling", allreduce_algorithm::recursive_doubling},
                                   {"single_copy", allreduce_algorithm::single_copy}});
    o.small_bytes =
        static_cast<std::size_t>(env::get_int("EBBFLOW_SMALL_BYTES", static_cast<std::int64_t>(o.small_bytes), 0));
    o.chunk_bytes =
        static_cast<std::size_t>(env::get_int("EBBFLOW_CHUNK_BYTES", static_cast<std::int64_t>(o.chunk_bytes), 1));
    o.window = static_cast<int>(env::get_int("EBBFLOW_COMM_WINDOW", o.window, 1, 1024));
    o.copy_chunk_bytes = static_cast<std::size_t>(
        env::get_int("EBBFLOW_COPY_CHUNK_BYTES", static_cast<std::int64_t>(o.copy_chunk_bytes), 1));
    o.timeout = env::get_ms("EBBFLOW_COMM_TIMEOUT_MS", o.timeout, 1);
    return o;
  }
};

//! A non-blocking collective in flight. Move-only. Progresses when `test`
//! or `wait` is called on it or on any other request of the same
//! communicator (each call moves every collective in flight), so ranks may
//! complete their requests in different orders. Destroying a pending
//! request abandons it: its posted transfers are cancelled by the
//! transport, and the communicator's group must be considered broken (the
//! elastic layer moves to a new generation).
template <transport T>
class request {
 public:
  request() noexcept = default;
  //! Takes over `o`'s collective; `o` becomes empty (done).
  request(request&& o) noexcept;
  //! Abandons this request's pending collective (as destruction does), then takes over `o`'s.
  request& operator=(request&& o) noexcept;
  request(const request&) = delete;
  request& operator=(const request&) = delete;
  ~request();

  //! Progresses without blocking; true once the collective finished
  //! (successfully or not: then `ec` holds the error). Never throws
  //! except `std::bad_alloc`.
  bool test(std::error_code& ec);
  //! Blocks until finished or `d` passed (`errc::timeout`; the request
  //! stays pending and may be waited on again).
  void wait(deadline d, std::error_code& ec);
  //! Blocks until finished. @throws system_error naming rank, generation,
  //! peer, operation and sequence number.
  void wait(deadline d);
  //! True when finished (successfully or not) or empty.
  [[nodiscard]] bool done() const noexcept;
  //! Where the last error happened (peer = the rank whose transfer failed).
  [[nodiscard]] const error_context& context() const;

 private:
  template <transport>
  friend class transport_communicator;
  request(T& t, detail::task<T> task, detail::op_context ctx, std::shared_ptr<detail::active_set<T>> active);
  void finish(std::error_code ec, int peer, std::string_view why = {});
  void progress();
  void release() noexcept;

  T* t_ = nullptr;
  std::coroutine_handle<detail::promise<T>> h_{};
  std::error_code ec_{};
  bool finished_ = true;
  mutable error_context ctx_{};
  std::uint64_t seq_ = 0;
  std::size_t bytes_ = 0;
  bool describe_ = false;
  std::string why_;  // "; " + what the failed transfer said (sizes), or empty
  std::shared_ptr<detail::active_set<T>> active_;
};

//! Collectives over a transport: the host-memory `communicator`. Holds a
//! reference to the transport (which must outlive it) and the collective
//! sequence number that, together with the step of an algorithm, forms
//! every message tag. It is the only source of sequence numbers on its
//! transport: collectives written outside this class take theirs from
//! `next_sequence`.
template <transport T>
class transport_communicator {
 public:
  //! Communicates over `transport` (not owned; must outlive this). Sends nothing.
  //! @throws std::invalid_argument when `opts.chunk_bytes` or `opts.window` is not positive.
  explicit transport_communicator(T& transport, collective_options opts = {});

  //! This rank (0-based), as the transport reports it.
  [[nodiscard]] int rank() const { return static_cast<int>(t_->rank()); }
  //! Number of ranks in the group.
  [[nodiscard]] int size() const { return static_cast<int>(t_->size()); }
  //! Membership generation of the transport (named in error messages).
  [[nodiscard]] std::int64_t generation() const { return static_cast<std::int64_t>(t_->generation()); }
  //! The options given at construction.
  [[nodiscard]] const collective_options& options() const noexcept { return opts_; }
  //! The underlying transport.
  [[nodiscard]] T& transport() noexcept { return *t_; }
  //! A deadline `options().timeout` from now.
  [[nodiscard]] deadline default_deadline() const noexcept { return deadline::after(opts_.timeout); }

  //! The algorithm `allreduce` runs for `count` elements of `type` on this
  //! group (never `automatic`): recursive doubling at or below `small_bytes`,
  //! else single_copy when every peer is on this host, else ring (or what
  //! `options().allreduce` forces). The same on every rank. Does not communicate.
  //! @throws std::invalid_argument when single_copy is forced but not possible.
  [[nodiscard]] allreduce_algorithm allreduce_algorithm_for(std::size_t count, dtype type) const;
  //! Payload bytes this rank hands to the transport in an allreduce of
  //! `count` elements of `type` (single_copy: none, peers' buffers are read
  //! in place). Does not communicate.
  [[nodiscard]] std::size_t allreduce_bytes_sent(std::size_t count, dtype type) const;

  //! `out = op(in of every rank)`; `in` and `out` have the same count and
  //! dtype; `in.data == out.data` is in-place. @throws system_error, std::invalid_argument.
  void allreduce(buffer_view in, buffer_view out, reduce_op op, deadline d) { iallreduce(in, out, op).wait(d); }
  //! As above; errors in `ec` (a refused argument: `std::errc::invalid_argument`).
  void allreduce(buffer_view in, buffer_view out, reduce_op op, deadline d, std::error_code& ec) noexcept;
  //! As above with `default_deadline()`.
  void allreduce(buffer_view in, buffer_view out, reduce_op op) { allreduce(in, out, op, default_deadline()); }
  //! In-place allreduce of `inout` by deadline `d`.
  void allreduce(buffer_view inout, reduce_op op, deadline d) { allreduce(inout, inout, op, d); }
  //! In-place allreduce of `inout` by deadline `d`; errors in `ec`.
  void allreduce(buffer_view inout, reduce_op op, deadline d, std::error_code& ec) noexcept {
    allreduce(inout, inout, op, d, ec);
  }
  //! In-place allreduce of `inout` with `default_deadline()`.
  void allreduce(buffer_view inout, reduce_op op) { allreduce(inout, inout, op, default_deadline()); }
  //! Non-blocking allreduce; buffers stay in use until the request finished.
  [[nodiscard]] request<T> iallreduce(buffer_view in, buffer_view out, reduce_op op);

  //! Copies `root`'s `buf` into every rank's `buf`.
  void broadcast(buffer_view buf, int root, deadline d) { ibroadcast(buf, root).wait(d); }
  //! As above; errors in `ec`.
  void broadcast(buffer_view buf, int root, deadline d, std::error_code& ec) noexcept;
  //! As above with `default_deadline()`.
  void broadcast(buffer_view buf, int root) { broadcast(buf, root, default_deadline()); }
  //! Non-blocking broadcast; `buf` stays in use until the request finished.
  [[nodiscard]] request<T> ibroadcast(buffer_view buf, int root);

  //! `out` (count `in.count * size()`) receives every rank's `in` in rank order.
  void allgather(buffer_view in, buffer_view out, deadline d) { iallgather(in, out).wait(d); }
  //! As above; errors in `ec`.
  void allgather(buffer_view in, buffer_view out, deadline d, std::error_code& ec) noexcept;
  //! As above with `default_deadline()`.
  void allgather(buffer_view in, buffer_view out) { allgather(in, out, default_deadline()); }
  //! Non-blocking allgather; buffers stay in use until the request finished.
  [[nodiscard]] request<T> iallgather(buffer_view in, buffer_view out);

  //! `out` (count `in.count / size()`) receives block `rank()` of the reduction of every rank's `in`.
  void reduce_scatter(buffer_view in, buffer_view out, reduce_op op, deadline d) {
    ireduce_scatter(in, out, op).wait(d);
  }
  //! As above; errors in `ec`.
  void reduce_scatter(buffer_view in, buffer_view out, reduce_op op, deadline d, std::error_code& ec) noexcept;
  //! As above with `default_deadline()`.
  void reduce_scatter(buffer_view in, buffer_view out, reduce_op op) {
    reduce_scatter(in, out, op, default_deadline());
  }
  //! Non-blocking reduce_scatter; buffers stay in use until the request finished.
  [[nodiscard]] request<T> ireduce_scatter(buffer_view in, buffer_view out, reduce_op op);

  //! Returns once every rank entered the barrier.
  void barrier(deadline d) { ibarrier().wait(d); }
  //! As above; errors in `ec`.
  void barrier(deadline d, std::error_code& ec) noexcept;
  //! As above with `default_deadline()`.
  void barrier() { barrier(default_deadline()); }
  //! Non-blocking barrier: finished once every rank entered it.
  [[nodiscard]] request<T> ibarrier();

  //! Point-to-point: matched by (peer, `tag` < 2^24) in posting order; sizes must agree.
  //! Blocking send of `buf` to `peer`. @throws system_error, std::invalid_argument.
  void send(buffer_view buf, int peer, std::uint32_t tag, deadline d) { isend(buf, peer, tag).wait(d); }
  //! As above; errors in `ec`.
  void send(buffer_view buf, int peer, std::uint32_t tag, deadline d, std::error_code& ec) noexcept;
  //! Blocking receive into `buf` from `peer`. @throws system_error, std::invalid_argument.
  void recv(buffer_view buf, int peer, std::uint32_t tag, deadline d) { irecv(buf, peer, tag).wait(d); }
  //! As above; errors in `ec`.
  void recv(buffer_view buf, int peer, std::uint32_t tag, deadline d, std::error_code& ec) noexcept;
  //! Non-blocking send; `buf` stays in use until the request finished.
  [[nodiscard]] request<T> isend(buffer_view buf, int peer, std::uint32_t tag);
  //! Non-blocking receive; `buf` stays in use until the request finished.
  [[nodiscard]] request<T> irecv(buffer_view buf, int peer, std::uint32_t tag);

  //! The sequence number of one collective written outside this class over
  //! `transport()` (e.g. compress's codec-specific algorithms): its step s
  //! uses the tag `make_tag(seq, s)`, s at most `max_collective_step`. Taken
  //! from the counter of this communicator's own collectives, so every rank
  //! that calls collectives in the same order gets the same number, and no
  //! collective in flight shares it.
  [[nodiscard]] std::uint64_t next_sequence() noexcept { return seq_++ & seq_mask; }

 private:
  detail::op_context ctx(const char* op, std::uint64_t seq, std::size_t bytes) const;
  bool all_peers_local() const;
  request<T> make_request(detail::task<T> tk, detail::op_context c);
  request<T> point_to_point(bool is_send, buffer_view buf, int peer, std::uint32_t tag);
  T* t_;
  collective_options opts_;
  std::uint64_t seq_ = 0;
  std::shared_ptr<detail::scratch_pool> pool_;
  std::shared_ptr<detail::active_set<T>> active_;
};

//! The former name of `transport_communicator`, kept for one release.
//! @deprecated Use `transport_communicator`.
template <transport T>
using basic_communicator = transport_communicator<T>;

//! What a communicator offers, for host memory (`transport_communicator`)
//! and device memory (`nccl_communicator`) alike: the same calls on
//! `buffer_view`s, each blocking form also as a `noexcept` twin reporting in
//! an `std::error_code`. Syntactic; semantics as documented above.
template <class C>
concept communicator = requires(C& c, buffer_view v, reduce_op op, int root, deadline d, std::error_code& ec) {
  { c.rank() } -> std::convertible_to<int>;
  { c.size() } -> std::convertible_to<int>;
  { c.generation() } -> std::convertible_to<std::int64_t>;
  c.allreduce(v, v, op, d);
  c.allreduce(v, v, op, d, ec);
  c.broadcast(v, root, d);
  c.broadcast(v, root, d, ec);
  c.allgather(v, v, d);
  c.allgather(v, v, d, ec);
  c.reduce_scatter(v, v, op, d);
  c.reduce_scatter(v, v, op, d, ec);
  c.barrier(d);
  c.barrier(d, ec);
};

}  // namespace comm
EBBFLOW_END_NAMESPACE

// #include <ebbflow/comm/impl/communicator.hpp>  (inlined here)
// ---- begin <ebbflow/comm/impl/communicator.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file impl/communicator.hpp
//! Definitions for comm/communicator.hpp. Each collective is a C++20
//! coroutine over the transport: it posts transfers and `co_await`s one
//! transport request at a time; `request::test` / `request::wait` drive it.
//! Writing the algorithms as straight-line code keeps them readable while the
//! same code serves the blocking and the non-blocking forms.


// #include <ebbflow/comm/communicator.hpp>  (inlined)
// #include <ebbflow/comm/detail/argument_checks.hpp>  (inlined here)
// ---- begin <ebbflow/comm/detail/argument_checks.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file comm/detail/argument_checks.hpp
//! The argument checks every collective makes before it starts (memory
//! space, overlap, sizes, root), and the body of the `std::error_code&`
//! twins.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/error.hpp>  (inlined)
// #include <ebbflow/core/memory.hpp>  (inlined)

#include <cstddef>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <system_error>

EBBFLOW_BEGIN_NAMESPACE
namespace comm::detail {

//! Refuses `op`'s buffer `role` ("input", ...) when it is in the wrong
//! memory space (host-accessible memory, or with `device` device memory), or
//! null with elements.
inline void check_buffer(const buffer_view& v, const char* op, const char* role, bool device = false) {
  if (device)
    EBBFLOW_ENFORCE(v.space == memory_space::device,
                    op << " " << role << " must be device memory, got " << name(v.space));
  else
    EBBFLOW_ENFORCE(host_accessible(v.space), op << " " << role << " must be host memory, got " << name(v.space));
  EBBFLOW_ENFORCE(v.count == 0 || v.data != nullptr, op << " " << role << " is null with count " << v.count);
}

//! Input and output must not overlap, except with the input at `in_place`
//! (the documented in-place form): a partial overlap would be read after it
//! was overwritten.
inline void check_overlap(const buffer_view& in, const buffer_view& out, const std::byte* in_place, const char* what) {
  const auto i0 = reinterpret_cast<std::uintptr_t>(in.data), o0 = reinterpret_cast<std::uintptr_t>(out.data);
  const bool disjoint = in.bytes() == 0 || out.bytes() == 0 || i0 + in.bytes() <= o0 || o0 + out.bytes() <= i0;
  EBBFLOW_ENFORCE(disjoint || in.data == in_place, what << ": input [" << in.data << ", +" << in.bytes()
                                                        << " bytes) overlaps output [" << out.data << ", +"
                                                        << out.bytes() << " bytes) other than in place (input at "
                                                        << static_cast<const void*>(in_place) << ")");
}

// What every communicator checks before a collective of `n` ranks starts
// (`device`: its buffers are device memory). @throws std::invalid_argument.
inline void check_allreduce(const buffer_view& in, const buffer_view& out, bool device = false) {
  check_buffer(in, "allreduce", "input", device);
  check_buffer(out, "allreduce", "output", device);
  EBBFLOW_ENFORCE(in.count == out.count && in.type == out.type,
                  "allreduce: input (" << in.count << " " << name(in.type) << ") and output (" << out.count << " "
                                       << name(out.type) << ") differ");
  check_overlap(in, out, static_cast<const std::byte*>(out.data), "allreduce");
}
inline void check_broadcast(const buffer_view& buf, int root, int n, bool device = false) {
  check_buffer(buf, "broadcast", "buffer", device);
  EBBFLOW_ENFORCE(root >= 0 && root < n, "broadcast root " << root << " outside [0, " << n << ")");
}
// allgather (`gather`: out holds n x in) and reduce_scatter (in holds n x out).
inline void check_parts(const char* op, const buffer_view& in, const buffer_view& out, int n, bool gather,
                        const std::byte* in_place, bool device) {
  check_buffer(in, op, "input", device);
  check_buffer(out, op, "output", device);
  const auto un = static_cast<std::size_t>(n);
  const buffer_view &whole = gather ? out : in, &part = gather ? in : out;
  EBBFLOW_ENFORCE(in.type == out.type && whole.count == part.count * un,
                  op << ": " << (gather ? "output" : "input") << " count " << whole.count << " must be " << un << " x "
                     << (gather ? "input" : "output") << " count " << part.count << " of the same dtype");
  check_overlap(in, out, in_place, op);
}
inline void check_allgather(const buffer_view& in, const buffer_view& out, int n, int rank, bool device = false) {
  check_parts("allgather", in, out, n, true,
              static_cast<const std::byte*>(out.data) + static_cast<std::size_t>(rank) * in.bytes(), device);
}
inline void check_reduce_scatter(const buffer_view& in, const buffer_view& out, int n, bool device = false) {
  // One rank: the output may be the input (a copy to itself).
  check_parts("reduce_scatter", in, out, n, false, n == 1 ? static_cast<const std::byte*>(out.data) : nullptr, device);
}

//! The body of an `std::error_code&` twin: runs `f` (the throwing form) and
//! reports what it throws in `ec` instead: a run-time failure with its code,
//! a refused argument as `std::errc::invalid_argument`, exhausted memory as
//! `std::errc::not_enough_memory`.
template <class F>
void into_error_code(std::error_code& ec, F&& f) noexcept {
  ec.clear();
  try {
    std::forward<F>(f)();
  } catch (const std::system_error& e) {
    ec = e.code();
  } catch (const std::invalid_argument&) {
    ec = std::make_error_code(std::errc::invalid_argument);
  } catch (const std::bad_alloc&) {
    ec = std::make_error_code(std::errc::not_enough_memory);
  } catch (...) {
    ec = make_error_code(error::invalid_state);
  }
}

}  // namespace comm::detail
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/comm/detail/argument_checks.hpp>
// #include <ebbflow/comm/detail/collective_algorithms.hpp>  (inlined here)
// ---- begin <ebbflow/comm/detail/collective_algorithms.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file comm/detail/collective_algorithms.hpp
//! The collectives over any `comm::transport`, each a coroutine of
//! comm/detail/collective_task.hpp: ring and recursive-doubling allreduce,
//! binomial-tree and chain broadcast, ring allgather, barrier, point to
//! point. comm/impl/communicator.hpp picks one per call.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/comm/detail/collective_task.hpp>  (inlined)
// #include <ebbflow/comm/reduce.hpp>  (inlined)
// #include <ebbflow/comm/transport.hpp>  (inlined)
// #include <ebbflow/core/dtype.hpp>  (inlined)

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace comm::detail {

//! Ring reduce-scatter (+ allgather when `gather`). Segment s holds elements
//! [count*s/n, count*(s+1)/n); each is cut into `chunks` pieces that travel
//! independently, so the reduction of piece j overlaps the transfer of j+1.
//! Rank r ends the reduce-scatter owning segment r (written to `final_dst`).
template <transport T>
task<T> ring_allreduce(T& t, std::uint64_t seq, const std::byte* in, std::byte* work, std::byte* final_dst,
                       std::size_t count, dtype ty, reduce_op op, std::size_t chunk_bytes, int window, bool gather,
                       std::shared_ptr<scratch_pool> pool, scratch_pool::lease keep_alive = {}) {
  using req_t = typename T::request;
  const int n = static_cast<int>(t.size()), r = static_cast<int>(t.rank());
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  const std::size_t es = size_of(ty);
  const std::size_t nn = static_cast<std::size_t>(n);
  const std::size_t maxseg = (count + nn - 1) / nn;
  const std::size_t chunk_elems = std::max<std::size_t>(1, chunk_bytes / es);
  const std::size_t chunks = std::max<std::size_t>(1, (maxseg + chunk_elems - 1) / chunk_elems);
  const std::size_t slot_bytes = std::max<std::size_t>(1, (maxseg + chunks - 1) / chunks) * es;
  const std::size_t items = (nn - 1) * chunks;
  const std::size_t w = std::min<std::size_t>(static_cast<std::size_t>(std::max(window, 1)), items);
  auto seg_begin = [&](int s) { return segment_of(count, n, s).first; };
  auto chunk = [&](long long s_raw, std::size_t j) {
    const int s = mod(s_raw, n);
    const std::size_t b = seg_begin(s), len = seg_begin(s + 1) - b;
    return std::pair{b + len * j / chunks, b + len * (j + 1) / chunks};
  };
  auto lease = scratch_pool::take(pool, w * slot_bytes);
  auto slot = [&](std::size_t k) { return lease.data() + (k % w) * slot_bytes; };

  std::vector<req_t> sends, recvs;
  sends.reserve(items + chunks);
  recvs.reserve(items);
  // Reduce-scatter. Step s: send segment r-s-1, receive segment r-s-2 and reduce it.
  for (std::size_t j = 0; j < chunks; ++j) {
    auto [b, e] = chunk(r - 1, j);
    sends.push_back(t.isend(right, make_tag(seq, 0), cbytes(in + b * es, (e - b) * es)));
  }
  auto post = [&](std::size_t k) {
    const auto s = static_cast<long long>(k / chunks);
    auto [b, e] = chunk(r - s - 2, k % chunks);
    recvs.push_back(t.irecv(left, make_tag(seq, static_cast<std::uint32_t>(s)), mbytes(slot(k), (e - b) * es)));
  };
  for (std::size_t k = 0; k < w; ++k) post(k);
  const std::size_t own_begin = seg_begin(r);
  for (std::size_t k = 0; k < items; ++k) {
    co_await awaiting<T>{t, recvs[k], left};
    const auto s = static_cast<long long>(k / chunks);
    auto [b, e] = chunk(r - s - 2, k % chunks);
    const bool last = s == n - 2;
    std::byte* dst = last ? final_dst + (b - own_begin) * es : work + b * es;
    reduce(ty, op, dst, in + b * es, slot(k), e - b);
    if (last) {
      if (op == reduce_op::avg) finish_avg(ty, dst, e - b, n);
    } else {
      sends.push_back(t.isend(right, make_tag(seq, static_cast<std::uint32_t>(s + 1)), cbytes(dst, (e - b) * es)));
    }
    if (k + w < items) post(k + w);
  }
  // All reduce-scatter sends must be done before the allgather overwrites
  // segments they may still read (in-place: segment r-1 was sent from `in`).
  for (auto& q : sends) co_await awaiting<T>{t, q, right};
  if (!gather) co_return;
  (void)keep_alive;

  sends.clear();
  recvs.clear();
  const auto ag = static_cast<std::uint32_t>(n);  // allgather steps follow the reduce-scatter's
  for (std::size_t k = 0; k < items; ++k) {
    const auto s = static_cast<long long>(k / chunks);
    auto [b, e] = chunk(r - s - 1, k % chunks);
    recvs.push_back(
        t.irecv(left, make_tag(seq, ag + static_cast<std::uint32_t>(s)), mbytes(work + b * es, (e - b) * es)));
  }
  for (std::size_t j = 0; j < chunks; ++j) {
    auto [b, e] = chunk(r, j);
    sends.push_back(t.isend(right, make_tag(seq, ag), cbytes(work + b * es, (e - b) * es)));
  }
  for (std::size_t k = 0; k < items; ++k) {
    co_await awaiting<T>{t, recvs[k], left};
    const auto s = static_cast<long long>(k / chunks);
    if (s < n - 2) {
      auto [b, e] = chunk(r - s - 1, k % chunks);
      sends.push_back(
          t.isend(right, make_tag(seq, ag + static_cast<std::uint32_t>(s + 1)), cbytes(work + b * es, (e - b) * es)));
    }
  }
  for (auto& q : sends) co_await awaiting<T>{t, q, right};
}

//! Recursive doubling; ranks beyond the largest power of two p first fold
//! into a partner (MPICH), which hands the result back at the end.
template <transport T>
task<T> rd_allreduce(T& t, std::uint64_t seq, const std::byte* in, std::byte* out, std::size_t count, dtype ty,
                     reduce_op op, std::shared_ptr<scratch_pool> pool) {
  const int n = static_cast<int>(t.size()), r = static_cast<int>(t.rank());
  const std::size_t bytes = count * size_of(ty);
  if (out != in) std::memcpy(out, in, bytes);
  auto lease = scratch_pool::take(pool, bytes);
  std::byte* tmp = lease.data();
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int rem = n - p;
  constexpr std::uint32_t final_step = 0xff00;
  int vr = -1;
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      auto s = t.isend(r + 1, make_tag(seq, 0), cbytes(out, bytes));
      co_await awaiting<T>{t, s, r + 1};
    } else {
      auto q = t.irecv(r - 1, make_tag(seq, 0), mbytes(tmp, bytes));
      co_await awaiting<T>{t, q, r - 1};
      reduce(ty, op, out, out, tmp, count);
      vr = r / 2;
    }
  } else {
    vr = r - rem;
  }
  if (vr >= 0) {
    std::uint32_t step = 1;
    for (int mask = 1; mask < p; mask <<= 1, ++step) {
      const int vp = vr ^ mask;
      const int peer = vp < rem ? vp * 2 + 1 : vp + rem;
      auto q = t.irecv(peer, make_tag(seq, step), mbytes(tmp, bytes));
      auto s = t.isend(peer, make_tag(seq, step), cbytes(out, bytes));
      co_await awaiting<T>{t, q, peer};
      co_await awaiting<T>{t, s, peer};
      reduce(ty, op, out, out, tmp, count);
    }
    if (op == reduce_op::avg) finish_avg(ty, out, count, n);
  }
  if (r < 2 * rem) {
    if (r % 2 == 1) {
      auto s = t.isend(r - 1, make_tag(seq, final_step), cbytes(out, bytes));
      co_await awaiting<T>{t, s, r - 1};
    } else {
      auto q = t.irecv(r + 1, make_tag(seq, final_step), mbytes(out, bytes));
      co_await awaiting<T>{t, q, r + 1};
    }
  }
}

//! Binomial tree (small) or a chunk-pipelined chain root -> root+1 -> ... (large).
template <transport T>
task<T> broadcast(T& t, std::uint64_t seq, std::byte* buf, std::size_t bytes, int root, bool chain,
                  std::size_t chunk_bytes) {
  using req_t = typename T::request;
  const int n = static_cast<int>(t.size()), r = static_cast<int>(t.rank());
  const int vr = mod(r - root, n);
  std::vector<req_t> sends;
  if (!chain) {
    int mask = 1;
    while (mask < n) {
      if (vr & mask) {
        const int src = mod(vr - mask + root, n);
        auto q = t.irecv(src, make_tag(seq, 0), mbytes(buf, bytes));
        co_await awaiting<T>{t, q, src};
        break;
      }
      mask <<= 1;
    }
    mask >>= 1;
    std::vector<int> peers;
    while (mask > 0) {
      if (vr + mask < n) {
        peers.push_back(mod(vr + mask + root, n));
        sends.push_back(t.isend(peers.back(), make_tag(seq, 0), cbytes(buf, bytes)));
      }
      mask >>= 1;
    }
    for (std::size_t i = 0; i < sends.size(); ++i) co_await awaiting<T>{t, sends[i], peers[i]};
    co_return;
  }
  const std::size_t chunks = n == 2 ? 1 : std::max<std::size_t>(1, (bytes + chunk_bytes - 1) / chunk_bytes);
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  auto piece = [&](std::size_t j) { return std::pair{bytes * j / chunks, bytes * (j + 1) / chunks}; };
  sends.reserve(chunks);
  if (vr == 0) {
    for (std::size_t j = 0; j < chunks; ++j) {
      auto [b, e] = piece(j);
      sends.push_back(t.isend(next, make_tag(seq, 1), cbytes(buf + b, e - b)));
    }
  } else {
    std::vector<req_t> recvs;
    recvs.reserve(chunks);
    for (std::size_t j = 0; j < chunks; ++j) {
      auto [b, e] = piece(j);
      recvs.push_back(t.irecv(prev, make_tag(seq, 1), mbytes(buf + b, e - b)));
    }
    for (std::size_t j = 0; j < chunks; ++j) {
      co_await awaiting<T>{t, recvs[j], prev};
      if (vr < n - 1) {
        auto [b, e] = piece(j);
        sends.push_back(t.isend(next, make_tag(seq, 1), cbytes(buf + b, e - b)));
      }
    }
  }
  for (auto& q : sends) co_await awaiting<T>{t, q, next};
}

//! Ring allgather of equal blocks of `bb` bytes.
template <transport T>
task<T> allgather(T& t, std::uint64_t seq, const std::byte* in, std::byte* out, std::size_t bb) {
  using req_t = typename T::request;
  const int n = static_cast<int>(t.size()), r = static_cast<int>(t.rank());
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  auto block = [&](long long i) { return out + static_cast<std::size_t>(mod(i, n)) * bb; };
  if (block(r) != in && bb) std::memcpy(block(r), in, bb);
  std::vector<req_t> recvs, sends;
  recvs.reserve(static_cast<std::size_t>(n));
  sends.reserve(static_cast<std::size_t>(n));
  for (int s = 0; s < n - 1; ++s)
    recvs.push_back(t.irecv(left, make_tag(seq, static_cast<std::uint32_t>(s)), mbytes(block(r - s - 1), bb)));
  sends.push_back(t.isend(right, make_tag(seq, 0), cbytes(block(r), bb)));
  for (int s = 0; s < n - 1; ++s) {
    co_await awaiting<T>{t, recvs[static_cast<std::size_t>(s)], left};
    if (s < n - 2)
      sends.push_back(t.isend(right, make_tag(seq, static_cast<std::uint32_t>(s + 1)), cbytes(block(r - s - 1), bb)));
  }
  for (auto& q : sends) co_await awaiting<T>{t, q, right};
}

//! Dissemination barrier: ceil(log2 n) rounds of empty messages.
template <transport T>
task<T> barrier(T& t, std::uint64_t seq) {
  const int n = static_cast<int>(t.size()), r = static_cast<int>(t.rank());
  std::uint32_t step = 0;
  for (int d = 1; d < n; d <<= 1, ++step) {
    const int to = mod(r + d, n), from = mod(r - d, n);
    auto q = t.irecv(from, make_tag(seq, step), {});
    auto s = t.isend(to, make_tag(seq, step), {});
    co_await awaiting<T>{t, q, from};
    co_await awaiting<T>{t, s, to};
  }
}

template <transport T>
task<T> p2p(T& t, bool is_send, std::byte* buf, std::size_t bytes, int peer, tag_t tag) {
  auto q = is_send ? t.isend(peer, tag, cbytes(buf, bytes)) : t.irecv(peer, tag, mbytes(buf, bytes));
  co_await awaiting<T>{t, q, peer};
}

template <transport T>
task<T> copy_only(const std::byte* in, std::byte* out, std::size_t bytes) {
  if (in != out && bytes) std::memmove(out, in, bytes);
  co_return;
}

}  // namespace comm::detail
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/comm/detail/collective_algorithms.hpp>
// #include <ebbflow/comm/detail/collective_task.hpp>  (inlined)
// #include <ebbflow/comm/detail/single_copy.hpp>  (inlined here)
// ---- begin <ebbflow/comm/detail/single_copy.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file comm/detail/single_copy.hpp
//! The single-copy allreduce (all ranks on one host: each reads its peers'
//! buffers directly, Linux CMA `process_vm_readv`) and how a failed read or
//! a lost peer is attributed to the peer that went away.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/comm/detail/collective_task.hpp>  (inlined)
// #include <ebbflow/comm/reduce.hpp>  (inlined)
// #include <ebbflow/comm/shared_memory.hpp>  (inlined here)
// ---- begin <ebbflow/comm/shared_memory.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file shared_memory.hpp
//! Host buffers that processes on the same host can map: allocate the
//! buffers you pass to collectives here and an intra-host allreduce reads
//! and writes peers' memory directly, with no copy through the kernel.
//!
//! Why: without it, ranks on one host read each other's buffers with Linux
//! CMA (`process_vm_readv`), as Open MPI's vader does. CMA copies through
//! the kernel and pins pages on every call, so the allreduce of a buffer
//! costs one extra pass over memory and the pinning. A `shared_buffer` is a
//! `memfd` mapped `MAP_SHARED`; a peer maps it once (through
//! `/proc/<pid>/fd/<fd>`, the same permission check as CMA) and then reduces
//! straight out of it. This is the host-memory counterpart of NCCL's user
//! buffer registration (`ncclMemAlloc` + `ncclCommRegister`) and of
//! `MPI_Win_allocate_shared`.
//!
//! Use:
//! @code
//! auto grads = ebbflow::comm::shared_buffer::allocate(n * sizeof(float));
//! std::span<float> g = grads.as<float>();  // fill it, then
//! comm.allreduce(ebbflow::buffer_view{g.data(), g.size(), ebbflow::dtype::f32}, ebbflow::reduce_op::sum);
//! @endcode
//!
//! Collectives find out by themselves: every `shared_buffer` is entered in a
//! process-wide registry, and the single-copy allreduce looks its input and
//! output up there (any sub-range of a buffer counts). Peers whose buffers
//! are registered and mappable are read directly; any other peer, as before,
//! through CMA. Nothing else changes: the same phases, deadlines and
//! peer-failure detection, and the same bitwise result. A peer that dies
//! cannot fault a reader: the reader's mapping keeps the memory alive.
//!
//! Cost: mapping a peer's buffer is a syscall pair on its first use; mappings
//! are cached per (peer process, buffer) and released when the cache holds
//! more than `peer_mapping_cache` of them (least recently used first) or the
//! process exits. Keep gradient buffers for the whole run, as with NCCL.
//!
//! Thread safety: allocation, destruction and lookups may run on any thread.
//! Errors: `allocate` throws `ebbflow::system_error` with the errno of the
//! failing call (memfd_create, ftruncate or mmap) and the size.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/error.hpp>  (inlined)

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

EBBFLOW_BEGIN_NAMESPACE
namespace comm {

//! How many peer mappings a process keeps before unmapping the least
//! recently used one.
inline constexpr std::size_t peer_mapping_cache = 64;

//! Page-aligned host memory in a `memfd`, mappable by peers on this host.
//! Move-only RAII: the destructor unregisters and unmaps it. Zero-filled.
class shared_buffer {
 public:
  //! An empty buffer (no memory).
  shared_buffer() noexcept = default;
  //! Allocates `bytes` (rounded up to whole pages; 0 gives an empty buffer).
  //! @throws ebbflow::system_error (errno of memfd_create/ftruncate/mmap, naming the size).
  [[nodiscard]] static shared_buffer allocate(std::size_t bytes);
  //! Takes over the source, which becomes empty.
  shared_buffer(shared_buffer&& o) noexcept;
  //! Releases this buffer's memory and takes over the source's.
  shared_buffer& operator=(shared_buffer&& o) noexcept;
  shared_buffer(const shared_buffer&) = delete;
  shared_buffer& operator=(const shared_buffer&) = delete;
  ~shared_buffer();

  //! Start of the memory (null when empty).
  [[nodiscard]] void* data() const noexcept { return data_; }
  //! Bytes usable (as requested).
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  //! The memory as `size() / sizeof(T)` elements of T.
  template <class T>
  [[nodiscard]] std::span<T> as() const noexcept {
    return {static_cast<T*>(data_), size_ / sizeof(T)};
  }
  //! True when the buffer holds memory.
  explicit operator bool() const noexcept { return data_ != nullptr; }

 private:
  void reset() noexcept;
  void* data_ = nullptr;
  std::size_t size_ = 0, mapped_ = 0;
  int fd_ = -1;
};

namespace detail {
//! Where a registered range lives, as a peer needs it to map it.
struct shared_ref {
  std::int32_t fd = -1;        //!< the owner's memfd (-1: not registered)
  std::uint32_t reserved = 0;  //!< zero (no padding: the record travels as bytes)
  std::uint64_t id = 0;        //!< unique per buffer and process (fd numbers are reused)
  std::uint64_t offset = 0;    //!< of the range within the buffer
  std::uint64_t size = 0;      //!< of the whole buffer (mapped length)
};
//! The registration of [p, p + bytes), if one `shared_buffer` holds all of it.
[[nodiscard]] inline shared_ref find_shared(const void* p, std::size_t bytes) noexcept;
//! One peer buffer mapped into this process (defined in impl/).
struct peer_mapping;
//! A read-write pointer to `bytes` at `ref.offset` in process `pid`'s buffer
//! `ref`, mapped on first use and cached; null when it cannot be mapped (no
//! permission, the buffer is gone, a size mismatch). The mapping stays valid
//! while the returned handle lives.
class peer_view {
 public:
  peer_view() = default;
  //! The mapped range (null when not mapped).
  [[nodiscard]] std::byte* data() const noexcept { return data_; }
  //! True when mapped.
  explicit operator bool() const noexcept { return data_ != nullptr; }

 private:
  friend peer_view map_peer(long pid, const shared_ref& ref, std::size_t bytes) noexcept;
  std::shared_ptr<peer_mapping> keep_;
  std::byte* data_ = nullptr;
};
[[nodiscard]] inline peer_view map_peer(long pid, const shared_ref& ref, std::size_t bytes) noexcept;
}  // namespace detail

}  // namespace comm
EBBFLOW_END_NAMESPACE

// #include <ebbflow/comm/impl/shared_memory.hpp>  (inlined here)
// ---- begin <ebbflow/comm/impl/shared_memory.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file impl/shared_memory.hpp
//! Definitions for comm/shared_memory.hpp: the memfd allocation, the
//! process-wide registry of shared buffers and the cache of peers' mappings.


// #include <ebbflow/comm/shared_memory.hpp>  (inlined)

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <list>
#include <map>
#include <mutex>
#include <random>
#include <limits>
#include <string>
#include <utility>

EBBFLOW_BEGIN_NAMESPACE
namespace comm {
namespace detail {

//! Registered buffers of this process, by start address.
class shared_registry {
 public:
  static shared_registry& instance() {
    static shared_registry r;
    return r;
  }
  void add(const void* p, std::size_t bytes, std::size_t mapped, int fd, std::uint64_t id) {
    std::lock_guard lk(mu_);
    by_addr_[reinterpret_cast<std::uintptr_t>(p)] = entry{bytes, mapped, fd, id};
  }
  void remove(const void* p) noexcept {
    std::lock_guard lk(mu_);
    by_addr_.erase(reinterpret_cast<std::uintptr_t>(p));
  }
  shared_ref find(const void* p, std::size_t bytes) const noexcept {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard lk(mu_);
    auto it = by_addr_.upper_bound(a);
    if (it == by_addr_.begin()) return {};
    --it;
    const std::uintptr_t off = a - it->first;
    if (off > it->second.bytes || bytes > it->second.bytes - off) return {};
    return shared_ref{it->second.fd, 0, it->second.id, off, it->second.mapped};
  }
  //! A process-unique, never reused buffer id (random start: ids of two
  //! processes never need to differ, but a restarted process's should).
  std::uint64_t next_id() noexcept { return base_ + counter_.fetch_add(1, std::memory_order_relaxed); }

 private:
  shared_registry() : base_(std::random_device{}() | (std::uint64_t{std::random_device{}()} << 32)) {}
  struct entry {
    std::size_t bytes, mapped;
    int fd;
    std::uint64_t id;
  };
  mutable std::mutex mu_;
  std::map<std::uintptr_t, entry> by_addr_;
  std::uint64_t base_;
  std::atomic<std::uint64_t> counter_{1};
};

inline shared_ref find_shared(const void* p, std::size_t bytes) noexcept {
  if (p == nullptr) return {};
  return shared_registry::instance().find(p, bytes);
}

//! One peer buffer mapped here; unmapped when the last holder lets go.
struct peer_mapping {
  void* base = MAP_FAILED;
  std::size_t len = 0;
  ~peer_mapping() {
    if (base != MAP_FAILED) ::munmap(base, len);
  }
};

//! Peers' mappings by (pid, buffer id), least recently used last.
class peer_mappings {
 public:
  static peer_mappings& instance() {
    static peer_mappings m;
    return m;
  }
  std::shared_ptr<peer_mapping> get(long pid, const shared_ref& ref) noexcept {
    const key k{pid, ref.id};
    std::lock_guard lk(mu_);
    if (auto it = index_.find(k); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
    auto m = open(pid, ref);
    if (!m) return nullptr;
    lru_.emplace_front(k, m);
    index_[k] = lru_.begin();
    while (lru_.size() > peer_mapping_cache) {  // holders keep evicted mappings alive
      index_.erase(lru_.back().first);
      lru_.pop_back();
    }
    return m;
  }

 private:
  using key = std::pair<long, std::uint64_t>;
  static std::shared_ptr<peer_mapping> open(long pid, const shared_ref& ref) noexcept {
    const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(ref.fd);
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return nullptr;
    struct stat st {};
    // The fd number may have been reused for another file since the peer
    // sent it: insist on a memfd-sized regular file of the advertised size.
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<std::uint64_t>(st.st_size) != ref.size) {
      ::close(fd);
      return nullptr;
    }
    auto m = std::make_shared<peer_mapping>();
    m->len = static_cast<std::size_t>(ref.size);
    m->base = ::mmap(nullptr, m->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (m->base == MAP_FAILED) return nullptr;
    return m;
  }
  std::mutex mu_;
  std::list<std::pair<key, std::shared_ptr<peer_mapping>>> lru_;
  std::map<key, decltype(lru_)::iterator> index_;
};

inline peer_view map_peer(long pid, const shared_ref& ref, std::size_t bytes) noexcept {
  peer_view v;
  if (ref.fd < 0 || ref.offset > ref.size || bytes > ref.size - ref.offset) return v;
  auto m = peer_mappings::instance().get(pid, ref);
  if (!m) return v;
  v.data_ = static_cast<std::byte*>(m->base) + ref.offset;
  v.keep_ = std::move(m);
  return v;
}
}  // namespace detail

inline shared_buffer shared_buffer::allocate(std::size_t bytes) {
  shared_buffer b;
  if (bytes == 0) return b;
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  if (bytes > static_cast<std::size_t>(std::numeric_limits<off_t>::max()) - page)
    EBBFLOW_THROW((system_error(
        std::make_error_code(std::errc::value_too_large),
        {-1, -1, -1, "shared_buffer::allocate", std::to_string(bytes) + " bytes: larger than a file can be"})));
  const std::size_t mapped = (bytes + page - 1) / page * page;
  auto fail = [&](const char* call) {
    const int err = errno;
    b.reset();
    EBBFLOW_THROW((system_error(std::error_code(err, std::system_category()),
                                {-1, -1, -1, "shared_buffer::allocate",
                                 std::string(call) + " failed for " + std::to_string(bytes) + " bytes"})));
  };
  b.fd_ = ::memfd_create("ebbflow-shared", MFD_CLOEXEC);
  if (b.fd_ < 0) fail("memfd_create");
  if (::ftruncate(b.fd_, static_cast<off_t>(mapped)) != 0) fail("ftruncate");
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, b.fd_, 0);
  if (p == MAP_FAILED) fail("mmap");
  b.data_ = p;
  b.size_ = bytes;
  b.mapped_ = mapped;
  detail::shared_registry::instance().add(p, bytes, mapped, b.fd_, detail::shared_registry::instance().next_id());
  return b;
}

inline shared_buffer::shared_buffer(shared_buffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      mapped_(std::exchange(o.mapped_, 0)),
      fd_(std::exchange(o.fd_, -1)) {}

inline shared_buffer& shared_buffer::operator=(shared_buffer&& o) noexcept {
  if (this != &o) {
    reset();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    mapped_ = std::exchange(o.mapped_, 0);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

inline shared_buffer::~shared_buffer() { reset(); }

inline void shared_buffer::reset() noexcept {
  if (data_) {
    detail::shared_registry::instance().remove(data_);
    ::munmap(data_, mapped_);
  }
  if (fd_ >= 0) ::close(fd_);
  data_ = nullptr;
  size_ = mapped_ = 0;
  fd_ = -1;
}

}  // namespace comm
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/comm/impl/shared_memory.hpp>
// ---- end <ebbflow/comm/shared_memory.hpp>
// #include <ebbflow/comm/transport.hpp>  (inlined)
// #include <ebbflow/core/dtype.hpp>  (inlined)
// #include <ebbflow/core/error.hpp>  (inlined)

#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <system_error>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace comm::detail {

//! Transports that know which peers share this host and allow
//! `process_vm_readv` on them (the UCX transport) offer `local_peer(q)`.
template <class T>
concept single_copy_transport = requires(const T& t, int q) {
  { t.local_peer(q) } -> std::convertible_to<long>;
};

//! The peer a transport that offers `int lost_peer() const` (UCX) knows
//! lost, or -1.
template <class T>
int lost_peer_of(const T& t) noexcept {
  if constexpr (requires {
                  { t.lost_peer() } -> std::convertible_to<int>;
                })
    return t.lost_peer();
  else
    return -1;
}
//! As `lost_peer_of`, but a transport that can probe its peers' processes
//! (`probe_peers()`, UCX) looks first, so a dead peer that no transfer
//! reported yet is found. Used where a failure must be explained (a
//! deadline passed, a peer's memory vanished).
template <class T>
int find_lost_peer(T& t) noexcept {
  if constexpr (requires { t.probe_peers(); }) (void)t.probe_peers();
  return lost_peer_of(t);
}

//! What a failed single-copy read of peer `q`'s memory (errno `err`) means.
//! ESRCH: `q`'s process is gone, `q` is lost. EFAULT: `q`'s buffer is gone,
//! which also happens when `q` left the collective after an error of its
//! own, caused by another peer that died: the peer lost is whichever one
//! whose process is gone (`find_lost_peer`), `q` only if it is. When no
//! process is gone, `q` gave up for another reason (its deadline): the
//! result is empty, and the caller waits for the transport to report a loss
//! or for its deadline. Any other errno is reported as it is.
template <class T>
std::error_code read_failure(T& t, int err, int q) noexcept {
  if constexpr (requires { t.mark_lost(q); }) {
    if (err == ESRCH) t.mark_lost(q);
    if (err == ESRCH || err == EFAULT)
      return find_lost_peer(t) >= 0 ? make_error_code(error::peer_lost) : std::error_code{};
  }
  if (err == ESRCH) return make_error_code(error::peer_lost);
  return {err, std::system_category()};
}

//! Reads `bytes` at `remote` in process `pid` into `dst` (Linux CMA, one
//! copy, no intermediate buffer). Returns 0 or errno.
inline int cma_read(long pid, std::uint64_t remote, std::byte* dst, std::size_t bytes) noexcept {
  while (bytes) {
    iovec l{dst, bytes}, r{reinterpret_cast<void*>(remote), bytes};
    const ssize_t got = ::process_vm_readv(static_cast<pid_t>(pid), &l, 1, &r, 1, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (got == 0) return EFAULT;
    dst += got;
    remote += static_cast<std::uint64_t>(got);
    bytes -= static_cast<std::size_t>(got);
  }
  return 0;
}

//! Single-copy allreduce for ranks on one host (the vader/CMA idea, as a
//! collective): ranks swap buffer addresses; each rank reduces its own
//! segment reading every peer's input directly (through a cache-sized
//! scratch chunk), then copies every peer's reduced segment straight from the
//! peer's output. Three rounds of empty messages order the phases (addresses
//! known / segments reduced / reads done); they travel over the transport,
//! so deadlines and peer-failure detection apply as everywhere else.
//! Memory traffic per rank is the minimum: (n-1)/n of the buffer read twice
//! from peers, one reduction pass, no staging copies, no rendezvous.
template <transport T>
task<T> cma_allreduce(T& t, std::uint64_t seq, const std::byte* in, std::byte* out, std::size_t count, dtype ty,
                      reduce_op op, std::size_t chunk_bytes, std::shared_ptr<scratch_pool> pool) {
  using req_t = typename T::request;
  const int n = static_cast<int>(t.size()), r = static_cast<int>(t.rank());
  const std::size_t es = size_of(ty), nn = static_cast<std::size_t>(n);
  struct addrs {
    std::uint64_t in, out, bytes;
    shared_ref in_shm, out_shm;  // registered `shared_buffer` ranges: peers map them instead of CMA
  };
  // Sent raw to the peers: no padding byte may carry this process's memory.
  static_assert(std::has_unique_object_representations_v<addrs>);
  const addrs mine{reinterpret_cast<std::uint64_t>(in), reinterpret_cast<std::uint64_t>(out), count * es,
                   find_shared(in, count * es), find_shared(out, count * es)};
  std::vector<addrs> theirs(nn);
  std::vector<peer_view> peer_in(nn), peer_out(nn);  // direct views of peers' registered buffers
  std::vector<req_t> sends, recvs;
  std::vector<int> peers;
  auto all_to_all = [&](std::uint32_t step, bool with_addrs) {
    sends.clear();
    recvs.clear();
    peers.clear();
    for (int i = 1; i < n; ++i) {
      const int q = (r + i) % n;
      peers.push_back(q);
      auto rb = with_addrs ? std::as_writable_bytes(std::span(&theirs[static_cast<std::size_t>(q)], 1))
                           : std::span<std::byte>{};
      recvs.push_back(t.irecv(q, make_tag(seq, step), rb));
      sends.push_back(t.isend(q, make_tag(seq, step),
                              with_addrs ? std::as_bytes(std::span(&mine, 1)) : std::span<const std::byte>{}));
    }
  };
  auto seg_begin = [&](int s) { return segment_of(count, n, s).first; };
  std::error_code failed;
  int failed_peer = -1;
  int left = -1;  // a live peer whose memory vanished: it left the collective (see read_failure)
  auto fail = [&](int err, int q) {
    failed = read_failure(t, err, q);
    failed_peer = q;
    if (!failed) left = q;
  };

  all_to_all(0, true);
  for (std::size_t i = 0; i < recvs.size(); ++i) co_await awaiting<T>{t, recvs[i], peers[i]};
  for (std::size_t i = 0; i < sends.size(); ++i) co_await awaiting<T>{t, sends[i], peers[i]};
  // Ranks that disagree on the size would read past a peer's buffer: refuse
  // (every rank sees the disagreement with at least one peer).
  std::string failed_detail;
  for (int q : peers) {
    if (const auto b = theirs[static_cast<std::size_t>(q)].bytes; b != mine.bytes) {
      failed = make_error_code(error::bad_message);
      failed_peer = q;
      failed_detail = "; peer " + std::to_string(q) + "'s is " + std::to_string(b) + " bytes";
    }
  }

  if (!failed) {
    // Peers whose buffers are registered are read in place; the others through CMA.
    for (int q : peers) {
      const auto u = static_cast<std::size_t>(q);
      peer_in[u] = map_peer(t.local_peer(q), theirs[u].in_shm, mine.bytes);
      peer_out[u] = map_peer(t.local_peer(q), theirs[u].out_shm, mine.bytes);
    }
  }
  if (!failed) {  // reduce my segment
    const std::size_t b = seg_begin(r), e = seg_begin(r + 1);
    const std::size_t chunk = std::max<std::size_t>(1, chunk_bytes / es);
    bool any_cma = false;
    for (int q : peers) any_cma |= !peer_in[static_cast<std::size_t>(q)];
    auto lease = scratch_pool::take(pool, any_cma ? std::min(chunk, std::max<std::size_t>(e - b, 1)) * es : 0);
    for (std::size_t off = b; off < e && !failed && left < 0; off += chunk) {
      const std::size_t len = std::min(chunk, e - off);
      const std::byte* acc = in + off * es;
      for (int i = 1; i < n; ++i) {
        const int q = (r + i) % n;
        const auto u = static_cast<std::size_t>(q);
        const std::byte* theirs_now = peer_in[u] ? peer_in[u].data() + off * es : lease.data();
        if (!peer_in[u]) {
          if (int err = cma_read(t.local_peer(q), theirs[u].in + off * es, lease.data(), len * es)) {
            fail(err, q);
            break;
          }
        }
        reduce(ty, op, out + off * es, acc, theirs_now, len);
        acc = out + off * es;
      }
      if (!failed && left < 0 && op == reduce_op::avg) finish_avg(ty, out + off * es, len, n);
    }
  }
  if (left >= 0) {
    // A live peer left the collective: something made it give up that this
    // rank has not seen yet. Wait, on a message nobody sends, until the
    // transport reports a lost peer or the deadline passes (timeout).
    auto never = t.irecv(left, make_tag(seq, 3), {});
    co_await awaiting<T>{t, never, left};
    failed = make_error_code(error::invalid_state);  // not reached: step 3 is never sent
    failed_peer = left;
  }
  if (!failed) {
    all_to_all(1, false);  // my segment is final; I no longer read your input
    for (std::size_t i = 0; i < recvs.size(); ++i) co_await awaiting<T>{t, recvs[i], peers[i]};
    for (int i = 1; i < n && !failed; ++i) {
      const int q = (r + i) % n;
      const auto u = static_cast<std::size_t>(q);
      const std::size_t b = seg_begin(q), e = seg_begin(q + 1);
      if (peer_out[u]) {
        if (e > b) std::memcpy(out + b * es, peer_out[u].data() + b * es, (e - b) * es);
      } else if (int err = cma_read(t.local_peer(q), theirs[u].out + b * es, out + b * es, (e - b) * es)) {
        fail(err, q);
        if (!failed) {
          auto never = t.irecv(q, make_tag(seq, 3), {});  // as above
          co_await awaiting<T>{t, never, q};
          failed = make_error_code(error::invalid_state);
        }
      }
    }
    for (std::size_t i = 0; i < sends.size() && !failed; ++i) co_await awaiting<T>{t, sends[i], peers[i]};
  }
  if (failed) {
    // Report through the promise: the driver finishes the request with it.
    struct set_failed {
      std::error_code ec;
      int peer;
      std::string* detail;
      bool await_ready() const noexcept { return false; }
      bool await_suspend(std::coroutine_handle<promise<T>> h) const noexcept {
        h.promise().failed = ec;
        h.promise().failed_peer = peer;
        h.promise().failed_detail.swap(*detail);
        return false;  // continue to co_return
      }
      void await_resume() const noexcept {}
    };
    co_await set_failed{failed, failed_peer, &failed_detail};
    co_return;
  }
  all_to_all(2, false);  // I finished reading your output: you may reuse it
  for (std::size_t i = 0; i < recvs.size(); ++i) co_await awaiting<T>{t, recvs[i], peers[i]};
  for (std::size_t i = 0; i < sends.size(); ++i) co_await awaiting<T>{t, sends[i], peers[i]};
}

}  // namespace comm::detail
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/comm/detail/single_copy.hpp>
// #include <ebbflow/comm/shared_memory.hpp>  (inlined)

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <new>
#include <stdexcept>
#include <type_traits>
#include <utility>

EBBFLOW_BEGIN_NAMESPACE

namespace comm {

// ------------------------------------------------------------------ request
template <transport T>
request<T>::request(T& t, detail::task<T> task, detail::op_context ctx, std::shared_ptr<detail::active_set<T>> active)
    : t_(&t),
      h_(task.h),
      finished_(false),
      ctx_(std::move(ctx.ctx)),
      seq_(ctx.seq),
      bytes_(ctx.bytes),
      describe_(ctx.describe),
      active_(std::move(active)) {
  try {
    active_->hs.push_back(h_);
  } catch (...) {
    h_.destroy();
    throw;
  }
  std::error_code ec;
  test(ec);  // start: post the first transfers now, so they overlap the caller's work
}

template <transport T>
request<T>::request(request&& o) noexcept
    : t_(o.t_),
      h_(std::exchange(o.h_, {})),
      ec_(o.ec_),
      finished_(std::exchange(o.finished_, true)),
      ctx_(std::move(o.ctx_)),
      seq_(o.seq_),
      bytes_(o.bytes_),
      describe_(o.describe_),
      active_(std::move(o.active_)) {}

template <transport T>
request<T>& request<T>::operator=(request&& o) noexcept {
  if (this != &o) {
    release();
    t_ = o.t_;
    h_ = std::exchange(o.h_, {});
    ec_ = o.ec_;
    finished_ = std::exchange(o.finished_, true);
    ctx_ = std::move(o.ctx_);
    seq_ = o.seq_;
    bytes_ = o.bytes_;
    describe_ = o.describe_;
    active_ = std::move(o.active_);
  }
  return *this;
}

template <transport T>
request<T>::~request() {
  release();
}

template <transport T>
void request<T>::release() noexcept {
  if (!h_) return;
  if (active_) std::erase(active_->hs, h_);
  h_.destroy();  // releases scratch; pending transfers are cancelled by their destructors
  h_ = {};
}

template <transport T>
bool request<T>::done() const noexcept {
  return finished_;
}

template <transport T>
void request<T>::finish(std::error_code ec, int peer, std::string_view why) {
  // A transport that knows which peer died (UCX: `lost_peer()`) names it,
  // whichever transfer happened to report the loss.
  if (const int lost = detail::lost_peer_of(*t_); ec == errc::peer_lost && lost >= 0) peer = lost;
  finished_ = true;
  ec_ = ec;
  if (ec) ctx_.peer = peer;
  if (ec && !why.empty()) {
    if (describe_)
      why_ = why;  // context() builds the rest of the text
    else
      ctx_.detail += why;  // starts with "; "
  }
  if (h_) {
    auto exc = std::exchange(h_.promise().exc, nullptr);
    release();
    if (exc) std::rethrow_exception(exc);
  }
}

namespace detail {
//! Moves one collective forward as far as its completed transfers allow.
//! Failures are parked in the promise for the owning request to report.
template <transport T>
void advance(T& t, std::coroutine_handle<promise<T>> h) {
  for (;;) {
    auto& p = h.promise();
    if (h.done() || p.failed || p.exc) return;
    if (p.awaited) {
      std::error_code e;
      if (!t.test(*p.awaited, e)) return;
      if (e) {
        p.failed = e;
        p.failed_peer = p.peer;
        p.failed_detail = describe(*p.awaited, {});
        p.awaited = nullptr;
        return;
      }
      p.awaited = nullptr;
    }
    h.resume();
  }
}
}  // namespace detail

template <transport T>
void request<T>::progress() {
  // Every collective in flight on this communicator moves, not only this one:
  // ranks may wait for their requests in different orders without deadlock.
  for (std::size_t i = 0; i < active_->hs.size(); ++i)
    if (active_->hs[i] != h_) detail::advance(*t_, active_->hs[i]);
  detail::advance(*t_, h_);
  auto& p = h_.promise();
  if (p.exc)
    finish(make_error_code(error::invalid_state), -1);
  else if (p.failed)
    finish(p.failed, p.failed_peer, p.failed_detail);
  else if (h_.done())
    finish({}, -1);
}

template <transport T>
bool request<T>::test(std::error_code& ec) {
  if (!finished_) progress();
  if (!finished_) return false;
  ec = ec_;
  return true;
}

template <transport T>
void request<T>::wait(deadline d, std::error_code& ec) {
  while (!finished_) {
    progress();
    if (finished_) break;
    auto& p = h_.promise();
    // Block on this collective's transfer; with others in flight, only for a
    // short slice, so their next steps get posted too.
    const deadline slice = active_->hs.size() > 1 ? min(d, deadline::after(std::chrono::microseconds(200))) : d;
    std::error_code e;
    t_->wait(*p.awaited, slice, e);
    if (e == errc::timeout) {
      // The group broke (a peer died, perhaps one whose loss no transfer
      // reported yet: look at the deadline): report the loss, naming the
      // peer that died, not the live one this rank waits for.
      if (const int lost = d.expired() ? detail::find_lost_peer(*t_) : detail::lost_peer_of(*t_); lost >= 0) {
        finish(make_error_code(error::peer_lost), lost);
        break;
      }
      if (d.expired()) {
        ctx_.peer = p.peer;  // still pending: the caller may wait again
        ec = e;
        return;
      }
    }
  }
  ec = ec_;
}

template <transport T>
void request<T>::wait(deadline d) {
  std::error_code ec;
  wait(d, ec);
  if (ec) throw_if(ec, context());
}

template <transport T>
const error_context& request<T>::context() const {
  if (describe_ && (ec_ || ctx_.peer >= 0)) {
    ctx_.detail = "seq " + std::to_string(seq_) + ", " + std::to_string(bytes_) + " bytes";
    if (!finished_) {
      // The deadline passed with the collective pending. Besides a slow or
      // stopped peer, ranks that disagree on the size end here: they may
      // choose different algorithms (small_bytes, ring vs recursive
      // doubling), whose messages never match, so no size is ever compared;
      // or a peer saw a message of the wrong size first and gave up (the
      // ring: only the ranks whose chunks differ see one).
      ctx_.detail += "; the peer is slow or stopped, or the ranks disagree on the size (a peer may have failed "
                     "with bad message)";
    } else if (ec_ == errc::bad_message) {
      // why_: both sizes of the message that did not fit, or the peer's size.
      ctx_.detail += why_ + (why_.empty() ? "; " : ": ") + "the ranks disagree on the size";
    } else {
      ctx_.detail += why_;
    }
  }
  return ctx_;
}

// ------------------------------------------------------------- communicator
template <transport T>
transport_communicator<T>::transport_communicator(T& transport, collective_options opts)
    : t_(&transport),
      opts_(opts),
      pool_(std::make_shared<detail::scratch_pool>()),
      active_(std::make_shared<detail::active_set<T>>()) {
  EBBFLOW_ENFORCE(opts_.chunk_bytes > 0 && opts_.window > 0,
                  "collective_options: chunk_bytes and window must be positive");
  check_rank_count(t_->size(), "communicator");
}

template <transport T>
request<T> transport_communicator<T>::make_request(detail::task<T> tk, detail::op_context c) {
  return request<T>(*t_, std::move(tk), std::move(c), active_);
}

template <transport T>
bool transport_communicator<T>::all_peers_local() const {
  if constexpr (detail::single_copy_transport<T>) {
    for (int q = 0; q < size(); ++q)
      if (q != rank() && t_->local_peer(q) == 0) return false;
    return true;
  } else {
    return false;
  }
}

template <transport T>
detail::op_context transport_communicator<T>::ctx(const char* op, std::uint64_t seq, std::size_t bytes) const {
  // The detail text ("seq S, B bytes") is built only if the collective fails:
  // no allocation on the hot path.
  return {{.rank = rank(), .generation = generation(), .peer = -1, .operation = op}, seq, bytes, true};
}

template <transport T>
request<T> transport_communicator<T>::iallreduce(buffer_view in, buffer_view out, reduce_op op) {
  detail::check_allreduce(in, out);
  const std::uint64_t seq = next_sequence();
  auto* src = static_cast<const std::byte*>(in.data);
  auto* dst = static_cast<std::byte*>(out.data);
  const std::size_t bytes = in.bytes();
  if (size() == 1 || in.count == 0)
    return make_request(detail::copy_only<T>(src, dst, bytes), ctx("allreduce", seq, bytes));
  switch (allreduce_algorithm_for(in.count, in.type)) {
    case allreduce_algorithm::single_copy:
      if constexpr (detail::single_copy_transport<T>)
        return make_request(
            detail::cma_allreduce<T>(*t_, seq, src, dst, in.count, in.type, op, opts_.copy_chunk_bytes, pool_),
            ctx("allreduce", seq, bytes));
      break;  // not reached: allreduce_algorithm_for chose single_copy, so the transport has it
    case allreduce_algorithm::ring:
      return make_request(
          detail::ring_allreduce<T>(*t_, seq, src, dst,
                                    dst + allreduce_segment(in.count, size(), rank()).first * size_of(in.type),
                                    in.count, in.type, op, opts_.chunk_bytes, opts_.window, true, pool_),
          ctx("allreduce", seq, bytes));
    default:
      break;
  }
  return make_request(detail::rd_allreduce<T>(*t_, seq, src, dst, in.count, in.type, op, pool_),
                      ctx("allreduce", seq, bytes));
}

template <transport T>
allreduce_algorithm transport_communicator<T>::allreduce_algorithm_for(std::size_t count, dtype type) const {
  switch (opts_.allreduce) {
    case allreduce_algorithm::automatic:
      break;
    case allreduce_algorithm::single_copy:
      EBBFLOW_ENFORCE(all_peers_local(),
                      "allreduce: single_copy needs every peer on this host with process_vm_readv access");
      return allreduce_algorithm::single_copy;
    default:
      return opts_.allreduce;
  }
  // The ring needs at least one element per rank.
  if (count * size_of(type) <= opts_.small_bytes || count < static_cast<std::size_t>(size()))
    return allreduce_algorithm::recursive_doubling;
  return all_peers_local() ? allreduce_algorithm::single_copy : allreduce_algorithm::ring;
}

template <transport T>
std::size_t transport_communicator<T>::allreduce_bytes_sent(std::size_t count, dtype type) const {
  const int n = size(), r = rank();
  if (n == 1 || count == 0) return 0;
  const std::size_t es = size_of(type);
  switch (allreduce_algorithm_for(count, type)) {
    case allreduce_algorithm::ring: {
      // The reduce-scatter sends every segment but this rank's, the allgather every one but the right neighbour's.
      const auto seg = [&](int s) {
        const auto [b, e] = allreduce_segment(count, n, s % n);
        return e - b;
      };
      return (2 * count - seg(r) - seg(r + 1)) * es;
    }
    case allreduce_algorithm::recursive_doubling: {
      int p = 1, steps = 0;
      for (; p * 2 <= n; p *= 2) ++steps;
      const int rem = n - p;
      // Below 2 * rem, even ranks fold into their odd partner, which hands the result back at the end.
      const int sends = r >= 2 * rem ? steps : r % 2 == 0 ? 1 : steps + 1;
      return static_cast<std::size_t>(sends) * count * es;
    }
    default:
      return 0;  // single_copy: peers read the buffers in place
  }
}

template <transport T>
request<T> transport_communicator<T>::ireduce_scatter(buffer_view in, buffer_view out, reduce_op op) {
  detail::check_reduce_scatter(in, out, size());
  const auto n = static_cast<std::size_t>(size());
  const std::uint64_t seq = next_sequence();
  auto* src = static_cast<const std::byte*>(in.data);
  auto* dst = static_cast<std::byte*>(out.data);
  if (n == 1 || out.count == 0)
    return make_request(detail::copy_only<T>(src, dst, out.bytes()), ctx("reduce_scatter", seq, in.bytes()));
  // Partial sums of the segments this rank forwards live in a work buffer
  // owned by the coroutine; the final reduction of segment `rank()` goes
  // straight to `out`.
  auto work = detail::scratch_pool::take(pool_, in.bytes());
  std::byte* w = work.data();
  return make_request(detail::ring_allreduce<T>(*t_, seq, src, w, dst, in.count, in.type, op, opts_.chunk_bytes,
                                                opts_.window, false, pool_, std::move(work)),
                      ctx("reduce_scatter", seq, in.bytes()));
}

template <transport T>
request<T> transport_communicator<T>::ibroadcast(buffer_view buf, int root) {
  detail::check_broadcast(buf, root, size());
  const std::uint64_t seq = next_sequence();
  auto* p = static_cast<std::byte*>(buf.data);
  if (size() == 1 || buf.count == 0)
    return make_request(detail::copy_only<T>(p, p, 0), ctx("broadcast", seq, buf.bytes()));
  const bool chain = buf.bytes() > opts_.small_bytes;
  return make_request(detail::broadcast<T>(*t_, seq, p, buf.bytes(), root, chain, opts_.chunk_bytes),
                      ctx("broadcast", seq, buf.bytes()));
}

template <transport T>
request<T> transport_communicator<T>::iallgather(buffer_view in, buffer_view out) {
  detail::check_allgather(in, out, size(), rank());
  const auto n = static_cast<std::size_t>(size());
  const std::uint64_t seq = next_sequence();
  auto* src = static_cast<const std::byte*>(in.data);
  auto* dst = static_cast<std::byte*>(out.data);
  if (n == 1 || in.count == 0)
    return make_request(detail::copy_only<T>(src, dst, in.bytes()), ctx("allgather", seq, out.bytes()));
  return make_request(detail::allgather<T>(*t_, seq, src, dst, in.bytes()), ctx("allgather", seq, out.bytes()));
}

template <transport T>
request<T> transport_communicator<T>::ibarrier() {
  const std::uint64_t seq = next_sequence();
  return make_request(detail::barrier<T>(*t_, seq), ctx("barrier", seq, 0));
}

template <transport T>
request<T> transport_communicator<T>::point_to_point(bool is_send, buffer_view buf, int peer, std::uint32_t tag) {
  const char* op = is_send ? "send" : "recv";
  detail::check_buffer(buf, op, "buffer");
  EBBFLOW_ENFORCE(peer >= 0 && peer < size() && peer != rank(),
                  op << ": peer " << peer << " invalid for rank " << rank());
  EBBFLOW_ENFORCE(tag < (1u << 24), op << ": tag " << tag << " must be < 2^24");
  // Point-to-point tags live in the step value 0xffff, which collectives never use.
  return make_request(
      detail::p2p<T>(*t_, is_send, static_cast<std::byte*>(buf.data), buf.bytes(), peer, make_tag(tag, 0xffff)),
      error_context{.rank = rank(),
                    .generation = generation(),
                    .peer = peer,
                    .operation = op,
                    .detail = "tag " + std::to_string(tag) + ", " + std::to_string(buf.bytes()) + " bytes"});
}

template <transport T>
request<T> transport_communicator<T>::isend(buffer_view buf, int peer, std::uint32_t tag) {
  return point_to_point(true, buf, peer, tag);
}

template <transport T>
request<T> transport_communicator<T>::irecv(buffer_view buf, int peer, std::uint32_t tag) {
  return point_to_point(false, buf, peer, tag);
}

// The std::error_code& twins: a request's wait reports run-time failures in
// `ec` without throwing; what starting the request refuses is caught.
template <transport T>
void transport_communicator<T>::allreduce(buffer_view in, buffer_view out, reduce_op op, deadline d,
                                          std::error_code& ec) noexcept {
  detail::into_error_code(ec, [&] { iallreduce(in, out, op).wait(d, ec); });
}
template <transport T>
void transport_communicator<T>::broadcast(buffer_view buf, int root, deadline d, std::error_code& ec) noexcept {
  detail::into_error_code(ec, [&] { ibroadcast(buf, root).wait(d, ec); });
}
template <transport T>
void transport_communicator<T>::allgather(buffer_view in, buffer_view out, deadline d, std::error_code& ec) noexcept {
  detail::into_error_code(ec, [&] { iallgather(in, out).wait(d, ec); });
}
template <transport T>
void transport_communicator<T>::reduce_scatter(buffer_view in, buffer_view out, reduce_op op, deadline d,
                                               std::error_code& ec) noexcept {
  detail::into_error_code(ec, [&] { ireduce_scatter(in, out, op).wait(d, ec); });
}
template <transport T>
void transport_communicator<T>::barrier(deadline d, std::error_code& ec) noexcept {
  detail::into_error_code(ec, [&] { ibarrier().wait(d, ec); });
}
template <transport T>
void transport_communicator<T>::send(buffer_view buf, int peer, std::uint32_t tag, deadline d,
                                     std::error_code& ec) noexcept {
  detail::into_error_code(ec, [&] { isend(buf, peer, tag).wait(d, ec); });
}
template <transport T>
void transport_communicator<T>::recv(buffer_view buf, int peer, std::uint32_t tag, deadline d,
                                     std::error_code& ec) noexcept {
  detail::into_error_code(ec, [&] { irecv(buf, peer, tag).wait(d, ec); });
}

}  // namespace comm
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/comm/impl/communicator.hpp>
// ==== end <ebbflow/comm/communicator.hpp>

// ==== begin <ebbflow/comm/loopback_transport.hpp> =========================
// SPDX-License-Identifier: Apache-2.0
//! @file loopback_transport.hpp
//! An in-process `transport` for unit tests: N threads, one `loopback_transport`
//! each, exchanging messages through a shared `loopback_hub`. The hub can kill
//! a rank (its peers then see `errc::peer_lost`) and delay delivery, so
//! failure handling can be unit-tested. Never the only proof: integration
//! tests run real processes over UCX.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/comm/transport.hpp>  (inlined)

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
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
    std::size_t sent = 0;     //!< the message's size, when it did not fit `in` (bad_message)

    //! After `errc::bad_message`: both sizes, e.g. "message of 12 bytes for a
    //! 20-byte receive buffer"; otherwise empty.
    [[nodiscard]] std::string error_detail() const {
      if (ec != errc::bad_message) return {};
      return "message of " + std::to_string(sent) + " bytes for a " + std::to_string(in.size()) +
             "-byte receive buffer";
    }
  };

  //! Rank `rank` of `hub` in generation `generation`.
  //! @throws std::invalid_argument when `rank` is outside the hub.
  basic_loopback_transport(std::shared_ptr<loopback_hub> hub, int rank, std::int64_t generation = 0)
      : hub_(std::move(hub)), rank_(rank), generation_(generation) {
    EBBFLOW_ENFORCE(rank >= 0 && rank < hub_->size(),
                    "loopback rank " << rank << " outside [0, " << hub_->size() << ")");
  }

  //! This transport's rank.
  [[nodiscard]] int rank() const noexcept { return rank_; }
  //! Number of ranks.
  [[nodiscard]] int size() const noexcept { return hub_->size(); }
  //! Generation carried in every message's key.
  [[nodiscard]] std::int64_t generation() const noexcept { return generation_; }
  //! Moves to generation `g`; messages of other generations are not matched.
  void set_generation(std::int64_t g) noexcept { generation_ = g; }
  //! Always connected (no wire-up): for callers that start a connect and poll it.
  [[nodiscard]] bool poll_connect() noexcept { return true; }

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
        r.sent = msg.data.size();
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
// #include <ebbflow/core/enum_names.hpp>  (inlined)

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

namespace detail {
inline constexpr auto level_names = make_enum_names(level::off, "off", "error", "warn", "info", "debug", "trace");
static_assert(level_names.last() == level::trace);
}  // namespace detail

//! Lower-case name ("error", "info", ...), as accepted by `EBBFLOW_LOG`.
constexpr std::string_view name(level l) noexcept { return detail::level_names(l); }

//! Parses a name produced by `name(level)`.
constexpr std::optional<level> parse_level(std::string_view s) noexcept { return detail::level_names.parse(s); }

namespace detail {
inline level level_from_env() noexcept {
  const char* v = std::getenv("EBBFLOW_LOG");
  if (!v || !*v) return level::warn;
  if (auto l = parse_level(v)) return *l;
  std::fprintf(stderr, "[ebbflow] warn: EBBFLOW_LOG='%s' is not one of off,error,warn,info,debug,trace; using warn\n",
               v);
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
inline bool enabled(level l) noexcept {
  return l != level::off && static_cast<int>(l) <= detail::current().load(std::memory_order_relaxed);
}

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

#define EBBFLOW_DETAIL_LOG(lvl, expr)                    \
  do {                                                   \
    if (::ebbflow::log::enabled(lvl)) {                  \
      std::ostringstream ebbflow_log_os_;                \
      ebbflow_log_os_ << expr;                           \
      ::ebbflow::log::write(lvl, ebbflow_log_os_.str()); \
    }                                                    \
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

// ==== begin <ebbflow/comm/nccl/communicator.hpp> ==========================
#if EBBFLOW_HAS_CUDA && EBBFLOW_HAS_NCCL
// SPDX-License-Identifier: Apache-2.0
//! @file nccl/communicator.hpp
//! The former names of the NCCL communicator, kept for one release: include
//! <ebbflow/comm/nccl_communicator.hpp> and use `comm::nccl_communicator`,
//! `nccl_unique_id`, `make_nccl_unique_id` and `nccl_options` instead. The
//! collectives take `buffer_view`s and run on the communicator's stream
//! (the former pointer-and-stream signatures are gone).
//! @deprecated Use comm/nccl_communicator.hpp.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/comm/nccl_communicator.hpp>  (inlined here)
// ---- begin <ebbflow/comm/nccl_communicator.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file nccl_communicator.hpp
//! `nccl_communicator`: the `comm::communicator` concept for device memory,
//! over NCCL. It takes the same calls as the host communicator
//! (`transport_communicator`): `buffer_view`s that carry their memory space,
//! a reduce op and a deadline, each blocking form with a `noexcept`
//! `std::error_code&` twin. The CUDA stream the collectives run on belongs
//! to the object (`nccl_options::stream`, `set_stream`), so a training loop
//! moves from host to device memory by changing the communicator's type.
//!
//! * Non-blocking initialisation (`ncclConfig_t::blocking = 0`) from a fresh
//!   unique id per generation (the elastic layer publishes it in the store),
//!   polled until ready or the deadline passes.
//! * Every collective is enqueued on the stream and then polled through
//!   `cudaStreamQuery` and `ncclCommGetAsyncError` until its deadline: a peer
//!   that died yields `errc::peer_lost` (ncclRemoteError) and a stuck one
//!   `errc::timeout`, never a hang. Blocking: on return the result is in
//!   device memory (the stream has drained). After an error the communicator
//!   is revoked (`ncclCommRevoke`) so in-flight work stops, and it is aborted
//!   on destruction.
//! * `shrink()` builds the next generation without the lost or leaving ranks
//!   (`ncclCommShrink`, NCCL 2.27+), with `NCCL_SHRINK_ABORT` after an error.
//!
//! Buffers: device memory (`memory_space::device`); a host or pinned view is
//! refused with `std::invalid_argument` naming its space, before anything
//! is enqueued. Counts and dtypes follow the host communicator's rules.
//! Errors: run-time failures throw `ebbflow::system_error` naming rank,
//! generation and operation (the twins set its code); refused arguments
//! raise `std::invalid_argument` (the twins: `std::errc::invalid_argument`).
//!
//! Requires the CUDA runtime and NCCL headers and linking `ebbflow::nccl`.
//! The current CUDA device must be the communicator's when it is used.
//! Thread safety: one thread drives a communicator at a time.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/comm/communicator.hpp>  (inlined)
// #include <ebbflow/core/deadline.hpp>  (inlined)
// #include <ebbflow/core/dtype.hpp>  (inlined)
// #include <ebbflow/core/error.hpp>  (inlined)
// #include <ebbflow/core/memory.hpp>  (inlined)

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <system_error>

#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < NCCL_VERSION(2, 27, 0)
#error "ebbflow's NCCL communicator needs NCCL 2.27 or newer (ncclCommShrink, ncclCommRevoke)"
#endif

EBBFLOW_BEGIN_NAMESPACE
namespace comm {

//! The 128-byte NCCL unique id, as bytes for the rendezvous store.
using nccl_unique_id = std::array<std::byte, sizeof(ncclUniqueId)>;

//! A fresh unique id (call on one rank per generation, then publish).
//! @throws system_error (nccl category) when NCCL cannot create one (e.g. no network interface).
inline nccl_unique_id make_nccl_unique_id();

//! NCCL's element type for an ebbflow dtype.
constexpr ncclDataType_t to_nccl(dtype t) noexcept;
//! NCCL's reduction for an ebbflow reduce_op.
constexpr ncclRedOp_t to_nccl(reduce_op op) noexcept;

//! Options of an NCCL communicator.
struct nccl_options {
  std::chrono::milliseconds init_timeout{60'000};  //!< deadline for non-blocking init / shrink
  std::chrono::milliseconds timeout{60'000};       //!< deadline of calls that take none
  std::chrono::microseconds poll_interval{50};     //!< sleep between progress polls
  cudaStream_t stream = nullptr;                   //!< where collectives run (nullptr: the legacy default stream)
};

//! An NCCL communicator of one generation, for device buffers. Move-only;
//! destroys its NCCL communicator when healthy and aborts it after a failure.
class nccl_communicator {
 public:
  //! An empty communicator (`valid()` false); its collectives fail with `errc::revoked`.
  nccl_communicator() = default;

  //! Joins generation `generation` as `rank` of `size`, from the id that rank 0
  //! published; collectives run on `opts.stream`. The current CUDA device must
  //! be set by the caller. Blocks until ready or `opts.init_timeout` passed.
  //! @throws system_error (timeout, or the NCCL error) naming rank and generation;
  //! std::invalid_argument when `rank` is outside [0, size).
  static nccl_communicator init(int rank, int size, std::int64_t generation, const nccl_unique_id& id,
                                nccl_options opts = {});

  //! Takes over `o`'s NCCL communicator; `o` is left empty (`valid()` false).
  nccl_communicator(nccl_communicator&& o) noexcept;
  //! Closes the held communicator (destroy, or abort after a failure), then takes over `o`'s.
  nccl_communicator& operator=(nccl_communicator&& o) noexcept;
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;
  ~nccl_communicator();

  [[nodiscard]] int rank() const noexcept { return st_.rank; }  //!< this rank in the generation; -1 when empty
  [[nodiscard]] int size() const noexcept { return st_.size; }  //!< number of ranks; 0 when empty
  //! The generation this communicator belongs to; -1 when empty.
  [[nodiscard]] std::int64_t generation() const noexcept { return st_.generation; }
  //! True when an NCCL communicator is held (false when default-constructed or moved from).
  [[nodiscard]] bool valid() const noexcept { return st_.comm != nullptr; }
  //! True after an operation failed; the communicator must then be shrunk or replaced.
  [[nodiscard]] bool failed() const noexcept { return st_.failed; }
  //! The underlying `ncclComm_t` (still owned by this object; nullptr when empty).
  [[nodiscard]] ncclComm_t native_handle() const noexcept { return st_.comm; }
  //! The options given at construction (with the current stream).
  [[nodiscard]] const nccl_options& options() const noexcept { return st_.opts; }
  //! The CUDA stream collectives are enqueued on.
  [[nodiscard]] cudaStream_t stream() const noexcept { return st_.opts.stream; }
  //! Runs later collectives on `s` (the caller keeps it alive meanwhile).
  void set_stream(cudaStream_t s) noexcept { st_.opts.stream = s; }
  //! A deadline `options().timeout` from now.
  [[nodiscard]] deadline default_deadline() const noexcept { return deadline::after(st_.opts.timeout); }

  //! `out = op(in of every rank)`, device memory; same count and dtype;
  //! `in.data == out.data` is in place. @throws system_error, std::invalid_argument.
  void allreduce(buffer_view in, buffer_view out, reduce_op op, deadline d);
  //! As above; errors in `ec`.
  void allreduce(buffer_view in, buffer_view out, reduce_op op, deadline d, std::error_code& ec) noexcept;
  //! As above with `default_deadline()`.
  void allreduce(buffer_view in, buffer_view out, reduce_op op) { allreduce(in, out, op, default_deadline()); }
  //! In-place allreduce of `inout` by deadline `d`.
  void allreduce(buffer_view inout, reduce_op op, deadline d) { allreduce(inout, inout, op, d); }
  //! In-place allreduce of `inout` by deadline `d`; errors in `ec`.
  void allreduce(buffer_view inout, reduce_op op, deadline d, std::error_code& ec) noexcept {
    allreduce(inout, inout, op, d, ec);
  }
  //! In-place allreduce of `inout` with `default_deadline()`.
  void allreduce(buffer_view inout, reduce_op op) { allreduce(inout, inout, op, default_deadline()); }

  //! Copies `root`'s `buf` into every rank's `buf`.
  void broadcast(buffer_view buf, int root, deadline d);
  //! As above; errors in `ec`.
  void broadcast(buffer_view buf, int root, deadline d, std::error_code& ec) noexcept;
  //! As above with `default_deadline()`.
  void broadcast(buffer_view buf, int root) { broadcast(buf, root, default_deadline()); }

  //! `out` (count `in.count * size()`) receives every rank's `in` in rank order.
  void allgather(buffer_view in, buffer_view out, deadline d);
  //! As above; errors in `ec`.
  void allgather(buffer_view in, buffer_view out, deadline d, std::error_code& ec) noexcept;
  //! As above with `default_deadline()`.
  void allgather(buffer_view in, buffer_view out) { allgather(in, out, default_deadline()); }

  //! `out` (count `in.count / size()`) receives block `rank()` of the reduction of every rank's `in`.
  void reduce_scatter(buffer_view in, buffer_view out, reduce_op op, deadline d);
  //! As above; errors in `ec`.
  void reduce_scatter(buffer_view in, buffer_view out, reduce_op op, deadline d, std::error_code& ec) noexcept;
  //! As above with `default_deadline()`.
  void reduce_scatter(buffer_view in, buffer_view out, reduce_op op) {
    reduce_scatter(in, out, op, default_deadline());
  }

  //! Returns once every rank entered the barrier (an allreduce of one
  //! element in a small device buffer allocated on first use).
  void barrier(deadline d);
  //! As above; errors in `ec`.
  void barrier(deadline d, std::error_code& ec) noexcept;
  //! As above with `default_deadline()`.
  void barrier() { barrier(default_deadline()); }

  //! Stops all in-flight operations (`ncclCommRevoke`); later operations fail
  //! with `errc::revoked` until the communicator is shrunk. Safe to call after a failure.
  void revoke() noexcept;

  //! The communicator of generation `next_generation` without the ranks in
  //! `exclude` (old ranks; the survivors keep their relative order), on the
  //! same stream. After a failure or revoke NCCL_SHRINK_ABORT is used. Every
  //! survivor must call it. @throws system_error on failure or timeout.
  nccl_communicator shrink(std::span<const int> exclude, std::int64_t next_generation);

 private:
  // Everything a move hands over; a moved-from communicator holds `state{}`.
  struct state {
    ncclComm_t comm = nullptr;
    int rank = -1;
    int size = 0;
    std::int64_t generation = -1;
    bool failed = false;
    bool revoked = false;
    nccl_options opts{};
    void* d_barrier = nullptr;  // one device int for `barrier`, allocated on first use
  };
  void close() noexcept;
  void wait_ready(deadline d, std::error_code& ec) noexcept;
  template <class Enqueue>
  void run(const char* what, const buffer_view& v, deadline d, Enqueue&& enqueue);
  void check(const std::error_code& ec, const char* what, std::string detail = {});

  state st_;
};

static_assert(communicator<nccl_communicator>);

}  // namespace comm
EBBFLOW_END_NAMESPACE

// #include <ebbflow/comm/impl/nccl_communicator.hpp>  (inlined here)
// ---- begin <ebbflow/comm/impl/nccl_communicator.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file impl/nccl_communicator.hpp
//! Definitions for comm/nccl_communicator.hpp.


// #include <ebbflow/comm/nccl_communicator.hpp>  (inlined)
// #include <ebbflow/core/log.hpp>  (inlined)

#include <cstring>
#include <iterator>
#include <thread>
#include <utility>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace comm {

inline nccl_unique_id make_nccl_unique_id() {
  ncclUniqueId id;
  if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
    throw_if(std::error_code(r, nccl_category()), {.operation = "ncclGetUniqueId"});
  nccl_unique_id out;
  std::memcpy(out.data(), &id, sizeof id);
  return out;
}

namespace detail {
// Indexed by the enumerators' values (dtype: f32 f64 f16 bf16 i32 i64 u8;
// reduce_op: sum avg min max prod).
inline constexpr ncclDataType_t nccl_types[] = {ncclFloat32, ncclFloat64, ncclFloat16, ncclBfloat16,
                                                ncclInt32,   ncclInt64,   ncclUint8};
inline constexpr ncclRedOp_t nccl_ops[] = {ncclSum, ncclAvg, ncclMin, ncclMax, ncclProd};
static_assert(std::size(nccl_types) == std::size(all_dtypes) && std::size(nccl_ops) == std::size(all_reduce_ops));
}  // namespace detail

constexpr ncclDataType_t to_nccl(dtype t) noexcept { return detail::nccl_types[static_cast<std::size_t>(t)]; }
constexpr ncclRedOp_t to_nccl(reduce_op op) noexcept { return detail::nccl_ops[static_cast<std::size_t>(op)]; }
static_assert(to_nccl(dtype::bf16) == ncclBfloat16 && to_nccl(dtype::u8) == ncclUint8 &&
              to_nccl(reduce_op::avg) == ncclAvg && to_nccl(reduce_op::prod) == ncclProd);

inline nccl_communicator nccl_communicator::init(int rank, int size, std::int64_t generation, const nccl_unique_id& id,
                                                 nccl_options opts) {
  EBBFLOW_ENFORCE(size > 0 && rank >= 0 && rank < size,
                  "nccl_communicator::init: rank " << rank << " outside [0, " << size << ")");
  nccl_communicator c;
  c.st_.rank = rank;
  c.st_.size = size;
  c.st_.generation = generation;
  c.st_.opts = opts;
  ncclUniqueId uid;
  std::memcpy(&uid, id.data(), sizeof uid);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&c.st_.comm, size, uid, rank, &cfg);
  std::error_code ec;
  if (r != ncclSuccess && r != ncclInProgress) ec = std::error_code(r, nccl_category());
  if (!ec) c.wait_ready(deadline::after(opts.init_timeout), ec);
  c.check(ec, "nccl init");
  return c;
}

inline nccl_communicator::nccl_communicator(nccl_communicator&& o) noexcept : st_(std::exchange(o.st_, {})) {}

inline nccl_communicator& nccl_communicator::operator=(nccl_communicator&& o) noexcept {
  if (this != &o) {
    close();
    st_ = std::exchange(o.st_, {});
  }
  return *this;
}

inline nccl_communicator::~nccl_communicator() { close(); }

inline void nccl_communicator::allreduce(buffer_view in, buffer_view out, reduce_op op, deadline d) {
  detail::check_allreduce(in, out, true);
  run("allreduce", in, d, [&] {
    return ncclAllReduce(in.data, out.data, in.count, to_nccl(in.type), to_nccl(op), st_.comm, st_.opts.stream);
  });
}

inline void nccl_communicator::broadcast(buffer_view buf, int root, deadline d) {
  detail::check_broadcast(buf, root, st_.size, true);
  run("broadcast", buf, d,
      [&] { return ncclBroadcast(buf.data, buf.data, buf.count, to_nccl(buf.type), root, st_.comm, st_.opts.stream); });
}

inline void nccl_communicator::allgather(buffer_view in, buffer_view out, deadline d) {
  detail::check_allgather(in, out, st_.size, st_.rank, true);
  run("allgather", out, d,
      [&] { return ncclAllGather(in.data, out.data, in.count, to_nccl(in.type), st_.comm, st_.opts.stream); });
}

inline void nccl_communicator::reduce_scatter(buffer_view in, buffer_view out, reduce_op op, deadline d) {
  detail::check_reduce_scatter(in, out, st_.size, true);
  run("reduce_scatter", in, d, [&] {
    return ncclReduceScatter(in.data, out.data, out.count, to_nccl(in.type), to_nccl(op), st_.comm, st_.opts.stream);
  });
}

inline void nccl_communicator::barrier(deadline d) {
  if (st_.comm && !st_.d_barrier) {
    if (cudaError_t e = cudaMalloc(&st_.d_barrier, sizeof(std::int32_t)); e != cudaSuccess)
      check(std::error_code(static_cast<int>(e), cuda_category()), "barrier", "cudaMalloc of 4 bytes");
  }
  const buffer_view one{st_.d_barrier, 1, dtype::i32, memory_space::device};
  run("barrier", one, d,
      [&] { return ncclAllReduce(one.data, one.data, 1, ncclInt32, ncclSum, st_.comm, st_.opts.stream); });
}

inline void nccl_communicator::allreduce(buffer_view in, buffer_view out, reduce_op op, deadline d,
                                         std::error_code& ec) noexcept {
  detail::into_error_code(ec, [&] { allreduce(in, out, op, d); });
}
inline void nccl_communicator::broadcast(buffer_view buf, int root, deadline d, std::error_code& ec) noexcept {
  detail::into_error_code(ec, [&] { broadcast(buf, root, d); });
}
inline void nccl_communicator::allgather(buffer_view in, buffer_view out, deadline d, std::error_code& ec) noexcept {
  detail::into_error_code(ec, [&] { allgather(in, out, d); });
}
inline void nccl_communicator::reduce_scatter(buffer_view in, buffer_view out, reduce_op op, deadline d,
                                              std::error_code& ec) noexcept {
  detail::into_error_code(ec, [&] { reduce_scatter(in, out, op, d); });
}
inline void nccl_communicator::barrier(deadline d, std::error_code& ec) noexcept {
  detail::into_error_code(ec, [&] { barrier(d); });
}

inline void nccl_communicator::revoke() noexcept {
  if (!st_.comm || st_.revoked) return;
  st_.revoked = true;
  st_.failed = true;
  if (ncclResult_t r = ncclCommRevoke(st_.comm, NCCL_REVOKE_DEFAULT); r != ncclSuccess && r != ncclInProgress)
    EBBFLOW_LOG_WARN("ncclCommRevoke failed: " << ncclGetErrorString(r) << " [rank " << st_.rank << ", generation "
                                               << st_.generation << "]");
}

inline nccl_communicator nccl_communicator::shrink(std::span<const int> exclude, std::int64_t next_generation) {
  for (int r : exclude)
    EBBFLOW_ENFORCE(r >= 0 && r < st_.size && r != st_.rank,
                    "nccl shrink: cannot exclude rank " << r << " of " << st_.size << " from rank " << st_.rank);
  nccl_communicator c;
  c.st_.opts = st_.opts;
  c.st_.generation = next_generation;
  std::vector<int> ex(exclude.begin(), exclude.end());
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  const int flags = st_.failed ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT;
  ncclResult_t r = ncclCommShrink(st_.comm, ex.data(), static_cast<int>(ex.size()), &c.st_.comm, &cfg, flags);
  std::error_code ec;
  if (r != ncclSuccess && r != ncclInProgress) ec = std::error_code(r, nccl_category());
  if (!ec) c.wait_ready(deadline::after(st_.opts.init_timeout), ec);
  if (!ec) {
    ncclCommUserRank(c.st_.comm, &c.st_.rank);
    ncclCommCount(c.st_.comm, &c.st_.size);
  }
  c.check(ec, "nccl shrink");
  return c;
}

inline void nccl_communicator::close() noexcept {
  if (st_.d_barrier) {
    if (cudaError_t e = cudaFree(st_.d_barrier); e != cudaSuccess)
      EBBFLOW_LOG_WARN("freeing the NCCL barrier's device word: " << cudaGetErrorString(e));
    st_.d_barrier = nullptr;
  }
  if (!st_.comm) return;
  // A healthy communicator is finalised and destroyed; a failed one aborted
  // (destroy could wait forever for a dead peer).
  ncclResult_t r = st_.failed ? ncclCommAbort(st_.comm) : ncclCommDestroy(st_.comm);
  if (r != ncclSuccess) EBBFLOW_LOG_WARN("closing NCCL communicator: " << ncclGetErrorString(r));
  st_.comm = nullptr;
}

inline void nccl_communicator::wait_ready(deadline d, std::error_code& ec) noexcept {
  for (;;) {
    ncclResult_t st = ncclSuccess;
    if (ncclResult_t r = ncclCommGetAsyncError(st_.comm, &st); r != ncclSuccess) st = r;
    if (st == ncclSuccess) return;
    if (st != ncclInProgress) {
      ec = std::error_code(st, nccl_category());
      return;
    }
    if (d.expired()) {
      ec = make_error_code(error::timeout);
      return;
    }
    std::this_thread::sleep_for(st_.opts.poll_interval);
  }
}

// Runs one collective on the buffer `v` (named on error): enqueue, then poll
// the stream and NCCL's async error until done or `d` passed.
template <class Enqueue>
void nccl_communicator::run(const char* what, const buffer_view& v, deadline d, Enqueue&& enqueue) {
  std::error_code ec;
  if (!st_.comm || st_.revoked) {
    ec = make_error_code(error::revoked);
  } else if (ncclResult_t r = enqueue(); r != ncclSuccess && r != ncclInProgress) {
    ec = std::error_code(r, nccl_category());
  } else {
    for (;;) {
      ncclResult_t st = ncclSuccess;
      ncclCommGetAsyncError(st_.comm, &st);
      if (st != ncclSuccess && st != ncclInProgress) {
        ec = std::error_code(st, nccl_category());
        break;
      }
      const cudaError_t q = cudaStreamQuery(st_.opts.stream);
      if (q == cudaSuccess && st == ncclSuccess) break;
      if (q != cudaSuccess && q != cudaErrorNotReady) {
        ec = std::error_code(static_cast<int>(q), cuda_category());
        break;
      }
      if (d.expired()) {
        ec = make_error_code(error::timeout);
        break;
      }
      std::this_thread::sleep_for(st_.opts.poll_interval);
    }
  }
  if (ec) revoke();
  check(ec, what,
        std::to_string(v.count) + " " + std::string(name(v.type)) + ", " + std::to_string(v.bytes()) + " bytes");
}

inline void nccl_communicator::check(const std::error_code& ec, const char* what, std::string detail) {
  if (!ec) return;
  st_.failed = true;
  throw_if(ec, {.rank = st_.rank, .generation = st_.generation, .operation = what, .detail = std::move(detail)});
}

}  // namespace comm
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/comm/impl/nccl_communicator.hpp>
// ---- end <ebbflow/comm/nccl_communicator.hpp>

EBBFLOW_BEGIN_NAMESPACE
namespace comm::nccl {

//! @deprecated Use `comm::nccl_communicator`.
using communicator = nccl_communicator;
//! @deprecated Use `comm::nccl_unique_id`.
using unique_id_bytes = nccl_unique_id;
//! @deprecated Use `comm::nccl_options`.
using options = nccl_options;
//! @deprecated Use `comm::make_nccl_unique_id`.
inline nccl_unique_id make_unique_id() { return make_nccl_unique_id(); }
using comm::to_nccl;

}  // namespace comm::nccl
EBBFLOW_END_NAMESPACE
#endif  // EBBFLOW_HAS_CUDA && EBBFLOW_HAS_NCCL
// ==== end <ebbflow/comm/nccl/communicator.hpp>

// ==== begin <ebbflow/comm/revocable.hpp> ==================================
// SPDX-License-Identifier: Apache-2.0
//! @file revocable.hpp
//! `revocable<Transport>`: wraps any transport so that another thread can
//! revoke it. Once revoked, every pending and later `wait` returns
//! `errc::revoked` within about one poll slice. The elastic group uses this
//! to pull every survivor out of a collective when any member saw a failure
//! (a ring neighbour of a survivor is alive but will never send again).


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/comm/transport.hpp>  (inlined)

#include <atomic>
#include <chrono>
#include <memory>
#include <utility>

EBBFLOW_BEGIN_NAMESPACE
namespace comm {

//! A flag shared between the transport user and the thread that revokes.
class revoke_flag {
 public:
  //! Sets the flag; never blocks, callable from any thread. Irreversible.
  void revoke() noexcept { v_.store(true, std::memory_order_release); }
  //! True once `revoke()` was called (acquire load; any thread).
  [[nodiscard]] bool revoked() const noexcept { return v_.load(std::memory_order_acquire); }

 private:
  std::atomic<bool> v_{false};
};

//! A `transport` that forwards to `T` and fails waits with `errc::revoked`
//! once its shared `revoke_flag` is set. Models `transport` itself. Like any
//! transport, one thread drives it at a time; only the flag may be set from
//! another thread.
template <transport T>
class revocable {
 public:
  using request = typename T::request;  //!< the inner transport's request

  //! `slice`: how long one inner wait may block before the flag is checked again.
  revocable(T inner, std::shared_ptr<revoke_flag> flag, std::chrono::microseconds slice = std::chrono::milliseconds(2))
      : inner_(std::move(inner)), flag_(std::move(flag)), slice_(slice) {}

  [[nodiscard]] int rank() const noexcept { return inner_.rank(); }  //!< the inner transport's rank
  [[nodiscard]] int size() const noexcept { return inner_.size(); }  //!< the inner transport's size
  //! The inner transport's generation.
  [[nodiscard]] std::int64_t generation() const noexcept { return inner_.generation(); }
  //! The wrapped transport (bypasses the revoke check).
  [[nodiscard]] T& inner() noexcept { return inner_; }
  //! The shared flag; set it (from any thread) to revoke.
  [[nodiscard]] const std::shared_ptr<revoke_flag>& flag() const noexcept { return flag_; }

  //! Forwarded when the inner transport knows which peers share this host
  //! (enables the communicator's single-copy path).
  [[nodiscard]] long local_peer(int q) const noexcept requires requires(const T& t) { t.local_peer(q); }
  { return static_cast<long>(inner_.local_peer(q)); }
  //! Forwarded when the inner transport can name the peer that died.
  [[nodiscard]] int lost_peer() const noexcept requires requires(const T& t) {
    { t.lost_peer() } -> std::convertible_to<int>;
  }
  { return inner_.lost_peer(); }
  //! Forwarded when the inner transport can tell that a peer's process on
  //! this host is gone (safe after a revoke).
  [[nodiscard]] bool peer_gone(int q) const noexcept requires requires(const T& t) {
    { t.peer_gone(q) } -> std::convertible_to<bool>;
  }
  { return inner_.peer_gone(q); }
  //! Forwarded when the inner transport can be told that a peer died.
  void mark_lost(int q) noexcept requires requires(T& t) { t.mark_lost(q); }
  { inner_.mark_lost(q); }
  //! Forwarded when the inner transport can probe its peers' processes
  //! (returns whether it found one gone; safe after a revoke).
  bool probe_peers() noexcept requires requires(T& t) {
    { t.probe_peers() } -> std::convertible_to<bool>;
  }
  { return inner_.probe_peers(); }

  //! Posts a send on the inner transport (not checked against the flag; never blocks).
  //! `out` (host memory) must stay valid until the request completed.
  request isend(int peer, tag_t tag, std::span<const std::byte> out) { return inner_.isend(peer, tag, out); }
  //! Posts a receive on the inner transport (not checked against the flag; never blocks).
  //! `in` (host memory) must stay valid until the request completed.
  request irecv(int peer, tag_t tag, std::span<std::byte> in) { return inner_.irecv(peer, tag, in); }
  //! Progresses `r`; true once it completed or the flag is set (then `ec` is
  //! `errc::revoked` unless the request had already completed). Never blocks.
  bool test(request& r, std::error_code& ec) {
    if (inner_.test(r, ec)) return true;
    if (flag_->revoked()) {
      ec = make_error_code(error::revoked);
      return true;
    }
    return false;
  }
  //! Blocks until `r` completes, the flag is set (`ec` = `errc::revoked`,
  //! noticed within one `slice`) or `d` passes (`ec` = `errc::timeout`; the
  //! request stays pending). Other errors of the inner transport pass through in `ec`.
  void wait(request& r, deadline d, std::error_code& ec) {
    for (;;) {
      if (flag_->revoked()) {
        if (!inner_.test(r, ec)) ec = make_error_code(error::revoked);
        return;
      }
      ec.clear();
      inner_.wait(r, min(d, deadline::after(slice_)), ec);
      if (ec != errc::timeout) return;
      if (d.expired()) return;
    }
  }

 private:
  T inner_;
  std::shared_ptr<revoke_flag> flag_;
  std::chrono::microseconds slice_;
};

}  // namespace comm
EBBFLOW_END_NAMESPACE
// ==== end <ebbflow/comm/revocable.hpp>

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

// ==== begin <ebbflow/comm/ucx/address_exchange.hpp> =======================
#if EBBFLOW_HAS_UCX
// SPDX-License-Identifier: Apache-2.0
//! @file ucx/address_exchange.hpp
//! Bootstrap of a UCX group: every rank publishes its worker address and
//! fetches everyone's. Pluggable: anything satisfying `address_exchange`
//! works (the rendezvous store plugs in here); `file_address_exchange` uses a
//! shared directory and needs nothing else (tests, single host, shared FS).


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/comm/ucx/handles.hpp>  (inlined here)
// ---- begin <ebbflow/comm/ucx/handles.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file ucx/handles.hpp
//! RAII over UCX: `ucx::context` (ucp_context) and `ucx::worker`
//! (ucp_worker) as `unique_handle`s, plus the process-environment defaults
//! that keep shared memory usable under peer-failure handling.
//!
//! Requires UCX headers and `ebbflow::ucx` (links ucp/ucs).


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/deadline.hpp>  (inlined)
// #include <ebbflow/core/env.hpp>  (inlined)
// #include <ebbflow/core/error.hpp>  (inlined)
// #include <ebbflow/core/handle.hpp>  (inlined)
// #include <ebbflow/core/log.hpp>  (inlined)
// #include <ebbflow/comm/ucx/endpoint_pool.hpp>  (inlined here)
// ---- begin <ebbflow/comm/ucx/endpoint_pool.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file ucx/endpoint_pool.hpp
//! `comm::ucx::endpoint_pool`: the endpoints of one UCX worker, shared by
//! every transport built on it. The elastic group keeps one worker for the
//! whole job and builds a transport per generation; a member that stays from
//! one generation to the next reuses its endpoints to the other members that
//! stay, so a join wires up only the newcomers (UCX's wire-up of an endpoint
//! is the costly part of a membership change: over tcp it takes round trips
//! and runs on whichever thread progresses the worker, i.e. training).
//!
//! An endpoint is handed out again only while it is healthy: not failed, and
//! not retired by `retire` (after a failure, the next generation must not
//! inherit the failed one's abandoned traffic). The last user closes it.
//! Failure callbacks reach every transport that uses the endpoint.
//!
//! Thread safety: every member function may be called from any thread. The
//! pool never calls UCX while it holds its lock; UCX calls the error callback
//! with the worker's lock held, and the callback takes the pool's lock, so a
//! user must not call the pool from inside an error callback.


// #include <ebbflow/config.hpp>  (inlined)

#include <ucp/api/ucp.h>

#include <algorithm>
#include <cstddef>
#include <list>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace comm::ucx {

//! Endpoints of one worker, keyed by the remote worker's address and shared
//! by the transports on that worker (see the file comment). Owned by
//! `worker`; entries live as long as the pool, so UCX's callback argument
//! stays valid for any late callback.
class endpoint_pool {
  struct entry;

 public:
  //! Called (with the pool's lock held, from whichever thread progresses the
  //! worker) when an endpoint fails: `ctx` and `peer` are what the user gave
  //! `acquire`. Must not call UCX or the pool.
  using error_fn = void (*)(void* ctx, int peer, ucs_status_t status) noexcept;

  //! One user's hold on an endpoint (from `acquire`, given back to `release`).
  struct ref {
    entry* e = nullptr;     //!< the pool's record (opaque)
    ucp_ep_h ep = nullptr;  //!< the endpoint
    bool reused = false;    //!< whether an earlier user opened it
  };
  //! What `release` leaves to the caller: an endpoint to close, or none.
  struct to_close {
    ucp_ep_h ep = nullptr;  //!< null: others still use it
    bool force = false;     //!< close with UCP_EP_CLOSE_FLAG_FORCE
  };

  endpoint_pool() = default;
  endpoint_pool(const endpoint_pool&) = delete;
  endpoint_pool& operator=(const endpoint_pool&) = delete;

  //! An endpoint on `w` to the worker at `address`, error handling
  //! `UCP_ERR_HANDLING_MODE_PEER`: a healthy shared one when the pool has it,
  //! else a new one (then shared with later users). `on_error(ctx, peer, s)`
  //! reports its failure until `release(r, ctx, ...)`. Returns UCX's status
  //! of `ucp_ep_create` (`r` is then empty).
  ucs_status_t acquire(ucp_worker_h w, std::span<const std::byte> address, error_fn on_error, void* ctx, int peer,
                       ref& r) {
    r = {};
    entry* e = nullptr;
    {
      std::lock_guard lk(mu_);
      if (entry* x = shared_to(address)) {
        x->users.push_back({on_error, ctx, peer});
        r = {x, x->ep, true};
        return UCS_OK;
      }
      e = &entries_.emplace_back();
      e->pool = this;
      e->users.push_back({on_error, ctx, peer});
    }
    ucp_ep_params_t p{};
    p.field_mask =
        UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.address = reinterpret_cast<const ucp_address_t*>(address.data());
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = &endpoint_pool::on_ep_error;
    p.err_handler.arg = e;
    ucp_ep_h h = nullptr;
    const ucs_status_t s = ucp_ep_create(w, &p, &h);
    std::lock_guard lk(mu_);
    if (s != UCS_OK) {
      e->users.clear();
      e->dead = true;
      return s;
    }
    e->ep = h;
    // Shared from now on, unless it failed already or a concurrent user
    // opened one to the same worker first (then this one stays private).
    e->shareable = !e->dead && shared_to(address) == nullptr;
    if (e->shareable) e->address.assign(address.begin(), address.end());
    r = {e, h, false};
    return UCS_OK;
  }

  //! Gives back `ctx`'s hold on `r`. `broken_peer`: this user left traffic
  //! on the endpoint that the peer will never answer (abandoned sends), or
  //! saw it fail; then no later user gets it, and its last user closes it
  //! by force. `broken_user`: this user's whole group broke (a peer lost),
  //! which forces the close only when this user is the last. Returns the
  //! endpoint when the caller must close it.
  to_close release(ref& r, void* ctx, bool broken_peer, bool broken_user) noexcept {
    if (!r.e) return {};
    entry* e = std::exchange(r.e, nullptr);
    r.ep = nullptr;
    std::lock_guard lk(mu_);
    std::erase_if(e->users, [&](const user& u) { return u.ctx == ctx; });
    if (broken_peer) {
      e->force = true;
      e->shareable = false;
    }
    if (!e->users.empty() || !e->ep) return {};
    e->shareable = false;
    e->address.clear();
    e->address.shrink_to_fit();
    return {std::exchange(e->ep, nullptr), e->force || e->dead || broken_user};
  }

  //! From now on, no endpoint open now is handed out again: the next
  //! `acquire` of each address opens a new one. The elastic group calls it
  //! when a generation failed; current users keep theirs until they release.
  //! Their last user closes them by force, as a broken group's: what is
  //! queued on them belongs to the aborted step, and a peer that hangs
  //! (stopped, not dead) would never answer a flushing close.
  void retire() noexcept {
    std::lock_guard lk(mu_);
    for (entry& x : entries_) {
      x.shareable = false;
      x.force = true;
    }
  }

  //! How many endpoints a new user could share now (for tests and logs).
  [[nodiscard]] std::size_t shareable() const {
    std::lock_guard lk(mu_);
    return static_cast<std::size_t>(std::ranges::count_if(entries_, [](const entry& x) { return x.shareable; }));
  }

 private:
  struct user {
    error_fn on_error;
    void* ctx;
    int peer;
  };
  struct entry {
    endpoint_pool* pool = nullptr;
    std::vector<std::byte> address;  // kept while shareable
    ucp_ep_h ep = nullptr;           // null once closed
    std::vector<user> users;
    bool shareable = false;
    bool dead = false;   // UCX reported it failed
    bool force = false;  // close it by force
  };

  // The shareable endpoint to `address`, or null (lock held).
  entry* shared_to(std::span<const std::byte> address) noexcept {
    for (entry& x : entries_)
      if (x.shareable && std::ranges::equal(x.address, address)) return &x;
    return nullptr;
  }

  static void on_ep_error(void* arg, ucp_ep_h, ucs_status_t status) noexcept {
    auto* e = static_cast<entry*>(arg);
    std::lock_guard lk(e->pool->mu_);
    e->dead = true;
    e->shareable = false;
    for (const user& u : e->users) u.on_error(u.ctx, u.peer, status);
  }

  mutable std::mutex mu_;
  std::list<entry> entries_;  // stable addresses: UCX holds them as callback arguments
};

}  // namespace comm::ucx
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/comm/ucx/endpoint_pool.hpp>

#include <poll.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <chrono>
#include <ctime>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace comm::ucx {

//! `std::error_code` of a UCX status (category `ucs_category()`; peer
//! failures compare equal to `errc::peer_lost`).
inline std::error_code make_error(ucs_status_t s) noexcept { return {static_cast<int>(s), ucs_category()}; }

namespace detail {
//! Whether `UCX_TLS` = `tls` (null or empty: unset) may select transport
//! `name`: unset, `all`, an exclusion list (`^...`), the name itself, or an
//! alias that covers it (`sm`/`shm` for every shared-memory transport, `mm`
//! for posix and sysv).
inline bool tls_may_select(const char* tls, std::string_view name) noexcept {
  if (tls == nullptr || *tls == 0 || *tls == '^') return true;
  const bool mm = name == "posix" || name == "sysv";
  std::string_view rest = tls;
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    const auto t = rest.substr(0, comma);
    if (t == name || t == "all" || t == "sm" || t == "shm" || (mm && t == "mm")) return true;
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
  }
  return false;
}
}  // namespace detail

//! Sets UCX variables that ebbflow relies on, each only when the user has not
//! set it (so an explicit `UCX_...` always wins). Idempotent; call before the
//! first `ucp_config_read` of the process (`context::create` does).
//! * `UCX_POSIX_ERROR_HANDLING=y`, `UCX_SYSV_ERROR_HANDLING=y`,
//!   `UCX_CMA_MEMORY_INVALIDATE=y`: without them UCX drops shared memory and
//!   CMA under `UCP_ERR_HANDLING_MODE_PEER` and runs over tcp/lo (about 1.7x
//!   less bandwidth, 10x more latency on one host).
//! * `UCX_KEEPALIVE_INTERVAL=100ms`: a dead peer on shared memory is found by
//!   keepalive only (default 20 s). Over shared memory keepalive checks that
//!   the peer process still exists (pid + start time), so a slow or
//!   descheduled peer is never declared dead: no false positives from load.
//!   Over tcp a failure is a broken connection, also not a timing guess.
//! * `UCX_POSIX_RX_BUFS_GROW=128`, `UCX_SYSV_RX_BUFS_GROW=128`: each
//!   shared-memory interface of a new worker allocates its receive buffers
//!   (8 KiB each) in chunks of this many, and needs 65 at once (its FIFO and
//!   one more). With UCX's 512, every worker writes and faults in 2 x 4.2 MB
//!   of shared memory it does not use: about 2.5 ms of CPU per process
//!   (a context and a worker: 7.3-8.1 ms, 5.1-5.6 ms with 128). A newcomer
//!   spends it on the cores of the members it is about to join when they
//!   share a host. The pool still grows on demand.
//! * `UCX_USE_MT_MUTEX=y`: a multi-threaded worker (the elastic group's,
//!   where a low-priority helper thread creates endpoints while the training
//!   thread progresses) locks with a mutex, not a spinlock, so a training
//!   thread never spins on a lock held by a preempted helper on its core.
//!   Single-threaded workers take no lock either way.
//! The shared-memory variables are set only when `UCX_TLS` (if set) may
//! select that transport: UCX warns about variables of transports it does
//! not load ("unused env variables"), which a user who chose
//! `UCX_TLS=tcp,self` should not see for variables they never set.
//! Not thread-safe (setenv).
inline void set_environment_defaults() noexcept {
  const char* tls = std::getenv("UCX_TLS");
  if (detail::tls_may_select(tls, "posix")) ::setenv("UCX_POSIX_ERROR_HANDLING", "y", 0);
  if (detail::tls_may_select(tls, "sysv")) ::setenv("UCX_SYSV_ERROR_HANDLING", "y", 0);
  if (detail::tls_may_select(tls, "posix")) ::setenv("UCX_POSIX_RX_BUFS_GROW", "128", 0);
  if (detail::tls_may_select(tls, "sysv")) ::setenv("UCX_SYSV_RX_BUFS_GROW", "128", 0);
  if (detail::tls_may_select(tls, "cma")) ::setenv("UCX_CMA_MEMORY_INVALIDATE", "y", 0);
  ::setenv("UCX_KEEPALIVE_INTERVAL", "100ms", 0);
  ::setenv("UCX_USE_MT_MUTEX", "y", 0);
}

namespace detail {
// The frame around every worker address ebbflow publishes (`worker::address`)
// and checks before UCX sees a peer's (`transport`): UCX parses an address
// with assertions, so a malformed one (a corrupt store value, a stale or
// foreign file) would abort the process inside `ucp_ep_create`. Header, 16
// bytes little-endian: magic "EBFA", u16 version, u16 zero, u32 length of the
// UCX address, u32 FNV-1a of its bytes; then the UCX address.
inline constexpr std::size_t address_header_bytes = 16;
inline constexpr std::uint16_t address_version = 1;
inline constexpr std::uint32_t fnv1a(std::span<const std::byte> b) noexcept {
  std::uint32_t h = 2166136261u;
  for (std::byte x : b) h = (h ^ static_cast<std::uint8_t>(x)) * 16777619u;
  return h;
}
inline void store_le(std::byte* p, std::uint32_t v, int n) noexcept {
  for (int i = 0; i < n; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
inline std::uint32_t load_le(const std::byte* p, int n) noexcept {
  std::uint32_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<std::uint32_t>(p[i]) << (8 * i);
  return v;
}
//! `raw` (a UCX worker address) with ebbflow's header in front.
inline std::vector<std::byte> frame_address(std::span<const std::byte> raw) {
  std::vector<std::byte> out(address_header_bytes + raw.size());
  for (int i = 0; i < 4; ++i) out[static_cast<std::size_t>(i)] = static_cast<std::byte>("EBFA"[i]);
  store_le(out.data() + 4, address_version, 2);
  store_le(out.data() + 6, 0, 2);
  store_le(out.data() + 8, static_cast<std::uint32_t>(raw.size()), 4);
  store_le(out.data() + 12, fnv1a(raw), 4);
  std::ranges::copy(raw, out.begin() + address_header_bytes);
  return out;
}
//! The UCX address inside `framed`, or empty with `why` saying what is wrong.
inline std::span<const std::byte> unframe_address(std::span<const std::byte> framed, std::string& why) {
  const auto n = framed.size();
  if (n < address_header_bytes) {
    why = "shorter than the " + std::to_string(address_header_bytes) + "-byte header";
    return {};
  }
  const std::byte* p = framed.data();
  if (load_le(p, 4) != load_le(reinterpret_cast<const std::byte*>("EBFA"), 4)) {
    why = "not an ebbflow worker address (bad magic)";
    return {};
  }
  if (load_le(p + 4, 2) != address_version) {
    why = "address format version " + std::to_string(load_le(p + 4, 2)) + " (this build reads " +
          std::to_string(address_version) + ")";
    return {};
  }
  const auto raw = framed.subspan(address_header_bytes);
  if (load_le(p + 8, 4) != raw.size() || raw.empty()) {
    why = "header says " + std::to_string(load_le(p + 8, 4)) + " bytes of UCX address, " + std::to_string(raw.size()) +
          " follow";
    return {};
  }
  if (load_le(p + 12, 4) != fnv1a(raw)) {
    why = "checksum mismatch (corrupted)";
    return {};
  }
  return raw;
}

struct context_traits {
  using value_type = ucp_context_h;
  static value_type null() noexcept { return nullptr; }
  static void close(value_type c) noexcept { ucp_cleanup(c); }
};
struct worker_traits {
  using value_type = ucp_worker_h;
  static value_type null() noexcept { return nullptr; }
  static void close(value_type w) noexcept { ucp_worker_destroy(w); }
};
}  // namespace detail

//! How a rank waits for a transfer once a short busy-poll (~50 us; none
//! when the host is oversubscribed) found nothing (`EBBFLOW_UCX_WAIT`).
//! Blocking: sleep on the worker's event file descriptor until a message or
//! completion arrives (UCX's wake-up feature), at most 1 ms at a time; the
//! core goes to whoever needs it and the thread is woken when its data is
//! there, at the price of a wake-up (tens of microseconds). Yielding: poll
//! and `sched_yield` in a loop; the thread keeps its core (or hands it to a
//! peer at once) and sees its data within a poll, but burns the core for
//! as long as it waits.
enum class wait_mode {
  //! `auto` (default): yield for the first `wait_block_after` (2 ms) of a
  //! wait, then block. Short waits keep the latency of polling; a rank
  //! waiting for a straggler stops burning its core.
  automatic,
  //! `block`: block right after the busy-poll.
  block,
  //! `yield`: never block (every wait burns its core to the end).
  yield,
};

//! How long a wait yields before it blocks in `wait_mode::automatic`.
inline constexpr std::chrono::microseconds wait_block_after{2000};

//! `EBBFLOW_UCX_WAIT` (`auto`, `block` or `yield`; unset or empty: `auto`).
//! @throws std::invalid_argument naming the variable and its value.
inline wait_mode wait_mode_from_environment() {
  return env::get_choice("EBBFLOW_UCX_WAIT", wait_mode::automatic,
                         {{"auto", wait_mode::automatic}, {"block", wait_mode::block}, {"yield", wait_mode::yield}});
}

//! An owned `ucp_context` with the tag feature (and, unless its workers'
//! transports only yield, the wake-up feature). Move-only; thread-safe to share
//! between workers of one thread each.
class context {
 public:
  //! Reads UCX's configuration from the environment (after
  //! `set_environment_defaults`) and initialises UCP; `mode` from
  //! `EBBFLOW_UCX_WAIT`. @throws system_error, std::invalid_argument.
  static std::shared_ptr<context> create() { return create(wait_mode_from_environment()); }
  //! The same with the wait mode given. @throws system_error.
  static std::shared_ptr<context> create(wait_mode mode) {
    set_environment_defaults();
    ucp_config_t* config = nullptr;
    ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
    throw_if(make_error(s), {.operation = "ucp_config_read"});
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_TAG | (mode != wait_mode::yield ? UCP_FEATURE_WAKEUP : 0);
    ucp_context_h h = nullptr;
    s = ucp_init(&params, config, &h);
    ucp_config_release(config);
    throw_if(make_error(s), {.operation = "ucp_init"});
    return std::shared_ptr<context>(new context(h, mode));
  }
  //! The raw UCP context handle (owned by this object).
  [[nodiscard]] ucp_context_h get() const noexcept { return h_.get(); }
  //! How its workers' transports wait.
  [[nodiscard]] wait_mode waits() const noexcept { return mode_; }

 private:
  context(ucp_context_h h, wait_mode mode) noexcept : h_(h), mode_(mode) {}
  unique_handle<detail::context_traits> h_;
  wait_mode mode_;
};

//! An owned `ucp_worker`, its address, and the `endpoint_pool` of the
//! transports built on it. Move-only. Keeps its context alive.
class worker {
 public:
  //! A single-threaded worker, or with `UCS_THREAD_MODE_MULTI` one that
  //! several threads may call at once (UCX then locks every call; whether the
  //! library granted it is `multi_threaded()`). @throws system_error.
  explicit worker(std::shared_ptr<context> ctx, ucs_thread_mode_t mode = UCS_THREAD_MODE_SINGLE)
      : ctx_(std::move(ctx)) {
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = mode;
    ucp_worker_h w = nullptr;
    throw_if(make_error(ucp_worker_create(ctx_->get(), &wp, &w)), {.operation = "ucp_worker_create"});
    h_.reset(w);
    ucp_worker_attr_t attr{};
    attr.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE;
    multi_ = ucp_worker_query(w, &attr) == UCS_OK && attr.thread_mode == UCS_THREAD_MODE_MULTI;
    if (int fd = -1; ctx_->waits() != wait_mode::yield && ucp_worker_get_efd(w, &fd) == UCS_OK) efd_ = fd;
    ucp_address_t* a = nullptr;
    std::size_t len = 0;
    throw_if(make_error(ucp_worker_get_address(w, &a, &len)), {.operation = "ucp_worker_get_address"});
    address_ = detail::frame_address({reinterpret_cast<const std::byte*>(a), len});
    ucp_worker_release_address(w, a);
  }
  //! The raw UCP worker handle (owned by this object).
  [[nodiscard]] ucp_worker_h get() const noexcept { return h_.get(); }
  //! This worker's address: the bytes peers need to connect (opaque; UCX's
  //! address behind a header with a checksum, which `transport` verifies
  //! before it connects, so a corrupt address fails cleanly).
  [[nodiscard]] std::span<const std::byte> address() const noexcept { return address_; }
  //! How the transports on this worker wait (the context's mode).
  [[nodiscard]] wait_mode waits() const noexcept { return ctx_->waits(); }
  //! Whether several threads may call into this worker at once.
  [[nodiscard]] bool multi_threaded() const noexcept { return multi_; }
  //! The endpoints of the transports on this worker, shared between them.
  [[nodiscard]] endpoint_pool& endpoints() const noexcept { return *pool_; }

  //! Sleeps until this worker has an event (a message arrived, an operation
  //! completed) or `most` passed, after arming the worker. Returns false,
  //! at once, when it cannot: the context has no wake-up (`wait_mode::yield`)
  //! or events are already pending (progress the worker again). The caller
  //! progresses the worker afterwards. On a multi-threaded worker an event
  //! another thread's progress took may go unnoticed here: `most` bounds
  //! that, and what a wait must also notice (a deadline, a revocation).
  bool block(std::chrono::nanoseconds most) noexcept {
    if (efd_ < 0) return false;
    if (ucp_worker_arm(get()) != UCS_OK) return false;  // UCS_ERR_BUSY: events pending
    const auto ns = std::max<std::int64_t>(most.count(), 0);
    const timespec ts{static_cast<std::time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
    pollfd p{efd_, POLLIN, 0};
    (void)::ppoll(&p, 1, &ts, nullptr);
    return true;
  }

  //! Receives and drops every message waiting unmatched on this worker
  //! whose wire tag matches `tag` under `mask` (a message nobody will ever
  //! receive: one of a generation that is over). Each is received into a
  //! small scratch buffer: UCX truncates a larger one (and still answers its
  //! sender's rendezvous), so nothing is allocated. Waits for each until `d`,
  //! then cancels it. Returns how many were dropped. Callable from any
  //! thread on a multi-threaded worker.
  std::size_t discard_unexpected(ucp_tag_t tag, ucp_tag_t mask, deadline d) noexcept {
    std::size_t n = 0;
    for (;;) {
      ucp_tag_recv_info_t info{};
      ucp_tag_message_h m = ucp_tag_probe_nb(get(), tag, mask, 1, &info);
      if (m == nullptr) return n;
      ++n;
      ucp_request_param_t prm{};
      prm.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
      prm.datatype = ucp_dt_make_contig(1);
      ucs_status_ptr_t r = ucp_tag_msg_recv_nbx(get(), scratch_->data(), scratch_->size(), m, &prm);
      if (!UCS_PTR_IS_PTR(r)) continue;  // complete (or truncated) at once
      while (ucp_request_check_status(r) == UCS_INPROGRESS && !d.expired()) ucp_worker_progress(get());
      if (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_request_cancel(get(), r);
      ucp_request_free(r);
    }
  }

  //! Drops what is left unmatched (see `discard_unexpected`, 100 ms at
  //! most), so UCX has nothing to complain about, and destroys the worker.
  ~worker() {
    if (h_.get() != nullptr) discard_unexpected(0, 0, deadline::after(std::chrono::milliseconds(100)));
  }
  //! Takes over the worker; the source must not be used afterwards.
  worker(worker&&) noexcept = default;
  worker& operator=(worker&&) = delete;

 private:
  std::shared_ptr<context> ctx_;  // declared first: destroyed after the worker
  // Destroyed after the worker, so no UCX callback outlives its argument.
  std::unique_ptr<endpoint_pool> pool_ = std::make_unique<endpoint_pool>();
  // Where discarded messages land (see `discard_unexpected`); destroyed
  // after the worker, which may still write into it. Concurrent discards
  // may share it: its contents are never read.
  std::unique_ptr<std::array<std::byte, 256>> scratch_ = std::make_unique<std::array<std::byte, 256>>();
  unique_handle<detail::worker_traits> h_;
  std::vector<std::byte> address_;
  bool multi_ = false;
  int efd_ = -1;  // the worker's event descriptor (wait_mode::block), owned by UCX
};

}  // namespace comm::ucx
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/comm/ucx/handles.hpp>
// #include <ebbflow/comm/ucx/transport.hpp>  (inlined here)
// ---- begin <ebbflow/comm/ucx/transport.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file ucx/transport.hpp
//! `comm::ucx::transport`: the `comm::transport` concept over UCX tag
//! matching (shm, CMA and tcp as UCX selects them), with peer-failure
//! handling on.
//!
//! Wire tag (64 bits): [generation mod 2^8 | source rank (16 bits) | low 40
//! bits of the collective tag]. UCX tag matching has no source filter, so the
//! source rank is part of the tag. Collective sequence numbers therefore wrap
//! at 2^24 on the wire (only operations in flight must differ). The elastic
//! group keeps one worker for the whole job and builds a transport per
//! generation on it: the generation bits keep late messages of an older
//! generation from matching (as after `set_generation`). The wire keeps 8
//! bits of the generation: a message of generation g that nobody received is
//! dropped when the worker moves to generation g+128, long before g+256 uses
//! the same bits; the worker drops whatever is left when it is destroyed.
//!
//! Endpoints: transports on one worker share them through the worker's
//! `endpoint_pool`. A transport of generation g+1 that connects to a peer
//! the transport of generation g already reaches reuses that endpoint (no
//! wire-up); the last user closes it.
//!
//! Failure: every endpoint uses `UCP_ERR_HANDLING_MODE_PEER`. When UCX
//! reports a peer's endpoint failed, or a wait finds the process of a peer
//! on this host gone (`probe_peers`, every 50 ms of waiting: UCX's keepalive
//! alone has been seen to miss a dead peer for seconds), the peer is marked
//! lost and the group is broken: every request pending then or posted later
//! fails with `errc::peer_lost`, receives from any peer (cancelled: UCX owns
//! posted receives on the worker and would never fail them) and sends to any
//! peer (abandoned: a live peer's receive for it was cancelled too).
//! `lost_peer()` names the first lost peer.
//!
//! Thread safety: one thread drives a transport and its requests.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/comm/transport.hpp>  (inlined)
// #include <ebbflow/comm/ucx/handles.hpp>  (inlined)
// #include <ebbflow/core/deadline.hpp>  (inlined)
// #include <ebbflow/core/error.hpp>  (inlined)
// #include <ebbflow/core/log.hpp>  (inlined)

#include <sched.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace comm::ucx {

//! Most ranks a transport supports: the collectives' limit (their steps
//! have 16 bits of the tag; the wire tag holds the source rank in 16 more).
inline constexpr int max_ranks = max_collective_ranks;
static_assert(max_ranks <= 1 << 16);

namespace detail {
// What a rank tells its peers at wire-up so that those on the same host can
// read its memory directly (single copy). A pid names a process only within
// one pid namespace: two containers on one host (one boot id) may each run
// a worker as pid 1, and with the same memory layout the probe address too.
// So a peer is local only with the same boot id, pid namespace and network
// namespace (a host as the job sees it: processes in two network namespaces
// talk over the network, as on two hosts), and when the word at `probe` in
// process `pid` holds this transport's random nonce.
struct hello {
  std::uint64_t pid;
  std::uint64_t probe;   // address of the probe word, which holds `nonce`
  std::uint64_t nonce;   // random per transport
  std::uint64_t pid_ns;  // inode of /proc/self/ns/pid (0: unknown)
  std::uint64_t net_ns;  // inode of /proc/self/ns/net (0: unknown)
  char boot_id[40];
};
inline std::uint64_t namespace_inode(const char* path) noexcept {
  struct stat st {};
  return ::stat(path, &st) == 0 ? static_cast<std::uint64_t>(st.st_ino) : 0;
}
inline std::uint64_t random_nonce() noexcept {
  std::uint64_t x = 0;
  if (::getrandom(&x, sizeof x, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof x) || x == 0)
    x = (static_cast<std::uint64_t>(::getpid()) << 32) ^
        static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^ 0xebbf1057a6e5ull;
  return x;
}
//! This process's probe word: a random nonce at one address for the life of
//! the process. Peers on this host read it to test single-copy access at
//! connect time, and later to tell whether the process that said hello is
//! still there (`transport::peer_gone`). It belongs to the process, not to a
//! transport: a live peer that already closed the transport of a failed
//! generation still answers.
inline const std::uint64_t& process_probe() noexcept {
  static const std::uint64_t word = random_nonce();
  return word;
}
//! Whether process `pid` is still the one whose probe word (`process_probe`)
//! was read at `address` holding `nonce`: `there`; `gone` when no such
//! process exists (or only its zombie), or the pid now names a process that
//! holds something else there or has no memory there; `unknown` on any other
//! error, `EPERM` included (a live process may make itself unreadable, e.g.
//! `PR_SET_DUMPABLE`; so a pid taken over by another user's process reads as
//! unknown, and the lease decides).
enum class probe_result { there, gone, unknown };
inline probe_result probe_process(pid_t pid, std::uint64_t address, std::uint64_t nonce) noexcept {
  std::uint64_t v = 0;
  iovec l{&v, sizeof v}, r{reinterpret_cast<void*>(address), sizeof v};
  if (::process_vm_readv(pid, &l, 1, &r, 1, 0) == static_cast<ssize_t>(sizeof v))
    return v == nonce ? probe_result::there : probe_result::gone;
  return errno == ESRCH || errno == EFAULT ? probe_result::gone : probe_result::unknown;
}
inline void read_boot_id(char (&out)[40]) noexcept {
  std::memset(out, 0, sizeof out);
  if (std::FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    const std::size_t got = std::fread(out, 1, sizeof out - 1, f);
    out[got] = 0;
    std::fclose(f);
  }
}
}  // namespace detail

//! The `comm::transport` concept over UCX tag matching: one endpoint per
//! peer on a `worker`, peer failures reported as `errc::peer_lost` (see the
//! file comment). Move-only; one thread drives it and its requests.
class transport {
  struct state;

 public:
  //! A posted send or receive. Move-only; destroying a pending request
  //! cancels it (receives) or abandons it (sends; UCX finishes or fails it).
  class request {
   public:
    request() noexcept = default;
    //! Takes over `o`'s operation; `o` becomes empty (done).
    request(request&& o) noexcept { swap(o); }
    //! Releases this request's operation (as destruction does), then takes over `o`'s.
    request& operator=(request&& o) noexcept {
      request tmp(std::move(o));
      swap(tmp);
      return *this;
    }
    request(const request&) = delete;
    request& operator=(const request&) = delete;
    ~request() { release(); }

    //! After a receive failed with `errc::bad_message`: the sizes, e.g.
    //! "message of 12 bytes for a 20-byte receive buffer" (UCX reports the
    //! sender's length of a message it truncated, too; when it does not,
    //! "message larger than the 20-byte receive buffer"); otherwise empty.
    [[nodiscard]] std::string error_detail() const {
      if (!recv_ || ec_ != errc::bad_message) return {};
      const std::string buffer = std::to_string(len_) + "-byte receive buffer";
      if (got_ == len_) return "message larger than the " + buffer;
      return "message of " + std::to_string(got_) + " bytes for a " + buffer;
    }

   private:
    friend class transport;
    void swap(request& o) noexcept {
      std::swap(st_, o.st_);
      std::swap(ucx_, o.ucx_);
      std::swap(done_, o.done_);
      std::swap(ec_, o.ec_);
      std::swap(peer_, o.peer_);
      std::swap(len_, o.len_);
      std::swap(got_, o.got_);
      std::swap(recv_, o.recv_);
      std::swap(idle_since_, o.idle_since_);
    }
    void release() noexcept;
    state* st_ = nullptr;
    void* ucx_ = nullptr;  // UCX request while in flight
    bool done_ = true;
    std::error_code ec_{};
    int peer_ = -1;
    std::size_t len_ = 0;
    std::size_t got_ = 0;  // a receive's message length as UCX reported it
    bool recv_ = false;
    // When `wait` first found it idle: a wait in slices (a revocable
    // transport's, a communicator with several collectives in flight) goes
    // on counting toward wait_block_after from there, not from each slice.
    steady_clock::time_point idle_since_{};
  };

  //! Connects to every peer: creates endpoints from `addresses` (one per
  //! rank, indexed by rank, each as `worker::address` gave it; this rank's
  //! own is ignored; a malformed one fails with `errc::peer_lost` naming the
  //! peer and the address's size, before UCX sees it) and exchanges an
  //! empty message with each, so every endpoint is wired up (and watched by
  //! keepalive) before the first collective. Blocks until done or `d`.
  //! @throws system_error (peer_lost / timeout naming the peer), std::invalid_argument.
  transport(worker w, std::int64_t generation, int rank, int size, const std::vector<std::vector<std::byte>>& addresses,
            deadline d);
  //! As above, on a worker shared with other (earlier or later) transports:
  //! the elastic layer keeps one worker, and so one address, for the whole
  //! job and builds each generation's endpoints on it. The generation bits of
  //! the wire tag keep late messages of an older generation from matching.
  transport(std::shared_ptr<worker> w, std::int64_t generation, int rank, int size,
            const std::vector<std::vector<std::byte>>& addresses, deadline d);
  //! Starts connecting without blocking: creates the endpoints and posts the
  //! wire-up handshake, which completes as the shared worker is progressed
  //! (by this or any other transport on it, e.g. the generation still
  //! training). Finish with `poll_connect` or `finish_connect` before any
  //! other use. The elastic group connects to joiners this way while it
  //! keeps training. On a multi-threaded worker (`worker::multi_threaded`)
  //! it may run on another thread than the one progressing the worker; the
  //! transport then belongs to the caller of `poll_connect`, which must see
  //! it through a synchronising hand-over (a future, a joined thread).
  //! @throws system_error, std::invalid_argument.
  static transport start(std::shared_ptr<worker> w, std::int64_t generation, int rank, int size,
                         const std::vector<std::vector<std::byte>>& addresses);
  //! Progresses a connect begun by `start` once; true when every peer
  //! answered the handshake (always true for a transport built connected).
  //! Never blocks. @throws system_error (peer_lost naming the peer) when the
  //! handshake failed; the transport is then unusable: every later
  //! `poll_connect` and `finish_connect` throws the same error, and every
  //! send and receive completes at once with it.
  bool poll_connect();
  //! Blocks until a connect begun by `start` completed or `d` passed.
  //! @throws system_error (peer_lost / timeout naming the peer; again on
  //! every call once the connect failed).
  void finish_connect(deadline d);
  //! Takes over the endpoints; the source must not be used afterwards.
  transport(transport&&) noexcept = default;
  //! Takes over the endpoints; the source must not be used afterwards.
  transport& operator=(transport&&) noexcept = default;
  //! Flushes and closes the endpoints (bounded: 1 s, then forced); waits
  //! for what a `start_close` left.
  ~transport();
  //! Starts flushing and closing the endpoints without waiting (a replaced
  //! generation: the members go on with the next one on the same worker,
  //! whose progress also completes these closes). Cancels posted receives.
  //! Use nothing of this transport afterwards except `poll_close` (a send
  //! or receive posted anyway completes at once with `errc::invalid_state`).
  void start_close() noexcept;
  //! Progresses a close begun by `start_close`; true once all endpoints are
  //! closed (or the 1 s bound passed: the rest is cancelled).
  bool poll_close() noexcept;

  //! This rank (0-based).
  [[nodiscard]] int rank() const noexcept { return st_->rank; }
  //! Number of ranks.
  [[nodiscard]] int size() const noexcept { return st_->size; }
  //! Current tag generation.
  [[nodiscard]] std::int64_t generation() const noexcept { return st_->generation; }
  //! Switches the tag generation on the same worker and endpoints. Requests
  //! of the old generation must have completed; late messages of the old
  //! generation will never match. For tests and for keeping a worker across
  //! generations.
  void set_generation(std::int64_t g) noexcept {
    st_->generation = g;
    discard_stale();
  }
  //! The first peer reported lost, or -1.
  [[nodiscard]] int lost_peer() const noexcept { return st_->lost; }
  //! How many of this transport's endpoints it took over from earlier
  //! transports on the same worker rather than opened (see `endpoint_pool`).
  [[nodiscard]] int reused_endpoints() const noexcept { return st_->reused; }
  //! The pid of `peer` when it runs on this host and its memory can be read
  //! with `process_vm_readv` (checked at connect time), else 0. Collectives
  //! use it for single-copy reads between processes of one host.
  [[nodiscard]] pid_t local_peer(int peer) const noexcept {
    return peer >= 0 && static_cast<std::size_t>(peer) < st_->locals.size()
               ? st_->locals[static_cast<std::size_t>(peer)].pid
               : 0;
  }
  //! True when `peer` runs on this host (`local_peer`) and the process that
  //! said hello at connect time is provably gone: its pid no longer exists,
  //! or no longer holds that process's probe word (the pid was reused; see
  //! `detail::probe_process`). A stopped or hung process is not gone. One
  //! `process_vm_readv`, no UCX call: safe after a revoke. False for remote
  //! peers, whose death only their transport or their lease can tell.
  [[nodiscard]] bool peer_gone(int peer) const noexcept;
  //! Marks `peer` lost (e.g. a single-copy read found its process gone):
  //! from now on it behaves as if UCX had reported the failure.
  void mark_lost(int peer) noexcept { lose(st_.get(), peer, "its process is gone"); }
  //! Asks every peer on this host not yet known lost whether its process
  //! is gone (`peer_gone`), and marks those that are lost. Returns whether
  //! it found one. No UCX call; one `process_vm_readv` per such peer.
  //! `wait` does it every `probe_interval` of waiting (and `test`, polled
  //! for as long); the communicator again before it reports a timeout.
  bool probe_peers() noexcept;
  //! How often a waiting (or polling) transport probes its peers on this host.
  static constexpr std::chrono::milliseconds probe_interval{50};

  //! Posts a send of `out` (host memory, valid until the request completed)
  //! to `peer`; never blocks. Once a peer was lost (any peer: the group is
  //! broken), it completes at once with `errc::peer_lost`.
  //! @throws std::invalid_argument for a bad `peer`.
  request isend(int peer, tag_t tag, std::span<const std::byte> out);
  //! Posts a receive into `in` (host memory, valid until the request
  //! completed) from `peer`; never blocks. A size mismatch completes it with
  //! `errc::bad_message` (sizes in `request::error_detail`). Once a peer was
  //! lost, it completes at once with `errc::peer_lost`.
  //! @throws std::invalid_argument for a bad `peer`.
  request irecv(int peer, tag_t tag, std::span<std::byte> in);
  //! Drives UCX once; true once `r` completed (then `ec` holds its outcome).
  //! Never blocks.
  bool test(request& r, std::error_code& ec);
  //! Blocks until `r` completed (`ec` = its outcome) or `d` passed (`ec` =
  //! `errc::timeout`; `r` stays pending). Busy-polls for ~50 us (not at all
  //! when the host is oversubscribed), then yields the core between polls
  //! and sleeps on the worker's events as its `wait_mode` says (by default
  //! after 2 ms).
  void wait(request& r, deadline d, std::error_code& ec);
  //! Drives UCX once; returns whether anything happened.
  bool progress();

 private:
  struct state {
    std::shared_ptr<worker> w;  // shared: a worker may serve several generations in turn
    int rank = 0, size = 1;
    std::int64_t generation = 0;
    // Set by the error callback, which runs in whichever thread progresses
    // the worker: with a multi-threaded worker a transport may be started on
    // one thread while another progresses (see `start`).
    std::atomic<int> lost{-1};
    std::atomic<bool> cancel_pending{false};
    steady_clock::time_point next_probe{};  // when a waiting or polling caller probes local peers next
    unsigned idle_tests = 0;                // tests that found their request pending
    std::vector<std::uint8_t> abandoned;  // by peer: sends it will never answer
    std::vector<std::uint8_t> undrained;  // by peer: an abandoned receive still written after 1 s
    std::vector<ucp_ep_h> eps;
    std::vector<endpoint_pool::ref> refs;  // this transport's holds on the worker's endpoints
    int reused = 0;                        // endpoints taken over from earlier transports
    std::vector<std::atomic<std::uint8_t>> dead;
    std::unordered_set<void*> pending_recvs;  // UCX receive requests in flight
    std::vector<void*> closing;               // endpoint closes in flight (start_close)
    bool close_started = false;
    steady_clock::time_point close_until{};
    //! A peer on this host whose memory can be read: its pid (0: not such a
    //! peer), where its probe word is and what it held at connect time.
    struct local_process {
      pid_t pid = 0;              //!< `local_peer()`
      std::uint64_t address = 0;  //!< where the peer's `process_probe` is
      std::uint64_t nonce = 0;    //!< what it held at connect time
    };
    std::vector<local_process> locals;  // by peer
    bool oversubscribed = false;        // more local ranks than usable cores
    struct handshake;                   // while connecting (see `start`)
    std::unique_ptr<handshake> connecting;
    std::error_code connect_failed{};  // set when the handshake failed: the endpoints are closed
    int connect_failed_peer = -1;
    explicit state(std::shared_ptr<worker> wk) : w(std::move(wk)) {}
    ~state();
  };
  struct deferred_t {};
  transport(std::shared_ptr<worker> w, std::int64_t generation, int rank, int size,
            const std::vector<std::vector<std::byte>>& addresses, deferred_t);
  void fail_connect(std::error_code ec, int peer);
  // Moves the handshake to its second round; true once it had (see the definition).
  bool next_handshake_round();
  void finish_handshake() noexcept;
  // `isend`; with `sync` a synchronous send (complete once the peer matched it).
  request post_send(int peer, tag_t tag, std::span<const std::byte> out, bool sync);

  // The endpoint pool's error callback (ctx: this transport's state).
  static void on_peer_error(void* ctx, int peer, ucs_status_t status) noexcept {
    lose(static_cast<state*>(ctx), peer, ucs_status_string(status));
  }
  // Marks `peer` lost (the first one is `lost`); `why` goes to the log.
  static void lose(state* st, int peer, const char* why) noexcept {
    if (!st->dead[static_cast<std::size_t>(peer)].exchange(1)) {
      int none = -1;
      st->lost.compare_exchange_strong(none, peer);
      // Cancelling from inside progress is avoided: done on the next test/wait.
      st->cancel_pending = true;
      EBBFLOW_LOG_WARN("ucx: peer " << peer << " lost (" << why << ") [rank " << st->rank << ", generation "
                                    << st->generation << "]");
    }
  }
  // Generation g+256 has the wire tag bits of g. A message of g that nobody
  // received (a failed step's, in flight when its generation ended) would
  // match there, so it is dropped earlier: when this worker moves to g+128.
  // No peer is 128 generations ahead, so none of g+128's own messages (its
  // peers' hellos may come before this transport exists) can be dropped.
  void discard_stale() noexcept {
    const auto bits = static_cast<ucp_tag_t>(st_->generation + 128) & 0xff;
    if (const auto n = st_->w->discard_unexpected(bits << 56, ucp_tag_t{0xff} << 56,
                                                  deadline::after(std::chrono::milliseconds(10))))
      EBBFLOW_LOG_DEBUG("ucx: dropped " << n << " unreceived message(s) of generation " << st_->generation - 128
                                        << " [rank " << st_->rank << "]");
  }
  ucp_tag_t wire_tag(int src, tag_t tag) const noexcept {
    return (static_cast<ucp_tag_t>(st_->generation) & 0xff) << 56 | (static_cast<ucp_tag_t>(src) & 0xffff) << 40 |
           (tag & ((ucp_tag_t{1} << 40) - 1));
  }
  void check_peer(int peer) const {
    EBBFLOW_ENFORCE(peer >= 0 && peer < st_->size && peer != st_->rank,
                    "ucx transport: peer " << peer << " invalid for rank " << st_->rank << " of " << st_->size);
  }
  // Sends and receives in a broken group (a peer lost: its receives were
  // cancelled, so a later one would wait for a peer that gave up) or on
  // closed endpoints (a failed connect, `start_close`) never reach UCX: they
  // complete at once with why.
  [[nodiscard]] std::error_code unusable() const noexcept {
    if (st_->lost >= 0) return make_error_code(error::peer_lost);
    if (st_->connect_failed) return st_->connect_failed;
    if (st_->close_started) return make_error_code(error::invalid_state);
    return {};
  }
  [[noreturn]] void throw_connect_failed() const {
    throw_if(st_->connect_failed, {.rank = st_->rank,
                                   .generation = st_->generation,
                                   .peer = st_->connect_failed_peer,
                                   .operation = "ucx connect",
                                   .detail = "the connect failed earlier; the transport is unusable"});
    std::abort();  // unreachable: connect_failed is set
  }
  // `probe_peers` when `probe_interval` passed since the last time.
  bool probe_if_due(steady_clock::time_point now) noexcept {
    if (now < st_->next_probe) return false;
    st_->next_probe = now + probe_interval;
    return probe_peers();
  }
  void cancel_all_receives() noexcept {
    st_->cancel_pending = false;
    for (void* r : st_->pending_recvs) ucp_request_cancel(st_->w->get(), r);
  }
  void complete(request& r) noexcept;
  void close_endpoints() noexcept;

  std::unique_ptr<state> st_;
};
static_assert(comm::transport<transport>);

}  // namespace comm::ucx
EBBFLOW_END_NAMESPACE

// #include <ebbflow/comm/ucx/impl/transport.hpp>  (inlined here)
// ---- begin <ebbflow/comm/ucx/impl/transport.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file ucx/impl/transport.hpp
//! Definitions of comm/ucx/transport.hpp: requests, the connect handshake
//! (wire-up and single-copy access), close, peer probing and loss, send,
//! receive, progress and wait.


// #include <ebbflow/comm/ucx/transport.hpp>  (inlined)

EBBFLOW_BEGIN_NAMESPACE
namespace comm::ucx {

inline void transport::request::release() noexcept {
  if (!ucx_) return;
  if (recv_) {
    st_->pending_recvs.erase(ucx_);
    if (ucp_request_check_status(ucx_) == UCS_INPROGRESS) {
      ucp_request_cancel(st_->w->get(), ucx_);
      // A receive UCX has matched cannot be cancelled: it goes on writing
      // into its buffer, which the owner reuses or frees once this returns
      // (an abandoned collective's scratch, or the gradients of the step
      // redone after a failure). Drive it to its end first: the sender is
      // sending, or fails. A sender stopped mid-transfer leaves it running
      // after 1 s: its endpoint is then closed by force with this transport
      // (and its other abandoned receives wait no more).
      const auto p = static_cast<std::size_t>(peer_);
      const auto until = steady_clock::now() + (st_->undrained[p] ? std::chrono::seconds(0) : std::chrono::seconds(1));
      while (ucp_request_check_status(ucx_) == UCS_INPROGRESS && steady_clock::now() < until)
        ucp_worker_progress(st_->w->get());
      if (ucp_request_check_status(ucx_) == UCS_INPROGRESS) {
        st_->abandoned[p] = st_->undrained[p] = 1;
        EBBFLOW_LOG_ERROR("ucx: an abandoned receive of " << len_ << " bytes from peer " << peer_
                                                          << " is still being written after 1 s [rank " << st_->rank
                                                          << ", generation " << st_->generation << "]");
      }
    }
  } else if (ucp_request_check_status(ucx_) == UCS_INPROGRESS) {
    st_->abandoned[static_cast<std::size_t>(peer_)] = 1;  // only a forced close can retire it now
  }
  ucp_request_free(ucx_);
  ucx_ = nullptr;
}

inline transport::transport(worker w, std::int64_t generation, int rank, int size,
                            const std::vector<std::vector<std::byte>>& addresses, deadline d)
    : transport(std::make_shared<worker>(std::move(w)), generation, rank, size, addresses, d) {}

//! The wire-up handshake of a connecting transport: heap-held, so the
//! buffers the posted requests use stay put when the transport moves.
struct transport::state::handshake {
  detail::hello mine{};               //!< what this rank tells every peer
  std::vector<detail::hello> theirs;  //!< what each peer told (by rank)
  std::vector<request> reqs;          //!< the posted sends and receives of this round
  std::vector<int> peers;             //!< the peer of each request
  int round = 0;                      //!< 0: hellos (synchronous sends), 1: ready
};
inline transport::state::~state() = default;

inline transport::transport(std::shared_ptr<worker> w, std::int64_t generation, int rank, int size,
                            const std::vector<std::vector<std::byte>>& addresses, deadline d)
    : transport(std::move(w), generation, rank, size, addresses, deferred_t{}) {
  finish_connect(d);
}

inline transport transport::start(std::shared_ptr<worker> w, std::int64_t generation, int rank, int size,
                                  const std::vector<std::vector<std::byte>>& addresses) {
  return transport(std::move(w), generation, rank, size, addresses, deferred_t{});
}

inline transport::transport(std::shared_ptr<worker> w, std::int64_t generation, int rank, int size,
                            const std::vector<std::vector<std::byte>>& addresses, deferred_t)
    : st_(std::make_unique<state>(std::move(w))) {
  EBBFLOW_ENFORCE(st_->w != nullptr, "ucx transport: null worker");
  EBBFLOW_ENFORCE(size >= 1 && size <= max_ranks && rank >= 0 && rank < size,
                  "ucx transport: rank " << rank << " / size " << size << " invalid (size <= " << max_ranks << ")");
  EBBFLOW_ENFORCE(addresses.size() == static_cast<std::size_t>(size),
                  "ucx transport: " << addresses.size() << " addresses for " << size << " ranks");
  st_->rank = rank;
  st_->size = size;
  st_->generation = generation;
  discard_stale();
  const auto n = static_cast<std::size_t>(size);
  st_->eps.assign(n, nullptr);
  st_->refs.assign(n, {});
  st_->abandoned.assign(n, 0);
  st_->undrained.assign(n, 0);
  st_->dead = std::vector<std::atomic<std::uint8_t>>(n);
  st_->locals.assign(n, {});
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    auto& ref = st_->refs[static_cast<std::size_t>(p)];
    const auto& framed = addresses[static_cast<std::size_t>(p)];
    std::string why;
    const auto address = detail::unframe_address(framed, why);
    if (address.empty()) {
      // Refused before UCX parses it (UCX asserts on a malformed address).
      // A peer whose address is unusable cannot be reached: lost, as below.
      close_endpoints();
      throw system_error(make_error_code(error::peer_lost),
                         {.rank = rank,
                          .generation = generation,
                          .peer = p,
                          .operation = "ucx connect",
                          .detail = "malformed worker address of " + std::to_string(framed.size()) + " bytes: " + why});
    }
    const ucs_status_t s =
        st_->w->endpoints().acquire(st_->w->get(), address, &transport::on_peer_error, st_.get(), p, ref);
    if (s != UCS_OK) {
      // The address is the peer's own: when it cannot be reached (its shared
      // memory is gone, its host refuses) the peer is as good as lost, and
      // the elastic layer must fail over rather than give up.
      close_endpoints();
      throw system_error(make_error_code(error::peer_lost), {.rank = rank,
                                                             .generation = generation,
                                                             .peer = p,
                                                             .operation = "ucp_ep_create",
                                                             .detail = ucs_status_string(s)});
    }
    st_->eps[static_cast<std::size_t>(p)] = ref.ep;
    st_->reused += ref.reused;
  }
  // Wire-up handshake on tags collectives never use (step 0xfffe), in two
  // rounds (see `next_handshake_round`). Each rank also tells its pid, boot
  // id and the address of a probe word, so peers on the same host can use
  // single-copy reads (see `local_peer`).
  const tag_t hello = make_tag(0xffffffffu, 0xfffe);
  st_->connecting = std::make_unique<state::handshake>();
  auto& hs = *st_->connecting;
  hs.mine.pid = static_cast<std::uint64_t>(::getpid());
  hs.mine.probe = reinterpret_cast<std::uint64_t>(&detail::process_probe());
  hs.mine.nonce = detail::process_probe();
  hs.mine.pid_ns = detail::namespace_inode("/proc/self/ns/pid");
  hs.mine.net_ns = detail::namespace_inode("/proc/self/ns/net");
  detail::read_boot_id(hs.mine.boot_id);
  hs.theirs.resize(n);
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    hs.reqs.push_back(irecv(p, hello, std::as_writable_bytes(std::span(&hs.theirs[static_cast<std::size_t>(p)], 1))));
    hs.peers.push_back(p);
    // Synchronous on a new endpoint only (see `next_handshake_round`).
    const bool fresh = !st_->refs[static_cast<std::size_t>(p)].reused;
    hs.reqs.push_back(post_send(p, hello, std::as_bytes(std::span(&hs.mine, 1)), fresh));
    hs.peers.push_back(p);
  }
}

inline bool transport::next_handshake_round() {
  // UCX 1.13 wires an endpoint up lazily: the first send that needs the
  // peer's endpoint id (a rendezvous, i.e. the first large message, or a
  // synchronous send) puts a proxy on the endpoint and sends a wire-up
  // request, which the peer answers. Two hazards follow when that happens
  // in the middle of a collective (the first large allreduce). An answer
  // queued behind a full shared-memory FIFO (a peer busy with a burst of
  // rendezvous headers, or dead) is still queued when the endpoint is
  // failed or closed by force, and UCX 1.13.1 aborts purging it
  // (ucp_request.c:684 "got REP message"; removed upstream later). And a
  // survivor whose endpoint to a peer that died was still being wired up
  // was seen to learn nothing of the death until its deadline. So the
  // hellos on new endpoints are synchronous sends, which wire them up now,
  // and a second round of empty messages tells each rank that its peers'
  // hellos completed: every answer it owed them has left, none stays
  // queued. An endpoint taken over from an earlier transport on this worker
  // was wired up by that one's handshake; its hello goes as before, since
  // the peer's end of it may belong to a transport the peer has closed
  // since (the elastic group's blocking switch: one side keeps its
  // endpoints, the other opens new ones), where a synchronous send would
  // wait for an answer that never comes. A message needs no endpoint at the
  // receiving side; an answer (a synchronous send's, a rendezvous's) does.
  auto& hs = *st_->connecting;
  if (hs.round == 1) return true;
  hs.round = 1;
  hs.reqs.clear();
  hs.peers.clear();
  const tag_t ready = make_tag(0xfffffffeu, 0xfffe);
  for (int p = 0; p < st_->size; ++p) {
    if (p == st_->rank) continue;
    hs.reqs.push_back(irecv(p, ready, {}));
    hs.peers.push_back(p);
    hs.reqs.push_back(isend(p, ready, {}));
    hs.peers.push_back(p);
  }
  return false;
}

inline void transport::fail_connect(std::error_code ec, int peer) {
  // A lost peer cancels every pending receive, a live peer's hello too:
  // the error names the peer that was lost, not the first request it failed.
  if (ec == errc::peer_lost && st_->lost >= 0) peer = st_->lost;
  st_->connecting.reset();  // releases (cancels) the outstanding handshake requests
  st_->connect_failed = ec;
  st_->connect_failed_peer = peer;
  close_endpoints();
  throw_if(ec, {.rank = st_->rank, .generation = st_->generation, .peer = peer, .operation = "ucx connect"});
}

inline bool transport::poll_connect() {
  if (st_->connect_failed) throw_connect_failed();
  if (!st_->connecting) return true;
  auto& hs = *st_->connecting;
  for (;;) {
    bool all = true;
    for (std::size_t i = 0; i < hs.reqs.size(); ++i) {
      std::error_code ec;
      if (!test(hs.reqs[i], ec)) {
        all = false;
        continue;
      }
      if (ec) fail_connect(ec, hs.peers[i]);
    }
    if (!all) return false;
    if (next_handshake_round()) break;
  }
  finish_handshake();
  return true;
}

inline void transport::finish_connect(deadline d) {
  if (st_->connect_failed) throw_connect_failed();
  if (!st_->connecting) return;
  auto& hs = *st_->connecting;
  do {
    for (std::size_t i = 0; i < hs.reqs.size(); ++i) {
      std::error_code ec;
      wait(hs.reqs[i], d, ec);
      if (ec) fail_connect(ec, hs.peers[i]);
    }
  } while (!next_handshake_round());
  finish_handshake();
}

inline void transport::finish_handshake() noexcept {
  const auto hs = std::move(st_->connecting);
  const int size = st_->size, rank = st_->rank;
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    const auto& h = hs->theirs[static_cast<std::size_t>(p)];
    // Same boot, pid and network namespaces, and the kernel lets us read the
    // peer's nonce where it said: single-copy capable (see detail::hello).
    if (std::memcmp(h.boot_id, hs->mine.boot_id, sizeof hs->mine.boot_id) == 0 && hs->mine.boot_id[0] &&
        h.pid_ns == hs->mine.pid_ns && h.net_ns == hs->mine.net_ns) {
      if (detail::probe_process(static_cast<pid_t>(h.pid), h.probe, h.nonce) == detail::probe_result::there)
        st_->locals[static_cast<std::size_t>(p)] = {static_cast<pid_t>(h.pid), h.probe, h.nonce};
    }
  }
  int local = 1;
  for (const auto& l : st_->locals) local += l.pid != 0;
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  const int cores = ::sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  st_->oversubscribed = local > cores;
  EBBFLOW_LOG_DEBUG("ucx: generation " << st_->generation << ": " << local - 1 << " of " << size - 1
                                       << " peers on this host (single-copy reads) [rank " << rank << "]");
}

inline bool transport::peer_gone(int peer) const noexcept {
  if (local_peer(peer) == 0) return false;
  const auto& l = st_->locals[static_cast<std::size_t>(peer)];
  return detail::probe_process(l.pid, l.address, l.nonce) == detail::probe_result::gone;
}

inline bool transport::probe_peers() noexcept {
  bool found = false;
  for (int p = 0; p < st_->size; ++p) {
    if (p == st_->rank || st_->dead[static_cast<std::size_t>(p)] || !peer_gone(p)) continue;
    lose(st_.get(), p, "its process is gone; found by probe, UCX had not reported it");
    found = true;
  }
  return found;
}

inline transport::~transport() {
  if (!st_) return;
  st_->connecting.reset();
  close_endpoints();
}

inline void transport::start_close() noexcept {
  if (!st_ || st_->close_started) return;
  st_->connecting.reset();
  st_->close_started = true;
  st_->close_until = steady_clock::now() + std::chrono::seconds(1);
  if (st_->pending_recvs.size()) cancel_all_receives();
  const bool broken = st_->lost >= 0 || std::ranges::any_of(st_->abandoned, [](std::uint8_t a) { return a != 0; });
  for (std::size_t p = 0; p < st_->eps.size(); ++p) {
    st_->eps[p] = nullptr;
    // An endpoint a later transport also uses stays open for it. The last
    // user closes it: a healthy group flushes what is queued; a broken one
    // (a peer lost, or sends abandoned by a failed collective, whose
    // rendezvous the peer will never answer) closes by force, which fails
    // everything outstanding (UCX asserts when a worker dies with requests
    // still on an endpoint).
    const auto c = st_->w->endpoints().release(st_->refs[p], st_.get(), st_->dead[p] || st_->abandoned[p], broken);
    if (!c.ep) continue;
    ucp_request_param_t prm{};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = c.force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    ucs_status_ptr_t r = ucp_ep_close_nbx(c.ep, &prm);
    if (UCS_PTR_IS_PTR(r)) st_->closing.push_back(r);
  }
}

inline bool transport::poll_close() noexcept {
  if (!st_) return true;
  if (!st_->close_started) start_close();
  ucp_worker_progress(st_->w->get());
  const bool late = steady_clock::now() >= st_->close_until;
  auto& c = st_->closing;
  if (late && !c.empty())
    EBBFLOW_LOG_WARN("ucx: " << c.size() << " endpoint close(s) of generation " << st_->generation
                             << " not done after 1 s: cancelled (a peer that does not answer) [rank " << st_->rank
                             << "]");
  for (std::size_t i = 0; i < c.size();) {
    if (ucp_request_check_status(c[i]) == UCS_INPROGRESS && !late) {
      ++i;
      continue;
    }
    if (ucp_request_check_status(c[i]) == UCS_INPROGRESS) ucp_request_cancel(st_->w->get(), c[i]);
    ucp_request_free(c[i]);
    c[i] = c.back();
    c.pop_back();
  }
  return c.empty();
}

inline void transport::close_endpoints() noexcept {
  start_close();  // no-op when already started
  while (!poll_close()) {
  }
}

inline transport::request transport::isend(int peer, tag_t tag, std::span<const std::byte> out) {
  return post_send(peer, tag, out, false);
}

inline transport::request transport::post_send(int peer, tag_t tag, std::span<const std::byte> out, bool sync) {
  check_peer(peer);
  request r;
  r.st_ = st_.get();
  r.peer_ = peer;
  r.len_ = out.size();
  if (const auto ec = unusable()) {
    r.ec_ = ec;
    return r;
  }
  ucp_request_param_t prm{};
  const auto send = sync ? &ucp_tag_send_sync_nbx : &ucp_tag_send_nbx;
  ucs_status_ptr_t p =
      send(st_->eps[static_cast<std::size_t>(peer)], out.data(), out.size(), wire_tag(st_->rank, tag), &prm);
  if (UCS_PTR_IS_ERR(p)) {
    r.ec_ = make_error(UCS_PTR_STATUS(p));
  } else if (p != nullptr) {
    r.ucx_ = p;
    r.done_ = false;
  }
  return r;
}

inline transport::request transport::irecv(int peer, tag_t tag, std::span<std::byte> in) {
  check_peer(peer);
  request r;
  r.st_ = st_.get();
  r.peer_ = peer;
  r.len_ = in.size();
  r.recv_ = true;
  if (const auto ec = unusable()) {
    r.ec_ = ec;
    return r;
  }
  ucp_request_param_t prm{};
  ucs_status_ptr_t p = ucp_tag_recv_nbx(st_->w->get(), in.data(), in.size(), wire_tag(peer, tag), ~ucp_tag_t{0}, &prm);
  if (UCS_PTR_IS_ERR(p)) {
    r.ec_ = make_error(UCS_PTR_STATUS(p));
  } else if (p != nullptr) {
    r.ucx_ = p;
    r.done_ = false;
    st_->pending_recvs.insert(p);
  }
  return r;
}

inline void transport::complete(request& r) noexcept {
  if (r.done_) return;
  ucs_status_t s;
  std::size_t got = r.len_;
  if (r.recv_) {
    // UCX fills `info` once the receive completed, also when it truncated
    // the message (UCS_ERR_MESSAGE_TRUNCATED): `length` is then the sender's.
    ucp_tag_recv_info_t info{};
    info.length = r.len_;
    s = ucp_tag_recv_request_test(r.ucx_, &info);
    got = info.length;
  } else {
    s = ucp_request_check_status(r.ucx_);
  }
  if (s == UCS_INPROGRESS) return;
  r.done_ = true;
  if ((s == UCS_OK && got != r.len_) || s == UCS_ERR_MESSAGE_TRUNCATED) {
    r.got_ = got;
    r.ec_ = make_error_code(error::bad_message);
  } else if (s == UCS_ERR_CANCELED && st_->lost >= 0) {
    r.ec_ = make_error_code(error::peer_lost);  // cancelled because a peer died
  } else if (s != UCS_OK && st_->dead[static_cast<std::size_t>(r.peer_)]) {
    r.ec_ = make_error_code(error::peer_lost);  // UCX says reset, i/o error, timeout...: one condition
  } else if (s != UCS_OK) {
    r.ec_ = make_error(s);
  }
  if (r.recv_) st_->pending_recvs.erase(r.ucx_);
  ucp_request_free(r.ucx_);
  r.ucx_ = nullptr;
}

inline bool transport::progress() {
  const bool any = ucp_worker_progress(st_->w->get()) != 0;
  if (st_->cancel_pending) cancel_all_receives();
  return any;
}

inline bool transport::test(request& r, std::error_code& ec) {
  if (!r.done_) {
    progress();
    complete(r);
    if (!r.done_ && !r.recv_ && st_->lost >= 0) {
      // A send in a broken group that UCX has not failed yet: to the lost
      // peer, or to a live one whose receive for it was cancelled (a
      // rendezvous that nobody will ever fetch). Abandoned: its endpoint is
      // closed by force.
      r.release();
      r.done_ = true;
      r.ec_ = make_error_code(error::peer_lost);
    }
    // Polled without `wait` (a caller overlapping work): probe now and then too.
    if (!r.done_ && (++st_->idle_tests & 1023) == 0) (void)probe_if_due(steady_clock::now());
  }
  if (r.done_) ec = r.ec_;
  return r.done_;
}

inline void transport::wait(request& r, deadline d, std::error_code& ec) {
  // Busy-poll (latency) for ~50 us, then yield the core between polls, then
  // (wait_mode: after wait_block_after, or at once) sleep on the worker's
  // events. When this host runs more ranks than this process may use cores
  // (oversubscribed), skip the busy-poll: a spinning rank would only steal
  // the time slice the peer it waits for needs. A sleeping thread, unlike a
  // yielding one, uses no CPU, and on a shared core it is woken when its
  // data arrives, where a yielding one may wait for another process's time
  // slice to end.
  const wait_mode mode = st_->w->waits();
  const bool spin = !st_->oversubscribed;
  unsigned spins = 0;
  steady_clock::time_point spin_until{}, block_from{};
  while (!test(r, ec)) {
    if (spin && (++spins & 63) != 0) continue;
    const auto now = steady_clock::now();
    // Past the busy-poll: a peer found gone fails `r` at the next test.
    if (spin_until != steady_clock::time_point{} && now >= spin_until && probe_if_due(now)) continue;
    if (now >= d.at()) {
      ec = make_error_code(error::timeout);
      return;
    }
    if (spin_until == steady_clock::time_point{}) {
      spin_until = spin ? now + std::chrono::microseconds(50) : now;
      if (r.idle_since_ == steady_clock::time_point{}) r.idle_since_ = spin_until;
      block_from = r.idle_since_ + (mode == wait_mode::automatic ? wait_block_after : std::chrono::microseconds(0));
    }
    if (now < spin_until) continue;
    // At most 1 ms asleep: another thread of a shared worker may take this
    // wait's event, and UCX's keepalive (a dead peer) runs in progress.
    if (mode == wait_mode::yield || now < block_from ||
        !st_->w->block(std::min<std::chrono::nanoseconds>(d.at() - now, std::chrono::milliseconds(1))))
      sched_yield();
  }
}

}  // namespace comm::ucx
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/comm/ucx/impl/transport.hpp>
// ---- end <ebbflow/comm/ucx/transport.hpp>
// #include <ebbflow/core/deadline.hpp>  (inlined)
// #include <ebbflow/core/error.hpp>  (inlined)

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <thread>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace comm::ucx {

//! `x(generation, rank, size, my_address, deadline)` publishes `my_address`
//! for (generation, rank) and returns all `size` addresses indexed by rank
//! (its own included), blocking until every rank published or the deadline
//! passed (then throws `system_error` with `errc::timeout` naming a missing
//! rank).
template <class X>
concept address_exchange = requires(X& x, std::int64_t g, int rank, int size, std::span<const std::byte> mine,
                                    deadline d) {
  { x(g, rank, size, mine, d) } -> std::same_as<std::vector<std::vector<std::byte>>>;
};

//! Exchange through files `<dir>/g<generation>.r<rank>.addr`, written to a
//! temporary name and renamed, so readers never see a partial file. Polls
//! every millisecond. Thread-safe for distinct ranks.
class file_address_exchange {
 public:
  //! Exchanges through files in `dir`, a directory every rank can reach (e.g.
  //! a shared or node-local filesystem); touches nothing until called.
  explicit file_address_exchange(std::filesystem::path dir) : dir_(std::move(dir)) {}

  //! Publishes `mine` for (`generation`, `rank`) and returns all `size`
  //! addresses indexed by rank, blocking (polling) until every rank published
  //! or `d` passed. @throws system_error (`errc::timeout` naming a missing
  //! rank), std::invalid_argument when the file cannot be written,
  //! std::filesystem::filesystem_error when the rename fails.
  std::vector<std::vector<std::byte>> operator()(std::int64_t generation, int rank, int size,
                                                 std::span<const std::byte> mine, deadline d) const {
    namespace fs = std::filesystem;
    // Built by appending: GCC 12 at -O3 reports a false -Wrestrict on
    // `"literal" + std::to_string(...)` (GCC bug 105651), which breaks -Werror users.
    auto name = [&](int r) {
      std::string file = "g";
      file += std::to_string(generation);
      file += ".r";
      file += std::to_string(r);
      file += ".addr";
      return dir_ / file;
    };
    const fs::path tmp = name(rank).string() + ".tmp";
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      f.write(reinterpret_cast<const char*>(mine.data()), static_cast<std::streamsize>(mine.size()));
      f.close();
      EBBFLOW_ENFORCE(f.good(), "file_address_exchange: cannot write " << tmp);
    }
    fs::rename(tmp, name(rank));
    std::vector<std::vector<std::byte>> all(static_cast<std::size_t>(size));
    for (int r = 0; r < size; ++r) {
      for (;;) {
        std::ifstream f(name(r), std::ios::binary);
        if (f) {
          std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
          auto& out = all[static_cast<std::size_t>(r)];
          out.resize(bytes.size());
          for (std::size_t i = 0; i < bytes.size(); ++i) out[i] = static_cast<std::byte>(bytes[i]);
          break;
        }
        if (d.expired())
          throw_if(make_error_code(error::timeout), {.rank = rank,
                                                     .generation = generation,
                                                     .peer = r,
                                                     .operation = "address exchange",
                                                     .detail = name(r).string()});
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    return all;
  }

 private:
  std::filesystem::path dir_;
};
static_assert(address_exchange<file_address_exchange>);

//! Builds this rank's UCX transport for `generation`: a fresh worker on
//! `ctx`, its address published and everyone's fetched through `exchange`,
//! then endpoints to every peer, all before `d`. @throws system_error.
template <address_exchange X>
transport connect(const std::shared_ptr<context>& ctx, X& exchange, std::int64_t generation, int rank, int size,
                  deadline d) {
  worker w(ctx);
  auto addrs = exchange(generation, rank, size, w.address(), d);
  return transport(std::move(w), generation, rank, size, addrs, d);
}

}  // namespace comm::ucx
EBBFLOW_END_NAMESPACE
#endif  // EBBFLOW_HAS_UCX
// ==== end <ebbflow/comm/ucx/address_exchange.hpp>

// ==== begin <ebbflow/compress.hpp> ========================================
// SPDX-License-Identifier: Apache-2.0
//! @file compress.hpp
//! Umbrella header of the compression piece: codecs, compressed allreduce,
//! bucket manager. Host-compiler safe; device paths are in the .cuh files.


// #include <ebbflow/compress/bucket.hpp>  (inlined here)
// ---- begin <ebbflow/compress/bucket.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file bucket.hpp
//! Tensor fusion: packs many small gradient tensors into a few flat buckets
//! (Horovod tensor fusion, PyTorch DDP buckets) so that each bucket is one
//! compressed allreduce, large enough to compress well and to amortise the
//! per-collective latency.
//!
//! Tensors are assigned in registration order (for DDP: reverse order of the
//! backward pass, so the first bucket fills first) and a bucket closes when
//! adding the next tensor would exceed `bucket_bytes`; a tensor larger than
//! the cap gets a bucket of its own. `mark_ready(t)` reports the bucket that
//! became complete, so a caller can start its allreduce while backward still
//! runs. Host memory. Not thread-safe (one training thread).


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/error.hpp>  (inlined)

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <optional>
#include <span>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace compress {

//! Assigns tensors to fused float buckets (see the file comment) and owns
//! the bucket buffers (host memory). Not thread-safe.
class bucket_manager {
 public:
  //! Where tensor `i` lives inside its bucket.
  struct slot {
    std::size_t bucket = 0, offset = 0, size = 0;
    //! @var bucket
    //! Index of the bucket holding the tensor.
    //! @var offset
    //! First element of the tensor within its bucket.
    //! @var size
    //! Element count of the tensor.
  };

  //! `sizes[i]` = element count of tensor i. @throws std::invalid_argument if bucket_bytes < 4.
  bucket_manager(std::span<const std::size_t> sizes, std::size_t bucket_bytes) {
    EBBFLOW_ENFORCE(bucket_bytes >= sizeof(float), "bucket_bytes " << bucket_bytes << " below one float");
    const std::size_t cap = bucket_bytes / sizeof(float);
    slots_.reserve(sizes.size());
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      if (buckets_.empty() || (fill_ > 0 && fill_ + sizes[i] > cap)) {
        buckets_.push_back({});
        fill_ = 0;
      }
      slots_.push_back({buckets_.size() - 1, fill_, sizes[i]});
      buckets_.back().tensors.push_back(i);
      fill_ += sizes[i];
      buckets_.back().data.resize(fill_);
    }
    pending_.resize(buckets_.size());
    reset_ready();
  }

  //! Number of buckets.
  [[nodiscard]] std::size_t bucket_count() const noexcept { return buckets_.size(); }
  //! Number of registered tensors.
  [[nodiscard]] std::size_t tensor_count() const noexcept { return slots_.size(); }
  //! Where `tensor` lives. @throws std::out_of_range for an unknown tensor.
  [[nodiscard]] const slot& slot_of(std::size_t tensor) const { return slots_.at(tensor); }
  //! Tensors of bucket b, in registration order.
  [[nodiscard]] std::span<const std::size_t> tensors_of(std::size_t b) const { return buckets_.at(b).tensors; }
  //! The fused buffer of bucket b (host memory, owned by the manager).
  [[nodiscard]] std::span<float> bucket(std::size_t b) { return buckets_.at(b).data; }

  //! Copies tensor `t` (host memory, `slot_of(t).size` floats) into its bucket.
  void pack(std::size_t t, std::span<const float> grad) {
    const slot& s = slots_.at(t);
    EBBFLOW_ENFORCE(grad.size() == s.size,
                    "tensor " << t << " has " << grad.size() << " elements, registered " << s.size);
    if (s.size) std::memcpy(buckets_[s.bucket].data.data() + s.offset, grad.data(), s.size * sizeof(float));
  }
  //! Copies tensor `t` back out of its bucket.
  void unpack(std::size_t t, std::span<float> grad) const {
    const slot& s = slots_.at(t);
    EBBFLOW_ENFORCE(grad.size() == s.size,
                    "tensor " << t << " has " << grad.size() << " elements, registered " << s.size);
    if (s.size) std::memcpy(grad.data(), buckets_[s.bucket].data.data() + s.offset, s.size * sizeof(float));
  }
  //! Packs `grad` for tensor t and marks it ready; returns the bucket index
  //! when this completed the bucket (each bucket is returned once per step).
  std::optional<std::size_t> mark_ready(std::size_t t, std::span<const float> grad) {
    pack(t, grad);
    const std::size_t b = slots_[t].bucket;
    EBBFLOW_ENFORCE(pending_[b] > 0, "tensor " << t << " marked ready twice in one step");
    if (--pending_[b] == 0) return b;
    return std::nullopt;
  }
  //! Starts a new step: every bucket waits for all its tensors again.
  void reset_ready() {
    for (std::size_t b = 0; b < buckets_.size(); ++b) pending_[b] = buckets_[b].tensors.size();
  }

  //! Convenience for one step: packs all `grads`, calls `reduce(bucket_span,
  //! bucket_index)` per bucket, unpacks. `grads[i]` is tensor i.
  template <class Reduce>
  void allreduce(std::span<const std::span<float>> grads, Reduce&& reduce) {
    EBBFLOW_ENFORCE(grads.size() == slots_.size(), grads.size()
                                                       << " tensors given, " << slots_.size() << " registered");
    for (std::size_t t = 0; t < grads.size(); ++t) pack(t, grads[t]);
    for (std::size_t b = 0; b < buckets_.size(); ++b) reduce(std::span<float>(buckets_[b].data), b);
    for (std::size_t t = 0; t < grads.size(); ++t) unpack(t, grads[t]);
  }

 private:
  struct bucket_data {
    std::vector<std::size_t> tensors;
    std::vector<float> data;
  };
  std::vector<slot> slots_;
  std::vector<bucket_data> buckets_;
  std::vector<std::size_t> pending_;
  std::size_t fill_ = 0;
};

}  // namespace compress
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/compress/bucket.hpp>
// #include <ebbflow/compress/codec.hpp>  (inlined here)
// ---- begin <ebbflow/compress/codec.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file codec.hpp
//! The `codec` concept: how a gradient compressor presents itself to
//! `compressed_allreduce`.
//!
//! A codec turns `n` floats into at most `max_encoded_bytes(n)` bytes and back.
//! Every pointer handed to a codec lives in the memory space of the executor
//! it is called with (`exec::cpu_executor`: host; `exec::cuda_executor`:
//! device); the codec itself never allocates, copies across spaces or blocks
//! beyond what its executor's `bulk` does.
//!
//! * `encode(ex, in, residual, out, n, ctx)`: error feedback is built in. When
//!   `residual` is not null the codec encodes `v = in + residual` and stores
//!   `residual = v - decode(out)`, so the compression error of this call is
//!   added to the next one (Seide et al. 2014; Karimireddy et al. 2019). With a
//!   null residual it encodes `in` alone. `ctx` carries the random seed/stream
//!   for stochastic codecs and a scratch area of `workspace_bytes(n)` bytes.
//! * `decode(ex, in, out, n)` writes the decoded floats; `decode_add` adds them
//!   to `out`.
//! * `kind` tells `compressed_allreduce` which algorithm is valid for the code.
//!
//! Encoded buffers must be 8-byte aligned; `max_encoded_bytes` is a multiple
//! of 8 so that consecutive encoded segments stay aligned. Encoding is
//! deterministic given (input, residual, seed, stream): the same bits on CPU
//! and GPU. Codecs are cheap value types; calls on distinct buffers may run
//! concurrently.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/exec/executor.hpp>  (inlined here)
// ---- begin <ebbflow/exec/executor.hpp>
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
// ---- end <ebbflow/exec/executor.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string_view>

EBBFLOW_BEGIN_NAMESPACE
namespace compress {

//! Which reduction algorithm a code admits.
enum class codec_kind {
  //! Summable after a per-hop decode: a ring reduce-scatter can decode, add
  //! its own data and re-encode at every hop (casts; unbiased stochastic
  //! quantisers, whose per-hop errors stay unbiased). Wire bytes per rank
  //! ~ 2(p-1)/p * encoded size.
  linear,
  //! Not summable (top-k): every rank's encoded blocks are allgathered and
  //! decoded by everybody. Wire bytes per rank ~ (p-1) * encoded size.
  sparse,
  //! Sign codes (1-bit): compressed reduce-scatter, average, re-encode with a
  //! second error-feedback residual, compressed allgather (DeepSpeed 1-bit).
  sign,
  //! Low-rank (PowerSGD): not a flat codec; two dense allreduces of the
  //! factors P and Q.
  low_rank,
};

//! The enumerator's name ("linear", "sparse", "sign", "low_rank"), or "?".
constexpr std::string_view name(codec_kind k) noexcept {
  constexpr std::string_view names[] = {"linear", "sparse", "sign", "low_rank"};  // in declaration order
  const auto i = static_cast<std::size_t>(k);
  return i < std::size(names) ? names[i] : "?";
}

//! Per-call context of an encode. `workspace` points to `workspace_bytes(n)`
//! bytes (8-byte aligned) in the executor's memory space, or is null when the
//! codec needs none. `seed` and `stream` select the Philox stream of
//! stochastic codecs: callers make `stream` unique per (rank, step, region).
struct encode_context {
  std::uint64_t seed = 0;          //!< Philox key of stochastic codecs
  std::uint64_t stream = 0;        //!< Philox stream: unique per (rank, step, region)
  std::byte* workspace = nullptr;  //!< `workspace_bytes(n)` bytes in the executor's memory space, or null
};

//! Rounds `b` up to a multiple of 8 bytes.
constexpr std::size_t align8(std::size_t b) noexcept { return (b + 7) / 8 * 8; }

template <class C>
concept codec = std::copy_constructible<C> &&
    requires(const C& c, exec::cpu_executor& ex, const float* in, float* res, float* out, const std::byte* ein,
             std::byte* eout, std::size_t n, encode_context ctx) {
  { C::kind } -> std::convertible_to<codec_kind>;
  { c.name() } -> std::convertible_to<std::string_view>;
  { c.max_encoded_bytes(n) } -> std::same_as<std::size_t>;
  { c.workspace_bytes(n) } -> std::same_as<std::size_t>;
  //! Granularity: segment boundaries passed by the allreduce are multiples of it.
  { c.block_elems() } -> std::same_as<std::size_t>;
  c.encode(ex, in, res, eout, n, ctx);
  c.decode(ex, ein, out, n);
  c.decode_add(ex, ein, out, n);
};

}  // namespace compress
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/compress/codec.hpp>
// #include <ebbflow/compress/codecs/cast.hpp>  (inlined here)
// ---- begin <ebbflow/compress/codecs/cast.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file cast.hpp
//! fp16 and bf16 cast codecs: 2 bytes per element plus one exponent byte per
//! block of 256 (block floating point), round to nearest even, with optional
//! error feedback. Each block is scaled by its own power of two, so any
//! finite float is encoded (fp16's own range ends at 65504) with relative
//! error <= 2^-11 (fp16) or 2^-8 (bf16) for every element within 2^-28
//! (fp16) of its block's largest |value|. Linear: the ring decodes, adds and
//! re-encodes at every hop, in one pass (`decode_add_encode`) that never
//! unscales the running sum, so the ring's sums cannot overflow either.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/compress/codec.hpp>  (inlined)
// #include <ebbflow/compress/detail/fp.hpp>  (inlined here)
// ---- begin <ebbflow/compress/detail/fp.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file fp.hpp
//! Floating-point helpers whose results are bit-identical on host and device.
//! nvcc contracts `a * b + c` into an FMA by default while a host build for
//! baseline x86-64 does not, so kernels that must match the CPU bit for bit
//! multiply and add through `fmul` / `fadd`, which nvcc never fuses. Bit casts
//! and branch-free selects keep host loops vectorisable.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/half.hpp>  (inlined)

#include <cstdint>
#include <cstring>

EBBFLOW_BEGIN_NAMESPACE
namespace compress::detail {

EBBFLOW_HD inline float fmul(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
EBBFLOW_HD inline float fadd(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
EBBFLOW_HD inline float fsub(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
//! A decoded value into its place: `out = d`, or with `Add` (decode_add) `out += d`.
template <bool Add>
EBBFLOW_HD inline void store(float& out, float d) noexcept {
  if constexpr (Add)
    out = fadd(out, d);
  else
    out = d;
}
// Bit casts shared with core/half.hpp (one implementation, host and device).
EBBFLOW_HD inline std::uint32_t as_u32(float f) noexcept { return ::ebbflow::detail::float_bits(f); }
EBBFLOW_HD inline float as_f32(std::uint32_t u) noexcept { return ::ebbflow::detail::bits_float(u); }
//! Whether `x` is neither inf nor NaN (from its exponent bits, the same on
//! host and device and under fast-math).
EBBFLOW_HD inline bool is_finite(float x) noexcept { return (as_u32(x) & 0x7F800000u) != 0x7F800000u; }
//! `x`, or 0 when it is inf or NaN: an error-feedback residual that is not
//! finite is dropped (a step that overflowed must not poison every later
//! one, e.g. under loss scaling, which skips such steps).
EBBFLOW_HD inline float finite_or_zero(float x) noexcept { return is_finite(x) ? x : 0.0f; }
//! Round toward minus infinity, as an int (|x| < 2^31).
EBBFLOW_HD inline std::int32_t floor_i32(float x) noexcept {
  const auto t = static_cast<std::int32_t>(x);  // truncates toward zero
  return t - static_cast<std::int32_t>(static_cast<float>(t) > x);
}

//! Branch-free select: `c ? a : b` as masks, so host loops if-convert and vectorise.
EBBFLOW_HD inline std::uint32_t select(bool c, std::uint32_t a, std::uint32_t b) noexcept {
  const std::uint32_t m = 0u - static_cast<std::uint32_t>(c);
  return (a & m) | (b & ~m);
}

//! float -> IEEE binary16 bits, round to nearest even, branch-free (after
//! F. Giesen's float_to_half_fast3_rtne). Same bits as `ebbflow::half`.
EBBFLOW_HD inline std::uint16_t f32_to_f16(float f) noexcept {
  const std::uint32_t x = as_u32(f);
  const std::uint32_t sign = x & 0x80000000u;
  const std::uint32_t ax = x ^ sign;
  // Normal range: rebias, round to nearest even through the carry.
  const std::uint32_t normal = (ax + 0xC8000FFFu + ((ax >> 13) & 1u)) >> 13;
  // Subnormal range: let the FPU round (adding 0.5 aligns the 10 bits).
  const std::uint32_t sub = as_u32(as_f32(ax) + 0.5f) - 0x3F000000u;
  const std::uint32_t special = select(ax > 0x7F800000u, 0x7E00u, 0x7C00u);
  std::uint32_t o = select(ax < 0x38800000u, sub, normal);
  o = select(ax >= 0x47800000u, special, o);
  return static_cast<std::uint16_t>(o | (sign >> 16));
}
//! IEEE binary16 bits -> float (exact), branch-free.
EBBFLOW_HD inline float f16_to_f32(std::uint16_t h) noexcept {
  const std::uint32_t hu = h;
  const std::uint32_t body = (hu & 0x7FFFu) << 13;
  const std::uint32_t exp = body & 0x0F800000u;
  const std::uint32_t normal = body + 0x38000000u;
  const std::uint32_t inf_nan = body + 0x70000000u;
  const std::uint32_t sub = as_u32(as_f32(body + 0x38800000u) - 6.103515625e-05f);
  std::uint32_t o = select(exp == 0x0F800000u, inf_nan, normal);
  o = select(exp == 0, sub, o);
  return as_f32(o | ((hu & 0x8000u) << 16));
}
//! float -> bfloat16 bits, round to nearest even; NaN stays a quiet NaN.
EBBFLOW_HD inline std::uint16_t f32_to_bf16(float f) noexcept {
  const std::uint32_t x = as_u32(f);
  const std::uint32_t rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
  const std::uint32_t nan = (x >> 16) | 0x40u;
  return static_cast<std::uint16_t>(select((x & 0x7FFFFFFFu) > 0x7F800000u, nan, rounded));
}
EBBFLOW_HD inline float bf16_to_f32(std::uint16_t b) noexcept { return as_f32(static_cast<std::uint32_t>(b) << 16); }

}  // namespace compress::detail
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/compress/detail/fp.hpp>
// #include <ebbflow/compress/detail/run.hpp>  (inlined here)
// ---- begin <ebbflow/compress/detail/run.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file run.hpp
//! How codecs launch their block functors. On a single-threaded
//! `exec::cpu_executor` compiled by GCC for x86-64, the host loop is built
//! twice (baseline SSE2 and AVX2, picked at load time through an ifunc:
//! `target_clones`), because the codec loops are compute-bound at SSE2 width
//! on fast memory. AVX2 without FMA is chosen on purpose: with no fused
//! multiply-add available, GCC cannot contract a * b + c, so both clones, and
//! the GPU, produce the same bits. `flatten` inlines the functor into each
//! clone (otherwise it stays a baseline-ISA call). Everything else goes to
//! `ex.bulk`.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/exec/executor.hpp>  (inlined)

#include <cstddef>
#include <type_traits>

// Not under TSan/ASan: an ifunc resolver runs before the sanitizer runtime is
// initialised and crashes in instrumented code.
#if !defined(__CUDACC__) && defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && \
    !defined(EBBFLOW_NO_TARGET_CLONES) && !EBBFLOW_SANITIZE_THREAD && !EBBFLOW_SANITIZE_ADDRESS
#define EBBFLOW_DETAIL_CLONES __attribute__((target_clones("avx2", "default"), flatten))
#else
#define EBBFLOW_DETAIL_CLONES
#endif

EBBFLOW_BEGIN_NAMESPACE
namespace compress::detail {

template <class F>
EBBFLOW_DETAIL_CLONES void host_loop(std::size_t n, const F& f) {
  for (std::size_t i = 0; i < n; ++i) f(i);
}

//! A codec's decode and decode_add, from its `decode_into<Add>(ex, in,
//! out, n)` (with `Add`, accumulate into `out`). Codecs derive from it.
template <class Codec>
struct decode_forms {
  //! Writes the `n` floats decoded from `in` to `out` (both in `Ex`'s space;
  //! completes as `ex.bulk` does).
  template <class Ex>
  void decode(Ex& ex, const std::byte* in, float* out, std::size_t n) const {
    static_cast<const Codec&>(*this).template decode_into<false>(ex, in, out, n);
  }
  //! Adds the `n` floats decoded from `in` to `out` (both in `Ex`'s space;
  //! completes as `ex.bulk` does).
  template <class Ex>
  void decode_add(Ex& ex, const std::byte* in, float* out, std::size_t n) const {
    static_cast<const Codec&>(*this).template decode_into<true>(ex, in, out, n);
  }
};

//! Runs f(i) for i in [0, n) on `ex`.
template <class Ex, class F>
void bulk(Ex& ex, std::size_t n, const F& f) {
  if constexpr (std::is_same_v<std::remove_cv_t<Ex>, exec::cpu_executor>) {
    if (ex.threads() <= 1) {
      host_loop(n, f);
      return;
    }
  }
  ex.bulk(n, f);
}

}  // namespace compress::detail
EBBFLOW_END_NAMESPACE

#undef EBBFLOW_DETAIL_CLONES
// ---- end <ebbflow/compress/detail/run.hpp>
// #include <ebbflow/compress/kernels/cast.hpp>  (inlined here)
// ---- begin <ebbflow/compress/kernels/cast.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file cast.hpp
//! fp16 / bf16 cast kernels with optional error feedback, in block floating
//! point: each block of `block_size` elements is scaled by its own power of
//! two 2^e (e in [-126, 126], one signed byte per block) so that its largest
//! |value| lands in [2^15, 65504] (fp16; just below 2^15 where it would round
//! beyond 65504) or [2^125, 2^126) (bf16). The codes
//! then hold any finite float and keep the format's relative precision for
//! every element within 2^-28 (fp16) of its block's largest, and the ring's hop
//! (`cast_add_encode`) adds a running sum to this rank's values without
//! ever unscaling the sum. Powers of two are exact: where a value is in the
//! format's normal range with and without the scale, its code decodes to the
//! plain cast's value. One functor call per block. Bit-identical on host
//! and device.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/compress/detail/fp.hpp>  (inlined)
// #include <ebbflow/compress/kernels/block.hpp>  (inlined here)
// ---- begin <ebbflow/compress/kernels/block.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file block.hpp
//! Blocking conventions shared by the codec kernels. Each kernel functor is
//! called once per block of `block_size` elements (the last block may be
//! short), so a host loop over one full block has a compile-time trip count
//! and vectorises, and a GPU thread owns a whole block (its per-block scale,
//! its random numbers) without cross-thread communication.


// #include <ebbflow/config.hpp>  (inlined)

#include <cstddef>
#include <cstdint>
#include <type_traits>

#if defined(__CUDACC__) || defined(__GNUC__)
#define EBBFLOW_DETAIL_RESTRICT __restrict__
#else
#define EBBFLOW_DETAIL_RESTRICT
#endif

EBBFLOW_BEGIN_NAMESPACE
namespace compress::kernels {

//! Elements per block for scaled codes (one float scale per block).
inline constexpr std::size_t block_size = 256;

//! Number of blocks covering `n` elements.
EBBFLOW_HD constexpr std::size_t blocks_of(std::size_t n) noexcept { return (n + block_size - 1) / block_size; }

//! Calls `body(count)` for block `b` of an `n`-element range: with a
//! compile-time 256 when the block is full (vectorisable), with the run-time
//! length for the short tail.
template <class Body>
EBBFLOW_HD inline void for_block(std::size_t b, std::size_t n, Body&& body) {
  const std::size_t begin = b * block_size;
  const std::size_t len = n - begin < block_size ? n - begin : block_size;
  if (len == block_size)
    body(std::integral_constant<std::uint32_t, static_cast<std::uint32_t>(block_size)>{});
  else
    body(static_cast<std::uint32_t>(len));
}

//! Calls `body(std::true_type{})` when the residual `res` is given (error
//! feedback), `body(std::false_type{})` when it is null: the choice is made
//! once per block, and each branch compiles without the other's loads.
template <class Body>
EBBFLOW_HD inline void with_residual(const float* res, Body&& body) {
  if (res == nullptr)
    body(std::false_type{});
  else
    body(std::true_type{});
}

}  // namespace compress::kernels
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/compress/kernels/block.hpp>

#include <cstddef>
#include <cstdint>

EBBFLOW_BEGIN_NAMESPACE
namespace compress::kernels {

//! Target format of a cast code.
enum class cast_format { f16, bf16 };

//! `v` rounded to nearest even in format `F`, as raw bits.
template <cast_format F>
EBBFLOW_HD inline std::uint16_t to_bits(float v) noexcept {
  if constexpr (F == cast_format::f16)
    return detail::f32_to_f16(v);
  else
    return detail::f32_to_bf16(v);
}
//! The float value of raw bits `b` of format `F` (exact).
template <cast_format F>
EBBFLOW_HD inline float from_bits(std::uint16_t b) noexcept {
  if constexpr (F == cast_format::f16)
    return detail::f16_to_f32(b);
  else
    return detail::bf16_to_f32(b);
}

//! log2 of the bound H that a block's scaled values are kept below: 16 for
//! fp16 (and at most 65504, its largest value, after rounding), 126 for
//! bf16 (so that the hop's sum of two such values, below 2H, is still a
//! finite float).
template <cast_format F>
inline constexpr int block_top_log2 = F == cast_format::f16 ? 16 : 126;

//! 2^e as a float, for e in [-126, 127] (exact).
EBBFLOW_HD inline float pow2(int e) noexcept { return detail::as_f32(static_cast<std::uint32_t>(e + 127) << 23); }
//! x 2^d for d in [-252, 252], in two exact steps (one rounding at most,
//! where the result is subnormal).
EBBFLOW_HD inline float scale_pow2(float x, int d) noexcept {
  const int h = d / 2;
  return detail::fmul(detail::fmul(x, pow2(h)), pow2(d - h));
}
//! The block exponent e for a block whose largest finite |value| has the
//! bits `amax`: amax 2^e in [H / 2, H), clamped to [-126, 126] (126 for an
//! all-zero block). fp16: one binade lower where amax 2^e would round
//! beyond 65504 (a significand of 2 - 2^-11 or more, 65520 and up); so a
//! block whose largest value is in fp16's range gets e >= 0, and each of its
//! values in fp16's normal range the plain cast's bits.
template <cast_format F>
EBBFLOW_HD inline int block_exponent(std::uint32_t amax) noexcept {
  int e = block_top_log2<F> + 126 - static_cast<int>(amax >> 23);
  if constexpr (F == cast_format::f16) e -= (amax & 0x7FFFFFu) >= 0x7FF000u ? 1 : 0;
  return e < -126 ? -126 : e > 126 ? 126 : e;
}
//! The bits of the largest finite |v| of a block, on the integer image of
//! |v| (monotone for non-negative floats; inf and NaN are skipped),
//! branch-free so that the loop vectorises. `v(j)` gives element j.
template <class V>
EBBFLOW_HD inline std::uint32_t finite_amax(std::uint32_t cnt, V&& v) noexcept {
  std::int32_t amax = 0;
  for (std::uint32_t j = 0; j < cnt; ++j) {
    const auto a = static_cast<std::int32_t>(detail::as_u32(v(j)) & 0x7FFFFFFFu);
    const std::int32_t finite = a < 0x7F800000 ? a : 0;
    amax = finite > amax ? finite : amax;
  }
  return static_cast<std::uint32_t>(amax);
}

//! Encodes block b of v = in + res (`res` may be null: no error feedback):
//! exps[b] = e = block_exponent(max |v|), out[i] = cast(v 2^e), and
//! res = v - float(out[i]) 2^-e. Non-finite values pass as inf or NaN.
//! Pointers in the executor's space.
template <cast_format F>
struct cast_encode {
  const float* in;     //!< n input floats
  float* res;          //!< n residual floats, or null
  std::uint16_t* out;  //!< n codes (output)
  std::int8_t* exps;   //!< one exponent per block (output)
  std::size_t n;       //!< element count

  //! Processes block `b` (elements [256 b, min(256 (b + 1), n))).
  EBBFLOW_HD void operator()(std::size_t b) const noexcept {
    with_residual(res, [&](auto ef) {
      constexpr bool EF = decltype(ef)::value;
      const std::size_t o = b * block_size;
      const float* EBBFLOW_DETAIL_RESTRICT pi = in + o;
      float* EBBFLOW_DETAIL_RESTRICT pr = EF ? res + o : nullptr;
      std::uint16_t* EBBFLOW_DETAIL_RESTRICT po = out + o;
      for_block(b, n, [&](auto cnt) {
        const auto v = [&](std::uint32_t j) { return EF ? detail::fadd(pi[j], pr[j]) : pi[j]; };
        const int e = block_exponent<F>(finite_amax(cnt, v));
        exps[b] = static_cast<std::int8_t>(e);
        const float s = pow2(e), inv = pow2(-e);
        for (std::uint32_t j = 0; j < cnt; ++j) {
          const float w = detail::fmul(v(j), s);
          const std::uint16_t q = to_bits<F>(w);
          po[j] = q;
          if constexpr (EF) pr[j] = detail::finite_or_zero(detail::fmul(detail::fsub(w, from_bits<F>(q)), inv));
        }
      });
    });
  }
};

//! out[i] = float(in[i]) 2^-exps[b] (Add = false) or out[i] += that (Add = true).
template <cast_format F, bool Add>
struct cast_decode {
  const std::uint16_t* in;  //!< n codes
  const std::int8_t* exps;  //!< one exponent per block
  float* out;               //!< n floats (output, or accumulated into when `Add`)
  std::size_t n;            //!< element count

  //! Processes block `b` (elements [256 b, min(256 (b + 1), n))).
  EBBFLOW_HD void operator()(std::size_t b) const noexcept {
    const std::size_t o = b * block_size;
    const std::uint16_t* EBBFLOW_DETAIL_RESTRICT pi = in + o;
    float* EBBFLOW_DETAIL_RESTRICT po = out + o;
    const float inv = pow2(-exps[b]);
    for_block(b, n, [&](auto cnt) {
      for (std::uint32_t j = 0; j < cnt; ++j) detail::store<Add>(po[j], detail::fmul(from_bits<F>(pi[j]), inv));
    });
  }
};

//! The ring's hop on block b: encodes t = decode(in) + v, v = own + res
//! (`res` may be null), without unscaling the running sum decode(in): both
//! terms are brought to the smaller of their two block exponents (each then
//! below H, their sum below 2H, a finite float), then t to its own block
//! exponent (`out_exps`), and res = t - decoded, unscaled. `own` is read
//! only. Pointers in the executor's space.
template <cast_format F>
struct cast_add_encode {
  const std::uint16_t* in;     //!< n codes of the running sum
  const std::int8_t* in_exps;  //!< its exponents, one per block
  const float* own;            //!< n floats of this rank
  float* res;                  //!< n residual floats, or null
  std::uint16_t* out;          //!< n codes (output)
  std::int8_t* out_exps;       //!< one exponent per block (output)
  std::size_t n;               //!< element count

  //! Processes block `b` (elements [256 b, min(256 (b + 1), n))).
  EBBFLOW_HD void operator()(std::size_t b) const noexcept {
    with_residual(res, [&](auto ef) {
      constexpr bool EF = decltype(ef)::value;
      const std::size_t o = b * block_size;
      const std::uint16_t* EBBFLOW_DETAIL_RESTRICT pi = in + o;
      const float* EBBFLOW_DETAIL_RESTRICT px = own + o;
      float* EBBFLOW_DETAIL_RESTRICT pr = EF ? res + o : nullptr;
      std::uint16_t* EBBFLOW_DETAIL_RESTRICT po = out + o;
      for_block(b, n, [&](auto cnt) {
        const auto v = [&](std::uint32_t j) { return EF ? detail::fadd(px[j], pr[j]) : px[j]; };
        const int e_in = in_exps[b], e_v = block_exponent<F>(finite_amax(cnt, v));
        const int e_w = e_in < e_v ? e_in : e_v;
        const float sv = pow2(e_w);
        float t[block_size];
        // 2^d in one multiply where it is a normal float (nearly always);
        // the choice is per block, so each loop stays branch-free.
        const auto sum = [&](auto scale) {
          for (std::uint32_t j = 0; j < cnt; ++j)
            t[j] = detail::fadd(scale(from_bits<F>(pi[j])), detail::fmul(v(j), sv));
        };
        const int d = e_w - e_in;
        if (d >= -126)
          sum([f = pow2(d)](float x) { return detail::fmul(x, f); });
        else
          sum([d](float x) { return scale_pow2(x, d); });
        int e_adj = block_exponent<F>(finite_amax(cnt, [&](std::uint32_t j) { return t[j]; }));
        e_adj = e_adj < -126 - e_w ? -126 - e_w : e_adj > 126 - e_w ? 126 - e_w : e_adj;
        const int e_out = e_w + e_adj;
        out_exps[b] = static_cast<std::int8_t>(e_out);
        const float inv = pow2(-e_out);
        const auto encode = [&](auto scale) {
          for (std::uint32_t j = 0; j < cnt; ++j) {
            const float w = scale(t[j]);
            const std::uint16_t q = to_bits<F>(w);
            po[j] = q;
            if constexpr (EF) pr[j] = detail::finite_or_zero(detail::fmul(detail::fsub(w, from_bits<F>(q)), inv));
          }
        };
        if (e_adj >= -126 && e_adj <= 126)
          encode([f = pow2(e_adj)](float x) { return detail::fmul(x, f); });
        else
          encode([e_adj](float x) { return scale_pow2(x, e_adj); });
      });
    });
  }
};

}  // namespace compress::kernels
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/compress/kernels/cast.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

EBBFLOW_BEGIN_NAMESPACE
namespace compress {

//! Cast codec to the 16-bit format `F`. Stateless; thread-safe.
//!
//! Encoded layout of n elements, nb = blocks_of(n): n codes (2 bytes each,
//! padded to a multiple of 8), then nb signed exponent bytes e (the block's
//! values were scaled by 2^e before the cast; padded to a multiple of 8).
template <kernels::cast_format F>
struct cast_codec : detail::decode_forms<cast_codec<F>> {
  static constexpr codec_kind kind = codec_kind::linear;  //!< decoded, added and re-encoded per ring hop
  //! Unit roundoff of one encode, relative to |v| (documented bound).
  static constexpr float unit_roundoff = F == kernels::cast_format::f16 ? 1.0f / 2048 : 1.0f / 256;

  //! "fp16" or "bf16".
  [[nodiscard]] std::string_view name() const noexcept { return F == kernels::cast_format::f16 ? "fp16" : "bf16"; }
  //! Encoded size of `n` elements: 2 bytes each and one per block, each part rounded up to 8.
  [[nodiscard]] std::size_t max_encoded_bytes(std::size_t n) const noexcept {
    return align8(2 * n) + align8(kernels::blocks_of(n));
  }
  //! No workspace needed: 0.
  [[nodiscard]] std::size_t workspace_bytes(std::size_t) const noexcept { return 0; }
  //! Segment granularity: `kernels::block_size` (256) elements.
  [[nodiscard]] std::size_t block_elems() const noexcept { return kernels::block_size; }

  //! Encodes n floats (+ residual) into `out`. Pointers in `Ex`'s space.
  template <class Ex>
  void encode(Ex& ex, const float* in, float* residual, std::byte* out, std::size_t n, encode_context = {}) const {
    detail::bulk(ex, kernels::blocks_of(n), kernels::cast_encode<F>{in, residual, codes(out), exps(out, n), n});
  }
  //! Writes (`Add` false: decode) or adds (`Add` true: decode_add) the `n`
  //! floats decoded from `in` to `out` (both in `Ex`'s space; completes as
  //! `ex.bulk` does).
  template <bool Add, class Ex>
  void decode_into(Ex& ex, const std::byte* in, float* out, std::size_t n) const {
    detail::bulk(ex, kernels::blocks_of(n), kernels::cast_decode<F, Add>{codes(in), exps(in, n), out, n});
  }
  //! The ring's hop: encodes decode(`in`) + `own` (+ `residual`) into `out`
  //! in one pass, without unscaling the running sum decode(`in`) (a sum
  //! that fits the code but not float after rounding, or beyond float on
  //! the way, stays finite). `own` is only read; with a residual, it holds
  //! this encode's error afterwards, as `encode`'s does. Pointers in `Ex`'s
  //! space; `in` and `out` do not overlap.
  template <class Ex>
  void decode_add_encode(Ex& ex, const std::byte* in, const float* own, float* residual, std::byte* out,
                         std::size_t n) const {
    detail::bulk(ex, kernels::blocks_of(n),
                 kernels::cast_add_encode<F>{codes(in), exps(in, n), own, residual, codes(out), exps(out, n), n});
  }
  //! Of the `n` floats `decoded` from `in` (host memory), how many are
  //! +-inf or NaN although their codes are finite: values beyond float's
  //! range (above about 3.4e38) after the block's scale is undone.
  [[nodiscard]] std::size_t saturated(const std::byte* in, const float* decoded, std::size_t n) const noexcept {
    // Codes stay below 2^top (with a rounding); only blocks scaled down far
    // enough can leave float's range when decoded.
    constexpr int lowest_safe = kernels::block_top_log2<F> - 127;
    std::size_t k = 0;
    const std::int8_t* e = exps(in, n);
    const std::uint16_t* c = codes(in);
    for (std::size_t b = 0; b < kernels::blocks_of(n); ++b) {
      if (e[b] >= lowest_safe) continue;
      const std::size_t end = b * kernels::block_size + kernels::block_size < n ? (b + 1) * kernels::block_size : n;
      for (std::size_t i = b * kernels::block_size; i < end; ++i)
        k += !detail::is_finite(decoded[i]) && detail::is_finite(kernels::from_bits<F>(c[i]));
    }
    return k;
  }

 private:
  static std::uint16_t* codes(std::byte* p) noexcept { return reinterpret_cast<std::uint16_t*>(p); }
  static const std::uint16_t* codes(const std::byte* p) noexcept { return reinterpret_cast<const std::uint16_t*>(p); }
  static std::int8_t* exps(std::byte* p, std::size_t n) noexcept {
    return reinterpret_cast<std::int8_t*>(p + align8(2 * n));
  }
  static const std::int8_t* exps(const std::byte* p, std::size_t n) noexcept {
    return reinterpret_cast<const std::int8_t*>(p + align8(2 * n));
  }
};

//! IEEE binary16 cast codec (block floating point).
using fp16_codec = cast_codec<kernels::cast_format::f16>;
//! bfloat16 cast codec (block floating point).
using bf16_codec = cast_codec<kernels::cast_format::bf16>;
static_assert(codec<fp16_codec> && codec<bf16_codec>);

}  // namespace compress
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/compress/codecs/cast.hpp>
// #include <ebbflow/compress/codecs/powersgd.hpp>  (inlined here)
// ---- begin <ebbflow/compress/codecs/powersgd.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file powersgd.hpp
//! PowerSGD rank-r compression (Vogels et al., NeurIPS 2019) of a matrix
//! gradient M (rows x cols, row-major): one power-iteration step per call with
//! a warm-started Q. Not a flat codec: `compressed_allreduce` runs
//!   M = grad + residual; P = M normalize(Q); allreduce(P);
//!   orthogonalise(normalize(P)); Q = M^T P; residual = M - P Q^T;
//!   allreduce(Q); grad = P Q^T,
//! i.e. two dense allreduces of (rows + cols) r floats instead of rows cols.
//! This type holds the rank and the per-step kernels; the per-tensor state
//! (Q, residual) lives in the allreduce. A matrix of rank <= r is reproduced
//! exactly (up to float rounding) once Q spans its row space; on full-rank
//! matrices error feedback makes the accumulated updates converge to the
//! accumulated gradients.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/compress/codec.hpp>  (inlined)
// #include <ebbflow/compress/detail/philox.hpp>  (inlined here)
// ---- begin <ebbflow/compress/detail/philox.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file philox.hpp
//! Philox4x32-10 (Salmon et al., SC'11), the counter-based generator of
//! cuRAND and Random123, written once for host and device. Pure integer
//! arithmetic (32x32->64 multiplies), so the CPU and the GPU produce the same
//! bits for the same key and counter. No state: a stochastic kernel derives the
//! counter from the element index, so results do not depend on how the work is
//! split into threads or blocks.


// #include <ebbflow/config.hpp>  (inlined)

#include <cstdint>

// Host AVX2 path of philox_lanes: only where GCC's target attributes and
// runtime CPU checks exist (the same condition as run.hpp's target clones),
// never in device code or under nvcc's front end.
#if !defined(__CUDACC__) && defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && \
    !defined(EBBFLOW_NO_TARGET_CLONES)
#define EBBFLOW_DETAIL_PHILOX_AVX2 1
#include <immintrin.h>
#endif

EBBFLOW_BEGIN_NAMESPACE
namespace compress::detail {

struct philox_u4 {
  std::uint32_t x, y, z, w;
};

//! One Philox4x32-10 block: four uniformly distributed 32-bit words for
//! counter `c` under key (k0, k1).
EBBFLOW_HD inline philox_u4 philox4x32_10(philox_u4 c, std::uint32_t k0, std::uint32_t k1) noexcept {
  constexpr std::uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
  constexpr std::uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = static_cast<std::uint64_t>(m0) * c.x;
    const std::uint64_t p1 = static_cast<std::uint64_t>(m1) * c.z;
    const std::uint32_t hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const std::uint32_t hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    c = philox_u4{hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0};
    k0 += w0;
    k1 += w1;
  }
  return c;
}

//! Key and stream of one stochastic encode: the 64-bit seed is the key, the
//! stream id (e.g. rank, step and region hashed together) goes in the counter's
//! upper words, the element-group index in the lower ones.
struct philox_stream {
  std::uint64_t seed = 0;
  std::uint64_t stream = 0;

  //! Four random words for group `i` of this stream.
  EBBFLOW_HD philox_u4 operator()(std::uint64_t i) const noexcept {
    return philox4x32_10({static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(i >> 32),
                          static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)},
                         static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
  }
};

#if defined(EBBFLOW_DETAIL_PHILOX_AVX2)
//! AVX2 body of philox_lanes<N> (N a multiple of 8). Each Philox lane sits in
//! a 64-bit slot: vpmuludq reads only the low 32 bits of each slot and returns
//! the full 64-bit product, so hi is one shift and lo is the product itself.
//! Upper halves carry garbage that nothing reads (the multiplies ignore it and
//! the final pack drops it). Written with intrinsics because GCC vectorises
//! the portable loop with 32-bit lanes, where splitting each product back into
//! hi and lo words costs more shuffles than the multiplies themselves.
template <unsigned N>
__attribute__((target("avx2"))) inline void philox_lanes_avx2(const philox_stream& s, std::uint64_t first,
                                                              std::uint32_t* out) noexcept {
  // V vectors of 4 slots per word, 4 V groups per pass. One chain of rounds
  // is latency-bound (multiply, shift, xor); 8 independent chains per word
  // keep the multiplier busy (measured: 2 -> 8 vectors, +13 % encode speed;
  // the 32 state vectors spill, but only to L1).
  static_assert(N % 8 == 0);
  constexpr unsigned V = N % 32 == 0 ? 8 : 2;
  const __m256i m0 = _mm256_set1_epi64x(0xD2511F53u), m1 = _mm256_set1_epi64x(0xCD9E8D57u);
  const __m256i pick = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);  // low words of 4 slots -> low 128 bits
  const __m256i z_init = _mm256_set1_epi64x(static_cast<long long>(s.stream & 0xFFFFFFFFu));
  const __m256i w_init = _mm256_set1_epi64x(static_cast<long long>(s.stream >> 32));
  for (unsigned c = 0; c < N; c += 4 * V) {
    __m256i x[V], y[V], z[V], w[V];
    for (unsigned v = 0; v < V; ++v) {
      const __m256i i = _mm256_add_epi64(_mm256_set1_epi64x(static_cast<long long>(first + c + 4 * v)),
                                         _mm256_setr_epi64x(0, 1, 2, 3));
      x[v] = i;  // upper halves are ignored by vpmuludq
      y[v] = _mm256_srli_epi64(i, 32);
      z[v] = z_init;
      w[v] = w_init;
    }
    std::uint32_t k0 = static_cast<std::uint32_t>(s.seed), k1 = static_cast<std::uint32_t>(s.seed >> 32);
    for (int round = 0; round < 10; ++round) {
      const __m256i vk0 = _mm256_set1_epi64x(k0), vk1 = _mm256_set1_epi64x(k1);
      for (unsigned v = 0; v < V; ++v) {
        const __m256i p0 = _mm256_mul_epu32(x[v], m0), p1 = _mm256_mul_epu32(z[v], m1);
        x[v] = _mm256_xor_si256(_mm256_srli_epi64(p1, 32), _mm256_xor_si256(y[v], vk0));
        z[v] = _mm256_xor_si256(_mm256_srli_epi64(p0, 32), _mm256_xor_si256(w[v], vk1));
        y[v] = p1;
        w[v] = p0;
      }
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    // Low words of 4 + 4 slots -> 8 consecutive words.
    for (unsigned v = 0; v < V; v += 2) {
      const __m256i* const words[4] = {x, y, z, w};
      for (unsigned k = 0; k < 4; ++k) {
        const __m256i pa = _mm256_permutevar8x32_epi32(words[k][v], pick);
        const __m256i pb = _mm256_permutevar8x32_epi32(words[k][v + 1], pick);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k * N + c + 4 * v),
                            _mm256_permute2x128_si256(pa, pb, 0x20));
      }
    }
  }
}
#endif

//! `N` consecutive Philox blocks, groups `first` .. `first + N - 1` of
//! `s`, written structure-of-arrays: word w of group `first + g` lands at
//! `out[N * w + g]`. The same bits as `N` calls of `philox_stream::operator()`
//! on every path (tested against it); on x86-64 hosts with AVX2 it takes the
//! vector path above, picked at run time.
template <unsigned N>
EBBFLOW_HD inline void philox_lanes(const philox_stream& s, std::uint64_t first, std::uint32_t* out) noexcept {
#if defined(EBBFLOW_DETAIL_PHILOX_AVX2) && !defined(__CUDA_ARCH__)
  if constexpr (N % 8 == 0) {
    if (__builtin_cpu_supports("avx2")) {
      philox_lanes_avx2<N>(s, first, out);
      return;
    }
  }
#endif
  for (unsigned g = 0; g < N; ++g) {
    const philox_u4 r = s(first + g);
    out[g] = r.x, out[N + g] = r.y, out[2 * N + g] = r.z, out[3 * N + g] = r.w;
  }
}

//! SplitMix64 finaliser: mixes rank/step/region into one well-spread stream id.
EBBFLOW_HD constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace compress::detail
EBBFLOW_END_NAMESPACE

#undef EBBFLOW_DETAIL_PHILOX_AVX2
// ---- end <ebbflow/compress/detail/philox.hpp>
// #include <ebbflow/compress/kernels/lowrank.hpp>  (inlined here)
// ---- begin <ebbflow/compress/kernels/lowrank.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file lowrank.hpp
//! PowerSGD kernels (Vogels et al., NeurIPS 2019) for a row-major rows x cols
//! matrix M and rank r: P = M Q, Q = M^T P, reconstruction P Q^T with the
//! error-feedback residual, and Gram-Schmidt orthogonalisation of P's
//! columns. Every dot product runs in one fixed order (256 interleaved lanes,
//! then a pairwise tree), the order a 256-thread CUDA block uses, so host and
//! device give the same bits. The device orthogonalisation is in
//! orthogonalize.cuh.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/compress/detail/fp.hpp>  (inlined)
// #include <ebbflow/exec/executor.hpp>  (inlined)

#include <cmath>
#include <cstddef>
#include <cstdint>

EBBFLOW_BEGIN_NAMESPACE
namespace compress::kernels {

//! Largest supported rank (per-thread accumulators live in registers).
inline constexpr std::size_t max_rank = 32;
//! Lanes of the fixed-order dot product (= CUDA block size of the device path).
inline constexpr std::size_t dot_lanes = 256;
//! Added to column norms before dividing (as PyTorch's PowerSGD hook does).
inline constexpr float orthogonalize_eps = 1e-8f;
//! A column whose norm fell below this fraction of its original norm during
//! orthogonalisation is treated as linearly dependent and zeroed.
inline constexpr float rank_tolerance = 1e-3f;

//! The operands of a product of M (rows x cols, row-major) with a factor:
//! `in` is read, `out` written (executor's memory space; row-major, `rank`
//! columns). Entries are summed in index order, so every executor gives the
//! same bits.
struct lowrank_product {
  const float* m;   //!< M, rows x cols row-major
  const float* in;  //!< the factor read: Q (cols x rank) for P = M Q, P (rows x rank) for Q = M^T P
  float* out;       //!< the factor written: P (rows x rank), or Q (cols x rank)
  std::size_t rows, cols, rank;
  //! @var rows
  //! Rows of M (and of P).
  //! @var cols
  //! Columns of M (rows of Q).
  //! @var rank
  //! Rank r: columns of P and Q (<= `max_rank`).

  //! out[o, j] = sum_k M[k * stride + first] in[k, j] over k < len: row `o` of the output.
  EBBFLOW_HD void dot(std::size_t o, std::size_t first, std::size_t stride, std::size_t len) const noexcept {
    float acc[max_rank];
    for (std::size_t j = 0; j < rank; ++j) acc[j] = 0.0f;
    for (std::size_t k = 0; k < len; ++k) {
      const float v = m[k * stride + first];
      for (std::size_t j = 0; j < rank; ++j) acc[j] = detail::fadd(acc[j], detail::fmul(v, in[k * rank + j]));
    }
    for (std::size_t j = 0; j < rank; ++j) out[o * rank + j] = acc[j];
  }
};

//! P[i, j] = sum_c M[i, c] Q[c, j]; one call per row i (`in` = Q, `out` = P).
struct lowrank_mul_p : lowrank_product {
  //! Computes row `i` of P.
  EBBFLOW_HD void operator()(std::size_t i) const noexcept { dot(i, i * cols, 1, cols); }
};

//! Q[c, j] = sum_i M[i, c] P[i, j]; one call per column c (`in` = P, `out` = Q).
struct lowrank_mul_q : lowrank_product {
  //! Computes row `c` of Q (column `c` of M^T P).
  EBBFLOW_HD void operator()(std::size_t c) const noexcept { dot(c, c, cols, rows); }
};

//! Row i of P Q^T: out[i, c] = sum_j P[i, j] Q[c, j]. One call per row.
struct lowrank_reconstruct {
  const float* p;  //!< P, rows x rank row-major (executor's memory space)
  const float* q;  //!< Q, cols x rank row-major
  float* out;      //!< P Q^T (output), rows x cols row-major
  std::size_t rows, cols, rank;
  //! @var rows
  //! Rows of M (and of P).
  //! @var cols
  //! Columns of M (rows of Q).
  //! @var rank
  //! Rank r: columns of P and Q (<= `max_rank`).

  //! Writes row `i`.
  EBBFLOW_HD void operator()(std::size_t i) const noexcept {
    for (std::size_t c = 0; c < cols; ++c) {
      float acc = 0.0f;
      for (std::size_t j = 0; j < rank; ++j) acc = detail::fadd(acc, detail::fmul(p[i * rank + j], q[c * rank + j]));
      out[i * cols + c] = acc;
    }
  }
};

//! res[i, c] = m[i, c] - sum_j P[i, j] Q[c, j]; one call per row.
struct lowrank_residual {
  const float* m;  //!< M, rows x cols row-major (executor's memory space)
  const float* p;  //!< P, rows x rank row-major
  const float* q;  //!< Q, cols x rank row-major
  float* res;      //!< M - P Q^T (output; may alias `m`)
  std::size_t rows, cols, rank;
  //! @var rows
  //! Rows of M (and of P).
  //! @var cols
  //! Columns of M (rows of Q).
  //! @var rank
  //! Rank r: columns of P and Q (<= `max_rank`).

  //! Writes row `i`.
  EBBFLOW_HD void operator()(std::size_t i) const noexcept {
    for (std::size_t c = 0; c < cols; ++c) {
      float acc = 0.0f;
      for (std::size_t j = 0; j < rank; ++j) acc = detail::fadd(acc, detail::fmul(p[i * rank + j], q[c * rank + j]));
      res[i * cols + c] = detail::finite_or_zero(detail::fsub(m[i * cols + c], acc));
    }
  }
};

//! out[i] = a[i] + b[i]; used to form M = grad + residual.
struct add_into {
  const float* a;  //!< first summand (executor's memory space)
  const float* b;  //!< second summand
  float* out;      //!< sum (may alias `a` or `b`)
  //! Writes element `i`.
  EBBFLOW_HD void operator()(std::size_t i) const noexcept { out[i] = detail::fadd(a[i], b[i]); }
};

namespace detail_lr {
//! Pairwise tree over 256 lanes: lane[t] += lane[t + s], s = 128, 64, ..., 1.
inline float tree256(float* lane) noexcept {
  for (std::size_t s = dot_lanes / 2; s > 0; s /= 2)
    for (std::size_t t = 0; t < s; ++t) lane[t] = compress::detail::fadd(lane[t], lane[t + s]);
  return lane[0];
}
//! sum_k x[k*stride] * y[k*stride] in the fixed lane order.
inline float dot(const float* x, const float* y, std::size_t n, std::size_t stride) noexcept {
  float lane[dot_lanes] = {};
  for (std::size_t base = 0; base < n; base += dot_lanes)
    for (std::size_t t = 0; t < dot_lanes && base + t < n; ++t)
      lane[t] = compress::detail::fadd(lane[t], compress::detail::fmul(x[(base + t) * stride], y[(base + t) * stride]));
  return tree256(lane);
}
}  // namespace detail_lr

//! Modified Gram-Schmidt on the `rank` columns of the row-major rows x rank
//! matrix p, in host memory: column i /= (|column i| + eps), then every later
//! column loses its projection on column i. Blocking.
inline void orthogonalize_host(float* p, std::size_t rows, std::size_t rank) noexcept {
  using compress::detail::fmul;
  using compress::detail::fsub;
  float orig[max_rank];
  for (std::size_t i = 0; i < rank; ++i) orig[i] = std::sqrt(detail_lr::dot(p + i, p + i, rows, rank));
  for (std::size_t i = 0; i < rank; ++i) {
    const float norm = std::sqrt(detail_lr::dot(p + i, p + i, rows, rank));
    // A column that lost almost all of its norm to the previous ones is
    // rounding noise (P has lower rank than r): drop it rather than blow the
    // noise up to a unit vector that is not orthogonal to the others.
    const bool keep = norm > rank_tolerance * orig[i];
    const float denom = norm + orthogonalize_eps;
    for (std::size_t k = 0; k < rows; ++k) p[k * rank + i] = keep ? p[k * rank + i] / denom : 0.0f;
    for (std::size_t j = i + 1; j < rank; ++j) {
      const float d = detail_lr::dot(p + i, p + j, rows, rank);
      for (std::size_t k = 0; k < rows; ++k) p[k * rank + j] = fsub(p[k * rank + j], fmul(d, p[k * rank + i]));
    }
  }
}

//! Orthogonalisation dispatch by executor: specialised for `exec::cpu_executor`
//! here and for `exec::cuda_executor` in orthogonalize.cuh.
template <class Executor>
struct orthogonalizer;

//! Host orthogonalisation: `orthogonalize_host`, blocking.
template <>
struct orthogonalizer<exec::cpu_executor> {
  //! Orthogonalises the columns of `p` (host memory, rows x rank) in place.
  static void run(const exec::cpu_executor&, float* p, std::size_t rows, std::size_t rank) {
    orthogonalize_host(p, rows, rank);
  }
};

}  // namespace compress::kernels
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/compress/kernels/lowrank.hpp>
// #include <ebbflow/core/error.hpp>  (inlined)

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

EBBFLOW_BEGIN_NAMESPACE
namespace compress {

//! A matrix view of a flat gradient.
struct matrix_shape {
  std::size_t rows = 0, cols = 0;
  //! @var rows
  //! Number of rows.
  //! @var cols
  //! Number of columns (row-major: elements per row).

  //! Element count: rows * cols.
  [[nodiscard]] constexpr std::size_t size() const noexcept { return rows * cols; }
};

namespace kernels {
//! q[i] = uniform(-1, 1) from Philox; the same on every rank for one seed.
struct uniform_fill {
  float* q;                             //!< output (executor's memory space)
  compress::detail::philox_stream rng;  //!< (seed, stream) of the Philox generator
  //! Writes element `i`.
  EBBFLOW_HD void operator()(std::size_t i) const noexcept {
    const auto r = rng(i);
    q[i] = compress::detail::fsub(compress::detail::fmul(static_cast<float>(r.x >> 8), 1.0f / 8388608.0f), 1.0f);
  }
};

//! Column j of q (cols x rank, row-major) refilled as `uniform_fill` would
//! when it is all zero or holds a non-finite value: orthogonalisation drops
//! the columns of P that a lower-rank gradient leaves empty, and a zero (or
//! NaN, after a non-finite gradient) column of the warm-start Q would stay
//! so in every later step.
struct reseed_zero_columns {
  float* q;                             //!< cols x rank (executor's memory space)
  std::size_t cols;                     //!< rows of q
  std::size_t rank;                     //!< columns of q
  compress::detail::philox_stream rng;  //!< as init_q's
  //! Checks, and refills, column `j`.
  EBBFLOW_HD void operator()(std::size_t j) const noexcept {
    bool zero = true, finite = true;
    for (std::size_t k = 0; k < cols; ++k) {
      const float x = q[k * rank + j];
      zero = zero && x == 0.0f;
      finite = finite && compress::detail::is_finite(x);
    }
    if (!zero && finite) return;
    const uniform_fill fill{q, rng};
    for (std::size_t k = 0; k < cols; ++k) fill(k * rank + j);
  }
};

//! Column j of f (rows x rank, row-major) times the power of two that puts
//! its largest |entry| in [1, 2) (within [2^-126, 2^126]; exact): the
//! factors carry a direction, and their magnitude would otherwise follow
//! the gradient's, squared (P = M Q with the warm start Q = M^T P), out of
//! float's range (above about 1e18) or below the orthogonalisation's eps
//! (below about 1e-9), silently zeroing the result. Zero and non-finite
//! columns are left alone.
struct normalize_columns {
  float* f;          //!< rows x rank (executor's memory space)
  std::size_t rows;  //!< rows of f
  std::size_t rank;  //!< columns of f
  //! Scales column `j`.
  EBBFLOW_HD void operator()(std::size_t j) const noexcept {
    std::uint32_t amax = 0;
    for (std::size_t k = 0; k < rows; ++k) {
      const std::uint32_t a = compress::detail::as_u32(f[k * rank + j]) & 0x7FFFFFFFu;
      amax = a > amax ? a : amax;
    }
    if (amax == 0 || amax >= 0x7F800000u) return;
    std::uint32_t e = amax >> 23;  // biased exponent of the largest entry
    e = e < 1 ? 1 : e > 253 ? 253 : e;
    const float factor = compress::detail::as_f32((254u - e) << 23);  // 2^(127 - e)
    for (std::size_t k = 0; k < rows; ++k) f[k * rank + j] = compress::detail::fmul(f[k * rank + j], factor);
  }
};
}  // namespace kernels

//! Value type; thread-safe.
struct powersgd_codec {
  static constexpr codec_kind kind = codec_kind::low_rank;  //!< two dense allreduces of the factors

  //! @throws std::invalid_argument unless 1 <= rank <= kernels::max_rank.
  explicit powersgd_codec(std::size_t rank = 4) : rank_(rank) {
    EBBFLOW_ENFORCE(rank >= 1 && rank <= kernels::max_rank,
                    "PowerSGD rank " << rank << " outside [1, " << kernels::max_rank << "]");
  }
  //! "powersgd".
  [[nodiscard]] std::string_view name() const noexcept { return "powersgd"; }
  //! Requested rank r.
  [[nodiscard]] std::size_t rank() const noexcept { return rank_; }
  //! Rank actually used for a shape: min(rank, rows, cols).
  [[nodiscard]] std::size_t rank_for(matrix_shape s) const noexcept { return std::min({rank_, s.rows, s.cols}); }
  //! Default matrix view of n elements: cols = ceil(sqrt(n)), rows = n / cols;
  //! the n - rows * cols tail is reduced dense.
  [[nodiscard]] static matrix_shape shape_for(std::size_t n) noexcept {
    if (n == 0) return {};
    const auto cols = static_cast<std::size_t>(std::ceil(std::sqrt(static_cast<double>(n))));
    return {n / cols, cols};
  }
  //! Floats sent per allreduce round for a shape (P then Q).
  [[nodiscard]] std::size_t factor_floats(matrix_shape s) const noexcept { return (s.rows + s.cols) * rank_for(s); }

  //! q (cols x r) = uniform(-1, 1) for the first step of a tensor.
  template <class Ex>
  void init_q(Ex& ex, float* q, matrix_shape s, std::uint64_t seed) const {
    ex.bulk(s.cols * rank_for(s), kernels::uniform_fill{q, {seed, 0x9051D}});
  }
  //! Refills the all-zero (or non-finite) columns of the warm-start q as
  //! init_q would, so that the rank lost in one step (a gradient of lower
  //! rank, zero, or not finite) comes back in the next. The same on every
  //! rank (q is summed).
  template <class Ex>
  void refresh_q(Ex& ex, float* q, matrix_shape s, std::uint64_t seed) const {
    ex.bulk(rank_for(s), kernels::reseed_zero_columns{q, s.cols, rank_for(s), {seed, 0x9051D}});
  }
  //! Scales each column of the factor f (`rows` x r, row-major) by a power
  //! of two to a largest |entry| in [1, 2) (`kernels::normalize_columns`):
  //! the warm-start Q before P = M Q, and P before its orthogonalisation.
  //! Exact; the same on every rank for the same f.
  template <class Ex>
  void normalize(Ex& ex, float* f, std::size_t rows, matrix_shape s) const {
    ex.bulk(rank_for(s), kernels::normalize_columns{f, rows, rank_for(s)});
  }
  //! p (rows x r) = m q, with m (rows x cols) and q (cols x r) row-major.
  //! Pointers in `Ex`'s space; completes as `ex.bulk` does.
  template <class Ex>
  void compute_p(Ex& ex, const float* m, const float* q, float* p, matrix_shape s) const {
    ex.bulk(s.rows, kernels::lowrank_mul_p{{m, q, p, s.rows, s.cols, rank_for(s)}});
  }
  //! Gram-Schmidt on the columns of p (rows x r) in place; blocking on the
  //! CPU executor, enqueued on the stream of the CUDA executor.
  template <class Ex>
  void orthogonalize(Ex& ex, float* p, matrix_shape s) const {
    kernels::orthogonalizer<Ex>::run(ex, p, s.rows, rank_for(s));
  }
  //! q (cols x r) = m^T p. Pointers in `Ex`'s space; completes as `ex.bulk` does.
  template <class Ex>
  void compute_q(Ex& ex, const float* m, const float* p, float* q, matrix_shape s) const {
    ex.bulk(s.cols, kernels::lowrank_mul_q{{m, p, q, s.rows, s.cols, rank_for(s)}});
  }
  //! res = m - P Q^T (may alias m).
  template <class Ex>
  void residual(Ex& ex, const float* m, const float* p, const float* q, float* res, matrix_shape s) const {
    ex.bulk(s.rows, kernels::lowrank_residual{m, p, q, res, s.rows, s.cols, rank_for(s)});
  }
  //! out = P Q^T.
  template <class Ex>
  void reconstruct(Ex& ex, const float* p, const float* q, float* out, matrix_shape s) const {
    ex.bulk(s.rows, kernels::lowrank_reconstruct{p, q, out, s.rows, s.cols, rank_for(s)});
  }

 private:
  std::size_t rank_;
};

}  // namespace compress
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/compress/codecs/powersgd.hpp>
// #include <ebbflow/compress/codecs/quantize.hpp>  (inlined here)
// ---- begin <ebbflow/compress/codecs/quantize.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file quantize.hpp
//! int8 and int4 stochastic quantisation codecs with one float scale per 256
//! elements (QSGD-style max-abs scaling, Philox stochastic rounding).
//!
//! Guarantees, per encode of a block with max |v| = a:
//! * every element's error is below one step, a / 127 (int8) or a / 7 (int4);
//! * unbiased: E[decode(encode(v))] = v, up to 2^-17 of a step (16-bit u);
//! * the same bits on CPU and GPU for the same (seed, stream).
//! Linear in expectation, so the ring decodes, adds and re-encodes per hop.
//! Wire size: n + 4 n / 256 bytes (int8), n / 2 + 4 n / 256 (int4).


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/compress/codec.hpp>  (inlined)
// #include <ebbflow/compress/detail/run.hpp>  (inlined)
// #include <ebbflow/compress/kernels/quantize.hpp>  (inlined here)
// ---- begin <ebbflow/compress/kernels/quantize.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file quantize.hpp
//! Stochastic int8 / int4 quantisation with one float scale per block
//! (QSGD-style, max-abs scaling). Level count L = 127 (int8) or 7 (int4):
//! q = floor(v * L / amax + u), u uniform in (0, 1) from Philox, so
//! E[q * amax / L] = v (unbiased up to the 16-bit resolution of u: the bias is
//! at most 2^-17 of one quantisation step). Bit-identical on host and device.
//!
//! Encoded layout of n elements, nb = blocks_of(n): nb float scales, then the
//! codes: int8 -> n bytes, int4 -> 128 bytes per block (two 4-bit codes per
//! byte, low nibble first, stored as q + 8).


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/compress/detail/fp.hpp>  (inlined)
// #include <ebbflow/compress/detail/philox.hpp>  (inlined)
// #include <ebbflow/compress/kernels/block.hpp>  (inlined)

#include <cstddef>
#include <cstdint>
#include <type_traits>

EBBFLOW_BEGIN_NAMESPACE
namespace compress::kernels {

//! Largest code magnitude L for `Bits`-bit codes: codes lie in [-L, L].
template <int Bits>
inline constexpr std::int32_t levels = Bits == 8 ? 127 : 7;

//! Bytes of the code part of a block of `len` elements.
template <int Bits>
EBBFLOW_HD constexpr std::size_t code_bytes(std::size_t len) noexcept {
  return Bits == 8 ? len : (len + 1) / 2;
}

//! Encodes block b: scales[b] and its codes. `res` may be null.
template <int Bits>
struct quantize_encode {
  const float* in;            //!< n input floats (executor's memory space)
  float* res;                 //!< n residual floats, or null
  float* scales;              //!< one scale per block (output): max |v| / L
  std::uint8_t* codes;        //!< byte offset b * code_bytes<Bits>(block_size) for block b
  std::size_t n;              //!< element count
  detail::philox_stream rng;  //!< random bits for stochastic rounding

  //! Processes block `b` (elements [256 b, min(256 (b + 1), n))).
  EBBFLOW_HD void operator()(std::size_t b) const noexcept {
    with_residual(res, [&](auto ef) { run<decltype(ef)::value>(b); });
  }

 private:
  template <bool EF>
  EBBFLOW_HD void run(std::size_t b) const noexcept {
    constexpr std::int32_t L = levels<Bits>;
    const std::size_t o = b * block_size;
    const float* EBBFLOW_DETAIL_RESTRICT pi = in + o;
    float* EBBFLOW_DETAIL_RESTRICT pr = EF ? res + o : nullptr;
    std::uint8_t* EBBFLOW_DETAIL_RESTRICT pc = codes + b * code_bytes<Bits>(block_size);
    for_block(b, n, [&](auto cnt) {
      // 1. max |v| on the integer image of |v| (monotone for non-negative
      //    floats), which vectorises where a float max reduction would not.
      std::int32_t amax_bits = 0;
      for (std::uint32_t j = 0; j < cnt; ++j) {
        const float v = EF ? detail::fadd(pi[j], pr[j]) : pi[j];
        const auto a = static_cast<std::int32_t>(detail::as_u32(v) & 0x7FFFFFFFu);
        amax_bits = a > amax_bits ? a : amax_bits;
      }
      const float amax = detail::as_f32(static_cast<std::uint32_t>(amax_bits));
      const float scale = amax / static_cast<float>(L);
      // A block below 2^-100 (L / amax would overflow to inf) or with an inf
      // or NaN takes a slower loop (below): scaled up first, clamped before
      // the conversion, infinities with their sign, no non-finite residual.
      // Every other block takes the plain one, which vectorises.
      const bool finite = amax_bits < 0x7F800000;
      const bool rare = !finite || amax < 0x1p-100f;
      const float pre = amax < 0x1p-100f ? 0x1p64f : 1.0f;
      const float inv = !finite ? 1.0f : amax > 0.0f ? static_cast<float>(L) / (rare ? amax * pre : amax) : 0.0f;
      scales[b] = scale;
      // 2. 16 random bits per element from 32 Philox blocks. Word w of block
      //    g lands at rw[32 w + g], so both loops below run over contiguous
      //    memory and vectorise; element j uses half (j >> 7) of rw[j & 127].
      std::uint32_t rw[128];
      detail::philox_lanes<32>(rng, o / 8, rw);
      // 3. stochastic rounding, residual update. int8 codes go straight to
      //    the output; int4 codes are staged in q and packed in pairs after.
      [[maybe_unused]] std::int8_t q[Bits == 4 ? block_size : 1];
      const auto round = [&](auto rare_tag) {
        constexpr bool Rare = decltype(rare_tag)::value;
        for (std::uint32_t h = 0; h < 2; ++h) {
          const std::uint32_t base = 128 * h;
          const std::uint32_t len = cnt > base ? (cnt - base < 128u ? cnt - base : 128u) : 0u;
          const std::uint32_t shift = 16 * h;
          for (std::uint32_t j2 = 0; j2 < len; ++j2) {
            const std::uint32_t j = base + j2;
            const float v = EF ? detail::fadd(pi[j], pr[j]) : pi[j];
            const float u = detail::fmul(static_cast<float>((rw[j2] >> shift) & 0xFFFFu) + 0.5f, 1.0f / 65536.0f);
            std::int32_t k;
            if constexpr (Rare) {
              float x = detail::fadd(detail::fmul(detail::fmul(v, pre), inv), u);
              x = x < static_cast<float>(L + 1) ? x : static_cast<float>(L + 1);  // also inf; then NaN:
              x = x > static_cast<float>(-L - 1) ? x : static_cast<float>(-L - 1);
              k = detail::floor_i32(x);  // in range: no undefined conversion
            } else {
              k = detail::floor_i32(detail::fadd(detail::fmul(v, inv), u));
            }
            k = k > L ? L : k;
            k = k < -L ? -L : k;
            if constexpr (Bits == 8)
              pc[j] = static_cast<std::uint8_t>(k);  // int8: straight to the output
            else
              q[j] = static_cast<std::int8_t>(k);
            if constexpr (EF) {
              const float r = detail::fsub(v, detail::fmul(static_cast<float>(k), scale));
              pr[j] = Rare ? detail::finite_or_zero(r) : r;
            }
          }
        }
      };
      if (rare)
        round(std::true_type{});
      else
        round(std::false_type{});
      if constexpr (Bits == 4) {
        if (cnt & 1u) q[cnt] = 0;  // cnt < block_size here
        for (std::uint32_t j = 0; j < (cnt + 1u) / 2u; ++j)
          pc[j] = static_cast<std::uint8_t>((q[2 * j] + 8) | ((q[2 * j + 1] + 8) << 4));
      }
    });
  }
};

//! Decodes block b into out (Add = false) or adds it to out (Add = true).
template <int Bits, bool Add>
struct quantize_decode {
  const float* scales;        //!< one scale per block
  const std::uint8_t* codes;  //!< codes, laid out as `quantize_encode` writes them
  float* out;                 //!< n floats (output, or accumulated into when `Add`)
  std::size_t n;              //!< element count

  //! Processes block `b` (elements [256 b, min(256 (b + 1), n))).
  EBBFLOW_HD void operator()(std::size_t b) const noexcept {
    const std::size_t o = b * block_size;
    const std::uint8_t* EBBFLOW_DETAIL_RESTRICT pc = codes + b * code_bytes<Bits>(block_size);
    float* EBBFLOW_DETAIL_RESTRICT po = out + o;
    const float s = scales[b];
    for_block(b, n, [&](auto cnt) {
      for (std::uint32_t j = 0; j < cnt; ++j) {
        std::int32_t k;
        if constexpr (Bits == 8)
          k = static_cast<std::int8_t>(pc[j]);
        else
          k = static_cast<std::int32_t>((pc[j / 2] >> ((j & 1u) * 4u)) & 0xFu) - 8;
        const float d = detail::fmul(static_cast<float>(k), s);
        detail::store<Add>(po[j], d);
      }
    });
  }
};

}  // namespace compress::kernels
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/compress/kernels/quantize.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

EBBFLOW_BEGIN_NAMESPACE
namespace compress {

//! `Bits` = 8 or 4. Stateless; thread-safe.
template <int Bits>
struct quantize_codec : detail::decode_forms<quantize_codec<Bits>> {
  static_assert(Bits == 8 || Bits == 4);
  static constexpr codec_kind kind = codec_kind::linear;  //!< unbiased: decoded, added and re-encoded per ring hop
  static constexpr std::int32_t levels = kernels::levels<Bits>;  //!< largest code magnitude: 127 (int8) or 7 (int4)

  //! "int8" or "int4".
  [[nodiscard]] std::string_view name() const noexcept { return Bits == 8 ? "int8" : "int4"; }
  //! Encoded size of `n` elements: a float scale per block plus the codes
  //! (1 or 1/2 byte each), rounded up to 8.
  [[nodiscard]] std::size_t max_encoded_bytes(std::size_t n) const noexcept {
    const std::size_t nb = kernels::blocks_of(n);
    return align8(4 * nb + (nb == 0 ? 0
                                    : (nb - 1) * kernels::code_bytes<Bits>(kernels::block_size) +
                                          kernels::code_bytes<Bits>(n - (nb - 1) * kernels::block_size)));
  }
  //! No workspace needed: 0.
  [[nodiscard]] std::size_t workspace_bytes(std::size_t) const noexcept { return 0; }
  //! Segment granularity: `kernels::block_size` (256) elements.
  [[nodiscard]] std::size_t block_elems() const noexcept { return kernels::block_size; }

  //! Encodes `n` floats (+ `residual` when not null, which receives the new
  //! error) into `out`, rounding stochastically with the Philox stream
  //! (`ctx.seed`, `ctx.stream`). Pointers in `Ex`'s space.
  template <class Ex>
  void encode(Ex& ex, const float* in, float* residual, std::byte* out, std::size_t n, encode_context ctx = {}) const {
    const std::size_t nb = kernels::blocks_of(n);
    detail::bulk(ex, nb,
                 kernels::quantize_encode<Bits>{in,
                                                residual,
                                                reinterpret_cast<float*>(out),
                                                reinterpret_cast<std::uint8_t*>(out) + 4 * nb,
                                                n,
                                                {ctx.seed, ctx.stream}});
  }
  //! Writes (`Add` false: decode) or adds (`Add` true: decode_add) the `n`
  //! floats decoded from `in` to `out` (both in `Ex`'s space; completes as
  //! `ex.bulk` does).
  template <bool Add, class Ex>
  void decode_into(Ex& ex, const std::byte* in, float* out, std::size_t n) const {
    const std::size_t nb = kernels::blocks_of(n);
    detail::bulk(ex, nb,
                 kernels::quantize_decode<Bits, Add>{reinterpret_cast<const float*>(in),
                                                     reinterpret_cast<const std::uint8_t*>(in) + 4 * nb, out, n});
  }
};

//! 8-bit stochastic quantiser.
using int8_codec = quantize_codec<8>;
//! 4-bit stochastic quantiser.
using int4_codec = quantize_codec<4>;
static_assert(codec<int8_codec> && codec<int4_codec>);

}  // namespace compress
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/compress/codecs/quantize.hpp>
// #include <ebbflow/compress/codecs/sign.hpp>  (inlined here)
// ---- begin <ebbflow/compress/codecs/sign.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file sign.hpp
//! 1-bit sign codec with a per-block l1 scale (EF-signSGD / DeepSpeed 1-bit
//! Adam style). ~1.03 bits per element on the wire. Biased, so
//! `compressed_allreduce` always runs it with error feedback, in the
//! two-phase scheme (compressed reduce-scatter, average, re-encode with a
//! second residual, compressed allgather). Per encode, the decoded block has
//! the same l1 norm as the input block; the error lives in the residual.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/compress/codec.hpp>  (inlined)
// #include <ebbflow/compress/detail/run.hpp>  (inlined)
// #include <ebbflow/compress/kernels/sign.hpp>  (inlined here)
// ---- begin <ebbflow/compress/kernels/sign.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file sign.hpp
//! 1-bit sign code with one scale per block: scale = mean |v| over the block
//! (the l1-scaled sign of EF-signSGD), bit j set when v_j >= 0; decode gives
//! +scale or -scale. Biased on its own, so always used with error feedback.
//! Encoded layout of n elements: nb float scales, then 8 32-bit words per
//! block (256 bits; the tail block's unused bits are zero).


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/compress/detail/fp.hpp>  (inlined)
// #include <ebbflow/compress/kernels/block.hpp>  (inlined)

#include <cstddef>
#include <cstdint>

EBBFLOW_BEGIN_NAMESPACE
namespace compress::kernels {

//! 32-bit words of sign bits per block.
inline constexpr std::size_t sign_words_per_block = block_size / 32;

//! Encodes block b of v = in + res: scales[b] = mean |v| over the block, one
//! bit per element (set for v >= +0); with `res`, res = v - (+-scale).
//! Pointers in the executor's space.
struct sign_encode {
  const float* in;       //!< n input floats
  float* res;            //!< may be null (no error feedback; not recommended)
  float* scales;         //!< one scale per block (output)
  std::uint32_t* words;  //!< `sign_words_per_block` words per block (output)
  std::size_t n;         //!< element count

  //! Processes block `b` (elements [256 b, min(256 (b + 1), n))).
  EBBFLOW_HD void operator()(std::size_t b) const noexcept {
    const std::size_t o = b * block_size;
    const float* EBBFLOW_DETAIL_RESTRICT pi = in + o;
    float* EBBFLOW_DETAIL_RESTRICT pr = res == nullptr ? nullptr : res + o;
    std::uint32_t* EBBFLOW_DETAIL_RESTRICT pw = words + b * sign_words_per_block;
    for_block(b, n, [&](auto cnt) {
      // Eight interleaved partial sums, combined in a fixed order: the same
      // bits on every executor, and a dependency chain 8x shorter.
      float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      std::uint32_t j = 0;
      for (; j + 8 <= cnt; j += 8)
        for (std::uint32_t l = 0; l < 8; ++l) {
          const float v = pr ? detail::fadd(pi[j + l], pr[j + l]) : pi[j + l];
          part[l] = detail::fadd(part[l], detail::as_f32(detail::as_u32(v) & 0x7FFFFFFFu));
        }
      for (; j < cnt; ++j) {
        const float v = pr ? detail::fadd(pi[j], pr[j]) : pi[j];
        part[j & 7u] = detail::fadd(part[j & 7u], detail::as_f32(detail::as_u32(v) & 0x7FFFFFFFu));
      }
      const float sum = detail::fadd(detail::fadd(detail::fadd(part[0], part[1]), detail::fadd(part[2], part[3])),
                                     detail::fadd(detail::fadd(part[4], part[5]), detail::fadd(part[6], part[7])));
      float scale = sum / static_cast<float>(static_cast<std::uint32_t>(cnt));
      if (!detail::is_finite(sum)) {
        // The l1 sum overflowed (or an input is not finite): sum |v| / 256
        // instead (at most 256 elements of at most FLT_MAX each), then scale
        // the mean back. Finite inputs keep a finite mean; others stay non-finite.
        float s2 = 0.0f;
        for (std::uint32_t k = 0; k < cnt; ++k) {
          const float v = pr ? detail::fadd(pi[k], pr[k]) : pi[k];
          s2 = detail::fadd(s2, detail::fmul(detail::as_f32(detail::as_u32(v) & 0x7FFFFFFFu), 1.0f / 256.0f));
        }
        scale = detail::fmul(s2 / static_cast<float>(static_cast<std::uint32_t>(cnt)), 256.0f);
      }
      scales[b] = scale;
      const std::uint32_t scale_bits = detail::as_u32(scale);
      // Bit j of word j/32 set for v >= +0 (sign bit clear).
      for (std::uint32_t w = 0; w < sign_words_per_block; ++w) {
        std::uint32_t word = 0;
        const std::uint32_t lo = 32 * w, hi = cnt < lo + 32 ? cnt : lo + 32;
        for (std::uint32_t jj = lo; jj < hi; ++jj) {
          const float v = pr ? detail::fadd(pi[jj], pr[jj]) : pi[jj];
          word |= ((detail::as_u32(v) >> 31) ^ 1u) << (jj - lo);
        }
        pw[w] = word;
      }
      if (pr) {
        // decoded value = +-scale with v's sign bit
        for (std::uint32_t jj = 0; jj < cnt; ++jj) {
          const float v = detail::fadd(pi[jj], pr[jj]);
          pr[jj] =
              detail::finite_or_zero(detail::fsub(v, detail::as_f32(scale_bits | (detail::as_u32(v) & 0x80000000u))));
        }
      }
    });
  }
};

//! Decodes block b to +-scales[b] by sign bit into out (Add = false) or adds
//! it to out (Add = true). Pointers in the executor's space.
template <bool Add>
struct sign_decode {
  const float* scales;         //!< one scale per block
  const std::uint32_t* words;  //!< `sign_words_per_block` words per block
  float* out;                  //!< n floats (output, or accumulated into when `Add`)
  std::size_t n;               //!< element count

  //! Processes block `b` (elements [256 b, min(256 (b + 1), n))).
  EBBFLOW_HD void operator()(std::size_t b) const noexcept {
    const std::size_t o = b * block_size;
    const std::uint32_t* EBBFLOW_DETAIL_RESTRICT pw = words + b * sign_words_per_block;
    float* EBBFLOW_DETAIL_RESTRICT po = out + o;
    const float s = scales[b];
    for_block(b, n, [&](auto cnt) {
      const std::uint32_t sb = detail::as_u32(s);
      for (std::uint32_t j = 0; j < cnt; ++j) {
        const std::uint32_t neg = ((pw[j / 32] >> (j & 31u)) & 1u) ^ 1u;
        const float d = detail::as_f32(sb | (neg << 31));
        detail::store<Add>(po[j], d);
      }
    });
  }
};

}  // namespace compress::kernels
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/compress/kernels/sign.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

EBBFLOW_BEGIN_NAMESPACE
namespace compress {

//! Stateless; thread-safe.
struct sign_codec : detail::decode_forms<sign_codec> {
  static constexpr codec_kind kind = codec_kind::sign;  //!< two-phase scheme with error feedback

  //! "sign1".
  [[nodiscard]] std::string_view name() const noexcept { return "sign1"; }
  //! Encoded size of `n` elements: a float scale and 256 sign bits per
  //! block, rounded up to 8.
  [[nodiscard]] std::size_t max_encoded_bytes(std::size_t n) const noexcept {
    const std::size_t nb = kernels::blocks_of(n);
    return align8(4 * nb + 4 * kernels::sign_words_per_block * nb);
  }
  //! No workspace needed: 0.
  [[nodiscard]] std::size_t workspace_bytes(std::size_t) const noexcept { return 0; }
  //! Segment granularity: `kernels::block_size` (256) elements.
  [[nodiscard]] std::size_t block_elems() const noexcept { return kernels::block_size; }

  //! Encodes `n` floats (+ `residual` when not null, which receives the new
  //! error) into `out`. Pointers in `Ex`'s space.
  template <class Ex>
  void encode(Ex& ex, const float* in, float* residual, std::byte* out, std::size_t n, encode_context = {}) const {
    const std::size_t nb = kernels::blocks_of(n);
    detail::bulk(ex, nb,
                 kernels::sign_encode{in, residual, reinterpret_cast<float*>(out),
                                      reinterpret_cast<std::uint32_t*>(out + 4 * nb), n});
  }
  //! Writes (`Add` false: decode) or adds (`Add` true: decode_add) the `n`
  //! floats decoded from `in` to `out` (both in `Ex`'s space; completes as
  //! `ex.bulk` does).
  template <bool Add, class Ex>
  void decode_into(Ex& ex, const std::byte* in, float* out, std::size_t n) const {
    const std::size_t nb = kernels::blocks_of(n);
    detail::bulk(ex, nb,
                 kernels::sign_decode<Add>{reinterpret_cast<const float*>(in),
                                           reinterpret_cast<const std::uint32_t*>(in + 4 * nb), out, n});
  }
};
static_assert(codec<sign_codec>);

}  // namespace compress
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/compress/codecs/sign.hpp>
// #include <ebbflow/compress/codecs/topk.hpp>  (inlined here)
// ---- begin <ebbflow/compress/codecs/topk.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file topk.hpp
//! Top-k sparsification codec with error feedback and a sampled threshold
//! (Deep Gradient Compression, Lin et al. 2018): k = ceil(ratio * n) slots of
//! (u32 index, f32 value), 8 + 8k bytes on the wire. The threshold is the
//! matching quantile of |v| over `sample_size` random elements, so no full
//! sort is needed; at most k elements at or above it are sent, in index order,
//! and everything not sent stays in the residual. With s samples the count
//! above the estimated threshold is within about 3 / sqrt(s k / n) relative of
//! k (binomial), which bounds how many of the true top k can be missed.
//! Not summable: `compressed_allreduce` allgathers the encoded blocks.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/compress/codec.hpp>  (inlined)
// #include <ebbflow/compress/detail/run.hpp>  (inlined)
// #include <ebbflow/compress/kernels/topk.hpp>  (inlined here)
// ---- begin <ebbflow/compress/kernels/topk.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file topk.hpp
//! Top-k sparsification kernels, DGC-style: the threshold is estimated from a
//! random sample of |v| (no full sort), elements with |v| >= threshold are
//! packed as (index, value) pairs in index order, at most k of them; what is
//! not sent stays in the error-feedback residual. Deterministic and
//! identical on host and device: the compaction uses per-block counts and an
//! exclusive scan instead of atomics.
//!
//! Encoded layout for k slots: u32 count, u32 reserved, k u32 indices, k f32
//! values (slots past `count` are zero).


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/compress/detail/fp.hpp>  (inlined)
// #include <ebbflow/compress/detail/philox.hpp>  (inlined)
// #include <ebbflow/compress/kernels/block.hpp>  (inlined)

#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>

EBBFLOW_BEGIN_NAMESPACE
namespace compress::kernels {

//! |v| by clearing the sign bit.
EBBFLOW_HD inline float abs_bits(float v) noexcept { return detail::as_f32(detail::as_u32(v) & 0x7FFFFFFFu); }
//! Whether an element of magnitude `a` is sent at threshold `t`: at or above
//! it and not zero, or NaN (a non-finite input gives a non-finite output,
//! never a silent 0). Branch-free, so the selecting loops vectorise; the
//! counting and the packing passes use this one test.
EBBFLOW_HD inline bool selected(float a, float t) noexcept { return ((a >= t) & (a > 0.0f)) | (a != a); }

//! High 64 bits of the 128-bit product a * b: maps a uniform 64-bit word
//! onto [0, b) without a division (Lemire), the same on host and device.
EBBFLOW_HD inline std::uint64_t mulhi64(std::uint64_t a, std::uint64_t b) noexcept {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#elif defined(__SIZEOF_INT128__)
  __extension__ using u128 = unsigned __int128;
  return static_cast<std::uint64_t>((static_cast<u128>(a) * b) >> 64);
#else
  const std::uint64_t m = 0xFFFFFFFFu, al = a & m, ah = a >> 32, bl = b & m, bh = b >> 32;
  const std::uint64_t p0 = al * bl, p1 = al * bh, p2 = ah * bl;
  const std::uint64_t mid = (p0 >> 32) + (p1 & m) + (p2 & m);
  return ah * bh + (p1 >> 32) + (p2 >> 32) + (mid >> 32);
#endif
}

//! Samples drawn per call of `topk_sample`: two per Philox block, 32 blocks.
inline constexpr std::size_t topk_sample_chunk = 64;

//! sample[j] = |in[i] + res[i]| for Philox-chosen i (with replacement),
//! `topk_sample_chunk` samples per call. Sample 64 c + 2 g + h takes words
//! (x, y) (h = 0) or (z, w) (h = 1) of Philox group 32 c + g as a 64-bit
//! fraction of n: i = (x 2^32 + y) n / 2^64 (bias below n / 2^64).
struct topk_sample {
  const float* in;            //!< n input floats (executor's memory space)
  const float* res;           //!< n residual floats, or null
  float* sample;              //!< s sampled magnitudes (output)
  std::size_t n;              //!< element count (> 0)
  std::size_t s;              //!< sample count
  detail::philox_stream rng;  //!< chooses the sampled indices

  //! Draws samples [64 c, min(64 (c + 1), s)).
  EBBFLOW_HD void operator()(std::size_t c) const noexcept {
    std::uint32_t w[128];
    detail::philox_lanes<32>(rng, 32 * c, w);
    const std::size_t base = topk_sample_chunk * c;
    const std::size_t cnt = s - base < topk_sample_chunk ? s - base : topk_sample_chunk;
    for (std::size_t j = 0; j < cnt; ++j) {
      const std::size_t g = j >> 1, h = j & 1u;
      const std::uint64_t wide = (static_cast<std::uint64_t>(w[64 * h + g]) << 32) | w[64 * h + 32 + g];
      const auto i = static_cast<std::size_t>(mulhi64(wide, n));
      const float a = abs_bits(res ? detail::fadd(in[i], res[i]) : in[i]);
      sample[base + j] = a != a ? 0.0f : a;  // NaNs are always sent: they must not set the threshold
    }
  }
};

//! Single-thread functor: *threshold = the m-th largest of sample[0, s)
//! (quickselect, in place, deterministic pivots). Run with bulk(1, ...).
struct topk_threshold {
  float* sample;     //!< s magnitudes; reordered in place
  std::size_t s;     //!< sample count (> 0)
  std::size_t m;     //!< 1 <= m <= s
  float* threshold;  //!< one float (output)

  //! Runs the selection (the index is ignored).
  EBBFLOW_HD void operator()(std::size_t) const noexcept {
    // m-th largest == element at position s - m in ascending order.
    std::size_t want = s - m, lo = 0, hi = s - 1;
    while (lo < hi) {
      const float pivot = sample[lo + (hi - lo) / 2];
      std::size_t i = lo, j = hi;
      while (i <= j) {
        while (sample[i] < pivot) ++i;
        while (sample[j] > pivot) --j;
        if (i <= j) {
          const float t = sample[i];
          sample[i] = sample[j];
          sample[j] = t;
          ++i;
          if (j == 0) break;
          --j;
        }
      }
      if (want <= j)
        hi = j;
      else if (want >= i)
        lo = i;
      else
        break;
    }
    *threshold = sample[want];
  }
};

//! counts[b] = number of elements of block b with |v| >= threshold (> 0).
struct topk_count {
  const float* in;         //!< n input floats (executor's memory space)
  const float* res;        //!< n residual floats, or null
  const float* threshold;  //!< one float, from `topk_threshold`
  std::uint32_t* counts;   //!< one count per block (output)
  std::size_t n;           //!< element count

  //! Processes block `b` (elements [256 b, min(256 (b + 1), n))).
  EBBFLOW_HD void operator()(std::size_t b) const noexcept {
    const std::size_t o = b * block_size;
    const float t = *threshold;
    const float* EBBFLOW_DETAIL_RESTRICT pi = in + o;
    const float* EBBFLOW_DETAIL_RESTRICT pr = res ? res + o : nullptr;
    std::uint32_t c = 0;
    for_block(b, n, [&](auto cnt) {
      if (pr) {
        for (std::uint32_t j = 0; j < cnt; ++j) {
          const float a = abs_bits(detail::fadd(pi[j], pr[j]));
          c += selected(a, t) ? 1u : 0u;  // zeros carry nothing: never sent
        }
      } else {
        for (std::uint32_t j = 0; j < cnt; ++j) {
          const float a = abs_bits(pi[j]);
          c += selected(a, t) ? 1u : 0u;
        }
      }
    });
    counts[b] = c;
  }
};

//! Per-block counts form groups of `topk_scan_group` for the exclusive scan,
//! which runs in three passes so that its serial part is one step per group
//! instead of one per block: `topk_scan_local` (a thread per group),
//! `topk_scan_groups` (one thread over the group sums), `topk_scan_add` (a
//! thread per block).
inline constexpr std::size_t topk_scan_group = 256;

//! Groups of `topk_scan_group` blocks for `blocks` blocks.
EBBFLOW_HD constexpr std::size_t topk_scan_groups_of(std::size_t blocks) noexcept {
  return (blocks + topk_scan_group - 1) / topk_scan_group;
}

//! counts of group g -> offsets within the group (in place); sums[g] = the
//! group's total (at most 256 blocks of 256 elements: fits 32 bits).
struct topk_scan_local {
  std::uint32_t* counts;  //!< per-block counts in, offsets within the group out
  std::size_t blocks;     //!< block count
  std::uint32_t* sums;    //!< one total per group (output)

  //! Scans group `g` (blocks [256 g, min(256 (g + 1), blocks))).
  EBBFLOW_HD void operator()(std::size_t g) const noexcept {
    const std::size_t b0 = g * topk_scan_group;
    const std::size_t b1 = blocks - b0 < topk_scan_group ? blocks : b0 + topk_scan_group;
    std::uint32_t acc = 0;
    for (std::size_t b = b0; b < b1; ++b) {
      const std::uint32_t c = counts[b];
      counts[b] = acc;
      acc += c;
    }
    sums[g] = acc;
  }
};

//! Single-thread functor: group sums -> exclusive group offsets (in place,
//! saturating at 2^32 - 1); writes min(total, k) and 0 to the header. Run
//! with bulk(1, ...).
struct topk_scan_groups {
  std::uint32_t* sums;    //!< per-group totals in, exclusive group offsets out
  std::size_t groups;     //!< group count
  std::uint32_t* header;  //!< encoded buffer start
  std::size_t k;          //!< slot count

  //! Runs the scan (the index is ignored).
  EBBFLOW_HD void operator()(std::size_t) const noexcept {
    std::uint64_t acc = 0;
    for (std::size_t g = 0; g < groups; ++g) {
      const std::uint32_t c = sums[g];
      sums[g] = static_cast<std::uint32_t>(acc < 0xFFFFFFFFu ? acc : 0xFFFFFFFFu);
      acc += c;
    }
    header[0] = static_cast<std::uint32_t>(acc < k ? acc : k);
    header[1] = 0;
  }
};

//! offsets[b] += the offset of b's group (saturating): the exclusive scan of
//! the per-block counts over all blocks.
struct topk_scan_add {
  std::uint32_t* offsets;     //!< offsets within the group in, global offsets out
  const std::uint32_t* sums;  //!< exclusive group offsets, from `topk_scan_groups`

  //! Finishes block `b`'s offset.
  EBBFLOW_HD void operator()(std::size_t b) const noexcept {
    const std::uint32_t base = sums[b / topk_scan_group];
    offsets[b] = offsets[b] > 0xFFFFFFFFu - base ? 0xFFFFFFFFu : offsets[b] + base;
  }
};

//! Zeroes slot i when no element fills it (i >= the sent count in the
//! header, from `topk_scan_groups`), so an encoding's bytes depend on its
//! content alone.
struct topk_clear_slots {
  std::uint32_t* header;  //!< encoded buffer (count, 0, k indices, k values)
  std::size_t k;          //!< slot count

  //! Clears slot `i` if unused.
  EBBFLOW_HD void operator()(std::size_t i) const noexcept {
    if (i < header[0]) return;
    header[2 + i] = 0;
    header[2 + k + i] = 0;
  }
};

//! Packs block b's selected elements at its offset; updates the residual
//! (sent elements -> 0, others keep v); selected elements past slot k are
//! not sent and stay in the residual.
struct topk_write {
  const float* in;               //!< n input floats (executor's memory space)
  float* res;                    //!< n residual floats, or null
  const float* threshold;        //!< one float, from `topk_threshold`
  const std::uint32_t* offsets;  //!< first slot per block, from `topk_scan_add`
  std::uint32_t* indices;        //!< k slot indices (output)
  float* values;                 //!< k slot values (output)
  std::size_t n, k;
  //! @var n
  //! Element count.
  //! @var k
  //! Slot count.

  //! Processes block `b` (elements [256 b, min(256 (b + 1), n))).
  EBBFLOW_HD void operator()(std::size_t b) const noexcept {
    const std::size_t o = b * block_size;
    const float t = *threshold;
    const float* EBBFLOW_DETAIL_RESTRICT pi = in + o;
    float* EBBFLOW_DETAIL_RESTRICT pr = res ? res + o : nullptr;
    std::size_t slot = offsets[b];
    for_block(b, n, [&](auto cnt) {
      for (std::uint32_t j = 0; j < cnt; ++j) {
        const float v = pr ? detail::fadd(pi[j], pr[j]) : pi[j];
        const float a = abs_bits(v);
        const bool take = selected(a, t) && slot < k;
        if (take) {
          indices[slot] = static_cast<std::uint32_t>(o + j);
          values[slot] = v;
          ++slot;
        }
        if (pr) pr[j] = take ? 0.0f : detail::finite_or_zero(v);
      }
    });
  }
};

//! `topk_count`, the scan and `topk_write` in one pass, for executors
//! that call the blocks in increasing order on one thread (the single-thread
//! `exec::cpu_executor`): slots are handed out in index order as the pass
//! meets the selected elements, which is the order the exclusive scan gives,
//! so the encoding and the residual are the same bits. One read of the input
//! and the residual and one write of the residual, instead of two reads; the
//! caller writes the header and zeroes the unused slots afterwards. Host only.
struct topk_select_inorder {
  const float* in;         //!< n input floats (host memory)
  float* res;              //!< n residual floats, or null
  float threshold;         //!< from `topk_threshold`
  std::uint32_t* indices;  //!< k slot indices (output)
  float* values;           //!< k slot values (output)
  std::size_t n, k;
  std::size_t* slot;  //!< next free slot (in: 0 before block 0; out: the count sent)
  //! @var n
  //! Element count.
  //! @var k
  //! Slot count.

  //! Processes block `b`; blocks must come in increasing order, one at a time.
  void operator()(std::size_t b) const noexcept {
    with_residual(res, [&](auto ef) { run<decltype(ef)::value>(b); });
  }

 private:
  template <bool EF>
  void run(std::size_t b) const noexcept {
    const std::size_t o = b * block_size;
    const float t = threshold;
    const float* EBBFLOW_DETAIL_RESTRICT pi = in + o;
    float* EBBFLOW_DETAIL_RESTRICT pr = EF ? res + o : nullptr;
    std::size_t sl = *slot;
    // 32 elements at a time: a vectorised pass writes the new residual as if
    // every selected element were sent (0, else v), keeps v in registers and
    // builds a bit mask of the selected ones; the rare selected elements
    // (~1 in 100) are then packed through the mask, and any that find no free
    // slot get their v back.
    const auto part = [&](std::uint32_t c0, auto len) {
      float vb[32];
      std::uint32_t mask = 0;
      for (std::uint32_t j = 0; j < len; ++j) {
        const float v = EF ? detail::fadd(pi[c0 + j], pr[c0 + j]) : pi[c0 + j];
        const float a = abs_bits(v);
        const bool sel = selected(a, t);
        vb[j] = v;
        if constexpr (EF) pr[c0 + j] = sel ? 0.0f : v;
        mask |= static_cast<std::uint32_t>(sel) << j;
      }
      for (; mask != 0; mask &= mask - 1) {
        const auto j = static_cast<std::uint32_t>(std::countr_zero(mask));
        if (sl < k) {
          indices[sl] = static_cast<std::uint32_t>(o + c0 + j);
          values[sl] = vb[j];
          ++sl;
        } else if constexpr (EF) {
          pr[c0 + j] = detail::finite_or_zero(vb[j]);  // no slot left: stays in the residual
        }
      }
    };
    for_block(b, n, [&](auto cnt) {
      if constexpr (std::is_same_v<decltype(cnt), std::uint32_t>) {  // short tail block
        for (std::uint32_t c0 = 0; c0 < cnt; c0 += 32) part(c0, cnt - c0 < 32u ? cnt - c0 : 32u);
      } else {
        for (std::uint32_t c0 = 0; c0 < cnt; c0 += 32) part(c0, std::integral_constant<std::uint32_t, 32>{});
      }
    });
    *slot = sl;
  }
};

//! out[idx[i]] (+)= val[i] for the slots i < count of an encoding with k
//! slots. Indices within one encoding are distinct, so calls never collide.
template <bool Add>
struct topk_scatter {
  const std::uint32_t* header;  //!< encoded buffer (count, 0, k indices, k values)
  std::size_t k;                //!< slot count of the encoding
  float* out;                   //!< decoded floats (updated)

  //! Applies slot `i` (nothing when i >= the sent count).
  EBBFLOW_HD void operator()(std::size_t i) const noexcept {
    if (i >= header[0]) return;
    const std::uint32_t idx = header[2 + i];
    const float v = detail::as_f32(header[2 + k + i]);
    detail::store<Add>(out[idx], v);
  }
};

//! out[i] = 0.
struct fill_zero {
  float* out;  //!< floats to zero (executor's memory space)
  //! Zeroes element `i`.
  EBBFLOW_HD void operator()(std::size_t i) const noexcept { out[i] = 0.0f; }
};

}  // namespace compress::kernels
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/compress/kernels/topk.hpp>
// #include <ebbflow/core/error.hpp>  (inlined)

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

EBBFLOW_BEGIN_NAMESPACE
namespace compress {

//! Value type; thread-safe.
struct topk_codec {
  static constexpr codec_kind kind = codec_kind::sparse;  //!< not summable: encoded blocks are allgathered

  //! @throws std::invalid_argument unless 0 < ratio <= 1 and sample_size >= 64.
  explicit topk_codec(double ratio = 0.01, std::size_t sample_size = 16384) : ratio_(ratio), sample_(sample_size) {
    EBBFLOW_ENFORCE(ratio > 0.0 && ratio <= 1.0, "top-k ratio " << ratio << " outside (0, 1]");
    EBBFLOW_ENFORCE(sample_size >= 64, "top-k sample size " << sample_size << " below 64");
  }

  //! "topk".
  [[nodiscard]] std::string_view name() const noexcept { return "topk"; }
  //! Fraction of elements sent, in (0, 1].
  [[nodiscard]] double ratio() const noexcept { return ratio_; }
  //! Slots for n elements: ceil(ratio * n), at least 1 when n > 0.
  [[nodiscard]] std::size_t slots(std::size_t n) const noexcept {
    if (n == 0) return 0;
    return std::clamp<std::size_t>(static_cast<std::size_t>(std::ceil(ratio_ * static_cast<double>(n))), 1, n);
  }
  //! Encoded size of `n` elements: an 8-byte header plus (index, value) per slot.
  [[nodiscard]] std::size_t max_encoded_bytes(std::size_t n) const noexcept { return align8(8 + 8 * slots(n)); }
  //! Elements sampled to estimate the threshold: min(sample_size, n).
  [[nodiscard]] std::size_t sample_count(std::size_t n) const noexcept { return std::min(sample_, n); }
  //! Scratch for the sample, per-block counts, per-group sums and the threshold.
  [[nodiscard]] std::size_t workspace_bytes(std::size_t n) const noexcept {
    const std::size_t nb = kernels::blocks_of(n);
    return align8(4 * sample_count(n)) + align8(4 * nb) + align8(4 * kernels::topk_scan_groups_of(nb)) + 8;
  }
  //! Segment granularity: `kernels::block_size` (256) elements.
  [[nodiscard]] std::size_t block_elems() const noexcept { return kernels::block_size; }

  //! Needs `ctx.workspace` (workspace_bytes(n), same space) when n > 0.
  template <class Ex>
  void encode(Ex& ex, const float* in, float* residual, std::byte* out, std::size_t n, encode_context ctx) const {
    if (n == 0) return;
    EBBFLOW_ENFORCE(ctx.workspace != nullptr, "top-k encode needs a workspace of " << workspace_bytes(n) << " bytes");
    const std::size_t k = slots(n), s = sample_count(n), nb = kernels::blocks_of(n);
    auto* sample = reinterpret_cast<float*>(ctx.workspace);
    auto* counts = reinterpret_cast<std::uint32_t*>(ctx.workspace + align8(4 * s));
    const std::size_t ng = kernels::topk_scan_groups_of(nb);
    auto* sums = reinterpret_cast<std::uint32_t*>(ctx.workspace + align8(4 * s) + align8(4 * nb));
    auto* thr = reinterpret_cast<float*>(ctx.workspace + align8(4 * s) + align8(4 * nb) + align8(4 * ng));
    auto* header = reinterpret_cast<std::uint32_t*>(out);
    // Rank of the threshold in the sample: the same quantile as k in n.
    const std::size_t m =
        std::clamp<std::size_t>(static_cast<std::size_t>(std::llround(static_cast<double>(s) * static_cast<double>(k) /
                                                                      static_cast<double>(n))),
                                1, s);
    detail::bulk(ex, (s + kernels::topk_sample_chunk - 1) / kernels::topk_sample_chunk,
                 kernels::topk_sample{in, residual, sample, n, s, {ctx.seed, ctx.stream}});
    ex.bulk(1, kernels::topk_threshold{sample, s, m, thr});
    auto* indices = header + 2;
    auto* values = reinterpret_cast<float*>(header + 2 + k);
    if constexpr (std::is_same_v<std::remove_cv_t<Ex>, exec::cpu_executor>) {
      if (ex.threads() <= 1) {  // in order on this thread: count, scan and pack in one pass
        std::size_t sent = 0;
        detail::host_loop(nb, kernels::topk_select_inorder{in, residual, *thr, indices, values, n, k, &sent});
        header[0] = static_cast<std::uint32_t>(sent);
        header[1] = 0;
        std::fill(indices + sent, indices + k, 0u);
        std::fill(values + sent, values + k, 0.0f);
        return;
      }
    }
    detail::bulk(ex, nb, kernels::topk_count{in, residual, thr, counts, n});
    // Exclusive scan of the counts: a thread per group of 256 blocks, one
    // over the group sums, a thread per block; then the unused slots are
    // zeroed in parallel and the selected elements packed.
    detail::bulk(ex, ng, kernels::topk_scan_local{counts, nb, sums});
    ex.bulk(1, kernels::topk_scan_groups{sums, ng, header, k});
    detail::bulk(ex, nb, kernels::topk_scan_add{counts, sums});
    detail::bulk(ex, k, kernels::topk_clear_slots{header, k});
    detail::bulk(ex, nb, kernels::topk_write{in, residual, thr, counts, indices, values, n, k});
  }
  //! Zeroes `out`, then scatters the sent values of `in` into it (both in
  //! `Ex`'s space; completes as `ex.bulk` does).
  template <class Ex>
  void decode(Ex& ex, const std::byte* in, float* out, std::size_t n) const {
    ex.bulk(n, kernels::fill_zero{out});
    decode_add(ex, in, out, n);
  }
  //! Writes the sum of the `count` encodings `in[0 .. count)` (each of `n`
  //! elements) to `out`, adding them in array order: the same bits as
  //! `decode(in[0])` followed by `decode_add` of the others. The pointer
  //! array is host memory; the encodings and `out` are in `Ex`'s space.
  //! On the single-thread CPU executor it walks `out` in L1-sized tiles,
  //! zeroing a tile and adding every encoding's entries that fall in it
  //! (indices are sorted), so `out` goes through memory once instead of once
  //! plus once per encoding's scattered read-modify-writes.
  template <class Ex>
  void decode_sum(Ex& ex, const std::byte* const* in, std::size_t count, float* out, std::size_t n) const {
    if (count == 0 || n == 0) return;
    if constexpr (std::is_same_v<std::remove_cv_t<Ex>, exec::cpu_executor>) {
      if (ex.threads() <= 1 && count <= max_sum_inputs) {
        constexpr std::size_t tile = 4096;  // 16 KiB of floats
        const std::size_t k = slots(n);
        std::size_t cur[max_sum_inputs] = {};
        for (std::size_t t0 = 0; t0 < n; t0 += tile) {
          const std::size_t t1 = std::min(n, t0 + tile);
          std::fill(out + t0, out + t1, 0.0f);
          for (std::size_t e = 0; e < count; ++e) {
            const auto* h = reinterpret_cast<const std::uint32_t*>(in[e]);
            const std::uint32_t* idx = h + 2;
            const std::uint32_t* val = h + 2 + k;
            std::size_t c = cur[e];
            for (const std::size_t sent = h[0]; c < sent && idx[c] < t1; ++c)
              out[idx[c]] = compress::detail::fadd(out[idx[c]], compress::detail::as_f32(val[c]));
            cur[e] = c;
          }
        }
        return;
      }
    }
    decode(ex, in[0], out, n);
    for (std::size_t e = 1; e < count; ++e) decode_add(ex, in[e], out, n);
  }
  //! Adds the sent values of `in` to their positions in `out` (both in
  //! `Ex`'s space; completes as `ex.bulk` does).
  template <class Ex>
  void decode_add(Ex& ex, const std::byte* in, float* out, std::size_t n) const {
    ex.bulk(slots(n), kernels::topk_scatter<true>{reinterpret_cast<const std::uint32_t*>(in), slots(n), out});
  }

 private:
  static constexpr std::size_t max_sum_inputs = 256;  // decode_sum's tiled path: encodings per call
  double ratio_;
  std::size_t sample_;
};
static_assert(codec<topk_codec>);

}  // namespace compress
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/compress/codecs/topk.hpp>
// #include <ebbflow/compress/compressed_allreduce.hpp>  (inlined here)
// ---- begin <ebbflow/compress/compressed_allreduce.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file compressed_allreduce.hpp
//! Error-feedback compressed allreduce (sum) over a host communicator
//! (`comm::transport_communicator`, over any `comm::transport`).
//!
//! The algorithm follows the codec's `kind`:
//! * `linear` (fp16, bf16, int8, int4): pipelined ring reduce-scatter with
//!   decode-add-encode per hop, then a ring allgather of the encoded chunks
//!   (the casts scale each block of 256 by its own power of two, at every
//!   hop, so no running sum leaves their range);
//! * `sparse` (top-k): ring allgather of every rank's encoded tensor, decoded
//!   by everybody in rank order;
//! * `sign` (1-bit): compressed reduce-scatter, sum, re-encode with a second
//!   residual, compressed allgather (DeepSpeed 1-bit);
//! * `low_rank` (PowerSGD): two dense allreduces of the factors P and Q.
//! Dense traffic (tensors smaller than `dense_threshold_bytes`, PowerSGD's
//! factors and the tail its matrix leaves out) is the communicator's own
//! allreduce, with its choice of algorithm: recursive doubling for small
//! tensors, single copy on one host, the ring for large ones. Every rank
//! ends with the same bits. Error-feedback state (residuals, PowerSGD's Q)
//! is kept per tensor key and survives between calls.
//!
//! Tags: the codec-specific algorithms take their sequence numbers from the
//! communicator (`next_sequence`), the counter of its own collectives, so any
//! number of allreduce objects and the communicator's collectives share one
//! transport with nothing for the caller to keep apart.
//!
//! Requirements: every rank calls `run` with the same keys, sizes and codec,
//! in the same order relative to every other collective on the communicator
//! (collectives are matched by their sequence numbers).
//! Memory: `grad` must be host-accessible (the executor computes in place;
//! a device path needs staging buffers and is a follow-up). Blocking.
//! Thread safety: one thread drives the object and its communicator.
//! Errors: the throwing `run` raises `ebbflow::system_error` (timeout,
//! peer_lost, bad_message, with rank/peer/generation); the `ec` form reports
//! the same code. After an error the result and the residuals of that tensor
//! are unspecified; call `reset()` before reuse.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/comm/communicator.hpp>  (inlined)
// #include <ebbflow/comm/transport.hpp>  (inlined)
// #include <ebbflow/compress/codec.hpp>  (inlined)
// #include <ebbflow/compress/codecs/powersgd.hpp>  (inlined)
// #include <ebbflow/compress/detail/collectives.hpp>  (inlined here)
// ---- begin <ebbflow/compress/detail/collectives.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file collectives.hpp
//! The codec-specific algorithms behind `compressed_allreduce`, written over
//! the `comm::transport` concept: a ring with decode-add-encode per hop
//! (linear codes), a ring allgather of encoded blocks (sparse codes) and the
//! two-phase sign scheme. Dense traffic is not here: it is the communicator's
//! allreduce. Each call runs under one sequence number that the caller took
//! from the communicator (`coll_ctx::seq`), and numbers its steps within it.
//!
//! Pipelining: the tensor is cut into chunks (one per rank, block aligned) and
//! chunks into segments of `seg_elems`; all receives are posted up front,
//! each segment is sent as soon as it is encoded, so encoding segment k+1
//! overlaps the transfer of segment k, and a segment is forwarded to the next
//! hop as soon as it arrived. Segments of one (peer, tag) arrive in posting
//! order (the transport is non-overtaking), so one tag per ring step suffices.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/comm/transport.hpp>  (inlined)
// #include <ebbflow/compress/codec.hpp>  (inlined)
// #include <ebbflow/compress/detail/philox.hpp>  (inlined)
// #include <ebbflow/compress/kernels/topk.hpp>  (inlined)  // fill_zero
// #include <ebbflow/core/deadline.hpp>  (inlined)
// #include <ebbflow/core/error.hpp>  (inlined)

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace compress::detail {

//! One pipelined segment: elements [begin, begin + len) of the tensor, its
//! encoding at byte `off` of its chunk's encoded area.
struct segment {
  std::size_t begin, len, off, bytes;
};
struct chunk {
  std::size_t begin = 0, end = 0, bytes = 0, area_off = 0;  //!< area_off: offset in a p-chunk arena
  std::vector<segment> segs;
};

//! Chunks (block aligned, one per rank) and their segments.
template <class Codec>
std::vector<chunk> make_layout(const Codec& c, std::size_t n, int parts, std::size_t seg_elems) {
  const std::size_t g = c.block_elems();
  const std::size_t blocks = (n + g - 1) / g;
  seg_elems = std::max(g, seg_elems / g * g);
  std::vector<chunk> out(static_cast<std::size_t>(parts));
  std::size_t area = 0;
  for (std::size_t k = 0; k < out.size(); ++k) {
    auto& ch = out[k];
    ch.begin = std::min(n, blocks * k / out.size() * g);
    ch.end = std::min(n, blocks * (k + 1) / out.size() * g);
    ch.area_off = area;
    for (std::size_t b = ch.begin; b < ch.end; b += seg_elems) {
      const std::size_t len = std::min(seg_elems, ch.end - b);
      const std::size_t bytes = c.max_encoded_bytes(len);
      ch.segs.push_back({b, len, ch.bytes, bytes});
      ch.bytes += bytes;
    }
    area += ch.bytes;
  }
  return out;
}
inline std::size_t area_bytes(const std::vector<chunk>& l) noexcept {
  return l.empty() ? 0 : l.back().area_off + l.back().bytes;
}

//! Per-call context shared by the algorithms.
struct coll_ctx {
  std::size_t seg_elems = 1 << 18;
  deadline dl = deadline::never();
  std::uint64_t seed = 0;
  std::uint64_t stream_base = 0;  //!< unique per (rank, call, tensor)
  std::uint64_t seq = 0;          //!< tag sequence number of this collective
  std::size_t wire_sent = 0;      //!< bytes this rank sent (accumulated)
  std::size_t saturated = 0;      //!< result elements beyond float's range from finite codes (accumulated)
  const char* op = "compressed_allreduce";
};

//! Reusable byte arenas (host memory) of one allreduce object.
struct arenas {
  std::vector<std::byte> a, b, c, ws;
  static std::byte* get(std::vector<std::byte>& v, std::size_t n) {
    if (v.size() < n) v.resize(n);
    return v.data();
  }
};

//! Requests plus the deadline/error plumbing.
template <class T>
class request_set {
 public:
  request_set(T& t, coll_ctx& ctx) : t_(t), ctx_(ctx) {}
  std::size_t recv(int peer, comm::tag_t tag, std::byte* p, std::size_t n) {
    reqs_.push_back(t_.irecv(peer, tag, std::span<std::byte>(p, n)));
    peers_.push_back(peer);
    return reqs_.size() - 1;
  }
  void send(int peer, comm::tag_t tag, const std::byte* p, std::size_t n) {
    sends_.push_back(t_.isend(peer, tag, std::span<const std::byte>(p, n)));
    send_peers_.push_back(peer);
    ctx_.wire_sent += n;
    // Fail fast when the transport already knows the peer is gone: otherwise
    // this rank would first wait for a receive that may never come.
    std::error_code ec;
    if (t_.test(sends_.back(), ec) && ec)
      throw_if(
          ec, {.rank = t_.rank(), .generation = t_.generation(), .peer = peer, .operation = ctx_.op, .detail = "send"});
  }
  //! Blocks until receive `i` completed. @throws system_error (timeout, peer_lost, ...).
  void wait_recv(std::size_t i) { wait(reqs_[i], peers_[i], "recv"); }
  //! True when receive `i` completed; does not block. @throws system_error on a failed receive.
  bool test_recv(std::size_t i) {
    std::error_code ec;
    const bool done = t_.test(reqs_[i], ec);
    throw_if(
        ec,
        {.rank = t_.rank(), .generation = t_.generation(), .peer = peers_[i], .operation = ctx_.op, .detail = "recv"});
    return done;
  }
  void wait_sends() {
    for (std::size_t i = 0; i < sends_.size(); ++i) wait(sends_[i], send_peers_[i], "send");
    sends_.clear();
    send_peers_.clear();
  }

 private:
  void wait(typename T::request& r, int peer, const char* what) {
    std::error_code ec;
    t_.wait(r, ctx_.dl, ec);
    throw_if(ec,
             {.rank = t_.rank(), .generation = t_.generation(), .peer = peer, .operation = ctx_.op, .detail = what});
  }
  T& t_;
  coll_ctx& ctx_;
  std::vector<typename T::request> reqs_, sends_;
  std::vector<int> peers_, send_peers_;
};

inline int mod(int a, int p) noexcept { return ((a % p) + p) % p; }

// Allgather steps are numbered from here; reduce-scatter and all-to-all
// steps (at most max_collective_ranks − 2) stay below it.
inline constexpr std::uint32_t ag_step = 0x8000;
static_assert(comm::max_collective_ranks - 2 < static_cast<int>(ag_step) &&
              (ag_step | static_cast<std::uint32_t>(comm::max_collective_ranks - 2)) <= comm::max_collective_step);

//! The allgather both rings end with. At step s (0 to p - 2) the encoded
//! chunk mod(first - s, p) arrives from the left neighbour into its place in
//! `ag`, goes on to the right unless s is the last step, and is decoded into
//! `data`. Step 0's own chunk (mod(first + 1, p)) is sent with `tag(0)` by the
//! caller once encoded.
template <class T>
struct ring_allgather {
  request_set<T>& rq;
  const std::vector<chunk>& layout;
  std::byte* ag;
  std::uint64_t seq;
  int p, first, left, right;
  std::vector<std::size_t> ids{};

  [[nodiscard]] comm::tag_t tag(int s) const noexcept {
    return comm::make_tag(seq, ag_step | static_cast<std::uint32_t>(s));
  }
  [[nodiscard]] const chunk& arriving(int s) const noexcept {
    return layout[static_cast<std::size_t>(mod(first - s, p))];
  }
  //! Posts every receive of the allgather (before any send of the collective).
  void post() {
    for (int s = 0; s < p - 1; ++s)
      for (const auto& sg : arriving(s).segs)
        ids.push_back(rq.recv(left, tag(s), ag + arriving(s).area_off + sg.off, sg.bytes));
  }
  //! Forwards and decodes every arriving chunk, in order.
  template <class Codec, class Ex>
  void finish(const Codec& codec, Ex& ex, float* data) {
    std::size_t k = 0;
    for (int s = 0; s < p - 1; ++s) {
      const chunk& c = arriving(s);
      for (const auto& sg : c.segs) {
        rq.wait_recv(ids[k++]);
        if (s < p - 2) rq.send(right, tag(s + 1), ag + c.area_off + sg.off, sg.bytes);
        codec.decode(ex, ag + c.area_off + sg.off, data + sg.begin, sg.len);
      }
    }
  }
};

inline encode_context seg_ctx(const coll_ctx& ctx, std::uint64_t phase, std::size_t begin, std::byte* ws) noexcept {
  return {ctx.seed, mix64(ctx.stream_base ^ mix64((phase << 56) ^ begin)), ws};
}

//! The ring's hop: encodes decode(`in`) + `data` (+ `res`) into `out`.
//! Codecs that can do it in one pass (`decode_add_encode`: the casts, which
//! keep the running sum in their scaled units) leave `data` as it is; the
//! others decode-add into `data` and encode that.
template <class Codec, class Ex>
void add_encode(const Codec& c, Ex& ex, const std::byte* in, float* data, float* res, std::byte* out, std::size_t n,
                const encode_context& ctx) {
  if constexpr (requires { c.decode_add_encode(ex, in, data, res, out, n); }) {
    c.decode_add_encode(ex, in, data, res, out, n);
  } else {
    c.decode_add(ex, in, data, n);
    c.encode(ex, data, res, out, n, ctx);
  }
}

//! Ring allreduce (sum) of `data[0, n)` with decode-add-encode per hop.
//! `res` (nullable) is the error-feedback residual of this rank, n floats:
//! every rank encodes every region exactly once per call, so the residual of
//! each region carries exactly that encode's error into the next call.
//! Each hop is `add_encode`. `ctx.saturated` counts the results beyond
//! float's range, for codecs that can tell (`saturated`: the casts).
template <class Codec, class T, class Ex>
void ring_allreduce(T& t, const Codec& codec, Ex& ex, float* data, std::size_t n, float* res, coll_ctx& ctx,
                    arenas& ar) {
  const int p = t.size(), r = t.rank();
  if (p == 1 || n == 0) return;
  const auto L = make_layout(codec, n, p, ctx.seg_elems);
  const std::size_t area = area_bytes(L);
  std::byte* rs_in = arenas::get(ar.a, area);
  std::byte* rs_out = arenas::get(ar.b, area);
  std::byte* ag = arenas::get(ar.c, area);
  std::byte* ws = arenas::get(ar.ws, codec.workspace_bytes(ctx.seg_elems) + 8);
  const int left = mod(r - 1, p), right = mod(r + 1, p);
  const auto tag_rs = [&](int s) { return comm::make_tag(ctx.seq, static_cast<std::uint32_t>(s)); };
  const auto& ch = [&](int c) -> const chunk& { return L[static_cast<std::size_t>(c)]; };

  request_set<T> rq(t, ctx);
  std::vector<std::size_t> rs_ids;
  for (int s = 0; s < p - 1; ++s)
    for (const auto& sg : ch(mod(r - s - 1, p)).segs)
      rs_ids.push_back(rq.recv(left, tag_rs(s), rs_in + ch(mod(r - s - 1, p)).area_off + sg.off, sg.bytes));
  ring_allgather<T> gather{rq, L, ag, ctx.seq, p, r, left, right};
  gather.post();

  float* no_res = nullptr;
  for (const auto& sg : ch(r).segs) {  // reduce-scatter step 0: my own chunk, local data
    codec.encode(ex, data + sg.begin, res ? res + sg.begin : no_res, rs_out + ch(r).area_off + sg.off, sg.len,
                 seg_ctx(ctx, 0, sg.begin, ws));
    ex.wait();
    rq.send(right, tag_rs(0), rs_out + ch(r).area_off + sg.off, sg.bytes);
  }
  std::size_t k = 0;
  for (int s = 0; s < p - 1; ++s) {
    const chunk& c = ch(mod(r - s - 1, p));
    for (const auto& sg : c.segs) {
      rq.wait_recv(rs_ids[k++]);
      // The last step completes the chunk: encode it once for the allgather
      // and keep exactly what the others will decode.
      std::byte* out = (s < p - 2 ? rs_out : ag) + c.area_off + sg.off;
      add_encode(codec, ex, rs_in + c.area_off + sg.off, data + sg.begin, res ? res + sg.begin : no_res, out, sg.len,
                 seg_ctx(ctx, 0, sg.begin, ws));
      if (s < p - 2) {
        ex.wait();
        rq.send(right, tag_rs(s + 1), out, sg.bytes);
      } else {
        codec.decode(ex, out, data + sg.begin, sg.len);
        ex.wait();
        rq.send(right, gather.tag(0), out, sg.bytes);
      }
    }
  }
  gather.finish(codec, ex, data);
  ex.wait();
  // Every chunk's final encoding is in `ag` now, on every rank: codes that
  // decode beyond float's range are counted the same everywhere.
  if constexpr (requires(const std::byte* e) { codec.saturated(e, data, n); })
    for (const auto& c : L)
      for (const auto& sg : c.segs) ctx.saturated += codec.saturated(ag + c.area_off + sg.off, data + sg.begin, sg.len);
  rq.wait_sends();
}

//! Ring allgather of every rank's encoded tensor; every rank adds the p
//! encodings in rank order (so every rank gets the same bits).
//!
//! The CPU work is spread over the transfer instead of following it: after
//! each own segment is encoded, receives that already completed are forwarded
//! at once, so the ring keeps moving while this rank encodes. A segment is
//! decoded as soon as its turn has come: with `decode_sum` (top-k), in one
//! tiled pass once all p encodings of it are here, which touches `data` once
//! instead of zeroing it and then scattering p times into memory (measured:
//! 18.5-20.6x -> 20.1-22.4x dense at 1 Gbit/s, 4 ranks on 2 cores, paired
//! runs); otherwise the segment is zeroed after its encode (its input is no
//! longer needed) and origin o is added once it is here and origins < o are.
template <class Codec, class T, class Ex>
void sparse_allreduce(T& t, const Codec& codec, Ex& ex, float* data, std::size_t n, float* res, coll_ctx& ctx,
                      arenas& ar) {
  const int p = t.size(), r = t.rank();
  if (p == 1 || n == 0) return;
  const auto L = make_layout(codec, n, 1, ctx.seg_elems);
  const chunk& all = L[0];
  const std::size_t nseg = all.segs.size();
  std::byte* g = arenas::get(ar.a, all.bytes * static_cast<std::size_t>(p));
  std::byte* ws = arenas::get(ar.ws, codec.workspace_bytes(ctx.seg_elems) + 8);
  const auto at = [&](int origin, const segment& sg) {
    return g + all.bytes * static_cast<std::size_t>(origin) + sg.off;
  };
  const int left = mod(r - 1, p), right = mod(r + 1, p);
  request_set<T> rq(t, ctx);
  std::vector<std::size_t> ids;
  for (int s = 0; s < p - 1; ++s)
    for (const auto& sg : all.segs)
      ids.push_back(
          rq.recv(left, comm::make_tag(ctx.seq, static_cast<std::uint32_t>(s)), at(mod(r - s - 1, p), sg), sg.bytes));
  // here[o * nseg + i]: segment i of origin o is in the arena; next[i]: the
  // next origin to add into segment i (valid once segment i is zeroed).
  std::vector<char> here(static_cast<std::size_t>(p) * nseg, 0);
  std::vector<int> next(nseg, 0);
  std::vector<char> zeroed(nseg, 0);
  constexpr bool has_sum = requires(const std::byte* const* e) { codec.decode_sum(ex, e, std::size_t{}, data, n); };
  std::vector<const std::byte*> parts(static_cast<std::size_t>(p));
  const auto apply = [&](std::size_t i) {
    if (!zeroed[i]) return;
    const segment& sg = all.segs[i];
    if constexpr (has_sum) {  // one pass over the segment once all p encodings are here
      for (int o = 0; o < p; ++o)
        if (!here[static_cast<std::size_t>(o) * nseg + i]) return;
      for (int o = 0; o < p; ++o) parts[static_cast<std::size_t>(o)] = at(o, sg);
      if (next[i] == 0) codec.decode_sum(ex, parts.data(), parts.size(), data + sg.begin, sg.len);
      next[i] = p;
    } else {
      while (next[i] < p && here[static_cast<std::size_t>(next[i]) * nseg + i]) {
        codec.decode_add(ex, at(next[i], sg), data + sg.begin, sg.len);
        ++next[i];
      }
    }
  };
  std::size_t k = 0;  // receives handled so far, in posting order
  const auto arrived = [&](std::size_t id) {
    const auto s = static_cast<int>(id / nseg);
    const std::size_t i = id % nseg;
    const segment& sg = all.segs[i];
    const int origin = mod(r - s - 1, p);
    if (s < p - 2) rq.send(right, comm::make_tag(ctx.seq, static_cast<std::uint32_t>(s + 1)), at(origin, sg), sg.bytes);
    here[static_cast<std::size_t>(origin) * nseg + i] = 1;
    apply(i);
  };
  float* no_res = nullptr;
  for (std::size_t i = 0; i < nseg; ++i) {
    const segment& sg = all.segs[i];
    codec.encode(ex, data + sg.begin, res ? res + sg.begin : no_res, at(r, sg), sg.len, seg_ctx(ctx, 1, sg.begin, ws));
    ex.wait();
    rq.send(right, comm::make_tag(ctx.seq, 0), at(r, sg), sg.bytes);
    for (; k < ids.size() && rq.test_recv(ids[k]); ++k) arrived(k);
    if constexpr (!has_sum) ex.bulk(sg.len, kernels::fill_zero{data + sg.begin});  // decode_sum writes every element
    zeroed[i] = 1;
    here[static_cast<std::size_t>(r) * nseg + i] = 1;
    apply(i);
  }
  for (; k < ids.size(); ++k) {
    rq.wait_recv(ids[k]);
    arrived(k);
  }
  ex.wait();
  rq.wait_sends();
}

//! DeepSpeed 1-bit style: every rank encodes its tensor (worker residual
//! `res`) and sends chunk c to rank c; rank c decodes the p versions in rank
//! order, sums, re-encodes with its server residual `res2` (n floats, only
//! chunk c used) and the encoded chunks are allgathered around the ring.
template <class Codec, class T, class Ex>
void two_phase_allreduce(T& t, const Codec& codec, Ex& ex, float* data, std::size_t n, float* res, float* res2,
                         coll_ctx& ctx, arenas& ar) {
  const int p = t.size(), r = t.rank();
  if (p == 1 || n == 0) return;
  const auto L = make_layout(codec, n, p, ctx.seg_elems);
  const std::size_t area = area_bytes(L);
  const chunk& mine = L[static_cast<std::size_t>(r)];
  std::byte* out = arenas::get(ar.a, area);
  std::byte* in = arenas::get(ar.b, mine.bytes * static_cast<std::size_t>(p));
  std::byte* ag = arenas::get(ar.c, area);
  std::byte* ws = arenas::get(ar.ws, codec.workspace_bytes(ctx.seg_elems) + 8);
  const auto& ch = [&](int c) -> const chunk& { return L[static_cast<std::size_t>(c)]; };
  const int left = mod(r - 1, p), right = mod(r + 1, p);
  request_set<T> rq(t, ctx);
  std::vector<std::size_t> a2a_ids(static_cast<std::size_t>(p) * mine.segs.size());
  for (int o = 0; o < p; ++o)
    if (o != r)
      for (std::size_t i = 0; i < mine.segs.size(); ++i)
        a2a_ids[static_cast<std::size_t>(o) * mine.segs.size() + i] =
            rq.recv(o, comm::make_tag(ctx.seq, 0), in + mine.bytes * static_cast<std::size_t>(o) + mine.segs[i].off,
                    mine.segs[i].bytes);
  ring_allgather<T> gather{rq, L, ag, ctx.seq, p, mod(r - 1, p), left, right};
  gather.post();
  float* no_res = nullptr;
  // Phase 1: compressed all-to-all (my chunk last, so the others start early).
  for (int k = 1; k <= p; ++k) {
    const int c = mod(r + k, p);
    for (const auto& sg : ch(c).segs) {
      codec.encode(ex, data + sg.begin, res ? res + sg.begin : no_res, out + ch(c).area_off + sg.off, sg.len,
                   seg_ctx(ctx, 2, sg.begin, ws));
      ex.wait();
      if (c != r) rq.send(c, comm::make_tag(ctx.seq, 0), out + ch(c).area_off + sg.off, sg.bytes);
    }
  }
  // Sum the p versions of my chunk in rank order, re-encode (server residual).
  for (std::size_t i = 0; i < mine.segs.size(); ++i) {
    const segment& sg = mine.segs[i];
    for (int o = 0; o < p; ++o) {
      const std::byte* src =
          o == r ? out + mine.area_off + sg.off : in + mine.bytes * static_cast<std::size_t>(o) + sg.off;
      if (o != r) rq.wait_recv(a2a_ids[static_cast<std::size_t>(o) * mine.segs.size() + i]);
      if (o == 0)
        codec.decode(ex, src, data + sg.begin, sg.len);
      else
        codec.decode_add(ex, src, data + sg.begin, sg.len);
    }
    std::byte* e = ag + mine.area_off + sg.off;
    codec.encode(ex, data + sg.begin, res2 ? res2 + sg.begin : no_res, e, sg.len, seg_ctx(ctx, 3, sg.begin, ws));
    codec.decode(ex, e, data + sg.begin, sg.len);
    ex.wait();
    rq.send(right, gather.tag(0), e, sg.bytes);
  }
  // Phase 2: ring allgather of the re-encoded chunks.
  gather.finish(codec, ex, data);
  ex.wait();
  rq.wait_sends();
}

}  // namespace compress::detail
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/compress/detail/collectives.hpp>
// #include <ebbflow/core/error.hpp>  (inlined)
// #include <ebbflow/core/memory.hpp>  (inlined)
// #include <ebbflow/exec/executor.hpp>  (inlined)

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <system_error>
#include <unordered_map>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace compress {

//! Tuning of a `compressed_allreduce`. Every rank must use the same values.
struct allreduce_options {
  //! Encoded (wire) bytes per pipelined segment, about: a segment holds as
  //! many elements as encode to this size (whole codec blocks, at most
  //! `segment_bytes` elements, or 4 `segment_bytes` for sparse codes, whose
  //! encode has a fixed cost per call), so strongly compressing codecs are
  //! not cut into tiny messages yet still overlap encoding with the transfer.
  std::size_t segment_bytes = std::size_t{1} << 20;
  //! Tensors smaller than this are reduced dense (exact, by the
  //! communicator's allreduce): compressing them costs more in latency than
  //! it saves in bytes.
  std::size_t dense_threshold_bytes = std::size_t{32} << 10;
  //! Keep the compression error and add it to the next call of the same tensor.
  bool error_feedback = true;
  //! Seed of the stochastic codecs and of PowerSGD's initial Q (same on all ranks).
  std::uint64_t seed = 0x5EEDC0DEull;
  //! Deadline of one `run`, from its start.
  std::chrono::milliseconds timeout{60000};
};

//! Counters of one allreduce object (this rank).
struct allreduce_stats {
  std::size_t calls = 0;            //!< `run` calls
  std::size_t wire_bytes_sent = 0;  //!< bytes handed to the transport (dense: as the communicator's algorithm sends)
  std::size_t dense_calls = 0;      //!< calls that took the dense path
  //! Elements that came out +-inf or NaN from finite codes: the sum left
  //! float's range (above about 3.4e38). Counted by the cast codecs (fp16,
  //! bf16) on the compressed path; the same on every rank.
  std::size_t saturated = 0;
};

//! An error-feedback compressed allreduce bound to one communicator over a
//! `Transport`. `Codec` is a `codec` or `powersgd_codec`.
template <class Codec, comm::transport Transport, exec::executor Executor = exec::cpu_executor>
class compressed_allreduce {
  static_assert(host_accessible(Executor::space), "compressed_allreduce needs host-accessible gradients for now");
  static_assert(codec<Codec> || Codec::kind == codec_kind::low_rank);

 public:
  //! The communicator it runs over.
  using communicator_type = comm::transport_communicator<Transport>;

  //! Keeps a reference to `comm`, which must outlive this object.
  //! @throws std::invalid_argument for `segment_bytes` below one codec block.
  compressed_allreduce(communicator_type& comm, Codec c, Executor ex = {}, allreduce_options opts = {});

  //! Sums `grad` (host-accessible, in place) over all ranks. `key` names the
  //! tensor whose residual is used. Low-rank codecs view the tensor as
  //! `powersgd_codec::shape_for(n)`. @throws system_error
  void run(std::span<float> grad, std::size_t key = 0);
  //! As above; errors in `ec`.
  void run(std::span<float> grad, std::size_t key, std::error_code& ec) noexcept;
  //! Low-rank codecs: the tensor is the row-major rows x cols matrix `shape`
  //! (shape.size() == grad.size()). Other codecs ignore the shape.
  void run(std::span<float> grad, std::size_t key, matrix_shape shape);

  //! Bytes this rank sends for one call on n elements (no dense threshold;
  //! PowerSGD's factors as the communicator's allreduce sends them).
  //! @throws std::invalid_argument where the communicator's allreduce would (a forced algorithm it cannot run).
  [[nodiscard]] std::size_t wire_bytes(std::size_t n) const;
  //! Counters since construction.
  [[nodiscard]] const allreduce_stats& stats() const noexcept { return stats_; }
  //! The codec given at construction.
  [[nodiscard]] const Codec& get_codec() const noexcept { return codec_; }
  //! Drops all residuals and PowerSGD state (e.g. after a membership change).
  void reset() noexcept { state_.clear(); }

 private:
  struct tensor_state {
    std::size_t n = 0;
    int ranks = 0;
    matrix_shape shape{};  // PowerSGD: Q is cols x r of this shape
    std::vector<float> res, res2, q, p, q_local;
  };
  tensor_state& state_for(std::size_t key, std::size_t n, matrix_shape shape);
  [[nodiscard]] std::size_t segment_elems(std::size_t n) const noexcept;
  void run_impl(std::span<float> grad, std::size_t key, matrix_shape shape);
  void run_low_rank(std::span<float> grad, tensor_state& st, matrix_shape shape, deadline d);
  void dense(std::span<float> x, deadline d);

  communicator_type* comm_;
  Codec codec_;
  Executor exec_;
  allreduce_options opts_;
  std::unordered_map<std::size_t, tensor_state> state_;
  detail::arenas arenas_;
  std::uint64_t call_ = 0;  // calls so far: selects the stochastic codecs' random streams
  allreduce_stats stats_;
};

}  // namespace compress
EBBFLOW_END_NAMESPACE

// #include <ebbflow/compress/impl/compressed_allreduce.hpp>  (inlined here)
// ---- begin <ebbflow/compress/impl/compressed_allreduce.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file impl/compressed_allreduce.hpp
//! Definitions of compressed_allreduce (included by the public header).


// #include <ebbflow/compress/compressed_allreduce.hpp>  (inlined)

EBBFLOW_BEGIN_NAMESPACE
namespace compress {

template <class Codec, comm::transport Transport, exec::executor Executor>
compressed_allreduce<Codec, Transport, Executor>::compressed_allreduce(communicator_type& comm, Codec c, Executor ex,
                                                                       allreduce_options opts)
    : comm_(&comm), codec_(std::move(c)), exec_(std::move(ex)), opts_(opts) {
  EBBFLOW_ENFORCE(opts_.segment_bytes >= 4 * kernels::block_size,
                  "segment_bytes " << opts_.segment_bytes << " below one block (" << 4 * kernels::block_size << ")");
}

template <class Codec, comm::transport Transport, exec::executor Executor>
auto compressed_allreduce<Codec, Transport, Executor>::state_for(std::size_t key, std::size_t n, matrix_shape shape)
    -> tensor_state& {
  auto& st = state_[key];
  // A new tensor, another matrix shape of it (PowerSGD's Q would not fit),
  // or the group changed: start afresh.
  if (st.n != n || st.ranks != comm_->size() || st.shape.rows != shape.rows || st.shape.cols != shape.cols) {
    st = tensor_state{};
    st.n = n;
    st.ranks = comm_->size();
    st.shape = shape;
  }
  return st;
}

template <class Codec, comm::transport Transport, exec::executor Executor>
void compressed_allreduce<Codec, Transport, Executor>::run(std::span<float> grad, std::size_t key) {
  run_impl(grad, key, Codec::kind == codec_kind::low_rank ? powersgd_codec::shape_for(grad.size()) : matrix_shape{});
}

template <class Codec, comm::transport Transport, exec::executor Executor>
void compressed_allreduce<Codec, Transport, Executor>::run(std::span<float> grad, std::size_t key, matrix_shape shape) {
  EBBFLOW_ENFORCE(
      Codec::kind != codec_kind::low_rank || shape.size() == grad.size(),
      "matrix shape " << shape.rows << "x" << shape.cols << " does not cover " << grad.size() << " elements");
  run_impl(grad, key, shape);
}

template <class Codec, comm::transport Transport, exec::executor Executor>
void compressed_allreduce<Codec, Transport, Executor>::run(std::span<float> grad, std::size_t key,
                                                           std::error_code& ec) noexcept {
  ec.clear();
  try {
    run(grad, key);
  } catch (const std::system_error& e) {
    ec = e.code();
  } catch (const std::bad_alloc&) {
    ec = std::make_error_code(std::errc::not_enough_memory);
  } catch (...) {
    ec = make_error_code(error::invalid_state);
  }
}

template <class Codec, comm::transport Transport, exec::executor Executor>
void compressed_allreduce<Codec, Transport, Executor>::run_impl(std::span<float> grad, std::size_t key,
                                                                matrix_shape shape) {
  const std::size_t n = grad.size();
  const std::uint64_t call = call_++;
  ++stats_.calls;
  const deadline dl = deadline::after(opts_.timeout);
  if (comm_->size() == 1 || n == 0) return;
  if (n * sizeof(float) < opts_.dense_threshold_bytes) {
    ++stats_.dense_calls;
    dense(grad, dl);
    return;
  }
  tensor_state& st = state_for(key, n, shape);
  float* res = nullptr;
  if (opts_.error_feedback || Codec::kind == codec_kind::sign) {  // sign codes are useless without it
    if (st.res.empty()) st.res.assign(n, 0.0f);
    res = st.res.data();
  }
  if constexpr (Codec::kind == codec_kind::low_rank) {
    run_low_rank(grad, st, shape, dl);
  } else {
    Transport& t = comm_->transport();
    detail::coll_ctx ctx;
    ctx.seg_elems = segment_elems(n);
    ctx.dl = dl;
    ctx.seed = opts_.seed;
    ctx.stream_base = detail::mix64(detail::mix64(call) ^ detail::mix64(key + 0x1234567) ^
                                    detail::mix64(static_cast<std::uint64_t>(t.rank()) + 1));
    ctx.seq = comm_->next_sequence();
    if constexpr (Codec::kind == codec_kind::linear) {
      detail::ring_allreduce(t, codec_, exec_, grad.data(), n, res, ctx, arenas_);
    } else if constexpr (Codec::kind == codec_kind::sparse) {
      detail::sparse_allreduce(t, codec_, exec_, grad.data(), n, res, ctx, arenas_);
    } else {
      if (st.res2.empty()) st.res2.assign(n, 0.0f);
      detail::two_phase_allreduce(t, codec_, exec_, grad.data(), n, res, st.res2.data(), ctx, arenas_);
    }
    stats_.wire_bytes_sent += ctx.wire_sent;
    stats_.saturated += ctx.saturated;
  }
}

template <class Codec, comm::transport Transport, exec::executor Executor>
void compressed_allreduce<Codec, Transport, Executor>::dense(std::span<float> x, deadline d) {
  stats_.wire_bytes_sent += comm_->allreduce_bytes_sent(x.size(), dtype::f32);
  comm_->allreduce(view(x), reduce_op::sum, d);
}

template <class Codec, comm::transport Transport, exec::executor Executor>
void compressed_allreduce<Codec, Transport, Executor>::run_low_rank(std::span<float> grad, tensor_state& st,
                                                                    matrix_shape shape, deadline d) {
  if constexpr (Codec::kind == codec_kind::low_rank) {
    const std::size_t main = shape.size(), r = codec_.rank_for(shape);
    float* m = grad.data();
    if (main > 0 && r > 0) {
      if (opts_.error_feedback)  // M = grad + residual, in place
        exec_.bulk(main, kernels::add_into{m, st.res.data(), m});
      if (st.q.empty()) {
        st.q.resize(shape.cols * r);
        codec_.init_q(exec_, st.q.data(), shape, opts_.seed);
      }
      st.p.resize(shape.rows * r);
      st.q_local.resize(shape.cols * r);
      // The factors are directions: powers of two keep their entries near 1,
      // so that neither P = M Q (Q, the last sum, has M's magnitude) nor the
      // orthogonalisation (squares) leaves float's range or falls below its
      // eps at the gradient's magnitude. Q and the summed P are the same on
      // every rank, so are their scales.
      codec_.normalize(exec_, st.q.data(), shape.cols, shape);
      codec_.compute_p(exec_, m, st.q.data(), st.p.data(), shape);
      exec_.wait();
      dense(st.p, d);
      codec_.normalize(exec_, st.p.data(), shape.rows, shape);
      codec_.orthogonalize(exec_, st.p.data(), shape);
      codec_.compute_q(exec_, m, st.p.data(), st.q_local.data(), shape);
      if (opts_.error_feedback) codec_.residual(exec_, m, st.p.data(), st.q_local.data(), st.res.data(), shape);
      exec_.wait();
      st.q = st.q_local;
      dense(st.q, d);
      codec_.reconstruct(exec_, st.p.data(), st.q.data(), m, shape);  // warm start: keep the summed Q
      codec_.refresh_q(exec_, st.q.data(), shape, opts_.seed);        // ... with its dropped columns refilled
      exec_.wait();
    }
    if (main < grad.size()) dense(grad.subspan(main), d);
  } else {
    (void)grad, (void)st, (void)shape, (void)d;
  }
}

template <class Codec, comm::transport Transport, exec::executor Executor>
std::size_t compressed_allreduce<Codec, Transport, Executor>::segment_elems(std::size_t n) const noexcept {
  std::size_t per = opts_.segment_bytes / 4;  // raw floats
  if constexpr (Codec::kind != codec_kind::low_rank) {
    const std::size_t probe = std::max<std::size_t>(n, 1 << 16);
    const double bytes_per_elem = static_cast<double>(codec_.max_encoded_bytes(probe)) / static_cast<double>(probe);
    if (bytes_per_elem > 0) per = static_cast<std::size_t>(static_cast<double>(opts_.segment_bytes) / bytes_per_elem);
    // ... but at most 4x the raw-float segment, so that encoding still
    // overlaps the transfer for very sparse codes (top-k: ~0.08 B/element).
    // Sparse codes get 16x: each top-k encode draws a fixed-size threshold
    // sample (16384 random reads by default, ~0.3 ms from DRAM), which at 1 M
    // elements per segment cost as much as the selection pass itself;
    // measured on 4 ranks x 8 M elements at 1 Gbit/s, p50 of the top-k
    // allreduce: 39 ms at 1 M elements per segment, 35 at 2 M, 22-24 at 4 M,
    // 25 at 8 M (one segment: no encode/transfer overlap left).
    per = std::min(per, Codec::kind == codec_kind::sparse ? 4 * opts_.segment_bytes : opts_.segment_bytes);
  }
  return std::max<std::size_t>(per, kernels::block_size);
}

template <class Codec, comm::transport Transport, exec::executor Executor>
std::size_t compressed_allreduce<Codec, Transport, Executor>::wire_bytes(std::size_t n) const {
  const auto p = static_cast<std::size_t>(comm_->size());
  if (p <= 1 || n == 0) return 0;
  const auto rk = static_cast<std::size_t>(comm_->rank());
  if constexpr (Codec::kind == codec_kind::low_rank) {
    const matrix_shape s = powersgd_codec::shape_for(n);
    const std::size_t r = codec_.rank_for(s);
    const auto sent = [&](std::size_t count) { return comm_->allreduce_bytes_sent(count, dtype::f32); };
    return (s.size() > 0 && r > 0 ? sent(s.rows * r) + sent(s.cols * r) : 0) + sent(n - s.size());
  } else {
    const std::size_t seg = segment_elems(n);
    if constexpr (Codec::kind == codec_kind::sparse) {
      return (p - 1) * detail::area_bytes(detail::make_layout(codec_, n, 1, seg));
    } else {
      const auto l = detail::make_layout(codec_, n, static_cast<int>(p), seg);
      const std::size_t total = detail::area_bytes(l);
      const auto chunk = [&](std::size_t k) { return l[(rk + k) % p].bytes; };
      // linear: the reduce-scatter sends every chunk but (rank+1)'s, the allgather every chunk but (rank+2)'s;
      // sign: the all-to-all sends every chunk but mine, the allgather every chunk but (rank+1)'s.
      constexpr std::size_t skip = Codec::kind == codec_kind::linear ? 1 : 0;
      return (total - chunk(skip)) + (total - chunk(skip + 1));
    }
  }
}

}  // namespace compress
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/compress/impl/compressed_allreduce.hpp>
// ---- end <ebbflow/compress/compressed_allreduce.hpp>
// ==== end <ebbflow/compress.hpp>

// ==== begin <ebbflow/core/thread_name.hpp> ================================
// SPDX-License-Identifier: Apache-2.0
//! @file thread_name.hpp
//! Names for ebbflow's own threads, so that `top -H`, `ps -L`, `perf`,
//! `gdb` and `/proc/<pid>/task/<tid>/comm` show what each one is:
//!
//! | name | thread |
//! |---|---|
//! | `ebbflow-beat` | an elastic member's heartbeat (lease, failure watch) |
//! | `ebbflow-admit` | an elastic member's admission helper (a join or leave in the background) |
//! | `ebbflow-store` | the rendezvous store server's I/O thread |
//! | `ebbflow-loadN` | prefetcher loader N |
//! | `ebbflow-copy` | the prefetcher's host-to-device copy stage |
//!
//! Linux keeps 15 bytes of a thread's name; longer names are cut there.
//! Elsewhere naming does nothing.


// #include <ebbflow/config.hpp>  (inlined)

#include <algorithm>
#include <string_view>

#if defined(__linux__)
#include <pthread.h>
#endif

EBBFLOW_BEGIN_NAMESPACE

namespace detail {

//! Names thread `t` (a `std::thread` or `std::jthread` that has not been
//! joined; at most 15 bytes are kept); never fails. ebbflow calls it right
//! after starting `t`, from the starting thread, so the name is set by the
//! time the call that started `t` returns.
template <class Thread>
void name_thread(Thread& t, std::string_view name) noexcept {
#if defined(__linux__)
  char buf[16] = {};
  const std::size_t n = std::min<std::size_t>(name.size(), sizeof buf - 1);
  std::copy_n(name.data(), n, buf);
  ::pthread_setname_np(t.native_handle(), buf);
#else
  (void)t;
  (void)name;
#endif
}

}  // namespace detail

EBBFLOW_END_NAMESPACE
// ==== end <ebbflow/core/thread_name.hpp>

// ==== begin <ebbflow/elastic/cooldown.hpp> ================================
// SPDX-License-Identifier: Apache-2.0
//! @file cooldown.hpp
//! The back-off shared by the elastic group's join cool-down
//! (`EBBFLOW_JOIN_COOLDOWN`) and `ebbflow-run --restart-cooldown`: nothing
//! after a first failure, then SEC, doubling with every further failure in
//! a row, at most MAX. Written "SEC[:MAX]" in seconds; SEC 0 turns it off.


// #include <ebbflow/config.hpp>  (inlined)

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

//! SEC and MAX of a cool-down. Value type.
struct cooldown {
  std::chrono::milliseconds sec{1'000};   //!< the wait after the second failure in a row (0: never wait)
  std::chrono::milliseconds max{60'000};  //!< the longest wait

  //! The wait after `failures` failures in a row: 0 for fewer than 2 (or
  //! when SEC is 0), else SEC·2^(failures−2), at most MAX.
  [[nodiscard]] std::chrono::milliseconds after(std::int64_t failures) const noexcept {
    if (failures < 2 || sec.count() <= 0) return std::chrono::milliseconds(0);
    return std::min(max, sec * (std::int64_t{1} << std::min<std::int64_t>(failures - 2, 20)));
  }

  //! Parses "SEC[:MAX]" (seconds in [0, 86400]; MAX defaults to `defaults.max`).
  //! @throws std::invalid_argument "<what>='<text>': ..." on a malformed value.
  static cooldown parse(std::string_view text, std::string_view what, cooldown defaults) {
    const std::string t(text);
    // No source location in the message: a command line shows it to its user.
    const auto bad = [&](const char* why) { throw std::invalid_argument(std::string(what) + "='" + t + "': " + why); };
    const auto seconds = [&](const std::string& s) {
      char* end = nullptr;
      const double x = std::strtod(s.c_str(), &end);
      if (s.empty() || end != s.c_str() + s.size() || !(x >= 0 && x <= 86'400))
        bad("expected SEC[:MAX], seconds in [0, 86400]");
      return std::chrono::milliseconds(static_cast<std::int64_t>(x * 1000 + 0.5));
    };
    cooldown c = defaults;
    const auto colon = t.find(':');
    c.sec = seconds(t.substr(0, colon));
    if (colon != std::string::npos) c.max = seconds(t.substr(colon + 1));
    if (c.max < c.sec) bad("MAX is below SEC");
    return c;
  }
  //! As above, MAX defaulting to 60 s.
  static cooldown parse(std::string_view text, std::string_view what) { return parse(text, what, cooldown{}); }
};

}  // namespace elastic
EBBFLOW_END_NAMESPACE
// ==== end <ebbflow/elastic/cooldown.hpp>

// ==== begin <ebbflow/elastic/detail/store_protocol.hpp> ===================
// SPDX-License-Identifier: Apache-2.0
//! @file store_protocol.hpp
//! Wire protocol of the rendezvous store (no API promise).
//!
//! Every message is a frame: `u32 length` (little endian, bytes that follow),
//! then `u8 opcode`, then the opcode's fields. Field types: `u8`, `u32`,
//! `i64` (little endian) and `str` (`u32 length` + bytes, binary-safe).
//! Frames longer than a configurable limit are rejected before any allocation.
//!
//! Handshake (the secret never crosses the wire):
//!   server -> challenge{u8 version, nonce[32] server_nonce}
//!   client -> auth{u8 version, nonce[32] client_nonce, mac[32]}
//!             mac = HMAC-SHA256(token, "ebbflow-store client" | server_nonce | client_nonce)
//!   server -> welcome{mac[32]}  (HMAC over "ebbflow-store server" | ...: the server proves it too)
//!          or error{unauthorized} and closes.
//! Requests and their replies (one reply per request, in order):
//!   set{str key, str value}                    -> ok
//!   get{str key, u32 timeout_ms, u8 wait}      -> value{str} | missing | error{timeout}
//!   add{str key, i64 delta}                    -> integer{i64}
//!   compare_set{str key, str expected, str desired} -> cas_result{u8 swapped, str current}
//!   wait{u32 timeout_ms, u32 n, str key * n}   -> ok | error{timeout}
//!   wait_any{u32 timeout_ms, u32 n, str key * n} -> integer{index of the first key set} | error{timeout}
//!   erase{str key}                             -> boolean{u8 existed}
//!   num_keys{}                                 -> integer{i64}
//!   check{u32 n, str key * n}                  -> boolean{u8 all present}
//!   watch{str prefix, u8 include_existing}     -> ok, then event{u8 kind, str key, str value} forever
//!   ping{}                                     -> ok
//!   any                                        -> error{u8 errc, str reason}
//! A malformed frame gets an error reply (when the socket still allows one)
//! and the connection is closed, since the byte stream cannot be resynchronised.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/error.hpp>  (inlined)

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail::proto {

inline constexpr std::uint8_t version = 1;
inline constexpr std::size_t header_bytes = 4;
inline constexpr std::size_t nonce_bytes = 32;
inline constexpr std::size_t mac_bytes = 32;
//! Default limit on a frame's length (bytes after the length prefix).
inline constexpr std::size_t default_max_message_bytes = std::size_t{16} << 20;
//! Limit before authentication: an unauthenticated peer cannot make the
//! server allocate more than this.
inline constexpr std::size_t preauth_max_message_bytes = 1024;
//! `timeout_ms` value meaning "no limit".
inline constexpr std::uint32_t no_timeout = 0xffffffffu;

enum class op : std::uint8_t {
  // client -> server
  auth = 0x01,
  set = 0x02,
  get = 0x03,
  add = 0x04,
  compare_set = 0x05,
  wait = 0x06,
  erase = 0x07,
  num_keys = 0x08,
  check = 0x09,
  watch = 0x0a,
  ping = 0x0b,
  wait_any = 0x0c,
  // server -> client
  ok = 0x80,
  challenge = 0x81,
  welcome = 0x82,
  value = 0x83,
  missing = 0x84,
  integer = 0x85,
  cas_result = 0x86,
  boolean = 0x87,
  event = 0x88,
  error = 0x89,
};

//! Kinds of `event` frames.
enum class event_kind : std::uint8_t { set = 1, erase = 2 };

//! A decoded frame. Views point into the decoded buffer and live as long as it.
struct message {
  op code{};
  std::string_view key;                //!< set/get/add/compare_set/erase/event; watch: prefix
  std::string_view value;              //!< set/value/event; compare_set: desired; cas_result: current; error: reason
  std::string_view expected;           //!< compare_set
  std::vector<std::string_view> keys;  //!< wait/check
  std::int64_t integer = 0;            //!< add: delta; integer reply
  std::uint32_t timeout_ms = 0;        //!< get/wait
  std::uint8_t flag = 0;               //!< get: wait; watch: include existing; cas_result: swapped; boolean;
                                       //!< event: kind; error: errc value; challenge/auth: version
  std::string_view nonce;              //!< challenge/auth (nonce_bytes)
  std::string_view mac;                //!< auth/welcome (mac_bytes)
};

//! The members of `message` that frames carry, each with its wire type:
//! flag u8, timeout_ms u32, integer i64, key/value/expected str, keys
//! `u32 n, str * n`, nonce nonce_bytes and mac mac_bytes raw bytes.
enum class slot : std::uint8_t { flag, timeout_ms, integer, key, value, expected, keys, nonce, mac };

//! One field of a frame: the member it fills, and its name in errors.
struct field {
  slot where{};
  const char* name = nullptr;
};

//! An opcode's name and the fields after it, in wire order: the one
//! description of the frames that decoding (and anything that re-encodes a
//! message) follows.
struct layout {
  op code{};
  const char* name = "?";
  std::array<field, 3> fields{};
  std::uint8_t count = 0;
  [[nodiscard]] constexpr std::span<const field> list() const noexcept { return {fields.data(), count}; }
};

namespace detail {
constexpr layout frame(op o, const char* name) noexcept { return {o, name, {}, 0}; }
constexpr layout frame(op o, const char* name, field a) noexcept { return {o, name, {a}, 1}; }
constexpr layout frame(op o, const char* name, field a, field b) noexcept { return {o, name, {a, b}, 2}; }
constexpr layout frame(op o, const char* name, field a, field b, field c) noexcept { return {o, name, {a, b, c}, 3}; }
}  // namespace detail

inline constexpr layout layouts[] = {
    detail::frame(op::auth, "auth", {slot::flag, "version"}, {slot::nonce, "client nonce"}, {slot::mac, "mac"}),
    detail::frame(op::set, "set", {slot::key, "key"}, {slot::value, "value"}),
    detail::frame(op::get, "get", {slot::key, "key"}, {slot::timeout_ms, "timeout"}, {slot::flag, "wait flag"}),
    detail::frame(op::add, "add", {slot::key, "key"}, {slot::integer, "delta"}),
    detail::frame(op::compare_set, "compare_set", {slot::key, "key"}, {slot::expected, "expected value"},
                  {slot::value, "desired value"}),
    detail::frame(op::wait, "wait", {slot::timeout_ms, "timeout"}, {slot::keys, "key"}),
    detail::frame(op::erase, "erase", {slot::key, "key"}),
    detail::frame(op::num_keys, "num_keys"),
    detail::frame(op::check, "check", {slot::keys, "key"}),
    detail::frame(op::watch, "watch", {slot::key, "prefix"}, {slot::flag, "include-existing flag"}),
    detail::frame(op::ping, "ping"),
    detail::frame(op::wait_any, "wait_any", {slot::timeout_ms, "timeout"}, {slot::keys, "key"}),
    detail::frame(op::ok, "ok"),
    detail::frame(op::challenge, "challenge", {slot::flag, "version"}, {slot::nonce, "server nonce"}),
    detail::frame(op::welcome, "welcome", {slot::mac, "mac"}),
    detail::frame(op::value, "value", {slot::value, "value"}),
    detail::frame(op::missing, "missing"),
    detail::frame(op::integer, "integer", {slot::integer, "integer"}),
    detail::frame(op::cas_result, "cas_result", {slot::flag, "swapped flag"}, {slot::value, "current value"}),
    detail::frame(op::boolean, "boolean", {slot::flag, "boolean"}),
    detail::frame(op::event, "event", {slot::flag, "event kind"}, {slot::key, "key"}, {slot::value, "value"}),
    detail::frame(op::error, "error", {slot::flag, "error code"}, {slot::value, "reason"}),
};

//! The layout of opcode `raw`; nullptr when no opcode has that value.
constexpr const layout* find_layout(std::uint8_t raw) noexcept {
  for (const auto& l : layouts)
    if (static_cast<std::uint8_t>(l.code) == raw) return &l;
  return nullptr;
}

inline constexpr const char* op_name(op o) noexcept {
  const layout* l = find_layout(static_cast<std::uint8_t>(o));
  return l ? l->name : "?";
}

//! Result of `decode`: a message, or `errc::bad_message` with a reason.
struct decode_result {
  message msg;
  std::error_code ec;
  std::string reason;  //!< empty on success
  explicit operator bool() const noexcept { return !ec; }
};

//! Checks a frame's announced length; returns an empty string when acceptable.
inline std::string check_length(std::uint32_t length, std::size_t max_bytes) {
  if (length == 0) return "empty frame (length 0, no opcode)";
  if (length > max_bytes)
    return "frame length " + std::to_string(length) + " exceeds the limit of " + std::to_string(max_bytes) + " bytes";
  return {};
}

inline std::uint32_t load_u32(const char* p) noexcept {
  unsigned char b[4];
  std::memcpy(b, p, 4);
  return std::uint32_t(b[0]) | std::uint32_t(b[1]) << 8 | std::uint32_t(b[2]) << 16 | std::uint32_t(b[3]) << 24;
}

namespace detail {
//! Bounds-checked reader over a body; the first failure sticks.
class reader {
 public:
  explicit reader(std::string_view s) noexcept : s_(s) {}
  bool failed() const noexcept { return !why_.empty(); }
  const std::string& why() const noexcept { return why_; }
  std::size_t left() const noexcept { return s_.size() - pos_; }

  std::uint8_t u8(const char* field) {
    if (!need(1, field)) return 0;
    return static_cast<std::uint8_t>(s_[pos_++]);
  }
  std::uint32_t u32(const char* field) {
    if (!need(4, field)) return 0;
    auto v = load_u32(s_.data() + pos_);
    pos_ += 4;
    return v;
  }
  std::int64_t i64(const char* field) {
    if (!need(8, field)) return 0;
    std::uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s_[pos_ + static_cast<std::size_t>(i)]);
    pos_ += 8;
    return static_cast<std::int64_t>(v);
  }
  std::string_view fixed(std::size_t n, const char* field) {
    if (!need(n, field)) return {};
    auto v = s_.substr(pos_, n);
    pos_ += n;
    return v;
  }
  std::string_view str(const char* field) {
    const std::uint32_t n = u32(field);
    if (failed()) return {};
    if (n > left()) {
      fail(std::string(field) + " length " + std::to_string(n) + " exceeds the " + std::to_string(left()) +
           " bytes left in the frame");
      return {};
    }
    auto v = s_.substr(pos_, n);
    pos_ += n;
    return v;
  }
  void fail(std::string why) {
    if (why_.empty()) why_ = std::move(why);
  }

 private:
  bool need(std::size_t n, const char* field) {
    if (failed()) return false;
    if (left() < n) {
      fail(std::string("truncated: ") + field + " needs " + std::to_string(n) + " bytes, " + std::to_string(left()) +
           " left");
      return false;
    }
    return true;
  }
  std::string_view s_;
  std::size_t pos_ = 0;
  std::string why_;
};

inline void read_keys(reader& r, std::vector<std::string_view>& out) {
  const std::uint32_t n = r.u32("key count");
  if (r.failed()) return;
  // Every key takes at least its 4-byte length: never trust `n` for the reservation.
  if (n > r.left() / 4) {
    r.fail("key count " + std::to_string(n) + " cannot fit in the " + std::to_string(r.left()) +
           " bytes left in the frame");
    return;
  }
  out.reserve(n);
  for (std::uint32_t i = 0; i < n && !r.failed(); ++i) out.push_back(r.str("key"));
}

//! Reads field `f` into its member of `m`.
inline void read_field(reader& r, const field& f, message& m) {
  switch (f.where) {
    case slot::flag:
      m.flag = r.u8(f.name);
      break;
    case slot::timeout_ms:
      m.timeout_ms = r.u32(f.name);
      break;
    case slot::integer:
      m.integer = r.i64(f.name);
      break;
    case slot::key:
      m.key = r.str(f.name);
      break;
    case slot::value:
      m.value = r.str(f.name);
      break;
    case slot::expected:
      m.expected = r.str(f.name);
      break;
    case slot::keys:
      read_keys(r, m.keys);
      break;
    case slot::nonce:
      m.nonce = r.fixed(nonce_bytes, f.name);
      break;
    case slot::mac:
      m.mac = r.fixed(mac_bytes, f.name);
      break;
  }
}
}  // namespace detail

//! Decodes a frame body (opcode and fields, without the length prefix).
//! Never throws for bad input (only std::bad_alloc); never reads out of bounds.
inline decode_result decode_body(std::string_view body) {
  decode_result res;
  auto bad = [&](std::string why) {
    res.ec = make_error_code(ebbflow::error::bad_message);
    res.reason = std::move(why);
    return std::move(res);
  };
  if (body.empty()) return bad("empty frame (no opcode)");
  detail::reader r(body.substr(1));
  message& m = res.msg;
  const auto raw = static_cast<std::uint8_t>(body[0]);
  m.code = static_cast<op>(raw);
  const layout* l = find_layout(raw);
  if (!l) {
    static constexpr char hex[] = "0123456789abcdef";
    std::string h = "0x";
    h += hex[raw >> 4];
    h += hex[raw & 15];
    return bad("unknown opcode " + h);
  }
  for (const field& f : l->list()) detail::read_field(r, f, m);
  if (m.code == op::event && !r.failed() && m.flag != 1 && m.flag != 2)
    r.fail("unknown event kind " + std::to_string(m.flag));
  if (r.failed()) return bad(std::string(op_name(m.code)) + ": " + r.why());
  if (r.left() != 0)
    return bad(std::string(op_name(m.code)) + ": " + std::to_string(r.left()) + " trailing bytes after the last field");
  return res;
}

//! Decodes one whole frame (length prefix included). The length must match
//! the bytes given exactly and not exceed `max_bytes`. This is the fuzzed entry point.
inline decode_result decode(std::span<const std::byte> frame, std::size_t max_bytes = default_max_message_bytes) {
  const std::string_view s(reinterpret_cast<const char*>(frame.data()), frame.size());
  if (s.size() < header_bytes) {
    decode_result res;
    res.ec = make_error_code(ebbflow::error::bad_message);
    res.reason = "truncated header: " + std::to_string(s.size()) + " of 4 length bytes";
    return res;
  }
  const std::uint32_t len = load_u32(s.data());
  std::string why = check_length(len, max_bytes);
  if (why.empty() && len != s.size() - header_bytes)
    why = "frame length " + std::to_string(len) + " does not match the " + std::to_string(s.size() - header_bytes) +
          " bytes that follow";
  if (!why.empty()) {
    decode_result res;
    res.ec = make_error_code(ebbflow::error::bad_message);
    res.reason = std::move(why);
    return res;
  }
  return decode_body(s.substr(header_bytes));
}

//! Builds one frame in a std::string (the length is patched by `finish`).
class frame_builder {
 public:
  explicit frame_builder(op o, std::size_t reserve = 64) {
    buf_.reserve(reserve + header_bytes + 1);
    buf_.append(header_bytes, '\0');
    buf_.push_back(static_cast<char>(o));
  }
  frame_builder& u8(std::uint8_t v) {
    buf_.push_back(static_cast<char>(v));
    return *this;
  }
  frame_builder& u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) buf_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    return *this;
  }
  frame_builder& i64(std::int64_t s) {
    auto v = static_cast<std::uint64_t>(s);
    for (int i = 0; i < 8; ++i) buf_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    return *this;
  }
  frame_builder& raw(std::string_view s) {
    buf_.append(s);
    return *this;
  }
  frame_builder& str(std::string_view s) {
    u32(static_cast<std::uint32_t>(s.size()));
    buf_.append(s);
    return *this;
  }
  //! The finished frame (moves the buffer out); `size() - 4` must fit in u32.
  std::string finish() {
    const auto len = static_cast<std::uint32_t>(buf_.size() - header_bytes);
    for (int i = 0; i < 4; ++i) buf_[static_cast<std::size_t>(i)] = static_cast<char>((len >> (8 * i)) & 0xff);
    return std::move(buf_);
  }

 private:
  std::string buf_;
};

//! An `error` frame.
inline std::string error_frame(errc code, std::string_view reason) {
  return frame_builder(op::error, reason.size() + 8).u8(static_cast<std::uint8_t>(code)).str(reason).finish();
}

//! Maps an `error` frame's code to ebbflow's error code (unknown codes: bad_message).
inline std::error_code error_from_wire(std::uint8_t v) noexcept {
  if (v >= 1 && v <= static_cast<std::uint8_t>(ebbflow::error::job_finished))
    return make_error_code(static_cast<ebbflow::error>(v));
  return make_error_code(ebbflow::error::bad_message);
}

}  // namespace elastic::detail::proto

namespace elastic::detail {
//! A key for messages: quoted, non-printable bytes as \xNN, cut after 64 bytes.
inline std::string quote_key(std::string_view k) {
  std::string out = "'";
  const std::size_t n = std::min<std::size_t>(k.size(), 64);
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(k[i]);
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      static constexpr char hex[] = "0123456789abcdef";
      out += "\\x";
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  if (k.size() > n) out += "...";
  return out + "'";
}
}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
// ==== end <ebbflow/elastic/detail/store_protocol.hpp>

// ==== begin <ebbflow/elastic/store_options.hpp> ===========================
// SPDX-License-Identifier: Apache-2.0
//! @file store_options.hpp
//! The value types of the TCP rendezvous store (elastic/tcp_store.hpp): the
//! server's and the client's options, the server's counters, and the results
//! a client returns. Needs no Boost.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/elastic/detail/store_protocol.hpp>  (inlined)  // default_max_message_bytes

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

//! Configuration of a `store_server`.
struct server_options {
  std::string host = "127.0.0.1";  //!< address to bind ("0.0.0.0" / "::" for any)
  std::uint16_t port = 0;          //!< 0: pick a free port (see `store_server::port()`)
  std::string token;               //!< job secret clients must prove; empty: the empty token
  std::size_t max_message_bytes = detail::proto::default_max_message_bytes;  //!< frame limit
  //! A frame whose first byte arrived must be complete within this time
  //! (slow-loris defence); idle authenticated connections are kept.
  std::chrono::milliseconds frame_timeout{10000};
  //! A new connection must authenticate within this time.
  std::chrono::milliseconds auth_timeout{10000};
  std::size_t max_connections = 4096;  //!< further connections get an error and are closed
  //! Per connection: unsent replies/events beyond this close the connection
  //! (a watcher that does not read).
  std::size_t max_pending_output_bytes = std::size_t{64} << 20;

  //! Defaults plus `token` from `EBBFLOW_TOKEN`.
  static server_options from_environment();
};

//! Counters of a running server (read with relaxed atomics; for tests and logs).
struct server_stats {
  std::uint64_t accepted = 0;         //!< connections accepted
  std::uint64_t unauthorized = 0;     //!< connections refused for a bad token
  std::uint64_t protocol_errors = 0;  //!< connections closed for a malformed frame or a stall
  std::uint64_t open = 0;             //!< connections open now
};

//! Configuration of a `store_client`.
struct client_options {
  //! Deadline of calls that are not given one.
  std::chrono::milliseconds timeout{30000};
  //! Largest reply accepted.
  std::size_t max_message_bytes = detail::proto::default_max_message_bytes;
  //! Defaults plus `timeout` from `EBBFLOW_STORE_TIMEOUT_MS`.
  //! @throws std::invalid_argument for a malformed value.
  static client_options from_environment();
};

//! Result of `compare_set`.
struct compare_set_result {
  bool swapped = false;  //!< the desired value was stored
  std::string current;   //!< the value stored now
};

//! A change seen by a `store_watcher`.
struct store_event {
  //! What happened to the key.
  enum class kind { set, erase };
  kind type = kind::set;  //!< set (or initial report) or erase
  std::string key;        //!< the key that changed
  std::string value;      //!< the new value (empty for erase)
};

}  // namespace elastic
EBBFLOW_END_NAMESPACE
// ==== end <ebbflow/elastic/store_options.hpp>

// ==== begin <ebbflow/plan/work_stealing.hpp> ==============================
// SPDX-License-Identifier: Apache-2.0
//! @file work_stealing.hpp
//! In-step work stealing with exactly-once claims: a transient straggler's
//! unfinished tail is taken over by workers that finished early.
//!
//! A plan splits a step's B samples into per-rank slices (rank r owns the
//! b_r items [0, b_r) of its slice; `epoch_sampler::slice` maps them to data-set
//! indices). With stealing, each slice is consumed from the FRONT by its owner
//! and from the BACK by thieves, in chunks. Every claim on slice r is ONE
//! atomic fetch-add on one 64-bit store counter, `key(r)`, which packs two
//! counts: bits 32..62 hold F, the items the owner has requested so far, and
//! bits 0..31 hold K, the items thieves have requested. A claim of q items
//! adds q·2^32 (owner) or q (thief); `add` returns the value after the claim,
//! so the claimant knows the exact state (F, K) just before it and is granted
//! g = min(q, max(0, b_r − F − K)) items: the owner [F, F + g), a thief
//! [b_r − K − g, b_r − K).
//!
//! Exactly once, never out of range: the store applies the adds of one key in
//! a total order. While F + K <= b_r every claim so far was granted in full,
//! so the owner holds [0, F) and the thieves hold [b_r − K, b_r), disjoint
//! since F + K <= b_r. The claim that first makes F + K >= b_r is granted
//! exactly the gap b_r − F − K, and every later claim 0. Hence every item of
//! [0, b_r) is granted to exactly one claim. Every item is also processed:
//! the owner keeps claiming until a claim comes back short (its slice is
//! exhausted), so stealing is only an optimisation; a thief may stop whenever
//! it likes. The fields cannot overflow: the owner is the only writer of F and
//! never requests more than b_r − F (it knows F exactly), so F <= b_r < 2^31;
//! a thief requests at most what it last saw remaining and at most
//! `thief_request_limit(b_r, slices)`, and it makes at most one short claim
//! per slice (after one it knows the slice is exhausted), so
//! K <= b_r + slices·limit < 2^32 and never carries into F.
//!
//! Keys: `<prefix>/<generation>/<step>/<rank>`. The pair (generation, step)
//! must be unique per step *attempt*: a rolled-back step that is redone must
//! use a new generation (the elastic group's generation changes whenever a
//! step is rolled back) or a new step number, so counters of an old attempt,
//! and late claims of a zombie member, can never touch the new one. Cost:
//! one small integer key per (attempt, slice). `release()` erases the own
//! slice's key when the store supports `erase(key)` (the Boost.Asio store
//! client and memory_store do): call it once no member can claim in
//! this step any more, e.g. after the step's gradient allreduce. A late claim
//! on an erased key recreates a junk key of a dead attempt that nobody reads.
//!
//! Gradient weights (the loss-scaling contract): with stealing, worker i
//! trains on p_i = `processed()` samples (own and stolen) instead of b_i, and
//! Σ_i p_i = B. Each worker must weight each of its samples by 1/B: compute
//! the SUM of the per-sample losses over everything it processed in the step
//! (accumulating gradients over its chunks) and divide by B, or equivalently
//! scale its mean-loss gradient by w_i = p_i / B (`weight(B)`), not by the
//! plan's b_i / B. The allreduced sum is then the mean-loss gradient of the
//! step's B samples, exactly as without stealing. A worker that processed
//! nothing contributes a zero gradient and still takes part in the allreduce.
//!
//! Samples and data: a thief reads the data-set indices of another rank's
//! slice (`samples_of`), so stealing fits `epoch_sampler` over a data set
//! every worker can read; it does not fit `shard_sampler`, where only a shard's
//! owner reads it.
//!
//! Chunk sizes (`steal_options`, `owner_request`, `thief_request`): the owner
//! claims a first chunk (first_fraction·b_r, small enough that an owner up to
//! 1/first_fraction times slower than planned still finishes it in the planned
//! step time, and that measures its speed in this step), then everything but a
//! tail reserve (tail_reserve·b_r) at once, then guided chunks
//! ceil(rest / owner_divisor) of the reserve, never below min_chunk and never
//! leaving less than min_chunk behind. A step on plan thus costs about
//! 2 + log_{owner_divisor}(tail_reserve·b_r / min_chunk) claims; the reserve
//! is what thieves can take from an owner that is a little slow (noise),
//! while pacing leaves a straggler's whole rest to them. Callers may cap a
//! claim (`steal_policy` and `run_stealing_step` do all of this), e.g. with
//! `paced_owner_cap` so an owner that falls behind its planned step time
//! claims little and leaves its tail to thieves, and with `balanced_steal` so
//! a thief takes no more than it can finish before the victim would.
//!
//! Thread safety: a `work_stealer` is used by one thread (one per worker and
//! step); any number of workers, threads or processes may claim concurrently
//! through one store, which must make `add` atomic. Blocking: every claim and
//! `peek` is one store round trip, bounded by `steal_options::timeout`.
//! Errors: plan_error (empty_membership, slice_too_large, bad_rank,
//! bad_steal_request) for bad arguments; plan_fault(bad_counter) for a store
//! counter no valid claim sequence makes; store errors propagate unchanged
//! (e.g. `ebbflow::system_error` with errc::timeout or errc::peer_lost).


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/deadline.hpp>  (inlined)
// #include <ebbflow/plan/batch_planner.hpp>  (inlined here)
// ---- begin <ebbflow/plan/batch_planner.hpp>
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


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/plan/plan_error.hpp>  (inlined here)
// ---- begin <ebbflow/plan/plan_error.hpp>
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


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/enum_names.hpp>  (inlined)
// #include <ebbflow/core/error.hpp>  (inlined)

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
// ---- end <ebbflow/plan/plan_error.hpp>

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

// #include <ebbflow/plan/impl/batch_planner.hpp>  (inlined here)
// ---- begin <ebbflow/plan/impl/batch_planner.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file impl/batch_planner.hpp
//! Definitions for plan/batch_planner.hpp.
//!
//! How `solve` is exact. Write K = B − Σ lo_i and call the values
//! t_i(lo_i+1), ..., t_i(m_i) worker i's increments; they are non-decreasing
//! in b. Any split takes a prefix of each worker's increments, K in total, and
//! its step time is max(T_lo, largest increment taken) with T_lo = max_i
//! t_i(lo_i). Taking the K smallest increments therefore minimises the step
//! time, and taking them in (value, rank) order makes the choice unique.
//!
//! Finding them fast: a safeguarded Newton iteration solves the continuous
//! relaxation Σ clamp((S − a_i)/c_i, lo_i, m_i) = B for a level S (a few
//! O(n) passes; the function is monotone and piecewise linear). The level set
//! {increments <= S} is a downward-closed prefix of the (value, rank) order
//! whose size is within about n of K. A heap then adds the next-smallest
//! increments (or removes the largest ones) one at a time until exactly K are
//! taken: the result is the K-prefix of the order whatever S was, so rounding
//! in the Newton step never changes the plan, only the amount of heap work.


// #include <ebbflow/core/error.hpp>  (inlined)  // EBBFLOW_EXPECTS
// #include <ebbflow/plan/batch_planner.hpp>  (inlined)

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

// Compiled into ebbflow::compiled in separate compilation (config.hpp).
#if EBBFLOW_HEADER_ONLY
EBBFLOW_BEGIN_NAMESPACE
namespace plan {

EBBFLOW_DECL double batch_plan::weight(std::size_t rank) const {
  EBBFLOW_PLAN_ENFORCE(rank < batch.size(), plan_errc::bad_rank,
                       "rank " << rank << " outside a plan of " << batch.size() << " workers");
  return static_cast<double>(batch[rank]) / static_cast<double>(global_batch);
}

EBBFLOW_DECL std::vector<double> batch_plan::weights() const {
  std::vector<double> w(batch.size());
  for (std::size_t r = 0; r < batch.size(); ++r)
    w[r] = static_cast<double>(batch[r]) / static_cast<double>(global_batch);
  return w;
}

EBBFLOW_DECL std::size_t batch_plan::rank_of(std::uint64_t id) const noexcept {
  auto it = std::find(worker_ids.begin(), worker_ids.end(), id);
  return static_cast<std::size_t>(it - worker_ids.begin());
}

EBBFLOW_DECL void validate(std::span<const worker_spec> workers) {
  EBBFLOW_PLAN_ENFORCE(!workers.empty(), plan_errc::empty_membership, "the membership has no workers");
  for (const worker_spec& w : workers) {
    // 1 / c must be finite too: the solver divides by c (a subnormal c gave a
    // NaN level and a search one sample at a time).
    EBBFLOW_PLAN_ENFORCE_W(std::isfinite(w.c) && w.c > 0 && std::isfinite(1.0 / w.c), plan_errc::bad_cost, w.id,
                           "seconds per sample c = " << w.c << " must be finite and > 0 (and 1 / c finite)");
    EBBFLOW_PLAN_ENFORCE_W(std::isfinite(w.a) && w.a >= 0, plan_errc::bad_cost, w.id,
                           "fixed seconds a = " << w.a << " must be finite and >= 0");
    EBBFLOW_PLAN_ENFORCE_W(std::isfinite(w.comm_s) && w.comm_s >= 0, plan_errc::bad_cost, w.id,
                           "communication seconds comm_s = " << w.comm_s << " must be finite and >= 0");
    EBBFLOW_PLAN_ENFORCE_W(w.min_batch <= w.max_batch, plan_errc::bad_bounds, w.id,
                           "min_batch " << w.min_batch << " > max_batch " << w.max_batch);
  }
  bool increasing = true;  // the common case needs no sort
  for (std::size_t i = 1; i < workers.size() && increasing; ++i) increasing = workers[i - 1].id < workers[i].id;
  if (!increasing) {
    std::vector<std::uint64_t> ids(workers.size());
    for (std::size_t i = 0; i < workers.size(); ++i) ids[i] = workers[i].id;
    std::sort(ids.begin(), ids.end());
    auto dup = std::adjacent_find(ids.begin(), ids.end());
    EBBFLOW_PLAN_ENFORCE_W(dup == ids.end(), plan_errc::duplicate_worker, (dup == ids.end() ? 0 : *dup),
                           "appears more than once in the membership");
  }
}

namespace detail {
EBBFLOW_DECL std::size_t saturating_add(std::size_t x, std::size_t y) noexcept {
  return x > std::numeric_limits<std::size_t>::max() - y ? std::numeric_limits<std::size_t>::max() : x + y;
}

//! A plan's step time `t`, or NaN when a placeholder model made it.
inline double known_step_time(std::span<const worker_spec> workers, double t) noexcept {
  for (const auto& w : workers)
    if (w.placeholder) return std::numeric_limits<double>::quiet_NaN();
  return t;
}

//! Largest b in [lo, m] with w.step_time(b) <= s; requires w.step_time(lo) <= s.
EBBFLOW_DECL std::size_t level_count(const worker_spec& w, double inv_c, std::size_t lo, std::size_t m, double s) noexcept {
  double x = (s - (w.a + w.comm_s)) * inv_c;
  std::size_t g = !(x > static_cast<double>(lo)) ? lo : x >= static_cast<double>(m) ? m : static_cast<std::size_t>(x);
  // The division above is within an ulp or two of the truth; step towards
  // the exact answer, which is defined by step_time alone.
  for (int k = 0; k < 4 && g < m && w.step_time(g + 1) <= s; ++k) ++g;
  for (int k = 0; k < 4 && g > lo && w.step_time(g) > s; ++k) --g;
  if (w.step_time(g) <= s && (g == m || w.step_time(g + 1) > s)) return g;
  std::size_t lo_b = lo, hi_b = m;  // invariant: step_time(lo_b) <= s; answer in [lo_b, hi_b]
  while (lo_b < hi_b) {
    std::size_t mid = lo_b + (hi_b - lo_b + 1) / 2;
    if (w.step_time(mid) <= s)
      lo_b = mid;
    else
      hi_b = mid - 1;
  }
  return lo_b;
}

struct increment {
  double value;
  std::size_t rank;
};

//! The relaxed counts at a level s: Σ clamp((s − base_i)/c_i, lo_i, hi_i),
//! each term whole (floored) or not, and the sum's slope in s.
struct level_sums {
  std::span<const double> base, inv_c, lo, hi;

  double operator()(double s, bool whole, double& slope) const noexcept {
    double sum = 0;
    slope = 0;
    for (std::size_t i = 0; i < base.size(); ++i) {
      const double x = (s - base[i]) * inv_c[i];
      if (x <= lo[i]) {
        sum += lo[i];
      } else if (x >= hi[i]) {
        sum += hi[i];
      } else {
        sum += whole ? std::floor(x) : x;
        slope += inv_c[i];
      }
    }
    return sum;
  }
};

//! A level in [lo_s, hi_s] whose whole counts sum to within a handful of B.
//! A safeguarded Newton iteration solves the continuous relaxation (its
//! sum is monotone and piecewise linear in the level); whole samples under
//! that level fall short of it by the fractional parts (about n/2 in
//! total), and a few secant steps on the whole counts shrink that gap, so
//! the repair after it does O(few log n) work instead of O(n log n).
EBBFLOW_DECL double search_level(const level_sums& sums, double B, double lo_s, double hi_s, double start) noexcept {
  const double bracket_lo = lo_s, bracket_hi = hi_s;
  double s = std::clamp(start, lo_s, hi_s), slope = 0;
  for (int it = 0; it < 200; ++it) {
    const double f = sums(s, false, slope) - B;
    if (std::abs(f) < 0.5) break;
    if (f < 0)
      lo_s = s;
    else
      hi_s = s;
    double next = slope > 0 ? s - f / slope : std::numeric_limits<double>::quiet_NaN();
    if (!(next > lo_s && next < hi_s)) next = lo_s + 0.5 * (hi_s - lo_s);
    if (next == s || !(hi_s > lo_s)) break;
    s = next;
  }
  for (int it = 0; it < 6; ++it) {
    const double gap = B - sums(s, true, slope);
    if (std::abs(gap) <= 8 || slope <= 0) break;
    s = std::clamp(s + gap / slope, bracket_lo, bracket_hi);
  }
  return s;
}

//! Moves the counts to exactly B samples in all along the (value, rank)
//! order of increments: adds the smallest next increments while short
//! (Add), takes back the largest taken ones while over (!Add).
template <bool Add>
void take_exactly(std::span<const worker_spec> workers, std::span<const std::size_t> hi,
                  std::vector<std::size_t>& batch, std::size_t taken, std::size_t B) {
  auto less = [](const increment& x, const increment& y) {
    return x.value < y.value || (x.value == y.value && x.rank < y.rank);
  };
  // std::pop_heap yields the greatest under `later`: the smallest increment
  // when adding, the largest when taking back.
  auto later = [&](const increment& x, const increment& y) { return Add ? less(y, x) : less(x, y); };
  auto movable = [&](std::size_t i) { return Add ? batch[i] < hi[i] : batch[i] > workers[i].min_batch; };
  auto next = [&](std::size_t i) { return increment{workers[i].step_time(Add ? batch[i] + 1 : batch[i]), i}; };
  std::vector<increment> heap;
  heap.reserve(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i)
    if (movable(i)) heap.push_back(next(i));
  std::make_heap(heap.begin(), heap.end(), later);
  for (; taken != B; Add ? ++taken : --taken) {
    EBBFLOW_EXPECTS(!heap.empty());
    std::pop_heap(heap.begin(), heap.end(), later);
    const std::size_t i = heap.back().rank;
    heap.pop_back();
    Add ? ++batch[i] : --batch[i];
    if (movable(i)) {
      heap.push_back(next(i));
      std::push_heap(heap.begin(), heap.end(), later);
    }
  }
}
}  // namespace detail

EBBFLOW_DECL batch_plan solve(std::span<const worker_spec> workers, std::size_t global_batch, std::uint64_t version) {
  validate(workers);
  EBBFLOW_PLAN_ENFORCE(global_batch > 0, plan_errc::zero_batch, "global batch must be at least 1");
  // Counts and levels go through doubles: beyond 2^53 samples they are no
  // longer exact (and n counts near B could overflow their sum).
  EBBFLOW_PLAN_ENFORCE(global_batch <= (std::size_t{1} << 53), plan_errc::infeasible,
                       "global batch " << global_batch << " above 2^53 samples");
  const std::size_t n = workers.size();
  const std::size_t B = global_batch;

  std::size_t sum_max = 0, sum_min = 0;
  for (const worker_spec& w : workers) {
    sum_max = detail::saturating_add(sum_max, w.max_batch);
    sum_min = detail::saturating_add(sum_min, w.min_batch);
  }
  EBBFLOW_PLAN_ENFORCE(sum_max >= B, plan_errc::infeasible, "sum of max_batch " << sum_max << " < global batch " << B);
  EBBFLOW_PLAN_ENFORCE(sum_min <= B, plan_errc::infeasible, "sum of min_batch " << sum_min << " > global batch " << B);

  // Caps above B never bind; clamping keeps every count below B (no overflow).
  std::vector<std::size_t> hi(n);
  std::vector<double> inv_c(n), base(n), lo_d(n), hi_d(n);
  double t_lo = -std::numeric_limits<double>::infinity();
  double t_hi = -std::numeric_limits<double>::infinity();
  double t_min = std::numeric_limits<double>::infinity();  // the fastest minimum step
  double num = static_cast<double>(B), den = 0;            // the level where no bound binds
  for (std::size_t i = 0; i < n; ++i) {
    hi[i] = std::min(workers[i].max_batch, B);
    inv_c[i] = 1.0 / workers[i].c;
    base[i] = workers[i].a + workers[i].comm_s;
    lo_d[i] = static_cast<double>(workers[i].min_batch);
    hi_d[i] = static_cast<double>(hi[i]);
    t_lo = std::max(t_lo, workers[i].step_time(workers[i].min_batch));
    t_min = std::min(t_min, workers[i].step_time(workers[i].min_batch));
    t_hi = std::max(t_hi, workers[i].step_time(hi[i]));
    num += base[i] * inv_c[i];
    den += inv_c[i];
  }

  const detail::level_sums sums{base, inv_c, lo_d, hi_d};
  double slope = 0;
  const double f = sums(t_lo, false, slope) - static_cast<double>(B);
  // The level is in [t_lo, t_hi] when the slowest minimum step leaves room
  // (f < 0); else in [t_min, t_lo]: a worker with a large fixed cost sets
  // t_lo, and the others' counts at t_lo may sum far past B, which the
  // repair would take back one sample at a time (O(B)).
  const double level = f == 0  ? t_lo
                       : f < 0 ? detail::search_level(sums, static_cast<double>(B), t_lo, t_hi, num / den)
                               : detail::search_level(sums, static_cast<double>(B), t_min, t_lo, num / den);

  batch_plan p;
  p.version = version;
  p.global_batch = B;
  p.batch.resize(n);
  std::size_t taken = 0;
  for (std::size_t i = 0; i < n; ++i) {
    p.batch[i] = detail::level_count(workers[i], inv_c[i], workers[i].min_batch, hi[i], level);
    taken = detail::saturating_add(taken, p.batch[i]);
  }
  // Integer repair: reach exactly B along the (value, rank) order.
  if (taken < B)
    detail::take_exactly<true>(workers, hi, p.batch, taken, B);
  else if (taken > B)
    detail::take_exactly<false>(workers, hi, p.batch, taken, B);

  p.worker_ids.resize(n);
  p.offsets.resize(n + 1);
  p.offsets[0] = 0;
  double t = -std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < n; ++i) {
    p.worker_ids[i] = workers[i].id;
    p.offsets[i + 1] = p.offsets[i] + p.batch[i];
    t = std::max(t, workers[i].step_time(p.batch[i]));
  }
  p.step_time = detail::known_step_time(workers, t);
  return p;
}

EBBFLOW_DECL double predict_step_time(const batch_plan& plan, std::span<const worker_spec> workers) {
  EBBFLOW_PLAN_ENFORCE(
      plan.size() == workers.size(), plan_errc::membership_mismatch,
      "plan v" << plan.version << " has " << plan.size() << " workers, models have " << workers.size());
  double t = -std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < workers.size(); ++i) {
    EBBFLOW_PLAN_ENFORCE_W(
        plan.worker_ids[i] == workers[i].id, plan_errc::membership_mismatch, workers[i].id,
        "is at rank " << i << " but plan v" << plan.version << " has worker " << plan.worker_ids[i] << " there");
    t = std::max(t, workers[i].step_time(plan.batch[i]));
  }
  return t;
}

EBBFLOW_DECL batch_plan make_plan(std::span<const worker_spec> workers, std::span<const std::size_t> sizes,
                            std::uint64_t version) {
  validate(workers);
  EBBFLOW_PLAN_ENFORCE(sizes.size() == workers.size(), plan_errc::membership_mismatch,
                       sizes.size() << " sizes for " << workers.size() << " workers");
  batch_plan p;
  p.version = version;
  p.batch.assign(sizes.begin(), sizes.end());
  p.worker_ids.resize(workers.size());
  p.offsets.resize(workers.size() + 1);
  p.offsets[0] = 0;
  double t = -std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < workers.size(); ++i) {
    EBBFLOW_PLAN_ENFORCE_W(
        sizes[i] >= workers[i].min_batch && sizes[i] <= workers[i].max_batch, plan_errc::infeasible, workers[i].id,
        "batch " << sizes[i] << " outside [" << workers[i].min_batch << ", " << workers[i].max_batch << "]");
    p.worker_ids[i] = workers[i].id;
    p.offsets[i + 1] = p.offsets[i] + sizes[i];
    t = std::max(t, workers[i].step_time(sizes[i]));
  }
  p.global_batch = p.offsets.back();
  EBBFLOW_PLAN_ENFORCE(p.global_batch > 0, plan_errc::zero_batch, "the sizes sum to 0");
  p.step_time = detail::known_step_time(workers, t);
  return p;
}

}  // namespace plan
EBBFLOW_END_NAMESPACE
#endif  // EBBFLOW_HEADER_ONLY
// ---- end <ebbflow/plan/impl/batch_planner.hpp>
// ---- end <ebbflow/plan/batch_planner.hpp>
// #include <ebbflow/plan/plan_error.hpp>  (inlined)
// #include <ebbflow/plan/sampler.hpp>  (inlined here)
// ---- begin <ebbflow/plan/sampler.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file sampler.hpp
//! Exactly-once epoch sampler.
//!
//! Epoch e visits the data set [0, N) in the order pos -> order(pos), where
//! `order` is a keyed pseudo-random bijection of [0, N) derived from (seed, e)
//! (a 6-round Feistel network on the smallest even-bit power of two >= N,
//! cycle-walked into [0, N)); nothing of size N is ever materialised.
//!
//! A cursor counts the positions of the current epoch already consumed by
//! *committed* steps. A step under plan p takes the B = p.global_batch
//! positions [cursor, cursor + B); rank r gets the contiguous part
//! [cursor + p.offsets[r], cursor + p.offsets[r+1]) of it (prefix sums of
//! b_i in rank order). Every worker's indices are therefore a pure function
//! of (N, seed, epoch, cursor, policy) and the plan (`slice_of`): no worker
//! communicates to learn its indices. `commit(p)` advances the cursor by B; a
//! step that is rolled back simply is not committed, and its samples are
//! served again to whichever plan the redone step uses. Because each committed
//! step consumes the next B positions whatever the plan, the number of workers
//! or their split, every sample is consumed exactly once per epoch across
//! re-plans, joins, leaves, failures and changes of B.
//!
//! End of an epoch (`last_batch`):
//! * `short_batch`: the final step of an epoch may be shorter than the nominal
//!   batch. `step_size(B)` says how large it may be; pass a plan for that size
//!   (e.g. `plan::solve(models, sampler.step_size(B))`). Every sample is seen
//!   exactly once per epoch.
//! * `drop`: a step whose plan does not fit in what is left of the epoch
//!   starts the next epoch instead; the unvisited tail (< B samples, a
//!   different random subset every epoch) is skipped. Every sample is seen at
//!   most once per epoch, and all but the tail exactly once.
//!
//! Asynchronous extensions (out of scope here): the state already separates
//! what is committed (epoch, cursor) from who takes which part (the plan), so
//! an asynchronous mode can hand out position ranges per worker from the same
//! permutation.
//!
//! Thread safety: `epoch_sampler` is a value type with no internal
//! synchronisation; const members may be called concurrently.
//! Errors: plan_error (bad_dataset, bad_rank, batch_exceeds_epoch,
//! stale_plan); plan_fault(bad_state) for a state that no sampler holds.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/plan/batch_planner.hpp>  (inlined)
// #include <ebbflow/plan/plan_error.hpp>  (inlined)

#include <array>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <span>

EBBFLOW_BEGIN_NAMESPACE
namespace plan {

//! A keyed pseudo-random bijection of [0, n): the visiting order of one epoch.
//! Value type; O(1) memory; each call costs a few hash rounds (expected < 4
//! Feistel evaluations from cycle walking).
class epoch_permutation {
 public:
  static constexpr int rounds = 6;  //!< Feistel rounds per evaluation

  //! @throws plan_error(bad_dataset) when n == 0.
  epoch_permutation(std::uint64_t n, std::uint64_t seed, std::uint64_t epoch);

  //! Number of elements n.
  [[nodiscard]] std::uint64_t size() const noexcept { return n_; }
  //! The data-set index visited at position `pos` (< size()).
  [[nodiscard]] std::uint64_t operator()(std::uint64_t pos) const noexcept;

 private:
  [[nodiscard]] std::uint64_t encrypt(std::uint64_t x) const noexcept;
  std::uint64_t n_;
  unsigned half_bits_;
  std::uint64_t mask_;
  std::array<std::uint64_t, rounds> keys_;
};

//! The samples of one worker in one step: positions [first, last) of the
//! epoch order. `indices()` is a view of the data-set indices.
struct sample_range {
  epoch_permutation order;  //!< the epoch's visiting order
  std::uint64_t epoch = 0;  //!< epoch these positions belong to
  std::uint64_t first = 0;  //!< first position (inclusive)
  std::uint64_t last = 0;   //!< last position (exclusive)

  [[nodiscard]] std::uint64_t size() const noexcept { return last - first; }  //!< number of samples
  [[nodiscard]] bool empty() const noexcept { return first == last; }         //!< true when size() == 0
  //! The i-th data-set index of this range (i < size()).
  [[nodiscard]] std::uint64_t operator[](std::uint64_t i) const noexcept { return order(first + i); }
  //! A view over the data-set indices, in order.
  [[nodiscard]] auto indices() const { return std::views::iota(first, last) | std::views::transform(order); }
};

//! What happens at the end of an epoch; see the file comment.
enum class last_batch : std::uint32_t { short_batch = 0, drop = 1 };

//! Everything a joiner needs to continue the sampling: a small POD.
struct sampler_state {
  std::uint64_t dataset_size = 0;               //!< N
  std::uint64_t seed = 0;                       //!< key of every epoch's permutation
  std::uint64_t epoch = 0;                      //!< current epoch
  std::uint64_t cursor = 0;                     //!< positions of `epoch` consumed by committed steps
  std::uint64_t plan_version = 0;               //!< version of the plan of the last committed step
  last_batch policy = last_batch::short_batch;  //!< end-of-epoch behaviour

  //! Bytes of `encode()`: magic, format version, five u64, policy; little endian.
  static constexpr std::size_t encoded_size = 4 + 4 + 5 * 8 + 4;
  //! The state as `encoded_size` bytes, for `decode` on another worker.
  [[nodiscard]] std::array<std::byte, encoded_size> encode() const noexcept;
  //! @throws plan_fault(bad_state) for a wrong size, magic, format version or
  //!         policy, N == 0, or cursor > N.
  [[nodiscard]] static sampler_state decode(std::span<const std::byte> bytes);

  //! Member-wise equality.
  friend bool operator==(const sampler_state&, const sampler_state&) = default;
};

//! The samples of `rank` in the next step under `plan`, computed from the
//! state alone (what every worker does; `epoch_sampler::slice` calls this).
//! @throws plan_error(bad_rank | batch_exceeds_epoch | stale_plan)
[[nodiscard]] EBBFLOW_DECL sample_range slice_of(const sampler_state& state, const batch_plan& plan, std::size_t rank);

//! Exactly-once sampler over one data set. Value type.
class epoch_sampler {
 public:
  //! @throws plan_error(bad_dataset) when dataset_size == 0.
  epoch_sampler(std::uint64_t dataset_size, std::uint64_t seed, last_batch policy = last_batch::short_batch);
  //! Resumes from a state (e.g. received by a joiner).
  //! @throws plan_fault(bad_state) for N == 0, cursor >= N or an unknown policy.
  explicit epoch_sampler(const sampler_state& state);

  //! The committed state (what a joiner needs; see `sampler_state::encode`).
  [[nodiscard]] const sampler_state& state() const noexcept { return s_; }
  [[nodiscard]] std::uint64_t epoch() const noexcept { return s_.epoch; }  //!< current epoch
  //! Positions of the current epoch consumed by committed steps.
  [[nodiscard]] std::uint64_t cursor() const noexcept { return s_.cursor; }
  [[nodiscard]] std::uint64_t dataset_size() const noexcept { return s_.dataset_size; }  //!< N
  //! Positions of the current epoch not yet consumed.
  [[nodiscard]] std::uint64_t remaining() const noexcept { return s_.dataset_size - s_.cursor; }

  //! The global batch the next step will have when the nominal batch is B:
  //! min(B, remaining()) under short_batch, min(B, N) under drop.
  [[nodiscard]] std::size_t step_size(std::size_t nominal_batch) const noexcept;

  //! Rank `rank`'s samples of the next step under `plan`. Pure (does not advance).
  [[nodiscard]] sample_range slice(const batch_plan& plan, std::size_t rank) const { return slice_of(s_, plan, rank); }
  //! All samples of the next step under `plan` (every rank's slice, in rank order).
  [[nodiscard]] sample_range step(const batch_plan& plan) const;

  //! Commits the step made under `plan`: the cursor advances by its global
  //! batch, and the epoch ends when it is used up (see last_batch).
  //! @throws plan_error(batch_exceeds_epoch | stale_plan); the state is unchanged then.
  void commit(const batch_plan& plan);

 private:
  sampler_state s_;
};

}  // namespace plan
EBBFLOW_END_NAMESPACE

// #include <ebbflow/plan/impl/sampler.hpp>  (inlined here)
// ---- begin <ebbflow/plan/impl/sampler.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file impl/sampler.hpp
//! Definitions for plan/sampler.hpp.


// #include <ebbflow/core/error.hpp>  (inlined)  // EBBFLOW_EXPECTS
// #include <ebbflow/plan/sampler.hpp>  (inlined)

#include <algorithm>
#include <bit>
#include <cstring>

// Compiled into ebbflow::compiled in separate compilation (config.hpp).
#if EBBFLOW_HEADER_ONLY
EBBFLOW_BEGIN_NAMESPACE
namespace plan {
namespace detail {
//! splitmix64's finaliser: a bijective 64-bit mixer with full avalanche.
constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

struct position {
  std::uint64_t epoch;
  std::uint64_t cursor;
};

//! Where a step of `batch` samples starts, under the state's policy.
EBBFLOW_DECL position step_position(const sampler_state& s, std::size_t batch) {
  const std::uint64_t left = s.dataset_size - s.cursor;
  if (s.policy == last_batch::short_batch) {
    EBBFLOW_PLAN_ENFORCE(
        batch <= left, plan_errc::batch_exceeds_epoch,
        "a step of " << batch << " samples does not fit in the " << left << " samples left of epoch " << s.epoch);
    return {s.epoch, s.cursor};
  }
  EBBFLOW_PLAN_ENFORCE(batch <= s.dataset_size, plan_errc::batch_exceeds_epoch,
                       "a step of " << batch << " samples is larger than the data set (" << s.dataset_size << ")");
  if (batch > left) return {s.epoch + 1, 0};  // drop the tail
  return {s.epoch, s.cursor};
}

EBBFLOW_DECL void check_plan(const sampler_state& s, const batch_plan& plan) {
  EBBFLOW_PLAN_ENFORCE(plan.version >= s.plan_version, plan_errc::stale_plan,
                       "plan v" << plan.version << " is older than the committed plan v" << s.plan_version);
  EBBFLOW_PLAN_ENFORCE(plan.offsets.size() == plan.batch.size() + 1 && plan.offsets.back() == plan.global_batch,
                       plan_errc::membership_mismatch,
                       "plan v" << plan.version << " has inconsistent offsets (build plans with solve or make_plan)");
}

EBBFLOW_DECL void put_u64(std::byte* p, std::uint64_t v) noexcept {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}
EBBFLOW_DECL void put_u32(std::byte* p, std::uint32_t v) noexcept {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}
EBBFLOW_DECL std::uint64_t get_u64(const std::byte* p) noexcept {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::uint64_t(std::to_integer<std::uint8_t>(p[i])) << (8 * i);
  return v;
}
EBBFLOW_DECL std::uint32_t get_u32(const std::byte* p) noexcept {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::uint32_t(std::to_integer<std::uint8_t>(p[i])) << (8 * i);
  return v;
}
inline constexpr std::uint32_t sampler_magic = 0x53464245;  // "EBFS" little endian
inline constexpr std::uint32_t sampler_format = 1;
}  // namespace detail

EBBFLOW_DECL epoch_permutation::epoch_permutation(std::uint64_t n, std::uint64_t seed, std::uint64_t epoch) : n_(n) {
  EBBFLOW_PLAN_ENFORCE(n > 0, plan_errc::bad_dataset, "the data set is empty");
  // Smallest h >= 1 with 2^(2h) >= n: the Feistel domain is < 4n, so cycle
  // walking needs fewer than 4 encryptions on average.
  const unsigned bits = n <= 1 ? 1u : static_cast<unsigned>(std::bit_width(n - 1));
  half_bits_ = std::max(1u, (bits + 1) / 2);
  mask_ = half_bits_ >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << half_bits_) - 1;
  const std::uint64_t base = detail::mix64(seed ^ detail::mix64(epoch ^ 0x9e3779b97f4a7c15ULL));
  for (int r = 0; r < rounds; ++r) keys_[r] = detail::mix64(base + 0x9e3779b97f4a7c15ULL * std::uint64_t(r + 1));
}

EBBFLOW_DECL std::uint64_t epoch_permutation::encrypt(std::uint64_t x) const noexcept {
  std::uint64_t left = x >> half_bits_, right = x & mask_;
  for (int r = 0; r < rounds; ++r) {
    const std::uint64_t f = detail::mix64(right ^ keys_[r]) & mask_;
    const std::uint64_t next = left ^ f;
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

EBBFLOW_DECL std::uint64_t epoch_permutation::operator()(std::uint64_t pos) const noexcept {
  // Beyond [0, n) the walk below may never come back (it would spin): a
  // precondition violation ends the program with a message instead.
  EBBFLOW_EXPECTS(pos < n_);
  std::uint64_t y = encrypt(pos);
  while (y >= n_) y = encrypt(y);  // cycle walking: stays a bijection of [0, n)
  return y;
}

EBBFLOW_DECL std::array<std::byte, sampler_state::encoded_size> sampler_state::encode() const noexcept {
  std::array<std::byte, encoded_size> out{};
  std::byte* p = out.data();
  detail::put_u32(p, detail::sampler_magic);
  detail::put_u32(p + 4, detail::sampler_format);
  detail::put_u64(p + 8, dataset_size);
  detail::put_u64(p + 16, seed);
  detail::put_u64(p + 24, epoch);
  detail::put_u64(p + 32, cursor);
  detail::put_u64(p + 40, plan_version);
  detail::put_u32(p + 48, static_cast<std::uint32_t>(policy));
  return out;
}

EBBFLOW_DECL sampler_state sampler_state::decode(std::span<const std::byte> bytes) {
  EBBFLOW_PLAN_VERIFY(bytes.size() == encoded_size, plan_errc::bad_state,
                       "sampler state of " << bytes.size() << " bytes, expected " << encoded_size);
  const std::byte* p = bytes.data();
  EBBFLOW_PLAN_VERIFY(detail::get_u32(p) == detail::sampler_magic, plan_errc::bad_state, "bad magic");
  EBBFLOW_PLAN_VERIFY(detail::get_u32(p + 4) == detail::sampler_format, plan_errc::bad_state,
                       "format version " << detail::get_u32(p + 4) << ", expected " << detail::sampler_format);
  sampler_state s;
  s.dataset_size = detail::get_u64(p + 8);
  s.seed = detail::get_u64(p + 16);
  s.epoch = detail::get_u64(p + 24);
  s.cursor = detail::get_u64(p + 32);
  s.plan_version = detail::get_u64(p + 40);
  const std::uint32_t pol = detail::get_u32(p + 48);
  EBBFLOW_PLAN_VERIFY(pol <= 1, plan_errc::bad_state, "unknown last_batch policy " << pol);
  s.policy = static_cast<last_batch>(pol);
  EBBFLOW_PLAN_VERIFY(s.dataset_size > 0, plan_errc::bad_state, "data-set size 0");
  EBBFLOW_PLAN_VERIFY(s.cursor < s.dataset_size, plan_errc::bad_state,
                       "cursor " << s.cursor << " not below the data-set size " << s.dataset_size);
  return s;
}

EBBFLOW_DECL sample_range slice_of(const sampler_state& state, const batch_plan& plan, std::size_t rank) {
  detail::check_plan(state, plan);
  EBBFLOW_PLAN_ENFORCE(rank < plan.size(), plan_errc::bad_rank,
                       "rank " << rank << " outside plan v" << plan.version << " of " << plan.size() << " workers");
  const detail::position at = detail::step_position(state, plan.global_batch);
  return sample_range{epoch_permutation(state.dataset_size, state.seed, at.epoch), at.epoch,
                      at.cursor + plan.offsets[rank], at.cursor + plan.offsets[rank + 1]};
}

EBBFLOW_DECL epoch_sampler::epoch_sampler(std::uint64_t dataset_size, std::uint64_t seed, last_batch policy) {
  EBBFLOW_PLAN_ENFORCE(dataset_size > 0, plan_errc::bad_dataset, "the data set is empty");
  s_.dataset_size = dataset_size;
  s_.seed = seed;
  s_.policy = policy;
}

EBBFLOW_DECL epoch_sampler::epoch_sampler(const sampler_state& state) : s_(state) {
  EBBFLOW_PLAN_VERIFY(s_.dataset_size > 0, plan_errc::bad_state, "data-set size 0");
  EBBFLOW_PLAN_VERIFY(s_.cursor < s_.dataset_size, plan_errc::bad_state,
                       "cursor " << s_.cursor << " not below the data-set size " << s_.dataset_size);
  EBBFLOW_PLAN_VERIFY(s_.policy == last_batch::short_batch || s_.policy == last_batch::drop, plan_errc::bad_state,
                       "unknown last_batch policy");
}

EBBFLOW_DECL std::size_t epoch_sampler::step_size(std::size_t nominal_batch) const noexcept {
  const std::uint64_t cap = s_.policy == last_batch::short_batch ? remaining() : s_.dataset_size;
  return static_cast<std::size_t>(std::min<std::uint64_t>(nominal_batch, cap));
}

EBBFLOW_DECL sample_range epoch_sampler::step(const batch_plan& plan) const {
  detail::check_plan(s_, plan);
  const detail::position at = detail::step_position(s_, plan.global_batch);
  return sample_range{epoch_permutation(s_.dataset_size, s_.seed, at.epoch), at.epoch, at.cursor,
                      at.cursor + plan.global_batch};
}

EBBFLOW_DECL void epoch_sampler::commit(const batch_plan& plan) {
  detail::check_plan(s_, plan);
  const detail::position at = detail::step_position(s_, plan.global_batch);
  s_.epoch = at.epoch;
  s_.cursor = at.cursor + plan.global_batch;
  s_.plan_version = plan.version;
  if (s_.cursor == s_.dataset_size) {
    ++s_.epoch;
    s_.cursor = 0;
  }
}

}  // namespace plan
EBBFLOW_END_NAMESPACE
#endif  // EBBFLOW_HEADER_ONLY
// ---- end <ebbflow/plan/impl/sampler.hpp>
// ---- end <ebbflow/plan/sampler.hpp>

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace plan {

//! What work stealing needs from a store: an atomic 64-bit fetch-add with a
//! deadline that returns the value after the add (an absent key counts as 0).
//! `elastic::memory_store` and `elastic::store_client` model it (as does every
//! `elastic::kv_store`); plan/ names no elastic/ type.
template <class S>
concept counter_store = requires(S& s, const std::string& key, std::int64_t delta, deadline d) {
  { s.add(key, delta, d) } -> std::convertible_to<std::int64_t>;
};

//! A `counter_store` that can also apply many adds in about one round trip
//! (`add_many(keys, deltas, d)` returns the values after each add, in
//! order); `elastic::store_client` pipelines them, `elastic::memory_store`
//! takes one lock. Thieves then read every slice at once.
template <class S>
concept batch_counter_store = counter_store<S> &&
    requires(S& s, std::span<const std::string> keys, std::span<const std::int64_t> deltas, deadline d) {
  { s.add_many(keys, deltas, d) } -> std::convertible_to<std::vector<std::int64_t>>;
};

//! The largest slice work stealing accepts: each count must fit in 31 bits.
inline constexpr std::uint64_t max_slice_items = (std::uint64_t{1} << 31) - 1;

//! Identifies one step attempt; see the file comment for why both parts.
struct step_id {
  std::uint64_t generation = 0;  //!< membership generation (changes on every rollback)
  std::uint64_t step = 0;        //!< step number within the generation
};

//! The decoded counter of one slice at one moment. Value type.
struct slice_state {
  std::uint64_t size = 0;   //!< b_r, the slice's items
  std::uint64_t front = 0;  //!< F: items the owner has requested (granted: min(F, size − back) once exhausted)
  std::uint64_t back = 0;   //!< K: items thieves have requested
  //! Items not yet claimed by anyone.
  [[nodiscard]] std::uint64_t remaining() const noexcept { return front + back >= size ? 0 : size - front - back; }
  //! True when every item has been claimed.
  [[nodiscard]] bool exhausted() const noexcept { return remaining() == 0; }
};

//! Items [first, last) of rank `rank`'s slice, granted to one claim. Value type.
struct chunk {
  std::size_t rank = 0;     //!< owner rank of the slice the items belong to
  std::uint64_t first = 0;  //!< first item (inclusive), an offset into the slice
  std::uint64_t last = 0;   //!< last item (exclusive)
  bool stolen = false;      //!< true when a thief claimed it from the back
  //! Number of items.
  [[nodiscard]] std::uint64_t size() const noexcept { return last - first; }
  //! True when nothing was granted.
  [[nodiscard]] bool empty() const noexcept { return first == last; }
};

//! Chunk-size policy. Value type.
struct steal_options {
  double first_fraction = 0.25;     //!< the owner's first claim: ceil(first_fraction · b_r); in (0, 1]
  std::uint32_t owner_divisor = 2;  //!< guided owner claims: ceil(unclaimed-by-owner / owner_divisor); >= 1
  std::uint32_t thief_divisor = 2;  //!< a thief claims ceil(victim's remaining / thief_divisor); >= 1
  std::uint64_t min_chunk = 1;      //!< no claim asks for fewer (unless fewer are left); >= 1
  double tail_reserve = 0.03;  //!< then the owner claims all but max(ceil(tail_reserve · b_r), min_chunk) at once (0:
                               //!< guided chunks only); in [0, 1)
  std::chrono::milliseconds timeout{30000};  //!< deadline of each store call
};

//! Checks `o`. @throws plan_error(bad_steal_request) naming the bad field.
EBBFLOW_DECL void validate(const steal_options& o);

//! The owner's next request on a slice of `size` items of which it has
//! requested `front` so far: the first chunk, then all but the tail reserve,
//! then the guided size; at most `cap` but at least min_chunk (min_chunk wins:
//! it is the smallest chunk worth its overhead); the whole rest when less than
//! min_chunk would be left behind and `cap` is short of the rest by less
//! than min_chunk. 0 when front >= size. Pure.
[[nodiscard]] EBBFLOW_DECL std::uint64_t owner_request(const steal_options& o, std::uint64_t size, std::uint64_t front,
                                                 std::uint64_t cap = std::numeric_limits<std::uint64_t>::max());

//! A thief's request on a victim with `remaining` unclaimed items:
//! ceil(remaining / thief_divisor), at most `cap` but at least min_chunk, and
//! at most `remaining`. 0 when remaining == 0. Pure.
[[nodiscard]] EBBFLOW_DECL std::uint64_t thief_request(const steal_options& o, std::uint64_t remaining,
                                                 std::uint64_t cap = std::numeric_limits<std::uint64_t>::max());

//! The most a thief may request in one claim on a slice of `size` items when
//! `slices` workers share the store (keeps K < 2^32; see the file comment).
[[nodiscard]] constexpr std::uint64_t thief_request_limit(std::uint64_t size, std::uint64_t slices) noexcept {
  const std::uint64_t room = (std::uint64_t{1} << 32) - 1 - size;
  return slices == 0 ? room : room / slices;
}

//! A cap for an owner's request that paces it against its planned step time:
//! the items it can still finish by `planned_s` at its observed rate,
//! floor((planned_s − elapsed_s) / s_per_item), at least 1. An owner that runs
//! on plan is not limited; one that has fallen behind (a transient straggler,
//! detected by its own progress) claims little, leaving its tail to thieves.
//! `s_per_item` > 0: seconds per item measured in this step (or the model's
//! estimate before the first chunk). Pure.
[[nodiscard]] EBBFLOW_DECL std::uint64_t paced_owner_cap(double planned_s, double elapsed_s, double s_per_item) noexcept;

//! How many of a victim's `remaining` items a thief should take so that both
//! finish together: the g with overhead_s + g·thief_s = (remaining − g)·victim_s,
//! rounded down; 0 when stealing would not finish earlier than the victim.
//! `victim_s`, `thief_s`: seconds per item (estimates; use the larger of the
//! victim's planned and progress-observed time); `overhead_s`: the thief's
//! cost of one claim plus one extra chunk. Pure.
[[nodiscard]] EBBFLOW_DECL std::uint64_t balanced_steal(std::uint64_t remaining, double victim_s, double thief_s,
                                                  double overhead_s) noexcept;

//! The most a thief should take so that it does not become the new straggler
//! when everyone helps: the items it can finish within the horizon
//! total_remaining / fleet_items_per_s (the time the whole fleet needs for
//! all unclaimed items), floor(horizon / thief_s), at least 1 when anything
//! is left. `total_remaining`: unclaimed items over all slices it read;
//! `fleet_items_per_s`: Σ_j 1 / (seconds per item of worker j); `thief_s`:
//! its own seconds per item. Pure.
[[nodiscard]] EBBFLOW_DECL std::uint64_t fair_steal_cap(std::uint64_t total_remaining, double fleet_items_per_s,
                                                  double thief_s) noexcept;

//! One worker's claims in one step. Not thread-safe (one per worker per step);
//! see the file comment for the protocol, errors and the weight contract.
template <counter_store Store>
class work_stealer {
 public:
  //! Worker `rank` of a step whose slices have `slice_sizes` items (rank
  //! order, as `batch_plan::batch`). Does not touch the store. `store` must
  //! outlive this object.
  //! @throws plan_error: empty_membership (no slices), slice_too_large (a
  //!         slice > max_slice_items), bad_rank (rank >= slices),
  //!         bad_steal_request (bad options).
  work_stealer(Store& store, std::string prefix, step_id id, std::span<const std::size_t> slice_sizes, std::size_t rank,
               steal_options opts = {});
  //! As above with the slices of `plan`.
  work_stealer(Store& store, std::string prefix, step_id id, const batch_plan& plan, std::size_t rank,
               steal_options opts = {})
      : work_stealer(store, std::move(prefix), id, std::span<const std::size_t>(plan.batch), rank, opts) {}

  //! Claims the next chunk of the own slice from the front (`owner_request`
  //! items, at most `cap`). Empty once the own slice is exhausted (by the
  //! owner or by thieves); after that it does not call the store.
  //! @throws plan_error(bad_steal_request) when cap == 0; plan_fault(bad_counter); store errors.
  [[nodiscard]] chunk claim_own(std::uint64_t cap = std::numeric_limits<std::uint64_t>::max());
  //! True once the own slice is known to be exhausted.
  [[nodiscard]] bool own_done() const noexcept { return own_done_; }

  //! Reads slice `r`'s counter (an add of 0; one round trip).
  //! @throws plan_error(bad_rank); plan_fault(bad_counter); store errors.
  [[nodiscard]] slice_state peek(std::size_t r);
  //! Reads every other slice not yet seen exhausted: one batched round trip
  //! when `Store` is a `batch_counter_store`, else one `peek` each. The states
  //! are then in `last_seen`. Returns the number of slices read.
  //! @throws plan_fault(bad_counter); store errors.
  std::size_t peek_others();
  //! Claims up to `request` items from the back of slice `victim` (`victim`
  //! != own rank), clamped to what was last seen remaining and to
  //! `thief_request_limit`. Empty when the slice is (now) exhausted; a slice
  //! seen exhausted is never claimed again.
  //! @throws plan_error(bad_rank | bad_steal_request); plan_fault(bad_counter); store errors.
  [[nodiscard]] chunk steal_from(std::size_t victim, std::uint64_t request);
  //! Peeks every other slice not yet seen exhausted, picks the one with the
  //! most remaining items (lowest rank on ties) and claims `thief_request`
  //! items of it, at most `cap`. Empty when every other slice is exhausted.
  //! Errors as for `steal_from`.
  [[nodiscard]] chunk steal(std::uint64_t cap = std::numeric_limits<std::uint64_t>::max());
  //! `claim_own` until the own slice is exhausted, then `steal`. Empty: this
  //! worker is done with the step. Errors as above.
  [[nodiscard]] chunk next(std::uint64_t cap = std::numeric_limits<std::uint64_t>::max());

  //! The last state seen of slice `r` (from a peek or a claim; zeros before).
  [[nodiscard]] const slice_state& last_seen(std::size_t r) const { return seen_.at(r); }
  //! Items this worker has been granted in this step (own and stolen).
  [[nodiscard]] std::uint64_t processed() const noexcept { return processed_; }
  //! Items this worker has stolen from others.
  [[nodiscard]] std::uint64_t stolen() const noexcept { return stolen_; }
  //! Store round trips made so far (claims and peeks; a batched read counts once).
  [[nodiscard]] std::uint64_t store_calls() const noexcept { return calls_; }
  //! w = processed() / global_batch, the factor for this worker's mean-loss
  //! gradient (see the file comment). @throws plan_error(zero_batch) when global_batch == 0.
  [[nodiscard]] double weight(std::size_t global_batch) const;
  //! The store key of slice `r`'s counter. @throws plan_error(bad_rank).
  [[nodiscard]] std::string key(std::size_t r) const;
  //! Number of slices.
  [[nodiscard]] std::size_t slices() const noexcept { return size_.size(); }
  //! This worker's rank.
  [[nodiscard]] std::size_t rank() const noexcept { return rank_; }
  //! Erases the own slice's counter when `Store` has `erase(key)`; otherwise
  //! does nothing. Call only when no member can claim in this step any more.
  //! Store errors propagate.
  void release();

 private:
  slice_state decode(std::size_t r, std::int64_t after, std::int64_t delta) const;
  Store* store_;
  std::string prefix_;
  steal_options opts_;
  std::size_t rank_;
  std::vector<std::uint64_t> size_;
  std::vector<slice_state> seen_;
  std::vector<char> exhausted_;
  bool own_done_ = false;
  std::uint64_t processed_ = 0, stolen_ = 0, calls_ = 0;
};

//! The smallest chunk whose fixed overhead is at most `share` of its compute:
//! ceil(overhead_s / (share · s_per_item)), at least 1. Use it as
//! `steal_options::min_chunk`. The default share 0.25 balances the two costs
//! of the chunk size at the end of a step: the last chunks leave workers
//! finishing apart by about half a chunk, and halving the smallest chunk adds
//! one more chunk's overhead, so the expected loss is least when a smallest
//! chunk computes for about 4× its overhead. Pure.
[[nodiscard]] EBBFLOW_DECL std::uint64_t recommended_min_chunk(double overhead_s, double s_per_item,
                                                         double share = 0.25) noexcept;

//! The decisions of one worker in one step, free of clocks and stores so that
//! a real worker (`run_stealing_step`) and a simulation make them alike. Knows
//! only what a worker knows: the plan, every member's estimated model (the
//! inputs of the plan), its own measured speed in this step, the time since
//! the step started on its clock, and counters it read. Stragglers are seen
//! only through progress. Times are seconds since the step started; members
//! start a synchronous step together (after the previous allreduce), so one
//! worker's clock approximates the others'. Value type; not thread-safe.
class steal_policy {
 public:
  //! Worker `rank` of `plan`, made from `models` (rank order, the specs the
  //! plan was solved from; only a, comm_s and c are used). `claim_s`: one
  //! store round trip; `chunk_overhead_s`: this worker's cost of one extra chunk.
  //! @throws plan_error(membership_mismatch | bad_rank | bad_cost).
  steal_policy(std::span<const worker_spec> models, const batch_plan& plan, std::size_t rank, double claim_s,
               double chunk_overhead_s);

  //! Records `items` of its own slice processed in `seconds` (the speed it measures).
  void observe_own(std::uint64_t items, double seconds) noexcept;
  //! Its seconds per item: measured in this step when it has processed any, else its model's c.
  [[nodiscard]] double s_per_item() const noexcept;
  //! The cap of its next own claim: `paced_owner_cap(planned step time, elapsed_s, s_per_item())`.
  [[nodiscard]] std::uint64_t own_cap(double elapsed_s) const noexcept;

  //! A steal decision: `items` == 0 means stop stealing in this step.
  struct choice {
    std::size_t victim = 0;   //!< rank of the slice to steal from
    std::uint64_t items = 0;  //!< how many to request
  };
  //! Picks, among the slices in `seen` (index = rank; its own and exhausted ones
  //! are skipped) the victim with the longest estimated time to finish:
  //! remaining × max(planned c_r, (elapsed_s − a_r) / F_r), and requests
  //! min(`balanced_steal`, `fair_steal_cap`) of it.
  [[nodiscard]] choice choose(std::span<const slice_state> seen, double elapsed_s) const;
  //! Slice `r`'s estimated time to finish as `choose` rates it, from state `s`:
  //! remaining × max(c_r, (elapsed_s − a_r) / F_r) (planned c_r while F_r = 0).
  [[nodiscard]] double time_left(std::size_t r, const slice_state& s, double elapsed_s) const noexcept;
  //! An upper bound of `time_left` now for a slice last seen in state `stale`
  //! (its remaining only shrinks and its F only grows): the same formula, with
  //! F_r >= 1 assumed when `stale` shows F_r = 0.
  [[nodiscard]] double time_left_bound(std::size_t r, const slice_state& stale, double elapsed_s) const noexcept;
  //! The steal decision with as few store round trips as possible. With a
  //! `batch_counter_store` it reads every other slice not yet seen exhausted
  //! in one batch (`peek_others`). Otherwise it peeks them one by one in
  //! decreasing order of `time_left_bound` from their last-seen states and
  //! stops once no unread slice can beat the best one read. Then it
  //! `choose`s at `elapsed_s` (unread slices count with their last-seen
  //! states, which can only overstate the work left), so the victim is the
  //! one `choose` would pick after peeking every slice, except on exact ties.
  //! Errors as `work_stealer::peek`.
  template <counter_store Store>
  [[nodiscard]] choice scan(work_stealer<Store>& stealer, double elapsed_s) const;

 private:
  std::vector<double> a_, c_;
  double planned_s_, claim_s_, overhead_s_, fleet_rate_ = 0;
  std::size_t rank_;
  double own_items_ = 0, own_seconds_ = 0;
};

//! What `run_stealing_step` did.
struct steal_report {
  std::uint64_t processed = 0;    //!< items processed (own and stolen): the weight is processed / B
  std::uint64_t stolen = 0;       //!< of which stolen from others
  std::uint64_t chunks = 0;       //!< chunks processed
  std::uint64_t store_calls = 0;  //!< store round trips
  double seconds = 0;             //!< wall time of the step's claim-and-process loop
};

//! Runs one worker's step: claims its own slice paced by `policy`, calls
//! `process(chunk)` for each (which trains on it and blocks until done), then
//! steals as `policy` decides until it says stop. Every item of the own slice
//! is processed here or by a thief. Blocking; uses the steady clock.
//! @throws what `work_stealer` or `process` throw (a throwing `process` leaves
//! claimed items unprocessed: abandon the step attempt).
template <counter_store Store, class Process>
steal_report run_stealing_step(work_stealer<Store>& stealer, steal_policy& policy, Process&& process);
//! As above without a policy (no models to pace with): the own slice in
//! `next()`'s chunks, then the largest tails of the others, unpaced.
template <counter_store Store, class Process>
steal_report run_stealing_step(work_stealer<Store>& stealer, Process&& process);

//! The samples of chunk `c` of the step that `plan` makes from `state`: the
//! positions [first, last) of rank c.rank's slice (`slice_of`).
//! @throws plan_error as `slice_of`, and bad_rank when c lies beyond the slice.
[[nodiscard]] EBBFLOW_DECL sample_range samples_of(const sampler_state& state, const batch_plan& plan, const chunk& c);

}  // namespace plan
EBBFLOW_END_NAMESPACE

// #include <ebbflow/plan/impl/work_stealing.hpp>  (inlined here)
// ---- begin <ebbflow/plan/impl/work_stealing.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file impl/work_stealing.hpp
//! Definitions for plan/work_stealing.hpp.


// #include <ebbflow/plan/work_stealing.hpp>  (inlined)

#include <algorithm>
#include <cmath>
#include <utility>

EBBFLOW_BEGIN_NAMESPACE
namespace plan {
namespace detail {
//! The owner count lives in bits 32..62 of the counter, the thief count in bits 0..31.
inline constexpr std::int64_t owner_unit = std::int64_t{1} << 32;
inline constexpr std::uint64_t thief_mask = (std::uint64_t{1} << 32) - 1;

//! ceil(a / b) for b >= 1 without overflow.
constexpr std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) noexcept { return a / b + (a % b != 0); }

//! The items a claim of `request` is granted, given the state just before it:
//! the owner [F, F + g), a thief [n − K − g, n − K), g = min(request, remaining).
inline chunk grant(std::size_t rank, const slice_state& before, std::uint64_t request, bool from_back) noexcept {
  const std::uint64_t g = std::min(request, before.remaining());
  if (g == 0) return chunk{rank, 0, 0, from_back};
  if (from_back) return chunk{rank, before.size - before.back - g, before.size - before.back, true};
  return chunk{rank, before.front, before.front + g, false};
}
}  // namespace detail

// Compiled into ebbflow::compiled in separate compilation (config.hpp).
#if EBBFLOW_HEADER_ONLY
EBBFLOW_DECL void validate(const steal_options& o) {
  EBBFLOW_PLAN_ENFORCE(std::isfinite(o.first_fraction) && o.first_fraction > 0 && o.first_fraction <= 1,
                       plan_errc::bad_steal_request, "first_fraction " << o.first_fraction << " outside (0, 1]");
  EBBFLOW_PLAN_ENFORCE(o.owner_divisor >= 1, plan_errc::bad_steal_request, "owner_divisor 0");
  EBBFLOW_PLAN_ENFORCE(std::isfinite(o.tail_reserve) && o.tail_reserve >= 0 && o.tail_reserve < 1,
                       plan_errc::bad_steal_request, "tail_reserve " << o.tail_reserve << " outside [0, 1)");
  EBBFLOW_PLAN_ENFORCE(o.thief_divisor >= 1, plan_errc::bad_steal_request, "thief_divisor 0");
  EBBFLOW_PLAN_ENFORCE(o.min_chunk >= 1, plan_errc::bad_steal_request, "min_chunk 0");
  EBBFLOW_PLAN_ENFORCE(o.timeout.count() > 0, plan_errc::bad_steal_request,
                       "timeout " << o.timeout.count() << " ms is not positive");
}

EBBFLOW_DECL std::uint64_t owner_request(const steal_options& o, std::uint64_t size, std::uint64_t front, std::uint64_t cap) {
  if (front >= size) return 0;
  const std::uint64_t rest = size - front;
  // The tail reserve is at least one smallest chunk (a smaller one could not be split).
  const std::uint64_t reserve =
      o.tail_reserve > 0
          ? std::max(static_cast<std::uint64_t>(std::ceil(o.tail_reserve * static_cast<double>(size))), o.min_chunk)
          : 0;
  std::uint64_t q = front == 0 ? static_cast<std::uint64_t>(std::ceil(o.first_fraction * static_cast<double>(size)))
                    : reserve > 0 && rest > reserve ? rest - reserve
                                                    : detail::ceil_div(rest, o.owner_divisor);
  // min_chunk wins over cap: it is the smallest chunk worth its overhead.
  q = std::max(std::min(q, cap), o.min_chunk);
  // Never leave a remainder smaller than min_chunk: it would cost a whole
  // chunk's overhead for less than a chunk's worth of work. Unless the cap
  // is short of the rest by more than that (a paced straggler leaves its
  // tail to thieves; an owner on plan is only a little short).
  if (q >= rest || (rest - q < o.min_chunk && (cap >= rest || rest - cap < o.min_chunk))) return rest;
  return q;
}

EBBFLOW_DECL std::uint64_t thief_request(const steal_options& o, std::uint64_t remaining, std::uint64_t cap) {
  if (remaining == 0) return 0;
  const std::uint64_t q = std::max(std::min(detail::ceil_div(remaining, o.thief_divisor), cap), o.min_chunk);
  return std::min(q, remaining);
}

EBBFLOW_DECL std::uint64_t paced_owner_cap(double planned_s, double elapsed_s, double s_per_item) noexcept {
  if (!(s_per_item > 0) || !std::isfinite(s_per_item)) return std::numeric_limits<std::uint64_t>::max();
  const double left = (planned_s - elapsed_s) / s_per_item;
  if (!(left >= 1)) return 1;
  if (left >= 9e18) return std::numeric_limits<std::uint64_t>::max();
  return static_cast<std::uint64_t>(left);
}

EBBFLOW_DECL std::uint64_t balanced_steal(std::uint64_t remaining, double victim_s, double thief_s,
                                    double overhead_s) noexcept {
  if (remaining == 0 || !(victim_s > 0) || !(thief_s > 0)) return 0;
  const double g = (static_cast<double>(remaining) * victim_s - std::max(overhead_s, 0.0)) / (thief_s + victim_s);
  if (!(g >= 1)) return 0;
  return std::min(remaining, static_cast<std::uint64_t>(g));
}

EBBFLOW_DECL std::uint64_t fair_steal_cap(std::uint64_t total_remaining, double fleet_items_per_s, double thief_s) noexcept {
  if (total_remaining == 0) return 0;
  if (!(fleet_items_per_s > 0) || !(thief_s > 0)) return total_remaining;
  const double g = static_cast<double>(total_remaining) / fleet_items_per_s / thief_s;
  if (!(g >= 1)) return 1;
  return std::min(total_remaining, static_cast<std::uint64_t>(g));
}

#endif  // EBBFLOW_HEADER_ONLY

template <counter_store Store>
work_stealer<Store>::work_stealer(Store& store, std::string prefix, step_id id,
                                  std::span<const std::size_t> slice_sizes, std::size_t rank, steal_options opts)
    : store_(&store), opts_(opts), rank_(rank) {
  validate(opts_);
  EBBFLOW_PLAN_ENFORCE(!slice_sizes.empty(), plan_errc::empty_membership, "no slices to steal from");
  EBBFLOW_PLAN_ENFORCE(rank < slice_sizes.size(), plan_errc::bad_rank,
                       "rank " << rank << " outside a step of " << slice_sizes.size() << " slices");
  size_.reserve(slice_sizes.size());
  for (std::size_t r = 0; r < slice_sizes.size(); ++r) {
    EBBFLOW_PLAN_ENFORCE_W(slice_sizes[r] <= max_slice_items, plan_errc::slice_too_large, r,
                           "slice of " << slice_sizes[r] << " items exceeds " << max_slice_items
                                       << " (2^31 - 1): its claim counter would overflow");
    size_.push_back(slice_sizes[r]);
  }
  seen_.resize(size_.size());
  exhausted_.assign(size_.size(), 0);
  for (std::size_t r = 0; r < size_.size(); ++r) {
    seen_[r].size = size_[r];
    exhausted_[r] = size_[r] == 0;
  }
  own_done_ = exhausted_[rank_] != 0;
  prefix_ = std::move(prefix) + "/" + std::to_string(id.generation) + "/" + std::to_string(id.step) + "/";
}

template <counter_store Store>
std::string work_stealer<Store>::key(std::size_t r) const {
  EBBFLOW_PLAN_ENFORCE(r < size_.size(), plan_errc::bad_rank, "rank " << r << " outside " << size_.size() << " slices");
  return prefix_ + std::to_string(r);
}

template <counter_store Store>
slice_state work_stealer<Store>::decode(std::size_t r, std::int64_t after, std::int64_t delta) const {
  // `after - delta` is the exact value just before this add. Both fields are
  // bounded (file comment), so any other value means the key was written by
  // something that is not this protocol (a reused key, a corrupt store).
  const std::int64_t before = after - delta;
  EBBFLOW_PLAN_VERIFY_W(before >= 0 && after >= 0, plan_errc::bad_counter, r,
                         "counter '" << key(r) << "' reads " << after << " after adding " << delta << " (negative)");
  const auto b = static_cast<std::uint64_t>(before);
  slice_state s{size_[r], b >> 32, b & detail::thief_mask};
  EBBFLOW_PLAN_VERIFY_W(s.front <= s.size, plan_errc::bad_counter, r,
                         "counter '" << key(r) << "' has owner count " << s.front << " > slice size " << s.size);
  return s;
}

template <counter_store Store>
chunk work_stealer<Store>::claim_own(std::uint64_t cap) {
  EBBFLOW_PLAN_ENFORCE(cap >= 1, plan_errc::bad_steal_request, "claim_own with cap 0");
  if (own_done_) return chunk{rank_, 0, 0, false};
  // The owner is the only writer of F, so seen_.front is exact and the request
  // never takes F beyond the slice.
  const std::uint64_t q = owner_request(opts_, size_[rank_], seen_[rank_].front, cap);
  const std::int64_t delta = static_cast<std::int64_t>(q) * detail::owner_unit;
  const std::int64_t after = store_->add(key(rank_), delta, deadline::after(opts_.timeout));
  ++calls_;
  const slice_state before = decode(rank_, after, delta);
  const chunk c = detail::grant(rank_, before, q, false);
  seen_[rank_] = slice_state{size_[rank_], before.front + q, before.back};
  if (c.size() < q || seen_[rank_].exhausted()) {
    own_done_ = true;
    exhausted_[rank_] = 1;
  }
  processed_ += c.size();
  return c;
}

template <counter_store Store>
slice_state work_stealer<Store>::peek(std::size_t r) {
  EBBFLOW_PLAN_ENFORCE(r < size_.size(), plan_errc::bad_rank, "rank " << r << " outside " << size_.size() << " slices");
  if (size_[r] == 0) return seen_[r];
  const std::int64_t after = store_->add(key(r), 0, deadline::after(opts_.timeout));
  ++calls_;
  seen_[r] = decode(r, after, 0);
  if (seen_[r].exhausted()) exhausted_[r] = 1;
  if (r == rank_ && exhausted_[r]) own_done_ = true;
  return seen_[r];
}

template <counter_store Store>
std::size_t work_stealer<Store>::peek_others() {
  std::vector<std::size_t> which;
  for (std::size_t r = 0; r < size_.size(); ++r)
    if (r != rank_ && !exhausted_[r]) which.push_back(r);
  if (which.empty()) return 0;
  if constexpr (batch_counter_store<Store>) {
    std::vector<std::string> keys;
    keys.reserve(which.size());
    for (std::size_t r : which) keys.push_back(key(r));
    const std::vector<std::int64_t> zeros(which.size(), 0);
    const std::vector<std::int64_t> after = store_->add_many(
        std::span<const std::string>(keys), std::span<const std::int64_t>(zeros), deadline::after(opts_.timeout));
    ++calls_;
    EBBFLOW_PLAN_VERIFY(after.size() == which.size(), plan_errc::bad_counter,
                         "store answered " << after.size() << " of " << which.size() << " batched reads");
    for (std::size_t k = 0; k < which.size(); ++k) {
      const std::size_t r = which[k];
      seen_[r] = decode(r, after[k], 0);
      if (seen_[r].exhausted()) exhausted_[r] = 1;
    }
  } else {
    for (std::size_t r : which) (void)peek(r);
  }
  return which.size();
}

template <counter_store Store>
chunk work_stealer<Store>::steal_from(std::size_t victim, std::uint64_t request) {
  EBBFLOW_PLAN_ENFORCE(victim < size_.size(), plan_errc::bad_rank,
                       "victim " << victim << " outside " << size_.size() << " slices");
  EBBFLOW_PLAN_ENFORCE(victim != rank_, plan_errc::bad_steal_request,
                       "rank " << rank_ << " cannot steal from its own slice (use claim_own)");
  EBBFLOW_PLAN_ENFORCE(request >= 1, plan_errc::bad_steal_request, "steal of 0 items");
  if (exhausted_[victim]) return chunk{victim, 0, 0, true};
  // Clamp to what was last seen remaining (never more than the slice) and to
  // the per-claim limit: this is what bounds K below 2^32.
  const std::uint64_t q =
      std::min({request, seen_[victim].remaining(), thief_request_limit(size_[victim], size_.size())});
  if (q == 0) {
    exhausted_[victim] = 1;
    return chunk{victim, 0, 0, true};
  }
  const std::int64_t delta = static_cast<std::int64_t>(q);
  const std::int64_t after = store_->add(key(victim), delta, deadline::after(opts_.timeout));
  ++calls_;
  const slice_state before = decode(victim, after, delta);
  const chunk c = detail::grant(victim, before, q, true);
  seen_[victim] = slice_state{size_[victim], before.front, before.back + q};
  if (c.size() < q || seen_[victim].exhausted()) exhausted_[victim] = 1;
  processed_ += c.size();
  stolen_ += c.size();
  return c;
}

template <counter_store Store>
chunk work_stealer<Store>::steal(std::uint64_t cap) {
  EBBFLOW_PLAN_ENFORCE(cap >= 1, plan_errc::bad_steal_request, "steal with cap 0");
  for (;;) {
    (void)peek_others();
    std::size_t best = size_.size();
    std::uint64_t most = 0;
    for (std::size_t r = 0; r < size_.size(); ++r) {
      if (r == rank_ || exhausted_[r]) continue;
      const std::uint64_t rest = seen_[r].remaining();
      if (rest > most) most = rest, best = r;
    }
    if (best == size_.size()) return chunk{rank_, 0, 0, true};
    const chunk c = steal_from(best, thief_request(opts_, most, cap));
    if (!c.empty()) return c;
    // Lost the race for that tail; rescan (the slice is now marked exhausted).
  }
}

template <counter_store Store>
chunk work_stealer<Store>::next(std::uint64_t cap) {
  if (!own_done_) {
    const chunk c = claim_own(cap);
    if (!c.empty()) return c;
  }
  return steal(cap);
}

template <counter_store Store>
double work_stealer<Store>::weight(std::size_t global_batch) const {
  EBBFLOW_PLAN_ENFORCE(global_batch > 0, plan_errc::zero_batch, "weight of a step with global batch 0");
  return static_cast<double>(processed_) / static_cast<double>(global_batch);
}

template <counter_store Store>
void work_stealer<Store>::release() {
  if constexpr (requires(Store & s, const std::string& k) { s.erase(k); }) {
    if (size_[rank_] > 0) (void)store_->erase(key(rank_));
  }
}

// Compiled into ebbflow::compiled in separate compilation (config.hpp).
#if EBBFLOW_HEADER_ONLY
EBBFLOW_DECL std::uint64_t recommended_min_chunk(double overhead_s, double s_per_item, double share) noexcept {
  if (!(overhead_s > 0) || !(s_per_item > 0) || !(share > 0)) return 1;
  const double k = std::ceil(overhead_s / (share * s_per_item));
  if (!(k >= 1)) return 1;
  return k >= 9e18 ? std::numeric_limits<std::uint64_t>::max() : static_cast<std::uint64_t>(k);
}

EBBFLOW_DECL steal_policy::steal_policy(std::span<const worker_spec> models, const batch_plan& plan, std::size_t rank,
                                  double claim_s, double chunk_overhead_s)
    : planned_s_(std::isnan(plan.step_time) ? predict_step_time(plan, models) : plan.step_time),
      claim_s_(std::max(claim_s, 0.0)),
      overhead_s_(std::max(chunk_overhead_s, 0.0)),
      rank_(rank) {
  EBBFLOW_PLAN_ENFORCE(models.size() == plan.size(), plan_errc::membership_mismatch,
                       models.size() << " models for a plan of " << plan.size() << " workers");
  EBBFLOW_PLAN_ENFORCE(rank < plan.size(), plan_errc::bad_rank,
                       "rank " << rank << " outside plan v" << plan.version << " of " << plan.size() << " workers");
  for (std::size_t r = 0; r < models.size(); ++r) {
    const worker_spec& m = models[r];
    EBBFLOW_PLAN_ENFORCE_W(std::isfinite(m.c) && m.c > 0 && std::isfinite(m.a) && m.a >= 0, plan_errc::bad_cost, m.id,
                           "a = " << m.a << ", c = " << m.c << " cannot pace work stealing");
    a_.push_back(m.a + m.comm_s);
    c_.push_back(m.c);
    fleet_rate_ += 1 / m.c;
  }
}

EBBFLOW_DECL void steal_policy::observe_own(std::uint64_t items, double seconds) noexcept {
  if (items == 0 || !(seconds >= 0)) return;
  own_items_ += static_cast<double>(items);
  own_seconds_ += seconds;
}

EBBFLOW_DECL double steal_policy::s_per_item() const noexcept {
  return own_items_ > 0 && own_seconds_ > 0 ? own_seconds_ / own_items_ : c_[rank_];
}

EBBFLOW_DECL std::uint64_t steal_policy::own_cap(double elapsed_s) const noexcept {
  return paced_owner_cap(planned_s_, elapsed_s, s_per_item());
}

EBBFLOW_DECL steal_policy::choice steal_policy::choose(std::span<const slice_state> seen, double elapsed_s) const {
  EBBFLOW_PLAN_ENFORCE(seen.size() == c_.size(), plan_errc::membership_mismatch,
                       seen.size() << " slice states for " << c_.size() << " workers");
  double worst = 0, victim_s = 0, all_rest = 0;
  std::size_t victim = seen.size();
  for (std::size_t r = 0; r < seen.size(); ++r) {
    if (r == rank_ || seen[r].exhausted()) continue;
    all_rest += static_cast<double>(seen[r].remaining());
    // Progress: the owner requested F items in (elapsed − a_r) seconds; F
    // includes the chunk in flight, so this errs towards the planned speed.
    const double left = time_left(r, seen[r], elapsed_s);
    if (left > worst) worst = left, victim = r, victim_s = left / static_cast<double>(seen[r].remaining());
  }
  if (victim == seen.size()) return {};
  const std::uint64_t g =
      std::min(balanced_steal(seen[victim].remaining(), victim_s, s_per_item(), claim_s_ + overhead_s_),
               fair_steal_cap(static_cast<std::uint64_t>(all_rest), fleet_rate_, s_per_item()));
  return {victim, g};
}

EBBFLOW_DECL double steal_policy::time_left(std::size_t r, const slice_state& s, double elapsed_s) const noexcept {
  double v = c_[r];
  if (s.front > 0 && elapsed_s > a_[r]) v = std::max(v, (elapsed_s - a_[r]) / static_cast<double>(s.front));
  return static_cast<double>(s.remaining()) * v;
}

EBBFLOW_DECL double steal_policy::time_left_bound(std::size_t r, const slice_state& stale, double elapsed_s) const noexcept {
  double v = c_[r];
  if (elapsed_s > a_[r])
    v = std::max(v, (elapsed_s - a_[r]) / static_cast<double>(std::max<std::uint64_t>(stale.front, 1)));
  return static_cast<double>(stale.remaining()) * v;
}

#endif  // EBBFLOW_HEADER_ONLY

template <counter_store Store>
steal_policy::choice steal_policy::scan(work_stealer<Store>& stealer, double elapsed_s) const {
  const std::size_t n = stealer.slices();
  EBBFLOW_PLAN_ENFORCE(n == c_.size(), plan_errc::membership_mismatch,
                       "a stealer of " << n << " slices for a policy of " << c_.size() << " workers");
  if constexpr (batch_counter_store<Store>) {
    (void)stealer.peek_others();  // one round trip for all
  } else {
    std::vector<std::pair<double, std::size_t>> order;  // (bound, rank), largest bound first
    for (std::size_t r = 0; r < n; ++r)
      if (r != rank_ && !stealer.last_seen(r).exhausted())
        order.emplace_back(time_left_bound(r, stealer.last_seen(r), elapsed_s), r);
    std::sort(order.begin(), order.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
    double best = 0;
    for (const auto& [bound, r] : order) {
      if (bound <= best) break;  // neither this slice nor any later one can beat the best read
      best = std::max(best, time_left(r, stealer.peek(r), elapsed_s));
    }
  }
  std::vector<slice_state> seen(n);
  for (std::size_t r = 0; r < n; ++r) seen[r] = stealer.last_seen(r);
  return choose(seen, elapsed_s);
}

template <counter_store Store, class Process>
steal_report run_stealing_step(work_stealer<Store>& stealer, steal_policy& policy, Process&& process) {
  using seconds = std::chrono::duration<double>;
  const auto t0 = steady_clock::now();
  const auto elapsed = [&] { return seconds(steady_clock::now() - t0).count(); };
  steal_report rep;
  for (;;) {
    const chunk c = stealer.claim_own(policy.own_cap(elapsed()));
    if (c.empty()) break;
    const auto t = steady_clock::now();
    process(c);
    policy.observe_own(c.size(), seconds(steady_clock::now() - t).count());
    ++rep.chunks;
  }
  for (;;) {
    const steal_policy::choice ch = policy.scan(stealer, elapsed());
    if (ch.items == 0) break;
    const chunk c = stealer.steal_from(ch.victim, ch.items);
    if (c.empty()) continue;  // lost the race for that tail; look again
    process(c);
    ++rep.chunks;
  }
  rep.processed = stealer.processed();
  rep.stolen = stealer.stolen();
  rep.store_calls = stealer.store_calls();
  rep.seconds = elapsed();
  return rep;
}

template <counter_store Store, class Process>
steal_report run_stealing_step(work_stealer<Store>& stealer, Process&& process) {
  const auto t0 = steady_clock::now();
  steal_report rep;
  for (chunk c = stealer.next(); !c.empty(); c = stealer.next()) {
    process(c);
    ++rep.chunks;
  }
  rep.processed = stealer.processed();
  rep.stolen = stealer.stolen();
  rep.store_calls = stealer.store_calls();
  rep.seconds = std::chrono::duration<double>(steady_clock::now() - t0).count();
  return rep;
}

// Compiled into ebbflow::compiled in separate compilation (config.hpp).
#if EBBFLOW_HEADER_ONLY
EBBFLOW_DECL sample_range samples_of(const sampler_state& state, const batch_plan& plan, const chunk& c) {
  sample_range s = slice_of(state, plan, c.rank);
  EBBFLOW_PLAN_ENFORCE(
      c.first <= c.last && c.last <= s.size(), plan_errc::bad_rank,
      "chunk [" << c.first << ", " << c.last << ") outside rank " << c.rank << "'s slice of " << s.size() << " items");
  s.last = s.first + c.last;
  s.first = s.first + c.first;
  return s;
}

#endif  // EBBFLOW_HEADER_ONLY

}  // namespace plan
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/plan/impl/work_stealing.hpp>
// ==== end <ebbflow/plan/work_stealing.hpp>

// ==== begin <ebbflow/elastic/kv_store.hpp> ================================
// SPDX-License-Identifier: Apache-2.0
//! @file kv_store.hpp
//! The `kv_store` concept the elastic group coordinates through, and
//! `memory_store`, an in-process model of it for unit tests.
//!
//! Semantics: keys and values are strings (values binary-safe). Every call takes a deadline and
//! throws `ebbflow::system_error` (`errc::timeout`, `errc::peer_lost` when the
//! store is unreachable, `errc::unauthorized`) on failure.
//! * `set(k, v, d)` stores v under k.
//! * `try_get(k, d)` returns the value, or nullopt when k is absent (never blocks on absence).
//! * `add(k, delta, d)` atomically adds to the 64-bit integer under k (absent = 0), returns the new value.
//! * `compare_set(k, expected, desired, d)` stores desired when the current value
//!   equals expected (an empty expected matches an absent key); the result's `swapped` tells whether it did,
//!   `current` is the value now stored.
//! * `wait(keys, d)` blocks until every key exists, or throws `errc::timeout`.
//! Optional, used when present: `add_many(keys, deltas, d)` and
//! `try_get_many(keys, d)`, the same operations for several keys in about one
//! round trip (the group batches its reads of join tickets and addresses);
//! `wait_any(keys, d)`, which blocks until any key exists and returns the
//! index of the first one that does (the coordinator waits for the next join
//! ticket and for an abort at once; without it, an abort reaches it at its
//! next heartbeat).
//! The Boost.Asio store client (elastic/tcp_store.hpp) models this concept.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/deadline.hpp>  (inlined)
// #include <ebbflow/core/error.hpp>  (inlined)

#include <charconv>
#include <condition_variable>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {
//! `stored + delta` for a counter kept as decimal text (empty: 0), or the
//! reason it cannot be: the text is not a whole int64, or the sum
//! overflows. The store server and `memory_store` share it, so the two
//! agree on every value.
inline std::optional<std::int64_t> add_to_counter(std::string_view stored, std::int64_t delta, std::string& why) {
  std::int64_t cur = 0;
  if (!stored.empty()) {
    const auto [p, ec] = std::from_chars(stored.data(), stored.data() + stored.size(), cur);
    if (ec != std::errc{} || p != stored.data() + stored.size()) {
      why = "is not an integer";
      return std::nullopt;
    }
  }
  std::int64_t next = 0;
  if (__builtin_add_overflow(cur, delta, &next)) {
    why = "would overflow int64";
    return std::nullopt;
  }
  return next;
}
}  // namespace elastic::detail

namespace elastic {

//! Owned binary data (transport addresses, encoded records); host memory.
using bytes = std::vector<std::byte>;

template <class S>
concept kv_store = requires(S& s, const std::string& k, std::string_view v, std::int64_t delta, deadline d,
                            const std::vector<std::string>& keys) {
  s.set(k, v, d);
  { s.try_get(k, d) } -> std::same_as<std::optional<std::string>>;
  { s.add(k, delta, d) } -> std::same_as<std::int64_t>;
  { s.compare_set(k, v, v, d).current } -> std::convertible_to<std::string>;
  { s.compare_set(k, v, v, d).swapped } -> std::convertible_to<bool>;
  s.wait(keys, d);
};

//! Bytes as a string value (values are binary-safe).
inline std::string to_value(std::span<const std::byte> b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}
//! A string value as bytes.
inline bytes to_bytes(std::string_view s) {
  bytes b(s.size());
  if (!s.empty()) std::memcpy(b.data(), s.data(), s.size());
  return b;
}

//! A thread-safe in-process store. Can be made unreachable (`fail()`) to test
//! how clients react to a lost store.
class memory_store {
 public:
  //! Outcome of `compare_set`.
  struct cas_result {
    bool swapped = false;  //!< true when `desired` was stored
    std::string current;   //!< the value now stored under the key ("" when absent)
  };
  //! Stores `v` under `k` and wakes waiters. Never blocks beyond the lock.
  //! @throws system_error: peer_lost after `fail()`, timeout when `d` already expired.
  void set(const std::string& k, std::string_view v, deadline d) {
    std::lock_guard lk(m_);
    check(d, "store.set");
    kv_[k] = std::string(v);
    cv_.notify_all();
  }
  //! The value under `k`, or nullopt when absent. Errors as for `set`.
  std::optional<std::string> try_get(const std::string& k, deadline d) {
    std::lock_guard lk(m_);
    check(d, "store.get");
    auto it = kv_.find(k);
    if (it == kv_.end()) return std::nullopt;
    return it->second;
  }
  //! Removes `k`; returns whether it existed. @throws system_error: peer_lost after `fail()`.
  bool erase(std::string_view k) {
    std::lock_guard lk(m_);
    check(deadline::never(), "store.erase");
    auto it = kv_.find(std::string(k));
    if (it == kv_.end()) return false;
    kv_.erase(it);
    return true;
  }
  //! The keys that start with `prefix`, in order (for tests and diagnostics).
  std::vector<std::string> keys(std::string_view prefix = {}) const {
    std::lock_guard lk(m_);
    std::vector<std::string> out;
    for (auto it = kv_.lower_bound(std::string(prefix)); it != kv_.end() && it->first.starts_with(prefix); ++it)
      out.push_back(it->first);
    return out;
  }
  //! `try_get(keys[i])` for every i, under one lock. Errors as `try_get`.
  std::vector<std::optional<std::string>> try_get_many(std::span<const std::string> keys, deadline d) {
    std::vector<std::optional<std::string>> out;
    out.reserve(keys.size());
    std::lock_guard lk(m_);
    check(d, "store.try_get_many");
    for (const auto& k : keys) {
      auto it = kv_.find(k);
      out.push_back(it == kv_.end() ? std::nullopt : std::optional<std::string>(it->second));
    }
    return out;
  }
  //! Adds `delta` to the decimal integer under `k` (absent = 0) and returns
  //! the new value. Errors as for `set`; `errc::invalid_state` when the
  //! stored value is not a whole int64 or the sum would overflow (as the
  //! server: the value is left as it was).
  std::int64_t add(const std::string& k, std::int64_t delta, deadline d) {
    std::lock_guard lk(m_);
    check(d, "store.add");
    return add_locked(k, delta);
  }
  //! `add(keys[i], deltas[i])` for every i, under one lock. Errors as `add`;
  //! std::invalid_argument when the spans differ in length.
  std::vector<std::int64_t> add_many(std::span<const std::string> keys, std::span<const std::int64_t> deltas,
                                     deadline d) {
    if (keys.size() != deltas.size())
      throw std::invalid_argument("store.add_many: " + std::to_string(keys.size()) + " keys but " +
                                  std::to_string(deltas.size()) + " deltas");
    std::vector<std::int64_t> out;
    out.reserve(keys.size());
    std::lock_guard lk(m_);
    check(d, "store.add_many");
    for (std::size_t i = 0; i < keys.size(); ++i) out.push_back(add_locked(keys[i], deltas[i]));
    return out;
  }
  //! Stores `desired` when the value under `k` equals `expected` (an empty
  //! `expected` matches an absent key). Errors as for `set`.
  cas_result compare_set(const std::string& k, std::string_view expected, std::string_view desired, deadline d) {
    std::lock_guard lk(m_);
    check(d, "store.compare_set");
    auto it = kv_.find(k);
    const bool match = it == kv_.end() ? expected.empty() : it->second == expected;
    if (match) {
      kv_[k] = std::string(desired);
      cv_.notify_all();
      return {true, std::string(desired)};
    }
    return {false, it == kv_.end() ? std::string() : it->second};
  }
  //! Blocks until every key in `keys` exists.
  //! @throws system_error: timeout when `d` passes first (naming the first key),
  //! peer_lost after `fail()`.
  void wait(const std::vector<std::string>& keys, deadline d) {
    wait_until_found("store.wait", keys, d, [&]() -> std::optional<std::size_t> {
      for (auto& k : keys)
        if (kv_.count(k) == 0) return std::nullopt;
      return 0;
    });
  }
  //! Blocks until any key in `keys` exists; returns the index of the first
  //! one that does. Errors as for `wait`.
  std::size_t wait_any(const std::vector<std::string>& keys, deadline d) {
    if (keys.empty()) throw std::invalid_argument("store.wait_any: no keys to wait for");
    return wait_until_found("store.wait_any", keys, d, [&]() -> std::optional<std::size_t> {
      for (std::size_t i = 0; i < keys.size(); ++i)
        if (kv_.count(keys[i]) > 0) return i;
      return std::nullopt;
    });
  }
  //! Makes every later call fail with `peer_lost` (the store went away).
  void fail() {
    std::lock_guard lk(m_);
    failed_ = true;
    cv_.notify_all();
  }

 private:
  std::int64_t add_locked(const std::string& k, std::int64_t delta) {
    auto it = kv_.find(k);
    std::string why;
    const auto x =
        detail::add_to_counter(it == kv_.end() ? std::string_view() : std::string_view(it->second), delta, why);
    if (!x) throw_if(make_error_code(error::invalid_state), {.operation = "store.add", .detail = "'" + k + "' " + why});
    if (it == kv_.end()) it = kv_.emplace(k, std::string()).first;
    it->second = std::to_string(*x);
    cv_.notify_all();
    return *x;
  }
  // Waits under the lock until `found()` gives an index, or `d` passes.
  template <class Found>
  std::size_t wait_until_found(const char* op, const std::vector<std::string>& keys, deadline d, Found found) {
    std::unique_lock lk(m_);
    for (;;) {
      check(deadline::never(), op);
      if (const auto i = found()) return *i;
      if (d.expired())
        throw_if(make_error_code(error::timeout), {.operation = op, .detail = keys.empty() ? "" : keys.front()});
      cv_.wait_until(lk, std::min(d.at(), steady_clock::now() + std::chrono::milliseconds(50)));
    }
  }
  void check(deadline d, const char* op) const {
    if (failed_) throw_if(make_error_code(error::peer_lost), {.operation = op});
    if (d.expired()) throw_if(make_error_code(error::timeout), {.operation = op});
  }
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::map<std::string, std::string> kv_;
  bool failed_ = false;
};
static_assert(kv_store<memory_store>);

}  // namespace elastic
EBBFLOW_END_NAMESPACE
// ==== end <ebbflow/elastic/kv_store.hpp>

// ==== begin <ebbflow/elastic/tcp_store.hpp> ===============================
#if EBBFLOW_HAS_ASIO
// SPDX-License-Identifier: Apache-2.0
//! @file tcp_store.hpp
//! The rendezvous store: a small key-value server over Boost.Asio that a job
//! embeds (or runs standalone with `ebbflow-store`), and its client. In the
//! spirit of PyTorch's c10d TCPStore. It holds membership, UCX worker
//! addresses and heartbeats of an elastic job.
//!
//! Keys and values are arbitrary byte strings (`std::string` is binary-safe).
//! Counters made by `add` are stored as decimal text.
//!
//! Security: every connection proves the job token (a shared secret, from
//! `EBBFLOW_TOKEN` or passed in) with an HMAC-SHA256 challenge-response; the
//! secret never crosses the wire and the server proves it too. A client with
//! a wrong or missing token gets `errc::unauthorized` and is disconnected.
//! Frames are length-prefixed with a maximum size; malformed, truncated or
//! oversized frames, unknown opcodes and clients that stall mid-frame are
//! answered with an error naming the problem, logged, and disconnected
//! without affecting other clients. Traffic is not encrypted.
//!
//! Requires the `ebbflow::asio` CMake component (Boost headers + OpenSSL::Crypto).


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/deadline.hpp>  (inlined)
// #include <ebbflow/core/error.hpp>  (inlined)
// #include <ebbflow/elastic/detail/store_protocol.hpp>  (inlined)
// #include <ebbflow/elastic/store_options.hpp>  (inlined)

// Only named here; the definitions include it.
namespace boost::asio {
class io_context;
}  // namespace boost::asio

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

namespace detail {
class server_impl;
class client_connection;
}  // namespace detail

//! The store's server. Owns the key-value map; all state lives on one
//! strand, so handlers never race. Server-side `wait`/`get` block no thread:
//! they complete when a `set`/`add`/`compare_set` provides the last key or
//! their timeout passes.
//!
//! Thread safety: the member functions may be called from any thread.
class store_server {
 public:
  //! Binds and starts serving on a thread of its own.
  //! @throws system_error when the address cannot be bound; std::invalid_argument for bad options.
  explicit store_server(server_options opts = {});
  //! Binds and serves on `ioc`, which the caller runs (any number of threads).
  //! `ioc` must outlive this object.
  store_server(boost::asio::io_context& ioc, server_options opts);
  //! Stops serving and closes every connection (clients see `errc::peer_lost`). Blocks until
  //! the own thread, if any, has exited.
  ~store_server();
  store_server(const store_server&) = delete;
  store_server& operator=(const store_server&) = delete;

  //! The bound port (the chosen one when `port` was 0).
  [[nodiscard]] std::uint16_t port() const noexcept { return port_; }
  //! The bound address as given in the options.
  [[nodiscard]] const std::string& host() const noexcept { return host_; }
  //! "host:port", suitable for `EBBFLOW_STORE`.
  [[nodiscard]] std::string address() const;
  //! A snapshot of the counters (relaxed reads; never blocks).
  [[nodiscard]] server_stats stats() const noexcept;
  //! Stops accepting and closes all connections; idempotent, non-blocking.
  void stop() noexcept;

 private:
  std::unique_ptr<boost::asio::io_context> own_ioc_;
  std::shared_ptr<detail::server_impl> impl_;
  std::thread thread_;
  std::string host_;
  std::uint16_t port_ = 0;
};

//! A stream of changes to keys under a prefix, on its own connection.
//! Not thread-safe: use one watcher from one thread at a time.
class store_watcher {
 public:
  //! Takes over the connection of the source, which must not be used afterwards.
  store_watcher(store_watcher&&) noexcept;
  //! Closes this watcher's connection and takes over the source's.
  store_watcher& operator=(store_watcher&&) noexcept;
  ~store_watcher();

  //! Blocks until the next change or `d`. A timeout leaves the watcher usable.
  //! @throws system_error: errc::timeout, errc::peer_lost (server gone), errc::bad_message.
  store_event next(deadline d);
  //! As above; on error returns an empty event and sets `ec`.
  store_event next(deadline d, std::error_code& ec) noexcept;

 private:
  friend class store_client;
  explicit store_watcher(std::unique_ptr<detail::client_connection> c);
  std::unique_ptr<detail::client_connection> conn_;
};

//! A connection to a `store_server`. Connects lazily (retrying a refused
//! connection until the call's deadline, so ranks may start before the
//! store), and reconnects on the next call after the connection broke.
//! A call whose deadline passes closes the connection, so a late reply can
//! never be taken for the reply of a later call.
//!
//! Every call has a deadline: the one given, or now + `client_options::timeout`.
//! Errors (`ec` forms; the throwing forms raise `ebbflow::system_error` with
//! operation "store.<call>"): `errc::timeout`, `errc::unauthorized` (wrong
//! token), `errc::peer_lost` (server gone or connection lost mid-call),
//! `errc::bad_message` (a malformed or oversized frame), `errc::invalid_state`
//! (`add` on a non-integer value).
//!
//! Thread safety: all calls may be made from any thread; they are serialised
//! on the one connection (use one client per thread for parallel calls).
class store_client {
 public:
  //! Does not connect yet. @throws std::invalid_argument for an empty host.
  store_client(std::string host, std::uint16_t port, std::string token, client_options opts = {});
  //! From `EBBFLOW_STORE` (or `MASTER_ADDR`/`MASTER_PORT`), `EBBFLOW_TOKEN` and
  //! `EBBFLOW_STORE_TIMEOUT_MS` (see `launch_info`).
  //! @throws std::invalid_argument when no store address is set or values are malformed.
  static store_client from_environment();
  //! Takes over the connection of the source, which must not be used afterwards.
  store_client(store_client&&) noexcept;
  //! Closes this client's connection and takes over the source's.
  store_client& operator=(store_client&&) noexcept;
  ~store_client();

  //! Connects and authenticates now (otherwise the first call does).
  void connect(deadline d);
  //! As above; errors in `ec`.
  void connect(deadline d, std::error_code& ec) noexcept;

  //! Stores `value` under `key`, waking waiters and watchers.
  void set(std::string_view key, std::string_view value);
  //! As above, by deadline `d`.
  void set(std::string_view key, std::string_view value, deadline d);
  //! As above; errors in `ec`.
  void set(std::string_view key, std::string_view value, std::error_code& ec) noexcept;
  //! As above, by deadline `d`; errors in `ec`.
  void set(std::string_view key, std::string_view value, deadline d, std::error_code& ec) noexcept;

  //! The value of `key`, waiting (server-side) until it is set or `d` passes (errc::timeout).
  std::string get(std::string_view key);
  //! As above, by deadline `d`.
  std::string get(std::string_view key, deadline d);
  //! As above; on error sets `ec` and returns an empty string.
  std::string get(std::string_view key, std::error_code& ec) noexcept;
  //! As above, by deadline `d`; on error sets `ec` and returns an empty string.
  std::string get(std::string_view key, deadline d, std::error_code& ec) noexcept;

  //! The value of `key`, or nullopt when it is not set. Does not wait.
  std::optional<std::string> try_get(std::string_view key);
  //! As above, by deadline `d`.
  std::optional<std::string> try_get(std::string_view key, deadline d);
  //! As above; on error sets `ec` and returns nullopt.
  std::optional<std::string> try_get(std::string_view key, std::error_code& ec) noexcept;
  //! As above, by deadline `d`; on error sets `ec` and returns nullopt.
  std::optional<std::string> try_get(std::string_view key, deadline d, std::error_code& ec) noexcept;

  //! Atomically adds `delta` to the integer at `key` (missing: 0) and returns the result.
  std::int64_t add(std::string_view key, std::int64_t delta);
  //! As above, by deadline `d`.
  std::int64_t add(std::string_view key, std::int64_t delta, deadline d);
  //! As above; on error sets `ec` and returns 0.
  std::int64_t add(std::string_view key, std::int64_t delta, std::error_code& ec) noexcept;
  //! As above, by deadline `d`; on error sets `ec` and returns 0.
  std::int64_t add(std::string_view key, std::int64_t delta, deadline d, std::error_code& ec) noexcept;

  //! `add(keys[i], deltas[i])` for every i, pipelined: all requests leave in
  //! one write and the replies come back in order, so a batch costs about one
  //! round trip. Each add is atomic; the batch as a whole is not (other
  //! clients' calls may interleave). Returns the values after each add.
  //! @throws std::invalid_argument when the spans differ in length; a
  //! system_error as `add` (naming the first key that failed).
  std::vector<std::int64_t> add_many(std::span<const std::string> keys, std::span<const std::int64_t> deltas,
                                     deadline d);
  //! As above; on error sets `ec` and returns the values of the adds that
  //! completed before it (the rest may or may not have been applied).
  std::vector<std::int64_t> add_many(std::span<const std::string> keys, std::span<const std::int64_t> deltas,
                                     deadline d, std::error_code& ec);

  //! `try_get(keys[i])` for every i, pipelined as `add_many`: about one
  //! round trip for the batch. @throws system_error as `try_get` (naming the
  //! first key that failed).
  std::vector<std::optional<std::string>> try_get_many(std::span<const std::string> keys, deadline d);
  //! As above; on error sets `ec` and returns the values read before it.
  std::vector<std::optional<std::string>> try_get_many(std::span<const std::string> keys, deadline d,
                                                       std::error_code& ec);

  //! Atomically stores `desired` if the value is `expected` (a missing key
  //! matches an empty `expected`), and returns what is stored now.
  compare_set_result compare_set(std::string_view key, std::string_view expected, std::string_view desired);
  //! As above, by deadline `d`.
  compare_set_result compare_set(std::string_view key, std::string_view expected, std::string_view desired, deadline d);
  //! As above; on error sets `ec` and returns an empty result.
  compare_set_result compare_set(std::string_view key, std::string_view expected, std::string_view desired,
                                 std::error_code& ec) noexcept;
  //! As above, by deadline `d`; on error sets `ec` and returns an empty result.
  compare_set_result compare_set(std::string_view key, std::string_view expected, std::string_view desired, deadline d,
                                 std::error_code& ec) noexcept;

  //! Blocks until every key in `keys` is set, or `d` passes (errc::timeout).
  //! The server waits; the client does not poll.
  void wait(const std::vector<std::string>& keys, deadline d);
  //! As above; errors in `ec`.
  void wait(const std::vector<std::string>& keys, deadline d, std::error_code& ec) noexcept;

  //! Blocks until any key in `keys` is set, or `d` passes (errc::timeout);
  //! returns the index of the first one set, in the order of `keys`. The
  //! server waits; the client does not poll.
  //! @throws std::invalid_argument when `keys` is empty.
  std::size_t wait_any(const std::vector<std::string>& keys, deadline d);
  //! As above; errors in `ec` (an empty `keys` is the server's bad_message).
  std::size_t wait_any(const std::vector<std::string>& keys, deadline d, std::error_code& ec) noexcept;

  //! True when every key in `keys` is set. Does not wait.
  bool check(const std::vector<std::string>& keys);
  //! As above; on error sets `ec` and returns false.
  bool check(const std::vector<std::string>& keys, std::error_code& ec) noexcept;

  //! Removes `key`; returns whether it existed.
  bool erase(std::string_view key);
  //! As above; on error sets `ec` and returns false.
  bool erase(std::string_view key, std::error_code& ec) noexcept;

  //! Number of keys stored.
  std::int64_t num_keys();
  //! As above; on error sets `ec` and returns 0.
  std::int64_t num_keys(std::error_code& ec) noexcept;

  //! One round trip (liveness, latency).
  void ping(deadline d);
  //! As above; errors in `ec`.
  void ping(deadline d, std::error_code& ec) noexcept;

  //! Opens a new connection that streams every change to keys starting with
  //! `prefix`; with `include_existing` it first reports the keys already set
  //! (as `set` events, in unspecified order).
  store_watcher watch(std::string_view prefix, bool include_existing, deadline d);
  //! As above; on error sets `ec` and returns a watcher whose connection is
  //! closed (do not use it).
  store_watcher watch(std::string_view prefix, bool include_existing, deadline d, std::error_code& ec) noexcept;

  //! Drops the connection (the next call reconnects).
  void close() noexcept;

  //! The server's reason for the last failed call (e.g. "wait: 1 of 3 keys still
  //! missing after 100 ms: 'b'"), or the local one; empty after a success.
  [[nodiscard]] std::string last_error_detail() const;
  //! The server host given at construction.
  [[nodiscard]] const std::string& host() const noexcept { return host_; }
  //! The server port given at construction.
  [[nodiscard]] std::uint16_t port() const noexcept { return port_; }

 private:
  [[nodiscard]] deadline default_deadline() const noexcept { return deadline::after(opts_.timeout); }
  //! One request/reply exchange; `waits`: the server may hold the reply until `d`.
  detail::proto::decode_result call(std::string frame, deadline d, bool waits, std::error_code& ec) noexcept;
  template <class Frame, class Reply>
  void pipelined(const char* what, std::span<const std::string> keys, Frame&& frame, Reply&& reply, deadline d,
                 std::error_code& ec);
  [[noreturn]] void raise(const char* operation, std::string_view key, std::error_code ec) const;
  std::string host_;
  std::uint16_t port_ = 0;
  std::string token_;
  client_options opts_;
  std::unique_ptr<detail::client_connection> conn_;
};

//! A process's open-file limits (RLIMIT_NOFILE).
struct open_file_limit {
  std::uint64_t soft = 0;  //!< the limit in force
  std::uint64_t hard = 0;  //!< how far an unprivileged process may raise it
};
//! Raises this process's soft open-file limit to its hard limit and returns
//! the limits from before (zeros if they cannot be read). A store
//! serving N workers holds about 3 N sockets, and the usual soft limit (1024)
//! stops it near 340 workers. `ebbflow-run` and `ebbflow-store` call it at
//! start; `ebbflow-run` starts its workers with the old soft limit.
open_file_limit raise_open_file_limit() noexcept;

}  // namespace elastic
EBBFLOW_END_NAMESPACE

// #include <ebbflow/elastic/impl/store_server.hpp>  (inlined here)
// ---- begin <ebbflow/elastic/impl/store_server.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file impl/store_server.hpp
//! Definitions of `store_server` (included by elastic/tcp_store.hpp).


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/env.hpp>  (inlined)
// #include <ebbflow/core/error.hpp>  (inlined)
// #include <ebbflow/core/log.hpp>  (inlined)
// #include <ebbflow/core/thread_name.hpp>  (inlined)
// #include <ebbflow/elastic/detail/hmac.hpp>  (inlined here)
// ---- begin <ebbflow/elastic/detail/hmac.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file hmac.hpp
//! HMAC-SHA256 challenge-response helpers for the store handshake (no API
//! promise). Uses OpenSSL's libcrypto (link `ebbflow::asio`).


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/elastic/detail/store_protocol.hpp>  (inlined)

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/random.h>

#include <array>
#include <cerrno>
#include <random>
#include <string>
#include <string_view>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

//! `n` cryptographically random bytes: the kernel's CSPRNG (`getrandom`),
//! else OpenSSL's RAND_bytes, else std::random_device (/dev/urandom on
//! Linux). `getrandom` first: RAND_bytes instantiates OpenSSL's DRBG on its
//! first call, 1.3-1.6 ms of CPU in every process that joins a job.
inline std::string random_bytes(std::size_t n) {
  std::string out(n, '\0');
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::getrandom(out.data() + got, n - got, 0);
    if (r > 0) {
      got += static_cast<std::size_t>(r);
    } else if (r < 0 && errno != EINTR) {
      break;  // ENOSYS (an old kernel or a seccomp filter): try OpenSSL
    }
  }
  if (got == n) return out;
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1) {
    std::random_device rd;
    for (auto& c : out) c = static_cast<char>(rd() & 0xff);
  }
  return out;
}

//! Lower-case hex of `n` random bytes (for generated job tokens).
inline std::string random_hex(std::size_t n) {
  static constexpr char hex[] = "0123456789abcdef";
  const std::string b = random_bytes(n);
  std::string out;
  out.reserve(2 * n);
  for (unsigned char c : b) {
    out.push_back(hex[c >> 4]);
    out.push_back(hex[c & 15]);
  }
  return out;
}

//! HMAC-SHA256(key, label | a | b).
inline std::string handshake_mac(std::string_view key, std::string_view label, std::string_view a, std::string_view b) {
  std::string msg;
  msg.reserve(label.size() + a.size() + b.size());
  msg.append(label).append(a).append(b);
  std::array<unsigned char, EVP_MAX_MD_SIZE> out{};
  unsigned int out_len = 0;
  static const unsigned char empty_key = 0;  // HMAC wants a non-null key pointer even for length 0
  const void* k = key.empty() ? static_cast<const void*>(&empty_key) : static_cast<const void*>(key.data());
  if (!HMAC(EVP_sha256(), k, static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(msg.data()),
            msg.size(), out.data(), &out_len) ||
      out_len != proto::mac_bytes) {
    return {};  // empty: mac_equal() never accepts it
  }
  return std::string(reinterpret_cast<const char*>(out.data()), out_len);
}

inline constexpr std::string_view client_label = "ebbflow-store client";
inline constexpr std::string_view server_label = "ebbflow-store server";

//! Constant-time comparison of two MACs.
inline bool mac_equal(std::string_view a, std::string_view b) noexcept {
  return a.size() == b.size() && a.size() == proto::mac_bytes && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/elastic/detail/hmac.hpp>
// #include <ebbflow/elastic/detail/server_connection.hpp>  (inlined here)
// ---- begin <ebbflow/elastic/detail/server_connection.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file detail/server_connection.hpp
//! The store server's state (`server_impl`: keys, waiters, watchers,
//! connections; touched only on its strand) and one client connection
//! (`server_conn`): the HMAC handshake, frames in, replies and events out,
//! with a bound on what it buffers for a slow reader.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/env.hpp>  (inlined)
// #include <ebbflow/core/error.hpp>  (inlined)
// #include <ebbflow/core/log.hpp>  (inlined)
// #include <ebbflow/core/thread_name.hpp>  (inlined)
// #include <ebbflow/elastic/detail/hmac.hpp>  (inlined)
// #include <ebbflow/elastic/detail/store_protocol.hpp>  (inlined)
// #include <ebbflow/elastic/store_options.hpp>  (inlined)
// #include <ebbflow/elastic/kv_store.hpp>  (inlined)
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <sys/resource.h>
#include <algorithm>
#include <array>
#include <charconv>
#include <deque>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {
namespace detail {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

class server_conn;

//! A server-side `wait`, `wait_any` or waiting `get`.
struct store_waiter {
  enum class kind { all, any, get };
  explicit store_waiter(const asio::any_io_executor& ex) : timer(ex) {}
  std::weak_ptr<server_conn> conn;
  std::set<std::string> missing;  // keys not yet set
  std::size_t total = 0;
  kind what = kind::all;
  std::string get_key;
  std::vector<std::string> any_keys;  // wait_any: the keys in request order (the reply is an index)
  std::uint32_t timeout_ms = 0;
  bool done = false;
  asio::steady_timer timer;
};

//! All store state. Every member is touched only on `strand_`.
class server_impl : public std::enable_shared_from_this<server_impl> {
 public:
  using strand_t = asio::strand<asio::io_context::executor_type>;

  server_impl(asio::io_context& ioc, server_options opts)
      : strand_(asio::make_strand(ioc)), acceptor_(strand_), retry_(strand_), opts_(std::move(opts)) {
    EBBFLOW_ENFORCE(!opts_.host.empty(), "store_server: empty host");
    EBBFLOW_ENFORCE(opts_.max_message_bytes >= 64 && opts_.max_message_bytes <= 0xffffffffu,
                    "store_server: max_message_bytes " << opts_.max_message_bytes << " not in [64, 2^32)");
    EBBFLOW_ENFORCE(opts_.frame_timeout.count() > 0 && opts_.auth_timeout.count() > 0,
                    "store_server: timeouts must be positive");
    EBBFLOW_ENFORCE(opts_.max_connections > 0, "store_server: max_connections must be positive");
    error_context ctx{-1, -1, -1, "store.listen", opts_.host + ":" + std::to_string(opts_.port)};
    boost::system::error_code ec;
    tcp::resolver res(ioc);
    auto eps = res.resolve(opts_.host, std::to_string(opts_.port), tcp::resolver::passive, ec);
    if (ec || eps.empty()) throw_if(ec ? std::error_code(ec) : make_error_code(std::errc::address_not_available), ctx);
    const tcp::endpoint ep = eps.begin()->endpoint();
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    throw_if(ec, ctx);
    port_ = acceptor_.local_endpoint().port();
    if (opts_.token.empty())
      EBBFLOW_LOG_WARN("store: serving on " << opts_.host << ":" << port_
                                            << " without a job token (EBBFLOW_TOKEN unset): any local client can join");
    EBBFLOW_LOG_INFO("store: listening on " << opts_.host << ":" << port_);
  }

  void start() {
    asio::post(strand_, [self = shared_from_this()] { self->accept(); });
  }
  void stop() noexcept;

  std::uint16_t port() const noexcept { return port_; }
  server_stats stats() const noexcept {
    return {accepted_.load(std::memory_order_relaxed), unauthorized_.load(std::memory_order_relaxed),
            protocol_errors_.load(std::memory_order_relaxed), open_.load(std::memory_order_relaxed)};
  }

  // ---- used by server_conn (on the strand)
  const server_options& opts() const noexcept { return opts_; }
  strand_t& strand() noexcept { return strand_; }
  void count_unauthorized() noexcept { unauthorized_.fetch_add(1, std::memory_order_relaxed); }
  void count_protocol_error() noexcept { protocol_errors_.fetch_add(1, std::memory_order_relaxed); }
  void forget(std::uint64_t id) noexcept {
    if (conns_.erase(id)) open_.fetch_sub(1, std::memory_order_relaxed);
  }

  //! Executes one authenticated request; returns the reply frame, or an
  //! empty string when the reply comes later (a registered waiter).
  std::string execute(const std::shared_ptr<server_conn>& conn, const proto::message& m);
  void cancel_waiter(const std::shared_ptr<store_waiter>& w) noexcept;
  void remove_watcher(const server_conn* c) noexcept {
    std::erase_if(watchers_, [c](const auto& w) { return w.first.expired() || w.first.lock().get() == c; });
  }

 private:
  void accept();
  void notify(const std::string& key, proto::event_kind kind, std::string_view value);
  void finish_waiter(const std::shared_ptr<store_waiter>& w, std::string frame);
  std::string register_waiter(const std::shared_ptr<server_conn>& conn, const proto::message& m,
                              store_waiter::kind what);

  strand_t strand_;
  tcp::acceptor acceptor_;
  asio::steady_timer retry_;
  server_options opts_;
  std::uint16_t port_ = 0;
  bool stopped_ = false;
  bool accept_failing_ = false;  // an accept error was logged; cleared by the next accepted connection
  std::uint64_t next_id_ = 0;
  std::unordered_map<std::string, std::string> data_;
  std::unordered_multimap<std::string, std::shared_ptr<store_waiter>> waiters_;
  std::vector<std::pair<std::weak_ptr<server_conn>, std::string>> watchers_;  // (conn, prefix)
  std::unordered_map<std::uint64_t, std::weak_ptr<server_conn>> conns_;
  std::atomic<std::uint64_t> accepted_{0}, unauthorized_{0}, protocol_errors_{0}, open_{0};
};

//! One client connection: frames in, replies and events out.
class server_conn : public std::enable_shared_from_this<server_conn> {
 public:
  server_conn(std::shared_ptr<server_impl> srv, tcp::socket s, std::uint64_t id)
      : srv_(std::move(srv)), sock_(std::move(s)), timer_(srv_->strand()), id_(id) {
    boost::system::error_code ec;
    auto ep = sock_.remote_endpoint(ec);
    peer_ = ec ? std::string("?") : ep.address().to_string() + ":" + std::to_string(ep.port());
    sock_.set_option(tcp::no_delay(true), ec);
  }

  void start() {
    server_nonce_ = random_bytes(proto::nonce_bytes);
    send(proto::frame_builder(proto::op::challenge).u8(proto::version).raw(server_nonce_).finish());
    arm_timer(srv_->opts().auth_timeout);
    read();
  }

  //! Rejects the connection (e.g. too many connections) with an error frame.
  void reject(errc code, std::string reason) { fail(code, std::move(reason), false); }

  void send(std::string frame) {
    if (closed_) return;
    out_bytes_ += frame.size();
    outq_.push_back(std::move(frame));
    if (out_bytes_ > srv_->opts().max_pending_output_bytes) {
      EBBFLOW_LOG_WARN("store: closing connection from " << peer_ << ": " << out_bytes_
                                                         << " bytes of replies/events unsent (client not reading)");
      srv_->count_protocol_error();
      close();
      return;
    }
    if (!writing_) write();
  }

  //! The reply of a request that waited.
  void complete(std::string frame) {
    busy_ = false;
    waiter_.reset();
    send(std::move(frame));
    while (!busy_ && !closed_ && !pending_.empty()) {
      std::string body = std::move(pending_.front());
      pending_.pop_front();
      handle(body);
    }
  }

  void set_watching() noexcept { watching_ = true; }
  bool watching() const noexcept { return watching_; }
  const std::string& peer() const noexcept { return peer_; }

  //! Closes at once (server stop, slow watcher).
  void close() noexcept {
    if (closed_) return;
    closed_ = true;
    boost::system::error_code ec;
    timer_.cancel();
    if (waiter_) srv_->cancel_waiter(waiter_);
    waiter_.reset();
    if (watching_) srv_->remove_watcher(this);
    sock_.close(ec);
    srv_->forget(id_);
  }

 private:
  void arm_timer(std::chrono::milliseconds after) {
    timer_.expires_after(after);
    const std::uint64_t seq = frame_seq_;
    armed_seq_ = seq;
    timer_armed_ = true;
    timer_.async_wait([self = shared_from_this(), seq](const boost::system::error_code& ec) {
      if (ec || self->closed_ || self->draining_) return;
      if (!self->authed_) {
        self->fail(errc::timeout,
                   "no authentication within " + std::to_string(self->srv_->opts().auth_timeout.count()) + " ms");
      } else if (seq == self->frame_seq_ && !self->in_.empty()) {
        std::string why = "read deadline: frame incomplete after " +
                          std::to_string(self->srv_->opts().frame_timeout.count()) + " ms (" +
                          std::to_string(self->in_.size()) + " bytes received";
        if (self->in_.size() >= proto::header_bytes)
          why += " of " + std::to_string(proto::load_u32(self->in_.data()) + proto::header_bytes);
        self->fail(errc::timeout, why + ")");
      }
    });
  }

  void read() {
    if (closed_ || failing_) return;
    sock_.async_read_some(asio::buffer(rbuf_), [self = shared_from_this()](const boost::system::error_code& ec,
                                                                           std::size_t n) { self->on_read(ec, n); });
  }

  void on_read(const boost::system::error_code& ec, std::size_t n) {
    if (closed_ || failing_) return;
    if (ec) {
      if (!in_.empty()) {
        std::string why = "truncated frame: connection closed after " + std::to_string(in_.size()) + " of ";
        why += in_.size() >= proto::header_bytes ? std::to_string(proto::load_u32(in_.data()) + proto::header_bytes)
                                                 : std::string("4 header");
        fail(errc::bad_message, why + " bytes");
      } else {
        EBBFLOW_LOG_DEBUG("store: " << peer_ << " disconnected (" << ec.message() << ")");
        close();
      }
      return;
    }
    in_.append(rbuf_.data(), n);
    // Extract every complete frame.
    std::size_t pos = 0;
    while (!closed_ && !failing_ && in_.size() - pos >= proto::header_bytes) {
      const std::uint32_t len = proto::load_u32(in_.data() + pos);
      const std::size_t limit = authed_ ? srv_->opts().max_message_bytes : proto::preauth_max_message_bytes;
      if (auto why = proto::check_length(len, limit); !why.empty()) {
        if (!authed_) why += " before authentication";
        fail(errc::bad_message, why);
        return;
      }
      if (in_.size() - pos < proto::header_bytes + len) break;
      std::string body = in_.substr(pos + proto::header_bytes, len);
      pos += proto::header_bytes + len;
      ++frame_seq_;
      on_frame(std::move(body));
    }
    if (closed_ || failing_) return;
    in_.erase(0, pos);
    if (authed_) {
      if (in_.empty()) {
        if (timer_armed_) timer_.cancel();
        timer_armed_ = false;
      } else if (!timer_armed_ || armed_seq_ != frame_seq_) {
        arm_timer(srv_->opts().frame_timeout);  // the first bytes of a frame: start its deadline
      }
    }
    read();
  }

  void on_frame(std::string body) {
    if (!authed_) {
      authenticate(body);
      return;
    }
    if (busy_) {
      if (pending_.size() >= 16) {
        fail(errc::bad_message, "more than 16 requests pipelined behind a waiting request");
        return;
      }
      pending_.push_back(std::move(body));
      return;
    }
    handle(body);
  }

  void authenticate(const std::string& body) {
    auto r = proto::decode_body(body);
    if (!r) {
      fail(errc::bad_message, "handshake: " + r.reason);
      return;
    }
    if (r.msg.code != proto::op::auth) {
      fail(errc::unauthorized, std::string("expected auth, got ") + proto::op_name(r.msg.code));
      srv_->count_unauthorized();
      return;
    }
    if (r.msg.flag != proto::version) {
      fail(errc::bad_message, "protocol version " + std::to_string(r.msg.flag) + " not supported (server speaks " +
                                  std::to_string(proto::version) + ")");
      return;
    }
    const std::string& token = srv_->opts().token;
    if (!mac_equal(r.msg.mac, handshake_mac(token, client_label, server_nonce_, r.msg.nonce))) {
      srv_->count_unauthorized();
      fail(errc::unauthorized, "job token does not match", false);
      return;
    }
    authed_ = true;
    timer_.cancel();
    timer_armed_ = false;
    send(proto::frame_builder(proto::op::welcome)
             .raw(handshake_mac(token, server_label, server_nonce_, r.msg.nonce))
             .finish());
    EBBFLOW_LOG_DEBUG("store: " << peer_ << " authenticated");
  }

  void handle(const std::string& body) {
    auto r = proto::decode_body(body);
    if (!r) {
      fail(errc::bad_message, r.reason);
      return;
    }
    if (watching_) {
      fail(errc::bad_message,
           std::string("a watch connection takes no requests (got ") + proto::op_name(r.msg.code) + ")");
      return;
    }
    if (static_cast<std::uint8_t>(r.msg.code) >= 0x80 || r.msg.code == proto::op::auth) {
      fail(errc::bad_message, std::string("unexpected opcode ") + proto::op_name(r.msg.code) + " from a client");
      return;
    }
    std::string reply = srv_->execute(shared_from_this(), r.msg);
    if (reply.empty()) return;  // waiting; `complete` sends the reply
    send(std::move(reply));
  }

 public:
  void set_waiter(std::shared_ptr<store_waiter> w) {
    waiter_ = std::move(w);
    busy_ = true;
  }

 private:
  //! Logs, replies with an error frame and closes once it is sent.
  void fail(errc code, std::string reason, bool count = true) {
    if (closed_ || failing_) return;
    failing_ = true;
    if (count && code != errc::unauthorized) srv_->count_protocol_error();
    if (code == errc::unauthorized)
      EBBFLOW_LOG_WARN("store: refused client " << peer_ << ": " << reason);
    else
      EBBFLOW_LOG_WARN("store: closing connection from " << peer_ << ": " << reason);
    if (waiter_) srv_->cancel_waiter(waiter_);
    waiter_.reset();
    if (watching_) srv_->remove_watcher(this);
    watching_ = false;
    pending_.clear();
    outq_.push_back(proto::error_frame(code, reason));
    out_bytes_ += outq_.back().size();  // the write's completion subtracts it again
    // A client that does not read cannot hold the error reply (and us) forever.
    timer_armed_ = false;
    timer_.expires_after(srv_->opts().frame_timeout);
    timer_.async_wait([self = shared_from_this()](const boost::system::error_code& e) {
      if (!e && !self->draining_) self->close();
    });
    if (!writing_) write();
  }

  void write() {
    if (closed_) return;
    if (outq_.empty()) {
      if (failing_) linger();
      return;
    }
    writing_ = true;
    asio::async_write(sock_, asio::buffer(outq_.front()),
                      [self = shared_from_this()](const boost::system::error_code& ec, std::size_t) {
                        self->writing_ = false;
                        if (self->closed_) return;
                        if (ec) {
                          EBBFLOW_LOG_DEBUG("store: write to " << self->peer_ << " failed: " << ec.message());
                          self->close();
                          return;
                        }
                        self->out_bytes_ -= self->outq_.front().size();
                        self->outq_.pop_front();
                        self->write();
                      });
  }

  //! After an error reply: send FIN, then discard input until the peer closes
  //! (or a short deadline), so that unread input does not turn our close into
  //! a reset that destroys the error reply before the client reads it.
  void linger() {
    if (draining_ || closed_) return;
    draining_ = true;
    boost::system::error_code ec;
    sock_.shutdown(tcp::socket::shutdown_send, ec);
    timer_.expires_after(std::min<std::chrono::milliseconds>(srv_->opts().frame_timeout, std::chrono::seconds(1)));
    timer_.async_wait([self = shared_from_this()](const boost::system::error_code& e) {
      if (!e) self->close();
    });
    drain();
  }
  void drain() {
    sock_.async_read_some(asio::buffer(rbuf_),
                          [self = shared_from_this()](const boost::system::error_code& ec, std::size_t) {
                            if (self->closed_) return;
                            if (ec) {
                              self->close();
                              return;
                            }
                            self->drain();
                          });
  }

  std::shared_ptr<server_impl> srv_;
  tcp::socket sock_;
  asio::steady_timer timer_;
  std::uint64_t id_;
  std::string peer_;
  std::string server_nonce_;
  std::array<char, 65536> rbuf_{};
  std::string in_;
  std::deque<std::string> outq_;
  std::deque<std::string> pending_;
  std::size_t out_bytes_ = 0;
  std::uint64_t frame_seq_ = 0, armed_seq_ = 0;
  std::shared_ptr<store_waiter> waiter_;
  bool authed_ = false, busy_ = false, watching_ = false, writing_ = false;
  bool failing_ = false, draining_ = false, closed_ = false, timer_armed_ = false;
};

}  // namespace detail
}  // namespace elastic
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/elastic/detail/server_connection.hpp>
// #include <ebbflow/elastic/detail/store_protocol.hpp>  (inlined)
// #include <ebbflow/elastic/kv_store.hpp>  (inlined)
// #include <ebbflow/elastic/tcp_store.hpp>  (inlined)

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <deque>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

// Compiled into ebbflow::compiled in separate compilation (config.hpp).
#if EBBFLOW_HEADER_ONLY
EBBFLOW_BEGIN_NAMESPACE
namespace elastic {
namespace detail {

EBBFLOW_DECL void server_impl::accept() {
  if (stopped_) return;
  auto sock = std::make_shared<tcp::socket>(strand_);
  acceptor_.async_accept(*sock, [self = shared_from_this(), sock](const boost::system::error_code& ec) {
    if (self->stopped_) return;
    if (ec) {
      // EMFILE and friends: log once and retry shortly rather than spin.
      if (!self->accept_failing_) {
        std::string hint;
        if (ec == boost::system::errc::too_many_files_open) {
          rlimit l{};
          ::getrlimit(RLIMIT_NOFILE, &l);
          hint = " (open-file limit " + std::to_string(l.rlim_cur) + ", " + std::to_string(self->conns_.size()) +
                 " connections open; every worker holds 3: raise `ulimit -n`, or call "
                 "elastic::raise_open_file_limit() in the process that serves the store)";
        }
        EBBFLOW_LOG_WARN("store: accept failed: " << ec.message() << hint << "; retrying every 50 ms");
        self->accept_failing_ = true;
      }
      self->retry_.expires_after(std::chrono::milliseconds(50));
      self->retry_.async_wait([self](const boost::system::error_code& e) {
        if (!e) self->accept();
      });
      return;
    }
    self->accepted_.fetch_add(1, std::memory_order_relaxed);
    self->accept_failing_ = false;
    const std::uint64_t id = self->next_id_++;
    auto conn = std::make_shared<server_conn>(self, std::move(*sock), id);
    self->conns_.emplace(id, conn);
    self->open_.fetch_add(1, std::memory_order_relaxed);
    if (self->conns_.size() > self->opts_.max_connections) {
      conn->reject(errc::invalid_state,
                   "too many connections (limit " + std::to_string(self->opts_.max_connections) + ")");
    } else {
      conn->start();
    }
    self->accept();
  });
}

EBBFLOW_DECL void server_impl::stop() noexcept {
  asio::post(strand_, [self = shared_from_this()] {
    if (self->stopped_) return;
    self->stopped_ = true;
    boost::system::error_code ec;
    self->acceptor_.close(ec);
    self->retry_.cancel();
    std::vector<std::shared_ptr<server_conn>> live;
    for (auto& [id, w] : self->conns_)
      if (auto c = w.lock()) live.push_back(std::move(c));
    for (auto& c : live) c->close();
    self->conns_.clear();
    self->open_.store(0, std::memory_order_relaxed);
    EBBFLOW_LOG_INFO("store: stopped");
  });
}

EBBFLOW_DECL void server_impl::notify(const std::string& key, proto::event_kind kind, std::string_view value) {
  // The event goes out before any waiter completes: completing one runs the
  // requests its client pipelined behind the wait (`server_conn::complete`),
  // whose mutations send their own events, and a watcher must see those
  // after this one (events follow the order of the mutations).
  if (!watchers_.empty()) {
    std::string frame;
    std::vector<std::shared_ptr<server_conn>> targets;
    for (auto& [w, prefix] : watchers_)
      if (key.starts_with(prefix))
        if (auto c = w.lock()) targets.push_back(std::move(c));
    if (!targets.empty()) {
      frame = proto::frame_builder(proto::op::event, key.size() + value.size() + 16)
                  .u8(static_cast<std::uint8_t>(kind))
                  .str(key)
                  .str(value)
                  .finish();
      for (auto& c : targets) c->send(frame);
    }
  }
  if (kind == proto::event_kind::set) {
    auto [b, e] = waiters_.equal_range(key);
    if (b != e) {
      std::vector<std::shared_ptr<store_waiter>> hit;
      for (auto it = b; it != e; ++it) hit.push_back(it->second);
      waiters_.erase(b, e);
      // `value` stays valid: it is the setter's frame or a local of
      // `execute`, never the map entry a released request may reassign.
      for (auto& w : hit) {
        if (w->done) continue;
        w->missing.erase(key);
        if (w->what == store_waiter::kind::any) {
          const auto at = std::find(w->any_keys.begin(), w->any_keys.end(), key) - w->any_keys.begin();
          finish_waiter(w, proto::frame_builder(proto::op::integer).i64(at).finish());
          continue;
        }
        if (!w->missing.empty()) continue;
        if (w->what == store_waiter::kind::get)
          finish_waiter(w, proto::frame_builder(proto::op::value, value.size() + 8).str(value).finish());
        else
          finish_waiter(w, proto::frame_builder(proto::op::ok).finish());
      }
    }
  }
}

EBBFLOW_DECL void server_impl::finish_waiter(const std::shared_ptr<store_waiter>& w, std::string frame) {
  w->done = true;
  w->timer.cancel();
  for (const auto& k : w->missing) {
    auto [b, e] = waiters_.equal_range(k);
    for (auto it = b; it != e;) it = it->second == w ? waiters_.erase(it) : std::next(it);
  }
  if (auto c = w->conn.lock()) c->complete(std::move(frame));
}

EBBFLOW_DECL void server_impl::cancel_waiter(const std::shared_ptr<store_waiter>& w) noexcept {
  if (w->done) return;
  w->done = true;
  w->timer.cancel();
  for (const auto& k : w->missing) {
    auto [b, e] = waiters_.equal_range(k);
    for (auto it = b; it != e;) it = it->second == w ? waiters_.erase(it) : std::next(it);
  }
}

EBBFLOW_DECL std::string server_impl::register_waiter(const std::shared_ptr<server_conn>& conn, const proto::message& m,
                                                store_waiter::kind what) {
  auto w = std::make_shared<store_waiter>(strand_);
  w->conn = conn;
  w->what = what;
  w->timeout_ms = m.timeout_ms;
  if (what == store_waiter::kind::get) {
    w->get_key = std::string(m.key);
    w->missing.insert(w->get_key);
    w->total = 1;
  } else {
    w->total = m.keys.size();
    for (auto k : m.keys)
      if (!data_.contains(std::string(k))) w->missing.emplace(k);
    if (what == store_waiter::kind::any) w->any_keys.assign(m.keys.begin(), m.keys.end());
  }
  auto timeout_reply = [w] {
    std::ostringstream os;
    if (w->what == store_waiter::kind::get) {
      os << "get: key " << quote_key(w->get_key) << " not set within " << w->timeout_ms << " ms";
    } else {
      if (w->what == store_waiter::kind::any)
        os << "wait_any: none of " << w->total << " keys set within " << w->timeout_ms << " ms:";
      else
        os << "wait: " << w->missing.size() << " of " << w->total << " keys still missing after " << w->timeout_ms
           << " ms:";
      int n = 0;
      for (const auto& k : w->missing) {
        if (n++ == 5) {
          os << " ...";
          break;
        }
        os << ' ' << quote_key(k);
      }
    }
    return proto::error_frame(errc::timeout, os.str());
  };
  if (m.timeout_ms == 0) return timeout_reply();
  for (const auto& k : w->missing) waiters_.emplace(k, w);
  conn->set_waiter(w);
  if (m.timeout_ms != proto::no_timeout) {
    w->timer.expires_after(std::chrono::milliseconds(m.timeout_ms));
    w->timer.async_wait([self = shared_from_this(), w, timeout_reply](const boost::system::error_code& ec) {
      if (ec || w->done) return;
      self->finish_waiter(w, timeout_reply());
    });
  }
  return {};
}

EBBFLOW_DECL std::string server_impl::execute(const std::shared_ptr<server_conn>& conn, const proto::message& m) {
  using proto::frame_builder;
  using proto::op;
  switch (m.code) {
    case op::set: {
      std::string key(m.key);
      auto& slot = data_[key];
      slot.assign(m.value);
      notify(key, proto::event_kind::set, m.value);
      return frame_builder(op::ok).finish();
    }
    case op::get: {
      if (auto it = data_.find(std::string(m.key)); it != data_.end())
        return frame_builder(op::value, it->second.size() + 8).str(it->second).finish();
      if (!m.flag) return frame_builder(op::missing).finish();
      return register_waiter(conn, m, store_waiter::kind::get);
    }
    case op::add: {
      std::string key(m.key);
      auto it = data_.find(key);
      std::string why;
      const auto sum =
          add_to_counter(it == data_.end() ? std::string_view() : std::string_view(it->second), m.integer, why);
      if (!sum) return proto::error_frame(errc::invalid_state, "add: value of " + quote_key(key) + " " + why);
      const std::int64_t next = *sum;
      std::string text = std::to_string(next);
      data_[key] = text;
      notify(key, proto::event_kind::set, text);
      return frame_builder(op::integer).i64(next).finish();
    }
    case op::compare_set: {
      std::string key(m.key);
      auto it = data_.find(key);
      const bool match = it == data_.end() ? m.expected.empty() : it->second == m.expected;
      if (match) {
        data_[key].assign(m.value);
        notify(key, proto::event_kind::set, m.value);
        return frame_builder(op::cas_result, m.value.size() + 8).u8(1).str(m.value).finish();
      }
      std::string_view cur = it == data_.end() ? std::string_view{} : std::string_view(it->second);
      return frame_builder(op::cas_result, cur.size() + 8).u8(0).str(cur).finish();
    }
    case op::wait: {
      bool all = true;
      for (auto k : m.keys)
        if (!data_.contains(std::string(k))) {
          all = false;
          break;
        }
      if (all) return frame_builder(op::ok).finish();
      return register_waiter(conn, m, store_waiter::kind::all);
    }
    case op::wait_any: {
      if (m.keys.empty()) return proto::error_frame(errc::bad_message, "wait_any: no keys to wait for");
      for (std::size_t i = 0; i < m.keys.size(); ++i)
        if (data_.contains(std::string(m.keys[i]))) return frame_builder(op::integer).i64(std::int64_t(i)).finish();
      return register_waiter(conn, m, store_waiter::kind::any);
    }
    case op::erase: {
      const bool existed = data_.erase(std::string(m.key)) > 0;
      if (existed) notify(std::string(m.key), proto::event_kind::erase, {});
      return frame_builder(op::boolean).u8(existed ? 1 : 0).finish();
    }
    case op::num_keys:
      return frame_builder(op::integer).i64(static_cast<std::int64_t>(data_.size())).finish();
    case op::check: {
      bool all = true;
      for (auto k : m.keys) all = all && data_.contains(std::string(k));
      return frame_builder(op::boolean).u8(all ? 1 : 0).finish();
    }
    case op::watch: {
      std::string prefix(m.key);
      watchers_.emplace_back(conn, prefix);
      conn->set_watching();
      conn->send(frame_builder(op::ok).finish());
      if (m.flag)
        for (const auto& [k, v] : data_)
          if (k.starts_with(prefix))
            conn->send(frame_builder(op::event, k.size() + v.size() + 16)
                           .u8(static_cast<std::uint8_t>(proto::event_kind::set))
                           .str(k)
                           .str(v)
                           .finish());
      return {};
    }
    case op::ping:
      return frame_builder(op::ok).finish();
    default:
      return proto::error_frame(errc::bad_message,
                                std::string("unexpected opcode ") + proto::op_name(m.code) + " from a client");
  }
}

}  // namespace detail

// ------------------------------------------------------------------ store_server

EBBFLOW_DECL server_options server_options::from_environment() {
  server_options o;
  if (auto t = env::get("EBBFLOW_TOKEN")) o.token = *t;
  return o;
}

EBBFLOW_DECL store_server::store_server(server_options opts) : own_ioc_(std::make_unique<boost::asio::io_context>(1)) {
  impl_ = std::make_shared<detail::server_impl>(*own_ioc_, std::move(opts));
  host_ = impl_->opts().host;
  port_ = impl_->port();
  impl_->start();
  thread_ = std::thread([ioc = own_ioc_.get()] {
    for (;;) {
      try {
        ioc->run();
        return;
      } catch (const std::exception& e) {
        // A handler should never throw (only std::bad_alloc can); keep serving.
        EBBFLOW_LOG_ERROR("store: handler threw: " << e.what());
      }
    }
  });
  ::ebbflow::detail::name_thread(thread_, "ebbflow-store");
}

EBBFLOW_DECL store_server::store_server(boost::asio::io_context& ioc, server_options opts) {
  impl_ = std::make_shared<detail::server_impl>(ioc, std::move(opts));
  host_ = impl_->opts().host;
  port_ = impl_->port();
  impl_->start();
}

EBBFLOW_DECL store_server::~store_server() {
  stop();
  if (own_ioc_) {
    // Let the stop handler run, then end the loop (pending handlers die with the io_context).
    boost::asio::post(impl_->strand(), [ioc = own_ioc_.get()] { ioc->stop(); });
    if (thread_.joinable()) thread_.join();
    impl_.reset();
    own_ioc_.reset();
  }
}

EBBFLOW_DECL std::string store_server::address() const {
  return (host_.find(':') != std::string::npos ? "[" + host_ + "]" : host_) + ":" + std::to_string(port_);
}

EBBFLOW_DECL server_stats store_server::stats() const noexcept { return impl_->stats(); }

EBBFLOW_DECL void store_server::stop() noexcept {
  if (impl_) impl_->stop();
}

EBBFLOW_DECL open_file_limit raise_open_file_limit() noexcept {
  rlimit l{};
  if (::getrlimit(RLIMIT_NOFILE, &l) != 0) return {};
  const open_file_limit before{static_cast<std::uint64_t>(l.rlim_cur), static_cast<std::uint64_t>(l.rlim_max)};
  if (l.rlim_cur < l.rlim_max) {  // never infinite for open files (fs.nr_open bounds both)
    l.rlim_cur = l.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &l);
  }
  return before;
}

}  // namespace elastic
EBBFLOW_END_NAMESPACE
#endif  // EBBFLOW_HEADER_ONLY
// ---- end <ebbflow/elastic/impl/store_server.hpp>
// #include <ebbflow/elastic/impl/store_client.hpp>  (inlined here)
// ---- begin <ebbflow/elastic/impl/store_client.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file impl/store_client.hpp
//! Definitions of `store_client` and `store_watcher` (included by elastic/tcp_store.hpp).


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/deadline.hpp>  (inlined)
// #include <ebbflow/core/env.hpp>  (inlined)
// #include <ebbflow/core/error.hpp>  (inlined)
// #include <ebbflow/core/log.hpp>  (inlined)
// #include <ebbflow/elastic/detail/hmac.hpp>  (inlined)
// #include <ebbflow/elastic/detail/client_connection.hpp>  (inlined here)
// ---- begin <ebbflow/elastic/detail/client_connection.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file detail/client_connection.hpp
//! The store client's side of one TCP connection to a store server: a
//! blocking connection whose every operation has a deadline (started
//! asynchronously; the private io_context runs until it completes or the
//! deadline passes, then it is cancelled), the HMAC handshake, and the
//! request frames the client builds.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/deadline.hpp>  (inlined)
// #include <ebbflow/core/env.hpp>  (inlined)
// #include <ebbflow/core/error.hpp>  (inlined)
// #include <ebbflow/core/log.hpp>  (inlined)
// #include <ebbflow/elastic/detail/hmac.hpp>  (inlined)
// #include <ebbflow/elastic/detail/store_protocol.hpp>  (inlined)
// #include <ebbflow/elastic/store_options.hpp>  (inlined)
#include <boost/asio/buffer.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {
namespace detail {

namespace asio = boost::asio;

//! A blocking connection with deadlines: each operation is started
//! asynchronously and the private io_context is run until it completes or
//! the deadline passes (then the operation is cancelled).
class client_connection {
 public:
  client_connection(std::string host, std::uint16_t port, std::string token, std::size_t max_bytes)
      : host_(std::move(host)), port_(port), token_(std::move(token)), max_bytes_(max_bytes) {}

  std::mutex mu;            //!< serialises calls of a store_client
  std::string last_detail;  //!< reason of the last failure

  [[nodiscard]] bool connected() const noexcept { return connected_; }
  [[nodiscard]] std::string address() const { return host_ + ":" + std::to_string(port_); }

  void close() noexcept {
    boost::system::error_code ec;
    sock_.close(ec);
    in_.clear();
    connected_ = false;
  }

  //! Connects (retrying refused connections until `d`) and runs the handshake.
  void connect(deadline d, std::error_code& ec) {
    close();
    ec.clear();
    boost::system::error_code bec;
    std::vector<tcp::endpoint> eps;
    if (auto a = asio::ip::make_address(host_, bec); !bec) {
      eps.emplace_back(a, port_);
    } else {
      tcp::resolver res(ioc_);
      std::optional<boost::system::error_code> done;
      res.async_resolve(host_, std::to_string(port_),
                        [&](const boost::system::error_code& e, const tcp::resolver::results_type& r) {
                          done = e;
                          for (const auto& x : r) eps.push_back(x.endpoint());
                        });
      if (!run_until(d, done, [&] { res.cancel(); })) return fail(ec, error::timeout, "resolving " + host_);
      if (*done || eps.empty()) return fail(ec, error::peer_lost, "cannot resolve " + host_ + ": " + done->message());
    }
    auto backoff = std::chrono::milliseconds(5);
    for (;;) {
      std::optional<boost::system::error_code> done;
      sock_ = tcp::socket(ioc_);
      asio::async_connect(sock_, eps, [&](const boost::system::error_code& e, const tcp::endpoint&) { done = e; });
      if (!run_until(d, done, [&] { sock_.close(bec); })) return fail(ec, error::timeout, "connecting to " + address());
      if (!*done) break;
      const bool retry = *done == asio::error::connection_refused || *done == asio::error::timed_out ||
                         *done == asio::error::network_unreachable || *done == asio::error::host_unreachable;
      // The store may not be up yet (ranks can start before it): retry until the deadline.
      if (!retry || d.remaining() <= backoff)
        return fail(ec, error::peer_lost, "cannot connect to " + address() + ": " + done->message());
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
    }
    sock_.set_option(tcp::no_delay(true), bec);
    connected_ = true;
    // Handshake.
    // A refusal during the handshake ends the connection whatever its code:
    // the next call connects anew.
    auto r = read_frame(d, ec, false);
    if (ec) return;
    if (r.msg.code == proto::op::error) return server_error(ec, r.msg, true);
    if (r.msg.code != proto::op::challenge || r.msg.flag != proto::version)
      return fail(ec, error::bad_message,
                  std::string("handshake: expected challenge v") + std::to_string(proto::version) + ", got " +
                      proto::op_name(r.msg.code) + " v" + std::to_string(r.msg.flag));
    const std::string server_nonce(r.msg.nonce);
    const std::string client_nonce = random_bytes(proto::nonce_bytes);
    write_frame(proto::frame_builder(proto::op::auth, 80)
                    .u8(proto::version)
                    .raw(client_nonce)
                    .raw(handshake_mac(token_, client_label, server_nonce, client_nonce))
                    .finish(),
                d, ec);
    if (ec) return;
    r = read_frame(d, ec, false);
    if (ec) return;
    if (r.msg.code == proto::op::error) return server_error(ec, r.msg, true);
    if (r.msg.code != proto::op::welcome)
      return fail(ec, error::bad_message,
                  std::string("handshake: expected welcome, got ") + proto::op_name(r.msg.code));
    if (!mac_equal(r.msg.mac, handshake_mac(token_, server_label, server_nonce, client_nonce)))
      return fail(ec, error::unauthorized, "the server at " + address() + " could not prove the job token");
  }

  //! False, with `ec` and `last_detail` set, when a request frame is over
  //! the message limit: the server would reject it and drop the connection.
  //! The reason reads "of N bytes exceeds ..."; callers name the request before it.
  bool fits(std::size_t frame_bytes, std::error_code& ec) {
    if (frame_bytes - proto::header_bytes <= max_bytes_) return true;
    ec = make_error_code(error::bad_message);
    last_detail =
        "of " + std::to_string(frame_bytes) + " bytes exceeds max_message_bytes " + std::to_string(max_bytes_);
    return false;
  }

  //! Connects when not connected, then writes `frames` (one request or several).
  void send(const std::string& frames, deadline d, std::error_code& ec) {
    if (!connected_) {
      connect(d, ec);
      if (ec) return;
    }
    write_frame(frames, d, ec);
  }

  //! Reads one reply; an `error` reply from the server becomes `ec`.
  proto::decode_result receive(deadline d, std::error_code& ec) {
    auto r = read_frame(d, ec, false);
    if (!ec && r.msg.code == proto::op::error) server_error(ec, r.msg);
    return r;
  }

  void write_frame(const std::string& frame, deadline d, std::error_code& ec) {
    std::optional<boost::system::error_code> done;
    asio::async_write(sock_, asio::buffer(frame), [&](const boost::system::error_code& e, std::size_t) { done = e; });
    if (!run_until(d, done, [&] { sock_.cancel(); })) return fail(ec, error::timeout, "sending to " + address());
    if (*done) return fail(ec, error::peer_lost, "connection to " + address() + " lost: " + done->message());
  }

  //! Reads one frame. Views in the result point into this object until the
  //! next read. On timeout the connection is closed unless `keep_on_timeout`.
  proto::decode_result read_frame(deadline d, std::error_code& ec, bool keep_on_timeout) {
    for (;;) {
      if (in_.size() >= proto::header_bytes) {
        const std::uint32_t len = proto::load_u32(in_.data());
        if (auto why = proto::check_length(len, max_bytes_); !why.empty()) {
          fail(ec, error::bad_message, "reply from " + address() + ": " + why);
          return {};
        }
        if (in_.size() >= proto::header_bytes + len) {
          body_.assign(in_, proto::header_bytes, len);
          in_.erase(0, proto::header_bytes + len);
          auto r = proto::decode_body(body_);
          if (!r) fail(ec, error::bad_message, "reply from " + address() + ": " + r.reason);
          return r;
        }
      }
      std::optional<boost::system::error_code> done;
      std::size_t got = 0;
      sock_.async_read_some(asio::buffer(chunk_), [&](const boost::system::error_code& e, std::size_t n) {
        done = e;
        got = n;
      });
      if (!run_until(d, done, [&] { sock_.cancel(); })) {
        if (keep_on_timeout) {
          ec = make_error_code(error::timeout);
          last_detail = "no message from " + address() + " before the deadline";
        } else {
          fail(ec, error::timeout, "no reply from " + address() + " before the deadline");
        }
        return {};
      }
      if (*done) {
        fail(ec, error::peer_lost, "connection to " + address() + " lost: " + done->message());
        return {};
      }
      in_.append(chunk_.data(), got);
    }
  }

  //! Sets `ec` from an `error` frame. The server closes the connection after
  //! framing and authentication errors, and after any refusal of the
  //! handshake (`in_handshake`: too many connections, a bad token): so do we.
  void server_error(std::error_code& ec, const proto::message& m, bool in_handshake = false) {
    ec = proto::error_from_wire(m.flag);
    last_detail = std::string(m.value);
    if (in_handshake || (ec != errc::timeout && ec != errc::invalid_state)) close();
  }

  void fail(std::error_code& ec, error e, std::string why) {
    ec = make_error_code(e);
    last_detail = std::move(why);
    close();
  }

 private:
  template <class Cancel>
  bool run_until(deadline d, std::optional<boost::system::error_code>& done, Cancel cancel) {
    // run_until with time_point::max() would overflow inside Asio.
    const auto cap = steady_clock::now() + std::chrono::hours(24 * 365);
    ioc_.restart();
    ioc_.run_until(std::min(d.at(), cap));
    if (done) return true;
    cancel();
    ioc_.restart();
    ioc_.run();  // let the cancelled handler run
    return done && *done != asio::error::operation_aborted ? true : false;
  }

  using tcp = asio::ip::tcp;
  std::string host_;
  std::uint16_t port_;
  std::string token_;
  std::size_t max_bytes_;
  asio::io_context ioc_{1};
  tcp::socket sock_{ioc_};
  bool connected_ = false;
  std::string in_, body_;
  std::array<char, 16384> chunk_{};
};

// The server's wait for `d`, in whole milliseconds rounded up: rounded
// down, less than one left would be 0 (answer at once), and a caller that
// waits in slices would spin through that rest in round trips. The reply
// may come up to a millisecond after `d`, well within call()'s allowance.
inline std::uint32_t timeout_ms_until(deadline d) noexcept {
  if (d.at() == steady_clock::time_point::max()) return proto::no_timeout;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(d.remaining()).count();
  return static_cast<std::uint32_t>(std::min<std::int64_t>(ms, proto::no_timeout - 1));
}

inline std::string keys_frame(proto::op o, const std::vector<std::string>& keys, std::uint32_t timeout_ms,
                              bool with_timeout) {
  std::size_t n = 16;
  for (const auto& k : keys) n += k.size() + 4;
  proto::frame_builder b(o, n);
  if (with_timeout) b.u32(timeout_ms);
  b.u32(static_cast<std::uint32_t>(keys.size()));
  for (const auto& k : keys) b.str(k);
  return b.finish();
}

}  // namespace detail
}  // namespace elastic
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/elastic/detail/client_connection.hpp>
// #include <ebbflow/elastic/detail/store_protocol.hpp>  (inlined)
// #include <ebbflow/elastic/tcp_store.hpp>  (inlined)

#include <boost/asio/buffer.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

// Compiled into ebbflow::compiled in separate compilation (config.hpp).
#if EBBFLOW_HEADER_ONLY
EBBFLOW_BEGIN_NAMESPACE
namespace elastic {
// ------------------------------------------------------------------ options

EBBFLOW_DECL client_options client_options::from_environment() {
  client_options o;
  o.timeout = env::get_ms("EBBFLOW_STORE_TIMEOUT_MS", o.timeout, 1);
  return o;
}

// ------------------------------------------------------------------ store_watcher

EBBFLOW_DECL store_watcher::store_watcher(std::unique_ptr<detail::client_connection> c) : conn_(std::move(c)) {}
EBBFLOW_DECL store_watcher::store_watcher(store_watcher&&) noexcept = default;
EBBFLOW_DECL store_watcher& store_watcher::operator=(store_watcher&&) noexcept = default;
EBBFLOW_DECL store_watcher::~store_watcher() = default;

EBBFLOW_DECL store_event store_watcher::next(deadline d, std::error_code& ec) noexcept {
  ec.clear();
  if (!conn_ || !conn_->connected()) {
    ec = make_error_code(error::peer_lost);
    return {};
  }
  auto r = conn_->read_frame(d, ec, true);
  if (ec) return {};
  if (r.msg.code == detail::proto::op::error) {
    conn_->server_error(ec, r.msg);
    conn_->close();
    return {};
  }
  if (r.msg.code != detail::proto::op::event) {
    conn_->fail(ec, error::bad_message,
                std::string("watch: expected event, got ") + detail::proto::op_name(r.msg.code));
    return {};
  }
  store_event e;
  e.type = r.msg.flag == static_cast<std::uint8_t>(detail::proto::event_kind::erase) ? store_event::kind::erase
                                                                                     : store_event::kind::set;
  e.key = std::string(r.msg.key);
  e.value = std::string(r.msg.value);
  return e;
}

EBBFLOW_DECL store_event store_watcher::next(deadline d) {
  std::error_code ec;
  auto e = next(d, ec);
  if (ec) throw_if(ec, {-1, -1, -1, "store.watch", conn_ ? conn_->last_detail : std::string("moved-from watcher")});
  return e;
}

// ------------------------------------------------------------------ store_client

EBBFLOW_DECL store_client::store_client(std::string host, std::uint16_t port, std::string token, client_options opts)
    : host_(std::move(host)), port_(port), token_(std::move(token)), opts_(opts) {
  EBBFLOW_ENFORCE(!host_.empty(), "store_client: empty host");
  EBBFLOW_ENFORCE(port_ != 0, "store_client: port 0 (no store address given)");
  conn_ = std::make_unique<detail::client_connection>(host_, port_, token_, opts_.max_message_bytes);
}

EBBFLOW_DECL store_client store_client::from_environment() {
  const launch_info li = launch_info::from_environment();
  EBBFLOW_ENFORCE(li.store_port != 0,
                  "store_client::from_environment: EBBFLOW_STORE (HOST:PORT) or "
                  "MASTER_ADDR/MASTER_PORT is not set");
  return store_client(li.store_host, li.store_port, li.token, client_options::from_environment());
}

EBBFLOW_DECL store_client::store_client(store_client&&) noexcept = default;
EBBFLOW_DECL store_client& store_client::operator=(store_client&&) noexcept = default;
EBBFLOW_DECL store_client::~store_client() = default;

EBBFLOW_DECL detail::proto::decode_result store_client::call(std::string frame, deadline d, bool waits,
                                                       std::error_code& ec) noexcept {
  ec.clear();
  std::lock_guard lk(conn_->mu);
  conn_->last_detail.clear();
  if (!conn_->fits(frame.size(), ec)) {
    conn_->last_detail = "request " + conn_->last_detail;
    return {};
  }
  conn_->send(frame, d, ec);
  if (ec) return {};
  // A waiting request times out on the server, which names the missing keys;
  // allow its reply a little time to arrive before giving up locally.
  const deadline local =
      waits && d.at() != steady_clock::time_point::max() ? deadline(d.at() + std::chrono::milliseconds(250)) : d;
  auto r = conn_->receive(local, ec);
  if (ec) return {};
  return r;
}

EBBFLOW_DECL void store_client::raise(const char* operation, std::string_view key, std::error_code ec) const {
  std::string detail;
  if (!key.empty()) detail = "key " + detail::quote_key(key) + ", ";
  detail += "store " + host_ + ":" + std::to_string(port_);
  std::string why = last_error_detail();
  if (!why.empty()) detail += ": " + why;
  EBBFLOW_THROW((system_error(ec, {-1, -1, -1, operation, std::move(detail)})));
}

EBBFLOW_DECL std::string store_client::last_error_detail() const {
  std::lock_guard lk(conn_->mu);
  return conn_->last_detail;
}

EBBFLOW_DECL void store_client::close() noexcept {
  std::lock_guard lk(conn_->mu);
  conn_->close();
}

EBBFLOW_DECL void store_client::connect(deadline d, std::error_code& ec) noexcept {
  ec.clear();
  std::lock_guard lk(conn_->mu);
  conn_->last_detail.clear();
  conn_->connect(d, ec);
}
EBBFLOW_DECL void store_client::connect(deadline d) {
  std::error_code ec;
  connect(d, ec);
  if (ec) raise("store.connect", {}, ec);
}

namespace detail {
//! Checks the reply opcode; a mismatch is a protocol error.
EBBFLOW_DECL bool expect_reply(const proto::decode_result& r, proto::op want, std::error_code& ec, client_connection& c) {
  if (ec) return false;
  if (r.msg.code == want) return true;
  c.fail(ec, error::bad_message,
         std::string("expected reply ") + proto::op_name(want) + ", got " + proto::op_name(r.msg.code));
  return false;
}
//! The request frames of a non-waiting get and of an add, alone or pipelined.
EBBFLOW_DECL std::string try_get_frame(std::string_view key) {
  return proto::frame_builder(proto::op::get, key.size() + 16).str(key).u32(0).u8(0).finish();
}
EBBFLOW_DECL std::string add_frame(std::string_view key, std::int64_t delta) {
  return proto::frame_builder(proto::op::add, key.size() + 16).str(key).i64(delta).finish();
}
//! A get's reply into `out`: the value, or nullopt when the key is missing;
//! false (with `ec` set) on an error or any other reply.
EBBFLOW_DECL bool take_value(const proto::decode_result& r, std::optional<std::string>& out, std::error_code& ec,
                       client_connection& c) {
  out.reset();
  if (!ec && r.msg.code == proto::op::missing) return true;
  if (!expect_reply(r, proto::op::value, ec, c)) return false;
  out.emplace(r.msg.value);
  return true;
}
}  // namespace detail

// set
EBBFLOW_DECL void store_client::set(std::string_view key, std::string_view value, deadline d, std::error_code& ec) noexcept {
  auto r = call(
      detail::proto::frame_builder(detail::proto::op::set, key.size() + value.size() + 8).str(key).str(value).finish(),
      d, false, ec);
  detail::expect_reply(r, detail::proto::op::ok, ec, *conn_);
}
EBBFLOW_DECL void store_client::set(std::string_view key, std::string_view value, std::error_code& ec) noexcept {
  set(key, value, default_deadline(), ec);
}
EBBFLOW_DECL void store_client::set(std::string_view key, std::string_view value, deadline d) {
  std::error_code ec;
  set(key, value, d, ec);
  if (ec) raise("store.set", key, ec);
}
EBBFLOW_DECL void store_client::set(std::string_view key, std::string_view value) { set(key, value, default_deadline()); }

// get
EBBFLOW_DECL std::string store_client::get(std::string_view key, deadline d, std::error_code& ec) noexcept {
  auto r = call(detail::proto::frame_builder(detail::proto::op::get, key.size() + 16)
                    .str(key)
                    .u32(detail::timeout_ms_until(d))
                    .u8(1)
                    .finish(),
                d, true, ec);
  if (!detail::expect_reply(r, detail::proto::op::value, ec, *conn_)) return {};
  return std::string(r.msg.value);
}
EBBFLOW_DECL std::string store_client::get(std::string_view key, std::error_code& ec) noexcept {
  return get(key, default_deadline(), ec);
}
EBBFLOW_DECL std::string store_client::get(std::string_view key, deadline d) {
  std::error_code ec;
  auto v = get(key, d, ec);
  if (ec) raise("store.get", key, ec);
  return v;
}
EBBFLOW_DECL std::string store_client::get(std::string_view key) { return get(key, default_deadline()); }

// try_get
EBBFLOW_DECL std::optional<std::string> store_client::try_get(std::string_view key, deadline d,
                                                        std::error_code& ec) noexcept {
  auto r = call(detail::try_get_frame(key), d, false, ec);
  std::optional<std::string> v;
  detail::take_value(r, v, ec, *conn_);
  return v;
}
EBBFLOW_DECL std::optional<std::string> store_client::try_get(std::string_view key, std::error_code& ec) noexcept {
  return try_get(key, default_deadline(), ec);
}
EBBFLOW_DECL std::optional<std::string> store_client::try_get(std::string_view key, deadline d) {
  std::error_code ec;
  auto v = try_get(key, d, ec);
  if (ec) raise("store.try_get", key, ec);
  return v;
}
EBBFLOW_DECL std::optional<std::string> store_client::try_get(std::string_view key) {
  return try_get(key, default_deadline());
}

// add
EBBFLOW_DECL std::int64_t store_client::add(std::string_view key, std::int64_t delta, deadline d,
                                      std::error_code& ec) noexcept {
  auto r = call(detail::add_frame(key, delta), d, false, ec);
  if (!detail::expect_reply(r, detail::proto::op::integer, ec, *conn_)) return 0;
  return r.msg.integer;
}
EBBFLOW_DECL std::int64_t store_client::add(std::string_view key, std::int64_t delta, std::error_code& ec) noexcept {
  return add(key, delta, default_deadline(), ec);
}
EBBFLOW_DECL std::int64_t store_client::add(std::string_view key, std::int64_t delta, deadline d) {
  std::error_code ec;
  auto v = add(key, delta, d, ec);
  if (ec) raise("store.add", key, ec);
  return v;
}
EBBFLOW_DECL std::int64_t store_client::add(std::string_view key, std::int64_t delta) {
  return add(key, delta, default_deadline());
}

// pipelined: requests for `keys` leave in batches and the replies come back
// in order (the server answers the frames of one connection in turn).
// `frame(i)` builds request i; `reply(i, r)` takes its reply and returns
// false (with `ec` set) when it is not what was asked for.
template <class Frame, class Reply>
void store_client::pipelined(const char* what, std::span<const std::string> keys, Frame&& frame, Reply&& reply,
                             deadline d, std::error_code& ec) {
  ec.clear();
  // Batches small enough for the server's output budget and the socket buffers.
  constexpr std::size_t batch = 64;
  std::lock_guard lk(conn_->mu);
  conn_->last_detail.clear();
  for (std::size_t first = 0; first < keys.size(); first += batch) {
    const std::size_t last = std::min(keys.size(), first + batch);
    std::string frames;
    for (std::size_t i = first; i < last; ++i) {
      std::string f = frame(i);
      if (!conn_->fits(f.size(), ec)) {
        conn_->last_detail =
            std::string(what) + ": request for key " + detail::quote_key(keys[i]) + " " + conn_->last_detail;
        return;
      }
      frames += f;
    }
    conn_->send(frames, d, ec);
    if (ec) return;
    for (std::size_t i = first; i < last; ++i) {
      auto r = conn_->receive(d, ec);
      if (ec || !reply(i, r)) {
        conn_->last_detail = std::string(what) + ": reply " + std::to_string(i + 1) + " of " +
                             std::to_string(keys.size()) + " (key " + detail::quote_key(keys[i]) +
                             "): " + conn_->last_detail;
        // Replies to the rest of this batch may still be in flight: the
        // connection cannot be reused in step with its requests.
        conn_->close();
        return;
      }
    }
  }
}

// add_many: pipelined adds
EBBFLOW_DECL std::vector<std::int64_t> store_client::add_many(std::span<const std::string> keys,
                                                        std::span<const std::int64_t> deltas, deadline d,
                                                        std::error_code& ec) {
  if (keys.size() != deltas.size())
    throw std::invalid_argument("store.add_many: " + std::to_string(keys.size()) + " keys but " +
                                std::to_string(deltas.size()) + " deltas");
  std::vector<std::int64_t> out;
  out.reserve(keys.size());
  pipelined(
      "add_many", keys, [&](std::size_t i) { return detail::add_frame(keys[i], deltas[i]); },
      [&](std::size_t, const detail::proto::decode_result& r) {
        if (!detail::expect_reply(r, detail::proto::op::integer, ec, *conn_)) return false;
        out.push_back(r.msg.integer);
        return true;
      },
      d, ec);
  return out;
}
EBBFLOW_DECL std::vector<std::int64_t> store_client::add_many(std::span<const std::string> keys,
                                                        std::span<const std::int64_t> deltas, deadline d) {
  std::error_code ec;
  auto v = add_many(keys, deltas, d, ec);
  if (ec) raise("store.add_many", {}, ec);
  return v;
}

// try_get_many: pipelined try_get
EBBFLOW_DECL std::vector<std::optional<std::string>> store_client::try_get_many(std::span<const std::string> keys, deadline d,
                                                                          std::error_code& ec) {
  std::vector<std::optional<std::string>> out;
  out.reserve(keys.size());
  pipelined(
      "try_get_many", keys, [&](std::size_t i) { return detail::try_get_frame(keys[i]); },
      [&](std::size_t, const detail::proto::decode_result& r) {
        std::optional<std::string> v;
        if (!detail::take_value(r, v, ec, *conn_)) return false;
        out.push_back(std::move(v));
        return true;
      },
      d, ec);
  return out;
}
EBBFLOW_DECL std::vector<std::optional<std::string>> store_client::try_get_many(std::span<const std::string> keys,
                                                                          deadline d) {
  std::error_code ec;
  auto v = try_get_many(keys, d, ec);
  if (ec) raise("store.try_get_many", {}, ec);
  return v;
}

// compare_set
EBBFLOW_DECL compare_set_result store_client::compare_set(std::string_view key, std::string_view expected,
                                                    std::string_view desired, deadline d,
                                                    std::error_code& ec) noexcept {
  auto r = call(
      detail::proto::frame_builder(detail::proto::op::compare_set, key.size() + expected.size() + desired.size() + 16)
          .str(key)
          .str(expected)
          .str(desired)
          .finish(),
      d, false, ec);
  if (!detail::expect_reply(r, detail::proto::op::cas_result, ec, *conn_)) return {};
  return {r.msg.flag != 0, std::string(r.msg.value)};
}
EBBFLOW_DECL compare_set_result store_client::compare_set(std::string_view key, std::string_view expected,
                                                    std::string_view desired, std::error_code& ec) noexcept {
  return compare_set(key, expected, desired, default_deadline(), ec);
}
EBBFLOW_DECL compare_set_result store_client::compare_set(std::string_view key, std::string_view expected,
                                                    std::string_view desired, deadline d) {
  std::error_code ec;
  auto v = compare_set(key, expected, desired, d, ec);
  if (ec) raise("store.compare_set", key, ec);
  return v;
}
EBBFLOW_DECL compare_set_result store_client::compare_set(std::string_view key, std::string_view expected,
                                                    std::string_view desired) {
  return compare_set(key, expected, desired, default_deadline());
}

// wait
EBBFLOW_DECL void store_client::wait(const std::vector<std::string>& keys, deadline d, std::error_code& ec) noexcept {
  auto r = call(detail::keys_frame(detail::proto::op::wait, keys, detail::timeout_ms_until(d), true), d, true, ec);
  detail::expect_reply(r, detail::proto::op::ok, ec, *conn_);
}
EBBFLOW_DECL void store_client::wait(const std::vector<std::string>& keys, deadline d) {
  std::error_code ec;
  wait(keys, d, ec);
  if (ec) raise("store.wait", keys.size() == 1 ? std::string_view(keys[0]) : std::string_view{}, ec);
}

// wait_any
EBBFLOW_DECL std::size_t store_client::wait_any(const std::vector<std::string>& keys, deadline d,
                                          std::error_code& ec) noexcept {
  auto r = call(detail::keys_frame(detail::proto::op::wait_any, keys, detail::timeout_ms_until(d), true), d, true, ec);
  if (!detail::expect_reply(r, detail::proto::op::integer, ec, *conn_)) return 0;
  if (r.msg.integer < 0 || static_cast<std::uint64_t>(r.msg.integer) >= keys.size()) {
    ec = make_error_code(error::bad_message);
    return 0;
  }
  return static_cast<std::size_t>(r.msg.integer);
}
EBBFLOW_DECL std::size_t store_client::wait_any(const std::vector<std::string>& keys, deadline d) {
  if (keys.empty()) throw std::invalid_argument("store.wait_any: no keys to wait for");
  std::error_code ec;
  auto i = wait_any(keys, d, ec);
  if (ec) raise("store.wait_any", keys.size() == 1 ? std::string_view(keys[0]) : std::string_view{}, ec);
  return i;
}

// check
EBBFLOW_DECL bool store_client::check(const std::vector<std::string>& keys, std::error_code& ec) noexcept {
  auto r = call(detail::keys_frame(detail::proto::op::check, keys, 0, false), default_deadline(), false, ec);
  if (!detail::expect_reply(r, detail::proto::op::boolean, ec, *conn_)) return false;
  return r.msg.flag != 0;
}
EBBFLOW_DECL bool store_client::check(const std::vector<std::string>& keys) {
  std::error_code ec;
  auto v = check(keys, ec);
  if (ec) raise("store.check", {}, ec);
  return v;
}

// erase
EBBFLOW_DECL bool store_client::erase(std::string_view key, std::error_code& ec) noexcept {
  auto r = call(detail::proto::frame_builder(detail::proto::op::erase, key.size() + 8).str(key).finish(),
                default_deadline(), false, ec);
  if (!detail::expect_reply(r, detail::proto::op::boolean, ec, *conn_)) return false;
  return r.msg.flag != 0;
}
EBBFLOW_DECL bool store_client::erase(std::string_view key) {
  std::error_code ec;
  auto v = erase(key, ec);
  if (ec) raise("store.erase", key, ec);
  return v;
}

// num_keys
EBBFLOW_DECL std::int64_t store_client::num_keys(std::error_code& ec) noexcept {
  auto r = call(detail::proto::frame_builder(detail::proto::op::num_keys).finish(), default_deadline(), false, ec);
  if (!detail::expect_reply(r, detail::proto::op::integer, ec, *conn_)) return 0;
  return r.msg.integer;
}
EBBFLOW_DECL std::int64_t store_client::num_keys() {
  std::error_code ec;
  auto v = num_keys(ec);
  if (ec) raise("store.num_keys", {}, ec);
  return v;
}

// ping
EBBFLOW_DECL void store_client::ping(deadline d, std::error_code& ec) noexcept {
  auto r = call(detail::proto::frame_builder(detail::proto::op::ping).finish(), d, false, ec);
  detail::expect_reply(r, detail::proto::op::ok, ec, *conn_);
}
EBBFLOW_DECL void store_client::ping(deadline d) {
  std::error_code ec;
  ping(d, ec);
  if (ec) raise("store.ping", {}, ec);
}

// watch
EBBFLOW_DECL store_watcher store_client::watch(std::string_view prefix, bool include_existing, deadline d,
                                         std::error_code& ec) noexcept {
  ec.clear();
  auto c = std::make_unique<detail::client_connection>(host_, port_, token_, opts_.max_message_bytes);
  c->send(detail::proto::frame_builder(detail::proto::op::watch, prefix.size() + 8)
              .str(prefix)
              .u8(include_existing ? 1 : 0)
              .finish(),
          d, ec);
  if (!ec) detail::expect_reply(c->receive(d, ec), detail::proto::op::ok, ec, *c);
  if (ec) {
    std::lock_guard lk(conn_->mu);
    conn_->last_detail = c->last_detail;
    c->close();
  }
  return store_watcher(std::move(c));
}
EBBFLOW_DECL store_watcher store_client::watch(std::string_view prefix, bool include_existing, deadline d) {
  std::error_code ec;
  auto w = watch(prefix, include_existing, d, ec);
  if (ec) raise("store.watch", prefix, ec);
  return w;
}

}  // namespace elastic
EBBFLOW_END_NAMESPACE
#endif  // EBBFLOW_HEADER_ONLY
// ---- end <ebbflow/elastic/impl/store_client.hpp>

#if !EBBFLOW_HEADER_ONLY
// The library instantiates the work stealing the group does on this store.
// #include <ebbflow/plan/work_stealing.hpp>  (inlined)
EBBFLOW_BEGIN_NAMESPACE
extern template class plan::work_stealer<elastic::store_client>;
EBBFLOW_END_NAMESPACE
#endif
#endif  // EBBFLOW_HAS_ASIO
// ==== end <ebbflow/elastic/tcp_store.hpp>

// ==== begin <ebbflow/elastic/ucx_network.hpp> =============================
#if EBBFLOW_HAS_UCX
// SPDX-License-Identifier: Apache-2.0
//! @file ucx_network.hpp
//! `ucx_network`: the elastic group's `network` over UCX. One UCX worker
//! (one address) serves the whole job; each generation builds its transport
//! on it, reusing the endpoints between members that stay, and the
//! generation bits of every wire tag keep late messages of an older
//! generation from matching. Requires the `ebbflow::ucx` component.
//!
//! Thread safety: used by the group's training thread, except
//! `start_connect`, which the group's admission helper may call while the
//! training thread uses the current generation (`concurrent_connect()`).


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/comm/ucx/handles.hpp>  (inlined)
// #include <ebbflow/comm/ucx/transport.hpp>  (inlined)
// #include <ebbflow/core/error.hpp>  (inlined)
// #include <ebbflow/elastic/kv_store.hpp>  (inlined)

#include <memory>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

//! The elastic group's `network` over UCX: one context and one worker for
//! the whole job, a `comm::ucx::transport` per generation. `start_connect`
//! may be called from a helper thread when `concurrent_connect()`; nothing
//! else is thread-safe.
class ucx_network {
 public:
  using transport_type = comm::ucx::transport;  //!< what `connect` builds per generation

  //! Creates the process's UCP context and its one worker (UCX reads its
  //! configuration from the environment; see docs/comm.md for the defaults
  //! ebbflow sets). @throws system_error when UCX cannot initialise.
  ucx_network();
  //! Shares an existing context.
  explicit ucx_network(std::shared_ptr<comm::ucx::context> ctx);

  //! Whether `start_connect` may run on another thread while the current
  //! generation trains on the same worker (UCX built with thread support).
  [[nodiscard]] bool concurrent_connect() const noexcept { return worker_->multi_threaded(); }

  //! One worker serves every generation, so its address never changes: the
  //! group publishes it once, and a membership change only builds endpoints.
  [[nodiscard]] static constexpr bool stable_address() noexcept { return true; }

  //! This process's worker address (the same for every generation).
  bytes prepare(std::int64_t) const { return bytes(worker_->address().begin(), worker_->address().end()); }

  //! Connects to every member of generation `g` (addresses in rank order) on
  //! the shared worker. Blocks until every endpoint is wired up or `d` passes.
  //! @throws system_error (peer_lost / timeout naming the peer), std::invalid_argument.
  transport_type connect(std::int64_t g, int rank, const std::vector<bytes>& addresses, deadline d) {
    return transport_type(worker_, g, rank, static_cast<int>(addresses.size()), addresses, d);
  }
  //! As `connect`, without blocking: the endpoints wire up while the current
  //! generation keeps training on the same worker (see
  //! `comm::ucx::transport::start`); the group finishes it at the switch.
  transport_type start_connect(std::int64_t g, int rank, const std::vector<bytes>& addresses) {
    return transport_type::start(worker_, g, rank, static_cast<int>(addresses.size()), addresses);
  }
  //! After a failure: the next generation opens new endpoints rather than
  //! reuse those of the failed one, which may carry its abandoned traffic
  //! (a membership change without failure reuses the endpoints between the
  //! members that stay; see `comm::ucx::endpoint_pool`).
  void discard_endpoints() noexcept { worker_->endpoints().retire(); }

 private:
  std::shared_ptr<comm::ucx::worker> worker_;
};

}  // namespace elastic
EBBFLOW_END_NAMESPACE

// #include <ebbflow/elastic/impl/ucx_network.hpp>  (inlined here)
// ---- begin <ebbflow/elastic/impl/ucx_network.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file impl/ucx_network.hpp
//! Definitions of elastic/ucx_network.hpp.


// #include <ebbflow/elastic/ucx_network.hpp>  (inlined)

// Compiled into ebbflow::compiled in separate compilation (config.hpp).
#if EBBFLOW_HEADER_ONLY
EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

EBBFLOW_DECL ucx_network::ucx_network() : ucx_network(comm::ucx::context::create()) {}

EBBFLOW_DECL ucx_network::ucx_network(std::shared_ptr<comm::ucx::context> ctx) {
  EBBFLOW_ENFORCE(ctx != nullptr, "ucx_network: null UCX context");
  // Multi-threaded, so the group can build the next generation's endpoints
  // on a helper thread while training progresses the worker.
  worker_ = std::make_shared<comm::ucx::worker>(std::move(ctx), UCS_THREAD_MODE_MULTI);
}

}  // namespace elastic
EBBFLOW_END_NAMESPACE
#endif  // EBBFLOW_HEADER_ONLY
// ---- end <ebbflow/elastic/impl/ucx_network.hpp>
#endif  // EBBFLOW_HAS_UCX
// ==== end <ebbflow/elastic/ucx_network.hpp>

// ==== begin <ebbflow/elastic/group.hpp> ===================================
// SPDX-License-Identifier: Apache-2.0
//! @file group.hpp
//! The elastic group: data-parallel training whose workers join, leave and
//! fail while training goes on, with no restart and no lost or repeated
//! sample.
//!
//! A training loop joins the job and trains like this (docs/elastic.md
//! explains each line; docs/snippets/training_loop.cpp is the whole program,
//! which the tests build and run):
//! <!-- snippet: docs/snippets/training_loop.cpp#join -->
//! @code
//!   el::leave_on_signal(SIGTERM);                                    // SIGTERM: leave at the next step boundary
//!   el::group_options opts = el::group_options::from_environment();  // EBBFLOW_* settings (docs/elastic.md)
//!   opts.global_batch = 128;                                         // required: B, samples per step
//!   opts.dataset_size = dataset_size;                                // required: N, samples per epoch
//!   el::ucx_network net;
//!   el::group g([] { return std::make_unique<el::store_client>(el::store_client::from_environment()); }, net, opts,
//!               ef::launch_info::from_environment(), std::make_unique<el::planner_policy>());
//!   g.register_state("params", std::as_writable_bytes(std::span(params)));      // what must be equal on every
//!   g.register_state("velocity", std::as_writable_bytes(std::span(velocity)));  // member: model and optimizer
//! @endcode
//! <!-- snippet: docs/snippets/training_loop.cpp#loop -->
//! @code
//!   while (g.keep_training(steps)) {
//!     const el::step_info s = g.begin_step();  // my slice: positions [s.cursor + s.offset, + s.batch) of epoch s.epoch
//!     const auto t0 = std::chrono::steady_clock::now();
//!     compute_gradients(s, params, grads);
//!     const std::chrono::duration<double> compute = std::chrono::steady_clock::now() - t0;
//!     if (!g.allreduce(grads)) continue;  // a member failed: the step was rolled back; redo it
//!     sgd_step(params, velocity, grads);
//!     g.end_step(compute.count());  // commit; joins, leaves and re-plans take effect here
//!   }
//! @endcode
//! `keep_training` ends the loop once `total_steps` steps are committed and
//! no membership change is unfinished, and then marks the job finished
//! (`finish`); a loop that ends otherwise calls `finish` itself.
//!
//! Guarantees (docs/elastic.md gives the protocol and the argument for each):
//! * Every member applies the same update every step: the gradient of the
//!   step's global batch, each sample of an epoch used exactly once across
//!   joins, leaves and failures, so the parameters equal a single-process
//!   run over the same global batches.
//! * A failure (a peer's death or hang) makes a collective return false on
//!   every survivor: the step was rolled back (no update applied, the cursor
//!   did not advance) and the group re-formed; the caller redoes it.
//! * Joins and leaves take effect at step boundaries; newcomers connect in
//!   the background while the members train, and receive the committed state
//!   from the members holding it.
//! * Every wait has a deadline (group_options); what the group cannot
//!   recover from throws `group_error` naming the rank, generation and cause.
//!
//! Thread safety: one thread drives a group; `request_leave` may be called
//! from any thread or a signal handler (through `leave_on_signal`).


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/env.hpp>  (inlined)    // launch_info
// #include <ebbflow/core/error.hpp>  (inlined)  // system_error
// #include <ebbflow/elastic/detail/group_impl.hpp>  (inlined here)
// ---- begin <ebbflow/elastic/detail/group_impl.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file detail/group_impl.hpp
//! The state of an elastic group and the operations on it, behind the public
//! `elastic::group` (elastic/group.hpp, the contract). One class, because
//! every part works on the same generation; its definitions are split by
//! concern, one file each, under elastic/impl/group/:
//!
//! | file                  | owns                                                           |
//! |-----------------------|----------------------------------------------------------------|
//! | lifecycle.hpp         | construction, the end of a member, registered state, finish,   |
//! |                       | keep_training                                                  |
//! | formation.hpp         | generation 0 and waiting to be admitted as a newcomer          |
//! | generation.hpp        | entering a generation: addresses, wire-up, install, leaving    |
//! | step.hpp              | the user's step: begin, collectives, work stealing, commit     |
//! | join_tickets.hpp      | the coordinator's queue of newcomers and their cool-downs      |
//! | membership_change.hpp | joins and leaves decided at a step boundary, connected in the  |
//! |                       | background by the admission helper thread                      |
//! | state_transfer.hpp    | streaming the committed state to members that lack it          |
//! | recovery.hpp          | re-forming the group after a failure                           |
//! | heartbeat.hpp         | the heartbeat thread: leases, exit reports, aborts, stalls     |
//!
//! Threads: the training thread (the user's, calling the group) owns
//! everything not marked otherwise. The heartbeat thread touches only the
//! `hb_*` members (under `hb_mutex_` or atomic), the atomics it shares with
//! the training thread, and its own store client. The admission helper
//! thread touches only what `start_admission` hands it and its
//! `admission_result`. The protocol is described in docs/elastic.md.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/comm/communicator.hpp>  (inlined)
// #include <ebbflow/comm/revocable.hpp>  (inlined)
// #include <ebbflow/comm/transport.hpp>  (inlined)
// #include <ebbflow/core/deadline.hpp>  (inlined)
// #include <ebbflow/core/env.hpp>  (inlined)
// #include <ebbflow/core/error.hpp>  (inlined)
// #include <ebbflow/core/log.hpp>  (inlined)
// #include <ebbflow/elastic/detail/progress.hpp>  (inlined here)
// ---- begin <ebbflow/elastic/detail/progress.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file progress.hpp
//! Where a member's training thread is, as one store counter: the stall
//! warning's heartbeat publishes it and the waiting members read it.


// #include <ebbflow/config.hpp>  (inlined)

#include <algorithm>
#include <cstdint>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

/// Step, generation and the number of the collective within the step, packed
/// as `step * 2^24 + generation * 2^8 + collective` so that a member behind
/// another reads a lower counter. The generation saturates at 2^16 - 1 and
/// the collective at 255 and the step at 2^39 - 1; a negative step reads
/// as 0. Collective 0 is the
/// control exchange after step `step - 1` (it runs after the commit).
struct progress {
  static constexpr std::int64_t max_generation = 0xffff;
  static constexpr int max_collective = 0xff;
  static constexpr std::int64_t max_step = (std::int64_t{1} << 39) - 1;

  std::int64_t step = 0;
  std::int64_t generation = 0;
  int collective = 0;

  /// The generation as the counter holds it (saturated).
  [[nodiscard]] static constexpr std::int64_t stored_generation(std::int64_t g) noexcept {
    return std::clamp<std::int64_t>(g, 0, max_generation);
  }

  [[nodiscard]] constexpr std::int64_t encode() const noexcept {
    return (std::clamp<std::int64_t>(step, 0, max_step) << 24) + (stored_generation(generation) << 8) +
           std::clamp(collective, 0, max_collective);
  }

  [[nodiscard]] static constexpr progress decode(std::int64_t word) noexcept {
    return {word >> 24, (word >> 8) & max_generation, static_cast<int>(word & max_collective)};
  }
};

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/elastic/detail/progress.hpp>
// #include <ebbflow/elastic/detail/records.hpp>  (inlined here)
// ---- begin <ebbflow/elastic/detail/records.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file detail/records.hpp
//! The values the elastic group keeps in the store, and their formats: the
//! record of a generation (binary, `generation_record`), join tickets and a
//! worker's join failures (text), and integers (decimal text). Owned by no
//! one part of the group: every part that reads or writes these keys uses
//! these types, so a format lives in one place.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/error.hpp>  (inlined)
// #include <ebbflow/elastic/detail/wire.hpp>  (inlined here)
// ---- begin <ebbflow/elastic/detail/wire.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file wire.hpp
//! Little-endian byte writer/reader for the elastic group's records. The
//! reader checks every length, so a truncated or corrupted record becomes
//! `errc::bad_message`, never an out-of-bounds read.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/error.hpp>  (inlined)

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

class writer {
 public:
  template <class T>
  requires std::is_trivially_copyable_v<T> writer& put(const T& v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    out_.insert(out_.end(), p, p + sizeof v);
    return *this;
  }
  writer& put_bytes(std::span<const std::byte> b) {
    put<std::uint64_t>(b.size());
    out_.insert(out_.end(), b.begin(), b.end());
    return *this;
  }
  [[nodiscard]] std::vector<std::byte> take() { return std::move(out_); }

 private:
  std::vector<std::byte> out_;
};

class reader {
 public:
  reader(std::span<const std::byte> in, const char* what) : in_(in), what_(what) {}
  template <class T>
  requires std::is_trivially_copyable_v<T> T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, in_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  std::vector<std::byte> get_bytes() {
    const auto n = get<std::uint64_t>();
    need(n);
    std::vector<std::byte> b(in_.begin() + static_cast<std::ptrdiff_t>(pos_),
                             in_.begin() + static_cast<std::ptrdiff_t>(pos_ + n));
    pos_ += n;
    return b;
  }
  //! Elements of a length-prefixed array, bounded by what is left.
  std::uint64_t get_count(std::size_t elem_size) {
    const auto n = get<std::uint64_t>();
    if (elem_size && n > (in_.size() - pos_) / elem_size) fail();
    return n;
  }
  void expect_end() const {
    if (pos_ != in_.size()) fail();
  }

 private:
  void need(std::uint64_t n) const {
    if (n > in_.size() - pos_) fail();
  }
  [[noreturn]] void fail() const {
    throw system_error(
        make_error_code(error::bad_message),
        {.operation = "decode", .detail = std::string(what_) + " of " + std::to_string(in_.size()) + " bytes"});
  }
  std::span<const std::byte> in_;
  std::size_t pos_ = 0;
  const char* what_;
};

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/elastic/detail/wire.hpp>
// #include <ebbflow/elastic/group_types.hpp>  (inlined here)
// ---- begin <ebbflow/elastic/group_types.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file group_types.hpp
//! What the elastic group hands a training loop: this member's share of a
//! step (`step_info`), a membership change (`world_change`, `change_reason`),
//! and the settings of in-step work stealing (`steal_settings`).


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/enum_names.hpp>  (inlined)
// #include <ebbflow/plan/work_stealing.hpp>  (inlined)  // plan::steal_options

#include <cstddef>
#include <cstdint>
#include <string_view>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

//! What this member does in the current step.
struct step_info {
  std::int64_t step = 0;           //!< committed steps so far (this step's number)
  std::int64_t epoch = 0;          //!< epoch of this step
  std::size_t cursor = 0;          //!< position in the epoch's sample order where this step's global batch starts
  std::size_t global_batch = 0;    //!< B_t (B, or less for an epoch's short last batch)
  std::size_t offset = 0;          //!< start of this member's slice inside the global batch
  std::size_t batch = 0;           //!< b_i, this member's slice length (may be 0)
  double weight = 0;               //!< b_i / B_t: scale of this member's mean-loss gradient
  int rank = 0;                    //!< rank in the current generation
  int world_size = 1;              //!< members in the current generation
  std::int64_t generation = 0;     //!< current generation
  std::uint64_t plan_version = 0;  //!< identifies the plan (same on every member)
};

//! Settings of `group::steal_step`.
struct steal_settings {
  plan::steal_options chunks{};       //!< chunk sizes (and the deadline of each claim)
  double claim_seconds = 60e-6;       //!< one store round trip (what a claim costs a thief)
  double chunk_overhead_seconds = 0;  //!< this member's cost of processing one more chunk
};

//! Why the membership changed (passed to world-changed callbacks).
enum class change_reason : std::uint8_t { initial, join, leave, failure };

namespace detail {
inline constexpr auto change_reason_names =
    make_enum_names(change_reason::initial, "initial", "join", "leave", "failure");
static_assert(change_reason_names.last() == change_reason::failure);
}  // namespace detail

//! The reason as a lower-case word ("initial", "join", "leave", "failure"), for logs.
constexpr std::string_view name(change_reason r) noexcept { return detail::change_reason_names(r); }

//! A membership change as seen by callbacks and the event log.
struct world_change {
  std::int64_t generation = 0;                    //!< the generation that the change created
  change_reason reason = change_reason::initial;  //!< why it changed
  int old_size = 0;                               //!< members before the change (0 for the initial formation)
  int new_size = 0;                               //!< members after the change
  int rank = 0;                                   //!< this member's new rank
  std::int64_t step = 0;                          //!< committed step at which the change took effect
  double stall_seconds = 0;                       //!< time from the change's start to this member being ready again
};

}  // namespace elastic
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/elastic/group_types.hpp>
// #include <ebbflow/elastic/kv_store.hpp>  (inlined)         // bytes
// #include <ebbflow/elastic/planning_policy.hpp>  (inlined here)
// ---- begin <ebbflow/elastic/planning_policy.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file planning_policy.hpp
//! How the elastic group sizes each member's share of the global batch.
//! The coordinator asks its policy for a plan; every member feeds its policy
//! the same observations (the per-step control exchange carries every
//! member's batch and compute time), so a newly elected coordinator plans
//! from the same history. Plans are for the full global batch; a short last
//! batch of an epoch is split with `scale_plan`.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/error.hpp>  (inlined)

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

//! Identifies a worker for the whole job (assigned by the store; never reused).
using member_id = std::int64_t;

//! Decides the members' batch sizes. Called only from the group's training
//! thread (need not be thread-safe); exceptions propagate out of the group
//! call that asked for the plan.
class planning_policy {
 public:
  virtual ~planning_policy() = default;
  //! One measured step of `member`: `batch` samples took `seconds` of compute.
  virtual void observe(member_id member, std::size_t batch, double seconds) = 0;
  //! Batch sizes (rank order of `members`) that sum to `global_batch`.
  virtual std::vector<std::size_t> plan(std::span<const member_id> members, std::size_t global_batch) = 0;
  //! What the policy knows of a member's speed: seconds per step and per
  //! sample (the inputs of its plan). Paces in-step work stealing.
  struct member_model {
    double fixed_seconds = 0;       //!< a_i
    double seconds_per_sample = 0;  //!< c_i (> 0 when known)
  };
  //! The models of `members` (rank order), or empty when the policy has
  //! none for them yet (then `group::steal_step` steals unpaced).
  [[nodiscard]] virtual std::vector<member_model> models(std::span<const member_id> members) const {
    (void)members;
    return {};
  }
  //! Whether `current` should be replaced (checked by the coordinator each step).
  virtual bool should_replan(std::span<const member_id> members, std::span<const std::size_t> current,
                             std::size_t global_batch) {
    (void)members, (void)current, (void)global_batch;
    return false;
  }
};

//! Equal shares (the remainder goes to the lowest ranks). The default when no
//! planner is given; ignores timings.
class uniform_policy final : public planning_policy {
 public:
  void observe(member_id, std::size_t, double) override {}
  std::vector<std::size_t> plan(std::span<const member_id> members, std::size_t global_batch) override {
    EBBFLOW_ENFORCE(!members.empty(), "uniform_policy: empty membership");
    const std::size_t n = members.size();
    std::vector<std::size_t> b(n, global_batch / n);
    for (std::size_t i = 0; i < global_batch % n; ++i) ++b[i];
    return b;
  }
};

//! Splits `total` (≤ the plan's sum) in proportion to `plan`, deterministically:
//! floor shares, then the remainder to the largest fractional parts (ties to
//! the lower rank). Every rank computes the same result.
inline std::vector<std::size_t> scale_plan(std::span<const std::size_t> plan, std::size_t total) {
  const std::size_t sum = std::accumulate(plan.begin(), plan.end(), std::size_t{0});
  std::vector<std::size_t> out(plan.size(), 0);
  if (sum == total) {
    out.assign(plan.begin(), plan.end());
    return out;
  }
  if (sum == 0 || total == 0) {
    for (std::size_t i = 0; i < total; ++i) ++out[i % out.size()];
    return out;
  }
  std::vector<std::pair<std::size_t, std::size_t>> rem;  // (remainder numerator, rank)
  std::size_t given = 0;
  for (std::size_t i = 0; i < plan.size(); ++i) {
    __extension__ using u128 = unsigned __int128;
    const u128 num = static_cast<u128>(plan[i]) * total;
    out[i] = static_cast<std::size_t>(num / sum);
    rem.emplace_back(static_cast<std::size_t>(num % sum), i);
    given += out[i];
  }
  std::stable_sort(rem.begin(), rem.end(), [](auto& a, auto& b) { return a.first > b.first; });
  for (std::size_t k = 0; given < total; ++k, ++given) ++out[rem[k].second];
  return out;
}

}  // namespace elastic
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/elastic/planning_policy.hpp>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

// Integers the group stores as decimal text; anything else is a corrupt store.
inline std::int64_t parse_i64(const std::string& v) {
  std::int64_t x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc{} || p != v.data() + v.size())
    throw system_error(
        make_error_code(error::bad_message),
        {.operation = "elastic group", .detail = "store value '" + v.substr(0, 32) + "' is not an integer"});
  return x;
}

// Appends `item` to a list for a message: "1", then "1, 4".
inline void append_listed(std::string& list, const std::string& item) {
  if (!list.empty()) list += ", ";
  list += item;
}

// A member of a generation and the newest step it committed.
struct member_entry {
  member_id id = -1;
  std::int64_t committed = -1;  // newest committed step the member holds; -1: no state
};
// What a member with no step reports to a recovery when its buffers still
// hold its own launch-time initial state (never in a generation record).
inline constexpr std::int64_t own_initial_state = -2;

// The record of generation g under `<prefix>/gen/<g>`, written once
// (compare-and-set) by whoever forms it: its members in rank order, which
// member holds the newest committed state, the plan, and how many join
// tickets were handled. Binary, versioned by its magic number.
struct generation_record {
  std::int64_t generation = 0;
  change_reason reason = change_reason::initial;
  std::vector<member_entry> members;
  member_id source = -1;  // holds the newest committed state
  std::int64_t source_step = 0;
  std::vector<std::uint64_t> plan;  // full-B plan, rank order
  std::uint64_t plan_version = 0;
  std::int64_t joins_seen = 0;  // join tickets handled so far

  [[nodiscard]] bytes encode() const {
    writer w;
    w.put<std::uint32_t>(0xEBBF1001u).put(generation).put(static_cast<std::uint8_t>(reason));
    w.put<std::uint64_t>(members.size());
    for (auto& m : members) w.put(m.id).put(m.committed);
    w.put(source).put(source_step).put<std::uint64_t>(plan.size());
    for (auto b : plan) w.put(b);
    w.put(plan_version).put(joins_seen);
    return w.take();
  }
  static generation_record decode(std::span<const std::byte> in) {
    reader r(in, "generation record");
    generation_record g;
    if (r.get<std::uint32_t>() != 0xEBBF1001u)
      throw system_error(make_error_code(error::bad_message),
                         {.operation = "decode", .detail = "generation record magic"});
    g.generation = r.get<std::int64_t>();
    g.reason = static_cast<change_reason>(r.get<std::uint8_t>());
    const auto n = r.get_count(16);
    for (std::uint64_t i = 0; i < n; ++i) {
      member_entry m;
      m.id = r.get<member_id>();
      m.committed = r.get<std::int64_t>();
      g.members.push_back(m);
    }
    g.source = r.get<member_id>();
    g.source_step = r.get<std::int64_t>();
    const auto p = r.get_count(8);
    for (std::uint64_t i = 0; i < p; ++i) g.plan.push_back(r.get<std::uint64_t>());
    g.plan_version = r.get<std::uint64_t>();
    g.joins_seen = r.get<std::int64_t>();
    r.expect_end();
    return g;
  }
  [[nodiscard]] int rank_of(member_id id) const noexcept {
    for (std::size_t i = 0; i < members.size(); ++i)
      if (members[i].id == id) return static_cast<int>(i);
    return -1;
  }
};

// A join ticket reads "<member> <failures whose cool-down it waited out>
// <worker key>"; the member id is parsed (and checked) by its reader.
struct join_ticket {
  std::string id;
  std::int64_t held_for = 0;
  std::string worker;
  static join_ticket parse(const std::string& v) {
    join_ticket t;
    std::istringstream in(v);
    in >> t.id >> t.held_for >> std::ws;
    std::getline(in, t.worker);
    return t;
  }
};

// A worker's join failures in a row, as stored: "<count>" (after a reset),
// or "<count> <generation> <member>,<member>,..." naming the members of the
// failed generation already counted, so every recovering member can apply
// the same failure and only the first one counts it.
struct join_failures {
  std::int64_t count = 0;
  std::int64_t generation = -1;
  std::vector<member_id> members;

  static join_failures parse(const std::optional<std::string>& v) {
    join_failures f;
    if (!v || v->empty()) return f;
    std::istringstream in(*v);
    in >> f.count;
    if (in >> f.generation) {
      std::string ids;
      in >> ids;
      for (std::size_t at = 0; at < ids.size();) {
        const auto comma = std::min(ids.find(',', at), ids.size());
        f.members.push_back(parse_i64(ids.substr(at, comma - at)));
        at = comma + 1;
      }
    }
    if (in.fail() && !in.eof()) f = {};
    return f;
  }
  std::string str() const {
    std::string s = std::to_string(count) + " " + std::to_string(generation) + " ";
    for (std::size_t i = 0; i < members.size(); ++i) {
      if (i) s += ',';
      s += std::to_string(members[i]);
    }
    return s;
  }
};

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/elastic/detail/records.hpp>
// #include <ebbflow/elastic/group_options.hpp>  (inlined here)
// ---- begin <ebbflow/elastic/group_options.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file group_options.hpp
//! Settings of an elastic group (`group_options`), the store keys a launcher
//! reads, and `report_process_exit`, with which a launcher tells a job that a
//! worker's process exited. Each field names its environment variable;
//! docs/elastic.md ("Configuration") says what each one is for and when to
//! change it.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/comm/transport.hpp>  (inlined)  // comm::max_collective_ranks
// #include <ebbflow/core/deadline.hpp>  (inlined)
// #include <ebbflow/core/env.hpp>  (inlined)
// #include <ebbflow/elastic/cooldown.hpp>  (inlined)
// #include <ebbflow/elastic/kv_store.hpp>  (inlined)
// #include <ebbflow/elastic/planning_policy.hpp>  (inlined)  // member_id

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

//! Settings of an elastic group. `from_environment()` reads the `EBBFLOW_*`
//! variables named beside each field (validated; a bad value throws
//! std::invalid_argument naming the variable). `global_batch` and
//! `dataset_size` have no default: set them in code.
struct group_options {
  std::string prefix = "ebbflow";                    //!< EBBFLOW_JOB: store key prefix of this job
  int min_size = 1;                                  //!< EBBFLOW_MIN_SIZE: below it the group waits
  int max_size = comm::max_collective_ranks;         //!< EBBFLOW_MAX_SIZE: joiners beyond it wait
  std::size_t global_batch = 0;                      //!< B, samples per step over all members (required)
  std::size_t dataset_size = 0;                      //!< N, samples per epoch (required)
  bool drop_last = false;                            //!< drop an epoch's short last batch
  bool join = false;                                 //!< EBBFLOW_JOIN=1: join a running job as a newcomer
  std::chrono::milliseconds heartbeat{50};           //!< EBBFLOW_HEARTBEAT_MS
  std::chrono::milliseconds lease{1000};             //!< EBBFLOW_LEASE_MS: silence after which a member is dead
  std::chrono::milliseconds op_timeout{30'000};      //!< EBBFLOW_OP_TIMEOUT_MS: deadline of each collective
  std::chrono::milliseconds join_timeout{120'000};   //!< EBBFLOW_JOIN_TIMEOUT_MS: admission, initial formation
  std::chrono::milliseconds min_size_wait{600'000};  //!< EBBFLOW_MIN_WAIT_MS: below min_size before giving up
  std::chrono::milliseconds initial_wait{30'000};    //!< EBBFLOW_INITIAL_WAIT_MS: for all launched workers
  std::chrono::milliseconds store_timeout{10'000};   //!< EBBFLOW_STORE_TIMEOUT_MS: deadline of each store call
  std::chrono::milliseconds admit_delay{50};         //!< EBBFLOW_ADMIT_DELAY_MS: batch join tickets this close
  std::chrono::milliseconds stall_warning{10'000};   //!< EBBFLOW_STALL_WARN_MS: name who is behind (0: off)
  std::chrono::microseconds sched_slice{0};          //!< EBBFLOW_SCHED_SLICE_US: members' scheduler slice (0: off)
  static constexpr std::chrono::microseconds min_sched_slice{100};     //!< the kernel's shortest slice
  static constexpr std::chrono::microseconds max_sched_slice{100000};  //!< the kernel's longest slice
  //! EBBFLOW_RT_PRIORITY (0: off, else 1 to 99): the group's threads run
  //! under `SCHED_RR` once this process is a member. Opt-in; needs
  //! `CAP_SYS_NICE` or `RLIMIT_RTPRIO` (refused: logged, training goes on).
  int rt_priority = 0;
  static constexpr int max_rt_priority = 99;  //!< the highest `SCHED_RR` priority on Linux
  bool preconnect = true;                     //!< EBBFLOW_PRECONNECT: connect to joiners while training
  //! EBBFLOW_INITIAL_STAGING_MB (0: off): a launched worker receives the
  //! initial state into a copy of at most this size, so a sender's death
  //! midway leaves its own initial state whole.
  std::size_t initial_staging = std::size_t{1024} << 20;
  std::chrono::milliseconds join_cooldown{1'000};       //!< SEC of EBBFLOW_JOIN_COOLDOWN=SEC[:MAX] (0: off)
  std::chrono::milliseconds join_cooldown_max{60'000};  //!< MAX of EBBFLOW_JOIN_COOLDOWN
  std::string worker_key;   //!< EBBFLOW_WORKER_KEY: whose join failures count together (default: host name)
  std::string process_key;  //!< EBBFLOW_PROCESS_KEY: this process's name with its launcher (empty: none)

  //! The store key of generation `g`'s record, written when it forms (a
  //! launcher waits for generation 0 to know that training began).
  [[nodiscard]] std::string generation_key(std::int64_t g) const { return prefix + "/gen/" + std::to_string(g); }
  //! The store key under which the member that process `name` (its
  //! EBBFLOW_PROCESS_KEY) became records its member id.
  [[nodiscard]] std::string process_record_key(std::string_view name) const {
    return prefix + "/proc/" + std::string(name);
  }
  //! The store key that says member `m`'s process exited (`report_process_exit`).
  [[nodiscard]] std::string gone_key(member_id m) const { return prefix + "/gone/" + std::to_string(m); }
  //! The counter `report_process_exit` adds one to after each report.
  [[nodiscard]] std::string gone_count_key() const { return prefix + "/gone_count"; }

  //! The defaults, overridden by the environment. @throws std::invalid_argument naming the variable.
  static group_options from_environment() { return from_environment(group_options{}); }
  //! `o`, overridden by the environment. @throws std::invalid_argument naming the variable.
  static group_options from_environment(group_options o);
};

//! For a launcher: the process it started as `process_key` (the
//! EBBFLOW_PROCESS_KEY it gave it) exited, `how` (e.g. "killed by SIGKILL").
//! If that process became a member of the job, the members drop it at once
//! instead of waiting for its lease. Call it once the process and whatever it
//! started are gone. Returns the member id the process was, or nullopt when
//! it never registered. @throws system_error from the store (deadline `d`).
template <kv_store Store>
std::optional<member_id> report_process_exit(Store& st, const group_options& o, std::string_view process_key,
                                             std::string_view how, deadline d);

}  // namespace elastic
EBBFLOW_END_NAMESPACE

// #include <ebbflow/elastic/impl/group_options.hpp>  (inlined here)
// ---- begin <ebbflow/elastic/impl/group_options.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file impl/group_options.hpp
//! Definitions of elastic/group_options.hpp.


// #include <ebbflow/elastic/group_options.hpp>  (inlined)
// #include <ebbflow/elastic/detail/records.hpp>  (inlined)  // parse_i64

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

inline group_options group_options::from_environment(group_options o) {
  constexpr std::int64_t day_ms = 24LL * 3'600'000;
  if (auto j = env::get("EBBFLOW_JOB")) o.prefix = *j;
  // Both bounds within the collectives' most ranks, so a minimum above it
  // is refused naming EBBFLOW_MIN_SIZE rather than the maximum's default.
  o.min_size = static_cast<int>(env::get_int("EBBFLOW_MIN_SIZE", o.min_size, 1, comm::max_collective_ranks));
  o.max_size = static_cast<int>(env::get_int("EBBFLOW_MAX_SIZE", o.max_size, o.min_size, comm::max_collective_ranks));
  o.join = env::get_bool("EBBFLOW_JOIN", o.join);
  o.heartbeat = env::get_ms("EBBFLOW_HEARTBEAT_MS", o.heartbeat, 1, 60'000);
  o.store_timeout = env::get_ms("EBBFLOW_STORE_TIMEOUT_MS", o.store_timeout, 1);
  o.lease = env::get_ms("EBBFLOW_LEASE_MS", o.lease, 10, 3'600'000);
  o.op_timeout = env::get_ms("EBBFLOW_OP_TIMEOUT_MS", o.op_timeout, 10, day_ms);
  o.stall_warning = env::get_ms("EBBFLOW_STALL_WARN_MS", o.stall_warning, 0, day_ms);
  o.sched_slice = std::chrono::microseconds(env::get_int_or_zero("EBBFLOW_SCHED_SLICE_US", o.sched_slice.count(),
                                                                 min_sched_slice.count(), max_sched_slice.count()));
  o.rt_priority = static_cast<int>(env::get_int_or_zero("EBBFLOW_RT_PRIORITY", o.rt_priority, 1, max_rt_priority));
  o.join_timeout = env::get_ms("EBBFLOW_JOIN_TIMEOUT_MS", o.join_timeout, 10, day_ms);
  o.min_size_wait = env::get_ms("EBBFLOW_MIN_WAIT_MS", o.min_size_wait, 10, day_ms);
  o.initial_wait = env::get_ms("EBBFLOW_INITIAL_WAIT_MS", o.initial_wait, 0, day_ms);
  o.admit_delay = env::get_ms("EBBFLOW_ADMIT_DELAY_MS", o.admit_delay, 0, 3'600'000);
  o.preconnect = env::get_bool("EBBFLOW_PRECONNECT", o.preconnect);
  o.initial_staging =
      static_cast<std::size_t>(env::get_int(
          "EBBFLOW_INITIAL_STAGING_MB", static_cast<std::int64_t>(o.initial_staging >> 20), 0, std::int64_t{1} << 30))
      << 20;
  if (auto c = env::get("EBBFLOW_JOIN_COOLDOWN")) {
    const auto cd = cooldown::parse(*c, "EBBFLOW_JOIN_COOLDOWN", {o.join_cooldown, o.join_cooldown_max});
    o.join_cooldown = cd.sec;
    o.join_cooldown_max = cd.max;
  }
  if (auto k = env::get("EBBFLOW_WORKER_KEY")) o.worker_key = *k;
  if (auto k = env::get("EBBFLOW_PROCESS_KEY")) o.process_key = *k;
  return o;
}

template <kv_store Store>
std::optional<member_id> report_process_exit(Store& st, const group_options& o, std::string_view process_key,
                                             std::string_view how, deadline d) {
  const auto v = st.try_get(o.process_record_key(process_key), d);
  if (!v) return std::nullopt;
  const member_id m = detail::parse_i64(*v);
  st.set(o.gone_key(m), how, d);
  st.add(o.gone_count_key(), 1, d);  // after the report: who reads the new count finds it
  return m;
}

}  // namespace elastic
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/elastic/impl/group_options.hpp>
// ---- end <ebbflow/elastic/group_options.hpp>
// #include <ebbflow/elastic/group_types.hpp>  (inlined)
// #include <ebbflow/elastic/kv_store.hpp>  (inlined)
// #include <ebbflow/elastic/network.hpp>  (inlined here)
// ---- begin <ebbflow/elastic/network.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file network.hpp
//! The `network` concept: what builds the transport of each generation of an
//! elastic group. The UCX network (elastic/ucx_network.hpp) and the loopback
//! network (elastic/loopback_network.hpp) model it.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/comm/transport.hpp>  (inlined)
// #include <ebbflow/core/deadline.hpp>  (inlined)
// #include <ebbflow/elastic/kv_store.hpp>  (inlined)  // bytes

#include <concepts>
#include <cstdint>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

//! A network builds the transport of each generation. `prepare(g)` creates
//! this process's endpoint for generation g and returns its address (the
//! group publishes it in the store); `connect(g, rank, addresses, d)` returns
//! the transport of generation g given every member's address in rank order.
//!
//! Optional members, found by the group when present:
//! * `static bool stable_address()`: true when `prepare` returns the same
//!   address for every generation; the group publishes it once.
//! * `start_connect(g, rank, addresses)` returning a transport whose wire-up
//!   completes in the background (its `poll_connect()`): the group then
//!   connects to joiners while it keeps training and switches once every
//!   member is wired up (docs/elastic.md, "Join without suspension").
//! * `bool concurrent_connect()`: true when `start_connect` may run on the
//!   group's admission helper thread while the training thread uses the
//!   current generation's transport on the same network.
//! * `discard_endpoints()`: for a network whose consecutive generations
//!   share connections; called when a generation failed, so the recovered
//!   one opens its own.
template <class N>
concept network = requires(N& n, std::int64_t g, int rank, const std::vector<bytes>& addrs, deadline d) {
  typename N::transport_type;
  requires comm::transport<typename N::transport_type>;
  { n.prepare(g) } -> std::convertible_to<bytes>;
  { n.connect(g, rank, addrs, d) } -> std::same_as<typename N::transport_type>;
};

namespace detail {
//! Whether `N` publishes one address for every generation.
template <class N>
constexpr bool stable_address() {
  if constexpr (requires {
                  { N::stable_address() } -> std::convertible_to<bool>;
                })
    return N::stable_address();
  else
    return false;
}

//! Whether `N` can wire up a generation's transport in the background.
template <class N>
constexpr bool can_preconnect() {
  return requires(N & n, std::int64_t g, int rank, const std::vector<bytes>& addrs, typename N::transport_type& t) {
    { n.start_connect(g, rank, addrs) } -> std::same_as<typename N::transport_type>;
    { t.poll_connect() } -> std::convertible_to<bool>;
  };
}

//! Whether `n`'s start_connect may run on a helper thread while the current
//! generation trains on the same network (ucx_network on a UCX with threads).
template <class N>
bool concurrent_connect(const N& n) {
  if constexpr (requires {
                  { n.concurrent_connect() } -> std::convertible_to<bool>;
                })
    return n.concurrent_connect();
  else
    return false;
}
}  // namespace detail

}  // namespace elastic
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/elastic/network.hpp>
// #include <ebbflow/elastic/planning_policy.hpp>  (inlined)
// #include <ebbflow/plan/work_stealing.hpp>  (inlined)

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

template <kv_store Store, network Net>
class group;

namespace detail {

// Set by `leave_on_signal`'s handler: every group of the process leaves at
// its next step boundary.
inline std::atomic<bool>& signal_leave_flag() noexcept {
  static std::atomic<bool> f{false};
  return f;
}
extern "C" inline void on_leave_signal(int) { signal_leave_flag().store(true); }

// Errors after which the group re-forms instead of giving up.
inline bool recoverable(const std::error_code& ec) noexcept {
  return ec == errc::peer_lost || ec == errc::timeout || ec == errc::revoked;
}

template <kv_store Store, network Net>
class group_impl {
 public:
  using transport_type = comm::revocable<typename Net::transport_type>;
  using communicator_type = comm::transport_communicator<transport_type>;
  using store_factory = std::function<std::unique_ptr<Store>()>;

  // The public operations (elastic/group.hpp documents each).
  group_impl(store_factory connect_store, Net& net, group_options opts, launch_info launch,
             std::unique_ptr<planning_policy> policy);
  group_impl(const group_impl&) = delete;
  group_impl& operator=(const group_impl&) = delete;
  ~group_impl();
  void register_state(std::string name, std::span<std::byte> host_bytes);
  step_info begin_step();
  template <class F>
  bool collective(F&& f);
  bool allreduce(std::span<float> data);
  bool allreduce(std::span<double> data);
  template <class Process>
  plan::steal_report steal_step(Process&& process, const steal_settings& settings);
  // end_step: `processed` samples (the own slice when nullopt).
  void commit(double compute_seconds, std::optional<std::size_t> processed);
  void restore_position(std::int64_t step, std::int64_t epoch, std::size_t cursor);
  void finish();
  bool keep_training(std::int64_t total_steps);
  // A membership change is unfinished (group::changing).
  bool changing() const noexcept { return next_.has_value() || pending_.has_value(); }

 private:
  friend class elastic::group<Store, Net>;  // reads the state its accessors return

  // ---- store keys and failures (lifecycle.hpp)
  std::string key(const std::string& k) const { return opts_.prefix + "/" + k; }
  // The store key of generation g's record.
  std::string gen_key(std::int64_t g) const { return opts_.generation_key(g); }
  // The store key that marks member m dead in generation g (a recovery leaves it out).
  std::string dead_key(std::int64_t g, member_id m) const {
    return key("dead/" + std::to_string(g) + "/" + std::to_string(m));
  }
  // Whether the job was marked finished (`finish`).
  bool job_done() { return store_->try_get(key("done"), store_deadline()).has_value(); }
  // The deadline of a store call: store_timeout, or at most a lease while
  // the heartbeat finds the store unreachable (a call then fails fast).
  deadline store_deadline() const {
    return deadline::after(store_unreachable() ? std::min<std::chrono::milliseconds>(opts_.store_timeout, opts_.lease)
                                               : opts_.store_timeout);
  }
  bool store_unreachable() const noexcept { return store_down_since_.load(std::memory_order_relaxed) != 0; }
  // Whether `e` came from a store call (its operation is "store.<op>").
  static bool store_failure(const system_error& e) noexcept { return e.operation().starts_with("store"); }
  static constexpr std::chrono::seconds store_warning_period{10};
  [[noreturn]] void fail(std::error_code ec, const std::string& what) const;
  // Fails with job_finished: "the job EBBFLOW_JOB='<prefix>' <what>".
  [[noreturn]] void fail_job_finished(std::string_view what) const;
  // EBBFLOW_FAULT (detail/fault_injection.hpp), claimed on the training
  // thread's store connection, or on `st` from another thread.
  void fault_point(const char* point);
  void fault_point(const char* point, Store& st, std::stop_token stop);
  // The end of the job: see ~group.
  void wait_for_peers_to_end() noexcept;
  static constexpr std::chrono::seconds end_wait_max{2};

  // ---- generation 0 and newcomers (formation.hpp)
  void form_initial();
  // Writes generation 0 of the registered workers (compare-and-set: the first proposal wins).
  void propose_initial(const std::vector<std::optional<std::string>>& registered);
  void wait_admission();

  // ---- entering a generation (generation.hpp)
  int size() const noexcept { return static_cast<int>(gen_.members.size()); }  // members of gen_
  // `begun`: a transport this member already started for rec (the
  // background connect of a join that now goes the blocking way).
  void adopt(generation_record rec, steady_clock::time_point started,
             std::optional<typename Net::transport_type> begun = {});
  // adopt(), and on a recoverable error the recovery of rec's generation.
  void adopt_or_recover(generation_record rec, steady_clock::time_point started,
                        std::optional<typename Net::transport_type> begun = {});
  void enter(generation_record rec);
  void became_member();
  void take_member_scheduling();
  void install(generation_record rec, typename Net::transport_type t, steady_clock::time_point started,
               double prepared_seconds);
  typename Net::transport_type connect_watched(const generation_record& rec, const std::vector<bytes>& addrs,
                                               std::optional<typename Net::transport_type> begun = {});
  std::vector<bytes> gather_addresses(const generation_record& rec);
  // As above, on `st` with `cache`: callable from the admission helper.
  std::vector<bytes> gather_addresses(const generation_record& rec, Store& st, std::map<member_id, bytes>& cache,
                                      int rank, const std::shared_ptr<comm::revoke_flag>& revoke, std::stop_token stop);
  void leave_now();

  // ---- the user's step (step.hpp)
  step_info current_slice() const;
  // Throws group_error (invalid_state) unless a step is open on an active member.
  void require_open_step(const char* what) const;
  // The policy's plan for `ids`, checked: one entry each, summing to the global batch.
  std::vector<std::size_t> plan_of(const std::vector<member_id>& ids) const;
  void control_allreduce(std::span<double> v);
  void notify(change_reason reason, int old_size, double stall);
  void release_steal_counter();

  // ---- state transfer (state_transfer.hpp)
  void sync_state();

  // ---- the coordinator's join tickets (join_tickets.hpp)
  // A join ticket answered with a cool-down instead of an admission.
  struct join_hold {
    std::int64_t ticket = 0;
    std::int64_t ms = 0;        // how long the joiner waits before it files a new ticket
    std::int64_t failures = 0;  // its worker's join failures in a row
    std::string worker;         // its worker key
  };
  // The join tickets after `seen` (advanced past those handled), at most
  // `room` of them admitted; tickets of workers in a cool-down go to `holds`.
  std::vector<member_id> pending_joiners(std::int64_t& seen, std::size_t room, bool settle,
                                         std::vector<join_hold>& holds);
  void answer_holds(Store& st, const std::vector<join_hold>& holds) const;
  // The recovery's winner: the members lost from gen_ that were still in their
  // probation as newcomers count one join failure for their worker key.
  void count_join_failures(const std::vector<member_entry>& alive, std::set<member_id>& counted);
  // The heartbeat thread's read-ahead of new tickets (see hb_tickets_).
  std::int64_t prefetch_tickets(Store& st, std::int64_t total);

  // ---- joins and leaves at a step boundary (membership_change.hpp)
  // Forms generation g+1 without the members `leaving` marks (1 per rank of
  // the `n`) and with the joiners being admitted.
  void change_membership(const std::vector<char>& leaving, int n);
  // The leaves the control exchange `ctl` applies (1 per rank): a leave that
  // would take the group below min_size, or leave newcomers without a state
  // holder, waits (the lowest-ranked leavers stay one more generation).
  std::vector<char> leaves_applied(const std::vector<double>& ctl, int n);
  bool deferral_logged_ = false;  // the coordinator said why leaves wait
  void write_record(Store& st, const std::string& gkey, const std::string& rec, const std::vector<member_id>& joiners,
                    std::int64_t g1) const;
  void start_admission(std::optional<std::string> record, std::string gkey, std::int64_t g1,
                       std::vector<member_id> leavers, steady_clock::time_point started);
  void take_admission();
  void adopt_announced(std::int64_t g1, steady_clock::time_point started,
                       std::optional<typename Net::transport_type> begun = {});
  int poll_next();

  // ---- recovery after a failure (recovery.hpp)
  // Re-forms the group after generation `failed_generation` failed (its
  // rank `lost_peer` seen dead, or -1); a store that cannot be reached makes
  // it fail with a clear group_error.
  void recover(std::int64_t failed_generation, int lost_peer);
  void reform(std::int64_t failed_generation, int lost_peer);
  int lost_peer_of(const system_error& e) const noexcept;
  static int lost_in_adopt(const system_error& e) noexcept;
  // This member takes its own buffers as the job's initial state (recover() chose it).
  void take_own_initial_state();

  // ---- leases (heartbeat.hpp)
  // Each member's heartbeat counter as last read, and when it last changed.
  using lease_seen = std::map<member_id, std::pair<std::int64_t, steady_clock::time_point>>;
  // Lease checks of a connect in progress: at most one round per heartbeat.
  struct lease_watch {
    lease_seen seen;
    steady_clock::time_point next_check{};
  };
  bool fresh(Store& st, member_id m, lease_seen& seen) const;
  // Whether member m, whose heartbeat counter reads `hb` at `now`, counted on
  // within the lease (its first reading counts as fresh).
  bool fresh(member_id m, std::int64_t hb, steady_clock::time_point now, lease_seen& seen) const;
  // The rank in `rec` of a member whose lease expired (with `joiners_only`,
  // a joiner), else -1; reads the store at most once a heartbeat.
  int stale_member(const generation_record& rec, lease_watch& w, bool joiners_only);
  void heartbeat_loop(std::stop_token st);
  // The heartbeat thread's watch of the current generation's leases.
  struct peer_watch {
    std::int64_t generation = -1;
    lease_seen seen;
    steady_clock::time_point last_round{};
    std::int64_t aborted = -1;  // the generation this thread aborted, or saw aborted
  };
  // After a heartbeat round that read `ids`' counters `hb` for generation g:
  // a member silent for a lease is marked dead in g and g is aborted.
  void check_leases(Store& st, std::int64_t g, const std::vector<member_id>& ids, std::span<const std::int64_t> hb,
                    peer_watch& w);
  // The same for a launcher's report (report_process_exit) that one of
  // `ids` (ranks `ranks` in g) exited: it is marked dead and g aborted.
  void check_gone(Store& st, std::int64_t g, const std::vector<member_id>& ids, const std::vector<int>& ranks,
                  peer_watch& w);
  // Whether a heartbeat thread that found a member of g dead should still
  // abort g: the job has not finished and g is still this member's.
  bool abort_due(Store& st, std::int64_t g);
  // Marks m dead in g, posts abort/<g> and revokes this member's transport.
  void abort_without(Store& st, std::int64_t g, member_id m, peer_watch& w);
  // A heartbeat round could not reach the store: marks it unreachable and
  // warns (at once, then every store_warning_period).
  void note_store_unreachable(const char* why, steady_clock::time_point& next_warning);
  // Whole seconds from steady_clock tick `since` to now.
  static long long seconds_since(steady_clock::rep since) noexcept {
    return std::chrono::duration_cast<std::chrono::seconds>(steady_clock::now().time_since_epoch() -
                                                            steady_clock::duration(since))
        .count();
  }

  // ---- the state, in declaration order (which is destruction order)

  group_options opts_;
  launch_info launch_;
  store_factory connect_store_;
  std::unique_ptr<Store> store_;
  Net* net_;
  std::unique_ptr<planning_policy> policy_;
  member_id id_ = -1;
  comm::collective_options coll_opts_;
  std::map<member_id, bytes> address_cache_;  // stable-address networks only

  generation_record gen_;
  int rank_ = -1;
  bool active_ = true;
  bool became_member_ = false;      // became_member() ran: once per process
  bool member_scheduling_ = false;  // take_member_scheduling() ran: once per process
  bool started_ = false;            // begin_step was called
  bool finished_ = false;           // keep_training found the job's steps done and called finish()
  // Where the user's step is: begin_step opens it, end_step closes it, a
  // collective that returns false aborts it (redo from begin_step).
  enum class step_phase : unsigned char { closed, open, aborted };
  step_phase phase_ = step_phase::closed;
  bool callback_threw_ = false;  // a world-changed callback's exception is passing through
  static constexpr std::int64_t max_step = std::int64_t{1} << 62;
  std::int64_t step_ = -1;  // committed steps; -1 until state arrives
  std::int64_t epoch_ = 0;
  std::size_t cursor_ = 0;
  // The job's initial state is the registered buffers of the member that
  // formed generation 0. Should it die before that state moved, another
  // launched worker's own buffers serve instead, as if it had formed it:
  // only while no transfer has written them and the member was never left
  // out (a newcomer's buffers are never the job's state). See recover().
  bool own_initial_state_ = false;
  struct position {
    std::int64_t step, epoch;
    std::size_t cursor;
  };
  std::optional<position> restored_;  // restore_position's, kept by every member
  struct pending_change {
    change_reason reason;
    int old_size;
    steady_clock::time_point started;
    double prepared_seconds = 0;  // spent before the switch connecting in the background (counted as stall)
  };
  std::optional<pending_change> pending_;  // state transfer and notification still to do
  // What the admission helper thread hands back: the store work of a
  // membership change (the coordinator's record, the next generation's
  // record and addresses) and, where the network allows it from another
  // thread, the endpoints, done while this member's training thread goes on.
  struct admission_result {
    std::atomic<bool> done{false};  // release: everything below is written
    std::exception_ptr error;
    std::optional<generation_record> rec;
    std::vector<bytes> addrs;
    std::optional<typename Net::transport_type> transport;
    std::map<member_id, bytes> cache;  // the address cache, updated, handed back
    bool excluded = false;             // rec leaves this member out (a concurrent recovery): rejoin
    bool blocking = false;             // rec leaves a current member out: the blocking way sorts it out
  };
  // A join whose transport is wiring up while the current generation trains.
  struct next_generation {
    generation_record rec;
    std::int64_t g1 = -1;               // the generation being prepared
    std::optional<std::string> record;  // the coordinator's record (the helper writes it)
    std::vector<member_id> admitted;    // the joiners that record admits
    std::optional<typename Net::transport_type> transport;
    steady_clock::time_point since;               // connect started
    double prepared_seconds = 0;                  // this member's training-thread time spent starting it
    bool leaving = false;                         // this member leaves at the switch (no transport)
    bool failed = false;                          // starting the connect failed here: fall back at the next exchange
    bool excluded = false;                        // the next generation leaves this member out: it rejoins
    lease_watch joiners;                          // joiners' leases
    std::shared_ptr<admission_result> admission;  // the helper's result while it runs
    std::jthread helper;                          // declared last: joined first
  };
  std::unique_ptr<Store> aux_store_;  // the admission helper's own connection (store clients are not thread-safe)
  std::optional<next_generation> next_;
  std::optional<transport_type> transport_;
  std::optional<typename Net::transport_type> retiring_;  // the replaced generation's, closing in the background
  std::optional<communicator_type> comm_;
  std::shared_ptr<comm::revoke_flag> revoke_;
  std::atomic<std::int64_t> hb_generation_{-1};
  // Since when the heartbeat finds the store unreachable (steady_clock ticks; 0: it is reachable).
  std::atomic<steady_clock::rep> store_down_since_{0};
  std::mutex hb_wake_m_;                 // with hb_wake_: the heartbeat thread's sleep between beats,
  std::condition_variable_any hb_wake_;  // cut short when this process becomes a member
  std::mutex hb_mutex_;
  std::shared_ptr<comm::revoke_flag> hb_revoke_;
  std::vector<std::string> hb_erase_;  // store keys the heartbeat thread erases (under hb_mutex_)
  // The members of generation hb_watched_gen_ whose leases the heartbeat
  // thread watches (under hb_mutex_): the coordinator watches every other
  // member, the others the coordinator.
  std::int64_t hb_watched_gen_ = -1;
  std::vector<member_id> hb_watched_;
  std::vector<int> hb_watched_ranks_;  // their ranks in that generation
  std::atomic<bool> leave_requested_{false};
  // Nonzero while the training thread is inside begin_step, allreduce or
  // end_step (where it progresses the network itself): the admission helper
  // drives a background wire-up only while it is zero.
  std::atomic<int> in_group_{0};
  // Where the training thread is, published with its heartbeat for the
  // stall warning (an encoded progress: a member behind another
  // reads lower); and since when the training thread waits inside a
  // collective (steady_clock ticks; 0: it does not).
  std::atomic<std::int64_t> progress_{0};
  std::atomic<steady_clock::rep> waiting_since_{0};
  std::pair<std::int64_t, std::int64_t> progress_at_{-1, -1};  // (generation, step) progress_k_ counts in
  int progress_k_ = 0;
  struct waiting {
    std::atomic<steady_clock::rep>& since;
    explicit waiting(std::atomic<steady_clock::rep>& s) noexcept : since(s) {}
    ~waiting() { since.store(0, std::memory_order_relaxed); }
    waiting(const waiting&) = delete;
    waiting& operator=(const waiting&) = delete;
  };
  // The training thread enters a collective: counts it and marks the wait.
  [[nodiscard]] waiting enter_collective(bool control = false) noexcept;
  // After a heartbeat round that found this member waiting for
  // stall_warning: names the watched members whose progress is behind.
  void report_stall(std::int64_t mine, steady_clock::duration waited, const std::vector<member_id>& ids,
                    const std::vector<int>& ranks, std::span<const std::int64_t> progress, bool coordinator) const;
  struct inside {
    std::atomic<int>& n;
    explicit inside(std::atomic<int>& c) noexcept : n(c) { n.fetch_add(1, std::memory_order_relaxed); }
    ~inside() { n.fetch_sub(1, std::memory_order_relaxed); }
    inside(const inside&) = delete;
    inside& operator=(const inside&) = delete;
  };
  // A newcomer until its probation ends (steady_clock ticks; 0: not one):
  // then the heartbeat thread clears its join-failure marks.
  std::atomic<steady_clock::rep> probation_end_{0};
  std::pair<std::int64_t, std::int64_t> steal_attempt_{-1, -1};  // (generation, step) of the last steal_step
  std::string steal_key_;             // this step's work-stealing counter of the own slice (erased when the step ends)
  std::vector<member_id> admitting_;  // joiners the coordinator flagged in this step's control exchange
  steady_clock::time_point last_commit_{};  // the previous end_step
  steady_clock::duration step_interval_{};  // from the previous end_step to this one
  // The coordinator's heartbeat thread reads the join-ticket counter into
  // join_seq_hint_, so that a coordinator's step reads the store only
  // while join tickets wait: a steady step makes no store call.
  std::atomic<bool> hb_watch_joins_{false};
  std::atomic<std::int64_t> join_seq_hint_{0};
  // It also reads the tickets themselves as they appear, and their workers'
  // join-failure counts, so that the step that admits them makes no store
  // call either (under hb_mutex_, by ticket number; tickets up to
  // hb_tickets_floor_ are handled). A ticket never changes once written; a
  // count only in a recovery (count_join_failures), which bumps
  // failures_epoch_ after it: a count read before that is read again.
  struct prefetched_ticket {
    std::string value;
    std::int64_t failures_epoch = -1;  // failures_epoch_ when `failures` was read (-1: not read)
    std::optional<std::string> failures;
  };
  std::map<std::int64_t, prefetched_ticket> hb_tickets_;
  std::atomic<std::int64_t> hb_tickets_floor_{0};
  std::atomic<std::int64_t> failures_epoch_{0};
  std::int64_t ticket_seen_until_ = 0;  // coordinator: newest join ticket seen
  std::int64_t ticket_hole_ = 0;        // coordinator: a ticket taken but not written, since:
  steady_clock::time_point ticket_hole_since_;
  steady_clock::time_point ticket_first_seen_;   // when the oldest waiting ticket was seen
  steady_clock::time_point ticket_last_change_;  // when the newest ticket was seen

  struct state_entry {
    std::string name;
    std::span<std::byte> data;
  };
  std::vector<state_entry> state_;
  std::vector<std::function<void(const world_change&)>> callbacks_;
  std::vector<world_change> history_;
  std::jthread heartbeat_;
};

}  // namespace detail
}  // namespace elastic
EBBFLOW_END_NAMESPACE

// #include <ebbflow/elastic/impl/group/lifecycle.hpp>  (inlined here)
// ---- begin <ebbflow/elastic/impl/group/lifecycle.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file impl/group/lifecycle.hpp
//! Construction and the end of a member: the checks of the options, the
//! store connections, registration with the job, the end-of-job wait, the
//! registered state and a restored position, `finish` and `keep_training`,
//! and the fault points.
//! May touch any member: it runs before and after the other threads.


// #include <ebbflow/elastic/detail/group_impl.hpp>  (inlined)
// #include <ebbflow/core/thread_name.hpp>  (inlined)
// #include <ebbflow/elastic/detail/fault_injection.hpp>  (inlined here)
// ---- begin <ebbflow/elastic/detail/fault_injection.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file detail/fault_injection.hpp
//! Fault injection for the multi-process tests: EBBFLOW_FAULT=<point>[*N]
//! [:hang=MS|:sleep=MS] makes the first member of the job (the first N) that
//! reaches `point` die there as a crashed process would (SIGKILL), hang
//! there as a SIGSTOPped one would, or sleep on the calling thread only.
//! Claims go through the job's store, so exactly N members fire. The points
//! are listed in docs/elastic.md ("Testing aids"). Unset, a point costs one
//! comparison.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/deadline.hpp>  (inlined)
// #include <ebbflow/core/env.hpp>  (inlined)
// #include <ebbflow/core/log.hpp>  (inlined)
// #include <ebbflow/elastic/detail/records.hpp>  (inlined)    // parse_i64
// #include <ebbflow/elastic/detail/store_ops.hpp>  (inlined here)
// ---- begin <ebbflow/elastic/detail/store_ops.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file detail/store_ops.hpp
//! Store operations the elastic group builds on any `kv_store`: batched reads
//! and adds (one pipelined round trip where the store offers it), waits for
//! keys in slices that notice a stop request, and a stoppable sleep.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/deadline.hpp>  (inlined)
// #include <ebbflow/core/error.hpp>  (inlined)

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

// Sleeps until `until` or until `stop` is requested, whichever comes first
// (in slices of at most 10 ms, so a stop is seen soon).
inline void sleep_until(steady_clock::time_point until, const std::stop_token& stop) {
  while (!stop.stop_requested() && steady_clock::now() < until)
    std::this_thread::sleep_for(
        std::min<steady_clock::duration>(until - steady_clock::now(), std::chrono::milliseconds(10)));
}

// The values of `keys`: in one pipelined batch where the store offers
// try_get_many, else one by one.
template <class S>
std::vector<std::optional<std::string>> try_get_all(S& st, const std::vector<std::string>& keys, deadline d) {
  if (keys.empty()) return {};  // no round trip for nothing
  if constexpr (requires { st.try_get_many(std::span<const std::string>(keys), d); }) {
    return st.try_get_many(std::span<const std::string>(keys), d);
  } else {
    std::vector<std::optional<std::string>> out;
    for (const auto& k : keys) out.push_back(st.try_get(k, d));
    return out;
  }
}

// `add(keys[i], deltas[i])` for every i: in one pipelined batch where the
// store offers add_many, else one by one.
template <class S>
std::vector<std::int64_t> add_all(S& st, const std::vector<std::string>& keys, const std::vector<std::int64_t>& deltas,
                                  deadline d) {
  if constexpr (requires {
                  st.add_many(std::span<const std::string>(keys), std::span<const std::int64_t>(deltas), d);
                }) {
    return st.add_many(std::span<const std::string>(keys), std::span<const std::int64_t>(deltas), d);
  } else {
    std::vector<std::int64_t> out;
    for (std::size_t i = 0; i < keys.size(); ++i) out.push_back(st.add(keys[i], deltas[i], d));
    return out;
  }
}

// Waits on the server until any of `keys` exists, in 50 ms slices so that a
// stop request is noticed: the index of one that does, or nullopt when
// stopped or past `d`. A store without wait_any waits for the first key and
// looks for the others at the end of each slice.
template <class S>
std::optional<std::size_t> wait_any_key(S& st, const std::vector<std::string>& keys, deadline d,
                                        const std::stop_token& stop) {
  constexpr bool has_wait_any = requires { st.wait_any(keys, d); };
  while (!stop.stop_requested() && !d.expired()) {
    try {
      const auto slice = min(d, deadline::after(std::chrono::milliseconds(50)));
      if constexpr (has_wait_any) {
        return st.wait_any(keys, slice);
      } else {
        st.wait({keys.front()}, slice);
        return 0;
      }
    } catch (const system_error& e) {
      if (e.code() != errc::timeout) throw;
    }
    if constexpr (!has_wait_any)
      for (std::size_t i = 1; i < keys.size() && !d.expired(); ++i)
        if (st.try_get(keys[i], d)) return i;
  }
  return std::nullopt;
}

// The same for one key: true once it exists.
template <class S>
bool wait_key(S& st, const std::string& k, deadline d, const std::stop_token& stop) {
  return wait_any_key(st, {k}, d, stop).has_value();
}

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/elastic/detail/store_ops.hpp>
// #include <ebbflow/elastic/planning_policy.hpp>  (inlined)   // member_id

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <ctime>
#include <iomanip>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

//! Fires EBBFLOW_FAULT at `point` when it names that point and this member
//! (`id`, of the job under `prefix` in `st`) is among the first N to get
//! there. `stop` cuts a `:sleep` short.
//! @throws std::invalid_argument for a malformed EBBFLOW_FAULT.
template <class Store>
void fault_point(std::string_view point, Store& st, const std::string& prefix, member_id id, deadline d,
                 const std::stop_token& stop) {
  static const std::optional<std::string> fault = env::get("EBBFLOW_FAULT");
  if (!fault) return;
  std::string_view f = *fault;
  enum class mode { die, hang, sleep } how = mode::die;
  std::int64_t ms = 0;
  if (const auto colon = f.find(':'); colon != std::string_view::npos) {
    const std::string_view m = f.substr(colon + 1);
    if (m.starts_with("hang="))
      how = mode::hang;
    else if (m.starts_with("sleep="))
      how = mode::sleep;
    else
      throw std::invalid_argument("EBBFLOW_FAULT='" + *fault + "': expected <point>[*N][:hang=MS|:sleep=MS]");
    ms = parse_i64(std::string(m.substr(m.find('=') + 1)));
    f = f.substr(0, colon);
  }
  const auto star = f.find('*');
  if (f.substr(0, star) != point) return;
  const std::int64_t times = star == std::string_view::npos ? 1 : parse_i64(std::string(f.substr(star + 1)));
  if (st.add(prefix + "/fault/" + std::string(point), 1, d) > times) return;
  switch (how) {
    case mode::die:
      EBBFLOW_LOG_WARN("EBBFLOW_FAULT=" << point << ": member " << id << " dies here");
      std::raise(SIGKILL);
      return;
    case mode::sleep:
      EBBFLOW_LOG_WARN("EBBFLOW_FAULT=" << point << ": member " << id << "'s thread sleeps here for " << ms << " ms");
      sleep_until(std::chrono::steady_clock::now() + std::chrono::milliseconds(ms), stop);
      return;
    case mode::hang:
      break;
  }
  EBBFLOW_LOG_WARN("EBBFLOW_FAULT=" << point << ": member " << id << " hangs here for " << ms << " ms");
  // A child continues this process: fork() leaves it one thread, which
  // calls only async-signal-safe functions.
  const pid_t self = ::getpid();
  if (const pid_t waker = ::fork(); waker == 0) {
    const timespec t{static_cast<time_t>(ms / 1000), static_cast<long>(ms % 1000) * 1'000'000};
    ::nanosleep(&t, nullptr);
    ::kill(self, SIGCONT);
    ::_exit(0);
  } else if (waker > 0) {
    ::kill(self, SIGSTOP);
    ::waitpid(waker, nullptr, 0);
    EBBFLOW_LOG_WARN("EBBFLOW_FAULT=" << point << ": member " << id << " goes on after its hang [t=" << std::fixed
                                      << std::setprecision(3) << wall_seconds() << "]");
  }
}

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/elastic/detail/fault_injection.hpp>

#include <algorithm>
#include <string>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

template <kv_store Store, network Net>
group_impl<Store, Net>::group_impl(store_factory connect_store, Net& net, group_options opts, launch_info launch,
                                   std::unique_ptr<planning_policy> policy)
    : opts_(std::move(opts)),
      launch_(std::move(launch)),
      connect_store_(std::move(connect_store)),
      net_(&net),
      policy_(std::move(policy)) {
  EBBFLOW_ENFORCE(opts_.global_batch > 0, "elastic group: global_batch must be > 0");
  EBBFLOW_ENFORCE(opts_.dataset_size > 0, "elastic group: dataset_size must be > 0");
  EBBFLOW_ENFORCE(!opts_.drop_last || opts_.global_batch <= opts_.dataset_size,
                  "elastic group: drop_last with global_batch " << opts_.global_batch << " > dataset_size "
                                                                << opts_.dataset_size << " leaves no step");
  EBBFLOW_ENFORCE(
      opts_.min_size >= 1 && opts_.max_size >= opts_.min_size && opts_.max_size <= comm::max_collective_ranks,
      "elastic group: need 1 <= min_size (" << opts_.min_size << ") <= max_size (" << opts_.max_size << ") <= "
                                            << comm::max_collective_ranks << " (the collectives' most ranks)");
  EBBFLOW_ENFORCE(opts_.join_cooldown.count() >= 0 && opts_.join_cooldown_max >= opts_.join_cooldown,
                  "elastic group: need 0 <= join_cooldown ("
                      << opts_.join_cooldown.count() << " ms) <= join_cooldown_max (" << opts_.join_cooldown_max.count()
                      << " ms)");
  // A lease spans at least two heartbeats: a member whose counter moves only
  // once per lease would be judged dead for one late beat.
  EBBFLOW_ENFORCE(opts_.heartbeat.count() > 0 && opts_.lease >= 2 * opts_.heartbeat,
                  "elastic group: EBBFLOW_LEASE_MS=" << opts_.lease.count() << " must be at least twice "
                                                     << "EBBFLOW_HEARTBEAT_MS=" << opts_.heartbeat.count());
  EBBFLOW_ENFORCE(opts_.sched_slice.count() == 0 || (opts_.sched_slice >= group_options::min_sched_slice &&
                                                     opts_.sched_slice <= group_options::max_sched_slice),
                  "elastic group: EBBFLOW_SCHED_SLICE_US="
                      << opts_.sched_slice.count() << ": expected 0 or " << group_options::min_sched_slice.count()
                      << " to " << group_options::max_sched_slice.count() << " (the kernel's range)");
  EBBFLOW_ENFORCE(opts_.rt_priority >= 0 && opts_.rt_priority <= group_options::max_rt_priority,
                  "elastic group: EBBFLOW_RT_PRIORITY=" << opts_.rt_priority << ": expected 0 (off) or 1 to "
                                                        << group_options::max_rt_priority);
  // The first generation is formed from the launched workers alone (a
  // newcomer joins a running group): fewer than min_size could never start.
  EBBFLOW_ENFORCE(opts_.join || launch_.world_size >= opts_.min_size,
                  "elastic group: EBBFLOW_MIN_SIZE=" << opts_.min_size << " but this launch starts "
                                                     << launch_.world_size
                                                     << " workers; the first generation is formed from the "
                                                        "launched workers, so launch at least min_size of them");
  EBBFLOW_ENFORCE(policy_ != nullptr, "elastic group: null planning policy");
  EBBFLOW_ENFORCE(connect_store_ != nullptr, "elastic group: null store factory");
  if (opts_.worker_key.empty()) opts_.worker_key = env::host_name();
  store_ = connect_store_();
  // A store that outlives its jobs keeps a finished job's keys under its
  // prefix: this worker would take that job's generations for its own.
  if (job_done())
    fail_job_finished(
        "on this store has finished: a worker started now cannot join it, and a new job needs a prefix of its own "
        "(EBBFLOW_JOB; ebbflow-run --attach picks a fresh one) or a fresh store");
  // The admission helper's own connection, made now rather than in the
  // middle of a membership change (a joiner makes it later, when needed:
  // its start-up is already part of one).
  if (detail::can_preconnect<Net>() && opts_.preconnect && !opts_.join) aux_store_ = connect_store_();
  coll_opts_ = comm::collective_options::from_environment();
  coll_opts_.timeout = opts_.op_timeout;
  id_ = store_->add(key("next_id"), 1, store_deadline());
  // Which member this process is, for its launcher's report of its exit.
  if (!opts_.process_key.empty())
    store_->set(opts_.process_record_key(opts_.process_key), std::to_string(id_), store_deadline());
  if constexpr (detail::stable_address<Net>()) {
    const bytes mine = net_->prepare(0);
    store_->set(key("addr/" + std::to_string(id_)), to_value(mine), store_deadline());
  }
  heartbeat_ = std::jthread([this](std::stop_token st) { heartbeat_loop(st); });
  ::ebbflow::detail::name_thread(heartbeat_, "ebbflow-beat");
  if (!opts_.join && launch_.rank < launch_.world_size) {
    own_initial_state_ = true;
    form_initial();
  } else {
    wait_admission();  // a newcomer keeps a lowered priority (--join-nice) until the state moves (sync_state)
  }
}

template <kv_store Store, network Net>
group_impl<Store, Net>::~group_impl() {
  wait_for_peers_to_end();
  heartbeat_.request_stop();
  if (heartbeat_.joinable()) heartbeat_.join();
  next_.reset();  // stops and joins an admission helper first
  retiring_.reset();
  comm_.reset();
  transport_.reset();
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::wait_for_peers_to_end() noexcept {
  // A member that ends between steps (its training done) keeps its
  // transport until every member of its generation has ended too: a peer
  // still inside the last control exchange would take this one's closing
  // endpoints for a death (over tcp a close can reset what the peer has
  // not read yet) and fail the step it has in fact finished. A store
  // barrier, not a collective: its own last message cannot race a close.
  // Without a store there is nothing to wait on: the peers then see this
  // member's close at worst (a lease at most, as before this wait existed).
  if (!active_ || !transport_ || phase_ != step_phase::closed || step_ <= 0 || !store_ || store_unreachable()) return;
  try {
    const std::string prefix = "ended/" + std::to_string(gen_.generation) + "/";
    store_->set(key(prefix + std::to_string(id_)), std::to_string(step_), store_deadline());
    std::vector<std::string> keys;
    for (const auto& m : gen_.members)
      if (m.id != id_) keys.push_back(key(prefix + std::to_string(m.id)));
    if (!keys.empty()) store_->wait(keys, deadline::after(std::min<steady_clock::duration>(opts_.lease, end_wait_max)));
  } catch (const std::exception&) {
    // A member that is gone, or one that trains on: it was waited for long enough.
  }
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::register_state(std::string name, std::span<std::byte> host_bytes) {
  if (started_)
    fail(error::invalid_state, "register_state('" + name +
                                   "') after the first begin_step: the state moved to the other members without it "
                                   "(register every buffer before training)");
  for (auto& s : state_) EBBFLOW_ENFORCE(s.name != name, "elastic group: state '" << name << "' registered twice");
  state_.push_back({std::move(name), host_bytes});
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::fail(std::error_code ec, const std::string& what) const {
  throw system_error(ec, {.rank = rank_, .generation = gen_.generation, .operation = "elastic group", .detail = what});
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::fail_job_finished(std::string_view what) const {
  fail(error::job_finished, "the job EBBFLOW_JOB='" + opts_.prefix + "' " + std::string(what));
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::restore_position(std::int64_t step, std::int64_t epoch, std::size_t cursor) {
  if (started_) fail(error::invalid_state, "restore_position after the first begin_step");
  EBBFLOW_ENFORCE(step >= 0 && step <= max_step && epoch >= 0 && epoch <= max_step && cursor < opts_.dataset_size,
                  "restore_position: step " << step << ", epoch " << epoch << ", cursor " << cursor << " (dataset_size "
                                            << opts_.dataset_size << ", steps and epochs up to 2^62)");
  // With drop_last an epoch ends before a short last batch.
  EBBFLOW_ENFORCE(!opts_.drop_last || opts_.dataset_size - cursor >= opts_.global_batch,
                  "restore_position: cursor " << cursor << " is inside the short last batch of an epoch of "
                                              << opts_.dataset_size << " with global_batch " << opts_.global_batch
                                              << " and drop_last (that batch is never trained on)");
  // The source's position reaches everybody with the state. Every member
  // keeps it: should the source die before the state moved, another member
  // may become the source with its own initial state (take_own_initial_state).
  restored_ = position{step, epoch, cursor};
  if (gen_.source != id_) return;
  step_ = step;
  epoch_ = epoch;
  cursor_ = cursor;
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::finish() {
  // The training is complete whether or not the store can record it: a
  // store that is gone is said, not thrown (the job exits as it should).
  try {
    store_->set(key("done"), "1", store_deadline());
  } catch (const system_error& e) {
    if (!store_failure(e) || !recoverable(e.code())) throw;
    EBBFLOW_LOG_WARN("the job finished, but the store could not record it ("
                     << e.what() << "): workers still waiting to join it are not told, and wait until "
                     << "EBBFLOW_JOIN_TIMEOUT_MS");
  }
}

template <kv_store Store, network Net>
bool group_impl<Store, Net>::keep_training(std::int64_t total_steps) {
  EBBFLOW_ENFORCE(total_steps >= 0 && total_steps <= max_step,
                  "keep_training: total_steps " << total_steps << " (expected 0 to 2^62)");
  if (!active_ || finished_) return false;
  // A joiner (step_ -1 until its state arrives) and a change still in flight
  // keep the loop going: the members that admitted a newcomer wait for it
  // rather than leave it stranded. Every member sees the same step_ and the
  // same change after end_step, so they all stop at the same boundary.
  if (step_ < total_steps || changing()) return true;
  // Marked once, on every member (the same key: the calls after the first
  // change nothing): a worker started later under this job is refused at
  // once (job_finished) instead of waiting out its join timeout.
  finished_ = true;
  finish();
  return false;
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::fault_point(const char* point) {
  fault_point(point, *store_, {});
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::fault_point(const char* point, Store& st, std::stop_token stop) {
  detail::fault_point(point, st, opts_.prefix, id_, store_deadline(), stop);
}

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/elastic/impl/group/lifecycle.hpp>
// #include <ebbflow/elastic/impl/group/heartbeat.hpp>  (inlined here)
// ---- begin <ebbflow/elastic/impl/group/heartbeat.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file impl/group/heartbeat.hpp
//! The heartbeat thread and leases: each beat adds to this member's counter
//! and reads, in one round trip, the counters of the members it watches (the
//! coordinator watches all, the others the coordinator), the launchers'
//! exit reports and, when stalled, the others' progress. A member silent
//! for a lease or reported gone is marked dead and its generation aborted.
//! Between beats it waits on the server for its generation's abort (and the
//! coordinator for the next join ticket).
//! Threads: heartbeat_loop, check_*, abort_* and report_stall run on the
//! heartbeat thread, on its own store client; besides the settings they touch
//! only the hb_* members (under hb_mutex_) and the atomics the training thread
//! publishes (progress_, waiting_since_, probation_end_, join_seq_hint_).
//! fresh and stale_member serve any thread, with its store and lease map.


// #include <ebbflow/elastic/detail/group_impl.hpp>  (inlined)
// #include <ebbflow/elastic/detail/store_ops.hpp>  (inlined)

#include <sstream>
#include <string>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

template <kv_store Store, network Net>
void group_impl<Store, Net>::heartbeat_loop(std::stop_token st) {
  std::unique_ptr<Store> s;
  bool warned = false;                      // a failure other than the store's was logged
  steady_clock::time_point next_warning{};  // while the store is unreachable: when to say so again
  peer_watch peers;
  std::vector<std::string> keys;
  std::vector<std::int64_t> deltas;
  std::vector<std::string> wake;  // the keys to wait for between beats
  std::vector<member_id> watched;
  std::vector<int> watched_ranks;
  std::int64_t published = 0;          // this member's progress counter in the store, as last read
  std::int64_t next_ticket = 1;        // coordinator: the first join ticket not read yet
  steady_clock::rep stall_warned = 0;  // the wait (its start) last reported
  struct {
    std::int64_t reports = 0, generation = -1;
  } gone;  // the count of exit reports last read, for the watched members of which generation
  std::int64_t round_generation = -1;  // the generation this round was for
  while (!st.stop_requested()) {
    try {
      if (!s) s = connect_store_();
      const std::int64_t g = round_generation = hb_generation_.load();
      const bool watch = hb_watch_joins_.load(std::memory_order_relaxed);
      {
        std::lock_guard lk(hb_mutex_);
        if (g >= 0 && hb_watched_gen_ == g)
          watched = hb_watched_, watched_ranks = hb_watched_ranks_;
        else
          watched.clear(), watched_ranks.clear();
      }
      // A wait in one collective longer than stall_warning: this round also
      // reads the watched members' progress, to say who is behind.
      const std::int64_t progress = progress_.load(std::memory_order_relaxed);
      const auto since = waiting_since_.load(std::memory_order_relaxed);
      const auto waited = steady_clock::now() - steady_clock::time_point(steady_clock::duration(since));
      const bool stalled = opts_.stall_warning.count() > 0 && since != 0 && since != stall_warned &&
                           waited >= opts_.stall_warning && !watched.empty();
      // One round trip: this member's heartbeat and progress, the counters of
      // the members whose leases it watches, (coordinator) the join-ticket
      // counter and (stalled) the watched members' progress.
      keys.assign({key("hb/" + std::to_string(id_))});
      deltas.assign({1});
      const bool publish = progress != published;
      if (publish) keys.push_back(key("progress/" + std::to_string(id_))), deltas.push_back(progress - published);
      const std::size_t hb_at = keys.size();
      for (auto w : watched) keys.push_back(key("hb/" + std::to_string(w))), deltas.push_back(0);
      const std::size_t join_at = keys.size();
      if (watch) keys.push_back(key("join_seq")), deltas.push_back(0);
      const std::size_t gone_at = keys.size();
      keys.push_back(opts_.gone_count_key()), deltas.push_back(0);
      const std::size_t progress_at = keys.size();
      if (stalled)
        for (auto w : watched) keys.push_back(key("progress/" + std::to_string(w))), deltas.push_back(0);
      const auto counters =
          detail::add_all(*s, keys, deltas, deadline::after(opts_.heartbeat * 4 + std::chrono::milliseconds(100)));
      if (publish) published = counters[1];
      if (watch) {
        // The new tickets first, then the hint: a step that sees the hint
        // finds them read (prefetch_tickets makes no call while none is new).
        next_ticket = prefetch_tickets(*s, counters[join_at]);
        join_seq_hint_.store(counters[join_at], std::memory_order_relaxed);
      }
      if (const auto end = probation_end_.load(std::memory_order_relaxed);
          end != 0 && steady_clock::now().time_since_epoch().count() >= end) {
        // A newcomer that stayed: its worker's join failures no longer run in a row.
        s->set(key("wkey/" + std::to_string(id_)), "", store_deadline());
        s->set(key("joinfail/" + opts_.worker_key), "0", store_deadline());
        probation_end_.store(0, std::memory_order_relaxed);
      }
      if constexpr (requires { s->erase(std::string()); }) {
        std::vector<std::string> erase;
        {
          std::lock_guard lk(hb_mutex_);
          erase.swap(hb_erase_);
        }
        for (auto& k : erase) s->erase(k);
      }
      if (g >= 0 && s->try_get(key("abort/" + std::to_string(g)), store_deadline())) {
        peers.aborted = g;
        std::lock_guard lk(hb_mutex_);
        if (hb_revoke_ && !hb_revoke_->revoked()) {
          EBBFLOW_LOG_DEBUG("generation " << g << " aborted by a peer: revoking the transport");
          hb_revoke_->revoke();
        }
      } else if (!watched.empty()) {
        // A launcher's report of an exit (report_process_exit) is read once
        // per new report, and once per generation (new members watched).
        if (const auto reports = counters[gone_at];
            g >= 0 && reports != 0 && (reports != gone.reports || g != gone.generation)) {
          check_gone(*s, g, watched, watched_ranks, peers);
          gone = {reports, g};
        }
        check_leases(*s, g, watched, std::span(counters).subspan(hb_at, watched.size()), peers);
        if (stalled && detail::progress::decode(progress).generation == detail::progress::stored_generation(g)) {
          stall_warned = since;
          report_stall(progress, waited, watched, watched_ranks,
                       std::span(counters).subspan(progress_at, watched.size()), watch);
        }
      }
      warned = false;
      if (const auto down = store_down_since_.exchange(0, std::memory_order_relaxed); down != 0)
        EBBFLOW_LOG_WARN("the store is reachable again, after " << seconds_since(down) << " s");
      // Between beats the thread waits on the server instead of sleeping:
      // for its generation's abort, which then revokes this member's
      // transport at once, not at its next beat (a survivor whose own peers
      // are alive learns of a death only this way); and the coordinator for
      // the next join ticket too, which then reaches the hint at once (one
      // counted but not yet written is the next one to wait for).
      wake.clear();
      if (watch) wake.push_back(key("join/" + std::to_string(next_ticket)));
      if (g >= 0 && g != peers.aborted) wake.push_back(key("abort/" + std::to_string(g)));
      if (!wake.empty()) {
        detail::wait_any_key(*s, wake, deadline::after(opts_.heartbeat), st);
        continue;
      }
    } catch (const std::exception& e) {
      const auto* se = dynamic_cast<const system_error*>(&e);
      if (se && store_failure(*se) && (se->code() == errc::peer_lost || se->code() == errc::timeout)) {
        note_store_unreachable(e.what(), next_warning);
      } else if (!warned) {
        EBBFLOW_LOG_WARN("heartbeat of member " << id_ << " failed: " << e.what());
        warned = true;
      }
      s.reset();
    }
    // Not a member (yet): the next round comes at the next beat, or as soon
    // as this process becomes one (it then waits for its generation's abort).
    std::unique_lock lk(hb_wake_m_);
    hb_wake_.wait_for(lk, st, opts_.heartbeat, [&] { return round_generation < 0 && hb_generation_.load() >= 0; });
  }
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::check_gone(Store& st, std::int64_t g, const std::vector<member_id>& ids,
                                        const std::vector<int>& ranks, peer_watch& w) {
  if (w.aborted == g) return;
  std::vector<std::string> keys;
  for (auto m : ids) keys.push_back(opts_.gone_key(m));
  const auto how = detail::try_get_all(st, keys, store_deadline());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (!how[i]) continue;
    if (!abort_due(st, g)) return;
    EBBFLOW_LOG_WARN("member " << ids[i] << " (rank " << ranks[i] << " of generation " << g
                               << ") is gone: its launcher saw its process exit (" << *how[i]
                               << "); aborting generation " << g << " without it");
    abort_without(st, g, ids[i], w);
    return;
  }
}

template <kv_store Store, network Net>
bool group_impl<Store, Net>::abort_due(Store& st, std::int64_t g) {
  if (st.try_get(key("done"), store_deadline())) return false;  // the job finished: its members stop and exit
  return hb_generation_.load() == g;                            // else the generation changed meanwhile
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::abort_without(Store& st, std::int64_t g, member_id m, peer_watch& w) {
  st.set(dead_key(g, m), "1", store_deadline());
  st.set(key("abort/" + std::to_string(g)), "1", store_deadline());
  w.aborted = g;
  std::lock_guard lk(hb_mutex_);
  if (hb_revoke_ && !hb_revoke_->revoked()) hb_revoke_->revoke();
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::check_leases(Store& st, std::int64_t g, const std::vector<member_id>& ids,
                                          std::span<const std::int64_t> hb, peer_watch& w) {
  // A member that hangs inside a collective (a stopped process, a livelock)
  // fails no transport operation: without this, its peers would wait for the
  // collective's deadline (op_timeout). Its silent lease aborts the step.
  const auto now = steady_clock::now();
  if (w.generation != g || now - w.last_round > opts_.lease / 2) {
    // A new generation, or a gap in this thread's own rounds (it was
    // descheduled, the machine paused): that says nothing of the others, so
    // their leases are timed afresh.
    w.seen.clear();
    w.generation = g;
  }
  w.last_round = now;
  if (w.aborted == g) return;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (fresh(ids[i], hb[i], now, w.seen)) continue;
    if (!abort_due(st, g)) return;
    EBBFLOW_LOG_WARN("member " << ids[i] << " sent no heartbeat for EBBFLOW_LEASE_MS="
                               << std::chrono::duration_cast<std::chrono::milliseconds>(opts_.lease).count()
                               << " ms: aborting generation " << g << " without it");
    abort_without(st, g, ids[i], w);
    return;
  }
}

template <kv_store Store, network Net>
bool group_impl<Store, Net>::fresh(Store& st, member_id m, lease_seen& seen) const {
  const std::int64_t hb = st.add(key("hb/" + std::to_string(m)), 0, store_deadline());
  return fresh(m, hb, steady_clock::now(), seen);
}

template <kv_store Store, network Net>
bool group_impl<Store, Net>::fresh(member_id m, std::int64_t hb, steady_clock::time_point now, lease_seen& seen) const {
  auto it = seen.find(m);
  if (it == seen.end()) {
    seen.emplace(m, std::make_pair(hb, now));
    return true;
  }
  if (it->second.first != hb) {
    it->second = {hb, now};
    return true;
  }
  return now - it->second.second < opts_.lease;
}

template <kv_store Store, network Net>
int group_impl<Store, Net>::stale_member(const detail::generation_record& rec, lease_watch& w, bool joiners_only) {
  // The rank in `rec` of a member (other than this one; with `joiners_only`,
  // a joiner) whose lease expired, else -1. Reads the store at most once per
  // heartbeat period.
  const auto now = steady_clock::now();
  if (now < w.next_check) return -1;
  w.next_check = now + opts_.heartbeat;
  for (std::size_t j = 0; j < rec.members.size(); ++j) {
    const auto& m = rec.members[j];
    if (m.id == id_ || (joiners_only && m.committed >= 0)) continue;
    if (!fresh(*store_, m.id, w.seen)) return static_cast<int>(j);
  }
  return -1;
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::report_stall(std::int64_t mine, steady_clock::duration waited,
                                          const std::vector<member_id>& ids, const std::vector<int>& ranks,
                                          std::span<const std::int64_t> progress, bool coordinator) const {
  std::string behind;
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (progress[i] < mine)
      behind += (behind.empty() ? "" : ", ") + std::to_string(ids[i]) + " (rank " + std::to_string(ranks[i]) +
                (coordinator ? ")" : ", the coordinator)");
  const auto ms = [](auto d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); };
  std::ostringstream where;
  const auto at = detail::progress::decode(mine);
  where << "generation " << at.generation << ": member " << id_ << " has waited " << ms(waited) << " ms in ";
  if (at.collective == 0)
    where << "the control exchange after step " << at.step - 1;
  else
    where << "collective " << at.collective << " of step " << at.step;
  if (behind.empty()) {
    // A member this one does not watch is behind: the coordinator names it.
    EBBFLOW_LOG_DEBUG(where.str() << "; the members it watches have reached it");
    return;
  }
  EBBFLOW_LOG_WARN(where.str() << "; member(s) " << behind
                               << " have not reached it while their heartbeats go on (a training thread stuck "
                                  "outside ebbflow, e.g. in a data loader or a lock, or a collective skipped); "
                                  "EBBFLOW_OP_TIMEOUT_MS="
                               << ms(opts_.op_timeout) << " ms after it began, the step aborts and the group "
                               << "goes on without them");
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::note_store_unreachable(const char* why, steady_clock::time_point& next_warning) {
  // Training goes on without the store (a steady step makes no store call),
  // but nothing that needs it can happen: said at once, and again every
  // store_warning_period while it lasts. Meanwhile every store call of this
  // member fails within a lease (store_deadline).
  const auto now = steady_clock::now();
  steady_clock::rep since = 0;
  if (store_down_since_.compare_exchange_strong(since, now.time_since_epoch().count(), std::memory_order_relaxed)) {
    since = now.time_since_epoch().count();
    next_warning = now;
  }
  if (now < next_warning) return;
  next_warning = now + store_warning_period;
  const auto down_s = seconds_since(since);
  EBBFLOW_LOG_WARN("the store " << (down_s > 0 ? "has been unreachable for " + std::to_string(down_s) + " s"
                                               : std::string("cannot be reached"))
                                << " (" << why
                                << "): training goes on, but no worker can join, leave or fail over until it is back "
                                   "(docs/elastic.md, \"When the store dies\")");
}

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/elastic/impl/group/heartbeat.hpp>
// #include <ebbflow/elastic/impl/group/formation.hpp>  (inlined here)
// ---- begin <ebbflow/elastic/impl/group/formation.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file impl/group/formation.hpp
//! Becoming a member: generation 0 formed from the launched workers (launch
//! rank 0 proposes it once all registered or after `initial_wait`; the
//! others take over when it never came), and a newcomer's join ticket and
//! its wait for admission (with the join cool-down).
//! Training thread only.


// #include <ebbflow/elastic/detail/group_impl.hpp>  (inlined)
// #include <ebbflow/elastic/detail/store_ops.hpp>  (inlined)

#include <algorithm>
#include <sstream>
#include <string>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

template <kv_store Store, network Net>
void group_impl<Store, Net>::propose_initial(const std::vector<std::optional<std::string>>& registered) {
  detail::generation_record rec;
  rec.generation = 0;
  rec.reason = change_reason::initial;
  std::vector<member_id> ids;
  std::string missing, over;
  for (std::size_t r = 0; r < registered.size(); ++r) {
    if (!registered[r]) {
      detail::append_listed(missing, std::to_string(r));
      continue;
    }
    const member_id m = detail::parse_i64(*registered[r]);
    if (static_cast<int>(ids.size()) >= opts_.max_size && m != id_) {
      detail::append_listed(over, std::to_string(r));
      continue;
    }
    rec.members.push_back({m, m == id_ ? 0 : -1});  // the proposer holds the initial state
    ids.push_back(m);
  }
  if (!over.empty())
    EBBFLOW_LOG_WARN("launch rank(s) " << over << " above EBBFLOW_MAX_SIZE=" << opts_.max_size
                                       << ": they wait to join as newcomers");
  // Launch rank 0 names the workers it starts without; another launch rank
  // proposes only when rank 0 is gone, and has said so (form_initial).
  if (!missing.empty() && launch_.rank == 0)
    EBBFLOW_LOG_WARN("initial worker(s) " << missing << " did not register within EBBFLOW_INITIAL_WAIT_MS="
                                          << opts_.initial_wait.count() << " ms: starting with " << ids.size() << " of "
                                          << registered.size() << "; a late one joins as a newcomer");
  rec.source = id_;
  rec.source_step = 0;
  auto p = plan_of(ids);
  rec.plan.assign(p.begin(), p.end());
  rec.plan_version = 1;
  rec.joins_seen = 0;
  const std::string mine = to_value(rec.encode());
  if (store_->compare_set(gen_key(0), "", mine, store_deadline()).current == mine) step_ = 0;
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::form_initial() {
  const auto started = steady_clock::now();
  store_->set(key("init/" + std::to_string(launch_.rank)), std::to_string(id_), store_deadline());
  const std::string gkey = gen_key(0);
  std::vector<std::string> keys;
  for (int r = 0; r < launch_.world_size; ++r) keys.push_back(key("init/" + std::to_string(r)));
  const auto overall = deadline::after(opts_.join_timeout);
  const auto registered = [&] {
    auto got = detail::try_get_all(*store_, keys, store_deadline());
    return std::pair{got,
                     static_cast<int>(std::count_if(got.begin(), got.end(), [](auto& v) { return v.has_value(); }))};
  };
  if (launch_.rank == 0) {
    // Every launched worker, for up to initial_wait; then those registered,
    // if at least min_size (a worker that died while starting must not stop
    // the job), waiting on for min_size of them until join_timeout.
    const auto all_by = std::min(deadline::after(opts_.initial_wait).at(), overall.at());
    for (bool first = true;; first = false) {
      try {
        store_->wait(keys, first ? deadline(all_by) : deadline::after(std::chrono::milliseconds(100)));
      } catch (const system_error& e) {
        if (e.code() != errc::timeout) throw;
      }
      auto [got, present] = registered();
      if (present == launch_.world_size || present >= opts_.min_size) {
        propose_initial(got);
        break;
      }
      if (overall.expired())
        fail(error::timeout, "only " + std::to_string(present) + " of the " + std::to_string(launch_.world_size) +
                                 " initial workers registered within EBBFLOW_JOIN_TIMEOUT_MS, fewer than "
                                 "EBBFLOW_MIN_SIZE=" +
                                 std::to_string(opts_.min_size));
    }
  } else {
    // Launch rank 0 writes generation 0 within initial_wait. If it has not
    // by then (plus a lease) and it never registered or its heartbeat has
    // stopped, the registered workers propose generation 0 without it: the
    // first compare-and-set wins.
    const auto takeover_at = deadline::after(opts_.initial_wait + opts_.lease);
    lease_seen seen;
    for (;;) {
      try {
        const bool early = !takeover_at.expired();
        store_->wait({gkey}, early ? deadline(std::min(takeover_at.at(), overall.at()))
                                   : deadline::after(std::chrono::milliseconds(100)));
        break;
      } catch (const system_error& e) {
        if (e.code() != errc::timeout) throw;
      }
      if (overall.expired())
        fail(error::timeout, "the initial generation was not formed within EBBFLOW_JOIN_TIMEOUT_MS");
      if (!takeover_at.expired()) continue;
      auto [got, present] = registered();
      if (got[0] && fresh(*store_, detail::parse_i64(*got[0]), seen)) continue;  // rank 0 lives: it decides
      if (got[0]) got[0].reset(), --present;
      if (present >= opts_.min_size) {
        EBBFLOW_LOG_WARN("launch rank 0 did not form the initial generation within EBBFLOW_INITIAL_WAIT_MS="
                         << opts_.initial_wait.count() << " ms ("
                         << (seen.empty() ? "it never registered" : "its heartbeat stopped") << "): launch rank "
                         << launch_.rank << " proposes it without rank 0");
        propose_initial(got);
        break;
      }
    }
  }
  auto rec = detail::generation_record::decode(to_bytes(*store_->try_get(gkey, store_deadline())));
  if (rec.rank_of(id_) < 0) {  // registered after the initial generation was formed without it
    EBBFLOW_LOG_WARN("the initial generation was formed without launch rank " << launch_.rank
                                                                              << ": joining as a newcomer");
    wait_admission();
    return;
  }
  adopt_or_recover(std::move(rec), started);
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::wait_admission() {
  const auto started = steady_clock::now();
  step_ = -1;
  own_initial_state_ = false;  // the group went on without this member: its buffers are not the job's
  const bool cooldown = opts_.join_cooldown.count() > 0;
  // Until its probation ends, a newcomer that dies counts as a join failure
  // of its worker (count_join_failures).
  if (cooldown) store_->set(key("wkey/" + std::to_string(id_)), opts_.worker_key, store_deadline());
  const std::string jkey = key("joined/" + std::to_string(id_));
  // A member left out of its generation rejoins here; its key still names
  // the generation it was admitted to before, which it must not adopt again.
  const std::int64_t left = gen_.generation;
  const auto admitted = [&]() -> bool {
    auto v = store_->try_get(jkey, store_deadline());
    if (!v) return false;
    const auto g = detail::parse_i64(*v);
    if (g <= left) return false;
    if (cooldown)
      probation_end_.store((steady_clock::now() + opts_.join_cooldown_max).time_since_epoch().count(),
                           std::memory_order_relaxed);
    adopt_or_recover(detail::generation_record::decode(to_bytes(*store_->try_get(gen_key(g), store_deadline()))),
                     started);
    return true;
  };
  // A leave request (SIGTERM through leave_on_signal: the launcher retiring
  // its newest worker) ends the wait: this worker leaves without joining.
  // Were it admitted meanwhile, the others find its lease expired.
  const auto asked_to_leave = [&] {
    if (detail::signal_leave_flag().load()) leave_requested_.store(true);
    if (!leave_requested_.load()) return false;
    EBBFLOW_LOG_INFO("member " << id_ << " asked to leave while waiting to be admitted: leaving without joining");
    leave_now();
    return true;
  };
  // Waits on the server (no polling: waiting newcomers cost the running
  // members nothing), in slices so the job's end is noticed.
  const auto wait_slice = [&](const deadline& d) {
    if (job_done()) fail_job_finished("finished before this worker was admitted");
    try {
      store_->wait({jkey}, min(d, deadline::after(std::chrono::milliseconds(200))));
    } catch (const system_error& e) {
      if (e.code() != errc::timeout) throw;
    }
  };
  std::int64_t held_for = 0;  // join failures in a row whose cool-down this worker waited out
  for (;;) {                  // one ticket per pass; a cool-down answer starts the next
    const auto seq = store_->add(key("join_seq"), 1, store_deadline());
    store_->set(key("join/" + std::to_string(seq)),
                std::to_string(id_) + " " + std::to_string(held_for) + " " + opts_.worker_key, store_deadline());
    EBBFLOW_LOG_INFO("member " << id_ << " waiting to be admitted (join ticket " << seq << ")");
    const auto d = deadline::after(opts_.join_timeout);
    const std::string hkey = key("held/" + std::to_string(seq));
    std::optional<std::string> hold;
    while (!hold) {
      if (admitted() || asked_to_leave()) return;
      if (cooldown) hold = store_->try_get(hkey, store_deadline());
      if (hold) break;
      if (d.expired())
        fail(error::timeout, "not admitted within EBBFLOW_JOIN_TIMEOUT_MS (group at max size, or no coordinator)");
      wait_slice(d);
    }
    std::istringstream in(*hold);
    std::int64_t ms = 0;
    in >> ms >> held_for;
    EBBFLOW_LOG_WARN("worker '" << opts_.worker_key << "' failed " << held_for
                                << " times in a row while joining: held back " << static_cast<double>(ms) / 1000
                                << " s (EBBFLOW_JOIN_COOLDOWN)");
    const auto until = deadline::after(std::chrono::milliseconds(ms));
    while (!until.expired()) {
      if (admitted() || asked_to_leave()) return;  // an older ticket of this member was admitted after all
      wait_slice(until);
    }
  }
}

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/elastic/impl/group/formation.hpp>
// #include <ebbflow/elastic/impl/group/generation.hpp>  (inlined here)
// ---- begin <ebbflow/elastic/impl/group/generation.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file impl/group/generation.hpp
//! Entering a generation: publishing and gathering the members' addresses,
//! wiring up its transport while watching leases, installing it (the old
//! one closes in the background), handing the heartbeat thread what to
//! watch, and the members' scheduling; leaving the group.
//! Training thread, except gather_addresses(rec, st, ...), which the
//! admission helper also calls with its own store.


// #include <ebbflow/elastic/detail/group_impl.hpp>  (inlined)
// #include <ebbflow/elastic/detail/scheduling.hpp>  (inlined here)
// ---- begin <ebbflow/elastic/detail/scheduling.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file detail/scheduling.hpp
//! Linux scheduling of the elastic group's threads: the priority a joiner
//! started lower gets back (EBBFLOW_JOIN_NICE), the members' scheduler slice
//! (EBBFLOW_SCHED_SLICE_US), their real-time class (EBBFLOW_RT_PRIORITY), and
//! the lowest priority of the admission helper. docs/elastic.md says when each
//! helps. Failures are logged, never thrown: training goes on without them.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/env.hpp>  (inlined)
// #include <ebbflow/core/log.hpp>  (inlined)

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <span>
#include <system_error>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

// Calls f(tid) for every thread of this process (threads that end meanwhile
// are the callee's to skip: their calls fail).
template <class F>
void for_each_thread(F&& f) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task", ec))
    f(static_cast<pid_t>(std::strtol(e.path().filename().c_str(), nullptr, 10)));
}

// A joiner started with `ebbflow-run --join-nice N` runs N nice levels
// lower until the members switch to the generation that includes it (its
// start-up, connect and wait then do not slow the members on a shared host);
// it gets its priority back here, when the state starts to move. Linux nice values are per
// thread, so every thread of the process is raised again.
inline void restore_join_priority() {
  const auto n = env::get_int("EBBFLOW_JOIN_NICE", 0, 0, 19);
  if (n == 0) return;
  int failed = 0, err = 0;
  for_each_thread([&](pid_t t) {
    const auto tid = static_cast<id_t>(t);
    errno = 0;
    const int cur = ::getpriority(PRIO_PROCESS, tid);
    if (errno != 0) return;
    if (::setpriority(PRIO_PROCESS, tid, std::max(-20, cur - static_cast<int>(n))) != 0) {
      ++failed;
      err = errno;
    }
  });
  if (failed)
    EBBFLOW_LOG_WARN("admitted, but the CPU priority lowered by EBBFLOW_JOIN_NICE="
                     << n << " could not be restored (" << std::strerror(err) << "; needs CAP_SYS_NICE)");
  else
    EBBFLOW_LOG_INFO("the members switched: CPU priority raised back by EBBFLOW_JOIN_NICE="
                     << n << " (nice now " << ::getpriority(PRIO_PROCESS, 0) << ")");
}

// group_options::sched_slice: every thread of this process asks for a
// scheduler slice of `slice` (Linux 6.12+ EEVDF custom slices: sched_setattr
// with sched_runtime, keeping each thread's policy and nice; threads created
// later inherit it). Real-time and deadline threads are left alone. A
// kernel without per-task slices accepts and ignores the request: read
// back, that is logged once.
inline void request_sched_slice(std::chrono::microseconds slice) {
  struct sched_attr_v0 {  // struct sched_attr, SCHED_ATTR_SIZE_VER0 (glibc 2.36 has no wrapper)
    std::uint32_t size;
    std::uint32_t sched_policy;
    std::uint64_t sched_flags;
    std::int32_t sched_nice;
    std::uint32_t sched_priority;
    std::uint64_t sched_runtime;
    std::uint64_t sched_deadline;
    std::uint64_t sched_period;
  };
  static_assert(sizeof(sched_attr_v0) == 48);
  const auto ns = static_cast<std::uint64_t>(std::chrono::nanoseconds(slice).count());
  int failed = 0, err = 0, set = 0;
  for_each_thread([&](pid_t tid) {
    const int policy = ::sched_getscheduler(tid);
    if (policy < 0) return;  // the thread ended
    const int base = policy & ~SCHED_RESET_ON_FORK;
    if (base != SCHED_OTHER && base != SCHED_BATCH && base != SCHED_IDLE) return;
    errno = 0;
    const int nice = ::getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
    if (errno != 0) return;
    sched_attr_v0 a{};
    a.size = sizeof a;
    a.sched_policy = static_cast<std::uint32_t>(base);
    a.sched_flags = (policy & SCHED_RESET_ON_FORK) ? 0x01 : 0;  // SCHED_FLAG_RESET_ON_FORK
    a.sched_nice = nice;
    a.sched_runtime = ns;
    if (::syscall(SYS_sched_setattr, tid, &a, 0) != 0) {
      ++failed;
      err = errno;
    } else {
      ++set;
    }
  });
  sched_attr_v0 back{};
  const bool honoured =
      set > 0 && ::syscall(SYS_sched_getattr, 0, &back, sizeof back, 0) == 0 && back.sched_runtime == ns;
  if (failed)
    EBBFLOW_LOG_WARN("EBBFLOW_SCHED_SLICE_US=" << slice.count() << ": " << failed << " thread(s) refused ("
                                               << std::strerror(err) << ")");
  else if (!honoured)
    EBBFLOW_LOG_WARN("EBBFLOW_SCHED_SLICE_US=" << slice.count()
                                               << " has no effect: this kernel keeps no per-task slice (Linux 6.12+)");
  else
    EBBFLOW_LOG_INFO("scheduler slice " << slice.count() << " us for " << set << " thread(s)");
}

// group_options::rt_priority: the given threads (the group's: the thread
// that trains, its heartbeat) run under SCHED_RR at `priority`, with
// SCHED_RESET_ON_FORK: threads and processes they start later (clone resets
// it for both) are normal ones. Threads not named here stay normal: a
// real-time thread that spins while a normal one holds what it waits for
// keeps the core from it (UCX's progress thread at real-time priority kept
// the admission helper off both cores over tcp until the kernel throttled
// it).
inline void request_rt_priority(int priority, std::span<const pthread_t> threads) {
  int failed = 0, err = 0, set = 0;
  sched_param p{};
  p.sched_priority = priority;
  for (const pthread_t t : threads) {
    if (const int e = ::pthread_setschedparam(t, SCHED_RR | SCHED_RESET_ON_FORK, &p); e == 0) {
      ++set;
    } else {
      ++failed;
      err = e;
    }
  }
  if (failed)
    EBBFLOW_LOG_WARN("EBBFLOW_RT_PRIORITY=" << priority << ": " << failed << " thread(s) refused ("
                                            << std::strerror(err) << "; needs CAP_SYS_NICE or RLIMIT_RTPRIO >= "
                                            << priority << "), they stay normal threads");
  else
    EBBFLOW_LOG_INFO("SCHED_RR priority " << priority << " for " << set << " thread(s)");
}

// The calling thread at the lowest CPU priority of a normal thread: nice 19,
// and out of the real-time class that group_options::rt_priority may have
// handed down from the thread that started it.
inline void lowest_cpu_priority() {
  const int policy = ::sched_getscheduler(0) & ~SCHED_RESET_ON_FORK;
  if (policy == SCHED_RR || policy == SCHED_FIFO) {
    sched_param p{};
    ::sched_setscheduler(0, SCHED_OTHER, &p);  // lowering needs no privilege
  }
  const auto tid = static_cast<id_t>(::gettid());
  errno = 0;
  if (const int cur = ::getpriority(PRIO_PROCESS, tid); errno == 0) ::setpriority(PRIO_PROCESS, tid, std::max(cur, 19));
}

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/elastic/detail/scheduling.hpp>
// #include <ebbflow/elastic/detail/store_ops.hpp>  (inlined)

#include <pthread.h>
#include <string>
#include <thread>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

template <kv_store Store, network Net>
std::vector<bytes> group_impl<Store, Net>::gather_addresses(const detail::generation_record& rec) {
  return gather_addresses(rec, *store_, address_cache_, rank_, revoke_, {});
}

template <kv_store Store, network Net>
std::vector<bytes> group_impl<Store, Net>::gather_addresses(const detail::generation_record& rec, Store& st,
                                                            std::map<member_id, bytes>& cache, int rank,
                                                            const std::shared_ptr<comm::revoke_flag>& revoke,
                                                            std::stop_token stop) {
  // Every member publishes the address of its endpoint for this generation;
  // a member that stops heartbeating before it published is reported lost,
  // so the others fail over instead of waiting for the full deadline.
  constexpr bool stable = detail::stable_address<Net>();
  const std::string gs = std::to_string(rec.generation);
  std::vector<std::optional<bytes>> found(rec.members.size());
  if constexpr (stable)
    for (std::size_t j = 0; j < found.size(); ++j)
      if (auto it = cache.find(rec.members[j].id); it != cache.end()) found[j] = it->second;
  std::size_t cached = 0;
  for (auto& f : found) cached += f.has_value();
  lease_seen hb;
  const auto d = deadline::after(opts_.op_timeout);
  for (std::size_t missing = found.size() - cached;;) {
    std::vector<std::size_t> which;
    std::vector<std::string> keys;
    for (std::size_t j = 0; j < found.size(); ++j) {
      if (found[j]) continue;
      const member_id m = rec.members[j].id;
      which.push_back(j);
      keys.push_back(stable ? key("addr/" + std::to_string(m)) : key("addr/" + gs + "/" + std::to_string(m)));
    }
    auto values = detail::try_get_all(st, keys, store_deadline());
    for (std::size_t i = 0; i < which.size(); ++i) {
      const std::size_t j = which[i];
      const member_id m = rec.members[j].id;
      if (auto& v = values[i]) {
        found[j] = to_bytes(*v);
        if constexpr (stable) cache[m] = *found[j];
        --missing;
      } else if (!fresh(st, m, hb)) {
        throw system_error(make_error_code(error::peer_lost),
                           {.rank = rank,
                            .generation = rec.generation,
                            .peer = static_cast<int>(j),
                            .operation = "connect",
                            .detail = "member " + std::to_string(m) + " stopped before publishing its address"});
      }
    }
    if (missing == 0) break;
    if ((revoke && revoke->revoked()) || stop.stop_requested())
      throw system_error(make_error_code(error::revoked),
                         {.rank = rank, .generation = rec.generation, .operation = "connect"});
    if (d.expired())
      throw system_error(make_error_code(error::timeout),
                         {.rank = rank,
                          .generation = rec.generation,
                          .operation = "connect",
                          .detail = std::to_string(missing) + " members published no address"});
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  std::vector<bytes> out;
  for (auto& f : found) out.push_back(std::move(*f));
  return out;
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::enter(detail::generation_record rec) {
  // Becomes a member of `rec`'s generation: rank, revocation flag watched by
  // the heartbeat thread; the old transport is released.
  const int r = rec.rank_of(id_);
  EBBFLOW_EXPECTS(r >= 0);
  if (!opts_.join) became_member();  // a newcomer becomes one at the switch (sync_state)
  gen_ = std::move(rec);
  rank_ = r;
  log::set_rank(rank_);
  revoke_ = std::make_shared<comm::revoke_flag>();
  {
    std::lock_guard lk(hb_mutex_);
    hb_revoke_ = revoke_;
    hb_watched_gen_ = gen_.generation;
    hb_watched_.clear();
    hb_watched_ranks_.clear();
    for (std::size_t j = 0; j < gen_.members.size(); ++j)
      if (gen_.members[j].id != id_ && (rank_ == 0 || j == 0)) {
        hb_watched_.push_back(gen_.members[j].id);
        hb_watched_ranks_.push_back(static_cast<int>(j));
      }
  }
  hb_tickets_floor_.store(gen_.joins_seen, std::memory_order_relaxed);
  // Join-failure counts the heartbeat thread read are kept only while this
  // member stays the coordinator and no failure intervenes (the recovery's
  // coordinator counted it before it wrote this generation's record).
  if (gen_.reason == change_reason::failure || !hb_watch_joins_.load(std::memory_order_relaxed))
    failures_epoch_.fetch_add(1, std::memory_order_acq_rel);
  hb_generation_.store(gen_.generation);
  hb_watch_joins_.store(rank_ == 0, std::memory_order_relaxed);
  {
    std::lock_guard lk(hb_wake_m_);  // the heartbeat thread sees the generation before it waits, or is woken
  }
  hb_wake_.notify_all();
  comm_.reset();
  transport_.reset();
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::became_member() {
  // The one moment this process starts doing the members' work: a launched
  // worker as it enters its first generation, a newcomer once the members
  // switched to its generation and the state starts to move (until then its
  // start-up and waits leave the CPU to them). It gets back the priority
  // --join-nice took, and takes the members' scheduling.
  if (became_member_) return;
  became_member_ = true;
  if (opts_.join) detail::restore_join_priority();
  take_member_scheduling();
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::take_member_scheduling() {
  // The scheduler slice, then the real-time class (a slice is asked for on
  // a normal thread only). A newcomer with a real-time priority takes both
  // as it starts to wait for the members' switch (sync_state): from there it
  // only waits, and once they switch the members wait for it. As an equal
  // real-time thread it then runs as soon as a member waiting for it yields,
  // not only once that member's wait stops spinning and sleeps.
  if (member_scheduling_) return;
  member_scheduling_ = true;
  if (opts_.sched_slice.count() > 0) detail::request_sched_slice(opts_.sched_slice);
  if (opts_.rt_priority > 0) {
    // The thread that trains (this one) and the heartbeat, which finds a
    // dead member: the group's threads; the others stay normal.
    const pthread_t mine[] = {::pthread_self(), heartbeat_.native_handle()};
    detail::request_rt_priority(opts_.rt_priority, std::span<const pthread_t>(mine, heartbeat_.joinable() ? 2 : 1));
  }
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::adopt(detail::generation_record rec, steady_clock::time_point started,
                                   std::optional<typename Net::transport_type> begun) {
  next_.reset();
  const int old_size = static_cast<int>(gen_.members.size());
  enter(std::move(rec));
  const auto t0 = steady_clock::now();
  if constexpr (!detail::stable_address<Net>()) {
    if (!begun) {
      const bytes mine = net_->prepare(gen_.generation);
      store_->set(key("addr/" + std::to_string(gen_.generation) + "/" + std::to_string(id_)), to_value(mine),
                  store_deadline());
    }
  }
  const auto t1 = steady_clock::now();
  if (opts_.join && step_ < 0) fault_point("join-connect");
  auto addrs = begun ? std::vector<bytes>{} : gather_addresses(gen_);
  const auto t2 = steady_clock::now();
  transport_.emplace(connect_watched(gen_, addrs, std::move(begun)), revoke_);
  comm_.emplace(*transport_, coll_opts_);
  const auto t3 = steady_clock::now();
  auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  EBBFLOW_LOG_INFO("generation " << gen_.generation << " connect: prepare " << ms(t0, t1) << " ms, addresses "
                                 << ms(t1, t2) << " ms, wire-up " << ms(t2, t3) << " ms");
  // The state moves at the next begin_step: a newcomer registers its buffers
  // after the constructor returned.
  if (!pending_) pending_ = pending_change{gen_.reason, old_size, started};
  pending_->reason = gen_.reason;
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::adopt_or_recover(detail::generation_record rec, steady_clock::time_point started,
                                              std::optional<typename Net::transport_type> begun) {
  const std::int64_t g = rec.generation;
  try {
    adopt(std::move(rec), started, std::move(begun));
  } catch (const system_error& e) {
    if (!detail::recoverable(e.code())) throw;
    recover(g, lost_in_adopt(e));
  }
}

template <kv_store Store, network Net>
typename Net::transport_type group_impl<Store, Net>::connect_watched(
    const detail::generation_record& rec, const std::vector<bytes>& addrs,
    std::optional<typename Net::transport_type> begun) {
  const auto d = deadline::after(opts_.op_timeout);
  if constexpr (detail::can_preconnect<Net>()) {
    // Wire up while watching the members' leases: a member that died before
    // it connected (UCX may only notice at its own timeout) is reported lost
    // within about one lease, and the group fails over instead of waiting.
    // A transport already started for this generation has taken its peers'
    // wire-up messages: it must be the one that finishes (they come once).
    auto t = begun ? std::move(*begun) : net_->start_connect(rec.generation, rank_, addrs);
    lease_watch leases;
    while (!t.poll_connect()) {
      if (revoke_ && revoke_->revoked())
        throw system_error(make_error_code(error::revoked),
                           {.rank = rank_, .generation = rec.generation, .operation = "connect"});
      if (d.expired())
        throw system_error(make_error_code(error::timeout),
                           {.rank = rank_, .generation = rec.generation, .operation = "connect"});
      if (const int j = stale_member(rec, leases, false); j >= 0)
        throw system_error(make_error_code(error::peer_lost),
                           {.rank = rank_,
                            .generation = rec.generation,
                            .peer = j,
                            .operation = "connect",
                            .detail = "member " + std::to_string(rec.members[static_cast<std::size_t>(j)].id) +
                                      " stopped heartbeating"});
      // A newcomer connects while the members train: poll gently so its
      // wait costs them no CPU (on a shared host it would take their cores).
      // A real-time member sleeps between polls too: yielding, it would
      // keep the core from the normal threads the wire-up may wait for.
      if (opts_.join && step_ < 0)
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      else if (member_scheduling_ && opts_.rt_priority > 0)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      else
        std::this_thread::yield();
    }
    return t;
  } else {
    (void)begun;
    return net_->connect(rec.generation, rank_, addrs, d);
  }
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::install(detail::generation_record rec, typename Net::transport_type t,
                                     steady_clock::time_point started, double prepared_seconds) {
  const int old_size = static_cast<int>(gen_.members.size());
  comm_.reset();  // before its transport moves away (enter() resets the rest)
  if constexpr (requires(typename Net::transport_type & x) {
                  x.start_close();
                  { x.poll_close() } -> std::convertible_to<bool>;
                }) {
    // Close the replaced generation's endpoints in the background: over tcp
    // their flush takes round trips that would otherwise stall the switch.
    if (transport_) {
      retiring_.reset();  // an older one still closing: finish it (bounded)
      retiring_.emplace(std::move(transport_->inner()));
      transport_.reset();
      retiring_->start_close();
    }
  }
  if constexpr (requires { t.reused_endpoints(); })
    EBBFLOW_LOG_INFO("generation " << rec.generation << ": " << t.reused_endpoints() << " of " << rec.members.size() - 1
                                   << " endpoints kept from generation " << gen_.generation);
  enter(std::move(rec));
  transport_.emplace(std::move(t), revoke_);
  comm_.emplace(*transport_, coll_opts_);
  if (!pending_) pending_ = pending_change{gen_.reason, old_size, started, prepared_seconds};
  pending_->reason = gen_.reason;
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::leave_now() {
  active_ = false;
  EBBFLOW_LOG_INFO("member " << id_ << " left the group after step " << step_);
  hb_generation_.store(-1);
  next_.reset();
  comm_.reset();
  transport_.reset();
  heartbeat_.request_stop();
}

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/elastic/impl/group/generation.hpp>
// #include <ebbflow/elastic/impl/group/state_transfer.hpp>  (inlined here)
// ---- begin <ebbflow/elastic/impl/group/state_transfer.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file impl/group/state_transfer.hpp
//! Streaming the committed state (registered buffers plus step, epoch and
//! cursor) from the members holding the newest step to those that lack it,
//! over the new generation's point-to-point tags; a launched worker
//! receives into a staging copy so a sender's death leaves its own state.
//! Training thread only.


// #include <ebbflow/elastic/detail/group_impl.hpp>  (inlined)
// #include <ebbflow/elastic/detail/wire.hpp>  (inlined)

#include <algorithm>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

template <kv_store Store, network Net>
void group_impl<Store, Net>::sync_state() {
  if (gen_.source == id_ && step_ < 0) take_own_initial_state();
  const auto d = deadline::after(opts_.op_timeout);
  auto& c = *comm_;
  auto raw = [](void* p, std::size_t n) { return buffer_view{p, n, dtype::u8, memory_space::host}; };
  // Point-to-point tags of the state transfer (collectives never use p2p tags).
  constexpr std::uint32_t tag_size = 1, tag_header = 2, tag_first = 3;
  // Every member holding the newest state (they committed the same steps,
  // so they hold the same bits) serves a share of those that lack it:
  // receiver i (in rank order) gets it from holder i mod S, so k newcomers
  // cost the members about k/S transfers' time, not k.
  std::vector<std::size_t> holders, receivers;
  for (std::size_t j = 0; j < gen_.members.size(); ++j)
    (gen_.members[j].committed >= gen_.source_step ? holders : receivers).push_back(j);
  if (holders.empty() && !receivers.empty())
    fail(error::invalid_state, "no member of generation " + std::to_string(gen_.generation) + " holds the state");
  auto sender_of = [&](std::size_t i) { return holders[i % holders.size()]; };
  const auto me = static_cast<std::size_t>(rank_);
  std::vector<std::size_t> to;  // the receivers this member serves
  for (std::size_t i = 0; i < receivers.size(); ++i)
    if (sender_of(i) == me) to.push_back(receivers[i]);
  if (!to.empty()) {
    if (gen_.generation == 0) fault_point("initial-sync");  // formed generation 0; nothing sent yet
    detail::writer w;
    w.put(step_).put(epoch_).put<std::uint64_t>(cursor_).put<std::uint64_t>(state_.size());
    for (auto& s : state_) {
      w.put_bytes(elastic::to_bytes(s.name));
      w.put<std::uint64_t>(s.data.size());
    }
    bytes header = w.take();
    std::uint64_t header_size = header.size();
    // Post every send to every receiver first, then wait: the receivers
    // are served in parallel, and a slow one does not hold up the others.
    std::vector<comm::request<transport_type>> sends;
    for (auto j : to) {
      const int peer = static_cast<int>(j);
      sends.push_back(c.isend(raw(&header_size, sizeof header_size), peer, tag_size));
      sends.push_back(c.isend(raw(header.data(), header.size()), peer, tag_header));
    }
    if (step_ > 0) fault_point("sync-send");
    for (std::size_t k = 0; k < state_.size(); ++k) {
      for (auto j : to)
        sends.push_back(c.isend(raw(state_[k].data.data(), state_[k].data.size()), static_cast<int>(j),
                                tag_first + static_cast<std::uint32_t>(k)));
      if (k == 0 && gen_.generation == 0) fault_point("initial-sync-part");  // headers and first buffers posted
    }
    for (auto& r : sends) r.wait(d);
    for (auto j : to)
      EBBFLOW_LOG_INFO("sent state of step " << step_ << " to member " << gen_.members[j].id << " (rank " << j << ")");
  } else if (const auto it = std::ranges::find(receivers, me); it != receivers.end()) {
    const auto from = sender_of(static_cast<std::size_t>(it - receivers.begin()));
    const int src = static_cast<int>(from);
    const member_id source = gen_.members[from].id;
    std::uint64_t header_size = 0;
    {
      // A newcomer waits here until the members switch, which may be many
      // steps away: poll gently (the members' CPU is not ours to spin on),
      // then take the state at full speed. If the job ends first (the
      // members finished before they switched), `finish` said so: a clear
      // error, not a timeout.
      if (opts_.join && opts_.rt_priority > 0) take_member_scheduling();
      auto first = c.irecv(raw(&header_size, sizeof header_size), src, tag_size);
      std::error_code ec;
      auto next_check = steady_clock::now() + opts_.heartbeat;
      while (!first.test(ec) && !d.expired()) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        if (steady_clock::now() < next_check) continue;
        next_check = steady_clock::now() + opts_.heartbeat;
        if (job_done())
          fail_job_finished("finished before the members switched to generation " + std::to_string(gen_.generation) +
                            ": this worker never received the state");
      }
      first.wait(d);  // returns at once when done; throws naming the peer on an error or the deadline
    }
    if (opts_.join) became_member();  // the members switched: from here on this newcomer is one of them
    if (header_size > (std::uint64_t{1} << 24))
      fail(error::bad_message, "state header of " + std::to_string(header_size) + " bytes");
    bytes header(header_size);
    c.recv(raw(header.data(), header.size()), src, tag_header, d);
    if (opts_.join) fault_point("sync-recv");
    detail::reader rd(header, "state header");
    const auto step = rd.get<std::int64_t>();
    const auto epoch = rd.get<std::int64_t>();
    const auto cursor = rd.get<std::uint64_t>();
    const auto n = rd.get<std::uint64_t>();
    if (n != state_.size())
      fail(error::invalid_state, "member " + std::to_string(source) + " has " + std::to_string(n) +
                                     " registered state buffers, this member " + std::to_string(state_.size()));
    for (std::size_t k = 0; k < state_.size(); ++k) {
      auto nm = rd.get_bytes();
      const auto sz = rd.get<std::uint64_t>();
      const std::string name(reinterpret_cast<const char*>(nm.data()), nm.size());
      if (name != state_[k].name || sz != state_[k].data.size()) {
        std::ostringstream os;
        os << "state buffer " << k << " is '" << name << "' of " << sz << " bytes on member " << source << " but '"
           << state_[k].name << "' of " << state_[k].data.size() << " bytes here";
        fail(error::invalid_state, os.str());
      }
    }
    // A launched worker whose buffers still hold its own initial state
    // receives into a copy first: should the sender die midway, its buffers
    // stay a valid initial state (recover() may make it the source).
    std::size_t total = 0;
    for (auto& s : state_) total += s.data.size();
    if (own_initial_state_ && total <= opts_.initial_staging) {
      auto staged = std::make_unique_for_overwrite<std::byte[]>(total);
      for (std::size_t k = 0, off = 0; k < state_.size(); off += state_[k++].data.size()) {
        c.recv(raw(staged.get() + off, state_[k].data.size()), src, tag_first + static_cast<std::uint32_t>(k), d);
      }
      own_initial_state_ = false;
      for (std::size_t k = 0, off = 0; k < state_.size(); off += state_[k++].data.size())
        if (!state_[k].data.empty()) std::memcpy(state_[k].data.data(), staged.get() + off, state_[k].data.size());
    } else {
      own_initial_state_ = false;  // from here on a failure may leave the buffers part written
      for (std::size_t k = 0; k < state_.size(); ++k)
        c.recv(raw(state_[k].data.data(), state_[k].data.size()), src, tag_first + static_cast<std::uint32_t>(k), d);
    }
    step_ = step;
    epoch_ = epoch;
    cursor_ = cursor;
    EBBFLOW_LOG_INFO("received state of step " << step_ << " from member " << source);
  }
}

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/elastic/impl/group/state_transfer.hpp>
// #include <ebbflow/elastic/impl/group/step.hpp>  (inlined here)
// ---- begin <ebbflow/elastic/impl/group/step.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file impl/group/step.hpp
//! The user's step: begin_step (pending switch and state transfer first),
//! the collectives (a failure aborts the step and recovers), in-step work
//! stealing, and end_step: commit, then the control exchange that feeds the
//! policy and decides re-plans, joins and leaves, and switches to a
//! generation wired up in the background.
//! Training thread only.


// #include <ebbflow/elastic/detail/group_impl.hpp>  (inlined)

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

// Member templates: instantiated in the user's translation unit in either mode.
template <kv_store Store, network Net>
template <class F>
bool group_impl<Store, Net>::collective(F&& f) {
  const inside busy(in_group_);
  require_open_step("a collective");
  try {
    {
      const auto w = enter_collective();
      f(*comm_);
    }
    return true;
  } catch (const system_error& e) {
    if (!detail::recoverable(e.code())) throw;
    EBBFLOW_LOG_WARN("step " << step_ << " aborted: " << e.what());
    phase_ = step_phase::aborted;
    recover(gen_.generation, lost_peer_of(e));
    return false;
  }
}


template <kv_store Store, network Net>
template <class Process>
plan::steal_report group_impl<Store, Net>::steal_step(Process&& process, const steal_settings& settings) {
  require_open_step("steal_step");
  if (!steal_key_.empty() && steal_attempt_ == std::pair{gen_.generation, step_})
    fail(error::invalid_state, "steal_step called twice in step " + std::to_string(step_));
  release_steal_counter();  // an aborted attempt's
  steal_attempt_ = {gen_.generation, step_};
  const auto info = current_slice();
  const std::vector<std::size_t> full(gen_.plan.begin(), gen_.plan.end());
  const auto slices = scale_plan(full, info.global_batch);
  std::vector<std::size_t> offset(slices.size(), 0);
  for (std::size_t r = 1; r < slices.size(); ++r) offset[r] = offset[r - 1] + slices[r - 1];
  plan::work_stealer<Store> stealer(
      *store_, key("steal"), {static_cast<std::uint64_t>(gen_.generation), static_cast<std::uint64_t>(step_)},
      std::span<const std::size_t>(slices), static_cast<std::size_t>(rank_), settings.chunks);
  steal_key_ = stealer.key(static_cast<std::size_t>(rank_));
  const auto run = [&](const plan::chunk& c) { process(offset[c.rank] + c.first, offset[c.rank] + c.last); };

  std::vector<member_id> ids;
  for (auto& m : gen_.members) ids.push_back(m.id);
  const auto models = policy_->models(ids);
  const bool paced = models.size() == ids.size() && std::all_of(models.begin(), models.end(), [](const auto& m) {
                       return std::isfinite(m.fixed_seconds) && m.fixed_seconds >= 0 &&
                              std::isfinite(m.seconds_per_sample) && m.seconds_per_sample > 0;
                     });
  if (paced && info.global_batch > 0) {
    std::vector<plan::worker_spec> specs;
    for (std::size_t i = 0; i < ids.size(); ++i)
      specs.push_back({static_cast<std::uint64_t>(ids[i]), models[i].fixed_seconds, models[i].seconds_per_sample,
                       std::numeric_limits<std::size_t>::max(), 0, 0});
    const auto bp = plan::make_plan(specs, slices, gen_.plan_version);
    plan::steal_policy pacing(specs, bp, static_cast<std::size_t>(rank_), settings.claim_seconds,
                              settings.chunk_overhead_seconds);
    return plan::run_stealing_step(stealer, pacing, run);
  }
  return plan::run_stealing_step(stealer, run);  // no models yet: unpaced
}


template <kv_store Store, network Net>
step_info group_impl<Store, Net>::begin_step() {
  const inside busy(in_group_);
  if (!active_) fail(error::invalid_state, "begin_step after this member left the group");
  if (detail::signal_leave_flag().load()) leave_requested_.store(true);
  started_ = true;
  while (pending_) {
    try {
      sync_state();
      const auto p = *pending_;
      pending_.reset();
      const double at_switch = std::chrono::duration<double>(steady_clock::now() - p.started).count();
      if (p.prepared_seconds > 0)
        EBBFLOW_LOG_INFO("stall: " << p.prepared_seconds * 1e3 << " ms starting the connect at admission, "
                                   << at_switch * 1e3 << " ms at the switch");
      notify(p.reason, p.old_size, p.prepared_seconds + at_switch);
    } catch (const system_error& e) {
      if (!detail::recoverable(e.code()) || std::exchange(callback_threw_, false)) throw;
      EBBFLOW_LOG_WARN("state transfer failed: " << e.what());
      recover(gen_.generation, lost_peer_of(e));
    }
  }
  phase_ = step_phase::open;
  return current_slice();
}

template <kv_store Store, network Net>
step_info group_impl<Store, Net>::current_slice() const {
  step_info s;
  s.step = step_;
  s.epoch = epoch_;
  s.cursor = cursor_;
  s.global_batch = std::min(opts_.global_batch, opts_.dataset_size - cursor_);
  std::vector<std::size_t> plan(gen_.plan.begin(), gen_.plan.end());
  auto p = scale_plan(plan, s.global_batch);
  s.offset = std::accumulate(p.begin(), p.begin() + rank_, std::size_t{0});
  s.batch = p[static_cast<std::size_t>(rank_)];
  s.weight = s.global_batch ? static_cast<double>(s.batch) / static_cast<double>(s.global_batch) : 0.0;
  s.rank = rank_;
  s.world_size = size();
  s.generation = gen_.generation;
  s.plan_version = gen_.plan_version;
  return s;
}

template <kv_store Store, network Net>
std::vector<std::size_t> group_impl<Store, Net>::plan_of(const std::vector<member_id>& ids) const {
  auto p = policy_->plan(ids, opts_.global_batch);
  std::size_t sum = 0;
  bool wrapped = false;
  for (auto b : p) wrapped = wrapped || __builtin_add_overflow(sum, b, &sum);
  if (p.size() != ids.size() || wrapped || sum != opts_.global_batch)
    fail(error::invalid_state, "the planning policy's plan has " + std::to_string(p.size()) + " entries summing to " +
                                   (wrapped ? std::string("more than 2^64") : std::to_string(sum)) + " for " +
                                   std::to_string(ids.size()) + " members and a global batch of " +
                                   std::to_string(opts_.global_batch));
  return p;
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::require_open_step(const char* what) const {
  if (!active_) fail(error::invalid_state, std::string(what) + " after this member left the group");
  if (phase_ == step_phase::closed)
    fail(error::invalid_state,
         std::string(what) + " outside a step: call begin_step first (step " + std::to_string(step_) + " is not open)");
  if (phase_ == step_phase::aborted)
    fail(error::invalid_state, std::string(what) + " after a collective of step " + std::to_string(step_) +
                                   " returned false: the step was rolled back; redo it from begin_step");
}

template <kv_store Store, network Net>
bool group_impl<Store, Net>::allreduce(std::span<float> data) {
  return collective(
      [&](communicator_type& c) { c.allreduce(view(data), reduce_op::sum, deadline::after(opts_.op_timeout)); });
}

template <kv_store Store, network Net>
bool group_impl<Store, Net>::allreduce(std::span<double> data) {
  return collective(
      [&](communicator_type& c) { c.allreduce(view(data), reduce_op::sum, deadline::after(opts_.op_timeout)); });
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::control_allreduce(std::span<double> v) {
  // The communicator's allreduce gives bitwise-identical results on every
  // rank, so every member's policy observes exactly the same numbers.
  const auto w = enter_collective(true);
  comm_->allreduce(view(v), reduce_op::sum, deadline::after(opts_.op_timeout));
}

template <kv_store Store, network Net>
typename group_impl<Store, Net>::waiting group_impl<Store, Net>::enter_collective(bool control) noexcept {
  // The control exchange runs after the commit (step_ already advanced):
  // it counts as collective 0 of the next step.
  const std::pair<std::int64_t, std::int64_t> at{gen_.generation, step_};
  if (at != progress_at_) progress_at_ = at, progress_k_ = 0;
  if (!control) progress_k_ = std::min(progress_k_ + 1, detail::progress::max_collective);
  progress_.store(detail::progress{step_, gen_.generation, progress_k_}.encode(), std::memory_order_relaxed);
  waiting_since_.store(steady_clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  return waiting{waiting_since_};
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::notify(change_reason reason, int old_size, double stall) {
  world_change wc{gen_.generation, reason, old_size, size(), rank_, step_, stall};
  history_.push_back(wc);
  EBBFLOW_LOG_INFO("generation " << wc.generation << " (" << name(reason) << "): " << old_size << " -> " << wc.new_size
                                 << " members, rank " << rank_ << ", step " << step_ << ", ready after " << stall * 1e3
                                 << " ms");
  // A callback's exception reaches the caller of begin_step as it is, even
  // an ebbflow::system_error whose code a member failure would have: the
  // change it announced stays in effect.
  for (auto& cb : callbacks_) {
    try {
      cb(wc);
    } catch (...) {
      callback_threw_ = true;
      throw;
    }
  }
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::release_steal_counter() {
  if (steal_key_.empty()) return;
  // Erased by the heartbeat thread, on its own connection: no round trip here.
  if constexpr (requires(Store & s) { s.erase(steal_key_); }) {
    std::lock_guard lk(hb_mutex_);
    hb_erase_.push_back(std::move(steal_key_));
  }
  steal_key_.clear();
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::commit(double compute_seconds, std::optional<std::size_t> processed) {
  const inside busy(in_group_);
  // A second end_step would commit a step nobody computed (its samples
  // lost); one after a failed collective, a rolled-back step.
  require_open_step("end_step");
  phase_ = step_phase::closed;
  if (!std::isfinite(compute_seconds) || compute_seconds < 0) compute_seconds = 0;
  const auto now = steady_clock::now();
  if (last_commit_ != steady_clock::time_point{}) step_interval_ = now - last_commit_;
  last_commit_ = now;
  if constexpr (requires(typename Net::transport_type & x) { x.poll_close(); }) {
    if (retiring_ && retiring_->poll_close()) retiring_.reset();
  }
  // Commit: the gradient collectives completed and the optimizer stepped.
  const auto info = current_slice();
  ++step_;
  cursor_ += info.global_batch;
  if (cursor_ >= opts_.dataset_size || (opts_.drop_last && opts_.dataset_size - cursor_ < opts_.global_batch)) {
    ++epoch_;
    cursor_ = 0;
  }
  if (detail::signal_leave_flag().load()) leave_requested_.store(true);

  const int n = size();
  const std::size_t un = static_cast<std::size_t>(n);
  std::vector<double> v(4 + 4 * un, 0.0);
  const std::size_t r = static_cast<std::size_t>(rank_);
  v[3 + r] = compute_seconds;
  v[3 + un + r] = static_cast<double>(processed.value_or(info.batch));
  // Every member's claims ended before the gradient allreduce completed.
  release_steal_counter();
  v[3 + 2 * un + r] = leave_requested_.load() ? 1.0 : 0.0;
  std::vector<member_id> ids;
  for (auto& m : gen_.members) ids.push_back(m.id);
  admitting_.clear();
  std::int64_t seen = gen_.joins_seen;
  // A join connecting in the background: every member says whether its
  // side is wired up; nothing else changes the membership or the plan
  // until the switch (plan versions stay unique).
  if (next_) {
    const int ready = poll_next();
    v[2] = ready > 0 ? 1.0 : ready < 0 ? -1e6 : 0.0;
  }
  if (rank_ == 0 && !next_) {
    // The join tickets are read only once the heartbeat thread saw a new
    // one (or some still wait): a steady step waits on no store.
    if (join_seq_hint_.load(std::memory_order_relaxed) > seen || ticket_seen_until_ > seen) {
      try {
        const std::size_t room = static_cast<std::size_t>(std::max(0, opts_.max_size - n));
        std::vector<join_hold> holds;
        admitting_ = pending_joiners(seen, room, true, holds);
        if (!holds.empty()) answer_holds(*store_, holds);
        // Tickets handled without an admission (held, malformed, or never
        // written) are not read again; the next record carries the count.
        if (admitting_.empty() && seen > gen_.joins_seen) {
          gen_.joins_seen = seen;
          hb_tickets_floor_.store(seen, std::memory_order_relaxed);
        }
      } catch (const system_error& e) {
        EBBFLOW_LOG_WARN("coordinator could not read join tickets: " << e.what());
      }
    }
    v[0] = static_cast<double>(admitting_.size());
    std::vector<std::size_t> cur(gen_.plan.begin(), gen_.plan.end());
    if (policy_->should_replan(ids, cur, opts_.global_batch)) {
      auto p = plan_of(ids);
      v[1] = 1;
      for (std::size_t i = 0; i < un; ++i) v[3 + 3 * un + i] = static_cast<double>(p[i]);
    }
  }
  try {
    control_allreduce(v);
  } catch (const system_error& e) {
    if (!detail::recoverable(e.code())) throw;
    EBBFLOW_LOG_WARN("control exchange after step " << step_ << " failed: " << e.what());
    recover(gen_.generation, lost_peer_of(e));
    return;
  }
  for (std::size_t i = 0; i < un; ++i)
    if (v[3 + un + i] > 0) policy_->observe(ids[i], static_cast<std::size_t>(v[3 + un + i]), v[3 + i]);
  if constexpr (detail::can_preconnect<Net>()) {
    if (next_) {
      if (v[2] >= static_cast<double>(n)) {  // everybody wired up: switch now, only the state moves
        auto nx = std::move(*next_);
        next_.reset();
        if (nx.leaving)
          leave_now();
        else
          install(std::move(nx.rec), std::move(*nx.transport), steady_clock::now(), nx.prepared_seconds);
      } else if (v[2] < 0 && next_->leaving) {
        leave_now();          // the others switch the blocking way
      } else if (v[2] < 0) {  // somebody's connect failed or is overdue: the blocking way (and recovery)
        auto nx = std::move(*next_);
        next_.reset();
        if (nx.helper.joinable()) {  // overdue: stop it before going on without it
          nx.helper.request_stop();
          nx.helper.join();
        }
        // A transport this member already started for g1 (here or by the
        // helper) has taken wire-up messages its peers send only once: the
        // blocking way finishes that one. A second transport for g1 would
        // wait for them until the operation deadline (so would its peers).
        auto begun = [&]() -> std::optional<typename Net::transport_type> {
          if (nx.transport) return std::move(nx.transport);
          if (nx.admission && nx.admission->transport) return std::move(nx.admission->transport);
          return std::nullopt;
        }();
        nx.admission.reset();
        if (nx.excluded) {  // a concurrent recovery excluded this member: rejoin
          wait_admission();
          return;
        }
        // The helper may have stopped anywhere: redo what it may not have
        // done (writing the record twice is harmless), then the blocking way.
        if (nx.record) write_record(*store_, gen_key(nx.g1), *nx.record, nx.admitted, nx.g1);
        adopt_announced(nx.g1, steady_clock::now(), std::move(begun));
      }
      return;  // leave requests are taken at the first boundary after the switch
    }
  }
  if (v[1] > 0) {
    for (std::size_t i = 0; i < un; ++i) gen_.plan[i] = static_cast<std::uint64_t>(v[3 + 3 * un + i]);
    ++gen_.plan_version;
  }
  const auto leaves = leaves_applied(v, n);
  const bool leaving = std::find(leaves.begin(), leaves.end(), char{1}) != leaves.end();
  if (v[0] > 0 || leaving) {
    if (rank_ == 0) {
      gen_.joins_seen = seen;
      hb_tickets_floor_.store(seen, std::memory_order_relaxed);
    }
    change_membership(leaves, n);
  }
}


}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/elastic/impl/group/step.hpp>
// #include <ebbflow/elastic/impl/group/join_tickets.hpp>  (inlined here)
// ---- begin <ebbflow/elastic/impl/group/join_tickets.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file impl/group/join_tickets.hpp
//! The coordinator's queue of newcomers: join tickets (read ahead by its
//! heartbeat thread so a step that admits them makes no store call),
//! admission once no new ticket came for `admit_delay`, tickets skipped
//! when never written or malformed, and the join cool-down of workers whose
//! newcomers kept failing (counted once per failure by the recovery).
//! pending_joiners and count_join_failures: training thread;
//! prefetch_tickets: heartbeat thread (hb_tickets_ under hb_mutex_).


// #include <ebbflow/elastic/detail/group_impl.hpp>  (inlined)
// #include <ebbflow/elastic/detail/store_ops.hpp>  (inlined)

#include <algorithm>
#include <string>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

template <kv_store Store, network Net>
std::vector<member_id> group_impl<Store, Net>::pending_joiners(std::int64_t& seen, std::size_t room, bool settle,
                                                               std::vector<join_hold>& holds) {
  std::vector<member_id> out;
  // At a step boundary the heartbeat thread's hint (fresh within a few store
  // round trips of a ticket) stands in for the counter: while tickets keep
  // arriving, the coordinator's steps then make no store call at all.
  auto total =
      settle ? join_seq_hint_.load(std::memory_order_relaxed) : store_->add(key("join_seq"), 0, store_deadline());
  if (settle) {
    // Admit once no new ticket appeared for admit_delay (bounded by 10×):
    // workers started together register a few ms apart, and admitting them
    // together costs the members one switch instead of several.
    const auto now = steady_clock::now();
    if (total > ticket_seen_until_) {
      if (ticket_seen_until_ <= seen) ticket_first_seen_ = now;  // the oldest waiting ticket
      ticket_seen_until_ = total;
      ticket_last_change_ = now;
    }
    const bool quiet = now - ticket_last_change_ >= opts_.admit_delay;
    const bool overdue = now - ticket_first_seen_ >= 10 * opts_.admit_delay;
    if (!quiet && !overdue) total = seen;
  }
  std::vector<std::string> keys;
  for (std::int64_t t = seen + 1; t <= total && keys.size() < room; ++t)
    keys.push_back(key("join/" + std::to_string(t)));
  const bool with_failures = opts_.join_cooldown.count() > 0;
  // At a step boundary the heartbeat thread has read them (and their
  // workers' failure counts) before it raised the hint: no store call then.
  // Otherwise, or if any is missing, they are read here.
  std::vector<std::optional<std::string>> values, failures;
  bool cached = settle && !keys.empty();
  if (cached) {
    std::lock_guard lk(hb_mutex_);
    for (std::size_t i = 0; i < keys.size() && cached; ++i) {
      const auto it = hb_tickets_.find(seen + 1 + static_cast<std::int64_t>(i));
      cached = it != hb_tickets_.end() &&
               (!with_failures || it->second.failures_epoch == failures_epoch_.load(std::memory_order_acquire));
      if (cached) values.emplace_back(it->second.value), failures.push_back(it->second.failures);
    }
  }
  if (!cached) values = detail::try_get_all(*store_, keys, store_deadline());
  struct ticket {
    std::int64_t seq;
    member_id id;
    std::int64_t held_for = 0;
    std::string worker;
    std::optional<std::string> failures;
  };
  std::vector<ticket> tickets;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const auto& v = values[i];
    if (!v) {
      // Taken but not yet written: a newcomer writes its ticket right after
      // it takes the number, so it is picked up next time. One that stays
      // unwritten for a lease (its newcomer died in between) is skipped:
      // kept, it would stop every later ticket.
      const auto now = steady_clock::now();
      if (ticket_hole_ != seen + 1) ticket_hole_ = seen + 1, ticket_hole_since_ = now;
      if (now - ticket_hole_since_ < opts_.lease) break;
      ++seen;
      EBBFLOW_LOG_WARN(
          "join ticket " << seen << " was taken but not written for "
                         << std::chrono::duration_cast<std::chrono::milliseconds>(now - ticket_hole_since_).count()
                         << " ms (EBBFLOW_LEASE_MS=" << opts_.lease.count()
                         << "; did its newcomer die before writing it?): skipped");
      continue;
    }
    ++seen;
    auto p = detail::join_ticket::parse(*v);
    ticket t{seen, -1, p.held_for, std::move(p.worker), cached ? failures[i] : std::nullopt};
    try {
      t.id = detail::parse_i64(p.id);
    } catch (const system_error&) {
      // Consumed and skipped: kept, it would stop every later ticket.
      EBBFLOW_LOG_WARN("join ticket " << seen << " is malformed ('" << v->substr(0, 64) << "'): skipped");
      continue;
    }
    tickets.push_back(std::move(t));
  }
  // The failure counts of the tickets' workers, in one batch (only when a
  // ticket arrived and the heartbeat thread had not read them: this runs on
  // the coordinator's training thread).
  std::vector<std::optional<std::string>> counts(tickets.size());
  if (with_failures && !tickets.empty()) {
    if (cached) {
      for (std::size_t i = 0; i < tickets.size(); ++i) counts[i] = tickets[i].failures;
    } else {
      std::vector<std::string> ckeys;
      for (auto& t : tickets) ckeys.push_back(key("joinfail/" + t.worker));
      counts = detail::try_get_all(*store_, ckeys, store_deadline());
    }
  }
  for (std::size_t i = 0; i < tickets.size(); ++i) {
    const auto& t = tickets[i];
    // A member that filed a second ticket (after a cool-down) is admitted once.
    if (gen_.rank_of(t.id) >= 0 || std::find(out.begin(), out.end(), t.id) != out.end()) continue;
    const auto failures = detail::join_failures::parse(counts[i]).count;
    if (!t.worker.empty() && failures >= 2 && t.held_for < failures) {
      const auto wait = cooldown{opts_.join_cooldown, opts_.join_cooldown_max}.after(failures);
      holds.push_back({t.seq, wait.count(), failures, t.worker});
      continue;
    }
    out.push_back(t.id);
  }
  return out;
}

template <kv_store Store, network Net>
std::int64_t group_impl<Store, Net>::prefetch_tickets(Store& st, std::int64_t total) {
  // The coordinator's heartbeat thread: reads the tickets after those it
  // holds, up to `total`, in one batch (64 at most a round), then the
  // failure counts of their workers (and again those of held tickets read
  // before a recovery) in a second. No call while nothing is new. Returns
  // the number of the first ticket it does not hold.
  const std::int64_t floor = hb_tickets_floor_.load(std::memory_order_relaxed);
  const std::int64_t epoch = failures_epoch_.load(std::memory_order_acquire);
  const bool with_failures = opts_.join_cooldown.count() > 0;
  std::int64_t from = floor + 1;
  std::vector<std::pair<std::int64_t, std::string>> stale;  // held tickets whose counts are older: (number, worker)
  {
    std::lock_guard lk(hb_mutex_);
    std::erase_if(hb_tickets_, [&](const auto& e) { return e.first <= floor; });
    for (auto it = hb_tickets_.find(from); it != hb_tickets_.end() && it->first == from; ++it, ++from)
      if (with_failures && it->second.failures_epoch != epoch)
        stale.emplace_back(it->first, detail::join_ticket::parse(it->second.value).worker);
  }
  std::vector<std::string> keys;
  for (std::int64_t t = from; t <= total && t < from + 64; ++t) keys.push_back(key("join/" + std::to_string(t)));
  std::vector<std::pair<std::int64_t, prefetched_ticket>> got;
  for (auto& v : detail::try_get_all(st, keys, store_deadline())) {
    if (!v) break;  // taken but not yet written: the next round
    got.emplace_back(from + static_cast<std::int64_t>(got.size()), prefetched_ticket{std::move(*v), -1, std::nullopt});
  }
  std::map<std::int64_t, std::optional<std::string>> counts;  // by ticket number
  if (with_failures) {
    for (auto& [n, t] : got) stale.emplace_back(n, detail::join_ticket::parse(t.value).worker);
    std::vector<std::string> ckeys;
    std::vector<std::int64_t> of;
    for (auto& [n, worker] : stale) {
      if (worker.empty())
        counts[n] = std::nullopt;  // no worker key: no count to read
      else
        ckeys.push_back(key("joinfail/" + worker)), of.push_back(n);
    }
    auto values = detail::try_get_all(st, ckeys, store_deadline());
    for (std::size_t k = 0; k < of.size(); ++k) counts[of[k]] = std::move(values[k]);
  }
  std::lock_guard lk(hb_mutex_);
  for (auto& [n, t] : got) hb_tickets_.emplace(n, std::move(t));
  for (auto& [n, c] : counts)
    if (const auto it = hb_tickets_.find(n); it != hb_tickets_.end()) {
      it->second.failures = std::move(c);
      it->second.failures_epoch = epoch;
    }
  return from + static_cast<std::int64_t>(got.size());
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::answer_holds(Store& st, const std::vector<join_hold>& holds) const {
  for (auto& h : holds) {
    EBBFLOW_LOG_WARN("holding back worker '" << h.worker << "' (join ticket " << h.ticket << ") for "
                                             << static_cast<double>(h.ms) / 1000 << " s: it failed " << h.failures
                                             << " times in a row while joining");
    st.set(key("held/" + std::to_string(h.ticket)), std::to_string(h.ms) + " " + std::to_string(h.failures),
           store_deadline());
  }
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::count_join_failures(const std::vector<detail::member_entry>& alive,
                                                 std::set<member_id>& counted) {
  if (opts_.join_cooldown.count() <= 0) return;
  std::vector<member_id> lost;
  for (auto& m : gen_.members)
    if (!counted.contains(m.id) &&
        std::none_of(alive.begin(), alive.end(), [&](const auto& a) { return a.id == m.id; }))
      lost.push_back(m.id);
  if (lost.empty()) return;
  counted.insert(lost.begin(), lost.end());  // a recovery waiting below min_size asks again every few ms
  std::vector<std::string> keys;
  for (auto m : lost) keys.push_back(key("wkey/" + std::to_string(m)));
  const auto workers = detail::try_get_all(*store_, keys, store_deadline());
  for (std::size_t i = 0; i < lost.size(); ++i) {
    if (!workers[i] || workers[i]->empty()) continue;  // an initial member, or a newcomer past its probation
    // Every recovering member applies the failure before it reads join
    // tickets; the record of who was counted makes it count once.
    const std::string fkey = key("joinfail/" + *workers[i]);
    auto cur = store_->try_get(fkey, store_deadline()).value_or("");
    for (;;) {
      auto f = detail::join_failures::parse(cur);
      if (f.generation == gen_.generation && std::find(f.members.begin(), f.members.end(), lost[i]) != f.members.end())
        break;
      if (f.generation != gen_.generation) f.members.clear();
      ++f.count;
      f.generation = gen_.generation;
      f.members.push_back(lost[i]);
      const auto next = f.str();
      const auto r = store_->compare_set(fkey, cur, next, store_deadline());
      if (r.swapped) {
        EBBFLOW_LOG_WARN("member " << lost[i] << " of worker '" << *workers[i]
                                   << "' died while joining: its join failures in a row: " << f.count);
        break;
      }
      cur = r.current;
    }
  }
}

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/elastic/impl/group/join_tickets.hpp>
// #include <ebbflow/elastic/impl/group/membership_change.hpp>  (inlined here)
// ---- begin <ebbflow/elastic/impl/group/membership_change.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file impl/group/membership_change.hpp
//! Joins and leaves decided at a step boundary: which leaves apply, the
//! next generation's record, and its wire-up in the background by the
//! admission helper thread (lowest CPU priority, own store connection)
//! while training goes on; or the blocking way, which falls back to
//! recovery. The helper touches only what start_admission hands it.


// #include <ebbflow/elastic/detail/group_impl.hpp>  (inlined)
// #include <ebbflow/core/thread_name.hpp>  (inlined)
// #include <ebbflow/elastic/detail/scheduling.hpp>  (inlined)
// #include <ebbflow/elastic/detail/store_ops.hpp>  (inlined)

#include <algorithm>
#include <string>
#include <thread>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

template <kv_store Store, network Net>
std::vector<char> group_impl<Store, Net>::leaves_applied(const std::vector<double>& v, int n) {
  // Every member decides from the control exchange alone, so all agree.
  const std::size_t un = static_cast<std::size_t>(n);
  const int joiners = static_cast<int>(v[0]);
  std::vector<char> out(un, 0);
  int leaving = 0;
  for (std::size_t i = 0; i < un; ++i) leaving += out[i] = v[3 + 2 * un + i] > 0 ? 1 : 0;
  if (leaving == 0 || (leaving == n && joiners == 0)) {  // no leave, or everybody leaves: the job ends
    deferral_logged_ = false;
    return out;
  }
  // The members that stay and the newcomers admitted with them must number
  // at least min_size, and one member holding the state must stay when
  // newcomers come: the lowest-ranked leavers stay one more generation
  // (their leave request stands; they leave once others take their place).
  const int below = opts_.min_size - (n - leaving + joiners);
  int keep = std::max(below, leaving == n ? 1 : 0);
  std::string kept;
  for (std::size_t i = 0; i < un && keep > 0; ++i)
    if (out[i]) {
      out[i] = 0;
      --keep;
      detail::append_listed(kept, std::to_string(gen_.members[i].id));
    }
  if (!kept.empty() && rank_ == 0 && !deferral_logged_) {
    if (below > 0)
      EBBFLOW_LOG_WARN("member(s) " << kept << " asked to leave after step " << step_ - 1
                                    << ", but the group would fall below EBBFLOW_MIN_SIZE=" << opts_.min_size
                                    << ": they keep training until newcomers take their place");
    else
      EBBFLOW_LOG_INFO("member " << kept << " stays one more generation to hand the newcomers the state");
  }
  deferral_logged_ = !kept.empty();
  return out;
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::write_record(Store& st, const std::string& gkey, const std::string& rec,
                                          const std::vector<member_id>& joiners, std::int64_t g1) const {
  // The record must be written before the joiners are told, and before the
  // coordinator itself leaves. A concurrent recovery may have written
  // another one first: then the joiners are not told (that record does not
  // have them; they stay in the queue).
  if (st.compare_set(gkey, "", rec, store_deadline()).current == rec)
    for (auto j : joiners) st.set(key("joined/" + std::to_string(j)), std::to_string(g1), store_deadline());
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::change_membership(const std::vector<char>& leaving, int n) {
  const auto started = steady_clock::now();
  const std::size_t un = static_cast<std::size_t>(n);
  const std::int64_t g1 = gen_.generation + 1;
  const std::string gkey = gen_key(g1);
  const auto leaves = [&](std::size_t i) { return leaving[i] != 0; };
  const bool me_leaving = leaves(static_cast<std::size_t>(rank_));
  // With a network that connects in the background, the rest of the change
  // is done by a helper thread while this member keeps training.
  const bool background = detail::can_preconnect<Net>() && opts_.preconnect && !me_leaving;
  std::optional<std::string> record;  // the coordinator's, to write
  if (rank_ == 0) {
    detail::generation_record rec;
    rec.generation = g1;
    rec.reason = admitting_.empty() ? change_reason::leave : change_reason::join;
    std::vector<member_id> ids;
    for (std::size_t i = 0; i < un; ++i)
      if (!leaves(i)) {
        rec.members.push_back({gen_.members[i].id, step_});
        ids.push_back(gen_.members[i].id);
      }
    for (auto j : admitting_) {
      rec.members.push_back({j, -1});
      ids.push_back(j);
    }
    rec.source = rec.members.empty() ? -1 : rec.members.front().id;
    rec.source_step = step_;
    if (!ids.empty()) {
      auto p = plan_of(ids);
      rec.plan.assign(p.begin(), p.end());
    }
    rec.plan_version = gen_.plan_version + 1;
    rec.joins_seen = gen_.joins_seen;
    record = to_value(rec.encode());
    if (!background) {
      try {
        write_record(*store_, gkey, *record, admitting_, g1);
      } catch (const system_error& e) {
        // A coordinator that leaves goes even when the store is gone (a
        // SIGTERMed job whose store died): the others cannot switch without
        // the record and fail over, or end too when they all leave.
        if (!me_leaving || !store_failure(e)) throw;
        EBBFLOW_LOG_WARN("could not write the record of generation " << g1 << " (" << e.what()
                                                                     << "): leaving without it");
      }
    }
  }
  if (me_leaving) {
    if (detail::can_preconnect<Net>() && opts_.preconnect) {
      // The others connect among themselves in the background; this member
      // keeps training with them until they switch, then leaves.
      next_generation nx;
      nx.leaving = true;
      nx.since = steady_clock::now();
      next_ = std::move(nx);
      return;
    }
    leave_now();
    return;
  }
  std::vector<member_id> leavers;
  for (std::size_t i = 0; i < un; ++i)
    if (leaves(i)) leavers.push_back(gen_.members[i].id);
  if (background) {
    start_admission(std::move(record), gkey, g1, std::move(leavers), started);
    return;
  }
  adopt_announced(g1, started);
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::adopt_announced(std::int64_t g1, steady_clock::time_point started,
                                             std::optional<typename Net::transport_type> begun) {
  // The blocking way: wait for generation g1's record (the coordinator wrote
  // it, or a concurrent recovery did) and connect to it.
  const std::string gkey = gen_key(g1);
  try {
    store_->wait({gkey}, deadline::after(opts_.op_timeout));
  } catch (const system_error& e) {
    EBBFLOW_LOG_WARN("generation " << g1 << " was not announced: " << e.what() << "; re-forming");
    recover(gen_.generation, -1);
    return;
  }
  auto rec = detail::generation_record::decode(to_bytes(*store_->try_get(gkey, store_deadline())));
  if (rec.rank_of(id_) < 0) {  // a concurrent recovery excluded this member: rejoin
    wait_admission();
    return;
  }
  adopt_or_recover(std::move(rec), started, std::move(begun));
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::start_admission(std::optional<std::string> record, std::string gkey, std::int64_t g1,
                                             std::vector<member_id> leavers, steady_clock::time_point started) {
  // Joins and leaves without suspension: a helper thread writes the
  // coordinator's record, reads the next generation's record and addresses
  // and (where the network allows it) creates its endpoints, on a store
  // connection of its own, while this member's training thread goes on; the
  // members then connect to each other in the background, and end_step
  // switches once all are wired up (poll_next).
  if constexpr (detail::can_preconnect<Net>()) {
    next_generation nx;
    nx.since = started;
    nx.g1 = g1;
    nx.record = record;
    nx.admitted = admitting_;
    auto res = std::make_shared<admission_result>();
    nx.admission = res;
    std::vector<member_id> current;
    for (auto& m : gen_.members) current.push_back(m.id);
    // The helper starts a fifth of a step after the boundary (at most a
    // quarter lease): right after a boundary every member needs its CPU (the
    // control exchange completing, the next step's launches), and on a
    // kernel without preemption even a lowest-priority thread's system calls
    // (store requests, thread start-up) hold a shared core until they return.
    const auto delay = std::min<steady_clock::duration>(step_interval_ / 5, opts_.lease / 4);
    nx.helper = std::jthread([this, delay, res, record = std::move(record), joiners = admitting_,
                              gkey = std::move(gkey), g1, leavers = std::move(leavers), current = std::move(current),
                              rank = rank_, revoke = revoke_, cache = address_cache_,
                              concurrent = detail::concurrent_connect(*net_)](std::stop_token stop) mutable {
      // The lowest CPU priority: on a host whose cores the workers share,
      // this work fills their idle time (their device time) and never delays
      // a training thread that is ready to run.
      detail::lowest_cpu_priority();
      detail::sleep_until(steady_clock::now() + delay, stop);
      try {
        if (!aux_store_) aux_store_ = connect_store_();
        Store& st = *aux_store_;
        // The coordinator writes the record the others wait for. Tests make
        // another member's helper late here (EBBFLOW_FAULT=admission-helper:
        // sleep=MS) while the others' helpers start their transports.
        if (record)
          write_record(st, gkey, *record, joiners, g1);
        else
          fault_point("admission-helper", st, stop);
        const auto d = deadline::after(opts_.op_timeout);
        if (!detail::wait_key(st, gkey, d, stop))
          throw system_error(make_error_code(stop.stop_requested() ? error::revoked : error::timeout),
                             {.rank = rank,
                              .generation = g1,
                              .operation = "admission",
                              .detail = "waiting for the record of generation " + std::to_string(g1)});
        auto rec = detail::generation_record::decode(to_bytes(*st.try_get(gkey, store_deadline())));
        const int r = rec.rank_of(id_);
        if (r < 0) {
          res->excluded = true;  // a concurrent recovery excluded this member
        } else {
          for (auto m : current)
            if (rec.rank_of(m) < 0 && std::find(leavers.begin(), leavers.end(), m) == leavers.end())
              res->blocking = true;  // excluded by a concurrent recovery: the blocking way sorts it out
          if (!res->blocking) {
            res->addrs = gather_addresses(rec, st, cache, rank, revoke, stop);
            // The endpoints are made here, and their wire-up is driven from
            // here while the training thread computes: the peers' connect
            // messages are then handled in its compute (device) time rather
            // than inside its collectives. Never while it is inside the group
            // (in_group_), where it progresses the worker itself: this thread
            // would hold the worker's lock at the lowest priority, and the
            // training thread would wait for it. Bounded well below the lease
            // (past which the members finish the change themselves); what
            // is left completes as the training thread progresses the worker.
            if (concurrent) {
              res->transport.emplace(net_->start_connect(rec.generation, r, res->addrs));
              const auto until =
                  steady_clock::now() + std::min<steady_clock::duration>(4 * opts_.heartbeat, opts_.lease / 2);
              while (!stop.stop_requested() && steady_clock::now() < until) {
                if (in_group_.load(std::memory_order_relaxed) == 0 && res->transport->poll_connect()) break;
                std::this_thread::sleep_for(std::chrono::microseconds(100));
              }
            }
          }
        }
        res->cache = std::move(cache);
        res->rec = std::move(rec);
      } catch (...) {
        res->error = std::current_exception();
      }
      res->done.store(true, std::memory_order_release);
    });
    ::ebbflow::detail::name_thread(nx.helper, "ebbflow-admit");
    nx.prepared_seconds = std::chrono::duration<double>(steady_clock::now() - started).count();
    next_ = std::move(nx);
  } else {
    (void)record, (void)gkey, (void)g1, (void)leavers, (void)started;
  }
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::take_admission() {
  // The helper is done: its result becomes this member's next generation.
  auto res = std::move(next_->admission);
  next_->helper.join();
  if (res->rec) next_->rec = std::move(*res->rec);
  if (res->error) {
    next_->failed = true;
    std::rethrow_exception(res->error);
  }
  address_cache_ = std::move(res->cache);
  if (res->excluded || res->blocking) {
    next_->excluded = res->excluded;
    next_->failed = true;
    return;
  }
  if (res->transport) {
    next_->transport = std::move(res->transport);
  } else {  // the network cannot connect from another thread: here, then
    const auto t0 = steady_clock::now();
    next_->transport.emplace(net_->start_connect(next_->rec.generation, next_->rec.rank_of(id_), res->addrs));
    next_->prepared_seconds += std::chrono::duration<double>(steady_clock::now() - t0).count();
  }
  const double after_ms = std::chrono::duration<double>(steady_clock::now() - next_->since).count() * 1e3;
  EBBFLOW_LOG_INFO("generation " << next_->rec.generation << ": connecting " << next_->rec.members.size()
                                 << " members in the background (" << after_ms << " ms after the decision; "
                                 << next_->prepared_seconds * 1e3 << " ms of it on the training thread)");
}

template <kv_store Store, network Net>
int group_impl<Store, Net>::poll_next() {
  // 1: wired up; 0: not yet; -1: failed or overdue (the group then switches
  // the blocking way, which fails over to recovery).
  if constexpr (detail::can_preconnect<Net>()) {
    if (next_->leaving) return 1;  // nothing to connect: it leaves at the switch
    if (next_->failed) return -1;
    fault_point("preconnect");
    try {
      if (next_->admission) {
        // The helper runs at the lowest CPU priority: on a host whose cores
        // are all busy it may get no time at all. It has one lease; past
        // that, the members finish the change on their training threads.
        if (!next_->admission->done.load(std::memory_order_acquire)) {
          if (steady_clock::now() - next_->since <= opts_.lease) return 0;
          EBBFLOW_LOG_WARN("admission helper of generation "
                           << next_->g1 << " not done after EBBFLOW_LEASE_MS=" << opts_.lease.count()
                           << ": finishing the change on the training thread");
          return -1;
        }
        take_admission();
        if (next_->failed) return -1;
      }
      if (next_->transport->poll_connect()) return 1;
      // A joiner that died before it wired up: noticed through its lease.
      if (const int j = stale_member(next_->rec, next_->joiners, true); j >= 0) {
        EBBFLOW_LOG_WARN("joiner " << next_->rec.members[static_cast<std::size_t>(j)].id
                                   << " stopped heartbeating before it connected");
        return -1;
      }
    } catch (const system_error& e) {
      if (!detail::recoverable(e.code())) throw;
      EBBFLOW_LOG_WARN("background connect of generation " << next_->rec.generation << " failed: " << e.what());
      return -1;
    }
    return steady_clock::now() - next_->since > opts_.op_timeout ? -1 : 0;
  } else {
    return -1;
  }
}

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/elastic/impl/group/membership_change.hpp>
// #include <ebbflow/elastic/impl/group/recovery.hpp>  (inlined here)
// ---- begin <ebbflow/elastic/impl/group/recovery.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file impl/group/recovery.hpp
//! Re-forming the group after a failure: abort the generation everywhere,
//! report this member's committed step, decide who is alive (reported,
//! marked dead, process gone on this host, lease), wait below min_size, and
//! propose generation g+1 by compare-and-set (the first proposal wins);
//! the newest committed step becomes the state's source.
//! Training thread only.


// #include <ebbflow/elastic/detail/group_impl.hpp>  (inlined)
// #include <ebbflow/elastic/detail/store_ops.hpp>  (inlined)

#include <set>
#include <string>
#include <thread>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

template <kv_store Store, network Net>
void group_impl<Store, Net>::recover(std::int64_t g, int lost_peer) {
  try {
    reform(g, lost_peer);
  } catch (const system_error& e) {
    // Everything a recovery decides goes through the store: without it
    // the survivors cannot agree on the next generation.
    if (!store_failure(e) || !recoverable(e.code())) throw;
    fail(error::peer_lost, "generation " + std::to_string(g) + " failed and the store cannot be reached (" + e.what() +
                               "): the group cannot re-form without its store (docs/elastic.md, \"When the store "
                               "dies\")");
  }
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::reform(std::int64_t g, int lost_peer) {
  const auto started = steady_clock::now();
  next_.reset();  // a join still connecting is redone by the recovery below
  auto overall = deadline::after(opts_.op_timeout + opts_.min_size_wait);
  for (;;) {
    // 1. Stop every collective of g and tell the others. Its endpoints may
    // hold traffic its peers will never answer: the next opens its own.
    if (revoke_) revoke_->revoke();
    if constexpr (requires { net_->discard_endpoints(); }) net_->discard_endpoints();
    hb_generation_.store(-1);
    const std::string gs = std::to_string(g);
    store_->set(key("abort/" + gs), "1", store_deadline());
    if (lost_peer >= 0 && lost_peer < size() && gen_.generation == g)
      store_->set(dead_key(g, gen_.members[static_cast<std::size_t>(lost_peer)].id), "1", store_deadline());
    // What this member holds: its committed step, or (no step yet) whether
    // its buffers are still a launched worker's own initial state.
    const std::int64_t holds = step_ >= 0 ? step_ : own_initial_state_ ? detail::own_initial_state : -1;
    store_->set(key("recover/" + gs + "/" + std::to_string(id_)), std::to_string(holds), store_deadline());
    EBBFLOW_LOG_WARN("generation " << g << " failed at step " << step_ << ": re-forming the group");

    const std::string next_key = gen_key(g + 1);
    std::set<member_id> failures_counted;  // lost members of g whose join failure this member applied
    lease_seen hb_seen;
    const auto unresolved_deadline = deadline::after(opts_.op_timeout);
    const auto recovery_started = steady_clock::now();
    bool waiting_logged = false, stuck_logged = false;
    // Since when the members alive and the joiners waiting number fewer than
    // min_size: the group gives up min_size_wait after that, not later.
    std::optional<steady_clock::time_point> below_since;
    std::optional<detail::generation_record> next;
    // Each round asks the store in at most three pipelined batches, however
    // large the group: the next record and who reported; of the others, who
    // was reported lost; of the rest, their heartbeats.
    std::vector<std::string> reported_keys{next_key};
    for (auto& m : gen_.members)
      if (m.id != id_) reported_keys.push_back(key("recover/" + gs + "/" + std::to_string(m.id)));
    while (!next) {
      const auto reported = detail::try_get_all(*store_, reported_keys, store_deadline());
      if (const auto& cur = reported[0]) {
        next = detail::generation_record::decode(to_bytes(*cur));
        break;
      }
      // Who of g is alive (reported), dead (reported lost or lease expired), or undecided?
      // Lost: marked dead in g by a peer, or its launcher saw its process exit.
      std::vector<std::string> lost_keys, hb_keys;
      std::vector<std::size_t> unreported, maybe_alive;  // indices into gen_.members
      for (std::size_t i = 0, k = 1; i < gen_.members.size(); ++i) {
        if (gen_.members[i].id == id_) continue;
        if (!reported[k++]) {
          unreported.push_back(i);
          lost_keys.push_back(dead_key(g, gen_.members[i].id));
          lost_keys.push_back(opts_.gone_key(gen_.members[i].id));
        }
      }
      const auto lost_or_gone = detail::try_get_all(*store_, lost_keys, store_deadline());
      std::vector<std::uint8_t> lost(unreported.size());
      for (std::size_t j = 0; j < unreported.size(); ++j)
        lost[j] = lost_or_gone[2 * j].has_value() || lost_or_gone[2 * j + 1].has_value();
      // A member on this host whose process is gone is dead now, not only
      // after its lease: when several die at once, a survivor revoked before
      // its own transport saw a death reports none. Told to the others too
      // (read back as lost in the next round).
      std::vector<std::uint8_t> exited_here(unreported.size(), 0);
      if constexpr (requires(const transport_type& t) {
                      { t.peer_gone(0) } -> std::convertible_to<bool>;
                    }) {
        for (std::size_t j = 0; transport_ && gen_.generation == g && j < unreported.size(); ++j) {
          const std::size_t i = unreported[j];
          if (lost[j] || !transport_->peer_gone(static_cast<int>(i))) continue;
          exited_here[j] = 1;
          EBBFLOW_LOG_WARN("member " << gen_.members[i].id << " (rank " << i << " of generation " << g
                                     << ") is gone: its process on this host exited");
          store_->set(dead_key(g, gen_.members[i].id), "1", store_deadline());
        }
      }
      for (std::size_t j = 0; j < unreported.size(); ++j) {
        if (lost[j] || exited_here[j] || unresolved_deadline.expired())
          continue;  // reported lost, or its process exited on this host, or too late
        maybe_alive.push_back(unreported[j]);
        hb_keys.push_back(key("hb/" + std::to_string(gen_.members[unreported[j]].id)));
      }
      std::vector<std::uint8_t> heartbeating(gen_.members.size(), 0);  // unreported, lease fresh
      if (!hb_keys.empty()) {
        const auto hbs =
            detail::add_all(*store_, hb_keys, std::vector<std::int64_t>(hb_keys.size(), 0), store_deadline());
        const auto now = steady_clock::now();
        for (std::size_t j = 0; j < maybe_alive.size(); ++j)
          heartbeating[maybe_alive[j]] = fresh(gen_.members[maybe_alive[j]].id, hbs[j], now, hb_seen);
      }
      std::vector<detail::member_entry> alive;
      std::string undecided_ids;  // alive by their heartbeat, not yet in the recovery
      bool undecided = false;
      for (std::size_t i = 0, k = 1; i < gen_.members.size(); ++i) {
        const member_id m = gen_.members[i].id;
        if (m == id_) {
          alive.push_back({id_, holds});
        } else if (const auto& r = reported[k++]) {
          alive.push_back({m, detail::parse_i64(*r)});
        } else if (heartbeating[i]) {
          undecided = true;
          detail::append_listed(undecided_ids, std::to_string(m));
        }
      }
      // A member whose heartbeat goes on but whose training thread does not
      // come (stuck outside ebbflow: a data loader, a lock) is waited for
      // until the operation deadline, then left out; say so once.
      if (undecided && !stuck_logged && steady_clock::now() - recovery_started > opts_.lease) {
        EBBFLOW_LOG_WARN(
            "generation " << g << " failed; member(s) " << undecided_ids
                          << " still send heartbeats but have not reached the recovery (a training "
                             "thread stuck outside ebbflow?): waiting for them at most EBBFLOW_OP_TIMEOUT_MS="
                          << std::chrono::duration_cast<std::chrono::milliseconds>(opts_.op_timeout).count()
                          << " ms, then going on without them");
        stuck_logged = true;
      }
      if (!undecided) {
        count_join_failures(alive, failures_counted);  // before the tickets are read: a restarted newcomer's sees it
        // Failure counts the heartbeat thread read before this are stale.
        failures_epoch_.fetch_add(1, std::memory_order_acq_rel);
        std::int64_t seen = gen_.joins_seen;
        const std::size_t room =
            static_cast<std::size_t>(std::max<std::int64_t>(0, opts_.max_size - static_cast<int>(alive.size())));
        std::vector<join_hold> holds;
        auto joiners = pending_joiners(seen, room, false, holds);
        const int total = static_cast<int>(alive.size() + joiners.size());
        if (total < opts_.min_size) {
          const auto now = steady_clock::now();
          if (!below_since) below_since = now;
          if (!waiting_logged)
            EBBFLOW_LOG_WARN("only " << total << " workers left, below EBBFLOW_MIN_SIZE=" << opts_.min_size
                                     << ": waiting for workers to join (up to EBBFLOW_MIN_WAIT_MS="
                                     << opts_.min_size_wait.count() << " ms)");
          waiting_logged = true;
          if (now - *below_since >= opts_.min_size_wait)
            fail(error::timeout, "only " + std::to_string(total) + " worker(s) left after generation " + gs +
                                     " failed, below EBBFLOW_MIN_SIZE=" + std::to_string(opts_.min_size) +
                                     ", and none joined within EBBFLOW_MIN_WAIT_MS=" +
                                     std::to_string(opts_.min_size_wait.count()) + " ms");
        } else {
          detail::generation_record rec;
          rec.generation = g + 1;
          rec.reason = change_reason::failure;
          rec.members = alive;
          for (auto j : joiners) rec.members.push_back({j, -1});
          std::vector<member_id> ids;
          for (auto& m : rec.members) ids.push_back(m.id);
          rec.source = -1;
          rec.source_step = -1;
          for (auto& m : rec.members)
            if (m.committed > rec.source_step) {
              rec.source_step = m.committed;
              rec.source = m.id;
            }
          // If nobody holds a step, none was ever trained: the member that
          // formed generation 0 died before its state moved. A launched
          // worker whose buffers no transfer wrote holds an initial state as
          // valid as that one (as when launch rank 0 never registers): the
          // first becomes the source, the others receive its state.
          for (auto& m : rec.members) {
            if (m.committed != detail::own_initial_state) continue;
            m.committed = -1;
            if (rec.source_step < 0) {
              m.committed = rec.source_step = 0;
              rec.source = m.id;
            }
          }
          if (rec.source_step < 0) {  // only joiners that never got the state (and part-written members) are left
            if (job_done()) fail_job_finished("finished before this worker received the training state");
            fail(error::invalid_state, "no member holding the training state is left after generation " + gs +
                                           " failed: the state is lost (restart from a checkpoint)");
          }
          auto p = plan_of(ids);
          rec.plan.assign(p.begin(), p.end());
          rec.plan_version = gen_.plan_version + 1;
          rec.joins_seen = seen;
          const std::string mine = to_value(rec.encode());
          const std::string cur = store_->compare_set(next_key, "", mine, store_deadline()).current;
          if (cur == mine) {
            for (auto j : joiners)
              store_->set(key("joined/" + std::to_string(j)), std::to_string(g + 1), store_deadline());
            answer_holds(*store_, holds);
          }
          next = detail::generation_record::decode(to_bytes(cur));
          break;
        }
      }
      if (overall.expired())
        fail(error::timeout, "could not re-form the group after generation " + gs +
                                 " within EBBFLOW_OP_TIMEOUT_MS + EBBFLOW_MIN_WAIT_MS (" +
                                 std::to_string((opts_.op_timeout + opts_.min_size_wait).count()) + " ms)" +
                                 (undecided_ids.empty() ? "" : "; undecided: member(s) " + undecided_ids));
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (next->rank_of(id_) < 0 && leave_requested_.load()) {
      leave_now();  // it was leaving anyway
      return;
    }
    if (next->rank_of(id_) < 0) {
      EBBFLOW_LOG_WARN("member " << id_ << " was left out of generation " << next->generation << ": rejoining");
      wait_admission();
      return;
    }
    if (next->reason != change_reason::failure) {
      // A join or leave decided before the failure, whose members were
      // connecting in the background. Its committed steps date from that
      // decision, and the survivors may now be a step apart (a failure can
      // hit after some of them committed a step): adopting it could pair
      // different steps' gradients. Never adopted by a recovery: every member
      // fails it over in turn, so the next record holds the real steps.
      EBBFLOW_LOG_WARN("generation " << next->generation << " (" << name(next->reason)
                                     << ") was decided before generation " << gs << " failed: failing it over too");
      enter(std::move(*next));
      g = gen_.generation;
      lost_peer = -1;
      continue;
    }
    try {
      adopt(std::move(*next), started);
      return;
    } catch (const system_error& e) {
      if (!detail::recoverable(e.code())) throw;
      g = gen_.generation;
      lost_peer = lost_in_adopt(e);
    }
  }
}

template <kv_store Store, network Net>
int group_impl<Store, Net>::lost_peer_of(const system_error& e) const noexcept {
  // Only a transport that saw a peer die may name it: a collective's error
  // names the neighbour whose transfer failed, which in a ring is often a
  // live member stuck behind the dead one. Reporting it dead would exclude it.
  if (e.code() != errc::peer_lost) return -1;
  if constexpr (requires(const transport_type& t) {
                  { t.lost_peer() } -> std::convertible_to<int>;
                }) {
    return transport_ ? transport_->lost_peer() : -1;
  } else {
    return e.peer();
  }
}

template <kv_store Store, network Net>
int group_impl<Store, Net>::lost_in_adopt(const system_error& e) noexcept {
  // adopt() runs no collective: a member its error names stopped heartbeating
  // or never published its address, or its endpoint could not be made; it
  // is not a live neighbour stuck behind a dead one (lost_peer_of). Nor can
  // lost_peer_of ask the transport: the new one is not made yet.
  return e.code() == errc::peer_lost ? e.peer() : -1;
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::take_own_initial_state() {
  if (!own_initial_state_)
    fail(error::invalid_state, "member " + std::to_string(id_) + " was made the source of generation " +
                                   std::to_string(gen_.generation) + " without the training state");
  const auto p = restored_.value_or(position{0, 0, 0});
  step_ = p.step;
  epoch_ = p.epoch;
  cursor_ = p.cursor;
  EBBFLOW_LOG_WARN("the member that formed the first generation died before its state moved: member "
                   << id_ << " (launch rank " << launch_.rank << ") serves its own initial state"
                   << (restored_ ? " and restored position" : "") << " (step " << step_ << ")");
}

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/elastic/impl/group/recovery.hpp>
// ---- end <ebbflow/elastic/detail/group_impl.hpp>
// #include <ebbflow/elastic/group_options.hpp>  (inlined)
// #include <ebbflow/elastic/group_types.hpp>  (inlined)
// #include <ebbflow/elastic/kv_store.hpp>  (inlined)
// #include <ebbflow/elastic/network.hpp>  (inlined)
// #include <ebbflow/elastic/planning_policy.hpp>  (inlined)
// #include <ebbflow/plan/work_stealing.hpp>  (inlined)  // plan::steal_report

#include <csignal>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

//! Raised by `group` when it cannot go on: the store is gone, the membership
//! stayed below `min_size` for `min_size_wait`, or this worker was never
//! admitted. Carries errc::timeout / peer_lost / invalid_state / job_finished.
using group_error = system_error;

//! The elastic group. `Store` models `kv_store`, `Net` models `network`.
//! `connect_store` makes one store client per thread that talks to the store:
//! the training thread, the heartbeat thread (again after a lost connection)
//! and the admission helper. The heartbeat thread and the helper may call it
//! at the same time, so it must be thread-safe; the clients it returns need
//! not be.
template <kv_store Store, network Net>
class group {
  using impl_type = detail::group_impl<Store, Net>;

 public:
  //! The transport handed to `collective`: `Net`'s, revocable by the heartbeat thread.
  using transport_type = typename impl_type::transport_type;
  //! Collectives over the current generation's transport.
  using communicator_type = typename impl_type::communicator_type;
  //! Connects a new store client (must not return nullptr; may throw, which the constructor passes on).
  using store_factory = typename impl_type::store_factory;

  //! Joins the job: as one of the initial `launch.world_size` workers (rank
  //! `launch.rank`), or, with `opts.join`, as a newcomer admitted at a step
  //! boundary. Blocks until this worker is a member (deadline
  //! `opts.join_timeout`). Registered state is synchronised at the first
  //! `begin_step`; register it before that.
  //! @throws group_error, std::invalid_argument for bad options.
  group(store_factory connect_store, Net& net, group_options opts, launch_info launch,
        std::unique_ptr<planning_policy> policy = std::make_unique<uniform_policy>())
      : impl_(std::move(connect_store), net, std::move(opts), std::move(launch), std::move(policy)) {}

  group(const group&) = delete;
  group& operator=(const group&) = delete;
  //! Stops the heartbeat (the others see this worker as failed unless it left).
  //! A member that ends between steps first waits, for at most a lease
  //! (2 s at most), until every member of its generation ended too, so its
  //! closing transport fails no peer still in the last step's exchange.
  ~group() = default;

  //! Registers a buffer that is part of the training state (parameters,
  //! optimizer state, ...): streamed to joiners and to members behind after a
  //! failure, each from one of the members holding the newest committed
  //! step. Host memory; same name and size on every member; replicated
  //! state (the same bits on members that committed the same steps).
  //! @throws group_error (invalid_state) after the first `begin_step`.
  void register_state(std::string name, std::span<std::byte> host_bytes) {
    impl_.register_state(std::move(name), host_bytes);
  }
  //! Called after every membership change (e.g. to rescale the learning
  //! rate). An exception it throws leaves `begin_step` as it is; the change
  //! stays in effect.
  void on_world_changed(std::function<void(const world_change&)> cb) { impl_.callbacks_.push_back(std::move(cb)); }

  //! This member's share of the next step. Applies a pending switch or state
  //! transfer first. @throws group_error when the group cannot go on.
  step_info begin_step() { return impl_.begin_step(); }

  //! Runs `f(communicator&)` (any collectives over this generation).
  //! Returns false when a member failed: the step is aborted, the group
  //! re-formed, and the caller must redo the step from `begin_step`.
  //! Between `begin_step` and `end_step` only; after a false return, only
  //! `begin_step` (@throws group_error, invalid_state, otherwise).
  template <class F>
  [[nodiscard]] bool collective(F&& f) {
    return impl_.collective(std::forward<F>(f));
  }
  //! Sums `data` over all members (host memory). False: redo the step.
  [[nodiscard]] bool allreduce(std::span<float> data) { return impl_.allreduce(data); }
  //! As above, for doubles.
  [[nodiscard]] bool allreduce(std::span<double> data) { return impl_.allreduce(data); }

  //! In-step work stealing (plan/work_stealing.hpp) instead of processing
  //! the own slice whole: calls `process(first, last)` for positions
  //! [first, last) of this step's global batch (the sample at position p is
  //! the one at `cursor + p` of the epoch's order), first for chunks of its
  //! own slice, paced against its planned step time when the policy has
  //! models, then for chunks taken from the ends of slices whose owners fall
  //! behind. Each position is processed by exactly one member (atomic claims
  //! on the job's store, keyed by generation and step). Call between
  //! `begin_step` and the gradient allreduce on every member; weigh each
  //! sample by 1 / global_batch (a member that processed nothing still
  //! allreduces its zeros), and pass `processed` to `end_step`. `process`
  //! must not call the group. Once per step attempt.
  //! @throws group_error (invalid_state) when called twice, plan::plan_error
  //! (bad settings), plan::plan_fault (a corrupt claim counter in the store),
  //! the store's errors, and what `process` throws.
  template <class Process>
  plan::steal_report steal_step(Process&& process, const steal_settings& settings = {}) {
    return impl_.steal_step(std::forward<Process>(process), settings);
  }

  //! Commits the step (call after the optimizer step) and runs the control
  //! exchange: feeds every member's timing to the policy, applies new plans,
  //! leaves and joins. `compute_seconds`: this member's compute time of the step.
  void end_step(double compute_seconds) { impl_.commit(compute_seconds, std::nullopt); }
  //! As above, after `steal_step`: `processed` samples (its report) took
  //! `compute_seconds`, which is what the policy learns from.
  void end_step(double compute_seconds, std::size_t processed) { impl_.commit(compute_seconds, processed); }

  //! Resumes from a checkpoint: the step, epoch and cursor the job had
  //! reached. Call before the first `begin_step` on every member (the
  //! source's position travels with the initial state). Steps and epochs
  //! up to 2^62; with `drop_last`, not a cursor inside the short last batch.
  //! @throws group_error after the first begin_step, std::invalid_argument.
  void restore_position(std::int64_t step, std::int64_t epoch, std::size_t cursor) {
    impl_.restore_position(step, epoch, cursor);
  }

  //! Asks to leave at the next step boundary (thread-safe).
  void request_leave() noexcept { impl_.leave_requested_.store(true); }
  //! Marks the job finished: workers still waiting to join stop waiting, and
  //! joiners admitted to a change still in flight (see `changing`) stop
  //! waiting for the state with a clear error (job_finished); a worker
  //! started later under this job is refused at once. `keep_training` calls
  //! it when the steps are done; a loop that ends otherwise calls it after
  //! its last step (on one member or on all: the same mark).
  //! @throws system_error from the store.
  void finish() { impl_.finish(); }
  //! True while a membership change is unfinished: decided at an earlier
  //! step boundary and still being prepared in the background, or switched
  //! to with the state still to move at the next `begin_step`. Every member
  //! sees the same value after `end_step` returns, so a loop that must not
  //! end with a joiner stranded can run on while it is true.
  [[nodiscard]] bool changing() const noexcept { return impl_.changing(); }

  //! The condition of the training loop, `while (g.keep_training(total_steps))`:
  //! true while this member should run another step, that is while it is
  //! `active()` and either fewer than `total_steps` steps are committed or a
  //! membership change is unfinished (`changing()`: a joiner admitted near
  //! the end is taken in rather than stranded, so the job may commit a few
  //! steps more than `total_steps`). Every member gets the same answer after
  //! `end_step`. The first time it returns false because the steps are done,
  //! it calls `finish()`, so a worker started later under this job is refused
  //! at once (job_finished); a member that left returns false without it.
  //! Once false, it stays false. A loop that ends otherwise (on a loss
  //! target, a time limit, a signal) calls `finish()` itself.
  //! @throws std::invalid_argument when total_steps is negative; what `finish` throws.
  [[nodiscard]] bool keep_training(std::int64_t total_steps) { return impl_.keep_training(total_steps); }

  //! False once this member left the group (after `request_leave` took effect).
  [[nodiscard]] bool active() const noexcept { return impl_.active_; }
  //! This member's rank in the current generation.
  [[nodiscard]] int rank() const noexcept { return impl_.rank_; }
  //! Members in the current generation.
  [[nodiscard]] int size() const noexcept { return impl_.size(); }
  //! The current generation (grows by one with every membership change).
  [[nodiscard]] std::int64_t generation() const noexcept { return impl_.gen_.generation; }
  //! Steps committed so far; -1 on a joiner until its state arrived at the first `begin_step`.
  [[nodiscard]] std::int64_t step() const noexcept { return impl_.step_; }
  //! The epoch of the next step.
  [[nodiscard]] std::int64_t epoch() const noexcept { return impl_.epoch_; }
  //! Position in the epoch's sample order where the next step's global batch starts.
  [[nodiscard]] std::size_t cursor() const noexcept { return impl_.cursor_; }
  //! This worker's job-wide id (from the store; never reused).
  [[nodiscard]] member_id id() const noexcept { return impl_.id_; }
  //! The plan in force: every member's batch for a full global batch, rank
  //! order. Valid until the next membership change or re-plan.
  [[nodiscard]] std::span<const std::uint64_t> plan() const noexcept { return impl_.gen_.plan; }
  //! Every membership change this member saw, oldest first.
  [[nodiscard]] const std::vector<world_change>& history() const noexcept { return impl_.history_; }
  //! The transport of the current generation (valid until the next change).
  [[nodiscard]] transport_type& transport() { return *impl_.transport_; }
  //! The communicator of the current generation (valid until the next change).
  [[nodiscard]] communicator_type& communicator() { return *impl_.comm_; }

 private:
  impl_type impl_;  // all state and the protocol: elastic/detail/group_impl.hpp
};

//! Deduces the store type from what `connect_store` returns, so that a
//! lambda works as well as a `std::function`:
//! `elastic::group g([] { return std::make_unique<store_client>(...); }, net, opts, launch);`
template <class Connect, class Net, class... Policy>
requires std::invocable<Connect&> && requires { typename std::invoke_result_t<Connect&>::element_type; }
group(Connect, Net&, group_options, launch_info, Policy&&...)
    ->group<typename std::invoke_result_t<Connect&>::element_type, Net>;

//! Makes `sig` (e.g. SIGTERM) request a graceful leave of every group in this
//! process at its next step boundary, instead of killing it.
inline void leave_on_signal(int sig = SIGTERM) { std::signal(sig, detail::on_leave_signal); }

}  // namespace elastic
EBBFLOW_END_NAMESPACE

// Separate compilation (config.hpp): the group over the TCP store and UCX is
// instantiated once, in ebbflow::compiled; a translation unit here only
// declares that instantiation. The member definitions stay visible, so a
// group over another store or network instantiates as in header-only mode.
#if !EBBFLOW_HEADER_ONLY && EBBFLOW_HAS_ASIO && EBBFLOW_HAS_UCX
// #include <ebbflow/elastic/tcp_store.hpp>  (inlined)
// #include <ebbflow/elastic/ucx_network.hpp>  (inlined)
EBBFLOW_BEGIN_NAMESPACE
extern template class elastic::detail::group_impl<elastic::store_client, elastic::ucx_network>;
EBBFLOW_END_NAMESPACE
#endif
// ==== end <ebbflow/elastic/group.hpp>

// ==== begin <ebbflow/elastic/loopback_network.hpp> ========================
// SPDX-License-Identifier: Apache-2.0
//! @file loopback_network.hpp
//! An in-process `network` for unit tests of the elastic group: every
//! generation gets its own `loopback_hub`; `kill(address)` marks that worker
//! dead in every hub it belongs to, as a crashed process would be.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/comm/loopback_transport.hpp>  (inlined)
// #include <ebbflow/elastic/kv_store.hpp>  (inlined)

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

//! Shared by all workers of one test. Thread-safe.
class loopback_fabric {
 public:
  //! The hub of generation `g` (created for `size` ranks by its first caller)
  //! and records that `addr` is `rank` there; if `addr` was already killed,
  //! that rank is dead in the hub at once.
  std::shared_ptr<comm::loopback_hub> hub(std::int64_t g, int size, const bytes& addr, int rank) {
    std::lock_guard lk(m_);
    auto& h = hubs_[g];
    if (!h) h = std::make_shared<comm::loopback_hub>(size);
    const std::string k = str(addr);
    where_[k].push_back({h, rank});
    if (dead_.count(k)) h->kill(rank);
    return h;
  }
  //! The worker with this address crashed.
  void kill(const bytes& addr) {
    std::lock_guard lk(m_);
    const std::string k = str(addr);
    dead_[k] = true;
    for (auto& [h, r] : where_[k]) h->kill(r);
  }
  //! A fresh unique address ("loopback-<n>").
  bytes new_address() { return to_bytes("loopback-" + std::to_string(next_++)); }

 private:
  static std::string str(const bytes& b) { return std::string(reinterpret_cast<const char*>(b.data()), b.size()); }
  std::mutex m_;
  std::map<std::int64_t, std::shared_ptr<comm::loopback_hub>> hubs_;
  std::map<std::string, std::vector<std::pair<std::shared_ptr<comm::loopback_hub>, int>>> where_;
  std::map<std::string, bool> dead_;
  std::atomic<int> next_{0};
};

//! One worker's view of the fabric; models `network`.
class loopback_network {
 public:
  using transport_type = comm::loopback_transport;  //!< transport of each generation
  //! A worker with a fresh address on `f` (must not be null).
  explicit loopback_network(std::shared_ptr<loopback_fabric> f)
      : fabric_(std::move(f)), addr_(fabric_->new_address()) {}
  //! This worker's address.
  //! The address never changes (see `network`).
  [[nodiscard]] static constexpr bool stable_address() noexcept { return true; }
  //! The same address for every generation (the fabric routes by generation).
  [[nodiscard]] bytes prepare(std::int64_t) const { return addr_; }
  //! The loopback transport of generation `g` as `rank` of `addrs.size()`.
  //! Never blocks (the deadline is unused): loopback peers need no handshake.
  transport_type connect(std::int64_t g, int rank, const std::vector<bytes>& addrs, deadline) {
    return transport_type(fabric_->hub(g, static_cast<int>(addrs.size()), addr_, rank), rank, g);
  }
  //! As `connect` (loopback peers need no wire-up: `poll_connect` is true at
  //! once). The group calls it from its admission helper thread, which the
  //! fabric (locked) allows: `concurrent_connect()`.
  transport_type start_connect(std::int64_t g, int rank, const std::vector<bytes>& addrs) {
    return connect(g, rank, addrs, deadline::never());
  }
  //! `start_connect` may run on another thread than the training one.
  [[nodiscard]] static constexpr bool concurrent_connect() noexcept { return true; }
  //! Crashes this worker as seen by its peers.
  void kill() { fabric_->kill(addr_); }

 private:
  std::shared_ptr<loopback_fabric> fabric_;
  bytes addr_;
};

}  // namespace elastic
EBBFLOW_END_NAMESPACE
// ==== end <ebbflow/elastic/loopback_network.hpp>

// ==== begin <ebbflow/elastic/planner_policy.hpp> ==========================
// SPDX-License-Identifier: Apache-2.0
//! @file planner_policy.hpp
//! `planner_policy`: the elastic group's heterogeneity-aware policy. Keeps a
//! robust online cost model per member (plan::cost_model), plans with the
//! exact batch planner (plan::solve) and re-plans with hysteresis
//! (the threshold must hold for `persist` consecutive checks) when the models drift. Members without a fitted model
//! yet (newcomers) are planned with the mean model of the others, so a
//! joiner gets a sensible share at once and an exact one after a few steps.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/elastic/planning_policy.hpp>  (inlined)
// #include <ebbflow/plan/batch_planner.hpp>  (inlined)
// #include <ebbflow/plan/worker_models.hpp>  (inlined here)
// ---- begin <ebbflow/plan/worker_models.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file worker_models.hpp
//! `plan::worker_models`: one `cost_model` per worker id, and the worker specs
//! to plan with at any time, from the first step on: workers without a
//! fitted model yet (all of them at the start, a newcomer later) are planned
//! with the mean model of the others, and with one common placeholder while
//! nobody has one, which gives the uniform split. Observations that say
//! nothing of a worker's speed (a zero batch, a time that is not positive)
//! are ignored. This is what a loop needs around `replanner` when it has no
//! elastic group (the group's `planner_policy` is built on it).


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/plan/batch_planner.hpp>  (inlined)
// #include <ebbflow/plan/cost_model.hpp>  (inlined here)
// ---- begin <ebbflow/plan/cost_model.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file cost_model.hpp
//! Online fit of one worker's step time t(b) = a + c·b from measured
//! (batch size, seconds) pairs.
//!
//! What to measure: the seconds the worker itself spent on the step's compute
//! (data to device, forward, backward, optimizer), *not* the time it waited
//! for slower peers in the allreduce; otherwise every worker looks as slow as
//! the slowest. Every rank must feed identical observations to its copy of a
//! worker's model (e.g. after an allgather of the timings), so that all ranks
//! hold identical models and compute identical plans.
//!
//! How it fits:
//! * exponentially forgetting weighted least squares (half-life
//!   `half_life_steps` observations) over the sufficient statistics, so the
//!   model follows slow drift (thermal throttling) and recovery;
//! * robust: each residual is scaled by a running robust scale (exponentially
//!   weighted mean absolute residual, floored at `min_rel_scale` of the
//!   prediction). Residuals beyond `huber_k` scales are down-weighted (Huber),
//!   beyond `reject_k` scales they are not used at all: an isolated GC pause
//!   or transient straggler does not move the model;
//! * change detector: `change_window` consecutive residuals on the same side
//!   beyond `change_k` scales mean the speed really changed (a neighbour job);
//!   the model restarts from exactly those observations (keeping the shape
//!   a : c, fitting the scale), so a step change is followed after
//!   `change_window` steps;
//! * drift: a tracking signal (exponentially weighted mean of the residuals ÷
//!   that of their absolute values, in [-1, 1]) near ±1 means the model lags
//!   a trend (thermal throttling); while |signal| > `drift_signal` the
//!   forgetting uses the shorter `fast_half_life_steps` and large residuals
//!   keep their full weight;
//! * identifiability: a and c separately need batch sizes that vary. While the
//!   (weighted) batch sizes vary by less than `min_batch_spread` (coefficient
//!   of variation) the model keeps the last known *shape* a : c (from a probe,
//!   an earlier full fit, or a = 0 when nothing is known) and fits only a
//!   common scale factor, which is what a slowdown of the whole device does.
//!
//! Thread safety: none; a value type (copy it freely).
//! Errors: `plan_error(bad_observation)` for NaN, infinite or non-positive seconds;
//! `plan_fault(bad_state)` from `decode` for bytes that are not an encoded model.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/enum_names.hpp>  (inlined)
// #include <ebbflow/plan/batch_planner.hpp>  (inlined)
// #include <ebbflow/plan/plan_error.hpp>  (inlined)

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace plan {

//! Tuning of `cost_model`; the defaults suit step-time noise of a few percent.
struct cost_model_options {
  double half_life_steps = 50;      //!< weight of an observation halves after this many newer ones
  double huber_k = 2.5;             //!< residuals beyond this many robust scales are down-weighted
  double reject_k = 6.0;            //!< residuals beyond this many robust scales are ignored
  unsigned change_window = 3;       //!< same-side residuals beyond change_k in a row that mean a real change (1..8)
  double change_k = 4.5;            //!< residual size (robust scales) that counts towards a change
  double fast_half_life_steps = 4;  //!< forgetting used while the residuals show a persistent bias (drift)
  double drift_signal = 0.6;        //!< |tracking signal| above which the fast forgetting applies
  unsigned min_slope_samples = 8;   //!< effective samples needed before a and c are fitted apart
  double min_rel_scale = 0.005;     //!< floor of the robust scale, relative to the prediction
  double min_batch_spread = 0.05;   //!< batch-size coefficient of variation needed to fit a and c apart
  double initial_rel_scale = 0.05;  //!< robust scale assumed before there is data, relative
};

//! What one observation did to the model.
enum class observation_kind {
  accepted,      //!< used with full weight
  downweighted,  //!< used with a Huber weight < 1
  outlier,       //!< ignored (isolated outlier)
  change,        //!< a step change was detected; the model restarted from recent data
};

namespace detail {
inline constexpr auto observation_kind_names =
    make_enum_names(observation_kind::accepted, "accepted", "downweighted", "outlier", "change");
static_assert(observation_kind_names.last() == observation_kind::change);
}  // namespace detail

//! Short stable name of `k` ("accepted", "downweighted", "outlier", "change").
constexpr std::string_view to_string(observation_kind k) noexcept { return detail::observation_kind_names(k); }

//! One measured step: `batch` samples took `seconds`.
struct timing_sample {
  std::size_t batch = 0;  //!< samples in the step
  double seconds = 0;     //!< measured step time (must be finite and > 0)
};

//! Online robust model of one worker's step time. Value type.
class cost_model {
 public:
  //! An empty model (not ready()). Out-of-range options are clamped into
  //! their documented ranges rather than rejected; see `options()`.
  explicit cost_model(cost_model_options opts = {}) noexcept;

  //! A model seeded from a short probe (e.g. a few steps at two or three
  //! batch sizes when the worker joins). With two or more distinct batch
  //! sizes a and c are fitted apart; with one, a = 0 is assumed until the
  //! batch sizes vary. @throws plan_error(bad_observation).
  [[nodiscard]] static cost_model from_probe(std::span<const timing_sample> probe, cost_model_options opts = {});

  //! Feeds one measured step. O(1), no allocation. @throws plan_error(bad_observation).
  observation_kind observe(std::size_t batch, double seconds);

  //! True once at least one observation was used.
  [[nodiscard]] bool ready() const noexcept { return used_ > 0; }
  //! Fixed seconds per step (0 before ready()).
  [[nodiscard]] double a() const noexcept { return a_; }
  //! Seconds per sample (0 before ready()).
  [[nodiscard]] double c() const noexcept { return c_; }
  //! a + c·b.
  [[nodiscard]] double predict(std::size_t batch) const noexcept { return a_ + c_ * static_cast<double>(batch); }
  //! Sum of the (forgotten, Huber) weights now in the fit: the number of
  //! equivalent fresh observations behind it.
  [[nodiscard]] double effective_samples() const noexcept { return w_; }
  //! Estimated relative standard error of predict() at the recent batch
  //! sizes: 1.25·scale / prediction / sqrt(effective_samples) (1.25 turns a
  //! mean absolute deviation into a standard deviation). +inf before ready().
  [[nodiscard]] double relative_error() const noexcept;
  //! Confidence in [0, 1): 1 / (1 + (relative_error / 1 %)^2); 0.5 means the
  //! prediction is good to about 1 %.
  [[nodiscard]] double confidence() const noexcept;
  //! True when the batch sizes in the fit vary enough to separate a from c.
  [[nodiscard]] bool slope_identified() const noexcept { return full_fit_; }
  //! Observations used so far (accepted or down-weighted, plus restarts).
  [[nodiscard]] std::size_t observations() const noexcept { return used_; }
  //! Observations ignored as outliers so far.
  [[nodiscard]] std::size_t outliers() const noexcept { return outliers_; }
  //! Step changes detected so far.
  [[nodiscard]] std::size_t changes() const noexcept { return changes_; }
  //! Tracking signal in [-1, 1]: persistent bias of the recent residuals.
  [[nodiscard]] double tracking_signal() const noexcept { return ew_abs_r_ > 0 ? ew_r_ / ew_abs_r_ : 0; }
  //! Robust residual scale in seconds.
  [[nodiscard]] double scale() const noexcept { return scale_; }

  //! The planner's view of this worker: {id, a, c, max_batch, min_batch, comm_s}.
  //! Before ready() this has c = 0 and is rejected by the planner (bad_cost),
  //! so a worker without a model cannot be planned by accident.
  [[nodiscard]] worker_spec spec(std::uint64_t id, std::size_t max_batch, std::size_t min_batch = 0,
                                 double comm_s = 0) const noexcept {
    return worker_spec{id, a_, c_, max_batch, min_batch, comm_s};
  }

  //! The options in effect, after clamping.
  [[nodiscard]] const cost_model_options& options() const noexcept { return opts_; }

  //! The whole model (options, fit, recent observations) as bytes, for
  //! `decode` on another worker: a worker that joins a loop without the
  //! elastic group takes the others' models and so makes the same plans.
  //! Little endian, with a magic and a format version; 392 bytes.
  [[nodiscard]] std::vector<std::byte> encode() const;
  //! The model `encode` wrote, bit for bit.
  //! @throws plan_fault(bad_state) for bytes that are truncated, corrupt or of another format.
  [[nodiscard]] static cost_model decode(std::span<const std::byte> bytes);

 private:
  static constexpr std::size_t max_window = 8;
  void add(double b, double t, double weight, double lambda) noexcept;
  void refit(double min_samples) noexcept;
  void restart_from_recent() noexcept;

  cost_model_options opts_;
  double lambda_;                   // per-observation forgetting factor
  double lambda_fast_;              // forgetting while drifting
  double ew_r_ = 0, ew_abs_r_ = 0;  // tracking signal state
  // Weighted sufficient statistics, batch sizes shifted by b0_ against cancellation.
  double b0_ = 0, w_ = 0, wb_ = 0, wbb_ = 0, wt_ = 0, wbt_ = 0;
  double a_ = 0, c_ = 0;
  double shape_a_ = 0, shape_c_ = 1;  // a : c kept while the slope is not identified
  bool full_fit_ = false;
  double scale_ = 0;
  std::size_t used_ = 0, outliers_ = 0, changes_ = 0;
  int run_sign_ = 0;
  unsigned run_ = 0;
  std::array<timing_sample, max_window> recent_{};  // ring of the last observations
  std::size_t recent_count_ = 0, recent_head_ = 0;
};

}  // namespace plan
EBBFLOW_END_NAMESPACE

// #include <ebbflow/plan/impl/cost_model.hpp>  (inlined here)
// ---- begin <ebbflow/plan/impl/cost_model.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file impl/cost_model.hpp
//! Definitions for plan/cost_model.hpp.


// #include <ebbflow/plan/cost_model.hpp>  (inlined)

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

EBBFLOW_BEGIN_NAMESPACE
namespace plan {
// The encoded model's fields (worker_models.hpp encodes sets of models with them too).
namespace detail {
inline constexpr std::uint32_t cost_model_magic = 0x4d434245;  // "EBCM"
inline constexpr std::uint32_t cost_model_format = 1;

// Little-endian fields in and out of a byte buffer.
struct model_writer {
  std::vector<std::byte> out;
  void u64(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::byte>(v >> (8 * i)));
  }
  void f64(double v) { u64(std::bit_cast<std::uint64_t>(v)); }
};
struct model_reader {
  std::span<const std::byte> in;
  std::size_t at = 0;
  std::uint64_t u64() {
    EBBFLOW_PLAN_VERIFY(at + 8 <= in.size(), plan_errc::bad_state,
                         "cost model of " << in.size() << " bytes is truncated (field at byte " << at << ")");
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= std::to_integer<std::uint64_t>(in[at + static_cast<std::size_t>(i)]) << (8 * i);
    at += 8;
    return v;
  }
  double f64() { return std::bit_cast<double>(u64()); }
};
}  // namespace detail
}  // namespace plan
EBBFLOW_END_NAMESPACE

// Compiled into ebbflow::compiled in separate compilation (config.hpp).
#if EBBFLOW_HEADER_ONLY
EBBFLOW_BEGIN_NAMESPACE
namespace plan {

EBBFLOW_DECL cost_model::cost_model(cost_model_options opts) noexcept : opts_(opts) {
  opts_.change_window = std::clamp(opts_.change_window, 1u, static_cast<unsigned>(max_window));
  opts_.half_life_steps = std::max(opts_.half_life_steps, 1.0);
  opts_.reject_k = std::max(opts_.reject_k, opts_.huber_k);
  opts_.fast_half_life_steps = std::clamp(opts_.fast_half_life_steps, 1.0, opts_.half_life_steps);
  opts_.change_k = std::clamp(opts_.change_k, opts_.huber_k, opts_.reject_k);
  lambda_ = std::exp2(-1.0 / opts_.half_life_steps);
  lambda_fast_ = std::exp2(-1.0 / opts_.fast_half_life_steps);
}


EBBFLOW_DECL std::vector<std::byte> cost_model::encode() const {
  detail::model_writer w;
  w.u64(std::uint64_t{detail::cost_model_format} << 32 | detail::cost_model_magic);
  for (double v : {opts_.half_life_steps, opts_.huber_k, opts_.reject_k, opts_.change_k, opts_.fast_half_life_steps,
                   opts_.drift_signal, opts_.min_rel_scale, opts_.min_batch_spread, opts_.initial_rel_scale})
    w.f64(v);
  w.u64(opts_.change_window);
  w.u64(opts_.min_slope_samples);
  for (double v : {ew_r_, ew_abs_r_, b0_, w_, wb_, wbb_, wt_, wbt_, a_, c_, shape_a_, shape_c_, scale_}) w.f64(v);
  w.u64(full_fit_ ? 1 : 0);
  w.u64(used_);
  w.u64(outliers_);
  w.u64(changes_);
  w.u64(static_cast<std::uint64_t>(static_cast<std::int64_t>(run_sign_)));
  w.u64(run_);
  w.u64(recent_count_);
  w.u64(recent_head_);
  for (const timing_sample& t : recent_) {
    w.u64(t.batch);
    w.f64(t.seconds);
  }
  return std::move(w.out);
}

EBBFLOW_DECL cost_model cost_model::decode(std::span<const std::byte> bytes) {
  detail::model_reader r{bytes};
  const std::uint64_t head = r.u64();
  EBBFLOW_PLAN_VERIFY(static_cast<std::uint32_t>(head) == detail::cost_model_magic, plan_errc::bad_state,
                       "not an encoded cost model (bad magic)");
  EBBFLOW_PLAN_VERIFY(head >> 32 == detail::cost_model_format, plan_errc::bad_state,
                       "cost model format " << (head >> 32) << ", expected " << detail::cost_model_format);
  cost_model_options o;
  for (double* v : {&o.half_life_steps, &o.huber_k, &o.reject_k, &o.change_k, &o.fast_half_life_steps, &o.drift_signal,
                    &o.min_rel_scale, &o.min_batch_spread, &o.initial_rel_scale}) {
    *v = r.f64();
    EBBFLOW_PLAN_VERIFY(std::isfinite(*v), plan_errc::bad_state, "cost model with an option that is not finite");
  }
  const std::uint64_t window = r.u64(), slope = r.u64();
  EBBFLOW_PLAN_VERIFY(window >= 1 && window <= max_window && slope <= 0xffffffffu, plan_errc::bad_state,
                       "cost model options out of range (change_window " << window << ")");
  o.change_window = static_cast<unsigned>(window);
  o.min_slope_samples = static_cast<unsigned>(slope);
  cost_model m(o);
  // An encoded model's options were clamped when it was made: the same
  // clamping must leave them as they are.
  EBBFLOW_PLAN_VERIFY(m.opts_.half_life_steps == o.half_life_steps && m.opts_.reject_k == o.reject_k &&
                           m.opts_.change_k == o.change_k && m.opts_.fast_half_life_steps == o.fast_half_life_steps,
                       plan_errc::bad_state, "cost model options that no model holds");
  for (double* v : {&m.ew_r_, &m.ew_abs_r_, &m.b0_, &m.w_, &m.wb_, &m.wbb_, &m.wt_, &m.wbt_, &m.a_, &m.c_, &m.shape_a_,
                    &m.shape_c_, &m.scale_}) {
    *v = r.f64();
    EBBFLOW_PLAN_VERIFY(std::isfinite(*v), plan_errc::bad_state, "cost model with a value that is not finite");
  }
  const std::uint64_t full = r.u64();
  EBBFLOW_PLAN_VERIFY(full <= 1, plan_errc::bad_state, "cost model with a bad flag");
  m.full_fit_ = full == 1;
  m.used_ = static_cast<std::size_t>(r.u64());
  m.outliers_ = static_cast<std::size_t>(r.u64());
  m.changes_ = static_cast<std::size_t>(r.u64());
  const auto sign = static_cast<std::int64_t>(r.u64());
  const std::uint64_t run = r.u64(), count = r.u64(), at = r.u64();
  EBBFLOW_PLAN_VERIFY(sign >= -1 && sign <= 1 && run <= max_window && count <= max_window && at < max_window,
                       plan_errc::bad_state, "cost model with a recent-observation ring out of range");
  m.run_sign_ = static_cast<int>(sign);
  m.run_ = static_cast<unsigned>(run);
  m.recent_count_ = static_cast<std::size_t>(count);
  m.recent_head_ = static_cast<std::size_t>(at);
  for (timing_sample& t : m.recent_) {
    t.batch = static_cast<std::size_t>(r.u64());
    t.seconds = r.f64();
    EBBFLOW_PLAN_VERIFY(std::isfinite(t.seconds) && t.seconds >= 0, plan_errc::bad_state,
                         "cost model with a recent step time that is not finite");
  }
  EBBFLOW_PLAN_VERIFY(r.at == bytes.size(), plan_errc::bad_state,
                       "cost model of " << bytes.size() << " bytes, expected " << r.at);
  return m;
}

EBBFLOW_DECL cost_model cost_model::from_probe(std::span<const timing_sample> probe, cost_model_options opts) {
  cost_model m(opts);
  for (const timing_sample& s : probe) {
    EBBFLOW_PLAN_ENFORCE(std::isfinite(s.seconds) && s.seconds > 0, plan_errc::bad_observation,
                         "probe step of batch " << s.batch << " took " << s.seconds << " s");
    // A probe is a short controlled measurement: all of it counts.
    m.add(static_cast<double>(s.batch), s.seconds, 1.0, 1.0);
    m.recent_[m.recent_head_] = s;
    m.recent_head_ = (m.recent_head_ + 1) % max_window;
    m.recent_count_ = std::min(m.recent_count_ + 1, max_window);
    ++m.used_;
  }
  if (m.used_ == 0) return m;
  m.refit(2);  // a controlled probe pins the slope with two batch sizes
  double dev = 0;
  for (const timing_sample& s : probe) dev += std::abs(s.seconds - m.predict(s.batch));
  dev /= static_cast<double>(probe.size());
  // Two points fit exactly: do not trust a zero residual as the noise level.
  const double typical = m.wt_ / m.w_;
  m.scale_ = probe.size() > 2 ? std::max(dev, opts.min_rel_scale * typical) : opts.initial_rel_scale * typical;
  return m;
}

EBBFLOW_DECL void cost_model::add(double b, double t, double weight, double lambda) noexcept {
  if (w_ == 0) b0_ = b;
  const double x = b - b0_;
  w_ = lambda * w_ + weight;
  wb_ = lambda * wb_ + weight * x;
  wbb_ = lambda * wbb_ + weight * x * x;
  wt_ = lambda * wt_ + weight * t;
  wbt_ = lambda * wbt_ + weight * x * t;
}

EBBFLOW_DECL void cost_model::refit(double min_samples) noexcept {
  const double mb = wb_ / w_, mt = wt_ / w_;
  const double var = std::max(wbb_ / w_ - mb * mb, 0.0);
  const double cov = wbt_ / w_ - mb * mt;
  const double mean_b = mb + b0_;
  const double spread = opts_.min_batch_spread * mean_b;
  full_fit_ = false;
  if (var > 0 && var > spread * spread && w_ >= min_samples) {
    double c = cov / var;
    double a = mt - c * mb - c * b0_;
    if (c > 0 && a < 0) {
      // Through the origin: a = 0, c = Σwbt / Σwb² in unshifted terms.
      const double sbt = wbt_ + b0_ * wt_;
      const double sbb = wbb_ + 2 * b0_ * wb_ + b0_ * b0_ * w_;
      a = 0;
      c = sbb > 0 ? sbt / sbb : 0;
    }
    if (c > 0 && std::isfinite(c) && std::isfinite(a)) {
      a_ = a;
      c_ = c;
      shape_a_ = a;
      shape_c_ = c;
      full_fit_ = true;
      return;
    }
  }
  // Slope not identified: keep the shape a : c, fit the common scale.
  const double f = shape_a_ + shape_c_ * mean_b;
  if (f > 0) {
    const double k = mt / f;
    a_ = k * shape_a_;
    c_ = k * shape_c_;
  } else {
    a_ = mt;  // only empty batches seen: they measure a alone
  }
}

EBBFLOW_DECL void cost_model::restart_from_recent() noexcept {
  const double rel = scale_ / std::max(wt_ / w_, std::numeric_limits<double>::min());
  w_ = wb_ = wbb_ = wt_ = wbt_ = 0;
  const std::size_t k = std::min<std::size_t>(opts_.change_window, recent_count_);
  for (std::size_t j = k; j > 0; --j) {
    const timing_sample& s = recent_[(recent_head_ + max_window - j) % max_window];
    add(static_cast<double>(s.batch), s.seconds, 1.0, 1.0);
  }
  // A few points cannot pin the slope: keep the shape, fit the scale.
  refit(opts_.min_slope_samples);
  scale_ = rel * (wt_ / w_);
  ew_r_ = ew_abs_r_ = 0;
}

EBBFLOW_DECL observation_kind cost_model::observe(std::size_t batch, double seconds) {
  EBBFLOW_PLAN_ENFORCE(std::isfinite(seconds) && seconds > 0, plan_errc::bad_observation,
                       "a step of batch " << batch << " took " << seconds << " s");
  recent_[recent_head_] = timing_sample{batch, seconds};
  recent_head_ = (recent_head_ + 1) % max_window;
  recent_count_ = std::min(recent_count_ + 1, max_window);
  const auto b = static_cast<double>(batch);
  if (used_ == 0) {
    add(b, seconds, 1.0, lambda_);
    refit(opts_.min_slope_samples);
    scale_ = opts_.initial_rel_scale * seconds;
    ++used_;
    return observation_kind::accepted;
  }
  const double pred = predict(batch);
  const double r = seconds - pred;
  const double s = std::max(scale_, opts_.min_rel_scale * std::abs(pred));
  const double z = std::abs(r) / s;
  if (z > opts_.change_k) {
    const int sign = r > 0 ? 1 : -1;
    run_ = sign == run_sign_ ? run_ + 1 : 1;
    run_sign_ = sign;
  } else {
    run_ = 0;
    run_sign_ = 0;
  }
  if (run_ >= opts_.change_window) {
    restart_from_recent();
    run_ = 0;
    run_sign_ = 0;
    ++changes_;
    ++used_;
    return observation_kind::change;
  }
  if (z > opts_.reject_k) {
    ++outliers_;
    return observation_kind::outlier;
  }
  // Tracking signal over about the last 7 used observations (Trigg).
  const double rc = std::clamp(r, -opts_.huber_k * s, opts_.huber_k * s);
  ew_r_ = 0.85 * ew_r_ + 0.15 * rc;
  ew_abs_r_ = 0.85 * ew_abs_r_ + 0.15 * std::abs(rc);
  const bool drifting = used_ >= 8 && std::abs(tracking_signal()) > opts_.drift_signal;
  // While drifting, large residuals are the trend, not noise: full weight.
  const double h = z <= opts_.huber_k || drifting ? 1.0 : opts_.huber_k / z;
  add(b, seconds, h, drifting ? lambda_fast_ : lambda_);
  const double alpha = std::max(1.0 / static_cast<double>(used_ + 1), 1.0 - lambda_);
  scale_ = (1 - alpha) * scale_ + alpha * std::min(std::abs(r), opts_.huber_k * s);
  refit(opts_.min_slope_samples);
  ++used_;
  return h == 1.0 ? observation_kind::accepted : observation_kind::downweighted;
}

EBBFLOW_DECL double cost_model::relative_error() const noexcept {
  if (used_ == 0 || w_ <= 0) return std::numeric_limits<double>::infinity();
  const double mean_t = wt_ / w_;
  return 1.25 * scale_ / mean_t / std::sqrt(w_);
}

EBBFLOW_DECL double cost_model::confidence() const noexcept {
  const double e = relative_error();
  if (!std::isfinite(e)) return 0;
  const double q = e / 0.01;
  return 1.0 / (1.0 + q * q);
}

}  // namespace plan
EBBFLOW_END_NAMESPACE
#endif  // EBBFLOW_HEADER_ONLY
// ---- end <ebbflow/plan/impl/cost_model.hpp>
// ---- end <ebbflow/plan/cost_model.hpp>
// #include <ebbflow/plan/plan_error.hpp>  (inlined)

#include <cstddef>
#include <cstdint>
#include <concepts>
#include <map>
#include <ranges>
#include <span>
#include <utility>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace plan {

//! A range of integer worker ids (`std::vector<std::uint64_t>`, a span of
//! the group's member ids, ...).
template <class R>
concept id_range = std::ranges::input_range<R> && std::integral<std::ranges::range_value_t<R>>;

//! The cost models of a changing set of workers, keyed by worker id. Value
//! type. Fed the same observations in the same order, every rank holds the
//! same models and so computes the same specs, bit for bit.
class worker_models {
 public:
  //! No models yet. `opts` applies to every model made.
  explicit worker_models(cost_model_options opts = {}) : opts_(opts) {}

  //! Feeds worker `id`'s step: `batch` samples took `seconds`. A zero batch
  //! (a worker given no samples still reports its step time) or a time that
  //! is not positive (or NaN) is ignored: returns false.
  //! @throws plan_error(bad_observation) as `cost_model::observe` (an infinite time).
  bool observe(std::uint64_t id, std::size_t batch, double seconds) {
    if (batch == 0 || !(seconds > 0)) return false;
    models_.try_emplace(id, opts_).first->second.observe(batch, seconds);
    return true;
  }

  //! The model of worker `id` when it is fitted (ready, with a positive
  //! seconds per sample), else nullptr.
  [[nodiscard]] const cost_model* fitted(std::uint64_t id) const {
    auto it = models_.find(id);
    return it != models_.end() && it->second.ready() && it->second.c() > 0 ? &it->second : nullptr;
  }

  //! True when at least one of `ids` (a range of integer worker ids) has a fitted model.
  template <id_range Ids>
  [[nodiscard]] bool any_fitted(const Ids& ids) const {
    for (auto id : ids)
      if (fitted(static_cast<std::uint64_t>(id))) return true;
    return false;
  }

  //! The specs of `ids`, in that order (rank order), each capped at
  //! `max_batch`. A worker without a fitted model gets the mean a and c of
  //! the fitted ones among `ids`; when none is fitted, every worker gets
  //! a = 0, c = 1 marked `placeholder`, whose optimal plan is the uniform
  //! split and whose predicted step time is NaN (not known).
  template <id_range Ids>
  [[nodiscard]] std::vector<worker_spec> specs(const Ids& ids, std::size_t max_batch) const {
    double sa = 0, sc = 0;
    int k = 0;
    for (auto id : ids)
      if (const auto* m = fitted(static_cast<std::uint64_t>(id))) sa += m->a(), sc += m->c(), ++k;
    const double mean_a = k ? sa / k : 0, mean_c = k ? sc / k : 1;
    std::vector<worker_spec> out;
    for (auto id : ids) {
      const auto u = static_cast<std::uint64_t>(id);
      const auto* m = fitted(u);
      out.push_back({u, m ? m->a() : mean_a, m ? m->c() : mean_c, max_batch, 0, 0, k == 0});
    }
    return out;
  }

  //! Forgets worker `id` (it left; a worker that comes back starts afresh).
  void erase(std::uint64_t id) { models_.erase(id); }

  //! Every model with its worker id, as bytes (`cost_model::encode` each),
  //! for `decode` on a worker that joins: it then computes the same specs.
  [[nodiscard]] std::vector<std::byte> encode() const {
    detail::model_writer w;
    w.u64(models_.size());
    for (const auto& [id, m] : models_) {
      const auto b = m.encode();
      w.u64(id);
      w.u64(b.size());
      w.out.insert(w.out.end(), b.begin(), b.end());
    }
    return std::move(w.out);
  }
  //! The models `encode` wrote (options from the bytes; `opts` for models
  //! made later). @throws plan_fault(bad_state) for bytes that are not that.
  [[nodiscard]] static worker_models decode(std::span<const std::byte> bytes, cost_model_options opts = {}) {
    detail::model_reader r{bytes};
    worker_models out(opts);
    for (std::uint64_t n = r.u64(), k = 0; k < n; ++k) {
      const std::uint64_t id = r.u64(), len = r.u64();
      EBBFLOW_PLAN_VERIFY(len <= bytes.size() - r.at, plan_errc::bad_state,
                          "cost model of worker " << id << ": " << len << " bytes, " << bytes.size() - r.at << " left");
      EBBFLOW_PLAN_VERIFY(out.models_.try_emplace(id, cost_model::decode(bytes.subspan(r.at, len))).second,
                          plan_errc::bad_state, "cost model of worker " << id << " twice");
      r.at += len;
    }
    EBBFLOW_PLAN_VERIFY(r.at == bytes.size(), plan_errc::bad_state,
                        "cost models of " << bytes.size() << " bytes, " << bytes.size() - r.at << " left over");
    return out;
  }

 private:
  cost_model_options opts_;
  std::map<std::uint64_t, cost_model> models_;
};

//! The former name of `worker_models` (and of its header, plan/cost_models.hpp),
//! kept for one release and then removed.
using cost_models = worker_models;

}  // namespace plan
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/plan/worker_models.hpp>
// #include <ebbflow/plan/replanner.hpp>  (inlined here)
// ---- begin <ebbflow/plan/replanner.hpp>
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


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/enum_names.hpp>  (inlined)
// #include <ebbflow/plan/batch_planner.hpp>  (inlined)

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

// #include <ebbflow/plan/impl/replanner.hpp>  (inlined here)
// ---- begin <ebbflow/plan/impl/replanner.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file impl/replanner.hpp
//! Definitions for plan/replanner.hpp.


// #include <ebbflow/plan/replanner.hpp>  (inlined)

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
// ---- end <ebbflow/plan/impl/replanner.hpp>
// ---- end <ebbflow/plan/replanner.hpp>

#include <map>
#include <span>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

//! Settings of `planner_policy`.
struct planner_policy_options {
  std::size_t max_batch = 1u << 30;  //!< memory cap m_i applied to every member
  plan::cost_model_options model{};  //!< per-member cost model settings
  plan::replan_options replan{};     //!< drift threshold and hysteresis
};

//! Plans with per-member robust cost models and the exact batch planner;
//! observations with a zero batch or a non-positive time are ignored. Until
//! any member has a fitted model it plans uniformly. Not thread-safe (see
//! `planning_policy`).
class planner_policy final : public planning_policy {
 public:
  //! A policy with no observations yet (plans uniformly until models fit).
  explicit planner_policy(planner_policy_options o = {}) : opts_(o), models_(o.model) {}

  void observe(member_id m, std::size_t batch, double seconds) override;
  std::vector<std::size_t> plan(std::span<const member_id> members, std::size_t global_batch) override;
  bool should_replan(std::span<const member_id> members, std::span<const std::size_t> current,
                     std::size_t global_batch) override;
  std::vector<member_model> models(std::span<const member_id> members) const override;

  //! The model of member `m`, or nullptr when it has no fitted one yet.
  [[nodiscard]] const plan::cost_model* model(member_id m) const {
    return models_.fitted(static_cast<std::uint64_t>(m));
  }

 private:
  // Specs in rank order (newcomers: the others' mean model); empty when
  // nobody has a fitted model (then the caller plans uniformly).
  std::vector<plan::worker_spec> specs_of(std::span<const member_id> members) const;

  planner_policy_options opts_;
  plan::worker_models models_;
  unsigned streak_ = 0;
};

}  // namespace elastic
EBBFLOW_END_NAMESPACE

// #include <ebbflow/elastic/impl/planner_policy.hpp>  (inlined here)
// ---- begin <ebbflow/elastic/impl/planner_policy.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file impl/planner_policy.hpp
//! Definitions of elastic/planner_policy.hpp.


// #include <ebbflow/elastic/planner_policy.hpp>  (inlined)

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
// ---- end <ebbflow/elastic/impl/planner_policy.hpp>
// ==== end <ebbflow/elastic/planner_policy.hpp>

// ==== begin <ebbflow/elastic/policy.hpp> ==================================
// SPDX-License-Identifier: Apache-2.0
//! @file policy.hpp
//! Renamed elastic/planning_policy.hpp (`planning_policy`, `uniform_policy`,
//! `member_id`, `scale_plan`); this compatibility include goes in the next
//! release.


// #include <ebbflow/elastic/planning_policy.hpp>  (inlined)
// ==== end <ebbflow/elastic/policy.hpp>

// ==== begin <ebbflow/elastic/store.hpp> ===================================
#if EBBFLOW_HAS_ASIO
// SPDX-License-Identifier: Apache-2.0
//! @file store.hpp
//! Renamed elastic/tcp_store.hpp (the TCP rendezvous store's server and
//! client); this compatibility include goes in the next release.


// #include <ebbflow/elastic/tcp_store.hpp>  (inlined)
#endif  // EBBFLOW_HAS_ASIO
// ==== end <ebbflow/elastic/store.hpp>

// ==== begin <ebbflow/elastic/store_address_exchange.hpp> ==================
// SPDX-License-Identifier: Apache-2.0
//! @file store_address_exchange.hpp
//! `store_address_exchange`: publishes transport addresses through the
//! rendezvous store (any `kv_store`), for a fixed-size job started by
//! `ebbflow-run`, torchrun, mpirun or Slurm: each rank sets
//! `<prefix>/addr/<generation>/<rank>` and waits (server side) for the others.
//! Models `comm::ucx::address_exchange` (and any exchange of that shape).


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/deadline.hpp>  (inlined)
// #include <ebbflow/core/error.hpp>  (inlined)
// #include <ebbflow/elastic/kv_store.hpp>  (inlined)

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

//! Address exchange through a `kv_store` (see the file comment). Holds a
//! pointer to the store, not the store; concurrent calls are as safe as the
//! store's calls are.
template <kv_store Store>
class store_address_exchange {
 public:
  //! `store` must outlive the exchange; `prefix` separates jobs sharing a store.
  explicit store_address_exchange(Store& store, std::string prefix = "ebbflow")
      : store_(&store), prefix_(std::move(prefix)) {}

  //! Publishes `mine` for (generation, rank) and returns every rank's address
  //! by rank. Blocks until all `size` ranks published or `d` passes.
  //! @throws system_error (errc::timeout naming the generation) or the store's errors.
  std::vector<std::vector<std::byte>> operator()(std::int64_t generation, int rank, int size,
                                                 std::span<const std::byte> mine, deadline d) const {
    EBBFLOW_ENFORCE(size > 0 && rank >= 0 && rank < size,
                    "store_address_exchange: rank " << rank << " outside [0, " << size << ")");
    auto key = [&](int r) { return prefix_ + "/addr/" + std::to_string(generation) + "/" + std::to_string(r); };
    store_->set(key(rank), to_value(mine), d);
    std::vector<std::string> keys;
    for (int r = 0; r < size; ++r) keys.push_back(key(r));
    store_->wait(keys, d);
    std::vector<std::vector<std::byte>> all;
    for (int r = 0; r < size; ++r) {
      auto v = store_->try_get(keys[static_cast<std::size_t>(r)], d);
      if (!v)
        throw system_error(make_error_code(error::invalid_state), {.rank = rank,
                                                                   .generation = generation,
                                                                   .peer = r,
                                                                   .operation = "address exchange",
                                                                   .detail = "key vanished from the store"});
      all.push_back(to_bytes(*v));
    }
    return all;
  }

 private:
  Store* store_;
  std::string prefix_;
};

}  // namespace elastic
EBBFLOW_END_NAMESPACE
// ==== end <ebbflow/elastic/store_address_exchange.hpp>

// ==== begin <ebbflow/plan.hpp> ============================================
// SPDX-License-Identifier: Apache-2.0
//! @file plan.hpp
//! The heterogeneity-aware batch planner in one include: online cost models,
//! the exact batch-size solver, the re-planning policy, the exactly-once
//! samplers and in-step work stealing. Depends on core/ only; links nothing.


// #include <ebbflow/plan/plan_error.hpp>  (inlined)
// #include <ebbflow/plan/batch_planner.hpp>  (inlined)
// #include <ebbflow/plan/cost_model.hpp>  (inlined)
// #include <ebbflow/plan/replanner.hpp>  (inlined)
// #include <ebbflow/plan/sampler.hpp>  (inlined)
// #include <ebbflow/plan/shard_sampler.hpp>  (inlined here)
// ---- begin <ebbflow/plan/shard_sampler.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file shard_sampler.hpp
//! Exactly-once sampling of a data set partitioned into shards across nodes.
//!
//! The data set is shards 0..S-1 of the given sizes; shard j holds the global
//! indices [start_j, start_j + size_j). Each shard is owned by one member and
//! only its owner reads it. Within an epoch each shard is visited in its own
//! keyed pseudo-random order (`epoch_permutation` of (seed, epoch, j)), and a
//! per-shard cursor counts what committed steps consumed.
//!
//! Ownership (`rebalance`, deterministic): at the start of an epoch every
//! shard is assigned, largest first, to the member whose share of the samples
//! so far is furthest below its plan weight b_r / B, so that fast workers get
//! more data and pools run dry at about the same time. On a membership change
//! mid-epoch, survivors keep their shards (locality) and only shards whose
//! owner left, or whose owner's plan gives it b_r = 0, go with their cursors
//! to members with b_r > 0 the same way. A joiner gets shards from the next
//! epoch on (it trains on b_r = 0 samples until then, or re-plan it with
//! min/max 0).
//!
//! A step: rank r takes up to b_r samples from its own unfinished shards in
//! shard order. Near the end of an epoch a pool can hold fewer than b_r, so the
//! step's real sizes are `actual(plan)` (use its weights for the gradients).
//! `commit` advances the cursors; a rolled-back step does not. Every sample is
//! read exactly once per epoch, by the owner of its shard at that time.
//!
//! Thread safety: a value type; const members may run concurrently.
//! Errors: plan_error (bad_dataset, bad_rank, stale_plan, membership_mismatch).


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/plan/batch_planner.hpp>  (inlined)
// #include <ebbflow/plan/plan_error.hpp>  (inlined)
// #include <ebbflow/plan/sampler.hpp>  (inlined)

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace plan {

//! Positions [first, last) of shard `shard`'s order in one epoch.
struct shard_range {
  std::uint64_t shard = 0;  //!< shard index j
  std::uint64_t first = 0;  //!< first position in the shard's order (inclusive)
  std::uint64_t last = 0;   //!< last position (exclusive)
};

//! Exactly-once sampler over a sharded data set. Value type.
class shard_sampler {
 public:
  //! @throws plan_error(bad_dataset) when there are no shards or one is empty.
  shard_sampler(std::vector<std::uint64_t> shard_sizes, std::uint64_t seed)
      : sizes_(std::move(shard_sizes)), seed_(seed) {
    EBBFLOW_PLAN_ENFORCE(!sizes_.empty(), plan_errc::bad_dataset, "no shards");
    starts_.resize(sizes_.size());
    std::uint64_t at = 0;
    for (std::size_t j = 0; j < sizes_.size(); ++j) {
      EBBFLOW_PLAN_ENFORCE(sizes_[j] > 0, plan_errc::bad_dataset, "shard " << j << " is empty");
      EBBFLOW_PLAN_ENFORCE(sizes_[j] <= std::numeric_limits<std::uint64_t>::max() - at, plan_errc::bad_dataset,
                           "shard sizes sum past 2^64 at shard " << j);
      starts_[j] = at;
      at += sizes_[j];
    }
    cursor_.assign(sizes_.size(), 0);
    owner_.assign(sizes_.size(), unowned);
  }

  //! Owner id of a shard that no member owns yet (so not a valid worker id:
  //! a plan that uses it is a plan_error(membership_mismatch)).
  static constexpr std::uint64_t unowned = std::numeric_limits<std::uint64_t>::max();

  //! The current epoch (starts at 0).
  [[nodiscard]] std::uint64_t epoch() const noexcept { return epoch_; }
  //! Owner id of each shard (`unowned` before the first rebalance of an epoch).
  [[nodiscard]] const std::vector<std::uint64_t>& owners() const noexcept { return owner_; }
  //! Consumed positions of each shard in this epoch.
  [[nodiscard]] const std::vector<std::uint64_t>& cursors() const noexcept { return cursor_; }

  //! Assigns shards to the plan's members (see the file comment). Call it
  //! whenever the membership changes; `slice` and `commit` call it themselves
  //! when they find shards without a live owner. O(S·n).
  void rebalance(const batch_plan& plan) {
    EBBFLOW_PLAN_ENFORCE(plan.size() > 0 && plan.global_batch > 0, plan_errc::empty_membership, "empty plan");
    const std::size_t n = plan.size();
    for (std::uint64_t id : plan.worker_ids)  // the id that marks a shard without an owner
      EBBFLOW_PLAN_ENFORCE(id != unowned, plan_errc::membership_mismatch,
                           "worker id " << id << " is reserved (shard_sampler::unowned)");
    std::vector<double> held(n, 0);  // samples left in shards each member keeps
    std::vector<std::size_t> orphan;
    for (std::size_t j = 0; j < sizes_.size(); ++j) {
      if (cursor_[j] == sizes_[j]) continue;
      const std::size_t r = keeper(plan, j);
      if (r < n)
        held[r] += static_cast<double>(sizes_[j] - cursor_[j]);
      else
        orphan.push_back(j);
    }
    std::stable_sort(orphan.begin(), orphan.end(),
                     [&](std::size_t x, std::size_t y) { return sizes_[x] - cursor_[x] > sizes_[y] - cursor_[y]; });
    double total = 0;
    for (double h : held) total += h;
    for (std::size_t j : orphan) total += static_cast<double>(sizes_[j] - cursor_[j]);
    for (std::size_t j : orphan) {
      std::size_t best = 0;
      double best_gap = -std::numeric_limits<double>::infinity();
      for (std::size_t r = 0; r < n; ++r) {
        if (plan.batch[r] == 0) continue;  // global_batch > 0: some member takes samples
        const double gap = plan.weight(r) * total - held[r];
        if (gap > best_gap) {
          best_gap = gap;
          best = r;
        }
      }
      owner_[j] = plan.worker_ids[best];
      held[best] += static_cast<double>(sizes_[j] - cursor_[j]);
    }
  }

  //! The shard ranges rank `rank` reads in the next step under `plan`.
  //! @throws plan_error(bad_rank | stale_plan)
  [[nodiscard]] std::vector<shard_range> slice(const batch_plan& plan, std::size_t rank) const {
    shard_sampler s = *this;  // keep const: ownership repair happens on a copy
    s.prepare(plan);
    EBBFLOW_PLAN_ENFORCE(rank < plan.size(), plan_errc::bad_rank,
                         "rank " << rank << " outside plan v" << plan.version << " of " << plan.size() << " workers");
    return s.take(plan.worker_ids[rank], plan.batch[rank]);
  }

  //! The data-set index at position `pos` of shard `shard` in this epoch.
  //! @throws plan_error(bad_rank) when `shard` or `pos` is out of range.
  [[nodiscard]] std::uint64_t index(std::uint64_t shard, std::uint64_t pos) const {
    EBBFLOW_PLAN_ENFORCE(
        shard < sizes_.size() && pos < sizes_[shard], plan_errc::bad_rank,
        "position " << pos << " of shard " << shard << " outside the data set (" << sizes_.size() << " shards"
                    << (shard < sizes_.size() ? ", this one of " + std::to_string(sizes_[shard]) : std::string())
                    << ")");
    return starts_[shard] + epoch_permutation(sizes_[shard], seed_ ^ (shard * 0x9e3779b97f4a7c15ULL), epoch_)(pos);
  }

  //! The sizes each rank really gets in the next step (b_r, or less where its
  //! pool runs dry), as a plan with the same version: use its weights.
  [[nodiscard]] batch_plan actual(const batch_plan& plan) const {
    shard_sampler s = *this;
    s.prepare(plan);
    batch_plan out = plan;
    out.offsets.assign(plan.size() + 1, 0);
    for (std::size_t r = 0; r < plan.size(); ++r) {
      std::uint64_t got = 0;
      for (const shard_range& x : s.take(plan.worker_ids[r], plan.batch[r])) got += x.last - x.first;
      out.batch[r] = static_cast<std::size_t>(got);
      out.offsets[r + 1] = out.offsets[r] + out.batch[r];
    }
    out.global_batch = out.offsets.back();
    return out;
  }

  //! Commits the step made under `plan`. @throws plan_error(stale_plan)
  void commit(const batch_plan& plan) {
    prepare(plan);
    for (std::size_t r = 0; r < plan.size(); ++r)
      for (const shard_range& x : take(plan.worker_ids[r], plan.batch[r])) cursor_[x.shard] = x.last;
    plan_version_ = plan.version;
    if (std::equal(cursor_.begin(), cursor_.end(), sizes_.begin())) {  // epoch done
      ++epoch_;
      std::fill(cursor_.begin(), cursor_.end(), 0);
      std::fill(owner_.begin(), owner_.end(), unowned);
    }
  }

 private:
  // The rank under `plan` that keeps shard j, or plan.size() when the shard
  // is an orphan: its owner left, or takes no samples in this plan (b_r = 0:
  // its pool would never be read and the epoch never end).
  std::size_t keeper(const batch_plan& plan, std::size_t j) const {
    const std::size_t r = owner_[j] == unowned ? plan.size() : plan.rank_of(owner_[j]);
    return r < plan.size() && plan.batch[r] > 0 ? r : plan.size();
  }

  void prepare(const batch_plan& plan) {
    EBBFLOW_PLAN_ENFORCE(plan.version >= plan_version_, plan_errc::stale_plan,
                         "plan v" << plan.version << " is older than the committed plan v" << plan_version_);
    for (std::size_t j = 0; j < sizes_.size(); ++j) {
      if (cursor_[j] == sizes_[j]) continue;
      if (keeper(plan, j) == plan.size()) {
        rebalance(plan);
        return;
      }
    }
  }

  std::vector<shard_range> take(std::uint64_t id, std::size_t want) const {
    std::vector<shard_range> out;
    for (std::size_t j = 0; j < sizes_.size() && want > 0; ++j) {
      if (owner_[j] != id || cursor_[j] == sizes_[j]) continue;
      const std::uint64_t n = std::min<std::uint64_t>(want, sizes_[j] - cursor_[j]);
      out.push_back({j, cursor_[j], cursor_[j] + n});
      want -= static_cast<std::size_t>(n);
    }
    return out;
  }

  std::vector<std::uint64_t> sizes_, starts_, cursor_, owner_;
  std::uint64_t seed_;
  std::uint64_t epoch_ = 0;
  std::uint64_t plan_version_ = 0;
};

}  // namespace plan
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/plan/shard_sampler.hpp>
// #include <ebbflow/plan/work_stealing.hpp>  (inlined)
// #include <ebbflow/plan/worker_models.hpp>  (inlined)
// ==== end <ebbflow/plan.hpp>

// ==== begin <ebbflow/plan/cost_models.hpp> ================================
// SPDX-License-Identifier: Apache-2.0
//! @file cost_models.hpp
//! Renamed to plan/worker_models.hpp (`plan::cost_models` is now
//! `plan::worker_models`); this compatibility include, like the old name, is
//! kept for one release and then removed. Include the new header instead.


// #include <ebbflow/plan/worker_models.hpp>  (inlined)
// ==== end <ebbflow/plan/cost_models.hpp>

// ==== begin <ebbflow/plan/replan_policy.hpp> ==============================
// SPDX-License-Identifier: Apache-2.0
//! @file replan_policy.hpp
//! Renamed to plan/replanner.hpp (the header of `plan::replanner`); this
//! compatibility include is kept for one release and then removed. Include
//! the new header instead.


// #include <ebbflow/plan/replanner.hpp>  (inlined)
// ==== end <ebbflow/plan/replan_policy.hpp>

// ==== begin <ebbflow/prefetch/cuda_stage.hpp> =============================
// SPDX-License-Identifier: Apache-2.0
//! @file cuda_stage.hpp
//! The CUDA device stage and pinned allocator for the prefetcher. Uses the
//! CUDA runtime API only (no kernels), so it compiles with a host compiler as
//! well as nvcc.
//!
//! Opt-in: this header is not included by prefetcher.hpp. Including it means
//! the program must link the CUDA runtime (CMake: `ebbflow::cuda`). Without
//! the CUDA headers on the include path, or with `EBBFLOW_NO_CUDA` defined
//! (`EBBFLOW_HAS_CUDA` is 0), it declares nothing, and a use of `cuda_stage`
//! fails to compile as an unknown name. It is not an `#error`, because the
//! umbrella `<ebbflow/ebbflow.hpp>`, the single-include header and the
//! header self-containment tests include it in builds without CUDA.
//!
//! * `cuda_host_allocator()`: staging memory from `cudaHostAlloc` (portable,
//!   page-locked), so host-to-device copies are truly asynchronous.
//! * `cuda_stage`: per local device, one dedicated non-blocking copy stream;
//!   per ring slot and device, one device buffer and two events. `copy` enqueues
//!   `cudaMemcpyAsync` on the copy stream and records the slot's *ready*
//!   event; the consumer makes its compute stream wait on that event
//!   (`batch.event(d).wait(stream)`, no host synchronisation). When the batch
//!   is released, a *consumed* event is recorded on the stream the consumer
//!   waited with (the legacy default stream if it never did), and the next
//!   copy into that buffer waits for it on the copy stream, so the prefetcher
//!   never overwrites a buffer that queued kernels still read. Only the
//!   prefetcher's copy thread ever blocks on an event (`finish`), to know when
//!   the staging bytes may be reused.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/error.hpp>  (inlined)
// #include <ebbflow/core/log.hpp>  (inlined)
// #include <ebbflow/core/memory.hpp>  (inlined)
// #include <ebbflow/prefetch/device_stage.hpp>  (inlined here)
// ---- begin <ebbflow/prefetch/device_stage.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file device_stage.hpp
//! The `device_stage` concept: how the prefetcher moves a loaded sub-batch
//! from its page-locked staging bytes to a device, and `cpu_stage`, the model
//! used on the CPU executor (a copy thread into "device" host buffers, so the
//! whole pipeline runs in tests without a GPU). `cuda_stage`
//! (prefetch/cuda_stage.hpp) is the CUDA model: asynchronous copies on one
//! dedicated stream per device, completion signalled by events.
//!
//! Contract (the prefetcher calls these; users rarely do):
//! * `prepare(slots, capacity)` once, before anything else: allocate, for
//!   each of `slots` ring slots and each device, a buffer of `capacity` bytes
//!   in `S::space` memory. Never called again: stage memory never grows.
//! * `devices()` the number of local devices; `buffer(slot, d)` the buffer.
//! * `copy(slot, d, src)`: start copying host bytes `src` (page-locked) into
//!   `buffer(slot, d)`; may return before the copy ended. Called on the
//!   prefetcher's copy thread only. Before overwriting the buffer the stage
//!   must respect `consumed(slot)` (work the consumer queued on the previous
//!   contents must have finished reading them).
//! * `finish(slot)`: block the copy thread until every copy of `slot` has
//!   finished reading its `src` (the staging bytes are then reused).
//! * `event(slot, d)`: a readiness event of type `S::event_type` that the
//!   consumer waits on (on its stream for CUDA) before using the buffer.
//! * `consumed(slot)`: the consumer released the batch in `slot`; called on
//!   the consumer's thread.
//! Errors: members may throw; the prefetcher reports a throwing `copy` or
//! `finish` at the step it belongs to.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/error.hpp>  (inlined)
// #include <ebbflow/core/memory.hpp>  (inlined)

#include <concepts>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace prefetch {

template <class S>
concept device_stage = requires(S& s, std::size_t slot, std::size_t dev, std::span<const std::byte> src) {
  { S::space } -> std::convertible_to<memory_space>;
  typename S::event_type;
  s.prepare(slot, dev);
  { s.devices() } -> std::convertible_to<std::size_t>;
  { s.buffer(slot, dev) } -> std::same_as<std::byte*>;
  s.copy(slot, dev, src);
  s.finish(slot);
  { s.event(slot, dev) } -> std::same_as<typename S::event_type>;
  s.consumed(slot);
};

//! Readiness of a CPU-stage buffer: the copy thread finished the copy before
//! the batch was handed out, so it is always ready.
struct host_event {
  [[nodiscard]] constexpr bool ready() const noexcept { return true; }  //!< always true
  constexpr void wait() const noexcept {}                               //!< returns at once
};

//! The CPU executor's device stage: `devices` host buffers per slot, filled by
//! `memcpy` on the prefetcher's copy thread. Memory space: host.
//! Not thread-safe on its own; the prefetcher serialises access per slot.
class cpu_stage {
 public:
  static constexpr memory_space space = memory_space::host;  //!< stage buffers are ordinary host memory
  using event_type = host_event;                             //!< always-ready event

  //! @throws std::invalid_argument when devices is 0.
  explicit cpu_stage(std::size_t devices = 1) : devices_(devices) {
    EBBFLOW_ENFORCE(devices > 0, "cpu_stage: need at least one device");
  }

  //! Allocates and zero-fills `slots` × `devices()` host buffers of `capacity`
  //! bytes (at least 1). @throws std::invalid_argument when called twice,
  //! std::bad_alloc.
  void prepare(std::size_t slots, std::size_t capacity) {
    EBBFLOW_ENFORCE(buffers_.empty(), "cpu_stage: prepare() called twice");
    capacity_ = capacity;
    buffers_.reserve(slots * devices_);
    for (std::size_t i = 0; i < slots * devices_; ++i) {
      // Allocated once and touched, so they are resident from the start.
      auto p = std::unique_ptr<std::byte[]>(new std::byte[capacity > 0 ? capacity : 1]);
      std::memset(p.get(), 0, capacity > 0 ? capacity : 1);
      buffers_.push_back(std::move(p));
    }
  }
  [[nodiscard]] std::size_t devices() const noexcept { return devices_; }  //!< as constructed
  //! Host buffer of (`slot`, `d`), `capacity` bytes; valid after `prepare`
  //! for the stage's lifetime. Indices are not checked.
  [[nodiscard]] std::byte* buffer(std::size_t slot, std::size_t d) const noexcept {
    return buffers_[slot * devices_ + d].get();
  }
  //! Copies host bytes `src` (at most `capacity`) into `buffer(slot, d)`;
  //! synchronous, so the buffer is ready when it returns.
  void copy(std::size_t slot, std::size_t d, std::span<const std::byte> src) {
    EBBFLOW_EXPECTS(src.size() <= capacity_);
    if (!src.empty()) std::memcpy(buffer(slot, d), src.data(), src.size());
  }
  void finish(std::size_t) noexcept {}  //!< no-op: `copy` already finished
  //! An always-ready event (the copy finished inside `copy`).
  [[nodiscard]] event_type event(std::size_t, std::size_t) const noexcept { return {}; }
  void consumed(std::size_t) noexcept {}  //!< no-op: nothing reads the buffer asynchronously
  //! Bytes of stage memory allocated by `prepare`.
  [[nodiscard]] std::size_t bytes() const noexcept { return buffers_.size() * capacity_; }

 private:
  std::size_t devices_;
  std::size_t capacity_ = 0;
  std::vector<std::unique_ptr<std::byte[]>> buffers_;
};
static_assert(device_stage<cpu_stage>);

}  // namespace prefetch
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/prefetch/device_stage.hpp>
// #include <ebbflow/prefetch/pinned_pool.hpp>  (inlined here)
// ---- begin <ebbflow/prefetch/pinned_pool.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file pinned_pool.hpp
//! `pinned_pool`: one page-locked host region of a fixed size, allocated once
//! at construction and carved into leases of any size. The pool never grows:
//! a request that does not fit waits until earlier leases come back (or its
//! deadline passes); a request larger than the whole pool is rejected at once.
//! This is the bound DALI's growing pools lack.
//!
//! How the region is page-locked is chosen by a `host_allocator`:
//! * `mlock_allocator()` (default, this header, no CUDA needed): page-aligned
//!   host memory locked with `mlock(2)`. When locking is not permitted (e.g.
//!   `RLIMIT_MEMLOCK` too low without `CAP_IPC_LOCK`) the memory stays
//!   pageable, the pool still works, `stats().locked` is false and
//!   `stats().lock_status` says why; a warning is logged once.
//! * `prefetch::cuda_host_allocator()` (prefetch/cuda_stage.hpp, CUDA
//!   runtime): `cudaHostAlloc`, which CUDA can DMA from asynchronously.
//!
//! Thread safety: every member function may be called from any thread.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/deadline.hpp>  (inlined)
// #include <ebbflow/core/error.hpp>  (inlined)
// #include <ebbflow/core/log.hpp>  (inlined)

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>

EBBFLOW_BEGIN_NAMESPACE
namespace prefetch {

//! How a pool obtains and frees its one region. Plain function pointers: the
//! choice is made at run time (CUDA present or not) and happens once per pool.
struct host_allocator {
  //! Returns `bytes` of host memory (or nullptr). Sets `locked` when the
  //! memory is page-locked and otherwise writes the reason to `status`.
  void* (*allocate)(std::size_t bytes, bool& locked, std::string& status) = nullptr;
  //! Frees what `allocate` returned. Must not throw.
  void (*deallocate)(void* p, std::size_t bytes) noexcept = nullptr;
  //! Short name for logs and statistics ("mlock", "cudaHostAlloc", ...).
  const char* name = "";
};

//! Page-aligned host memory, locked with `mlock` when permitted (see file doc).
[[nodiscard]] host_allocator mlock_allocator() noexcept;
//! Plain pageable host memory, never locked (for comparisons and tests).
[[nodiscard]] host_allocator pageable_allocator() noexcept;

//! A snapshot of a pool's counters.
struct pool_stats {
  std::size_t capacity = 0;      //!< bytes of the region (fixed for the pool's life)
  std::size_t in_use = 0;        //!< bytes currently leased
  std::size_t peak = 0;          //!< largest `in_use` ever observed
  std::size_t leases = 0;        //!< leases currently outstanding
  std::size_t allocations = 0;   //!< regions allocated (1 for the pool's life: it never grows)
  bool locked = false;           //!< the region is page-locked
  std::string allocator = {};    //!< allocator name
  std::string lock_status = {};  //!< why the region is not locked (empty when it is)
};

class pinned_pool;

//! A leased range of a pool's region (host memory, page-locked when the pool
//! is). Move-only; gives its bytes back on destruction or `reset()`.
//! Not thread-safe itself; the pool it returns to is.
class pinned_lease {
 public:
  pinned_lease() noexcept = default;
  //! Takes over `o`'s bytes; `o` becomes empty.
  pinned_lease(pinned_lease&& o) noexcept
      : pool_(std::exchange(o.pool_, nullptr)), offset_(o.offset_), bytes_(o.bytes_), data_(o.data_) {}
  //! Gives this lease's bytes back, then takes over `o`'s; `o` becomes empty.
  pinned_lease& operator=(pinned_lease&& o) noexcept {
    if (this != &o) {
      reset();
      pool_ = std::exchange(o.pool_, nullptr);
      offset_ = o.offset_;
      bytes_ = o.bytes_;
      data_ = o.data_;
    }
    return *this;
  }
  pinned_lease(const pinned_lease&) = delete;
  pinned_lease& operator=(const pinned_lease&) = delete;
  ~pinned_lease() { reset(); }

  //! The leased bytes (host memory).
  [[nodiscard]] std::span<std::byte> bytes() const noexcept { return {data_, bytes_}; }
  //! Leased bytes: the request rounded up to `pinned_pool::alignment`.
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }
  //! True while the lease holds bytes of a pool (also for a 0-byte lease);
  //! false when default-constructed, moved from or reset.
  explicit operator bool() const noexcept { return pool_ != nullptr; }
  //! Gives the bytes back to the pool now.
  void reset() noexcept;

 private:
  friend class pinned_pool;
  pinned_lease(pinned_pool* p, std::size_t off, std::size_t n, std::byte* d) noexcept
      : pool_(p), offset_(off), bytes_(n), data_(d) {}
  pinned_pool* pool_ = nullptr;
  std::size_t offset_ = 0;
  std::size_t bytes_ = 0;
  std::byte* data_ = nullptr;
};

//! A fixed-size page-locked region carved into leases (first fit, coalescing).
//! Leases are aligned to `alignment` (256 bytes, enough for any CUDA copy).
//! The pool must outlive its leases.
class pinned_pool {
 public:
  static constexpr std::size_t alignment = 256;  //!< lease alignment and size granule, bytes

  //! Allocates the whole region (`capacity` bytes, rounded up to `alignment`)
  //! once. @throws std::invalid_argument when capacity is 0;
  //! std::bad_alloc when the allocator returns nothing.
  explicit pinned_pool(std::size_t capacity, host_allocator alloc = mlock_allocator());
  pinned_pool(const pinned_pool&) = delete;
  pinned_pool& operator=(const pinned_pool&) = delete;
  ~pinned_pool();

  //! A lease of `bytes` (rounded up to `alignment`), or nothing when no free
  //! range is large enough now. Non-blocking. A request of 0 bytes gives an
  //! empty but valid lease. @throws std::invalid_argument when `bytes`
  //! exceeds the capacity (it could never be satisfied).
  [[nodiscard]] std::optional<pinned_lease> try_acquire(std::size_t bytes);
  //! Blocks until `bytes` fit or `until` passes.
  //! @throws system_error(errc::timeout) at the deadline, system_error(errc::cancelled)
  //! after `cancel()`, std::invalid_argument as `try_acquire`.
  [[nodiscard]] pinned_lease acquire(std::size_t bytes, deadline until);
  //! Wakes every blocked `acquire` with `errc::cancelled`; later calls fail the same way.
  void cancel() noexcept;

  //! Bytes of the region (the requested capacity rounded up to `alignment`).
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  //! Region start (host memory) — for registering the region with other APIs.
  [[nodiscard]] std::byte* data() const noexcept { return base_; }
  //! A consistent snapshot of the counters (takes the pool's lock briefly).
  [[nodiscard]] pool_stats stats() const;
  //! Called after every release (outside the pool's lock), e.g. to wake a
  //! scheduler that waits for space. Set before leases are taken.
  void on_release(void (*fn)(void*) noexcept, void* ctx) noexcept {
    on_release_ = fn;
    on_release_ctx_ = ctx;
  }

 private:
  friend class pinned_lease;
  void release(std::size_t offset, std::size_t bytes) noexcept;
  std::optional<pinned_lease> try_acquire_locked(std::size_t bytes);

  host_allocator alloc_;
  std::size_t capacity_ = 0;
  std::byte* base_ = nullptr;
  bool locked_ = false;
  std::string lock_status_;
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::map<std::size_t, std::size_t> free_;  // offset -> length, disjoint, coalesced
  std::size_t in_use_ = 0, peak_ = 0, leases_ = 0;
  bool cancelled_ = false;
  void (*on_release_)(void*) noexcept = nullptr;
  void* on_release_ctx_ = nullptr;
};

}  // namespace prefetch
EBBFLOW_END_NAMESPACE

// #include <ebbflow/prefetch/impl/pinned_pool.hpp>  (inlined here)
// ---- begin <ebbflow/prefetch/impl/pinned_pool.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file impl/pinned_pool.hpp
//! Definitions for prefetch/pinned_pool.hpp.


// #include <ebbflow/prefetch/pinned_pool.hpp>  (inlined)

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>
#include <sstream>

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

EBBFLOW_BEGIN_NAMESPACE
namespace prefetch {
namespace detail {

inline std::size_t page_size() noexcept {
  const long p = ::sysconf(_SC_PAGESIZE);
  return p > 0 ? static_cast<std::size_t>(p) : 4096;
}
inline std::size_t round_up(std::size_t n, std::size_t a) noexcept { return (n + a - 1) / a * a; }

inline void* page_alloc(std::size_t bytes) noexcept {
  const std::size_t pg = page_size();
  void* p = std::aligned_alloc(pg, round_up(bytes, pg));
  // Touch every page now, so the pool's whole footprint is resident from the
  // start and steady-state memory does not creep up as ranges get used.
  if (p) std::memset(p, 0, round_up(bytes, pg));
  return p;
}

inline void* mlock_allocate(std::size_t bytes, bool& locked, std::string& status) {
  void* p = page_alloc(bytes);
  if (!p) return nullptr;
  if (::mlock(p, round_up(bytes, page_size())) == 0) {
    locked = true;
    return p;
  }
  const int err = errno;
  std::ostringstream os;
  os << "mlock of " << bytes << " bytes failed: " << std::strerror(err);
  if (err == ENOMEM || err == EPERM) {
    rlimit rl{};
    if (::getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
      os << " (RLIMIT_MEMLOCK soft limit ";
      if (rl.rlim_cur == RLIM_INFINITY)
        os << "unlimited";
      else
        os << rl.rlim_cur << " bytes";
      os << "; raise it with `ulimit -l` or grant CAP_IPC_LOCK)";
    }
  }
  os << "; the buffers stay pageable";
  status = os.str();
  locked = false;
  return p;
}
inline void mlock_deallocate(void* p, std::size_t bytes) noexcept {
  ::munlock(p, round_up(bytes, page_size()));  // harmless when it was never locked
  std::free(p);
}
inline void* pageable_allocate(std::size_t bytes, bool& locked, std::string& status) {
  locked = false;
  status = "pageable allocator: not locked by request";
  return page_alloc(bytes);
}
inline void pageable_deallocate(void* p, std::size_t) noexcept { std::free(p); }

}  // namespace detail

inline host_allocator mlock_allocator() noexcept {
  return {&detail::mlock_allocate, &detail::mlock_deallocate, "mlock"};
}
inline host_allocator pageable_allocator() noexcept {
  return {&detail::pageable_allocate, &detail::pageable_deallocate, "pageable"};
}

inline void pinned_lease::reset() noexcept {
  if (pool_) std::exchange(pool_, nullptr)->release(offset_, bytes_);
  bytes_ = 0;
  data_ = nullptr;
}

inline pinned_pool::pinned_pool(std::size_t capacity, host_allocator alloc)
    : alloc_(alloc), capacity_(detail::round_up(capacity, alignment)) {
  EBBFLOW_ENFORCE(capacity > 0, "pinned_pool: capacity must be positive");
  EBBFLOW_ENFORCE(alloc_.allocate && alloc_.deallocate, "pinned_pool: allocator without functions");
  void* p = alloc_.allocate(capacity_, locked_, lock_status_);
  if (!p) EBBFLOW_THROW(std::bad_alloc());
  base_ = static_cast<std::byte*>(p);
  free_.emplace(0, capacity_);
  if (!locked_) EBBFLOW_LOG_WARN("prefetch::pinned_pool (" << alloc_.name << "): " << lock_status_);
}

inline pinned_pool::~pinned_pool() {
  {
    std::lock_guard lk(m_);
    if (leases_ != 0) EBBFLOW_LOG_ERROR("prefetch::pinned_pool destroyed with " << leases_ << " leases outstanding");
  }
  alloc_.deallocate(base_, capacity_);
}

inline std::optional<pinned_lease> pinned_pool::try_acquire_locked(std::size_t bytes) {
  if (bytes == 0) {
    ++leases_;
    return pinned_lease(this, 0, 0, base_);
  }
  const std::size_t need = detail::round_up(bytes, alignment);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const std::size_t off = it->first, len = it->second;
    free_.erase(it);
    if (len > need) free_.emplace(off + need, len - need);
    in_use_ += need;
    if (in_use_ > peak_) peak_ = in_use_;
    ++leases_;
    return pinned_lease(this, off, need, base_ + off);
  }
  return std::nullopt;
}

inline std::optional<pinned_lease> pinned_pool::try_acquire(std::size_t bytes) {
  EBBFLOW_ENFORCE(bytes <= capacity_, "pinned_pool: request of "
                                          << bytes << " bytes exceeds the pool's fixed capacity of " << capacity_
                                          << " bytes");
  std::lock_guard lk(m_);
  return try_acquire_locked(bytes);
}

inline pinned_lease pinned_pool::acquire(std::size_t bytes, deadline until) {
  EBBFLOW_ENFORCE(bytes <= capacity_, "pinned_pool: request of "
                                          << bytes << " bytes exceeds the pool's fixed capacity of " << capacity_
                                          << " bytes");
  std::unique_lock lk(m_);
  for (;;) {
    if (cancelled_)
      EBBFLOW_THROW((system_error(make_error_code(error::cancelled), {.operation = "pinned_pool::acquire"})));
    if (auto l = try_acquire_locked(bytes)) return std::move(*l);
    if (cv_.wait_until(lk, until.at()) == std::cv_status::timeout && until.expired()) {
      if (auto l = try_acquire_locked(bytes)) return std::move(*l);
      EBBFLOW_THROW((system_error(make_error_code(error::timeout),
                                  {.operation = "pinned_pool::acquire", .detail = std::to_string(bytes) + " bytes"})));
    }
  }
}

inline void pinned_pool::cancel() noexcept {
  {
    std::lock_guard lk(m_);
    cancelled_ = true;
  }
  cv_.notify_all();
}

inline void pinned_pool::release(std::size_t offset, std::size_t bytes) noexcept {
  {
    std::lock_guard lk(m_);
    --leases_;
    if (bytes != 0) {
      in_use_ -= bytes;
      auto it = free_.emplace(offset, bytes).first;
      // Coalesce with the following and the preceding free range.
      if (auto nx = std::next(it); nx != free_.end() && it->first + it->second == nx->first) {
        it->second += nx->second;
        free_.erase(nx);
      }
      if (it != free_.begin()) {
        auto pv = std::prev(it);
        if (pv->first + pv->second == it->first) {
          pv->second += it->second;
          free_.erase(it);
        }
      }
    }
  }
  cv_.notify_all();
  if (on_release_) on_release_(on_release_ctx_);
}

inline pool_stats pinned_pool::stats() const {
  std::lock_guard lk(m_);
  return {.capacity = capacity_,
          .in_use = in_use_,
          .peak = peak_,
          .leases = leases_,
          .allocations = 1,
          .locked = locked_,
          .allocator = alloc_.name,
          .lock_status = lock_status_};
}

}  // namespace prefetch
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/prefetch/impl/pinned_pool.hpp>
// ---- end <ebbflow/prefetch/pinned_pool.hpp>

#if EBBFLOW_HAS_CUDA
#include <cuda_runtime_api.h>

#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace prefetch {
namespace detail {
inline void cuda_check(cudaError_t e, const char* op) {
  if (e != cudaSuccess)
    EBBFLOW_THROW((system_error(std::error_code(static_cast<int>(e), cuda_category()),
                                {.operation = op, .detail = cudaGetErrorString(e)})));
}
inline void* cuda_host_allocate(std::size_t bytes, bool& locked, std::string& status) {
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (e == cudaSuccess) {
    locked = true;
    return p;
  }
  (void)cudaGetLastError();
  status = std::string("cudaHostAlloc failed: ") + cudaGetErrorString(e);
  locked = false;
  return nullptr;
}
inline void cuda_host_deallocate(void* p, std::size_t) noexcept {
  if (cudaFreeHost(p) != cudaSuccess) EBBFLOW_LOG_ERROR("prefetch: cudaFreeHost failed");
}
//! Restores the current device on scope exit.
class device_guard {
 public:
  explicit device_guard(int dev) {
    cuda_check(cudaGetDevice(&old_), "cudaGetDevice");
    cuda_check(cudaSetDevice(dev), "cudaSetDevice");
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;
  ~device_guard() { (void)cudaSetDevice(old_); }

 private:
  int old_ = 0;
};
}  // namespace detail

//! True when the CUDA runtime sees at least one device. Never throws.
[[nodiscard]] inline bool cuda_device_present() noexcept {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  if (!ok) (void)cudaGetLastError();
  return ok;
}

//! Staging memory from `cudaHostAlloc(cudaHostAllocPortable)`.
[[nodiscard]] inline host_allocator cuda_host_allocator() noexcept {
  return {&detail::cuda_host_allocate, &detail::cuda_host_deallocate, "cudaHostAlloc"};
}

class cuda_stage;

//! Readiness of one device sub-batch. Cheap to copy; valid while the batch is held.
class cuda_ready_event {
 public:
  //! Makes `stream` (on this device) wait for the copy, without blocking the
  //! host, and remembers `stream` as the one that consumes the buffer.
  //! @throws system_error (cuda category).
  void wait(cudaStream_t stream) const;
  //! Non-blocking: true when the copy has finished.
  [[nodiscard]] bool ready() const { return cudaEventQuery(event_) == cudaSuccess; }
  //! Blocks the host until the copy has finished. @throws system_error.
  void synchronize() const { detail::cuda_check(cudaEventSynchronize(event_), "cudaEventSynchronize"); }
  //! The underlying CUDA event (owned by the stage; do not destroy or re-record it).
  [[nodiscard]] cudaEvent_t get() const noexcept { return event_; }

 private:
  friend class cuda_stage;
  cuda_ready_event(cuda_stage* s, std::size_t slot, std::size_t d, cudaEvent_t e) noexcept
      : stage_(s), slot_(slot), dev_(d), event_(e) {}
  cuda_stage* stage_;
  std::size_t slot_, dev_;
  cudaEvent_t event_;
};

//! CUDA device stage over the local devices `device_ids` (device d of a plan's
//! split is `device_ids[d]`). Memory space: device. Move-only.
class cuda_stage {
 public:
  static constexpr memory_space space = memory_space::device;  //!< buffers are `cudaMalloc` device memory
  using event_type = cuda_ready_event;                         //!< per-buffer copy completion

  //! @throws std::invalid_argument for an empty list.
  explicit cuda_stage(std::vector<int> device_ids) : ids_(std::move(device_ids)) {
    EBBFLOW_ENFORCE(!ids_.empty(), "cuda_stage: need at least one device");
  }
  //! Takes over `o`'s streams, buffers and events; `o` is left with no devices.
  cuda_stage(cuda_stage&& o) noexcept { swap(o); }
  //! Frees this stage's CUDA resources (after synchronising its copy streams), then takes over `o`'s.
  cuda_stage& operator=(cuda_stage&& o) noexcept {
    cuda_stage t(std::move(o));
    swap(t);
    return *this;
  }
  cuda_stage(const cuda_stage&) = delete;
  cuda_stage& operator=(const cuda_stage&) = delete;
  ~cuda_stage() { destroy(); }

  //! cudaHostAlloc when a device is present, else mlock'ed host memory.
  static host_allocator preferred_allocator() noexcept {
    return cuda_device_present() ? cuda_host_allocator() : mlock_allocator();
  }

  //! @throws system_error when allocation fails (e.g. no device).
  void prepare(std::size_t slots, std::size_t capacity) {
    EBBFLOW_ENFORCE(streams_.empty(), "cuda_stage: prepare() called twice");
    slots_ = slots;
    capacity_ = capacity;
    streams_.assign(ids_.size(), nullptr);
    per_.assign(slots * ids_.size(), {});
    for (std::size_t d = 0; d < ids_.size(); ++d) {
      detail::device_guard g(ids_[d]);
      detail::cuda_check(cudaStreamCreateWithFlags(&streams_[d], cudaStreamNonBlocking), "cudaStreamCreate");
      for (std::size_t s = 0; s < slots; ++s) {
        auto& p = at(s, d);
        detail::cuda_check(cudaMalloc(&p.d_buf, capacity > 0 ? capacity : 1), "cudaMalloc");
        detail::cuda_check(cudaEventCreateWithFlags(&p.ready, cudaEventDisableTiming), "cudaEventCreate");
        detail::cuda_check(cudaEventCreateWithFlags(&p.consumed, cudaEventDisableTiming), "cudaEventCreate");
      }
    }
  }
  [[nodiscard]] std::size_t devices() const noexcept { return ids_.size(); }  //!< number of local devices
  //! Device memory of (`slot`, `d`) on device `device_id(d)`, `capacity`
  //! bytes; valid after `prepare` for the stage's lifetime. Indices are not checked.
  [[nodiscard]] std::byte* buffer(std::size_t slot, std::size_t d) const noexcept {
    return static_cast<std::byte*>(per_[slot * ids_.size() + d].d_buf);
  }
  //! Copy thread: enqueue the H2D copy after the previous consumer finished.
  void copy(std::size_t slot, std::size_t d, std::span<const std::byte> src) {
    auto& p = at(slot, d);
    detail::device_guard g(ids_[d]);
    if (p.consumed_pending) {
      detail::cuda_check(cudaStreamWaitEvent(streams_[d], p.consumed, 0), "cudaStreamWaitEvent");
      p.consumed_pending = false;
    }
    if (!src.empty())
      detail::cuda_check(cudaMemcpyAsync(p.d_buf, src.data(), src.size(), cudaMemcpyHostToDevice, streams_[d]),
                         "cudaMemcpyAsync");
    detail::cuda_check(cudaEventRecord(p.ready, streams_[d]), "cudaEventRecord");
  }
  //! Copy thread: wait until the slot's copies have read their staging bytes.
  void finish(std::size_t slot) {
    for (std::size_t d = 0; d < ids_.size(); ++d)
      detail::cuda_check(cudaEventSynchronize(at(slot, d).ready), "cudaEventSynchronize");
  }
  //! The ready event of (`slot`, `d`), recorded by the last `copy`. Never blocks.
  [[nodiscard]] event_type event(std::size_t slot, std::size_t d) noexcept {
    return cuda_ready_event(this, slot, d, at(slot, d).ready);
  }
  //! Consumer thread: mark the end of the consumer's use of the slot's buffers.
  void consumed(std::size_t slot) {
    for (std::size_t d = 0; d < ids_.size(); ++d) {
      auto& p = at(slot, d);
      detail::device_guard g(ids_[d]);
      detail::cuda_check(cudaEventRecord(p.consumed, p.consumer), "cudaEventRecord");
      p.consumed_pending = true;
      p.consumer = nullptr;
    }
  }
  //! Device bytes allocated by `prepare`.
  [[nodiscard]] std::size_t bytes() const noexcept { return per_.size() * capacity_; }
  //! The copy stream of device `d`.
  [[nodiscard]] cudaStream_t copy_stream(std::size_t d) const noexcept { return streams_[d]; }
  //! The CUDA device ordinal of local device `d`.
  [[nodiscard]] int device_id(std::size_t d) const noexcept { return ids_[d]; }

 private:
  friend class cuda_ready_event;
  struct per_buffer {
    void* d_buf = nullptr;
    cudaEvent_t ready = nullptr, consumed = nullptr;
    cudaStream_t consumer = nullptr;  // stream given to wait(); nullptr: legacy default stream
    bool consumed_pending = false;
  };
  per_buffer& at(std::size_t slot, std::size_t d) noexcept { return per_[slot * ids_.size() + d]; }
  void swap(cuda_stage& o) noexcept {
    std::swap(ids_, o.ids_);
    std::swap(slots_, o.slots_);
    std::swap(capacity_, o.capacity_);
    std::swap(streams_, o.streams_);
    std::swap(per_, o.per_);
  }
  void destroy() noexcept {
    for (std::size_t d = 0; d < streams_.size(); ++d) {
      if (cudaSetDevice(ids_[d]) != cudaSuccess) continue;
      if (streams_[d]) (void)cudaStreamSynchronize(streams_[d]);
      for (std::size_t s = 0; s < slots_; ++s) {
        auto& p = at(s, d);
        if (p.d_buf) (void)cudaFree(p.d_buf);
        if (p.ready) (void)cudaEventDestroy(p.ready);
        if (p.consumed) (void)cudaEventDestroy(p.consumed);
      }
      if (streams_[d]) (void)cudaStreamDestroy(streams_[d]);
    }
    streams_.clear();
    per_.clear();
  }

  std::vector<int> ids_;
  std::size_t slots_ = 0, capacity_ = 0;
  std::vector<cudaStream_t> streams_;
  std::vector<per_buffer> per_;
};
static_assert(device_stage<cuda_stage>);

inline void cuda_ready_event::wait(cudaStream_t stream) const {
  detail::device_guard g(stage_->ids_[dev_]);
  detail::cuda_check(cudaStreamWaitEvent(stream, event_, 0), "cudaStreamWaitEvent");
  stage_->at(slot_, dev_).consumer = stream;
}

}  // namespace prefetch
EBBFLOW_END_NAMESPACE

#endif  // EBBFLOW_HAS_CUDA
// ==== end <ebbflow/prefetch/cuda_stage.hpp>

// ==== begin <ebbflow/prefetch/index_source.hpp> ===========================
// SPDX-License-Identifier: Apache-2.0
//! @file index_source.hpp
//! `index_source`: what the prefetcher asks, step by step, for the samples of
//! the global batch and how they are split over this process's local devices.
//! `sequence_source` and `list_source` are simple models for tests,
//! benchmarks and users without a planner. No model here draws from the
//! planner's epoch sampler: write one whose `plan` fills `indices` from the
//! epoch's visiting order (`plan::epoch_permutation`) and `split` from the
//! plan, as `slice_source` in examples/torch_elastic/torch_elastic.cpp does.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/error.hpp>  (inlined)

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace prefetch {

//! The plan of one step: the global batch's sample indices, in order, and the
//! per-device sub-batch sizes. Device d receives the `split[d]` samples that
//! follow those of devices 0..d-1 (CPU-centric splitting: the global batch is
//! loaded once and sliced, not loaded by each device).
//! Invariant checked by the prefetcher: sum(split) == indices.size().
struct step_plan {
  std::vector<std::size_t> indices;  //!< sample indices of the global batch
  std::vector<std::size_t> split;    //!< samples per local device
};

//! A source of step plans. `s.plan(step, out)` fills `out` for `step` and
//! returns true, or returns false when there is no such step (end of data).
//! The prefetcher calls it from one thread at a time, with steps 0, 1, 2, ...
//! in increasing order, reusing `out` (so a model can avoid allocations by
//! assigning into it). It may throw; the exception surfaces from
//! `prefetcher::next()` at that step and stops the prefetcher.
template <class S>
concept index_source = requires(S& s, std::uint64_t step, step_plan& out) {
  { s.plan(step, out) } -> std::convertible_to<bool>;
};

//! Samples 0, 1, 2, ... in order; the batch size of each step comes
//! from `batch_size(step)` (which may change every step) and is split over
//! `devices` devices as evenly as possible (the first devices get one more),
//! or by `weights` when given (largest remainder rounding). Ends when fewer
//! samples than the step's batch size remain, or after `steps` steps.
//!
//! The last partial batch is dropped: with 10 samples and batches of 4, steps
//! 0 and 1 serve samples 0-7 and samples 8 and 9 are never served. A first
//! step whose batch is larger than the whole data set is an error (it would
//! serve nothing), not an empty sequence.
class sequence_source {
 public:
  //! Batch size of a step; 0 ends the sequence.
  using batch_size_fn = std::function<std::size_t(std::uint64_t step)>;

  //! @throws std::invalid_argument for 0 devices or a weight vector of the wrong size.
  sequence_source(std::size_t samples, batch_size_fn batch_size, std::size_t devices = 1,
                  std::vector<double> weights = {}, std::uint64_t steps = UINT64_MAX)
      : samples_(samples),
        batch_size_(std::move(batch_size)),
        devices_(devices),
        weights_(std::move(weights)),
        steps_(steps) {
    EBBFLOW_ENFORCE(devices_ > 0, "sequence_source: need at least one device");
    EBBFLOW_ENFORCE(weights_.empty() || weights_.size() == devices_, "sequence_source: one weight per device");
    for (std::size_t d = 0; d < weights_.size(); ++d)
      EBBFLOW_ENFORCE(std::isfinite(weights_[d]) && weights_[d] >= 0, "sequence_source: weight of device "
                                                                          << d << " is " << weights_[d]
                                                                          << " (expected finite and >= 0)");
    EBBFLOW_ENFORCE(static_cast<bool>(batch_size_), "sequence_source: batch_size function is empty");
  }

  //! Fills `out` with the next `batch_size(step)` samples and their split;
  //! false at the end (see above). @throws std::invalid_argument when `step`
  //! is not the next one (steps must be asked for in order, without gaps), or
  //! when step 0's batch is larger than the data set.
  bool plan(std::uint64_t step, step_plan& out) {
    if (step >= steps_) return false;
    if (step != next_step_) {  // only forward, in order (the concept's contract)
      EBBFLOW_ENFORCE(step == next_step_, "sequence_source: steps must be asked for in order");
    }
    const std::size_t b = batch_size_(step);
    EBBFLOW_ENFORCE(step != 0 || b <= samples_, "sequence_source: the batch of step 0 is "
                                                    << b << " samples, more than the data set's " << samples_
                                                    << " (nothing would be served)");
    if (b == 0 || cursor_ + b > samples_) return false;
    out.indices.resize(b);
    for (std::size_t i = 0; i < b; ++i) out.indices[i] = cursor_ + i;
    split(b, out.split);
    cursor_ += b;
    ++next_step_;
    return true;
  }

  //! Per-device sizes for a batch of `b` samples (the rule described above).
  void split(std::size_t b, std::vector<std::size_t>& out) const {
    out.assign(devices_, 0);
    if (weights_.empty()) {
      for (std::size_t d = 0; d < devices_; ++d) out[d] = b / devices_ + (d < b % devices_ ? 1 : 0);
      return;
    }
    double total = 0;
    for (double w : weights_) total += w;
    std::size_t given = 0;
    std::vector<std::pair<double, std::size_t>> rem;
    rem.reserve(devices_);
    for (std::size_t d = 0; d < devices_; ++d) {
      const double exact = total > 0 ? static_cast<double>(b) * weights_[d] / total : 0.0;
      out[d] = static_cast<std::size_t>(exact);
      given += out[d];
      rem.emplace_back(exact - static_cast<double>(out[d]), d);
    }
    std::stable_sort(rem.begin(), rem.end(), [](auto& x, auto& y) { return x.first > y.first; });
    for (std::size_t k = 0; given < b; ++k, ++given) ++out[rem[k % devices_].second];
  }

 private:
  std::size_t samples_;
  batch_size_fn batch_size_;
  std::size_t devices_;
  std::vector<double> weights_;
  std::uint64_t steps_;
  std::size_t cursor_ = 0;
  std::uint64_t next_step_ = 0;
};
static_assert(index_source<sequence_source>);

//! A fixed list of step plans (plan k is step k). Useful in tests.
class list_source {
 public:
  //! The plans, used as given (not validated here; the prefetcher checks them).
  explicit list_source(std::vector<step_plan> plans) : plans_(std::move(plans)) {}
  //! Copies plan `step` into `out`; false when `step` >= the number of plans.
  //! Any order; const, so concurrent calls are safe.
  bool plan(std::uint64_t step, step_plan& out) const {
    if (step >= plans_.size()) return false;
    out = plans_[static_cast<std::size_t>(step)];
    return true;
  }

 private:
  std::vector<step_plan> plans_;
};
static_assert(index_source<list_source>);

}  // namespace prefetch
EBBFLOW_END_NAMESPACE
// ==== end <ebbflow/prefetch/index_source.hpp>

// ==== begin <ebbflow/prefetch/prefetcher.hpp> =============================
// SPDX-License-Identifier: Apache-2.0
//! @file prefetcher.hpp
//! `prefetcher`: loads the next global batches into page-locked host memory on
//! background threads, splits each on the CPU into per-device sub-batches, and
//! copies them to the devices while the current step computes (ScaleDNN's
//! mini-batch pre-loading with CPU-centric batch splitting).
//!
//! Pipeline (threads owned by the prefetcher):
//! ```
//!  index_source.plan(step) -> [loader threads] load(sample, bytes) into a
//!  pinned_pool lease -> [copy thread] stage.copy(slot, device, sub-batch)
//!  -> ready queue -> next() on the consumer's thread -> batch (RAII) -> slot free
//! ```
//! At most `depth` steps are in flight (a ring of `depth` slots); the staging
//! bytes of all of them come from one `pinned_pool` of fixed size; stage
//! buffers are allocated once. Memory never grows after construction.
//!
//! Ordering: `next()` returns steps 0, 1, 2, ... in order, each exactly once;
//! within a step, sample i of the global batch lies at byte
//! `i * sample_bytes` of the concatenated sub-batches, device d holding
//! positions [sum(split[0..d)), sum(split[0..d])) of `indices`.
//!
//! Errors: an exception thrown by `load` (or by the source or the stage) for
//! step s is rethrown by the `next()` call that would have returned step s,
//! as `load_error` (an `ebbflow::system_error`, `errc::load_failed`) naming
//! the step and sample. With `error_policy::stop` the prefetcher then ends
//! (later `next()` return an empty batch); with `error_policy::skip_step` the
//! failed step is skipped and step s+1 follows.
//!
//! Thread safety: `next()` is for one consumer thread at a time; `shutdown()`,
//! `stats()` and releasing batches may happen on any thread. Every blocking
//! call takes a deadline.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/core/deadline.hpp>  (inlined)
// #include <ebbflow/core/error.hpp>  (inlined)
// #include <ebbflow/core/memory.hpp>  (inlined)
// #include <ebbflow/prefetch/device_stage.hpp>  (inlined)
// #include <ebbflow/prefetch/index_source.hpp>  (inlined)
// #include <ebbflow/prefetch/pinned_pool.hpp>  (inlined)

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <stop_token>
#include <string>

EBBFLOW_BEGIN_NAMESPACE
namespace prefetch {

//! What the prefetcher does after a step failed to load.
enum class error_policy {
  stop,       //!< report the failed step, then end (no later step is delivered)
  skip_step,  //!< report the failed step, then continue with the next one
};

//! A step could not be prepared: a run-time condition, so an
//! `ebbflow::system_error` whose `code()` is `errc::load_failed`. `step()` is
//! the step, `sample()` the global sample index whose load failed
//! (`no_sample` when the failure was not in a sample's load, e.g. the source
//! or the device copy), `cause()` the original exception. `what()` reads
//! "prefetch: data load failed (step 3, sample 17: <cause>)".
class load_error : public system_error {
 public:
  //! `sample()` when the failure was not in one sample's load.
  static constexpr std::size_t no_sample = std::numeric_limits<std::size_t>::max();
  //! The error of `step`, caused by `cause` while loading `sample` (or `no_sample`).
  load_error(std::uint64_t step, std::size_t sample, std::exception_ptr cause)
      : system_error(make_error_code(error::load_failed),
                     error_context{.operation = "prefetch", .detail = describe(step, sample, cause)}),
        step_(step),
        sample_(sample),
        cause_(std::move(cause)) {}
  [[nodiscard]] std::uint64_t step() const noexcept { return step_; }  //!< the failed step
  //! The global sample index whose load failed, or `no_sample`. With a
  //! chunk-level `load` (one call for several samples) the prefetcher cannot
  //! tell which one failed: the chunk's first sample.
  [[nodiscard]] std::size_t sample() const noexcept { return sample_; }
  //! The original exception.
  [[nodiscard]] std::exception_ptr cause() const noexcept { return cause_; }
  //! Rethrows the original exception.
  [[noreturn]] void rethrow_cause() const { std::rethrow_exception(cause_); }

 private:
  // "step 3, sample 17: <what the cause says>".
  static std::string describe(std::uint64_t step, std::size_t sample, const std::exception_ptr& cause);
  std::uint64_t step_;
  std::size_t sample_;
  std::exception_ptr cause_;
};

//! Construction parameters. `sample_bytes` and `max_batch_samples` are required.
struct prefetch_options {
  std::size_t sample_bytes = 0;                //!< bytes of one sample (fixed)
  std::size_t max_batch_samples = 0;           //!< largest global batch any step may have
  std::size_t max_device_samples = 0;          //!< largest sub-batch of one device; 0: max_batch_samples
  std::size_t depth = 3;                       //!< steps in flight (ring slots), >= 1
  std::size_t pool_bytes = 0;                  //!< pinned staging bound; 0: depth * max_batch_samples * sample_bytes
  unsigned loaders = 2;                        //!< loader threads, >= 1
  std::size_t chunk_samples = 0;               //!< samples per loader task; 0: about batch / (4 * loaders)
  error_policy on_error = error_policy::stop;  //!< what to do after a step failed to load
  //! Staging allocator; empty: the stage's preferred one (cudaHostAlloc for
  //! cuda_stage), else `mlock_allocator()`.
  std::optional<host_allocator> allocator = std::nullopt;
};

//! Counters readable at any time from any thread (`prefetcher::stats()`).
struct prefetch_stats {
  std::uint64_t steps_delivered = 0;  //!< batches returned by next()
  std::uint64_t steps_planned = 0;    //!< steps taken from the index source
  std::size_t queue_depth = 0;        //!< steps ready and not yet taken by next()
  std::size_t in_flight = 0;          //!< slots in use (planned, loading, ready or held)
  double consumer_stall_s = 0;        //!< total time next() waited for a batch
  std::uint64_t samples_loaded = 0;   //!< successful load calls (samples)
  std::uint64_t bytes_loaded = 0;     //!< bytes written by successful loads
  double loader_busy_s = 0;           //!< summed time inside load callbacks
  double loader_bytes_per_s = 0;      //!< bytes_loaded / seconds since construction
  std::uint64_t load_errors = 0;      //!< failed steps
  pool_stats pool = {};               //!< staging pool: bytes in use, peak, capacity, locked
  std::size_t stage_bytes = 0;        //!< stage buffers allocated at construction (0 if unknown)
};

namespace detail {
template <class Source, class Load, class Stage>
class prefetch_state;
}

//! A delivered step. Owns its ring slot until destroyed or `release()`d;
//! move-only. Not thread-safe itself (release it from one thread). The spans
//! stay valid until release. `data(d)` is in `Stage::space` memory: wait on
//! `event(d)` (CUDA: `event(d).wait(stream)`) before using it. On the empty
//! batch `indices()` and `sizes()` are empty and `devices()` is 0, while the
//! per-device accessors `data(d)`, `indices(d)` and `event(d)` throw, as they
//! do for `d >= devices()`.
template <class State>
class basic_batch {
 public:
  using stage_type = typename State::stage_type;            //!< the prefetcher's `Stage`
  using event_type = typename stage_type::event_type;       //!< readiness of one device's data
  static constexpr memory_space space = stage_type::space;  //!< memory space of `data(d)`

  //! The empty batch (false; owns no slot).
  basic_batch() noexcept = default;
  //! Takes over `o`'s slot; `o` becomes empty.
  basic_batch(basic_batch&&) noexcept = default;
  //! Releases this batch's slot, then takes over `o`'s; `o` becomes empty.
  basic_batch& operator=(basic_batch&& o) noexcept {
    if (this != &o) {
      release();
      state_ = std::move(o.state_);
      slot_ = o.slot_;
      step_ = o.step_;
    }
    return *this;
  }
  ~basic_batch() { release(); }

  //! False for the empty batch that marks the end of data or shutdown.
  explicit operator bool() const noexcept { return state_ != nullptr; }
  //! The index source's step number of this batch.
  [[nodiscard]] std::uint64_t step() const noexcept { return step_; }
  //! Global batch sample indices, in order.
  [[nodiscard]] std::span<const std::size_t> indices() const noexcept;
  //! Samples in the global batch.
  [[nodiscard]] std::size_t size() const noexcept { return indices().size(); }
  //! Per-device sub-batch sizes (samples).
  [[nodiscard]] std::span<const std::size_t> sizes() const noexcept;
  //! Number of local devices (sub-batches).
  [[nodiscard]] std::size_t devices() const noexcept { return sizes().size(); }
  //! Sample indices of device `d`'s sub-batch.
  //! @throws std::invalid_argument for the empty batch or `d >= devices()`.
  [[nodiscard]] std::span<const std::size_t> indices(std::size_t d) const;
  //! Device `d`'s sub-batch bytes (`sizes()[d] * sample_bytes`), in `space` memory.
  //! @throws std::invalid_argument for the empty batch or `d >= devices()`.
  [[nodiscard]] mspan<std::byte, space> data(std::size_t d) const;
  //! Readiness of `data(d)`.
  //! @throws std::invalid_argument for the empty batch or `d >= devices()`.
  [[nodiscard]] event_type event(std::size_t d) const;
  //! Gives the slot back to the prefetcher (idempotent, noexcept).
  void release() noexcept;

 private:
  friend State;
  basic_batch(std::shared_ptr<State> s, std::size_t slot, std::uint64_t step) noexcept
      : state_(std::move(s)), slot_(slot), step_(step) {}
  // Throws unless this batch holds a slot and `d` is one of its devices.
  void check_device(const char* what, std::size_t d) const;
  std::shared_ptr<State> state_;
  std::size_t slot_ = 0;
  std::uint64_t step_ = 0;
};

//! The prefetcher. `Source` models `index_source`; `Load` is one of
//! * `void(std::size_t sample, std::span<std::byte> dst)`: fill one sample;
//! * `void(std::size_t sample, std::span<std::byte> dst, std::stop_token)`:
//!   the same, and should return early once the token is stopped (shutdown);
//! * `void(std::span<const std::size_t> samples, std::span<std::byte> dst)`:
//!   fill a chunk of consecutive positions of one step (batch-level loading).
//! `load` runs on the loader threads, concurrently with itself for different
//! samples; `dst` is page-locked host memory when the pool is locked.
//! `Stage` models `device_stage` (`cpu_stage` here, `cuda_stage` for CUDA).
template <index_source Source, class Load, device_stage Stage = cpu_stage>
class prefetcher {
 public:
  //! The shared state behind the threads and batches (implementation detail).
  using state_type = detail::prefetch_state<Source, Load, Stage>;
  //! What `next()` returns.
  using batch = basic_batch<state_type>;

  //! Allocates the staging pool and stage buffers and starts the threads.
  //! @throws std::invalid_argument for bad options; std::bad_alloc.
  prefetcher(Source source, Load load, Stage stage, prefetch_options opt);
  prefetcher(const prefetcher&) = delete;
  prefetcher& operator=(const prefetcher&) = delete;
  //! `shutdown()` then joins the threads (blocks until `load` calls return).
  ~prefetcher();

  //! The next step's batch, waiting until it is ready or `until` passes. An
  //! empty batch means the source ended (or the prefetcher was shut down or
  //! stopped after an error). Blocking; one consumer thread at a time.
  //! @throws load_error for a step that failed to load;
  //! system_error(errc::timeout) when `until` passes (the step is still
  //! pending: a later call returns it).
  [[nodiscard]] batch next(deadline until);
  //! `next(deadline::after(timeout))`.
  template <class Rep, class Period>
  [[nodiscard]] batch next(std::chrono::duration<Rep, Period> timeout) {
    return next(deadline::after(timeout));
  }

  //! Stops loading and wakes every waiter (a waiting next() returns an empty
  //! batch). Non-blocking; callable from any thread, also from `load`.
  void shutdown() noexcept;
  //! `shutdown()` and wait until every background thread has exited or
  //! `until` passes. @returns true when all exited.
  bool close(deadline until);

  //! The counters now; any thread, at any time. Read while the threads run,
  //! so they need not be mutually consistent.
  [[nodiscard]] prefetch_stats stats() const;
  //! The options in effect: as given, with a zero `max_device_samples` or
  //! `pool_bytes` replaced by its computed default.
  [[nodiscard]] const prefetch_options& options() const noexcept;

 private:
  std::shared_ptr<state_type> state_;
};

//! Deduces `prefetcher<Source, Load, Stage>` from the constructor's arguments.
template <class Source, class Load, class Stage>
prefetcher(Source, Load, Stage, prefetch_options) -> prefetcher<Source, Load, Stage>;

}  // namespace prefetch
EBBFLOW_END_NAMESPACE

// #include <ebbflow/prefetch/impl/prefetcher.hpp>  (inlined here)
// ---- begin <ebbflow/prefetch/impl/prefetcher.hpp>
// SPDX-License-Identifier: Apache-2.0
//! @file impl/prefetcher.hpp
//! Definitions for prefetch/prefetcher.hpp. The shared state lives in
//! `detail::prefetch_state`, owned jointly by the prefetcher and the batches
//! it handed out, so a batch released after the prefetcher is gone is safe.


// #include <ebbflow/prefetch/prefetcher.hpp>  (inlined)
// #include <ebbflow/core/log.hpp>  (inlined)
// #include <ebbflow/core/thread_name.hpp>  (inlined)

#include <algorithm>
#include <atomic>
#include <concepts>
#include <condition_variable>
#include <mutex>
#include <sstream>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace prefetch {

inline std::string load_error::describe(std::uint64_t step, std::size_t sample, const std::exception_ptr& cause) {
  std::ostringstream os;
  os << "step " << step;
  if (sample != no_sample) os << ", sample " << sample;
  os << ": ";
  try {
    if (cause) std::rethrow_exception(cause);
    os << "unknown error";
  } catch (const std::exception& e) {
    os << e.what();
  } catch (...) {
    os << "non-standard exception";
  }
  return os.str();
}

namespace detail {

// Which of the documented `load` signatures `Load` has.
enum class load_kind { none, sample, sample_stop, chunk };
template <class Load>
constexpr load_kind kind_of() {
  if constexpr (std::invocable<Load&, std::size_t, std::span<std::byte>, std::stop_token>)
    return load_kind::sample_stop;
  else if constexpr (std::invocable<Load&, std::size_t, std::span<std::byte>>)
    return load_kind::sample;
  else if constexpr (std::invocable<Load&, std::span<const std::size_t>, std::span<std::byte>>)
    return load_kind::chunk;
  else
    return load_kind::none;
}

template <class Stage>
host_allocator preferred_allocator(const std::optional<host_allocator>& given) {
  if (given) return *given;
  if constexpr (requires {
                  { Stage::preferred_allocator() } -> std::convertible_to<host_allocator>;
                })
    return Stage::preferred_allocator();
  else
    return mlock_allocator();
}

template <class Source, class Load, class Stage>
class prefetch_state : public std::enable_shared_from_this<prefetch_state<Source, Load, Stage>> {
 public:
  using stage_type = Stage;
  using batch = basic_batch<prefetch_state>;
  static constexpr load_kind kind = kind_of<Load>();
  static_assert(kind != load_kind::none,
                "prefetcher: Load must be callable as load(std::size_t, std::span<std::byte>[, std::stop_token]) "
                "or load(std::span<const std::size_t>, std::span<std::byte>)");

  prefetch_state(Source source, Load load, Stage stage, prefetch_options opt)
      : source_(std::move(source)),
        load_(std::move(load)),
        stage_(std::move(stage)),
        opt_(checked(opt)),
        devices_(stage_.devices()),
        pool_(opt_.pool_bytes, preferred_allocator<Stage>(opt_.allocator)),
        slots_(opt_.depth),
        t0_(steady_clock::now()) {
    stage_.prepare(opt_.depth, opt_.max_device_samples * opt_.sample_bytes);
    for (auto& s : slots_) {
      s.plan.indices.reserve(opt_.max_batch_samples);
      s.plan.split.reserve(devices_);
      s.offsets.reserve(devices_ + 1);
    }
    // Space freed in the pool may unblock a loader waiting to stage a step.
    pool_.on_release(
        [](void* self) noexcept {
          auto* st = static_cast<prefetch_state*>(self);
          { std::lock_guard lk(st->m_); }  // orders the wake-up after a waiter's check
          st->cv_work_.notify_all();
        },
        this);
  }

  ~prefetch_state() { join(); }

  void start() {
    std::lock_guard jl(join_m_);
    try {
      for (unsigned i = 0; i < opt_.loaders; ++i) {
        threads_.emplace_back([this] { guarded([this] { loader_loop(); }); });
        ::ebbflow::detail::name_thread(threads_.back(), "ebbflow-load" + std::to_string(i));
      }
      threads_.emplace_back([this] { guarded([this] { copy_loop(); }); });
      ::ebbflow::detail::name_thread(threads_.back(), "ebbflow-copy");
    } catch (...) {
      shutdown();
      throw;  // the destructor joins what started
    }
  }

  // ---------------------------------------------------------------- consumer
  batch next(deadline until) {
    std::unique_lock lk(m_);
    const auto t0 = steady_clock::now();
    const bool ok =
        cv_ready_.wait_until(lk, until.at(), [&] { return stopped_ || at_end_locked() || head_ready_locked(); });
    stall_ns_.fetch_add(static_cast<std::uint64_t>((steady_clock::now() - t0).count()), std::memory_order_relaxed);
    if (!ok)
      EBBFLOW_THROW((system_error(make_error_code(error::timeout),
                                  {.operation = "prefetch::next", .detail = "step " + std::to_string(consume_step_)})));
    if (stopped_ || at_end_locked()) return {};
    const std::uint64_t s = consume_step_++;
    const std::size_t idx = index(s);
    slot_t& sl = slots_[idx];
    if (sl.error) {
      load_error e(s, sl.error_sample, std::exchange(sl.error, nullptr));
      sl.ph = phase::free;
      lk.unlock();
      cv_work_.notify_all();
      EBBFLOW_THROW(e);
    }
    sl.ph = phase::held;
    delivered_.fetch_add(1, std::memory_order_relaxed);
    return batch(this->shared_from_this(), idx, s);
  }

  void give_back(std::size_t idx) noexcept {
    try {
      stage_.consumed(idx);
    } catch (const std::exception& e) {
      EBBFLOW_LOG_ERROR("prefetch: stage consumed() failed: " << e.what());
    }
    {
      std::lock_guard lk(m_);
      slots_[idx].ph = phase::free;
    }
    cv_work_.notify_all();
  }

  void shutdown() noexcept {
    {
      std::lock_guard lk(m_);
      stopped_ = true;
    }
    stop_.request_stop();
    cv_work_.notify_all();
    cv_copy_.notify_all();
    cv_ready_.notify_all();
  }

  bool close(deadline until) {
    shutdown();
    std::lock_guard jl(join_m_);
    {
      std::unique_lock lk(m_);
      if (!cv_exit_.wait_until(lk, until.at(), [&] { return exited_ == threads_.size(); })) return false;
    }
    for (auto& t : threads_)
      if (t.joinable()) t.join();
    return true;
  }

  void join() noexcept {
    shutdown();
    std::lock_guard jl(join_m_);
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }

  prefetch_stats stats() const {
    prefetch_stats r;
    {
      std::lock_guard lk(m_);
      for (const auto& s : slots_) {
        if (s.ph != phase::free) ++r.in_flight;
        if (s.ph == phase::ready && s.step >= consume_step_ && s.step < end_step_) ++r.queue_depth;
      }
      r.steps_planned = plan_step_;
    }
    r.steps_delivered = delivered_.load(std::memory_order_relaxed);
    r.consumer_stall_s = 1e-9 * static_cast<double>(stall_ns_.load(std::memory_order_relaxed));
    r.samples_loaded = samples_.load(std::memory_order_relaxed);
    r.bytes_loaded = bytes_.load(std::memory_order_relaxed);
    r.loader_busy_s = 1e-9 * static_cast<double>(busy_ns_.load(std::memory_order_relaxed));
    const double wall = std::chrono::duration<double>(steady_clock::now() - t0_).count();
    r.loader_bytes_per_s = wall > 0 ? static_cast<double>(r.bytes_loaded) / wall : 0.0;
    r.load_errors = errors_.load(std::memory_order_relaxed);
    r.pool = pool_.stats();
    if constexpr (requires(const Stage& s) {
                    { s.bytes() } -> std::convertible_to<std::size_t>;
                  })
      r.stage_bytes = stage_.bytes();
    return r;
  }

  const prefetch_options& options() const noexcept { return opt_; }

  // ---------------------------------------------------------------- batch access (slot is held)
  std::span<const std::size_t> indices(std::size_t idx) const noexcept { return slots_[idx].plan.indices; }
  std::span<const std::size_t> sizes(std::size_t idx) const noexcept { return slots_[idx].plan.split; }
  std::span<const std::size_t> indices(std::size_t idx, std::size_t d) const noexcept {
    const auto& s = slots_[idx];
    return std::span<const std::size_t>(s.plan.indices).subspan(s.offsets[d], s.plan.split[d]);
  }
  mspan<std::byte, Stage::space> data(std::size_t idx, std::size_t d) const noexcept {
    return {stage_.buffer(idx, d), slots_[idx].plan.split[d] * opt_.sample_bytes};
  }
  typename Stage::event_type stage_event(std::size_t idx, std::size_t d) { return stage_.event(idx, d); }

 private:
  enum class phase : unsigned char { free, staging, loading, loaded, copying, ready, held };
  struct slot_t {
    phase ph = phase::free;
    std::uint64_t step = UINT64_MAX;
    step_plan plan;
    std::vector<std::size_t> offsets;  // device d's first position; offsets[devices] = n
    pinned_lease staging;
    std::size_t next_pos = 0, done = 0;
    std::exception_ptr error;
    std::size_t error_pos = SIZE_MAX, error_sample = load_error::no_sample;
  };

  static prefetch_options checked(prefetch_options o) {
    EBBFLOW_ENFORCE(o.sample_bytes > 0, "prefetcher: sample_bytes must be positive");
    EBBFLOW_ENFORCE(o.max_batch_samples > 0, "prefetcher: max_batch_samples must be positive");
    EBBFLOW_ENFORCE(o.depth >= 1, "prefetcher: depth must be at least 1");
    EBBFLOW_ENFORCE(o.loaders >= 1, "prefetcher: need at least one loader thread");
    if (o.max_device_samples == 0 || o.max_device_samples > o.max_batch_samples)
      o.max_device_samples = o.max_batch_samples;
    const std::size_t batch_bytes = o.max_batch_samples * o.sample_bytes;
    if (o.pool_bytes == 0)
      o.pool_bytes =
          o.depth * ((batch_bytes + pinned_pool::alignment - 1) / pinned_pool::alignment * pinned_pool::alignment);
    EBBFLOW_ENFORCE(o.pool_bytes >= batch_bytes,
                    "prefetcher: pool_bytes "
                        << o.pool_bytes
                        << " cannot hold one batch of max_batch_samples * sample_bytes = " << batch_bytes);
    return o;
  }

  std::size_t index(std::uint64_t step) const noexcept { return static_cast<std::size_t>(step % opt_.depth); }
  bool at_end_locked() const noexcept { return consume_step_ >= end_step_; }
  bool head_ready_locked() const noexcept {
    const slot_t& s = slots_[index(consume_step_)];
    return s.step == consume_step_ && s.ph == phase::ready;
  }

  template <class F>
  void guarded(F f) noexcept {
    try {
      f();
    } catch (const std::exception& e) {
      EBBFLOW_LOG_ERROR("prefetch: internal thread failed, shutting down: " << e.what());
      shutdown();
    } catch (...) {
      shutdown();
    }
    {
      std::lock_guard lk(m_);
      ++exited_;
    }
    cv_exit_.notify_all();
  }

  void fail_locked(slot_t& sl, std::uint64_t step, std::size_t pos, std::size_t sample, std::exception_ptr e) {
    if (!sl.error) errors_.fetch_add(1, std::memory_order_relaxed);
    if (!sl.error || pos < sl.error_pos) {
      sl.error = std::move(e);
      sl.error_pos = pos;
      sl.error_sample = sample;
    }
    if (opt_.on_error == error_policy::stop) end_step_ = std::min(end_step_, step + 1);
  }

  void complete_if_done_locked(slot_t& sl) {
    if (sl.ph == phase::loading && sl.done == sl.plan.indices.size()) {
      sl.ph = phase::loaded;
      cv_copy_.notify_one();
    }
  }

  struct task {
    std::size_t idx;
    std::uint64_t step;
    std::size_t begin, end;
  };

  // The oldest loading step with unassigned positions; positions of failed
  // or discarded steps are retired here without calling load.
  std::optional<task> take_task_locked() {
    for (std::uint64_t s = copy_step_; s < plan_step_; ++s) {
      const std::size_t idx = index(s);
      slot_t& sl = slots_[idx];
      if (sl.step != s || sl.ph != phase::loading) continue;
      const std::size_t n = sl.plan.indices.size();
      if (sl.next_pos >= n) continue;
      if (sl.error || s >= end_step_) {
        sl.done += n - sl.next_pos;
        sl.next_pos = n;
        complete_if_done_locked(sl);
        continue;
      }
      const std::size_t chunk =
          opt_.chunk_samples ? opt_.chunk_samples : std::max<std::size_t>(1, n / (4 * std::size_t{opt_.loaders}));
      const std::size_t b = sl.next_pos, e = std::min(n, b + chunk);
      sl.next_pos = e;
      return task{idx, s, b, e};
    }
    return std::nullopt;
  }

  void run_task_and_finish(std::unique_lock<std::mutex>& lk, const task& t) {
    slot_t& sl = slots_[t.idx];
    const std::size_t sb = opt_.sample_bytes;
    const std::span<std::byte> dst = sl.staging.bytes();
    const std::span<const std::size_t> ind = sl.plan.indices;
    std::size_t ok = 0, fail_pos = SIZE_MAX;
    std::exception_ptr err;
    lk.unlock();
    const auto t0 = steady_clock::now();
    if constexpr (kind == load_kind::chunk) {
      try {
        load_(ind.subspan(t.begin, t.end - t.begin), dst.subspan(t.begin * sb, (t.end - t.begin) * sb));
        ok = t.end - t.begin;
      } catch (...) {
        err = std::current_exception();
        fail_pos = t.begin;
      }
    } else {
      const std::stop_token tok = stop_.get_token();
      for (std::size_t i = t.begin; i < t.end && !tok.stop_requested(); ++i) {
        try {
          if constexpr (kind == load_kind::sample_stop)
            load_(ind[i], dst.subspan(i * sb, sb), tok);
          else
            load_(ind[i], dst.subspan(i * sb, sb));
          ++ok;
        } catch (...) {
          err = std::current_exception();
          fail_pos = i;
          break;
        }
      }
    }
    busy_ns_.fetch_add(static_cast<std::uint64_t>((steady_clock::now() - t0).count()), std::memory_order_relaxed);
    samples_.fetch_add(ok, std::memory_order_relaxed);
    bytes_.fetch_add(ok * sb, std::memory_order_relaxed);
    lk.lock();
    // Positions not loaded because of an error or a stop count as done: the
    // step is reported as failed, or the prefetcher is shutting down.
    sl.done += t.end - t.begin;
    if (err) fail_locked(sl, t.step, fail_pos, ind[fail_pos], std::move(err));
    complete_if_done_locked(sl);
    if (err) cv_ready_.notify_all();
  }

  bool can_plan_locked() const noexcept {
    return !planning_ && !staging_wait_ && plan_step_ < end_step_ && slots_[index(plan_step_)].ph == phase::free;
  }

  void plan_next(std::unique_lock<std::mutex>& lk) {
    const std::uint64_t s = plan_step_;
    slot_t& sl = slots_[index(s)];
    planning_ = true;
    lk.unlock();
    bool more = false;
    std::exception_ptr err;
    try {
      more = static_cast<bool>(source_.plan(s, sl.plan));
      if (more) validate(sl.plan);
    } catch (...) {
      err = std::current_exception();
    }
    lk.lock();
    planning_ = false;
    if (!err && !more) {
      end_step_ = std::min(end_step_, s);
      cv_ready_.notify_all();
      return;
    }
    sl.step = s;
    sl.next_pos = sl.done = 0;
    sl.error = nullptr;
    sl.error_pos = SIZE_MAX;
    sl.error_sample = load_error::no_sample;
    ++plan_step_;
    if (err) {
      // A broken source cannot be continued past: always stop after this step.
      errors_.fetch_add(1, std::memory_order_relaxed);
      sl.error = std::move(err);
      end_step_ = std::min(end_step_, s + 1);
      sl.ph = phase::loaded;
      sl.plan.indices.clear();
      sl.plan.split.clear();
      cv_copy_.notify_one();
      return;
    }
    sl.offsets.assign(1, 0);
    for (std::size_t d = 0; d < devices_; ++d) sl.offsets.push_back(sl.offsets.back() + sl.plan.split[d]);
    sl.ph = phase::staging;
    staging_wait_ = true;
    try_stage_locked();
  }

  void validate(const step_plan& p) const {
    const std::size_t n = p.indices.size();
    EBBFLOW_ENFORCE(p.split.size() == devices_,
                    "prefetch: the plan splits over " << p.split.size() << " devices, the stage has " << devices_);
    std::size_t sum = 0;
    for (std::size_t d = 0; d < devices_; ++d) {
      EBBFLOW_ENFORCE(p.split[d] <= opt_.max_device_samples, "prefetch: device " << d << " gets " << p.split[d]
                                                                                 << " samples > max_device_samples "
                                                                                 << opt_.max_device_samples);
      sum += p.split[d];
    }
    EBBFLOW_ENFORCE(sum == n, "prefetch: split sums to " << sum << " but the batch has " << n << " samples");
    EBBFLOW_ENFORCE(n <= opt_.max_batch_samples,
                    "prefetch: batch of " << n << " samples > max_batch_samples " << opt_.max_batch_samples);
  }

  // Leases staging bytes for the last planned step, when the pool has room.
  bool try_stage_locked() {
    slot_t& sl = slots_[index(plan_step_ - 1)];
    auto lease = pool_.try_acquire(sl.plan.indices.size() * opt_.sample_bytes);
    if (!lease) return false;
    sl.staging = std::move(*lease);
    staging_wait_ = false;
    sl.ph = phase::loading;
    complete_if_done_locked(sl);  // an empty batch is complete at once
    cv_work_.notify_all();
    return true;
  }

  void loader_loop() {
    std::unique_lock lk(m_);
    while (!stopped_) {
      if (auto t = take_task_locked()) {
        run_task_and_finish(lk, *t);
        continue;
      }
      if (staging_wait_) {
        if (try_stage_locked()) continue;
      } else if (can_plan_locked()) {
        plan_next(lk);
        continue;
      }
      cv_work_.wait(lk);
    }
  }

  void copy_loop() {
    std::unique_lock lk(m_);
    for (;;) {
      cv_copy_.wait(lk, [&] {
        if (stopped_) return true;
        const slot_t& s = slots_[index(copy_step_)];
        return copy_step_ < plan_step_ && s.step == copy_step_ && s.ph == phase::loaded;
      });
      if (stopped_) return;
      const std::uint64_t s = copy_step_;
      const std::size_t idx = index(s);
      slot_t& sl = slots_[idx];
      const bool skip = sl.error || s >= end_step_;
      sl.ph = phase::copying;
      lk.unlock();
      std::exception_ptr err;
      if (!skip) {
        try {
          const std::span<const std::byte> src = sl.staging.bytes();
          const std::size_t sb = opt_.sample_bytes;
          for (std::size_t d = 0; d < devices_; ++d)
            stage_.copy(idx, d, src.subspan(sl.offsets[d] * sb, sl.plan.split[d] * sb));
          stage_.finish(idx);
        } catch (...) {
          err = std::current_exception();
        }
      }
      sl.staging.reset();  // outside m_: the pool's release hook takes m_
      lk.lock();
      if (err) fail_locked(sl, s, SIZE_MAX, load_error::no_sample, std::move(err));
      sl.ph = phase::ready;
      ++copy_step_;
      cv_ready_.notify_all();
      cv_work_.notify_all();  // a loader may be waiting to plan into a slot only the copy frees
    }
  }

  // Members are declared in acquisition order; the pool's release hook uses
  // m_ and cv_work_, so they are declared before the slots whose leases it sees.
  Source source_;
  Load load_;
  Stage stage_;
  prefetch_options opt_;
  std::size_t devices_;
  pinned_pool pool_;
  mutable std::mutex m_;
  std::condition_variable cv_work_, cv_copy_, cv_ready_, cv_exit_;
  std::vector<slot_t> slots_;
  std::uint64_t plan_step_ = 0, copy_step_ = 0, consume_step_ = 0, end_step_ = UINT64_MAX;
  bool planning_ = false, staging_wait_ = false, stopped_ = false;
  std::stop_source stop_;
  std::atomic<std::uint64_t> delivered_{0}, samples_{0}, bytes_{0}, busy_ns_{0}, stall_ns_{0}, errors_{0};
  steady_clock::time_point t0_;
  std::mutex join_m_;
  std::size_t exited_ = 0;
  std::vector<std::thread> threads_;
};

}  // namespace detail

// ---------------------------------------------------------------- basic_batch
template <class State>
std::span<const std::size_t> basic_batch<State>::indices() const noexcept {
  return state_ ? state_->indices(slot_) : std::span<const std::size_t>{};
}
template <class State>
std::span<const std::size_t> basic_batch<State>::sizes() const noexcept {
  return state_ ? state_->sizes(slot_) : std::span<const std::size_t>{};
}
template <class State>
void basic_batch<State>::check_device(const char* what, std::size_t d) const {
  EBBFLOW_ENFORCE(
      state_ != nullptr,
      "prefetch batch: " << what << "(" << d << ") on an empty batch (end of data or shutdown, or released)");
  EBBFLOW_ENFORCE(d < devices(), "prefetch batch: " << what << "(" << d << "): device " << d
                                                    << " out of range (devices() = " << devices() << ")");
}
template <class State>
std::span<const std::size_t> basic_batch<State>::indices(std::size_t d) const {
  check_device("indices", d);
  return state_->indices(slot_, d);
}
template <class State>
auto basic_batch<State>::data(std::size_t d) const -> mspan<std::byte, space> {
  check_device("data", d);
  return state_->data(slot_, d);
}
template <class State>
auto basic_batch<State>::event(std::size_t d) const -> event_type {
  check_device("event", d);
  return state_->stage_event(slot_, d);
}
template <class State>
void basic_batch<State>::release() noexcept {
  if (state_) std::exchange(state_, nullptr)->give_back(slot_);
}

// ---------------------------------------------------------------- prefetcher
template <index_source Source, class Load, device_stage Stage>
prefetcher<Source, Load, Stage>::prefetcher(Source source, Load load, Stage stage, prefetch_options opt)
    : state_(std::make_shared<state_type>(std::move(source), std::move(load), std::move(stage), std::move(opt))) {
  state_->start();
}
template <index_source Source, class Load, device_stage Stage>
prefetcher<Source, Load, Stage>::~prefetcher() {
  if (state_) state_->join();
}
template <index_source Source, class Load, device_stage Stage>
auto prefetcher<Source, Load, Stage>::next(deadline until) -> batch {
  return state_->next(until);
}
template <index_source Source, class Load, device_stage Stage>
void prefetcher<Source, Load, Stage>::shutdown() noexcept {
  state_->shutdown();
}
template <index_source Source, class Load, device_stage Stage>
bool prefetcher<Source, Load, Stage>::close(deadline until) {
  return state_->close(until);
}
template <index_source Source, class Load, device_stage Stage>
prefetch_stats prefetcher<Source, Load, Stage>::stats() const {
  return state_->stats();
}
template <index_source Source, class Load, device_stage Stage>
const prefetch_options& prefetcher<Source, Load, Stage>::options() const noexcept {
  return state_->options();
}

}  // namespace prefetch
EBBFLOW_END_NAMESPACE
// ---- end <ebbflow/prefetch/impl/prefetcher.hpp>
// ==== end <ebbflow/prefetch/prefetcher.hpp>

// ==== begin <ebbflow/impl/compiled.hpp> ===================================
#if EBBFLOW_HAS_ASIO && EBBFLOW_HAS_UCX
// SPDX-License-Identifier: Apache-2.0
//! @file impl/compiled.hpp
//! The one translation unit of the `ebbflow::compiled` library (separate
//! compilation, config.hpp): compiled with EBBFLOW_SEPARATE_COMPILATION and
//! EBBFLOW_COMPILING_LIBRARY, it defines once what the headers then only
//! declare: the TCP store's client and server, the planner's solver, cost
//! models and samplers, the planner policy, the UCX network's construction,
//! and the elastic group over the TCP store and UCX with its work stealing.
//! Nothing else includes this file; elsewhere it declares nothing.


// #include <ebbflow/config.hpp>  (inlined)
// #include <ebbflow/elastic/group.hpp>  (inlined)
// #include <ebbflow/elastic/planner_policy.hpp>  (inlined)
// #include <ebbflow/elastic/tcp_store.hpp>  (inlined)
// #include <ebbflow/elastic/ucx_network.hpp>  (inlined)
// #include <ebbflow/plan.hpp>  (inlined)

// Only the library's translation unit (EBBFLOW_COMPILING_LIBRARY) instantiates.
#if defined(EBBFLOW_SEPARATE_COMPILATION) && defined(EBBFLOW_COMPILING_LIBRARY)
EBBFLOW_BEGIN_NAMESPACE
template class plan::work_stealer<elastic::store_client>;
template class elastic::detail::group_impl<elastic::store_client, elastic::ucx_network>;
EBBFLOW_END_NAMESPACE
#endif
#endif  // EBBFLOW_HAS_ASIO && EBBFLOW_HAS_UCX
// ==== end <ebbflow/impl/compiled.hpp>

#endif  // EBBFLOW_SINGLE_INCLUDE_HPP
