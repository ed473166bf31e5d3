// SPDX-License-Identifier: Apache-2.0
//! @file ebbflow.hpp
//! Umbrella header: every public ebbflow header whose dependencies are on the
//! include path (optional backends behind their EBBFLOW_HAS_* guards, see
//! config.hpp). Including a piece's own headers compiles faster.
// GENERATED FILE, DO NOT EDIT: cmake/amalgamate.cmake writes it from the
// headers present (regenerate: cmake -P cmake/amalgamate.cmake).
#pragma once

#include <ebbflow/config.hpp>

#include <ebbflow/comm/loopback_transport.hpp>
#include <ebbflow/comm/transport.hpp>
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/core/dtype.hpp>
#include <ebbflow/core/env.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/core/half.hpp>
#include <ebbflow/core/handle.hpp>
#include <ebbflow/core/log.hpp>
#include <ebbflow/core/memory.hpp>
#include <ebbflow/exec/executor.hpp>
#include <ebbflow/version.hpp>
