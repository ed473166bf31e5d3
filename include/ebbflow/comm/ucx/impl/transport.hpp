// SPDX-License-Identifier: Apache-2.0
//! @file ucx/impl/transport.hpp
//! Definitions of comm/ucx/transport.hpp: requests, the connect handshake
//! (wire-up and single-copy access), close, peer probing and loss, send,
//! receive, progress and wait.
#pragma once

#include <ebbflow/comm/ucx/transport.hpp>

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
