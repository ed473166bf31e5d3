// SPDX-License-Identifier: Apache-2.0
//! @file impl/communicator.hpp
//! Definitions for comm/communicator.hpp. Each collective is a C++20
//! coroutine over the transport: it posts transfers and `co_await`s one
//! transport request at a time; `request::test` / `request::wait` drive it.
//! Writing the algorithms as straight-line code keeps them readable while the
//! same code serves the blocking and the non-blocking forms.
#pragma once

#include <ebbflow/comm/communicator.hpp>
#include <ebbflow/comm/detail/argument_checks.hpp>
#include <ebbflow/comm/detail/collective_algorithms.hpp>
#include <ebbflow/comm/detail/collective_task.hpp>
#include <ebbflow/comm/detail/single_copy.hpp>
#include <ebbflow/comm/shared_memory.hpp>

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
      ctx_.detail +=
          "; the peer is slow or stopped, or the ranks disagree on the size (a peer may have failed "
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
