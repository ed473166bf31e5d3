// SPDX-License-Identifier: Apache-2.0
//! @file quantize.hpp
//! int8 and int4 stochastic quantisation codecs with one float scale per 256
//! elements (QSGD-style max-abs scaling, Philox stochastic rounding).
//!
//! Guarantees, per encode of a block with max |v| = a:
//! * every element's error is below one step, a / 127 (int8) or a / 7 (int4);
//! * unbiased: E[decode(encode(v))] = v, up to 2^-17 of a step (16-bit u);
//! * the same bits on CPU and GPU for the same (seed, stream).
//! Linear in expectation, so the ring decodes, adds and re-encodes per hop.
//! Wire size: n + 4 n / 256 bytes (int8), n / 2 + 4 n / 256 (int4).
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/compress/codec.hpp>
#include <ebbflow/compress/detail/run.hpp>
#include <ebbflow/compress/kernels/quantize.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

EBBFLOW_BEGIN_NAMESPACE
namespace compress {

//! `Bits` = 8 or 4. Stateless; thread-safe.
template <int Bits>
struct quantize_codec : detail::decode_forms<quantize_codec<Bits>> {
  static_assert(Bits == 8 || Bits == 4);
  static constexpr codec_kind kind = codec_kind::linear;  //!< unbiased: decoded, added and re-encoded per ring hop
  static constexpr std::int32_t levels = kernels::levels<Bits>;  //!< largest code magnitude: 127 (int8) or 7 (int4)

  //! "int8" or "int4".
  [[nodiscard]] std::string_view name() const noexcept { return Bits == 8 ? "int8" : "int4"; }
  //! Encoded size of `n` elements: a float scale per block plus the codes
  //! (1 or 1/2 byte each), rounded up to 8.
  [[nodiscard]] std::size_t max_encoded_bytes(std::size_t n) const noexcept {
    const std::size_t nb = kernels::blocks_of(n);
    return align8(4 * nb + (nb == 0 ? 0
                                    : (nb - 1) * kernels::code_bytes<Bits>(kernels::block_size) +
                                          kernels::code_bytes<Bits>(n - (nb - 1) * kernels::block_size)));
  }
  //! No workspace needed: 0.
  [[nodiscard]] std::size_t workspace_bytes(std::size_t) const noexcept { return 0; }
  //! Segment granularity: `kernels::block_size` (256) elements.
  [[nodiscard]] std::size_t block_elems() const noexcept { return kernels::block_size; }

  //! Encodes `n` floats (+ `residual` when not null, which receives the new
  //! error) into `out`, rounding stochastically with the Philox stream
  //! (`ctx.seed`, `ctx.stream`). Pointers in `Ex`'s space.
  template <class Ex>
  void encode(Ex& ex, const float* in, float* residual, std::byte* out, std::size_t n, encode_context ctx = {}) const {
    const std::size_t nb = kernels::blocks_of(n);
    detail::bulk(ex, nb,
                 kernels::quantize_encode<Bits>{in,
                                                residual,
                                                reinterpret_cast<float*>(out),
                                                reinterpret_cast<std::uint8_t*>(out) + 4 * nb,
                                                n,
                                                {ctx.seed, ctx.stream}});
  }
  //! Writes (`Add` false: decode) or adds (`Add` true: decode_add) the `n`
  //! floats decoded from `in` to `out` (both in `Ex`'s space; completes as
  //! `ex.bulk` does).
  template <bool Add, class Ex>
  void decode_into(Ex& ex, const std::byte* in, float* out, std::size_t n) const {
    const std::size_t nb = kernels::blocks_of(n);
    detail::bulk(ex, nb,
                 kernels::quantize_decode<Bits, Add>{reinterpret_cast<const float*>(in),
                                                     reinterpret_cast<const std::uint8_t*>(in) + 4 * nb, out, n});
  }
};

//! 8-bit stochastic quantiser.
using int8_codec = quantize_codec<8>;
//! 4-bit stochastic quantiser.
using int4_codec = quantize_codec<4>;
static_assert(codec<int8_codec> && codec<int4_codec>);

}  // namespace compress
EBBFLOW_END_NAMESPACE
