// SPDX-License-Identifier: Apache-2.0
//! @file powersgd.hpp
//! PowerSGD rank-r compression (Vogels et al., NeurIPS 2019) of a matrix
//! gradient M (rows x cols, row-major): one power-iteration step per call with
//! a warm-started Q. Not a flat codec: `compressed_allreduce` runs
//!   M = grad + residual; P = M normalize(Q); allreduce(P);
//!   orthogonalise(normalize(P)); Q = M^T P; residual = M - P Q^T;
//!   allreduce(Q); grad = P Q^T,
//! i.e. two dense allreduces of (rows + cols) r floats instead of rows cols.
//! This type holds the rank and the per-step kernels; the per-tensor state
//! (Q, residual) lives in the allreduce. A matrix of rank <= r is reproduced
//! exactly (up to float rounding) once Q spans its row space; on full-rank
//! matrices error feedback makes the accumulated updates converge to the
//! accumulated gradients.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/compress/codec.hpp>
#include <ebbflow/compress/detail/philox.hpp>
#include <ebbflow/compress/kernels/lowrank.hpp>
#include <ebbflow/core/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

EBBFLOW_BEGIN_NAMESPACE
namespace compress {

//! A matrix view of a flat gradient.
struct matrix_shape {
  std::size_t rows = 0, cols = 0;
  //! @var rows
  //! Number of rows.
  //! @var cols
  //! Number of columns (row-major: elements per row).

  //! Element count: rows * cols.
  [[nodiscard]] constexpr std::size_t size() const noexcept { return rows * cols; }
};

namespace kernels {
//! q[i] = uniform(-1, 1) from Philox; the same on every rank for one seed.
struct uniform_fill {
  float* q;                             //!< output (executor's memory space)
  compress::detail::philox_stream rng;  //!< (seed, stream) of the Philox generator
  //! Writes element `i`.
  EBBFLOW_HD void operator()(std::size_t i) const noexcept {
    const auto r = rng(i);
    q[i] = compress::detail::fsub(compress::detail::fmul(static_cast<float>(r.x >> 8), 1.0f / 8388608.0f), 1.0f);
  }
};

//! Column j of q (cols x rank, row-major) refilled as `uniform_fill` would
//! when it is all zero or holds a non-finite value: orthogonalisation drops
//! the columns of P that a lower-rank gradient leaves empty, and a zero (or
//! NaN, after a non-finite gradient) column of the warm-start Q would stay
//! so in every later step.
struct reseed_zero_columns {
  float* q;                             //!< cols x rank (executor's memory space)
  std::size_t cols;                     //!< rows of q
  std::size_t rank;                     //!< columns of q
  compress::detail::philox_stream rng;  //!< as init_q's
  //! Checks, and refills, column `j`.
  EBBFLOW_HD void operator()(std::size_t j) const noexcept {
    bool zero = true, finite = true;
    for (std::size_t k = 0; k < cols; ++k) {
      const float x = q[k * rank + j];
      zero = zero && x == 0.0f;
      finite = finite && compress::detail::is_finite(x);
    }
    if (!zero && finite) return;
    const uniform_fill fill{q, rng};
    for (std::size_t k = 0; k < cols; ++k) fill(k * rank + j);
  }
};

//! Column j of f (rows x rank, row-major) times the power of two that puts
//! its largest |entry| in [1, 2) (within [2^-126, 2^126]; exact): the
//! factors carry a direction, and their magnitude would otherwise follow
//! the gradient's, squared (P = M Q with the warm start Q = M^T P), out of
//! float's range (above about 1e18) or below the orthogonalisation's eps
//! (below about 1e-9), silently zeroing the result. Zero and non-finite
//! columns are left alone.
struct normalize_columns {
  float* f;          //!< rows x rank (executor's memory space)
  std::size_t rows;  //!< rows of f
  std::size_t rank;  //!< columns of f
  //! Scales column `j`.
  EBBFLOW_HD void operator()(std::size_t j) const noexcept {
    std::uint32_t amax = 0;
    for (std::size_t k = 0; k < rows; ++k) {
      const std::uint32_t a = compress::detail::as_u32(f[k * rank + j]) & 0x7FFFFFFFu;
      amax = a > amax ? a : amax;
    }
    if (amax == 0 || amax >= 0x7F800000u) return;
    std::uint32_t e = amax >> 23;  // biased exponent of the largest entry
    e = e < 1 ? 1 : e > 253 ? 253 : e;
    const float factor = compress::detail::as_f32((254u - e) << 23);  // 2^(127 - e)
    for (std::size_t k = 0; k < rows; ++k) f[k * rank + j] = compress::detail::fmul(f[k * rank + j], factor);
  }
};
}  // namespace kernels

//! Value type; thread-safe.
struct powersgd_codec {
  static constexpr codec_kind kind = codec_kind::low_rank;  //!< two dense allreduces of the factors

  //! @throws std::invalid_argument unless 1 <= rank <= kernels::max_rank.
  explicit powersgd_codec(std::size_t rank = 4) : rank_(rank) {
    EBBFLOW_ENFORCE(rank >= 1 && rank <= kernels::max_rank,
                    "PowerSGD rank " << rank << " outside [1, " << kernels::max_rank << "]");
  }
  //! "powersgd".
  [[nodiscard]] std::string_view name() const noexcept { return "powersgd"; }
  //! Requested rank r.
  [[nodiscard]] std::size_t rank() const noexcept { return rank_; }
  //! Rank actually used for a shape: min(rank, rows, cols).
  [[nodiscard]] std::size_t rank_for(matrix_shape s) const noexcept { return std::min({rank_, s.rows, s.cols}); }
  //! Default matrix view of n elements: cols = ceil(sqrt(n)), rows = n / cols;
  //! the n - rows * cols tail is reduced dense.
  [[nodiscard]] static matrix_shape shape_for(std::size_t n) noexcept {
    if (n == 0) return {};
    const auto cols = static_cast<std::size_t>(std::ceil(std::sqrt(static_cast<double>(n))));
    return {n / cols, cols};
  }
  //! Floats sent per allreduce round for a shape (P then Q).
  [[nodiscard]] std::size_t factor_floats(matrix_shape s) const noexcept { return (s.rows + s.cols) * rank_for(s); }

  //! q (cols x r) = uniform(-1, 1) for the first step of a tensor.
  template <class Ex>
  void init_q(Ex& ex, float* q, matrix_shape s, std::uint64_t seed) const {
    ex.bulk(s.cols * rank_for(s), kernels::uniform_fill{q, {seed, 0x9051D}});
  }
  //! Refills the all-zero (or non-finite) columns of the warm-start q as
  //! init_q would, so that the rank lost in one step (a gradient of lower
  //! rank, zero, or not finite) comes back in the next. The same on every
  //! rank (q is summed).
  template <class Ex>
  void refresh_q(Ex& ex, float* q, matrix_shape s, std::uint64_t seed) const {
    ex.bulk(rank_for(s), kernels::reseed_zero_columns{q, s.cols, rank_for(s), {seed, 0x9051D}});
  }
  //! Scales each column of the factor f (`rows` x r, row-major) by a power
  //! of two to a largest |entry| in [1, 2) (`kernels::normalize_columns`):
  //! the warm-start Q before P = M Q, and P before its orthogonalisation.
  //! Exact; the same on every rank for the same f.
  template <class Ex>
  void normalize(Ex& ex, float* f, std::size_t rows, matrix_shape s) const {
    ex.bulk(rank_for(s), kernels::normalize_columns{f, rows, rank_for(s)});
  }
  //! p (rows x r) = m q, with m (rows x cols) and q (cols x r) row-major.
  //! Pointers in `Ex`'s space; completes as `ex.bulk` does.
  template <class Ex>
  void compute_p(Ex& ex, const float* m, const float* q, float* p, matrix_shape s) const {
    ex.bulk(s.rows, kernels::lowrank_mul_p{{m, q, p, s.rows, s.cols, rank_for(s)}});
  }
  //! Gram-Schmidt on the columns of p (rows x r) in place; blocking on the
  //! CPU executor, enqueued on the stream of the CUDA executor.
  template <class Ex>
  void orthogonalize(Ex& ex, float* p, matrix_shape s) const {
    kernels::orthogonalizer<Ex>::run(ex, p, s.rows, rank_for(s));
  }
  //! q (cols x r) = m^T p. Pointers in `Ex`'s space; completes as `ex.bulk` does.
  template <class Ex>
  void compute_q(Ex& ex, const float* m, const float* p, float* q, matrix_shape s) const {
    ex.bulk(s.cols, kernels::lowrank_mul_q{{m, p, q, s.rows, s.cols, rank_for(s)}});
  }
  //! res = m - P Q^T (may alias m).
  template <class Ex>
  void residual(Ex& ex, const float* m, const float* p, const float* q, float* res, matrix_shape s) const {
    ex.bulk(s.rows, kernels::lowrank_residual{m, p, q, res, s.rows, s.cols, rank_for(s)});
  }
  //! out = P Q^T.
  template <class Ex>
  void reconstruct(Ex& ex, const float* p, const float* q, float* out, matrix_shape s) const {
    ex.bulk(s.rows, kernels::lowrank_reconstruct{p, q, out, s.rows, s.cols, rank_for(s)});
  }

 private:
  std::size_t rank_;
};

}  // namespace compress
EBBFLOW_END_NAMESPACE
