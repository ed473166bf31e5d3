// SPDX-License-Identifier: Apache-2.0
//! @file topk.hpp
//! Top-k sparsification codec with error feedback and a sampled threshold
//! (Deep Gradient Compression, Lin et al. 2018): k = ceil(ratio * n) slots of
//! (u32 index, f32 value), 8 + 8k bytes on the wire. The threshold is the
//! matching quantile of |v| over `sample_size` random elements, so no full
//! sort is needed; at most k elements at or above it are sent, in index order,
//! and everything not sent stays in the residual. With s samples the count
//! above the estimated threshold is within about 3 / sqrt(s k / n) relative of
//! k (binomial), which bounds how many of the true top k can be missed.
//! Not summable: `compressed_allreduce` allgathers the encoded blocks.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/compress/codec.hpp>
#include <ebbflow/compress/detail/run.hpp>
#include <ebbflow/compress/kernels/topk.hpp>
#include <ebbflow/core/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

EBBFLOW_BEGIN_NAMESPACE
namespace compress {

//! Value type; thread-safe.
struct topk_codec {
  static constexpr codec_kind kind = codec_kind::sparse;  //!< not summable: encoded blocks are allgathered

  //! @throws std::invalid_argument unless 0 < ratio <= 1 and sample_size >= 64.
  explicit topk_codec(double ratio = 0.01, std::size_t sample_size = 16384) : ratio_(ratio), sample_(sample_size) {
    EBBFLOW_ENFORCE(ratio > 0.0 && ratio <= 1.0, "top-k ratio " << ratio << " outside (0, 1]");
    EBBFLOW_ENFORCE(sample_size >= 64, "top-k sample size " << sample_size << " below 64");
  }

  //! "topk".
  [[nodiscard]] std::string_view name() const noexcept { return "topk"; }
  //! Fraction of elements sent, in (0, 1].
  [[nodiscard]] double ratio() const noexcept { return ratio_; }
  //! Slots for n elements: ceil(ratio * n), at least 1 when n > 0.
  [[nodiscard]] std::size_t slots(std::size_t n) const noexcept {
    if (n == 0) return 0;
    return std::clamp<std::size_t>(static_cast<std::size_t>(std::ceil(ratio_ * static_cast<double>(n))), 1, n);
  }
  //! Encoded size of `n` elements: an 8-byte header plus (index, value) per slot.
  [[nodiscard]] std::size_t max_encoded_bytes(std::size_t n) const noexcept { return align8(8 + 8 * slots(n)); }
  //! Elements sampled to estimate the threshold: min(sample_size, n).
  [[nodiscard]] std::size_t sample_count(std::size_t n) const noexcept { return std::min(sample_, n); }
  //! Scratch for the sample, per-block counts, per-group sums and the threshold.
  [[nodiscard]] std::size_t workspace_bytes(std::size_t n) const noexcept {
    const std::size_t nb = kernels::blocks_of(n);
    return align8(4 * sample_count(n)) + align8(4 * nb) + align8(4 * kernels::topk_scan_groups_of(nb)) + 8;
  }
  //! Segment granularity: `kernels::block_size` (256) elements.
  [[nodiscard]] std::size_t block_elems() const noexcept { return kernels::block_size; }

  //! Needs `ctx.workspace` (workspace_bytes(n), same space) when n > 0.
  template <class Ex>
  void encode(Ex& ex, const float* in, float* residual, std::byte* out, std::size_t n, encode_context ctx) const {
    if (n == 0) return;
    EBBFLOW_ENFORCE(ctx.workspace != nullptr, "top-k encode needs a workspace of " << workspace_bytes(n) << " bytes");
    const std::size_t k = slots(n), s = sample_count(n), nb = kernels::blocks_of(n);
    auto* sample = reinterpret_cast<float*>(ctx.workspace);
    auto* counts = reinterpret_cast<std::uint32_t*>(ctx.workspace + align8(4 * s));
    const std::size_t ng = kernels::topk_scan_groups_of(nb);
    auto* sums = reinterpret_cast<std::uint32_t*>(ctx.workspace + align8(4 * s) + align8(4 * nb));
    auto* thr = reinterpret_cast<float*>(ctx.workspace + align8(4 * s) + align8(4 * nb) + align8(4 * ng));
    auto* header = reinterpret_cast<std::uint32_t*>(out);
    // Rank of the threshold in the sample: the same quantile as k in n.
    const std::size_t m =
        std::clamp<std::size_t>(static_cast<std::size_t>(std::llround(static_cast<double>(s) * static_cast<double>(k) /
                                                                      static_cast<double>(n))),
                                1, s);
    detail::bulk(ex, (s + kernels::topk_sample_chunk - 1) / kernels::topk_sample_chunk,
                 kernels::topk_sample{in, residual, sample, n, s, {ctx.seed, ctx.stream}});
    ex.bulk(1, kernels::topk_threshold{sample, s, m, thr});
    auto* indices = header + 2;
    auto* values = reinterpret_cast<float*>(header + 2 + k);
    if constexpr (std::is_same_v<std::remove_cv_t<Ex>, exec::cpu_executor>) {
      if (ex.threads() <= 1) {  // in order on this thread: count, scan and pack in one pass
        std::size_t sent = 0;
        detail::host_loop(nb, kernels::topk_select_inorder{in, residual, *thr, indices, values, n, k, &sent});
        header[0] = static_cast<std::uint32_t>(sent);
        header[1] = 0;
        std::fill(indices + sent, indices + k, 0u);
        std::fill(values + sent, values + k, 0.0f);
        return;
      }
    }
    detail::bulk(ex, nb, kernels::topk_count{in, residual, thr, counts, n});
    // Exclusive scan of the counts: a thread per group of 256 blocks, one
    // over the group sums, a thread per block; then the unused slots are
    // zeroed in parallel and the selected elements packed.
    detail::bulk(ex, ng, kernels::topk_scan_local{counts, nb, sums});
    ex.bulk(1, kernels::topk_scan_groups{sums, ng, header, k});
    detail::bulk(ex, nb, kernels::topk_scan_add{counts, sums});
    detail::bulk(ex, k, kernels::topk_clear_slots{header, k});
    detail::bulk(ex, nb, kernels::topk_write{in, residual, thr, counts, indices, values, n, k});
  }
  //! Zeroes `out`, then scatters the sent values of `in` into it (both in
  //! `Ex`'s space; completes as `ex.bulk` does).
  template <class Ex>
  void decode(Ex& ex, const std::byte* in, float* out, std::size_t n) const {
    ex.bulk(n, kernels::fill_zero{out});
    decode_add(ex, in, out, n);
  }
  //! Writes the sum of the `count` encodings `in[0 .. count)` (each of `n`
  //! elements) to `out`, adding them in array order: the same bits as
  //! `decode(in[0])` followed by `decode_add` of the others. The pointer
  //! array is host memory; the encodings and `out` are in `Ex`'s space.
  //! On the single-thread CPU executor it walks `out` in L1-sized tiles,
  //! zeroing a tile and adding every encoding's entries that fall in it
  //! (indices are sorted), so `out` goes through memory once instead of once
  //! plus once per encoding's scattered read-modify-writes.
  template <class Ex>
  void decode_sum(Ex& ex, const std::byte* const* in, std::size_t count, float* out, std::size_t n) const {
    if (count == 0 || n == 0) return;
    if constexpr (std::is_same_v<std::remove_cv_t<Ex>, exec::cpu_executor>) {
      if (ex.threads() <= 1 && count <= max_sum_inputs) {
        constexpr std::size_t tile = 4096;  // 16 KiB of floats
        const std::size_t k = slots(n);
        std::size_t cur[max_sum_inputs] = {};
        for (std::size_t t0 = 0; t0 < n; t0 += tile) {
          const std::size_t t1 = std::min(n, t0 + tile);
          std::fill(out + t0, out + t1, 0.0f);
          for (std::size_t e = 0; e < count; ++e) {
            const auto* h = reinterpret_cast<const std::uint32_t*>(in[e]);
            const std::uint32_t* idx = h + 2;
            const std::uint32_t* val = h + 2 + k;
            std::size_t c = cur[e];
            for (const std::size_t sent = h[0]; c < sent && idx[c] < t1; ++c)
              out[idx[c]] = compress::detail::fadd(out[idx[c]], compress::detail::as_f32(val[c]));
            cur[e] = c;
          }
        }
        return;
      }
    }
    decode(ex, in[0], out, n);
    for (std::size_t e = 1; e < count; ++e) decode_add(ex, in[e], out, n);
  }
  //! Adds the sent values of `in` to their positions in `out` (both in
  //! `Ex`'s space; completes as `ex.bulk` does).
  template <class Ex>
  void decode_add(Ex& ex, const std::byte* in, float* out, std::size_t n) const {
    ex.bulk(slots(n), kernels::topk_scatter<true>{reinterpret_cast<const std::uint32_t*>(in), slots(n), out});
  }

 private:
  static constexpr std::size_t max_sum_inputs = 256;  // decode_sum's tiled path: encodings per call
  double ratio_;
  std::size_t sample_;
};
static_assert(codec<topk_codec>);

}  // namespace compress
EBBFLOW_END_NAMESPACE
