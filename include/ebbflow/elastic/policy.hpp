// SPDX-License-Identifier: Apache-2.0
//! @file policy.hpp
//! Renamed elastic/planning_policy.hpp (`planning_policy`, `uniform_policy`,
//! `member_id`, `scale_plan`); this compatibility include goes in the next
//! release.
#pragma once

#include <ebbflow/elastic/planning_policy.hpp>
