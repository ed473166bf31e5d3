// SPDX-License-Identifier: Apache-2.0
//! @file nccl/communicator.hpp
//! The former names of the NCCL communicator, kept for one release: include
//! <ebbflow/comm/nccl_communicator.hpp> and use `comm::nccl_communicator`,
//! `nccl_unique_id`, `make_nccl_unique_id` and `nccl_options` instead. The
//! collectives take `buffer_view`s and run on the communicator's stream
//! (the former pointer-and-stream signatures are gone).
//! @deprecated Use comm/nccl_communicator.hpp.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/comm/nccl_communicator.hpp>

EBBFLOW_BEGIN_NAMESPACE
namespace comm::nccl {

//! @deprecated Use `comm::nccl_communicator`.
using communicator = nccl_communicator;
//! @deprecated Use `comm::nccl_unique_id`.
using unique_id_bytes = nccl_unique_id;
//! @deprecated Use `comm::nccl_options`.
using options = nccl_options;
//! @deprecated Use `comm::make_nccl_unique_id`.
inline nccl_unique_id make_unique_id() { return make_nccl_unique_id(); }
using comm::to_nccl;

}  // namespace comm::nccl
EBBFLOW_END_NAMESPACE
