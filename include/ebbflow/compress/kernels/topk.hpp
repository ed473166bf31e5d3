// SPDX-License-Identifier: Apache-2.0
//! @file topk.hpp
//! Top-k sparsification kernels, DGC-style: the threshold is estimated from a
//! random sample of |v| (no full sort), elements with |v| >= threshold are
//! packed as (index, value) pairs in index order, at most k of them; what is
//! not sent stays in the error-feedback residual. Deterministic and
//! identical on host and device: the compaction uses per-block counts and an
//! exclusive scan instead of atomics.
//!
//! Encoded layout for k slots: u32 count, u32 reserved, k u32 indices, k f32
//! values (slots past `count` are zero).
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/compress/detail/fp.hpp>
#include <ebbflow/compress/detail/philox.hpp>
#include <ebbflow/compress/kernels/block.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>

EBBFLOW_BEGIN_NAMESPACE
namespace compress::kernels {

//! |v| by clearing the sign bit.
EBBFLOW_HD inline float abs_bits(float v) noexcept { return detail::as_f32(detail::as_u32(v) & 0x7FFFFFFFu); }
//! Whether an element of magnitude `a` is sent at threshold `t`: at or above
//! it and not zero, or NaN (a non-finite input gives a non-finite output,
//! never a silent 0). Branch-free, so the selecting loops vectorise; the
//! counting and the packing passes use this one test.
EBBFLOW_HD inline bool selected(float a, float t) noexcept { return ((a >= t) & (a > 0.0f)) | (a != a); }

//! High 64 bits of the 128-bit product a * b: maps a uniform 64-bit word
//! onto [0, b) without a division (Lemire), the same on host and device.
EBBFLOW_HD inline std::uint64_t mulhi64(std::uint64_t a, std::uint64_t b) noexcept {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#elif defined(__SIZEOF_INT128__)
  __extension__ using u128 = unsigned __int128;
  return static_cast<std::uint64_t>((static_cast<u128>(a) * b) >> 64);
#else
  const std::uint64_t m = 0xFFFFFFFFu, al = a & m, ah = a >> 32, bl = b & m, bh = b >> 32;
  const std::uint64_t p0 = al * bl, p1 = al * bh, p2 = ah * bl;
  const std::uint64_t mid = (p0 >> 32) + (p1 & m) + (p2 & m);
  return ah * bh + (p1 >> 32) + (p2 >> 32) + (mid >> 32);
#endif
}

//! Samples drawn per call of `topk_sample`: two per Philox block, 32 blocks.
inline constexpr std::size_t topk_sample_chunk = 64;

//! sample[j] = |in[i] + res[i]| for Philox-chosen i (with replacement),
//! `topk_sample_chunk` samples per call. Sample 64 c + 2 g + h takes words
//! (x, y) (h = 0) or (z, w) (h = 1) of Philox group 32 c + g as a 64-bit
//! fraction of n: i = (x 2^32 + y) n / 2^64 (bias below n / 2^64).
struct topk_sample {
  const float* in;            //!< n input floats (executor's memory space)
  const float* res;           //!< n residual floats, or null
  float* sample;              //!< s sampled magnitudes (output)
  std::size_t n;              //!< element count (> 0)
  std::size_t s;              //!< sample count
  detail::philox_stream rng;  //!< chooses the sampled indices

  //! Draws samples [64 c, min(64 (c + 1), s)).
  EBBFLOW_HD void operator()(std::size_t c) const noexcept {
    std::uint32_t w[128];
    detail::philox_lanes<32>(rng, 32 * c, w);
    const std::size_t base = topk_sample_chunk * c;
    const std::size_t cnt = s - base < topk_sample_chunk ? s - base : topk_sample_chunk;
    for (std::size_t j = 0; j < cnt; ++j) {
      const std::size_t g = j >> 1, h = j & 1u;
      const std::uint64_t wide = (static_cast<std::uint64_t>(w[64 * h + g]) << 32) | w[64 * h + 32 + g];
      const auto i = static_cast<std::size_t>(mulhi64(wide, n));
      const float a = abs_bits(res ? detail::fadd(in[i], res[i]) : in[i]);
      sample[base + j] = a != a ? 0.0f : a;  // NaNs are always sent: they must not set the threshold
    }
  }
};

//! Single-thread functor: *threshold = the m-th largest of sample[0, s)
//! (quickselect, in place, deterministic pivots). Run with bulk(1, ...).
struct topk_threshold {
  float* sample;     //!< s magnitudes; reordered in place
  std::size_t s;     //!< sample count (> 0)
  std::size_t m;     //!< 1 <= m <= s
  float* threshold;  //!< one float (output)

  //! Runs the selection (the index is ignored).
  EBBFLOW_HD void operator()(std::size_t) const noexcept {
    // m-th largest == element at position s - m in ascending order.
    std::size_t want = s - m, lo = 0, hi = s - 1;
    while (lo < hi) {
      const float pivot = sample[lo + (hi - lo) / 2];
      std::size_t i = lo, j = hi;
      while (i <= j) {
        while (sample[i] < pivot) ++i;
        while (sample[j] > pivot) --j;
        if (i <= j) {
          const float t = sample[i];
          sample[i] = sample[j];
          sample[j] = t;
          ++i;
          if (j == 0) break;
          --j;
        }
      }
      if (want <= j)
        hi = j;
      else if (want >= i)
        lo = i;
      else
        break;
    }
    *threshold = sample[want];
  }
};

//! counts[b] = number of elements of block b with |v| >= threshold (> 0).
struct topk_count {
  const float* in;         //!< n input floats (executor's memory space)
  const float* res;        //!< n residual floats, or null
  const float* threshold;  //!< one float, from `topk_threshold`
  std::uint32_t* counts;   //!< one count per block (output)
  std::size_t n;           //!< element count

  //! Processes block `b` (elements [256 b, min(256 (b + 1), n))).
  EBBFLOW_HD void operator()(std::size_t b) const noexcept {
    const std::size_t o = b * block_size;
    const float t = *threshold;
    const float* EBBFLOW_DETAIL_RESTRICT pi = in + o;
    const float* EBBFLOW_DETAIL_RESTRICT pr = res ? res + o : nullptr;
    std::uint32_t c = 0;
    for_block(b, n, [&](auto cnt) {
      if (pr) {
        for (std::uint32_t j = 0; j < cnt; ++j) {
          const float a = abs_bits(detail::fadd(pi[j], pr[j]));
          c += selected(a, t) ? 1u : 0u;  // zeros carry nothing: never sent
        }
      } else {
        for (std::uint32_t j = 0; j < cnt; ++j) {
          const float a = abs_bits(pi[j]);
          c += selected(a, t) ? 1u : 0u;
        }
      }
    });
    counts[b] = c;
  }
};

//! Per-block counts form groups of `topk_scan_group` for the exclusive scan,
//! which runs in three passes so that its serial part is one step per group
//! instead of one per block: `topk_scan_local` (a thread per group),
//! `topk_scan_groups` (one thread over the group sums), `topk_scan_add` (a
//! thread per block).
inline constexpr std::size_t topk_scan_group = 256;

//! Groups of `topk_scan_group` blocks for `blocks` blocks.
EBBFLOW_HD constexpr std::size_t topk_scan_groups_of(std::size_t blocks) noexcept {
  return (blocks + topk_scan_group - 1) / topk_scan_group;
}

//! counts of group g -> offsets within the group (in place); sums[g] = the
//! group's total (at most 256 blocks of 256 elements: fits 32 bits).
struct topk_scan_local {
  std::uint32_t* counts;  //!< per-block counts in, offsets within the group out
  std::size_t blocks;     //!< block count
  std::uint32_t* sums;    //!< one total per group (output)

  //! Scans group `g` (blocks [256 g, min(256 (g + 1), blocks))).
  EBBFLOW_HD void operator()(std::size_t g) const noexcept {
    const std::size_t b0 = g * topk_scan_group;
    const std::size_t b1 = blocks - b0 < topk_scan_group ? blocks : b0 + topk_scan_group;
    std::uint32_t acc = 0;
    for (std::size_t b = b0; b < b1; ++b) {
      const std::uint32_t c = counts[b];
      counts[b] = acc;
      acc += c;
    }
    sums[g] = acc;
  }
};

//! Single-thread functor: group sums -> exclusive group offsets (in place,
//! saturating at 2^32 - 1); writes min(total, k) and 0 to the header. Run
//! with bulk(1, ...).
struct topk_scan_groups {
  std::uint32_t* sums;    //!< per-group totals in, exclusive group offsets out
  std::size_t groups;     //!< group count
  std::uint32_t* header;  //!< encoded buffer start
  std::size_t k;          //!< slot count

  //! Runs the scan (the index is ignored).
  EBBFLOW_HD void operator()(std::size_t) const noexcept {
    std::uint64_t acc = 0;
    for (std::size_t g = 0; g < groups; ++g) {
      const std::uint32_t c = sums[g];
      sums[g] = static_cast<std::uint32_t>(acc < 0xFFFFFFFFu ? acc : 0xFFFFFFFFu);
      acc += c;
    }
    header[0] = static_cast<std::uint32_t>(acc < k ? acc : k);
    header[1] = 0;
  }
};

//! offsets[b] += the offset of b's group (saturating): the exclusive scan of
//! the per-block counts over all blocks.
struct topk_scan_add {
  std::uint32_t* offsets;     //!< offsets within the group in, global offsets out
  const std::uint32_t* sums;  //!< exclusive group offsets, from `topk_scan_groups`

  //! Finishes block `b`'s offset.
  EBBFLOW_HD void operator()(std::size_t b) const noexcept {
    const std::uint32_t base = sums[b / topk_scan_group];
    offsets[b] = offsets[b] > 0xFFFFFFFFu - base ? 0xFFFFFFFFu : offsets[b] + base;
  }
};

//! Zeroes slot i when no element fills it (i >= the sent count in the
//! header, from `topk_scan_groups`), so an encoding's bytes depend on its
//! content alone.
struct topk_clear_slots {
  std::uint32_t* header;  //!< encoded buffer (count, 0, k indices, k values)
  std::size_t k;          //!< slot count

  //! Clears slot `i` if unused.
  EBBFLOW_HD void operator()(std::size_t i) const noexcept {
    if (i < header[0]) return;
    header[2 + i] = 0;
    header[2 + k + i] = 0;
  }
};

//! Packs block b's selected elements at its offset; updates the residual
//! (sent elements -> 0, others keep v); selected elements past slot k are
//! not sent and stay in the residual.
struct topk_write {
  const float* in;               //!< n input floats (executor's memory space)
  float* res;                    //!< n residual floats, or null
  const float* threshold;        //!< one float, from `topk_threshold`
  const std::uint32_t* offsets;  //!< first slot per block, from `topk_scan_add`
  std::uint32_t* indices;        //!< k slot indices (output)
  float* values;                 //!< k slot values (output)
  std::size_t n, k;
  //! @var n
  //! Element count.
  //! @var k
  //! Slot count.

  //! Processes block `b` (elements [256 b, min(256 (b + 1), n))).
  EBBFLOW_HD void operator()(std::size_t b) const noexcept {
    const std::size_t o = b * block_size;
    const float t = *threshold;
    const float* EBBFLOW_DETAIL_RESTRICT pi = in + o;
    float* EBBFLOW_DETAIL_RESTRICT pr = res ? res + o : nullptr;
    std::size_t slot = offsets[b];
    for_block(b, n, [&](auto cnt) {
      for (std::uint32_t j = 0; j < cnt; ++j) {
        const float v = pr ? detail::fadd(pi[j], pr[j]) : pi[j];
        const float a = abs_bits(v);
        const bool take = selected(a, t) && slot < k;
        if (take) {
          indices[slot] = static_cast<std::uint32_t>(o + j);
          values[slot] = v;
          ++slot;
        }
        if (pr) pr[j] = take ? 0.0f : detail::finite_or_zero(v);
      }
    });
  }
};

//! `topk_count`, the scan and `topk_write` in one pass, for executors
//! that call the blocks in increasing order on one thread (the single-thread
//! `exec::cpu_executor`): slots are handed out in index order as the pass
//! meets the selected elements, which is the order the exclusive scan gives,
//! so the encoding and the residual are the same bits. One read of the input
//! and the residual and one write of the residual, instead of two reads; the
//! caller writes the header and zeroes the unused slots afterwards. Host only.
struct topk_select_inorder {
  const float* in;         //!< n input floats (host memory)
  float* res;              //!< n residual floats, or null
  float threshold;         //!< from `topk_threshold`
  std::uint32_t* indices;  //!< k slot indices (output)
  float* values;           //!< k slot values (output)
  std::size_t n, k;
  std::size_t* slot;  //!< next free slot (in: 0 before block 0; out: the count sent)
  //! @var n
  //! Element count.
  //! @var k
  //! Slot count.

  //! Processes block `b`; blocks must come in increasing order, one at a time.
  void operator()(std::size_t b) const noexcept {
    with_residual(res, [&](auto ef) { run<decltype(ef)::value>(b); });
  }

 private:
  template <bool EF>
  void run(std::size_t b) const noexcept {
    const std::size_t o = b * block_size;
    const float t = threshold;
    const float* EBBFLOW_DETAIL_RESTRICT pi = in + o;
    float* EBBFLOW_DETAIL_RESTRICT pr = EF ? res + o : nullptr;
    std::size_t sl = *slot;
    // 32 elements at a time: a vectorised pass writes the new residual as if
    // every selected element were sent (0, else v), keeps v in registers and
    // builds a bit mask of the selected ones; the rare selected elements
    // (~1 in 100) are then packed through the mask, and any that find no free
    // slot get their v back.
    const auto part = [&](std::uint32_t c0, auto len) {
      float vb[32];
      std::uint32_t mask = 0;
      for (std::uint32_t j = 0; j < len; ++j) {
        const float v = EF ? detail::fadd(pi[c0 + j], pr[c0 + j]) : pi[c0 + j];
        const float a = abs_bits(v);
        const bool sel = selected(a, t);
        vb[j] = v;
        if constexpr (EF) pr[c0 + j] = sel ? 0.0f : v;
        mask |= static_cast<std::uint32_t>(sel) << j;
      }
      for (; mask != 0; mask &= mask - 1) {
        const auto j = static_cast<std::uint32_t>(std::countr_zero(mask));
        if (sl < k) {
          indices[sl] = static_cast<std::uint32_t>(o + c0 + j);
          values[sl] = vb[j];
          ++sl;
        } else if constexpr (EF) {
          pr[c0 + j] = detail::finite_or_zero(vb[j]);  // no slot left: stays in the residual
        }
      }
    };
    for_block(b, n, [&](auto cnt) {
      if constexpr (std::is_same_v<decltype(cnt), std::uint32_t>) {  // short tail block
        for (std::uint32_t c0 = 0; c0 < cnt; c0 += 32) part(c0, cnt - c0 < 32u ? cnt - c0 : 32u);
      } else {
        for (std::uint32_t c0 = 0; c0 < cnt; c0 += 32) part(c0, std::integral_constant<std::uint32_t, 32>{});
      }
    });
    *slot = sl;
  }
};

//! out[idx[i]] (+)= val[i] for the slots i < count of an encoding with k
//! slots. Indices within one encoding are distinct, so calls never collide.
template <bool Add>
struct topk_scatter {
  const std::uint32_t* header;  //!< encoded buffer (count, 0, k indices, k values)
  std::size_t k;                //!< slot count of the encoding
  float* out;                   //!< decoded floats (updated)

  //! Applies slot `i` (nothing when i >= the sent count).
  EBBFLOW_HD void operator()(std::size_t i) const noexcept {
    if (i >= header[0]) return;
    const std::uint32_t idx = header[2 + i];
    const float v = detail::as_f32(header[2 + k + i]);
    detail::store<Add>(out[idx], v);
  }
};

//! out[i] = 0.
struct fill_zero {
  float* out;  //!< floats to zero (executor's memory space)
  //! Zeroes element `i`.
  EBBFLOW_HD void operator()(std::size_t i) const noexcept { out[i] = 0.0f; }
};

}  // namespace compress::kernels
EBBFLOW_END_NAMESPACE
