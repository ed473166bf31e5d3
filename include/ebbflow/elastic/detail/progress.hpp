// SPDX-License-Identifier: Apache-2.0
//! @file progress.hpp
//! Where a member's training thread is, as one store counter: the stall
//! warning's heartbeat publishes it and the waiting members read it.
#pragma once

#include <ebbflow/config.hpp>

#include <algorithm>
#include <cstdint>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

/// Step, generation and the number of the collective within the step, packed
/// as `step * 2^24 + generation * 2^8 + collective` so that a member behind
/// another reads a lower counter. The generation saturates at 2^16 - 1 and
/// the collective at 255 and the step at 2^39 - 1; a negative step reads
/// as 0. Collective 0 is the
/// control exchange after step `step - 1` (it runs after the commit).
struct progress {
  static constexpr std::int64_t max_generation = 0xffff;
  static constexpr int max_collective = 0xff;
  static constexpr std::int64_t max_step = (std::int64_t{1} << 39) - 1;

  std::int64_t step = 0;
  std::int64_t generation = 0;
  int collective = 0;

  /// The generation as the counter holds it (saturated).
  [[nodiscard]] static constexpr std::int64_t stored_generation(std::int64_t g) noexcept {
    return std::clamp<std::int64_t>(g, 0, max_generation);
  }

  [[nodiscard]] constexpr std::int64_t encode() const noexcept {
    return (std::clamp<std::int64_t>(step, 0, max_step) << 24) + (stored_generation(generation) << 8) +
           std::clamp(collective, 0, max_collective);
  }

  [[nodiscard]] static constexpr progress decode(std::int64_t word) noexcept {
    return {word >> 24, (word >> 8) & max_generation, static_cast<int>(word & max_collective)};
  }
};

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
