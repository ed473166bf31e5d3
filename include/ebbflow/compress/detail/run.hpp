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

//! A codec's decode and decode_add, from its `decode_into<Add>(ex, in,
//! out, n)` (with `Add`, accumulate into `out`). Codecs derive from it.
template <class Codec>
struct decode_forms {
  //! Writes the `n` floats decoded from `in` to `out` (both in `Ex`'s space;
  //! completes as `ex.bulk` does).
  template <class Ex>
  void decode(Ex& ex, const std::byte* in, float* out, std::size_t n) const {
    static_cast<const Codec&>(*this).template decode_into<false>(ex, in, out, n);
  }
  //! Adds the `n` floats decoded from `in` to `out` (both in `Ex`'s space;
  //! completes as `ex.bulk` does).
  template <class Ex>
  void decode_add(Ex& ex, const std::byte* in, float* out, std::size_t n) const {
    static_cast<const Codec&>(*this).template decode_into<true>(ex, in, out, n);
  }
};

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
