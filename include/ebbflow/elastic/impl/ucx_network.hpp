// SPDX-License-Identifier: Apache-2.0
//! @file impl/ucx_network.hpp
//! Definitions of elastic/ucx_network.hpp.
#pragma once

#include <ebbflow/elastic/ucx_network.hpp>

// Compiled into ebbflow::compiled in separate compilation (config.hpp).
#if EBBFLOW_HEADER_ONLY
EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

EBBFLOW_DECL ucx_network::ucx_network() : ucx_network(comm::ucx::context::create()) {}

EBBFLOW_DECL ucx_network::ucx_network(std::shared_ptr<comm::ucx::context> ctx) {
  EBBFLOW_ENFORCE(ctx != nullptr, "ucx_network: null UCX context");
  // Multi-threaded, so the group can build the next generation's endpoints
  // on a helper thread while training progresses the worker.
  worker_ = std::make_shared<comm::ucx::worker>(std::move(ctx), UCS_THREAD_MODE_MULTI);
}

}  // namespace elastic
EBBFLOW_END_NAMESPACE
#endif  // EBBFLOW_HEADER_ONLY
