// SPDX-License-Identifier: Apache-2.0
//! @file sign.hpp
//! 1-bit sign code with one scale per block: scale = mean |v| over the block
//! (the l1-scaled sign of EF-signSGD), bit j set when v_j >= 0; decode gives
//! +scale or -scale. Biased on its own, so always used with error feedback.
//! Encoded layout of n elements: nb float scales, then 8 32-bit words per
//! block (256 bits; the tail block's unused bits are zero).
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/compress/detail/fp.hpp>
#include <ebbflow/compress/kernels/block.hpp>

#include <cstddef>
#include <cstdint>

EBBFLOW_BEGIN_NAMESPACE
namespace compress::kernels {

//! 32-bit words of sign bits per block.
inline constexpr std::size_t sign_words_per_block = block_size / 32;

//! Encodes block b of v = in + res: scales[b] = mean |v| over the block, one
//! bit per element (set for v >= +0); with `res`, res = v - (+-scale).
//! Pointers in the executor's space.
struct sign_encode {
  const float* in;       //!< n input floats
  float* res;            //!< may be null (no error feedback; not recommended)
  float* scales;         //!< one scale per block (output)
  std::uint32_t* words;  //!< `sign_words_per_block` words per block (output)
  std::size_t n;         //!< element count

  //! Processes block `b` (elements [256 b, min(256 (b + 1), n))).
  EBBFLOW_HD void operator()(std::size_t b) const noexcept {
    const std::size_t o = b * block_size;
    const float* EBBFLOW_DETAIL_RESTRICT pi = in + o;
    float* EBBFLOW_DETAIL_RESTRICT pr = res == nullptr ? nullptr : res + o;
    std::uint32_t* EBBFLOW_DETAIL_RESTRICT pw = words + b * sign_words_per_block;
    for_block(b, n, [&](auto cnt) {
      // Eight interleaved partial sums, combined in a fixed order: the same
      // bits on every executor, and a dependency chain 8x shorter.
      float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      std::uint32_t j = 0;
      for (; j + 8 <= cnt; j += 8)
        for (std::uint32_t l = 0; l < 8; ++l) {
          const float v = pr ? detail::fadd(pi[j + l], pr[j + l]) : pi[j + l];
          part[l] = detail::fadd(part[l], detail::as_f32(detail::as_u32(v) & 0x7FFFFFFFu));
        }
      for (; j < cnt; ++j) {
        const float v = pr ? detail::fadd(pi[j], pr[j]) : pi[j];
        part[j & 7u] = detail::fadd(part[j & 7u], detail::as_f32(detail::as_u32(v) & 0x7FFFFFFFu));
      }
      const float sum = detail::fadd(detail::fadd(detail::fadd(part[0], part[1]), detail::fadd(part[2], part[3])),
                                     detail::fadd(detail::fadd(part[4], part[5]), detail::fadd(part[6], part[7])));
      float scale = sum / static_cast<float>(static_cast<std::uint32_t>(cnt));
      if (!detail::is_finite(sum)) {
        // The l1 sum overflowed (or an input is not finite): sum |v| / 256
        // instead (at most 256 elements of at most FLT_MAX each), then scale
        // the mean back. Finite inputs keep a finite mean; others stay non-finite.
        float s2 = 0.0f;
        for (std::uint32_t k = 0; k < cnt; ++k) {
          const float v = pr ? detail::fadd(pi[k], pr[k]) : pi[k];
          s2 = detail::fadd(s2, detail::fmul(detail::as_f32(detail::as_u32(v) & 0x7FFFFFFFu), 1.0f / 256.0f));
        }
        scale = detail::fmul(s2 / static_cast<float>(static_cast<std::uint32_t>(cnt)), 256.0f);
      }
      scales[b] = scale;
      const std::uint32_t scale_bits = detail::as_u32(scale);
      // Bit j of word j/32 set for v >= +0 (sign bit clear).
      for (std::uint32_t w = 0; w < sign_words_per_block; ++w) {
        std::uint32_t word = 0;
        const std::uint32_t lo = 32 * w, hi = cnt < lo + 32 ? cnt : lo + 32;
        for (std::uint32_t jj = lo; jj < hi; ++jj) {
          const float v = pr ? detail::fadd(pi[jj], pr[jj]) : pi[jj];
          word |= ((detail::as_u32(v) >> 31) ^ 1u) << (jj - lo);
        }
        pw[w] = word;
      }
      if (pr) {
        // decoded value = +-scale with v's sign bit
        for (std::uint32_t jj = 0; jj < cnt; ++jj) {
          const float v = detail::fadd(pi[jj], pr[jj]);
          pr[jj] =
              detail::finite_or_zero(detail::fsub(v, detail::as_f32(scale_bits | (detail::as_u32(v) & 0x80000000u))));
        }
      }
    });
  }
};

//! Decodes block b to +-scales[b] by sign bit into out (Add = false) or adds
//! it to out (Add = true). Pointers in the executor's space.
template <bool Add>
struct sign_decode {
  const float* scales;         //!< one scale per block
  const std::uint32_t* words;  //!< `sign_words_per_block` words per block
  float* out;                  //!< n floats (output, or accumulated into when `Add`)
  std::size_t n;               //!< element count

  //! Processes block `b` (elements [256 b, min(256 (b + 1), n))).
  EBBFLOW_HD void operator()(std::size_t b) const noexcept {
    const std::size_t o = b * block_size;
    const std::uint32_t* EBBFLOW_DETAIL_RESTRICT pw = words + b * sign_words_per_block;
    float* EBBFLOW_DETAIL_RESTRICT po = out + o;
    const float s = scales[b];
    for_block(b, n, [&](auto cnt) {
      const std::uint32_t sb = detail::as_u32(s);
      for (std::uint32_t j = 0; j < cnt; ++j) {
        const std::uint32_t neg = ((pw[j / 32] >> (j & 31u)) & 1u) ^ 1u;
        const float d = detail::as_f32(sb | (neg << 31));
        detail::store<Add>(po[j], d);
      }
    });
  }
};

}  // namespace compress::kernels
EBBFLOW_END_NAMESPACE
