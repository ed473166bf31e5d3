// SPDX-License-Identifier: Apache-2.0
//! @file cuda_executor.cuh
//! `cuda_executor`: launches `EBBFLOW_HD` functors as a grid-stride kernel on
//! a user-given stream. Asynchronous: `bulk` returns after the launch; `wait()`
//! synchronises the stream. Requires nvcc.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/exec/executor.hpp>

#include <cuda_runtime.h>

#include <cstddef>

EBBFLOW_BEGIN_NAMESPACE
namespace exec {
namespace detail {
template <class F>
__global__ void bulk_kernel(std::size_t n, F f) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    f(i);
}
//! Launch shape policy (CUB-style: not a public parameter).
struct bulk_policy {
  static constexpr unsigned block = 256;
  static constexpr unsigned max_grid = 65535;
};
}  // namespace detail

//! Runs functors as one CUDA kernel on a stream. `bulk` is asynchronous
//! (enqueued on the stream); `wait` blocks until the stream is idle.
//! Thread-safe as far as the stream is.
class cuda_executor {
 public:
  static constexpr memory_space space = memory_space::device;  //!< functors touch device memory

  //! An executor enqueuing on `stream` (not owned; default: the legacy stream).
  explicit cuda_executor(cudaStream_t stream = nullptr) noexcept : stream_(stream) {}

  //! Enqueues `f(i)` for i in [0, n) on the stream. @throws system_error on launch failure.
  template <class F>
  void bulk(std::size_t n, F f) const {
    if (n == 0) return;
    using P = detail::bulk_policy;
    std::size_t blocks = (n + P::block - 1) / P::block;
    if (blocks > P::max_grid) blocks = P::max_grid;
    detail::bulk_kernel<<<static_cast<unsigned>(blocks), P::block, 0, stream_>>>(n, f);
    if (auto e = cudaGetLastError(); e != cudaSuccess)
      throw_if(std::error_code(static_cast<int>(e), cuda_category()), {.operation = "cuda_executor::bulk"});
  }
  //! Blocks until the stream is idle. @throws system_error.
  void wait() const {
    if (auto e = cudaStreamSynchronize(stream_); e != cudaSuccess)
      throw_if(std::error_code(static_cast<int>(e), cuda_category()), {.operation = "cuda_executor::wait"});
  }
  //! The stream work is enqueued on.
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }

 private:
  cudaStream_t stream_;
};
static_assert(executor<cuda_executor>);

}  // namespace exec
EBBFLOW_END_NAMESPACE
