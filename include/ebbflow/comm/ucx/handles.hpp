// SPDX-License-Identifier: Apache-2.0
//! @file ucx/handles.hpp
//! RAII over UCX: `ucx::context` (ucp_context) and `ucx::worker`
//! (ucp_worker) as `unique_handle`s, plus the process-environment defaults
//! that keep shared memory usable under peer-failure handling.
//!
//! Requires UCX headers and `ebbflow::ucx` (links ucp/ucs).
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/core/env.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/core/handle.hpp>
#include <ebbflow/core/log.hpp>
#include <ebbflow/comm/ucx/endpoint_pool.hpp>

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
