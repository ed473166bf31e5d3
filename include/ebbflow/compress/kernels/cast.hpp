// SPDX-License-Identifier: Apache-2.0
//! @file cast.hpp
//! fp16 / bf16 cast kernels with optional error feedback. One functor call
//! per block of `block_size` elements. Bit-identical on host and device.
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

//! out[i] = cast(in[i] + res[i]); res[i] = (in[i] + res[i]) - float(out[i]).
//! `res` may be null (no error feedback). Pointers in the executor's space.
template <cast_format F>
struct cast_encode {
  const float* in;     //!< n input floats
  float* res;          //!< n residual floats, or null
  std::uint16_t* out;  //!< n codes (output)
  std::size_t n;       //!< element count

  //! Processes block `b` (elements [256 b, min(256 (b + 1), n))).
  EBBFLOW_HD void operator()(std::size_t b) const noexcept {
    const std::size_t o = b * block_size;
    const float* EBBFLOW_DETAIL_RESTRICT pi = in + o;
    std::uint16_t* EBBFLOW_DETAIL_RESTRICT po = out + o;
    if (res == nullptr) {
      for_block(b, n, [&](auto cnt) {
        for (std::uint32_t j = 0; j < cnt; ++j) po[j] = to_bits<F>(pi[j]);
      });
    } else {
      float* EBBFLOW_DETAIL_RESTRICT pr = res + o;
      for_block(b, n, [&](auto cnt) {
        for (std::uint32_t j = 0; j < cnt; ++j) {
          const float v = detail::fadd(pi[j], pr[j]);
          const std::uint16_t q = to_bits<F>(v);
          po[j] = q;
          pr[j] = detail::finite_or_zero(detail::fsub(v, from_bits<F>(q)));
        }
      });
    }
  }
};

//! out[i] = float(in[i]) (Add = false) or out[i] += float(in[i]) (Add = true).
template <cast_format F, bool Add>
struct cast_decode {
  const std::uint16_t* in;  //!< n codes
  float* out;               //!< n floats (output, or accumulated into when `Add`)
  std::size_t n;            //!< element count

  //! Processes block `b` (elements [256 b, min(256 (b + 1), n))).
  EBBFLOW_HD void operator()(std::size_t b) const noexcept {
    const std::size_t o = b * block_size;
    const std::uint16_t* EBBFLOW_DETAIL_RESTRICT pi = in + o;
    float* EBBFLOW_DETAIL_RESTRICT po = out + o;
    for_block(b, n, [&](auto cnt) {
      for (std::uint32_t j = 0; j < cnt; ++j) {
        detail::store<Add>(po[j], from_bits<F>(pi[j]));
      }
    });
  }
};

}  // namespace compress::kernels
EBBFLOW_END_NAMESPACE
