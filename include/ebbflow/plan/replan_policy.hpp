// SPDX-License-Identifier: Apache-2.0
//! @file replan_policy.hpp
//! Renamed to plan/replanner.hpp (the header of `plan::replanner`); this
//! compatibility include is kept for one release and then removed. Include
//! the new header instead.
#pragma once

#include <ebbflow/plan/replanner.hpp>
