// SPDX-License-Identifier: Apache-2.0
//! @file cast.hpp
//! fp16 and bf16 cast codecs: 2 bytes per element, round to nearest even,
//! with optional error feedback. Linear: the ring decodes, adds and re-encodes
//! at every hop. Relative error per encode <= 2^-11 (fp16, inside its normal
//! range |v| in [6.1e-5, 65504]; larger values become inf) or 2^-8 (bf16,
//! up to its largest value, 2^-8 below FLT_MAX). A codec may carry a
//! power-of-two scale (`with_scale`): it then encodes v * scale and decodes
//! back to v, which moves that range wherever the values are;
//! `compressed_allreduce` picks one per call so that no running sum of its
//! ring leaves the range.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/compress/codec.hpp>
#include <ebbflow/compress/detail/run.hpp>
#include <ebbflow/compress/kernels/cast.hpp>
#include <ebbflow/core/error.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

EBBFLOW_BEGIN_NAMESPACE
namespace compress {

//! Cast codec to the 16-bit format `F`, with its scale. Immutable; thread-safe.
template <kernels::cast_format F>
struct cast_codec : detail::decode_forms<cast_codec<F>> {
  static constexpr codec_kind kind = codec_kind::linear;  //!< decoded, added and re-encoded per ring hop
  //! Unit roundoff of one encode, relative to |v| (documented bound).
  static constexpr float unit_roundoff = F == kernels::cast_format::f16 ? 1.0f / 2048 : 1.0f / 256;
  //! Largest finite value of the format, 65504 (fp16) or 0x1.FEp127
  //! (bf16): |v * scale()| above it (by half a unit in the last place) encodes as inf.
  static constexpr float max_value = F == kernels::cast_format::f16 ? 65504.0f : 0x1.FEp127f;

  //! This code of v * `s` instead of v, decoded back to v (the residual,
  //! too, stays unscaled). `s` must be a power of two in [2^-126, 2^126],
  //! so that scaling is exact both ways (short of float's own over- and
  //! underflow). @throws std::invalid_argument for any other `s`.
  [[nodiscard]] cast_codec with_scale(float s) const {
    const std::uint32_t bits = detail::as_u32(s), e = bits >> 23;
    EBBFLOW_ENFORCE((bits & 0x807FFFFFu) == 0 && e >= 1 && e <= 253,
                    name() << " scale " << s << " is not a power of two in [2^-126, 2^126]");
    cast_codec c = *this;
    c.scale_ = s;
    c.inv_scale_ = detail::as_f32((254u - e) << 23);
    return c;
  }
  //! The scale of `with_scale` (1: the plain cast).
  [[nodiscard]] float scale() const noexcept { return scale_; }

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
    detail::bulk(
        ex, kernels::blocks_of(n),
        kernels::cast_encode<F>{in, residual, reinterpret_cast<std::uint16_t*>(out), n, scale_, scale_, inv_scale_});
  }
  //! Writes (`Add` false: decode) or adds (`Add` true: decode_add) the `n`
  //! floats decoded from `in` to `out` (both in `Ex`'s space; completes as
  //! `ex.bulk` does).
  template <bool Add, class Ex>
  void decode_into(Ex& ex, const std::byte* in, float* out, std::size_t n) const {
    detail::bulk(ex, kernels::blocks_of(n),
                 kernels::cast_decode<F, Add>{reinterpret_cast<const std::uint16_t*>(in), out, n, inv_scale_});
  }

 private:
  float scale_ = 1.0f, inv_scale_ = 1.0f;
};

//! IEEE binary16 cast codec.
using fp16_codec = cast_codec<kernels::cast_format::f16>;
//! bfloat16 cast codec.
using bf16_codec = cast_codec<kernels::cast_format::bf16>;
static_assert(codec<fp16_codec> && codec<bf16_codec>);

}  // namespace compress
EBBFLOW_END_NAMESPACE
