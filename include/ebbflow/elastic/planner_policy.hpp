// SPDX-License-Identifier: Apache-2.0
//! @file planner_policy.hpp
//! `planner_policy`: the elastic group's heterogeneity-aware policy. Keeps a
//! robust online cost model per member (plan::cost_model), plans with the
//! exact batch planner (plan::solve) and re-plans with hysteresis
//! (the threshold must hold for `persist` consecutive checks) when the models drift. Members without a fitted model
//! yet (newcomers) are planned with the mean model of the others, so a
//! joiner gets a sensible share at once and an exact one after a few steps.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/elastic/planning_policy.hpp>
#include <ebbflow/plan/batch_planner.hpp>
#include <ebbflow/plan/worker_models.hpp>
#include <ebbflow/plan/replanner.hpp>  // plan::replan_options

#include <map>
#include <span>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

//! Settings of `planner_policy`.
struct planner_policy_options {
  std::size_t max_batch = 1u << 30;  //!< memory cap m_i applied to every member
  plan::cost_model_options model{};  //!< per-member cost model settings
  plan::replan_options replan{};     //!< drift threshold and hysteresis
};

//! Plans with per-member robust cost models and the exact batch planner;
//! observations with a zero batch or a non-positive time are ignored. Until
//! any member has a fitted model it plans uniformly. Not thread-safe (see
//! `planning_policy`).
class planner_policy final : public planning_policy {
 public:
  //! A policy with no observations yet (plans uniformly until models fit).
  explicit planner_policy(planner_policy_options o = {}) : opts_(o), models_(o.model) {}

  void observe(member_id m, std::size_t batch, double seconds) override;
  std::vector<std::size_t> plan(std::span<const member_id> members, std::size_t global_batch) override;
  bool should_replan(std::span<const member_id> members, std::span<const std::size_t> current,
                     std::size_t global_batch) override;
  std::vector<member_model> models(std::span<const member_id> members) const override;

  //! The model of member `m`, or nullptr when it has no fitted one yet.
  [[nodiscard]] const plan::cost_model* model(member_id m) const {
    return models_.fitted(static_cast<std::uint64_t>(m));
  }

 private:
  // Specs in rank order (newcomers: the others' mean model); empty when
  // nobody has a fitted model (then the caller plans uniformly).
  std::vector<plan::worker_spec> specs_of(std::span<const member_id> members) const;

  planner_policy_options opts_;
  plan::worker_models models_;
  unsigned streak_ = 0;
};

}  // namespace elastic
EBBFLOW_END_NAMESPACE

#include <ebbflow/elastic/impl/planner_policy.hpp>
