// SPDX-License-Identifier: Apache-2.0
//! @file quantize.hpp
//! Stochastic int8 / int4 quantisation with one float scale per block
//! (QSGD-style, max-abs scaling). Level count L = 127 (int8) or 7 (int4):
//! q = floor(v * L / amax + u), u uniform in (0, 1) from Philox, so
//! E[q * amax / L] = v (unbiased up to the 16-bit resolution of u: the bias is
//! at most 2^-17 of one quantisation step). Bit-identical on host and device.
//!
//! Encoded layout of n elements, nb = blocks_of(n): nb float scales, then the
//! codes: int8 -> n bytes, int4 -> 128 bytes per block (two 4-bit codes per
//! byte, low nibble first, stored as q + 8).
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/compress/detail/fp.hpp>
#include <ebbflow/compress/detail/philox.hpp>
#include <ebbflow/compress/kernels/block.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

EBBFLOW_BEGIN_NAMESPACE
namespace compress::kernels {

//! Largest code magnitude L for `Bits`-bit codes: codes lie in [-L, L].
template <int Bits>
inline constexpr std::int32_t levels = Bits == 8 ? 127 : 7;

//! Bytes of the code part of a block of `len` elements.
template <int Bits>
EBBFLOW_HD constexpr std::size_t code_bytes(std::size_t len) noexcept {
  return Bits == 8 ? len : (len + 1) / 2;
}

//! Encodes block b: scales[b] and its codes. `res` may be null.
template <int Bits>
struct quantize_encode {
  const float* in;            //!< n input floats (executor's memory space)
  float* res;                 //!< n residual floats, or null
  float* scales;              //!< one scale per block (output): max |v| / L
  std::uint8_t* codes;        //!< byte offset b * code_bytes<Bits>(block_size) for block b
  std::size_t n;              //!< element count
  detail::philox_stream rng;  //!< random bits for stochastic rounding

  //! Processes block `b` (elements [256 b, min(256 (b + 1), n))).
  EBBFLOW_HD void operator()(std::size_t b) const noexcept {
    with_residual(res, [&](auto ef) { run<decltype(ef)::value>(b); });
  }

 private:
  template <bool EF>
  EBBFLOW_HD void run(std::size_t b) const noexcept {
    constexpr std::int32_t L = levels<Bits>;
    const std::size_t o = b * block_size;
    const float* EBBFLOW_DETAIL_RESTRICT pi = in + o;
    float* EBBFLOW_DETAIL_RESTRICT pr = EF ? res + o : nullptr;
    std::uint8_t* EBBFLOW_DETAIL_RESTRICT pc = codes + b * code_bytes<Bits>(block_size);
    for_block(b, n, [&](auto cnt) {
      // 1. max |v| on the integer image of |v| (monotone for non-negative
      //    floats), which vectorises where a float max reduction would not.
      std::int32_t amax_bits = 0;
      for (std::uint32_t j = 0; j < cnt; ++j) {
        const float v = EF ? detail::fadd(pi[j], pr[j]) : pi[j];
        const auto a = static_cast<std::int32_t>(detail::as_u32(v) & 0x7FFFFFFFu);
        amax_bits = a > amax_bits ? a : amax_bits;
      }
      const float amax = detail::as_f32(static_cast<std::uint32_t>(amax_bits));
      const float scale = amax / static_cast<float>(L);
      // A block below 2^-100 (L / amax would overflow to inf) or with an inf
      // or NaN takes a slower loop (below): scaled up first, clamped before
      // the conversion, infinities with their sign, no non-finite residual.
      // Every other block takes the plain one, which vectorises.
      const bool finite = amax_bits < 0x7F800000;
      const bool rare = !finite || amax < 0x1p-100f;
      const float pre = amax < 0x1p-100f ? 0x1p64f : 1.0f;
      const float inv = !finite ? 1.0f : amax > 0.0f ? static_cast<float>(L) / (rare ? amax * pre : amax) : 0.0f;
      scales[b] = scale;
      // 2. 16 random bits per element from 32 Philox blocks. Word w of block
      //    g lands at rw[32 w + g], so both loops below run over contiguous
      //    memory and vectorise; element j uses half (j >> 7) of rw[j & 127].
      std::uint32_t rw[128];
      detail::philox_lanes<32>(rng, o / 8, rw);
      // 3. stochastic rounding, residual update. int8 codes go straight to
      //    the output; int4 codes are staged in q and packed in pairs after.
      [[maybe_unused]] std::int8_t q[Bits == 4 ? block_size : 1];
      const auto round = [&](auto rare_tag) {
        constexpr bool Rare = decltype(rare_tag)::value;
        for (std::uint32_t h = 0; h < 2; ++h) {
          const std::uint32_t base = 128 * h;
          const std::uint32_t len = cnt > base ? (cnt - base < 128u ? cnt - base : 128u) : 0u;
          const std::uint32_t shift = 16 * h;
          for (std::uint32_t j2 = 0; j2 < len; ++j2) {
            const std::uint32_t j = base + j2;
            const float v = EF ? detail::fadd(pi[j], pr[j]) : pi[j];
            const float u = detail::fmul(static_cast<float>((rw[j2] >> shift) & 0xFFFFu) + 0.5f, 1.0f / 65536.0f);
            std::int32_t k;
            if constexpr (Rare) {
              float x = detail::fadd(detail::fmul(detail::fmul(v, pre), inv), u);
              x = x < static_cast<float>(L + 1) ? x : static_cast<float>(L + 1);  // also inf; then NaN:
              x = x > static_cast<float>(-L - 1) ? x : static_cast<float>(-L - 1);
              k = detail::floor_i32(x);  // in range: no undefined conversion
            } else {
              k = detail::floor_i32(detail::fadd(detail::fmul(v, inv), u));
            }
            k = k > L ? L : k;
            k = k < -L ? -L : k;
            if constexpr (Bits == 8)
              pc[j] = static_cast<std::uint8_t>(k);  // int8: straight to the output
            else
              q[j] = static_cast<std::int8_t>(k);
            if constexpr (EF) {
              const float r = detail::fsub(v, detail::fmul(static_cast<float>(k), scale));
              pr[j] = Rare ? detail::finite_or_zero(r) : r;
            }
          }
        }
      };
      if (rare)
        round(std::true_type{});
      else
        round(std::false_type{});
      if constexpr (Bits == 4) {
        if (cnt & 1u) q[cnt] = 0;  // cnt < block_size here
        for (std::uint32_t j = 0; j < (cnt + 1u) / 2u; ++j)
          pc[j] = static_cast<std::uint8_t>((q[2 * j] + 8) | ((q[2 * j + 1] + 8) << 4));
      }
    });
  }
};

//! Decodes block b into out (Add = false) or adds it to out (Add = true).
template <int Bits, bool Add>
struct quantize_decode {
  const float* scales;        //!< one scale per block
  const std::uint8_t* codes;  //!< codes, laid out as `quantize_encode` writes them
  float* out;                 //!< n floats (output, or accumulated into when `Add`)
  std::size_t n;              //!< element count

  //! Processes block `b` (elements [256 b, min(256 (b + 1), n))).
  EBBFLOW_HD void operator()(std::size_t b) const noexcept {
    const std::size_t o = b * block_size;
    const std::uint8_t* EBBFLOW_DETAIL_RESTRICT pc = codes + b * code_bytes<Bits>(block_size);
    float* EBBFLOW_DETAIL_RESTRICT po = out + o;
    const float s = scales[b];
    for_block(b, n, [&](auto cnt) {
      for (std::uint32_t j = 0; j < cnt; ++j) {
        std::int32_t k;
        if constexpr (Bits == 8)
          k = static_cast<std::int8_t>(pc[j]);
        else
          k = static_cast<std::int32_t>((pc[j / 2] >> ((j & 1u) * 4u)) & 0xFu) - 8;
        const float d = detail::fmul(static_cast<float>(k), s);
        detail::store<Add>(po[j], d);
      }
    });
  }
};

}  // namespace compress::kernels
EBBFLOW_END_NAMESPACE
