// SPDX-License-Identifier: Apache-2.0
//! @file orthogonalize.cuh
//! Device Gram-Schmidt for PowerSGD's P factor: one 256-thread block walks
//! the columns; each dot product is 256 strided lane sums plus a shared-memory
//! tree, the same order as `orthogonalize_host`, so the results are
//! bit-identical to the CPU. Requires nvcc. P is small (rows x rank), so one
//! block is enough; the launch is asynchronous on the executor's stream.
#pragma once

#include <ebbflow/compress/kernels/lowrank.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/exec/cuda_executor.cuh>

#include <cuda_runtime.h>

EBBFLOW_BEGIN_NAMESPACE
namespace compress::kernels {
namespace detail_lr {

//! Fixed-order dot product of x[k*stride] and y[k*stride] over k < n by the
//! whole block (`lane`: 256 floats of shared memory); every thread gets the sum.
__device__ inline float block_dot(const float* x, const float* y, std::size_t n, std::size_t stride, float* lane) {
  const unsigned t = threadIdx.x;
  float acc = 0.0f;
  for (std::size_t base = 0; base < n; base += dot_lanes)
    if (base + t < n) acc = __fadd_rn(acc, __fmul_rn(x[(base + t) * stride], y[(base + t) * stride]));
  lane[t] = acc;
  __syncthreads();
  for (unsigned s = dot_lanes / 2; s > 0; s /= 2) {
    if (t < s) lane[t] = __fadd_rn(lane[t], lane[t + s]);
    __syncthreads();
  }
  const float r = lane[0];
  __syncthreads();
  return r;
}

//! Modified Gram-Schmidt on the columns of device matrix `p` (rows x rank,
//! row-major), in place; launched as one 256-thread block.
__global__ void orthogonalize_kernel(float* p, std::size_t rows, std::size_t rank) {
  __shared__ float lane[dot_lanes];
  float orig[max_rank];
  for (std::size_t i = 0; i < rank; ++i) orig[i] = sqrtf(block_dot(p + i, p + i, rows, rank, lane));
  for (std::size_t i = 0; i < rank; ++i) {
    const float norm = sqrtf(block_dot(p + i, p + i, rows, rank, lane));
    const bool keep = norm > __fmul_rn(rank_tolerance, orig[i]);
    const float denom = __fadd_rn(norm, orthogonalize_eps);
    for (std::size_t k = threadIdx.x; k < rows; k += dot_lanes)
      p[k * rank + i] = keep ? __fdiv_rn(p[k * rank + i], denom) : 0.0f;
    __syncthreads();
    for (std::size_t j = i + 1; j < rank; ++j) {
      const float d = block_dot(p + i, p + j, rows, rank, lane);
      for (std::size_t k = threadIdx.x; k < rows; k += dot_lanes)
        p[k * rank + j] = __fsub_rn(p[k * rank + j], __fmul_rn(d, p[k * rank + i]));
      __syncthreads();
    }
  }
}
}  // namespace detail_lr

//! Device orthogonalisation: one 256-thread block on the executor's stream.
template <>
struct orthogonalizer<exec::cuda_executor> {
  //! Enqueues the orthogonalisation of device matrix `d_p` on `ex`'s stream.
  //! @throws system_error on launch failure.
  static void run(const exec::cuda_executor& ex, float* d_p, std::size_t rows, std::size_t rank) {
    detail_lr::orthogonalize_kernel<<<1, static_cast<unsigned>(dot_lanes), 0, ex.stream()>>>(d_p, rows, rank);
    if (auto e = cudaGetLastError(); e != cudaSuccess)
      throw_if(std::error_code(static_cast<int>(e), cuda_category()), {.operation = "orthogonalize"});
  }
};

}  // namespace compress::kernels
EBBFLOW_END_NAMESPACE
