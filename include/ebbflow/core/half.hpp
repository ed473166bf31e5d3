// SPDX-License-Identifier: Apache-2.0
//! @file half.hpp
//! 16-bit floating-point storage types usable on host and device: `half`
//! (IEEE binary16) and `bfloat16`. Arithmetic is done in float; conversions
//! round to nearest even, identically on CPU and GPU (bit-exact).
#pragma once

#include <ebbflow/config.hpp>

#include <cstdint>
#include <cstring>

EBBFLOW_BEGIN_NAMESPACE

namespace detail {
EBBFLOW_HD inline std::uint32_t float_bits(float f) noexcept {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
EBBFLOW_HD inline float bits_float(std::uint32_t u) noexcept {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}
}  // namespace detail

//! IEEE 754 binary16 storage. Conversions round to nearest even; NaN stays NaN.
struct half {
  std::uint16_t bits = 0;  //!< the binary16 bit pattern

  half() = default;
  //! Rounds `f` to the nearest half.
  EBBFLOW_HD explicit half(float f) noexcept : bits(from_float(f)) {}
  //! The exact float value.
  EBBFLOW_HD explicit operator float() const noexcept { return to_float(bits); }

  //! Bit pattern of `f` rounded to half (nearest even; overflow gives inf).
  EBBFLOW_HD static std::uint16_t from_float(float f) noexcept {
    const std::uint32_t x = detail::float_bits(f);
    const std::uint32_t sign = (x >> 16) & 0x8000u;
    const std::uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {  // inf or nan
      return static_cast<std::uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    }
    if (ax >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow -> inf
    if (ax < 0x38800000u) {                                                    // subnormal or zero in half
      // Shift the float (with implicit bit) into half subnormal position, RNE.
      if (ax < 0x33000000u) return static_cast<std::uint16_t>(sign);  // < 2^-25 rounds to 0
      const std::uint32_t e = ax >> 23;
      const std::uint32_t m = (ax & 0x7fffffu) | 0x800000u;
      const std::uint32_t shift = 126u - e;  // 14 + (127-1) - e ... gives mantissa in 10 bits
      const std::uint32_t r = m >> shift;
      const std::uint32_t rem = m & ((1u << shift) - 1u);
      const std::uint32_t halfway = 1u << (shift - 1u);
      std::uint32_t h = r;
      if (rem > halfway || (rem == halfway && (r & 1u))) ++h;
      return static_cast<std::uint16_t>(sign | h);
    }
    std::uint32_t h = ((ax - 0x38000000u) >> 13);  // rebias exponent 127 -> 15
    const std::uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }

  //! The float value of the bit pattern `h`.
  EBBFLOW_HD static float to_float(std::uint16_t h) noexcept {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t e = (h >> 10) & 0x1fu;
    std::uint32_t m = h & 0x3ffu;
    if (e == 0x1fu) return detail::bits_float(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
      if (m == 0) return detail::bits_float(sign);
      // subnormal: value = m * 2^-24
      const float v = static_cast<float>(m) * 5.9604644775390625e-8f;
      return detail::bits_float(sign | detail::float_bits(v));
    }
    return detail::bits_float(sign | ((e + 112u) << 23) | (m << 13));
  }
};

//! bfloat16 storage (the upper 16 bits of a float). Round to nearest even.
struct bfloat16 {
  std::uint16_t bits = 0;  //!< the bfloat16 bit pattern

  bfloat16() = default;
  //! Rounds `f` to the nearest bfloat16.
  EBBFLOW_HD explicit bfloat16(float f) noexcept : bits(from_float(f)) {}
  //! The exact float value.
  EBBFLOW_HD explicit operator float() const noexcept { return to_float(bits); }

  //! Bit pattern of `f` rounded to bfloat16 (nearest even; NaN stays NaN).
  EBBFLOW_HD static std::uint16_t from_float(float f) noexcept {
    const std::uint32_t x = detail::float_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // quiet NaN
    const std::uint32_t lsb = (x >> 16) & 1u;
    return static_cast<std::uint16_t>((x + 0x7fffu + lsb) >> 16);
  }
  //! The float value of the bit pattern `b`.
  EBBFLOW_HD static float to_float(std::uint16_t b) noexcept {
    return detail::bits_float(static_cast<std::uint32_t>(b) << 16);
  }
};

static_assert(sizeof(half) == 2 && sizeof(bfloat16) == 2);

EBBFLOW_END_NAMESPACE
