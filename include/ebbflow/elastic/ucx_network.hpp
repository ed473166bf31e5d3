// SPDX-License-Identifier: Apache-2.0
//! @file ucx_network.hpp
//! `ucx_network`: the elastic group's `network` over UCX. One UCX worker
//! (one address) serves the whole job; each generation builds its transport
//! on it, reusing the endpoints between members that stay, and the
//! generation bits of every wire tag keep late messages of an older
//! generation from matching. Requires the `ebbflow::ucx` component.
//!
//! Thread safety: used by the group's training thread, except
//! `start_connect`, which the group's admission helper may call while the
//! training thread uses the current generation (`concurrent_connect()`).
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/comm/ucx/handles.hpp>
#include <ebbflow/comm/ucx/transport.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/elastic/kv_store.hpp>

#include <memory>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

//! The elastic group's `network` over UCX: one context and one worker for
//! the whole job, a `comm::ucx::transport` per generation. `start_connect`
//! may be called from a helper thread when `concurrent_connect()`; nothing
//! else is thread-safe.
class ucx_network {
 public:
  using transport_type = comm::ucx::transport;  //!< what `connect` builds per generation

  //! Creates the process's UCP context and its one worker (UCX reads its
  //! configuration from the environment; see docs/comm.md for the defaults
  //! ebbflow sets). @throws system_error when UCX cannot initialise.
  ucx_network();
  //! Shares an existing context.
  explicit ucx_network(std::shared_ptr<comm::ucx::context> ctx);

  //! Whether `start_connect` may run on another thread while the current
  //! generation trains on the same worker (UCX built with thread support).
  [[nodiscard]] bool concurrent_connect() const noexcept { return worker_->multi_threaded(); }

  //! One worker serves every generation, so its address never changes: the
  //! group publishes it once, and a membership change only builds endpoints.
  [[nodiscard]] static constexpr bool stable_address() noexcept { return true; }

  //! This process's worker address (the same for every generation).
  bytes prepare(std::int64_t) const { return bytes(worker_->address().begin(), worker_->address().end()); }

  //! Connects to every member of generation `g` (addresses in rank order) on
  //! the shared worker. Blocks until every endpoint is wired up or `d` passes.
  //! @throws system_error (peer_lost / timeout naming the peer), std::invalid_argument.
  transport_type connect(std::int64_t g, int rank, const std::vector<bytes>& addresses, deadline d) {
    return transport_type(worker_, g, rank, static_cast<int>(addresses.size()), addresses, d);
  }
  //! As `connect`, without blocking: the endpoints wire up while the current
  //! generation keeps training on the same worker (see
  //! `comm::ucx::transport::start`); the group finishes it at the switch.
  transport_type start_connect(std::int64_t g, int rank, const std::vector<bytes>& addresses) {
    return transport_type::start(worker_, g, rank, static_cast<int>(addresses.size()), addresses);
  }
  //! After a failure: the next generation opens new endpoints rather than
  //! reuse those of the failed one, which may carry its abandoned traffic
  //! (a membership change without failure reuses the endpoints between the
  //! members that stay; see `comm::ucx::endpoint_pool`).
  void discard_endpoints() noexcept { worker_->endpoints().retire(); }

 private:
  std::shared_ptr<comm::ucx::worker> worker_;
};

}  // namespace elastic
EBBFLOW_END_NAMESPACE

#include <ebbflow/elastic/impl/ucx_network.hpp>
