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
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/comm/transport.hpp>
#include <ebbflow/comm/ucx/handles.hpp>
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/core/log.hpp>

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
    std::vector<std::uint8_t> abandoned;    // by peer: sends it will never answer
    std::vector<std::uint8_t> undrained;    // by peer: an abandoned receive still written after 1 s
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

#include <ebbflow/comm/ucx/impl/transport.hpp>
