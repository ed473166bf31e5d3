// SPDX-License-Identifier: Apache-2.0
//! @file f32_codec.hpp
//! The identity "codec" (raw floats): lets the dense pass-through path reuse
//! the pipelined ring of `compressed_allreduce`. Exact; no error feedback.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/compress/codec.hpp>
#include <ebbflow/compress/detail/fp.hpp>
#include <ebbflow/compress/detail/run.hpp>
#include <ebbflow/compress/kernels/block.hpp>

#include <cstddef>
#include <cstring>
#include <string_view>

EBBFLOW_BEGIN_NAMESPACE
namespace compress::detail {

struct copy_fn {
  const float* in;
  float* out;
  std::size_t n;
  EBBFLOW_HD void operator()(std::size_t b) const noexcept {
    const std::size_t o = b * kernels::block_size;
    const float* EBBFLOW_DETAIL_RESTRICT pi = in + o;
    float* EBBFLOW_DETAIL_RESTRICT po = out + o;
    kernels::for_block(b, n, [&](auto cnt) {
      for (std::uint32_t j = 0; j < cnt; ++j) po[j] = pi[j];
    });
  }
};
struct add_fn {
  const float* in;
  float* out;
  std::size_t n;
  EBBFLOW_HD void operator()(std::size_t b) const noexcept {
    const std::size_t o = b * kernels::block_size;
    const float* EBBFLOW_DETAIL_RESTRICT pi = in + o;
    float* EBBFLOW_DETAIL_RESTRICT po = out + o;
    kernels::for_block(b, n, [&](auto cnt) {
      for (std::uint32_t j = 0; j < cnt; ++j) po[j] = fadd(po[j], pi[j]);
    });
  }
};

struct f32_codec {
  static constexpr codec_kind kind = codec_kind::linear;
  [[nodiscard]] std::string_view name() const noexcept { return "dense"; }
  [[nodiscard]] std::size_t max_encoded_bytes(std::size_t n) const noexcept { return align8(4 * n); }
  [[nodiscard]] std::size_t workspace_bytes(std::size_t) const noexcept { return 0; }
  [[nodiscard]] std::size_t block_elems() const noexcept { return kernels::block_size; }
  //! Ignores the residual: raw floats are exact.
  template <class Ex>
  void encode(Ex& ex, const float* in, float*, std::byte* out, std::size_t n, encode_context = {}) const {
    detail::bulk(ex, kernels::blocks_of(n), copy_fn{in, reinterpret_cast<float*>(out), n});
  }
  template <class Ex>
  void decode(Ex& ex, const std::byte* in, float* out, std::size_t n) const {
    detail::bulk(ex, kernels::blocks_of(n), copy_fn{reinterpret_cast<const float*>(in), out, n});
  }
  template <class Ex>
  void decode_add(Ex& ex, const std::byte* in, float* out, std::size_t n) const {
    detail::bulk(ex, kernels::blocks_of(n), add_fn{reinterpret_cast<const float*>(in), out, n});
  }
};
static_assert(codec<f32_codec>);

}  // namespace compress::detail
EBBFLOW_END_NAMESPACE
