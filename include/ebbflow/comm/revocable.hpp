// SPDX-License-Identifier: Apache-2.0
//! @file revocable.hpp
//! `revocable<Transport>`: wraps any transport so that another thread can
//! revoke it. Once revoked, every pending and later `wait` returns
//! `errc::revoked` within about one poll slice. The elastic group uses this
//! to pull every survivor out of a collective when any member saw a failure
//! (a ring neighbour of a survivor is alive but will never send again).
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/comm/transport.hpp>

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
