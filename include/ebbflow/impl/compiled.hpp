// SPDX-License-Identifier: Apache-2.0
//! @file impl/compiled.hpp
//! The one translation unit of the `ebbflow::compiled` library (separate
//! compilation, config.hpp): compiled with EBBFLOW_SEPARATE_COMPILATION and
//! EBBFLOW_COMPILING_LIBRARY, it defines once what the headers then only
//! declare: the TCP store's client and server, the etcd client, any_store's
//! construction from an address, the planner's solver, cost
//! models and samplers, the planner policy, the UCX network's construction,
//! and the elastic group over UCX with its work stealing, on the TCP store
//! and on `any_store`.
//! Nothing else includes this file; elsewhere it declares nothing.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/elastic/any_store.hpp>
#include <ebbflow/elastic/etcd_store.hpp>
#include <ebbflow/elastic/group.hpp>
#include <ebbflow/elastic/planner_policy.hpp>
#include <ebbflow/elastic/tcp_store.hpp>
#include <ebbflow/elastic/ucx_network.hpp>
#include <ebbflow/plan.hpp>

// Only the library's translation unit (EBBFLOW_COMPILING_LIBRARY) instantiates.
#if defined(EBBFLOW_SEPARATE_COMPILATION) && defined(EBBFLOW_COMPILING_LIBRARY)
EBBFLOW_BEGIN_NAMESPACE
template class plan::work_stealer<elastic::store_client>;
template class elastic::detail::group_impl<elastic::store_client, elastic::ucx_network>;
// The group over the store picked by the address (elastic/any_store.hpp).
template class plan::work_stealer<elastic::any_store>;
template class elastic::detail::group_impl<elastic::any_store, elastic::ucx_network>;
EBBFLOW_END_NAMESPACE
#endif
