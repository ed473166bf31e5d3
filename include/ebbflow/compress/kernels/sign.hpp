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

inline constexpr std::size_t sign_words_per_block = block_size / 32;

struct sign_encode {
  const float* in;
  float* res;  //!< may be null (no error feedback; not recommended)
  float* scales;
  std::uint32_t* words;
  std::size_t n;

  EBBFLOW_HD void operator()(std::size_t b) const noexcept {
    const std::size_t o = b * block_size;
    const float* EBBFLOW_DETAIL_RESTRICT pi = in + o;
    float* EBBFLOW_DETAIL_RESTRICT pr = res == nullptr ? nullptr : res + o;
    std::uint32_t* EBBFLOW_DETAIL_RESTRICT pw = words + b * sign_words_per_block;
    for_block(b, n, [&](auto cnt) {
      // Eight interleaved partial sums, combined in a fixed order: the same
      // bits on every executor, and a dependency chain 8x shorter.
      float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (std::uint32_t j = 0; j < cnt; ++j) {
        const float v = pr ? detail::fadd(pi[j], pr[j]) : pi[j];
        part[j & 7u] = detail::fadd(part[j & 7u], detail::as_f32(detail::as_u32(v) & 0x7FFFFFFFu));
      }
      const float sum = detail::fadd(detail::fadd(detail::fadd(part[0], part[1]), detail::fadd(part[2], part[3])),
                                     detail::fadd(detail::fadd(part[4], part[5]), detail::fadd(part[6], part[7])));
      const float scale = sum / static_cast<float>(static_cast<std::uint32_t>(cnt));
      scales[b] = scale;
      for (std::uint32_t w = 0; w < sign_words_per_block; ++w) pw[w] = 0;
      for (std::uint32_t j = 0; j < cnt; ++j) {
        const float v = pr ? detail::fadd(pi[j], pr[j]) : pi[j];
        const std::uint32_t pos = (detail::as_u32(v) >> 31) ^ 1u;  // 1 for +0 and positives
        pw[j / 32] |= pos << (j & 31u);
        if (pr) pr[j] = detail::fsub(v, pos ? scale : -scale);
      }
    });
  }
};

template <bool Add>
struct sign_decode {
  const float* scales;
  const std::uint32_t* words;
  float* out;
  std::size_t n;

  EBBFLOW_HD void operator()(std::size_t b) const noexcept {
    const std::size_t o = b * block_size;
    const std::uint32_t* EBBFLOW_DETAIL_RESTRICT pw = words + b * sign_words_per_block;
    float* EBBFLOW_DETAIL_RESTRICT po = out + o;
    const float s = scales[b];
    for_block(b, n, [&](auto cnt) {
      for (std::uint32_t j = 0; j < cnt; ++j) {
        const float d = (pw[j / 32] >> (j & 31u)) & 1u ? s : -s;
        if constexpr (Add) po[j] = detail::fadd(po[j], d);
        else po[j] = d;
      }
    });
  }
};

}  // namespace compress::kernels
EBBFLOW_END_NAMESPACE
