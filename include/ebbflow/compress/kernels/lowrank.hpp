// SPDX-License-Identifier: Apache-2.0
//! @file lowrank.hpp
//! PowerSGD kernels (Vogels et al., NeurIPS 2019) for a row-major rows x cols
//! matrix M and rank r: P = M Q, Q = M^T P, reconstruction P Q^T with the
//! error-feedback residual, and Gram-Schmidt orthogonalisation of P's
//! columns. Every dot product runs in one fixed order (256 interleaved lanes,
//! then a pairwise tree), the order a 256-thread CUDA block uses, so host and
//! device give the same bits. The device orthogonalisation is in
//! orthogonalize.cuh.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/compress/detail/fp.hpp>
#include <ebbflow/exec/executor.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>

EBBFLOW_BEGIN_NAMESPACE
namespace compress::kernels {

//! Largest supported rank (per-thread accumulators live in registers).
inline constexpr std::size_t max_rank = 32;
//! Lanes of the fixed-order dot product (= CUDA block size of the device path).
inline constexpr std::size_t dot_lanes = 256;
//! Added to column norms before dividing (as PyTorch's PowerSGD hook does).
inline constexpr float orthogonalize_eps = 1e-8f;
//! A column whose norm fell below this fraction of its original norm during
//! orthogonalisation is treated as linearly dependent and zeroed.
inline constexpr float rank_tolerance = 1e-3f;

//! The operands of a product of M (rows x cols, row-major) with a factor:
//! `in` is read, `out` written (executor's memory space; row-major, `rank`
//! columns). Entries are summed in index order, so every executor gives the
//! same bits.
struct lowrank_product {
  const float* m;   //!< M, rows x cols row-major
  const float* in;  //!< the factor read: Q (cols x rank) for P = M Q, P (rows x rank) for Q = M^T P
  float* out;       //!< the factor written: P (rows x rank), or Q (cols x rank)
  std::size_t rows, cols, rank;
  //! @var rows
  //! Rows of M (and of P).
  //! @var cols
  //! Columns of M (rows of Q).
  //! @var rank
  //! Rank r: columns of P and Q (<= `max_rank`).

  //! out[o, j] = sum_k M[k * stride + first] in[k, j] over k < len: row `o` of the output.
  EBBFLOW_HD void dot(std::size_t o, std::size_t first, std::size_t stride, std::size_t len) const noexcept {
    float acc[max_rank];
    for (std::size_t j = 0; j < rank; ++j) acc[j] = 0.0f;
    for (std::size_t k = 0; k < len; ++k) {
      const float v = m[k * stride + first];
      for (std::size_t j = 0; j < rank; ++j) acc[j] = detail::fadd(acc[j], detail::fmul(v, in[k * rank + j]));
    }
    for (std::size_t j = 0; j < rank; ++j) out[o * rank + j] = acc[j];
  }
};

//! P[i, j] = sum_c M[i, c] Q[c, j]; one call per row i (`in` = Q, `out` = P).
struct lowrank_mul_p : lowrank_product {
  //! Computes row `i` of P.
  EBBFLOW_HD void operator()(std::size_t i) const noexcept { dot(i, i * cols, 1, cols); }
};

//! Q[c, j] = sum_i M[i, c] P[i, j]; one call per column c (`in` = P, `out` = Q).
struct lowrank_mul_q : lowrank_product {
  //! Computes row `c` of Q (column `c` of M^T P).
  EBBFLOW_HD void operator()(std::size_t c) const noexcept { dot(c, c, cols, rows); }
};

//! Row i of P Q^T: out[i, c] = sum_j P[i, j] Q[c, j]. One call per row.
struct lowrank_reconstruct {
  const float* p;  //!< P, rows x rank row-major (executor's memory space)
  const float* q;  //!< Q, cols x rank row-major
  float* out;      //!< P Q^T (output), rows x cols row-major
  std::size_t rows, cols, rank;
  //! @var rows
  //! Rows of M (and of P).
  //! @var cols
  //! Columns of M (rows of Q).
  //! @var rank
  //! Rank r: columns of P and Q (<= `max_rank`).

  //! Writes row `i`.
  EBBFLOW_HD void operator()(std::size_t i) const noexcept {
    for (std::size_t c = 0; c < cols; ++c) {
      float acc = 0.0f;
      for (std::size_t j = 0; j < rank; ++j) acc = detail::fadd(acc, detail::fmul(p[i * rank + j], q[c * rank + j]));
      out[i * cols + c] = acc;
    }
  }
};

//! res[i, c] = m[i, c] - sum_j P[i, j] Q[c, j]; one call per row.
struct lowrank_residual {
  const float* m;  //!< M, rows x cols row-major (executor's memory space)
  const float* p;  //!< P, rows x rank row-major
  const float* q;  //!< Q, cols x rank row-major
  float* res;      //!< M - P Q^T (output; may alias `m`)
  std::size_t rows, cols, rank;
  //! @var rows
  //! Rows of M (and of P).
  //! @var cols
  //! Columns of M (rows of Q).
  //! @var rank
  //! Rank r: columns of P and Q (<= `max_rank`).

  //! Writes row `i`.
  EBBFLOW_HD void operator()(std::size_t i) const noexcept {
    for (std::size_t c = 0; c < cols; ++c) {
      float acc = 0.0f;
      for (std::size_t j = 0; j < rank; ++j) acc = detail::fadd(acc, detail::fmul(p[i * rank + j], q[c * rank + j]));
      res[i * cols + c] = detail::finite_or_zero(detail::fsub(m[i * cols + c], acc));
    }
  }
};

//! out[i] = a[i] + b[i]; used to form M = grad + residual.
struct add_into {
  const float* a;  //!< first summand (executor's memory space)
  const float* b;  //!< second summand
  float* out;      //!< sum (may alias `a` or `b`)
  //! Writes element `i`.
  EBBFLOW_HD void operator()(std::size_t i) const noexcept { out[i] = detail::fadd(a[i], b[i]); }
};

namespace detail_lr {
//! Pairwise tree over 256 lanes: lane[t] += lane[t + s], s = 128, 64, ..., 1.
inline float tree256(float* lane) noexcept {
  for (std::size_t s = dot_lanes / 2; s > 0; s /= 2)
    for (std::size_t t = 0; t < s; ++t) lane[t] = compress::detail::fadd(lane[t], lane[t + s]);
  return lane[0];
}
//! sum_k x[k*stride] * y[k*stride] in the fixed lane order.
inline float dot(const float* x, const float* y, std::size_t n, std::size_t stride) noexcept {
  float lane[dot_lanes] = {};
  for (std::size_t base = 0; base < n; base += dot_lanes)
    for (std::size_t t = 0; t < dot_lanes && base + t < n; ++t)
      lane[t] = compress::detail::fadd(lane[t], compress::detail::fmul(x[(base + t) * stride], y[(base + t) * stride]));
  return tree256(lane);
}
}  // namespace detail_lr

//! Modified Gram-Schmidt on the `rank` columns of the row-major rows x rank
//! matrix p, in host memory: column i /= (|column i| + eps), then every later
//! column loses its projection on column i. Blocking.
inline void orthogonalize_host(float* p, std::size_t rows, std::size_t rank) noexcept {
  using compress::detail::fmul;
  using compress::detail::fsub;
  float orig[max_rank];
  for (std::size_t i = 0; i < rank; ++i) orig[i] = std::sqrt(detail_lr::dot(p + i, p + i, rows, rank));
  for (std::size_t i = 0; i < rank; ++i) {
    const float norm = std::sqrt(detail_lr::dot(p + i, p + i, rows, rank));
    // A column that lost almost all of its norm to the previous ones is
    // rounding noise (P has lower rank than r): drop it rather than blow the
    // noise up to a unit vector that is not orthogonal to the others.
    const bool keep = norm > rank_tolerance * orig[i];
    const float denom = norm + orthogonalize_eps;
    for (std::size_t k = 0; k < rows; ++k) p[k * rank + i] = keep ? p[k * rank + i] / denom : 0.0f;
    for (std::size_t j = i + 1; j < rank; ++j) {
      const float d = detail_lr::dot(p + i, p + j, rows, rank);
      for (std::size_t k = 0; k < rows; ++k) p[k * rank + j] = fsub(p[k * rank + j], fmul(d, p[k * rank + i]));
    }
  }
}

//! Orthogonalisation dispatch by executor: specialised for `exec::cpu_executor`
//! here and for `exec::cuda_executor` in orthogonalize.cuh.
template <class Executor>
struct orthogonalizer;

//! Host orthogonalisation: `orthogonalize_host`, blocking.
template <>
struct orthogonalizer<exec::cpu_executor> {
  //! Orthogonalises the columns of `p` (host memory, rows x rank) in place.
  static void run(const exec::cpu_executor&, float* p, std::size_t rows, std::size_t rank) {
    orthogonalize_host(p, rows, rank);
  }
};

}  // namespace compress::kernels
EBBFLOW_END_NAMESPACE
