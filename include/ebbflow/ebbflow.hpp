// SPDX-License-Identifier: Apache-2.0
//! @file ebbflow.hpp
//! Umbrella header: every public ebbflow header whose dependencies are on the
//! include path (optional backends behind their EBBFLOW_HAS_* guards, see
//! config.hpp). Including a piece's own headers compiles faster.
//! prefetch/cuda_stage.hpp is included in every build but needs CUDA:
//! `prefetch::cuda_stage` and `cuda_host_allocator()` exist only when
//! EBBFLOW_HAS_CUDA is 1 (CUDA headers present, no EBBFLOW_NO_CUDA).
// GENERATED FILE, DO NOT EDIT: cmake/amalgamate.cmake writes it from the
// headers present (regenerate: cmake -P cmake/amalgamate.cmake).
#pragma once

#include <ebbflow/config.hpp>

#include <ebbflow/comm/communicator.hpp>
#include <ebbflow/comm/loopback_transport.hpp>
#include <ebbflow/comm/reduce.hpp>
#include <ebbflow/comm/revocable.hpp>
#include <ebbflow/comm/shared_memory.hpp>
#include <ebbflow/comm/transport.hpp>
#include <ebbflow/compress.hpp>
#include <ebbflow/compress/bucket.hpp>
#include <ebbflow/compress/codec.hpp>
#include <ebbflow/compress/codecs/cast.hpp>
#include <ebbflow/compress/codecs/powersgd.hpp>
#include <ebbflow/compress/codecs/quantize.hpp>
#include <ebbflow/compress/codecs/sign.hpp>
#include <ebbflow/compress/codecs/topk.hpp>
#include <ebbflow/compress/compressed_allreduce.hpp>
#include <ebbflow/compress/kernels/block.hpp>
#include <ebbflow/compress/kernels/cast.hpp>
#include <ebbflow/compress/kernels/lowrank.hpp>
#include <ebbflow/compress/kernels/quantize.hpp>
#include <ebbflow/compress/kernels/sign.hpp>
#include <ebbflow/compress/kernels/topk.hpp>
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/core/dtype.hpp>
#include <ebbflow/core/enum_names.hpp>
#include <ebbflow/core/env.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/core/half.hpp>
#include <ebbflow/core/handle.hpp>
#include <ebbflow/core/log.hpp>
#include <ebbflow/core/memory.hpp>
#include <ebbflow/core/thread_name.hpp>
#include <ebbflow/elastic/cooldown.hpp>
#include <ebbflow/elastic/group.hpp>
#include <ebbflow/elastic/group_options.hpp>
#include <ebbflow/elastic/group_types.hpp>
#include <ebbflow/elastic/kv_store.hpp>
#include <ebbflow/elastic/loopback_network.hpp>
#include <ebbflow/elastic/network.hpp>
#include <ebbflow/elastic/planner_policy.hpp>
#include <ebbflow/elastic/planning_policy.hpp>
#include <ebbflow/elastic/policy.hpp>
#include <ebbflow/elastic/store_address_exchange.hpp>
#include <ebbflow/elastic/store_options.hpp>
#include <ebbflow/exec/executor.hpp>
#include <ebbflow/plan.hpp>
#include <ebbflow/plan/batch_planner.hpp>
#include <ebbflow/plan/cost_model.hpp>
#include <ebbflow/plan/cost_models.hpp>
#include <ebbflow/plan/plan_error.hpp>
#include <ebbflow/plan/replan_policy.hpp>
#include <ebbflow/plan/replanner.hpp>
#include <ebbflow/plan/sampler.hpp>
#include <ebbflow/plan/shard_sampler.hpp>
#include <ebbflow/plan/work_stealing.hpp>
#include <ebbflow/plan/worker_models.hpp>
#include <ebbflow/prefetch/cuda_stage.hpp>
#include <ebbflow/prefetch/device_stage.hpp>
#include <ebbflow/prefetch/index_source.hpp>
#include <ebbflow/prefetch/pinned_pool.hpp>
#include <ebbflow/prefetch/prefetcher.hpp>
#include <ebbflow/version.hpp>

#if EBBFLOW_HAS_ASIO
#include <ebbflow/elastic/any_store.hpp>
#include <ebbflow/elastic/etcd_store.hpp>
#include <ebbflow/elastic/store.hpp>
#include <ebbflow/elastic/tcp_store.hpp>
#endif  // EBBFLOW_HAS_ASIO

#if EBBFLOW_HAS_CUDA && EBBFLOW_HAS_NCCL
#include <ebbflow/comm/nccl/communicator.hpp>
#include <ebbflow/comm/nccl_communicator.hpp>
#endif  // EBBFLOW_HAS_CUDA && EBBFLOW_HAS_NCCL

#if EBBFLOW_HAS_UCX
#include <ebbflow/comm/ucx/address_exchange.hpp>
#include <ebbflow/comm/ucx/endpoint_pool.hpp>
#include <ebbflow/comm/ucx/handles.hpp>
#include <ebbflow/comm/ucx/transport.hpp>
#include <ebbflow/elastic/ucx_network.hpp>
#endif  // EBBFLOW_HAS_UCX
