// SPDX-License-Identifier: Apache-2.0
//! @file plan.hpp
//! The heterogeneity-aware batch planner in one include: online cost models,
//! the exact batch-size solver, the re-planning policy, the exactly-once
//! samplers and in-step work stealing. Depends on core/ only; links nothing.
#pragma once

#include <ebbflow/plan/plan_error.hpp>
#include <ebbflow/plan/batch_planner.hpp>
#include <ebbflow/plan/cost_model.hpp>
#include <ebbflow/plan/replanner.hpp>
#include <ebbflow/plan/sampler.hpp>
#include <ebbflow/plan/shard_sampler.hpp>
#include <ebbflow/plan/work_stealing.hpp>
#include <ebbflow/plan/worker_models.hpp>
