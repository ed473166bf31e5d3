// SPDX-License-Identifier: Apache-2.0
//! @file planning_policy.hpp
//! How the elastic group sizes each member's share of the global batch.
//! The coordinator asks its policy for a plan; every member feeds its policy
//! the same observations (the per-step control exchange carries every
//! member's batch and compute time), so a newly elected coordinator plans
//! from the same history. Plans are for the full global batch; a short last
//! batch of an epoch is split with `scale_plan`.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

//! Identifies a worker for the whole job (assigned by the store; never reused).
using member_id = std::int64_t;

//! Decides the members' batch sizes. Called only from the group's training
//! thread (need not be thread-safe); exceptions propagate out of the group
//! call that asked for the plan.
class planning_policy {
 public:
  virtual ~planning_policy() = default;
  //! One measured step of `member`: `batch` samples took `seconds` of compute.
  virtual void observe(member_id member, std::size_t batch, double seconds) = 0;
  //! Batch sizes (rank order of `members`) that sum to `global_batch`.
  virtual std::vector<std::size_t> plan(std::span<const member_id> members, std::size_t global_batch) = 0;
  //! What the policy knows of a member's speed: seconds per step and per
  //! sample (the inputs of its plan). Paces in-step work stealing.
  struct member_model {
    double fixed_seconds = 0;       //!< a_i
    double seconds_per_sample = 0;  //!< c_i (> 0 when known)
  };
  //! The models of `members` (rank order), or empty when the policy has
  //! none for them yet (then `group::steal_step` steals unpaced).
  [[nodiscard]] virtual std::vector<member_model> models(std::span<const member_id> members) const {
    (void)members;
    return {};
  }
  //! Whether `current` should be replaced (checked by the coordinator each step).
  virtual bool should_replan(std::span<const member_id> members, std::span<const std::size_t> current,
                             std::size_t global_batch) {
    (void)members, (void)current, (void)global_batch;
    return false;
  }
};

//! Equal shares (the remainder goes to the lowest ranks). The default when no
//! planner is given; ignores timings.
class uniform_policy final : public planning_policy {
 public:
  void observe(member_id, std::size_t, double) override {}
  std::vector<std::size_t> plan(std::span<const member_id> members, std::size_t global_batch) override {
    EBBFLOW_ENFORCE(!members.empty(), "uniform_policy: empty membership");
    const std::size_t n = members.size();
    std::vector<std::size_t> b(n, global_batch / n);
    for (std::size_t i = 0; i < global_batch % n; ++i) ++b[i];
    return b;
  }
};

//! Splits `total` (≤ the plan's sum) in proportion to `plan`, deterministically:
//! floor shares, then the remainder to the largest fractional parts (ties to
//! the lower rank). Every rank computes the same result.
inline std::vector<std::size_t> scale_plan(std::span<const std::size_t> plan, std::size_t total) {
  const std::size_t sum = std::accumulate(plan.begin(), plan.end(), std::size_t{0});
  std::vector<std::size_t> out(plan.size(), 0);
  if (sum == total) {
    out.assign(plan.begin(), plan.end());
    return out;
  }
  if (sum == 0 || total == 0) {
    for (std::size_t i = 0; i < total; ++i) ++out[i % out.size()];
    return out;
  }
  std::vector<std::pair<std::size_t, std::size_t>> rem;  // (remainder numerator, rank)
  std::size_t given = 0;
  for (std::size_t i = 0; i < plan.size(); ++i) {
    __extension__ using u128 = unsigned __int128;
    const u128 num = static_cast<u128>(plan[i]) * total;
    out[i] = static_cast<std::size_t>(num / sum);
    rem.emplace_back(static_cast<std::size_t>(num % sum), i);
    given += out[i];
  }
  std::stable_sort(rem.begin(), rem.end(), [](auto& a, auto& b) { return a.first > b.first; });
  for (std::size_t k = 0; given < total; ++k, ++given) ++out[rem[k].second];
  return out;
}

}  // namespace elastic
EBBFLOW_END_NAMESPACE
