// SPDX-License-Identifier: Apache-2.0
//! @file comm/detail/collective_algorithms.hpp
//! The collectives over any `comm::transport`, each a coroutine of
//! comm/detail/collective_task.hpp: ring and recursive-doubling allreduce,
//! binomial-tree and chain broadcast, ring allgather, barrier, point to
//! point. comm/impl/communicator.hpp picks one per call.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/comm/detail/collective_task.hpp>
#include <ebbflow/comm/reduce.hpp>
#include <ebbflow/comm/transport.hpp>
#include <ebbflow/core/dtype.hpp>

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
