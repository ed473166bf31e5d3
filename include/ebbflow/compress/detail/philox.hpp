// SPDX-License-Identifier: Apache-2.0
//! @file philox.hpp
//! Philox4x32-10 (Salmon et al., SC'11), the counter-based generator of
//! cuRAND and Random123, written once for host and device. Pure integer
//! arithmetic (32x32->64 multiplies), so the CPU and the GPU produce the same
//! bits for the same key and counter. No state: a stochastic kernel derives the
//! counter from the element index, so results do not depend on how the work is
//! split into threads or blocks.
#pragma once

#include <ebbflow/config.hpp>

#include <cstdint>

EBBFLOW_BEGIN_NAMESPACE
namespace compress::detail {

struct philox_u4 {
  std::uint32_t x, y, z, w;
};

//! One Philox4x32-10 block: four uniformly distributed 32-bit words for
//! counter `c` under key (k0, k1).
EBBFLOW_HD inline philox_u4 philox4x32_10(philox_u4 c, std::uint32_t k0, std::uint32_t k1) noexcept {
  constexpr std::uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
  constexpr std::uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = static_cast<std::uint64_t>(m0) * c.x;
    const std::uint64_t p1 = static_cast<std::uint64_t>(m1) * c.z;
    const std::uint32_t hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const std::uint32_t hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    c = philox_u4{hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0};
    k0 += w0;
    k1 += w1;
  }
  return c;
}

//! Key and stream of one stochastic encode: the 64-bit seed is the key, the
//! stream id (e.g. rank, step and region hashed together) goes in the counter's
//! upper words, the element-group index in the lower ones.
struct philox_stream {
  std::uint64_t seed = 0;
  std::uint64_t stream = 0;

  //! Four random words for group `i` of this stream.
  EBBFLOW_HD philox_u4 operator()(std::uint64_t i) const noexcept {
    return philox4x32_10({static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(i >> 32),
                          static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)},
                         static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
  }
};

//! SplitMix64 finaliser: mixes rank/step/region into one well-spread stream id.
EBBFLOW_HD constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace compress::detail
EBBFLOW_END_NAMESPACE
