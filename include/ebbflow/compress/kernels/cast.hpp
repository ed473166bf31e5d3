// SPDX-License-Identifier: Apache-2.0
//! @file cast.hpp
//! fp16 / bf16 cast kernels with optional error feedback and a power-of-two
//! scale, and the range scan the scale is chosen from. One functor call per
//! block of `block_size` elements. Bit-identical on host and device.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/compress/detail/fp.hpp>
#include <ebbflow/compress/kernels/block.hpp>

#include <cstddef>
#include <cstdint>

EBBFLOW_BEGIN_NAMESPACE
namespace compress::kernels {

//! Target format of a cast code.
enum class cast_format { f16, bf16 };

//! `v` rounded to nearest even in format `F`, as raw bits.
template <cast_format F>
EBBFLOW_HD inline std::uint16_t to_bits(float v) noexcept {
  if constexpr (F == cast_format::f16)
    return detail::f32_to_f16(v);
  else
    return detail::f32_to_bf16(v);
}
//! The float value of raw bits `b` of format `F` (exact).
template <cast_format F>
EBBFLOW_HD inline float from_bits(std::uint16_t b) noexcept {
  if constexpr (F == cast_format::f16)
    return detail::f16_to_f32(b);
  else
    return detail::bf16_to_f32(b);
}

//! out[i] = cast(w), w = in[i] * in_scale + res[i] * res_scale;
//! res[i] = (w - float(out[i])) * inv_scale.
//! `res` may be null (no error feedback). The scales are powers of two, so
//! every product is exact: 1, 1, 1 is the plain cast of in + res; s, s, 1/s
//! the cast of (in + res) s with an unscaled residual; 1, s, 1/s takes `in`
//! already scaled (the ring's running sums). Pointers in the executor's space.
template <cast_format F>
struct cast_encode {
  const float* in;         //!< n input floats
  float* res;              //!< n residual floats (unscaled), or null
  std::uint16_t* out;      //!< n codes (output)
  std::size_t n;           //!< element count
  float in_scale = 1.0f;   //!< factor of `in`
  float res_scale = 1.0f;  //!< factor of `res`
  float inv_scale = 1.0f;  //!< 1 / res_scale

  //! Processes block `b` (elements [256 b, min(256 (b + 1), n))).
  EBBFLOW_HD void operator()(std::size_t b) const noexcept {
    const std::size_t o = b * block_size;
    const float* EBBFLOW_DETAIL_RESTRICT pi = in + o;
    std::uint16_t* EBBFLOW_DETAIL_RESTRICT po = out + o;
    if (res == nullptr) {
      for_block(b, n, [&](auto cnt) {
        for (std::uint32_t j = 0; j < cnt; ++j) po[j] = to_bits<F>(detail::fmul(pi[j], in_scale));
      });
    } else {
      float* EBBFLOW_DETAIL_RESTRICT pr = res + o;
      for_block(b, n, [&](auto cnt) {
        for (std::uint32_t j = 0; j < cnt; ++j) {
          const float w = detail::fadd(detail::fmul(pi[j], in_scale), detail::fmul(pr[j], res_scale));
          const std::uint16_t q = to_bits<F>(w);
          po[j] = q;
          pr[j] = detail::finite_or_zero(detail::fmul(detail::fsub(w, from_bits<F>(q)), inv_scale));
        }
      });
    }
  }
};

//! out[i] = float(in[i]) * scale (Add = false), or
//! out[i] = out[i] * acc_scale + float(in[i]) * scale (Add = true). The
//! scales are powers of two (exact): 1/s undoes an encoder's s; acc_scale s
//! moves an accumulator of values into code units as the code is added.
template <cast_format F, bool Add>
struct cast_decode {
  const std::uint16_t* in;  //!< n codes
  float* out;               //!< n floats (output, or accumulated into when `Add`)
  std::size_t n;            //!< element count
  float scale = 1.0f;       //!< factor of the decoded code
  float acc_scale = 1.0f;   //!< factor of `out` before the add (`Add` only)

  //! Processes block `b` (elements [256 b, min(256 (b + 1), n))).
  EBBFLOW_HD void operator()(std::size_t b) const noexcept {
    const std::size_t o = b * block_size;
    const std::uint16_t* EBBFLOW_DETAIL_RESTRICT pi = in + o;
    float* EBBFLOW_DETAIL_RESTRICT po = out + o;
    for_block(b, n, [&](auto cnt) {
      for (std::uint32_t j = 0; j < cnt; ++j) {
        const float d = detail::fmul(from_bits<F>(pi[j]), scale);
        if constexpr (Add)
          po[j] = detail::fadd(detail::fmul(po[j], acc_scale), d);
        else
          po[j] = d;
      }
    });
  }
};

//! The range of `in` over block b, from which `compressed_allreduce` scales
//! the cast codes: out[2 b] = the bits of the largest finite |in[i]| (0 when
//! there is none), out[2 b + 1] = 1 when some in[i] is inf or NaN, else 0.
//! Pointers in the executor's space.
struct finite_amax {
  const float* in;     //!< n floats
  std::uint32_t* out;  //!< 2 words per block (output)
  std::size_t n;       //!< element count

  //! Processes block `b` (elements [256 b, min(256 (b + 1), n))).
  EBBFLOW_HD void operator()(std::size_t b) const noexcept {
    const float* EBBFLOW_DETAIL_RESTRICT pi = in + b * block_size;
    for_block(b, n, [&](auto cnt) {
      // Two max reductions on the integer image of |v| (monotone for
      // non-negative floats; inf and NaN above every finite value),
      // branch-free: the loop vectorises where a float max, or an or of
      // flags, does not (measured: 7.6x).
      std::int32_t amax = 0, all = 0;
      for (std::uint32_t j = 0; j < cnt; ++j) {
        const auto a = static_cast<std::int32_t>(detail::as_u32(pi[j]) & 0x7FFFFFFFu);
        const std::int32_t finite = a < 0x7F800000 ? a : 0;
        amax = finite > amax ? finite : amax;
        all = a > all ? a : all;
      }
      out[2 * b] = static_cast<std::uint32_t>(amax);
      out[2 * b + 1] = all >= 0x7F800000 ? 1u : 0u;
    });
  }
};

}  // namespace compress::kernels
EBBFLOW_END_NAMESPACE
