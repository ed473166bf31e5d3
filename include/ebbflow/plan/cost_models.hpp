// SPDX-License-Identifier: Apache-2.0
//! @file cost_models.hpp
//! Renamed to plan/worker_models.hpp (`plan::cost_models` is now
//! `plan::worker_models`); this compatibility include, like the old name, is
//! kept for one release and then removed. Include the new header instead.
#pragma once

#include <ebbflow/plan/worker_models.hpp>
