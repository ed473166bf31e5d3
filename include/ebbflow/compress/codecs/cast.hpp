// SPDX-License-Identifier: Apache-2.0
//! @file cast.hpp
//! fp16 and bf16 cast codecs: 2 bytes per element plus one exponent byte per
//! block of 256 (block floating point), round to nearest even, with optional
//! error feedback. Each block is scaled by its own power of two, so any
//! finite float is encoded (fp16's own range ends at 65504) with relative
//! error <= 2^-11 (fp16) or 2^-8 (bf16) for every element within 2^-28
//! (fp16) of its block's largest |value|. Linear: the ring decodes, adds and
//! re-encodes at every hop, in one pass (`decode_add_encode`) that never
//! unscales the running sum, so the ring's sums cannot overflow either.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/compress/codec.hpp>
#include <ebbflow/compress/detail/fp.hpp>
#include <ebbflow/compress/detail/run.hpp>
#include <ebbflow/compress/kernels/cast.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

EBBFLOW_BEGIN_NAMESPACE
namespace compress {

//! Cast codec to the 16-bit format `F`. Stateless; thread-safe.
//!
//! Encoded layout of n elements, nb = blocks_of(n): n codes (2 bytes each,
//! padded to a multiple of 8), then nb signed exponent bytes e (the block's
//! values were scaled by 2^e before the cast; padded to a multiple of 8).
template <kernels::cast_format F>
struct cast_codec : detail::decode_forms<cast_codec<F>> {
  static constexpr codec_kind kind = codec_kind::linear;  //!< decoded, added and re-encoded per ring hop
  //! Unit roundoff of one encode, relative to |v| (documented bound).
  static constexpr float unit_roundoff = F == kernels::cast_format::f16 ? 1.0f / 2048 : 1.0f / 256;

  //! "fp16" or "bf16".
  [[nodiscard]] std::string_view name() const noexcept { return F == kernels::cast_format::f16 ? "fp16" : "bf16"; }
  //! Encoded size of `n` elements: 2 bytes each and one per block, each part rounded up to 8.
  [[nodiscard]] std::size_t max_encoded_bytes(std::size_t n) const noexcept {
    return align8(2 * n) + align8(kernels::blocks_of(n));
  }
  //! No workspace needed: 0.
  [[nodiscard]] std::size_t workspace_bytes(std::size_t) const noexcept { return 0; }
  //! Segment granularity: `kernels::block_size` (256) elements.
  [[nodiscard]] std::size_t block_elems() const noexcept { return kernels::block_size; }

  //! Encodes n floats (+ residual) into `out`. Pointers in `Ex`'s space.
  template <class Ex>
  void encode(Ex& ex, const float* in, float* residual, std::byte* out, std::size_t n, encode_context = {}) const {
    detail::bulk(ex, kernels::blocks_of(n), kernels::cast_encode<F>{in, residual, codes(out), exps(out, n), n});
  }
  //! Writes (`Add` false: decode) or adds (`Add` true: decode_add) the `n`
  //! floats decoded from `in` to `out` (both in `Ex`'s space; completes as
  //! `ex.bulk` does).
  template <bool Add, class Ex>
  void decode_into(Ex& ex, const std::byte* in, float* out, std::size_t n) const {
    detail::bulk(ex, kernels::blocks_of(n), kernels::cast_decode<F, Add>{codes(in), exps(in, n), out, n});
  }
  //! The ring's hop: encodes decode(`in`) + `own` (+ `residual`) into `out`
  //! in one pass, without unscaling the running sum decode(`in`) (a sum
  //! that fits the code but not float after rounding, or beyond float on
  //! the way, stays finite). `own` is only read; with a residual, it holds
  //! this encode's error afterwards, as `encode`'s does. Pointers in `Ex`'s
  //! space; `in` and `out` do not overlap.
  template <class Ex>
  void decode_add_encode(Ex& ex, const std::byte* in, const float* own, float* residual, std::byte* out,
                         std::size_t n) const {
    detail::bulk(ex, kernels::blocks_of(n),
                 kernels::cast_add_encode<F>{codes(in), exps(in, n), own, residual, codes(out), exps(out, n), n});
  }
  //! Of the `n` floats `decoded` from `in` (host memory), how many are
  //! +-inf or NaN although their codes are finite: values beyond float's
  //! range (above about 3.4e38) after the block's scale is undone.
  [[nodiscard]] std::size_t saturated(const std::byte* in, const float* decoded, std::size_t n) const noexcept {
    // Codes stay below 2^top (with a rounding); only blocks scaled down far
    // enough can leave float's range when decoded.
    constexpr int lowest_safe = kernels::block_top_log2<F> - 127;
    std::size_t k = 0;
    const std::int8_t* e = exps(in, n);
    const std::uint16_t* c = codes(in);
    for (std::size_t b = 0; b < kernels::blocks_of(n); ++b) {
      if (e[b] >= lowest_safe) continue;
      const std::size_t end = b * kernels::block_size + kernels::block_size < n ? (b + 1) * kernels::block_size : n;
      for (std::size_t i = b * kernels::block_size; i < end; ++i)
        k += !detail::is_finite(decoded[i]) && detail::is_finite(kernels::from_bits<F>(c[i]));
    }
    return k;
  }

 private:
  static std::uint16_t* codes(std::byte* p) noexcept { return reinterpret_cast<std::uint16_t*>(p); }
  static const std::uint16_t* codes(const std::byte* p) noexcept { return reinterpret_cast<const std::uint16_t*>(p); }
  static std::int8_t* exps(std::byte* p, std::size_t n) noexcept {
    return reinterpret_cast<std::int8_t*>(p + align8(2 * n));
  }
  static const std::int8_t* exps(const std::byte* p, std::size_t n) noexcept {
    return reinterpret_cast<const std::int8_t*>(p + align8(2 * n));
  }
};

//! IEEE binary16 cast codec (block floating point).
using fp16_codec = cast_codec<kernels::cast_format::f16>;
//! bfloat16 cast codec (block floating point).
using bf16_codec = cast_codec<kernels::cast_format::bf16>;
static_assert(codec<fp16_codec> && codec<bf16_codec>);

}  // namespace compress
EBBFLOW_END_NAMESPACE
