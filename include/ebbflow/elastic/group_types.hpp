// SPDX-License-Identifier: Apache-2.0
//! @file group_types.hpp
//! What the elastic group hands a training loop: this member's share of a
//! step (`step_info`), a membership change (`world_change`, `change_reason`),
//! and the settings of in-step work stealing (`steal_settings`).
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/enum_names.hpp>
#include <ebbflow/plan/work_stealing.hpp>  // plan::steal_options

#include <cstddef>
#include <cstdint>
#include <string_view>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

//! What this member does in the current step.
struct step_info {
  std::int64_t step = 0;           //!< committed steps so far (this step's number)
  std::int64_t epoch = 0;          //!< epoch of this step
  std::size_t cursor = 0;          //!< position in the epoch's sample order where this step's global batch starts
  std::size_t global_batch = 0;    //!< B_t (B, or less for an epoch's short last batch)
  std::size_t offset = 0;          //!< start of this member's slice inside the global batch
  std::size_t batch = 0;           //!< b_i, this member's slice length (may be 0)
  double weight = 0;               //!< b_i / B_t: scale of this member's mean-loss gradient
  int rank = 0;                    //!< rank in the current generation
  int world_size = 1;              //!< members in the current generation
  std::int64_t generation = 0;     //!< current generation
  std::uint64_t plan_version = 0;  //!< identifies the plan (same on every member)
};

//! Settings of `group::steal_step`.
struct steal_settings {
  plan::steal_options chunks{};       //!< chunk sizes (and the deadline of each claim)
  double claim_seconds = 60e-6;       //!< one store round trip (what a claim costs a thief)
  double chunk_overhead_seconds = 0;  //!< this member's cost of processing one more chunk
};

//! Why the membership changed (passed to world-changed callbacks).
enum class change_reason : std::uint8_t { initial, join, leave, failure };

namespace detail {
inline constexpr auto change_reason_names =
    make_enum_names(change_reason::initial, "initial", "join", "leave", "failure");
static_assert(change_reason_names.last() == change_reason::failure);
}  // namespace detail

//! The reason as a lower-case word ("initial", "join", "leave", "failure"), for logs.
constexpr std::string_view name(change_reason r) noexcept { return detail::change_reason_names(r); }

//! A membership change as seen by callbacks and the event log.
struct world_change {
  std::int64_t generation = 0;                    //!< the generation that the change created
  change_reason reason = change_reason::initial;  //!< why it changed
  int old_size = 0;                               //!< members before the change (0 for the initial formation)
  int new_size = 0;                               //!< members after the change
  int rank = 0;                                   //!< this member's new rank
  std::int64_t step = 0;                          //!< committed step at which the change took effect
  double stall_seconds = 0;                       //!< time from the change's start to this member being ready again
};

}  // namespace elastic
EBBFLOW_END_NAMESPACE
