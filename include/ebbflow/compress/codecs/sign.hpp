// SPDX-License-Identifier: Apache-2.0
//! @file sign.hpp
//! 1-bit sign codec with a per-block l1 scale (EF-signSGD / DeepSpeed 1-bit
//! Adam style). ~1.03 bits per element on the wire. Biased, so
//! `compressed_allreduce` always runs it with error feedback, in the
//! two-phase scheme (compressed reduce-scatter, average, re-encode with a
//! second residual, compressed allgather). Per encode, the decoded block has
//! the same l1 norm as the input block; the error lives in the residual.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/compress/codec.hpp>
#include <ebbflow/compress/detail/run.hpp>
#include <ebbflow/compress/kernels/sign.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

EBBFLOW_BEGIN_NAMESPACE
namespace compress {

//! Stateless; thread-safe.
struct sign_codec : detail::decode_forms<sign_codec> {
  static constexpr codec_kind kind = codec_kind::sign;  //!< two-phase scheme with error feedback

  //! "sign1".
  [[nodiscard]] std::string_view name() const noexcept { return "sign1"; }
  //! Encoded size of `n` elements: a float scale and 256 sign bits per
  //! block, rounded up to 8.
  [[nodiscard]] std::size_t max_encoded_bytes(std::size_t n) const noexcept {
    const std::size_t nb = kernels::blocks_of(n);
    return align8(4 * nb + 4 * kernels::sign_words_per_block * nb);
  }
  //! No workspace needed: 0.
  [[nodiscard]] std::size_t workspace_bytes(std::size_t) const noexcept { return 0; }
  //! Segment granularity: `kernels::block_size` (256) elements.
  [[nodiscard]] std::size_t block_elems() const noexcept { return kernels::block_size; }

  //! Encodes `n` floats (+ `residual` when not null, which receives the new
  //! error) into `out`. Pointers in `Ex`'s space.
  template <class Ex>
  void encode(Ex& ex, const float* in, float* residual, std::byte* out, std::size_t n, encode_context = {}) const {
    const std::size_t nb = kernels::blocks_of(n);
    detail::bulk(ex, nb,
                 kernels::sign_encode{in, residual, reinterpret_cast<float*>(out),
                                      reinterpret_cast<std::uint32_t*>(out + 4 * nb), n});
  }
  //! Writes (`Add` false: decode) or adds (`Add` true: decode_add) the `n`
  //! floats decoded from `in` to `out` (both in `Ex`'s space; completes as
  //! `ex.bulk` does).
  template <bool Add, class Ex>
  void decode_into(Ex& ex, const std::byte* in, float* out, std::size_t n) const {
    const std::size_t nb = kernels::blocks_of(n);
    detail::bulk(ex, nb,
                 kernels::sign_decode<Add>{reinterpret_cast<const float*>(in),
                                           reinterpret_cast<const std::uint32_t*>(in + 4 * nb), out, n});
  }
};
static_assert(codec<sign_codec>);

}  // namespace compress
EBBFLOW_END_NAMESPACE
