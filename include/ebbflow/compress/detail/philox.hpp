// SPDX-License-Identifier: Apache-2.0
//! @file philox.hpp
//! Philox4x32-10 (Salmon et al., SC'11), the counter-based generator of
//! cuRAND and Random123, written once for host and device. Pure integer
//! arithmetic (32x32->64 multiplies), so the CPU and the GPU produce the same
//! bits for the same key and counter. No state: a stochastic kernel derives the
//! counter from the element index, so results do not depend on how the work is
//! split into threads or blocks.
#pragma once

#include <ebbflow/config.hpp>

#include <cstdint>

// Host AVX2 path of philox_lanes: only where GCC's target attributes and
// runtime CPU checks exist (the same condition as run.hpp's target clones),
// never in device code or under nvcc's front end.
#if !defined(__CUDACC__) && defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && \
    !defined(EBBFLOW_NO_TARGET_CLONES)
#define EBBFLOW_DETAIL_PHILOX_AVX2 1
#include <immintrin.h>
#endif

EBBFLOW_BEGIN_NAMESPACE
namespace compress::detail {

struct philox_u4 {
  std::uint32_t x, y, z, w;
};

//! One Philox4x32-10 block: four uniformly distributed 32-bit words for
//! counter `c` under key (k0, k1).
EBBFLOW_HD inline philox_u4 philox4x32_10(philox_u4 c, std::uint32_t k0, std::uint32_t k1) noexcept {
  constexpr std::uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
  constexpr std::uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = static_cast<std::uint64_t>(m0) * c.x;
    const std::uint64_t p1 = static_cast<std::uint64_t>(m1) * c.z;
    const std::uint32_t hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const std::uint32_t hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    c = philox_u4{hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0};
    k0 += w0;
    k1 += w1;
  }
  return c;
}

//! Key and stream of one stochastic encode: the 64-bit seed is the key, the
//! stream id (e.g. rank, step and region hashed together) goes in the counter's
//! upper words, the element-group index in the lower ones.
struct philox_stream {
  std::uint64_t seed = 0;
  std::uint64_t stream = 0;

  //! Four random words for group `i` of this stream.
  EBBFLOW_HD philox_u4 operator()(std::uint64_t i) const noexcept {
    return philox4x32_10({static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(i >> 32),
                          static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)},
                         static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
  }
};

#if defined(EBBFLOW_DETAIL_PHILOX_AVX2)
//! AVX2 body of philox_lanes<N> (N a multiple of 8). Each Philox lane sits in
//! a 64-bit slot: vpmuludq reads only the low 32 bits of each slot and returns
//! the full 64-bit product, so hi is one shift and lo is the product itself.
//! Upper halves carry garbage that nothing reads (the multiplies ignore it and
//! the final pack drops it). Written with intrinsics because GCC vectorises
//! the portable loop with 32-bit lanes, where splitting each product back into
//! hi and lo words costs more shuffles than the multiplies themselves.
template <unsigned N>
__attribute__((target("avx2"))) inline void philox_lanes_avx2(const philox_stream& s, std::uint64_t first,
                                                              std::uint32_t* out) noexcept {
  // V vectors of 4 slots per word, 4 V groups per pass. One chain of rounds
  // is latency-bound (multiply, shift, xor); 8 independent chains per word
  // keep the multiplier busy (measured: 2 -> 8 vectors, +13 % encode speed;
  // the 32 state vectors spill, but only to L1).
  static_assert(N % 8 == 0);
  constexpr unsigned V = N % 32 == 0 ? 8 : 2;
  const __m256i m0 = _mm256_set1_epi64x(0xD2511F53u), m1 = _mm256_set1_epi64x(0xCD9E8D57u);
  const __m256i pick = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);  // low words of 4 slots -> low 128 bits
  const __m256i z_init = _mm256_set1_epi64x(static_cast<long long>(s.stream & 0xFFFFFFFFu));
  const __m256i w_init = _mm256_set1_epi64x(static_cast<long long>(s.stream >> 32));
  for (unsigned c = 0; c < N; c += 4 * V) {
    __m256i x[V], y[V], z[V], w[V];
    for (unsigned v = 0; v < V; ++v) {
      const __m256i i = _mm256_add_epi64(_mm256_set1_epi64x(static_cast<long long>(first + c + 4 * v)),
                                         _mm256_setr_epi64x(0, 1, 2, 3));
      x[v] = i;  // upper halves are ignored by vpmuludq
      y[v] = _mm256_srli_epi64(i, 32);
      z[v] = z_init;
      w[v] = w_init;
    }
    std::uint32_t k0 = static_cast<std::uint32_t>(s.seed), k1 = static_cast<std::uint32_t>(s.seed >> 32);
    for (int round = 0; round < 10; ++round) {
      const __m256i vk0 = _mm256_set1_epi64x(k0), vk1 = _mm256_set1_epi64x(k1);
      for (unsigned v = 0; v < V; ++v) {
        const __m256i p0 = _mm256_mul_epu32(x[v], m0), p1 = _mm256_mul_epu32(z[v], m1);
        x[v] = _mm256_xor_si256(_mm256_srli_epi64(p1, 32), _mm256_xor_si256(y[v], vk0));
        z[v] = _mm256_xor_si256(_mm256_srli_epi64(p0, 32), _mm256_xor_si256(w[v], vk1));
        y[v] = p1;
        w[v] = p0;
      }
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    // Low words of 4 + 4 slots -> 8 consecutive words.
    for (unsigned v = 0; v < V; v += 2) {
      const __m256i* const words[4] = {x, y, z, w};
      for (unsigned k = 0; k < 4; ++k) {
        const __m256i pa = _mm256_permutevar8x32_epi32(words[k][v], pick);
        const __m256i pb = _mm256_permutevar8x32_epi32(words[k][v + 1], pick);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k * N + c + 4 * v),
                            _mm256_permute2x128_si256(pa, pb, 0x20));
      }
    }
  }
}
#endif

//! `N` consecutive Philox blocks, groups `first` .. `first + N - 1` of
//! `s`, written structure-of-arrays: word w of group `first + g` lands at
//! `out[N * w + g]`. The same bits as `N` calls of `philox_stream::operator()`
//! on every path (tested against it); on x86-64 hosts with AVX2 it takes the
//! vector path above, picked at run time.
template <unsigned N>
EBBFLOW_HD inline void philox_lanes(const philox_stream& s, std::uint64_t first, std::uint32_t* out) noexcept {
#if defined(EBBFLOW_DETAIL_PHILOX_AVX2) && !defined(__CUDA_ARCH__)
  if constexpr (N % 8 == 0) {
    if (__builtin_cpu_supports("avx2")) {
      philox_lanes_avx2<N>(s, first, out);
      return;
    }
  }
#endif
  for (unsigned g = 0; g < N; ++g) {
    const philox_u4 r = s(first + g);
    out[g] = r.x, out[N + g] = r.y, out[2 * N + g] = r.z, out[3 * N + g] = r.w;
  }
}

//! SplitMix64 finaliser: mixes rank/step/region into one well-spread stream id.
EBBFLOW_HD constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace compress::detail
EBBFLOW_END_NAMESPACE

#undef EBBFLOW_DETAIL_PHILOX_AVX2
