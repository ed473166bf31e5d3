// SPDX-License-Identifier: Apache-2.0
//! @file cast.hpp
//! fp16 and bf16 cast codecs: 2 bytes per element, round to nearest even,
//! with optional error feedback. Linear: the ring decodes, adds and re-encodes
//! at every hop. Relative error per encode <= 2^-11 (fp16, inside its normal
//! range |v| in [6.1e-5, 65504]; larger values become inf) or 2^-8 (bf16,
//! full float range).
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/compress/codec.hpp>
#include <ebbflow/compress/detail/run.hpp>
#include <ebbflow/compress/kernels/cast.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

EBBFLOW_BEGIN_NAMESPACE
namespace compress {

//! Cast codec to the 16-bit format `F`. Stateless; thread-safe.
template <kernels::cast_format F>
struct cast_codec : detail::decode_forms<cast_codec<F>> {
  static constexpr codec_kind kind = codec_kind::linear;  //!< decoded, added and re-encoded per ring hop
  //! Unit roundoff of one encode, relative to |v| (documented bound).
  static constexpr float unit_roundoff = F == kernels::cast_format::f16 ? 1.0f / 2048 : 1.0f / 256;

  //! "fp16" or "bf16".
  [[nodiscard]] std::string_view name() const noexcept { return F == kernels::cast_format::f16 ? "fp16" : "bf16"; }
  //! Encoded size of `n` elements: 2 bytes each, rounded up to 8.
  [[nodiscard]] std::size_t max_encoded_bytes(std::size_t n) const noexcept { return align8(2 * n); }
  //! No workspace needed: 0.
  [[nodiscard]] std::size_t workspace_bytes(std::size_t) const noexcept { return 0; }
  //! Segment granularity: `kernels::block_size` (256) elements.
  [[nodiscard]] std::size_t block_elems() const noexcept { return kernels::block_size; }

  //! Encodes n floats (+ residual) into `out`. Pointers in `Ex`'s space.
  template <class Ex>
  void encode(Ex& ex, const float* in, float* residual, std::byte* out, std::size_t n, encode_context = {}) const {
    detail::bulk(ex, kernels::blocks_of(n),
                 kernels::cast_encode<F>{in, residual, reinterpret_cast<std::uint16_t*>(out), n});
  }
  //! Writes (`Add` false: decode) or adds (`Add` true: decode_add) the `n`
  //! floats decoded from `in` to `out` (both in `Ex`'s space; completes as
  //! `ex.bulk` does).
  template <bool Add, class Ex>
  void decode_into(Ex& ex, const std::byte* in, float* out, std::size_t n) const {
    detail::bulk(ex, kernels::blocks_of(n),
                 kernels::cast_decode<F, Add>{reinterpret_cast<const std::uint16_t*>(in), out, n});
  }
};

//! IEEE binary16 cast codec.
using fp16_codec = cast_codec<kernels::cast_format::f16>;
//! bfloat16 cast codec.
using bf16_codec = cast_codec<kernels::cast_format::bf16>;
static_assert(codec<fp16_codec> && codec<bf16_codec>);

}  // namespace compress
EBBFLOW_END_NAMESPACE
