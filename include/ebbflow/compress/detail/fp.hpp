// SPDX-License-Identifier: Apache-2.0
//! @file fp.hpp
//! Floating-point helpers whose results are bit-identical on host and device.
//! nvcc contracts `a * b + c` into an FMA by default while a host build for
//! baseline x86-64 does not, so kernels that must match the CPU bit for bit
//! multiply and add through `fmul` / `fadd`, which nvcc never fuses. Bit casts
//! and branch-free selects keep host loops vectorisable.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/half.hpp>

#include <cstdint>
#include <cstring>

EBBFLOW_BEGIN_NAMESPACE
namespace compress::detail {

EBBFLOW_HD inline float fmul(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
EBBFLOW_HD inline float fadd(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
EBBFLOW_HD inline float fsub(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
//! A decoded value into its place: `out = d`, or with `Add` (decode_add) `out += d`.
template <bool Add>
EBBFLOW_HD inline void store(float& out, float d) noexcept {
  if constexpr (Add)
    out = fadd(out, d);
  else
    out = d;
}
// Bit casts shared with core/half.hpp (one implementation, host and device).
EBBFLOW_HD inline std::uint32_t as_u32(float f) noexcept { return ::ebbflow::detail::float_bits(f); }
EBBFLOW_HD inline float as_f32(std::uint32_t u) noexcept { return ::ebbflow::detail::bits_float(u); }
//! Whether `x` is neither inf nor NaN (from its exponent bits, the same on
//! host and device and under fast-math).
EBBFLOW_HD inline bool is_finite(float x) noexcept { return (as_u32(x) & 0x7F800000u) != 0x7F800000u; }
//! `x`, or 0 when it is inf or NaN: an error-feedback residual that is not
//! finite is dropped (a step that overflowed must not poison every later
//! one, e.g. under loss scaling, which skips such steps).
EBBFLOW_HD inline float finite_or_zero(float x) noexcept { return is_finite(x) ? x : 0.0f; }
//! Round toward minus infinity, as an int (|x| < 2^31).
EBBFLOW_HD inline std::int32_t floor_i32(float x) noexcept {
  const auto t = static_cast<std::int32_t>(x);  // truncates toward zero
  return t - static_cast<std::int32_t>(static_cast<float>(t) > x);
}

//! Branch-free select: `c ? a : b` as masks, so host loops if-convert and vectorise.
EBBFLOW_HD inline std::uint32_t select(bool c, std::uint32_t a, std::uint32_t b) noexcept {
  const std::uint32_t m = 0u - static_cast<std::uint32_t>(c);
  return (a & m) | (b & ~m);
}

//! float -> IEEE binary16 bits, round to nearest even, branch-free (after
//! F. Giesen's float_to_half_fast3_rtne). Same bits as `ebbflow::half`.
EBBFLOW_HD inline std::uint16_t f32_to_f16(float f) noexcept {
  const std::uint32_t x = as_u32(f);
  const std::uint32_t sign = x & 0x80000000u;
  const std::uint32_t ax = x ^ sign;
  // Normal range: rebias, round to nearest even through the carry.
  const std::uint32_t normal = (ax + 0xC8000FFFu + ((ax >> 13) & 1u)) >> 13;
  // Subnormal range: let the FPU round (adding 0.5 aligns the 10 bits).
  const std::uint32_t sub = as_u32(as_f32(ax) + 0.5f) - 0x3F000000u;
  const std::uint32_t special = select(ax > 0x7F800000u, 0x7E00u, 0x7C00u);
  std::uint32_t o = select(ax < 0x38800000u, sub, normal);
  o = select(ax >= 0x47800000u, special, o);
  return static_cast<std::uint16_t>(o | (sign >> 16));
}
//! IEEE binary16 bits -> float (exact), branch-free.
EBBFLOW_HD inline float f16_to_f32(std::uint16_t h) noexcept {
  const std::uint32_t hu = h;
  const std::uint32_t body = (hu & 0x7FFFu) << 13;
  const std::uint32_t exp = body & 0x0F800000u;
  const std::uint32_t normal = body + 0x38000000u;
  const std::uint32_t inf_nan = body + 0x70000000u;
  const std::uint32_t sub = as_u32(as_f32(body + 0x38800000u) - 6.103515625e-05f);
  std::uint32_t o = select(exp == 0x0F800000u, inf_nan, normal);
  o = select(exp == 0, sub, o);
  return as_f32(o | ((hu & 0x8000u) << 16));
}
//! float -> bfloat16 bits, round to nearest even; NaN stays a quiet NaN.
EBBFLOW_HD inline std::uint16_t f32_to_bf16(float f) noexcept {
  const std::uint32_t x = as_u32(f);
  const std::uint32_t rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
  const std::uint32_t nan = (x >> 16) | 0x40u;
  return static_cast<std::uint16_t>(select((x & 0x7FFFFFFFu) > 0x7F800000u, nan, rounded));
}
EBBFLOW_HD inline float bf16_to_f32(std::uint16_t b) noexcept { return as_f32(static_cast<std::uint32_t>(b) << 16); }

}  // namespace compress::detail
EBBFLOW_END_NAMESPACE
