// SPDX-License-Identifier: Apache-2.0
//! @file run.hpp
//! How codecs launch their block functors. On a single-threaded
//! `exec::cpu_executor` compiled by GCC for x86-64, the host loop is built
//! twice (baseline SSE2 and AVX2, picked at load time through an ifunc:
//! `target_clones`), because the codec loops are compute-bound at SSE2 width
//! on fast memory. AVX2 without FMA is chosen on purpose: with no fused
//! multiply-add available, GCC cannot contract a * b + c, so both clones, and
//! the GPU, produce the same bits. `flatten` inlines the functor into each
//! clone (otherwise it stays a baseline-ISA call). Everything else goes to
//! `ex.bulk`.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/exec/executor.hpp>

#include <cstddef>
#include <type_traits>

// Not under TSan/ASan: an ifunc resolver runs before the sanitizer runtime is
// initialised and crashes in instrumented code.
#if !defined(__CUDACC__) && defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && \
    !defined(EBBFLOW_NO_TARGET_CLONES) && !EBBFLOW_SANITIZE_THREAD && !EBBFLOW_SANITIZE_ADDRESS
#define EBBFLOW_DETAIL_CLONES __attribute__((target_clones("avx2", "default"), flatten))
#else
#define EBBFLOW_DETAIL_CLONES
#endif

EBBFLOW_BEGIN_NAMESPACE
namespace compress::detail {

template <class F>
EBBFLOW_DETAIL_CLONES void host_loop(std::size_t n, const F& f) {
  for (std::size_t i = 0; i < n; ++i) f(i);
}

//! Runs f(i) for i in [0, n) on `ex`.
template <class Ex, class F>
void bulk(Ex& ex, std::size_t n, const F& f) {
  if constexpr (std::is_same_v<std::remove_cv_t<Ex>, exec::cpu_executor>) {
    if (ex.threads() <= 1) {
      host_loop(n, f);
      return;
    }
  }
  ex.bulk(n, f);
}

}  // namespace compress::detail
EBBFLOW_END_NAMESPACE

#undef EBBFLOW_DETAIL_CLONES
