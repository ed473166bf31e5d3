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
#pragma once

#include <ebbflow/config.hpp>

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
