// SPDX-License-Identifier: Apache-2.0
//! @file ucx_network.hpp
//! `ucx_network`: the elastic group's `network` over UCX. Each generation
//! gets a fresh UCX worker (a new address), so traffic of an old generation
//! cannot even reach the new one; the UCP context is shared for the whole
//! process. Requires the `ebbflow::ucx` component.
//!
//! Thread safety: used by the group's training thread only.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/comm/ucx/handles.hpp>
#include <ebbflow/comm/ucx/transport.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/elastic/kv_store.hpp>

#include <map>
#include <memory>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

class ucx_network {
 public:
  using transport_type = comm::ucx::transport;

  //! Creates the process's UCP context (UCX reads its configuration from the
  //! environment; see docs/comm.md for the defaults ebbflow sets).
  //! @throws system_error when UCX cannot initialise.
  ucx_network() : ctx_(comm::ucx::context::create()) {}
  //! Shares an existing context.
  explicit ucx_network(std::shared_ptr<comm::ucx::context> ctx) : ctx_(std::move(ctx)) {
    EBBFLOW_ENFORCE(ctx_ != nullptr, "ucx_network: null UCX context");
  }

  //! Creates this process's worker for generation `g` and returns its
  //! address. @throws system_error.
  bytes prepare(std::int64_t g) {
    auto w = std::make_unique<comm::ucx::worker>(ctx_);
    bytes a(w->address().begin(), w->address().end());
    workers_.erase(workers_.begin(), workers_.lower_bound(g));  // older generations are gone
    workers_[g] = std::move(w);
    return a;
  }

  //! Connects generation `g`'s worker to every member (addresses in rank
  //! order). Blocks until every endpoint is wired up or `d` passes.
  //! @throws system_error (peer_lost / timeout naming the peer), std::invalid_argument.
  transport_type connect(std::int64_t g, int rank, const std::vector<bytes>& addresses, deadline d) {
    auto it = workers_.find(g);
    EBBFLOW_ENFORCE(it != workers_.end(), "ucx_network: connect for generation " << g << " without prepare");
    comm::ucx::worker w = std::move(*it->second);
    workers_.erase(it);
    return transport_type(std::move(w), g, rank, static_cast<int>(addresses.size()), addresses, d);
  }

 private:
  std::shared_ptr<comm::ucx::context> ctx_;
  std::map<std::int64_t, std::unique_ptr<comm::ucx::worker>> workers_;
};

}  // namespace elastic
EBBFLOW_END_NAMESPACE
