// SPDX-License-Identifier: Apache-2.0
//! @file loopback_transport.hpp
//! An in-process `transport` for unit tests: N threads, one `loopback_transport`
//! each, exchanging messages through a shared `loopback_hub`. The hub can kill
//! a rank (its peers then see `errc::peer_lost`) and delay delivery, so
//! failure handling can be unit-tested. Never the only proof: integration
//! tests run real processes over UCX.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/comm/transport.hpp>

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
