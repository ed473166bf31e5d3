// SPDX-License-Identifier: Apache-2.0
//! @file codec.hpp
//! The `codec` concept: how a gradient compressor presents itself to
//! `compressed_allreduce`.
//!
//! A codec turns `n` floats into at most `max_encoded_bytes(n)` bytes and back.
//! Every pointer handed to a codec lives in the memory space of the executor
//! it is called with (`exec::cpu_executor`: host; `exec::cuda_executor`:
//! device); the codec itself never allocates, copies across spaces or blocks
//! beyond what its executor's `bulk` does.
//!
//! * `encode(ex, in, residual, out, n, ctx)`: error feedback is built in. When
//!   `residual` is not null the codec encodes `v = in + residual` and stores
//!   `residual = v - decode(out)`, so the compression error of this call is
//!   added to the next one (Seide et al. 2014; Karimireddy et al. 2019). With a
//!   null residual it encodes `in` alone. `ctx` carries the random seed/stream
//!   for stochastic codecs and a scratch area of `workspace_bytes(n)` bytes.
//! * `decode(ex, in, out, n)` writes the decoded floats; `decode_add` adds them
//!   to `out`.
//! * `kind` tells `compressed_allreduce` which algorithm is valid for the code.
//!
//! Encoded buffers must be 8-byte aligned; `max_encoded_bytes` is a multiple
//! of 8 so that consecutive encoded segments stay aligned. Encoding is
//! deterministic given (input, residual, seed, stream): the same bits on CPU
//! and GPU. Codecs are cheap value types; calls on distinct buffers may run
//! concurrently.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/exec/executor.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string_view>

EBBFLOW_BEGIN_NAMESPACE
namespace compress {

//! Which reduction algorithm a code admits.
enum class codec_kind {
  //! Summable after a per-hop decode: a ring reduce-scatter can decode, add
  //! its own data and re-encode at every hop (casts; unbiased stochastic
  //! quantisers, whose per-hop errors stay unbiased). Wire bytes per rank
  //! ~ 2(p-1)/p * encoded size.
  linear,
  //! Not summable (top-k): every rank's encoded blocks are allgathered and
  //! decoded by everybody. Wire bytes per rank ~ (p-1) * encoded size.
  sparse,
  //! Sign codes (1-bit): compressed reduce-scatter, average, re-encode with a
  //! second error-feedback residual, compressed allgather (DeepSpeed 1-bit).
  sign,
  //! Low-rank (PowerSGD): not a flat codec; two dense allreduces of the
  //! factors P and Q.
  low_rank,
};

//! The enumerator's name ("linear", "sparse", "sign", "low_rank"), or "?".
constexpr std::string_view name(codec_kind k) noexcept {
  constexpr std::string_view names[] = {"linear", "sparse", "sign", "low_rank"};  // in declaration order
  const auto i = static_cast<std::size_t>(k);
  return i < std::size(names) ? names[i] : "?";
}

//! Per-call context of an encode. `workspace` points to `workspace_bytes(n)`
//! bytes (8-byte aligned) in the executor's memory space, or is null when the
//! codec needs none. `seed` and `stream` select the Philox stream of
//! stochastic codecs: callers make `stream` unique per (rank, step, region).
struct encode_context {
  std::uint64_t seed = 0;          //!< Philox key of stochastic codecs
  std::uint64_t stream = 0;        //!< Philox stream: unique per (rank, step, region)
  std::byte* workspace = nullptr;  //!< `workspace_bytes(n)` bytes in the executor's memory space, or null
};

//! Rounds `b` up to a multiple of 8 bytes.
constexpr std::size_t align8(std::size_t b) noexcept { return (b + 7) / 8 * 8; }

template <class C>
concept codec = std::copy_constructible<C> &&
    requires(const C& c, exec::cpu_executor& ex, const float* in, float* res, float* out, const std::byte* ein,
             std::byte* eout, std::size_t n, encode_context ctx) {
  { C::kind } -> std::convertible_to<codec_kind>;
  { c.name() } -> std::convertible_to<std::string_view>;
  { c.max_encoded_bytes(n) } -> std::same_as<std::size_t>;
  { c.workspace_bytes(n) } -> std::same_as<std::size_t>;
  //! Granularity: segment boundaries passed by the allreduce are multiples of it.
  { c.block_elems() } -> std::same_as<std::size_t>;
  c.encode(ex, in, res, eout, n, ctx);
  c.decode(ex, ein, out, n);
  c.decode_add(ex, ein, out, n);
};

}  // namespace compress
EBBFLOW_END_NAMESPACE
