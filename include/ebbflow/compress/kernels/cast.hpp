// SPDX-License-Identifier: Apache-2.0
//! @file cast.hpp
//! fp16 / bf16 cast kernels with optional error feedback, in block floating
//! point: each block of `block_size` elements is scaled by its own power of
//! two 2^e (e in [-126, 126], one signed byte per block) so that its largest
//! |value| lands in [2^15, 65504] (fp16; just below 2^15 where it would round
//! beyond 65504) or [2^125, 2^126) (bf16). The codes
//! then hold any finite float and keep the format's relative precision for
//! every element within 2^-28 (fp16) of its block's largest, and the ring's hop
//! (`cast_add_encode`) adds a running sum to this rank's values without
//! ever unscaling the sum. Powers of two are exact: where a value is in the
//! format's normal range with and without the scale, its code decodes to the
//! plain cast's value. One functor call per block. Bit-identical on host
//! and device.
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

//! log2 of the bound H that a block's scaled values are kept below: 16 for
//! fp16 (and at most 65504, its largest value, after rounding), 126 for
//! bf16 (so that the hop's sum of two such values, below 2H, is still a
//! finite float).
template <cast_format F>
inline constexpr int block_top_log2 = F == cast_format::f16 ? 16 : 126;

//! 2^e as a float, for e in [-126, 127] (exact).
EBBFLOW_HD inline float pow2(int e) noexcept { return detail::as_f32(static_cast<std::uint32_t>(e + 127) << 23); }
//! x 2^d for d in [-252, 252], in two exact steps (one rounding at most,
//! where the result is subnormal).
EBBFLOW_HD inline float scale_pow2(float x, int d) noexcept {
  const int h = d / 2;
  return detail::fmul(detail::fmul(x, pow2(h)), pow2(d - h));
}
//! The block exponent e for a block whose largest finite |value| has the
//! bits `amax`: amax 2^e in [H / 2, H), clamped to [-126, 126] (126 for an
//! all-zero block). fp16: one binade lower where amax 2^e would round
//! beyond 65504 (a significand of 2 - 2^-11 or more, 65520 and up); so a
//! block whose largest value is in fp16's range gets e >= 0, and each of its
//! values in fp16's normal range the plain cast's bits.
template <cast_format F>
EBBFLOW_HD inline int block_exponent(std::uint32_t amax) noexcept {
  int e = block_top_log2<F> + 126 - static_cast<int>(amax >> 23);
  if constexpr (F == cast_format::f16) e -= (amax & 0x7FFFFFu) >= 0x7FF000u ? 1 : 0;
  return e < -126 ? -126 : e > 126 ? 126 : e;
}
//! The bits of the largest finite |v| of a block, on the integer image of
//! |v| (monotone for non-negative floats; inf and NaN are skipped),
//! branch-free so that the loop vectorises. `v(j)` gives element j.
template <class V>
EBBFLOW_HD inline std::uint32_t finite_amax(std::uint32_t cnt, V&& v) noexcept {
  std::int32_t amax = 0;
  for (std::uint32_t j = 0; j < cnt; ++j) {
    const auto a = static_cast<std::int32_t>(detail::as_u32(v(j)) & 0x7FFFFFFFu);
    const std::int32_t finite = a < 0x7F800000 ? a : 0;
    amax = finite > amax ? finite : amax;
  }
  return static_cast<std::uint32_t>(amax);
}

//! Encodes block b of v = in + res (`res` may be null: no error feedback):
//! exps[b] = e = block_exponent(max |v|), out[i] = cast(v 2^e), and
//! res = v - float(out[i]) 2^-e. Non-finite values pass as inf or NaN.
//! Pointers in the executor's space.
template <cast_format F>
struct cast_encode {
  const float* in;     //!< n input floats
  float* res;          //!< n residual floats, or null
  std::uint16_t* out;  //!< n codes (output)
  std::int8_t* exps;   //!< one exponent per block (output)
  std::size_t n;       //!< element count

  //! Processes block `b` (elements [256 b, min(256 (b + 1), n))).
  EBBFLOW_HD void operator()(std::size_t b) const noexcept {
    with_residual(res, [&](auto ef) {
      constexpr bool EF = decltype(ef)::value;
      const std::size_t o = b * block_size;
      const float* EBBFLOW_DETAIL_RESTRICT pi = in + o;
      float* EBBFLOW_DETAIL_RESTRICT pr = EF ? res + o : nullptr;
      std::uint16_t* EBBFLOW_DETAIL_RESTRICT po = out + o;
      for_block(b, n, [&](auto cnt) {
        const auto v = [&](std::uint32_t j) { return EF ? detail::fadd(pi[j], pr[j]) : pi[j]; };
        const int e = block_exponent<F>(finite_amax(cnt, v));
        exps[b] = static_cast<std::int8_t>(e);
        const float s = pow2(e), inv = pow2(-e);
        for (std::uint32_t j = 0; j < cnt; ++j) {
          const float w = detail::fmul(v(j), s);
          const std::uint16_t q = to_bits<F>(w);
          po[j] = q;
          if constexpr (EF) pr[j] = detail::finite_or_zero(detail::fmul(detail::fsub(w, from_bits<F>(q)), inv));
        }
      });
    });
  }
};

//! out[i] = float(in[i]) 2^-exps[b] (Add = false) or out[i] += that (Add = true).
template <cast_format F, bool Add>
struct cast_decode {
  const std::uint16_t* in;  //!< n codes
  const std::int8_t* exps;  //!< one exponent per block
  float* out;               //!< n floats (output, or accumulated into when `Add`)
  std::size_t n;            //!< element count

  //! Processes block `b` (elements [256 b, min(256 (b + 1), n))).
  EBBFLOW_HD void operator()(std::size_t b) const noexcept {
    const std::size_t o = b * block_size;
    const std::uint16_t* EBBFLOW_DETAIL_RESTRICT pi = in + o;
    float* EBBFLOW_DETAIL_RESTRICT po = out + o;
    const float inv = pow2(-exps[b]);
    for_block(b, n, [&](auto cnt) {
      for (std::uint32_t j = 0; j < cnt; ++j) detail::store<Add>(po[j], detail::fmul(from_bits<F>(pi[j]), inv));
    });
  }
};

//! The ring's hop on block b: encodes t = decode(in) + v, v = own + res
//! (`res` may be null), without unscaling the running sum decode(in): both
//! terms are brought to the smaller of their two block exponents (each then
//! below H, their sum below 2H, a finite float), then t to its own block
//! exponent (`out_exps`), and res = t - decoded, unscaled. `own` is read
//! only. Pointers in the executor's space.
template <cast_format F>
struct cast_add_encode {
  const std::uint16_t* in;     //!< n codes of the running sum
  const std::int8_t* in_exps;  //!< its exponents, one per block
  const float* own;            //!< n floats of this rank
  float* res;                  //!< n residual floats, or null
  std::uint16_t* out;          //!< n codes (output)
  std::int8_t* out_exps;       //!< one exponent per block (output)
  std::size_t n;               //!< element count

  //! Processes block `b` (elements [256 b, min(256 (b + 1), n))).
  EBBFLOW_HD void operator()(std::size_t b) const noexcept {
    with_residual(res, [&](auto ef) {
      constexpr bool EF = decltype(ef)::value;
      const std::size_t o = b * block_size;
      const std::uint16_t* EBBFLOW_DETAIL_RESTRICT pi = in + o;
      const float* EBBFLOW_DETAIL_RESTRICT px = own + o;
      float* EBBFLOW_DETAIL_RESTRICT pr = EF ? res + o : nullptr;
      std::uint16_t* EBBFLOW_DETAIL_RESTRICT po = out + o;
      for_block(b, n, [&](auto cnt) {
        const auto v = [&](std::uint32_t j) { return EF ? detail::fadd(px[j], pr[j]) : px[j]; };
        const int e_in = in_exps[b], e_v = block_exponent<F>(finite_amax(cnt, v));
        const int e_w = e_in < e_v ? e_in : e_v;
        const float sv = pow2(e_w);
        float t[block_size];
        // 2^d in one multiply where it is a normal float (nearly always);
        // the choice is per block, so each loop stays branch-free.
        const auto sum = [&](auto scale) {
          for (std::uint32_t j = 0; j < cnt; ++j)
            t[j] = detail::fadd(scale(from_bits<F>(pi[j])), detail::fmul(v(j), sv));
        };
        const int d = e_w - e_in;
        if (d >= -126)
          sum([f = pow2(d)](float x) { return detail::fmul(x, f); });
        else
          sum([d](float x) { return scale_pow2(x, d); });
        int e_adj = block_exponent<F>(finite_amax(cnt, [&](std::uint32_t j) { return t[j]; }));
        e_adj = e_adj < -126 - e_w ? -126 - e_w : e_adj > 126 - e_w ? 126 - e_w : e_adj;
        const int e_out = e_w + e_adj;
        out_exps[b] = static_cast<std::int8_t>(e_out);
        const float inv = pow2(-e_out);
        const auto encode = [&](auto scale) {
          for (std::uint32_t j = 0; j < cnt; ++j) {
            const float w = scale(t[j]);
            const std::uint16_t q = to_bits<F>(w);
            po[j] = q;
            if constexpr (EF) pr[j] = detail::finite_or_zero(detail::fmul(detail::fsub(w, from_bits<F>(q)), inv));
          }
        };
        if (e_adj >= -126 && e_adj <= 126)
          encode([f = pow2(e_adj)](float x) { return detail::fmul(x, f); });
        else
          encode([e_adj](float x) { return scale_pow2(x, e_adj); });
      });
    });
  }
};

}  // namespace compress::kernels
EBBFLOW_END_NAMESPACE
