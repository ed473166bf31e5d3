// SPDX-License-Identifier: Apache-2.0
//! @file impl/communicator.hpp
//! Definitions for comm/communicator.hpp. Each collective is a C++20
//! coroutine over the transport: it posts transfers and `co_await`s one
//! transport request at a time; `request::test` / `request::wait` drive it.
//! Writing the algorithms as straight-line code keeps them readable while the
//! same code serves the blocking and the non-blocking forms.
#pragma once

#include <ebbflow/comm/communicator.hpp>
#include <ebbflow/comm/shared_memory.hpp>

#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <new>
#include <stdexcept>
#include <type_traits>
#include <utility>

EBBFLOW_BEGIN_NAMESPACE
namespace comm::detail {

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
  auto seg_begin = [&](int s) { return allreduce_segment(count, n, s).first; };
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
  auto seg_begin = [&](int s) { return allreduce_segment(count, n, s).first; };
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
