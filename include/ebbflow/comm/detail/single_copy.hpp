// SPDX-License-Identifier: Apache-2.0
//! @file comm/detail/single_copy.hpp
//! The single-copy allreduce (all ranks on one host: each reads its peers'
//! buffers directly, Linux CMA `process_vm_readv`) and how a failed read or
//! a lost peer is attributed to the peer that went away.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/comm/detail/collective_task.hpp>
#include <ebbflow/comm/reduce.hpp>
#include <ebbflow/comm/shared_memory.hpp>
#include <ebbflow/comm/transport.hpp>
#include <ebbflow/core/dtype.hpp>
#include <ebbflow/core/error.hpp>

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
