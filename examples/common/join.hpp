// SPDX-License-Identifier: Apache-2.0
// Joining the elastic job as the documented loop does
// (docs/snippets/training_loop.cpp, region "join"): the EBBFLOW_* options
// with the job's global batch and data-set size, the store that
// EBBFLOW_STORE names (embedded, TLS or etcd), collectives over UCX and the
// exact batch planner; SIGTERM asks for a leave at the next step boundary.
// An initial worker and a newcomer (EBBFLOW_JOIN=1) call it alike. Shared by
// the examples; not part of the library.
#pragma once

#include <ebbflow/core/env.hpp>
#include <ebbflow/elastic/any_store.hpp>
#include <ebbflow/elastic/group.hpp>
#include <ebbflow/elastic/planner_policy.hpp>
#include <ebbflow/elastic/ucx_network.hpp>

#include <csignal>
#include <cstddef>
#include <memory>

namespace examples {

//! The group the examples train with.
using elastic_group = ebbflow::elastic::group<ebbflow::elastic::any_store, ebbflow::elastic::ucx_network>;

//! Joins the job over `net` (which must outlive the group) with `global_batch`
//! samples per step out of `dataset_size` per epoch.
inline elastic_group join_job(ebbflow::elastic::ucx_network& net, std::size_t global_batch, std::size_t dataset_size) {
  namespace el = ebbflow::elastic;
  el::leave_on_signal(SIGTERM);
  auto opts = el::group_options::from_environment();
  opts.global_batch = global_batch;
  opts.dataset_size = dataset_size;
  auto connect = [] { return std::make_unique<el::any_store>(el::any_store::from_environment()); };
  return elastic_group(connect, net, opts, ebbflow::launch_info::from_environment(),
                       std::make_unique<el::planner_policy>());
}

}  // namespace examples
