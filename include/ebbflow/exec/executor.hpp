// SPDX-License-Identifier: Apache-2.0
//! @file executor.hpp
//! The `executor` concept: runs an `EBBFLOW_HD` functor over an index range
//! in one memory space. `cpu_executor` (this header) runs it as a host loop and
//! is the reference every GPU result is checked against; `cuda_executor`
//! (cuda_executor.cuh, nvcc only) launches it as a kernel on a stream.
//!
//! `bulk(n, f)` calls `f(i)` for every i in [0, n) in unspecified order and
//! possibly concurrently; `f` must not depend on ordering. `wait()` blocks
//! until every bulk submitted before it has finished.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/memory.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <thread>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace exec {

namespace detail {
struct probe_fn {
  EBBFLOW_HD void operator()(std::size_t) const noexcept {}
};
}  // namespace detail

template <class E>
concept executor = requires(E& e, std::size_t n) {
  { E::space } -> std::convertible_to<memory_space>;
  e.bulk(n, detail::probe_fn{});
  e.wait();
};

//! Runs functors on the calling thread, or on `threads` threads in contiguous
//! chunks when `threads > 1` and the range is large enough to pay for it.
//! Blocking: `bulk` returns when all calls finished, so `wait()` is a no-op.
class cpu_executor {
 public:
  static constexpr memory_space space = memory_space::host;  //!< functors touch host memory

  constexpr cpu_executor() noexcept = default;
  //! Runs `bulk` on up to `threads` threads (0 counts as 1).
  explicit cpu_executor(unsigned threads) noexcept : threads_(threads == 0 ? 1 : threads) {}

  //! Calls `f(i)` for every i in [0, n); returns when all calls finished.
  template <class F>
  void bulk(std::size_t n, F&& f) const {
    constexpr std::size_t min_per_thread = 1 << 15;
    const std::size_t t = std::min<std::size_t>(threads_, std::max<std::size_t>(1, n / min_per_thread));
    if (t <= 1) {
      for (std::size_t i = 0; i < n; ++i) f(i);
      return;
    }
    std::vector<std::jthread> pool;
    pool.reserve(t - 1);
    const std::size_t chunk = (n + t - 1) / t;
    for (std::size_t k = 1; k < t; ++k) {
      const std::size_t b = k * chunk, e = std::min(n, b + chunk);
      pool.emplace_back([&f, b, e] {
        for (std::size_t i = b; i < e; ++i) f(i);
      });
    }
    for (std::size_t i = 0; i < std::min(n, chunk); ++i) f(i);
  }
  //! No-op: `bulk` is blocking.
  void wait() const noexcept {}
  //! Most threads `bulk` uses.
  [[nodiscard]] unsigned threads() const noexcept { return threads_; }

 private:
  unsigned threads_ = 1;
};
static_assert(executor<cpu_executor>);

}  // namespace exec
EBBFLOW_END_NAMESPACE
