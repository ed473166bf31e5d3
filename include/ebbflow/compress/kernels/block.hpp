// SPDX-License-Identifier: Apache-2.0
//! @file block.hpp
//! Blocking conventions shared by the codec kernels. Each kernel functor is
//! called once per block of `block_size` elements (the last block may be
//! short), so a host loop over one full block has a compile-time trip count
//! and vectorises, and a GPU thread owns a whole block (its per-block scale,
//! its random numbers) without cross-thread communication.
#pragma once

#include <ebbflow/config.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#if defined(__CUDACC__) || defined(__GNUC__)
#define EBBFLOW_DETAIL_RESTRICT __restrict__
#else
#define EBBFLOW_DETAIL_RESTRICT
#endif

EBBFLOW_BEGIN_NAMESPACE
namespace compress::kernels {

//! Elements per block for scaled codes (one float scale per block).
inline constexpr std::size_t block_size = 256;

//! Number of blocks covering `n` elements.
EBBFLOW_HD constexpr std::size_t blocks_of(std::size_t n) noexcept { return (n + block_size - 1) / block_size; }

//! Calls `body(count)` for block `b` of an `n`-element range: with a
//! compile-time 256 when the block is full (vectorisable), with the run-time
//! length for the short tail.
template <class Body>
EBBFLOW_HD inline void for_block(std::size_t b, std::size_t n, Body&& body) {
  const std::size_t begin = b * block_size;
  const std::size_t len = n - begin < block_size ? n - begin : block_size;
  if (len == block_size)
    body(std::integral_constant<std::uint32_t, static_cast<std::uint32_t>(block_size)>{});
  else
    body(static_cast<std::uint32_t>(len));
}

//! Calls `body(std::true_type{})` when the residual `res` is given (error
//! feedback), `body(std::false_type{})` when it is null: the choice is made
//! once per block, and each branch compiles without the other's loads.
template <class Body>
EBBFLOW_HD inline void with_residual(const float* res, Body&& body) {
  if (res == nullptr)
    body(std::false_type{});
  else
    body(std::true_type{});
}

}  // namespace compress::kernels
EBBFLOW_END_NAMESPACE
