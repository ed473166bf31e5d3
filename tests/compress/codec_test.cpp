// SPDX-License-Identifier: Apache-2.0
// CPU tests of the codecs: bit-exactness of the casts, their block scales, error bounds,
// unbiasedness of stochastic rounding, error feedback, top-k selection,
// PowerSGD reconstruction and convergence. All random inputs use fixed seeds.
#include <ebbflow/compress.hpp>
#include <ebbflow/compress/detail/philox.hpp>
#include <ebbflow/core/half.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <type_traits>
#include <vector>

namespace ef = ebbflow;
namespace cx = ebbflow::compress;

namespace {
std::vector<float> normal_vec(std::size_t n, unsigned seed, float mean = 0.0f, float sd = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(mean, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
template <class C>
std::vector<std::byte> encode(const C& c, const std::vector<float>& in, float* res, cx::encode_context ctx = {}) {
  std::vector<std::byte> out(c.max_encoded_bytes(in.size()));
  std::vector<std::byte> ws(c.workspace_bytes(in.size()) + 8);
  ctx.workspace = ws.data();
  ef::exec::cpu_executor ex;
  c.encode(ex, in.data(), res, out.data(), in.size(), ctx);
  return out;
}
template <class C>
std::vector<float> decode(const C& c, const std::vector<std::byte>& e, std::size_t n) {
  std::vector<float> out(n, 123.0f);
  ef::exec::cpu_executor ex;
  c.decode(ex, e.data(), out.data(), n);
  return out;
}
//! `v` encoded (no residual) and decoded again.
template <class C>
std::vector<float> round_trip(const C& c, const std::vector<float>& v, cx::encode_context ctx = {}) {
  return decode(c, encode(c, v, nullptr, ctx), v.size());
}
}  // namespace

// The typed suites: cast codecs, quantisers, every flat codec.
template <class C>
class CastRoundTrip : public ::testing::Test {};
template <class C>
class QuantizeTest : public ::testing::Test {};
template <class C>
class ErrorFeedback : public ::testing::Test {};
using CastCodecs = ::testing::Types<cx::fp16_codec, cx::bf16_codec>;
using QuantCodecs = ::testing::Types<cx::int8_codec, cx::int4_codec>;
using AllFlat =
    ::testing::Types<cx::fp16_codec, cx::bf16_codec, cx::int8_codec, cx::int4_codec, cx::sign_codec, cx::topk_codec>;
TYPED_TEST_SUITE(CastRoundTrip, CastCodecs);
TYPED_TEST_SUITE(QuantizeTest, QuantCodecs);
TYPED_TEST_SUITE(ErrorFeedback, AllFlat);

TEST(Philox, MatchesRandom123KnownAnswers) {
  using cx::detail::philox4x32_10;
  auto a = philox4x32_10({0, 0, 0, 0}, 0, 0);
  EXPECT_EQ(a.x, 0x6627e8d5u);
  EXPECT_EQ(a.y, 0xe169c58du);
  EXPECT_EQ(a.z, 0xbc57ac4cu);
  EXPECT_EQ(a.w, 0x9b00dbd8u);
  auto b = philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, 0xffffffffu, 0xffffffffu);
  EXPECT_EQ(b.x, 0x408f276du);
  EXPECT_EQ(b.y, 0x41c83b0eu);
  EXPECT_EQ(b.z, 0xa20bc7c6u);
  EXPECT_EQ(b.w, 0x6d5451fdu);
  auto c = philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, 0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(c.x, 0xd16cfe09u);
  EXPECT_EQ(c.y, 0x94fdccebu);
  EXPECT_EQ(c.z, 0x5001e420u);
  EXPECT_EQ(c.w, 0x24126ea1u);
}

TEST(Cast, Fp16AndBf16BitsMatchCoreTypesOverASweepOfFloats) {
  // Every 2^32 / 40503 th bit pattern (all exponents, signs, NaN, inf).
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 40503) {
    const float f = cx::detail::as_f32(static_cast<std::uint32_t>(u));
    ASSERT_EQ(cx::detail::f32_to_f16(f), ef::half::from_float(f)) << std::hex << u;
    ASSERT_EQ(cx::detail::f32_to_bf16(f), ef::bfloat16::from_float(f)) << std::hex << u;
  }
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const float a = cx::detail::f16_to_f32(static_cast<std::uint16_t>(h));
    const float b = ef::half::to_float(static_cast<std::uint16_t>(h));
    ASSERT_EQ(cx::detail::as_u32(a), cx::detail::as_u32(b)) << h;
  }
}

TYPED_TEST(CastRoundTrip, RelativeErrorWithinUnitRoundoff) {
  TypeParam c;
  for (std::size_t n : {0u, 1u, 255u, 256u, 257u, 10007u}) {
    auto v = normal_vec(n, 7);
    auto d = round_trip(c, v);
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_LE(std::fabs(d[i] - v[i]), TypeParam::unit_roundoff * std::fabs(v[i])) << i;
  }
}

TYPED_TEST(QuantizeTest, ErrorBelowOneStepPerBlock) {
  TypeParam c;
  for (std::size_t n : {1u, 7u, 255u, 256u, 257u, 1000u, 10007u}) {
    auto v = normal_vec(n, 11, 0.3f, 2.0f);
    auto d = round_trip(c, v, {1, 2});
    for (std::size_t b = 0; b * 256 < n; ++b) {
      float amax = 0;
      for (std::size_t i = b * 256; i < std::min(n, b * 256 + 256); ++i) amax = std::max(amax, std::fabs(v[i]));
      const float step = amax / TypeParam::levels;
      for (std::size_t i = b * 256; i < std::min(n, b * 256 + 256); ++i)
        ASSERT_LT(std::fabs(d[i] - v[i]), step * 1.0001f) << "n=" << n << " i=" << i;
    }
  }
}

// A block whose max |v| is so small that L / max overflows (below about
// 4e-37 for int8): still within one step with the sign kept (every element
// decoded as -max before, through an undefined float-to-int conversion).
TYPED_TEST(QuantizeTest, TinyBlocksKeepTheirSignsAndTheErrorBound) {
  TypeParam c;
  for (const float amax : {1e-37f, 1e-38f, 2e-39f, 1e-30f}) {
    const std::vector<float> v{amax, 0.0f, -0.5f * amax, -amax, 0.25f * amax};
    const auto d = round_trip(c, v, {1, 2});
    for (std::size_t i = 0; i < v.size(); ++i) {
      ASSERT_LE(std::fabs(d[i] - v[i]), amax / TypeParam::levels * 1.0001f + 4e-45f) << amax << " i=" << i;
      if (v[i] != 0) {
        ASSERT_EQ(v[i] > 0, d[i] > 0) << amax << " i=" << i;
      }
    }
  }
}

// Non-finite inputs give non-finite outputs, infinities with their sign; a
// residual never becomes non-finite, so the next finite step is exact again.
TYPED_TEST(QuantizeTest, NonFiniteBlocksDecodeNonFiniteAndLeaveAFiniteResidual) {
  TypeParam c;
  const float inf = std::numeric_limits<float>::infinity();
  for (const std::vector<float>& v : {std::vector<float>{1.0f, inf, -inf}, std::vector<float>{1.0f, std::nanf("")}}) {
    std::vector<float> res(v.size(), 0.0f);
    const auto d = decode(c, encode(c, v, res.data(), {1, 2}), v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      ASSERT_FALSE(std::isfinite(d[i])) << i;
      if (std::isinf(v[i])) {
        ASSERT_EQ(d[i], v[i]) << i;
      }
      ASSERT_TRUE(std::isfinite(res[i])) << i;
    }
    const std::vector<float> w(v.size(), 0.5f);
    const auto e = decode(c, encode(c, w, res.data(), {1, 3}), v.size());
    for (std::size_t i = 0; i < v.size(); ++i) ASSERT_TRUE(std::isfinite(e[i])) << i;
  }
}

TYPED_TEST(QuantizeTest, SameSeedSameBitsOtherStreamOtherBits) {
  TypeParam c;
  auto v = normal_vec(1000, 3);
  EXPECT_EQ(encode(c, v, nullptr, {5, 9}), encode(c, v, nullptr, {5, 9}));
  EXPECT_NE(encode(c, v, nullptr, {5, 9}), encode(c, v, nullptr, {5, 10}));
}

// The SIMD host path (SoA Philox lanes, target clones) must give the bits of
// the plain scalar recipe: one Philox4x32-10 call per 8 elements, element j
// of a block taking half j / 128 of word (j % 128) / 32 of group j % 32.
// The reference is written from the spec in kernels/quantize.hpp, at the
// baseline ISA; it also pins the bits the CUDA executor must reproduce.
template <int Bits>
std::vector<std::byte> reference_encode(const std::vector<float>& in, std::vector<float>* res,
                                        cx::detail::philox_stream rng) {
  constexpr int L = Bits == 8 ? 127 : 7;
  const std::size_t n = in.size(), nb = (n + 255) / 256;
  std::vector<std::byte> out(cx::quantize_codec<Bits>{}.max_encoded_bytes(n), std::byte{0});
  auto* codes = reinterpret_cast<std::uint8_t*>(out.data()) + 4 * nb;
  for (std::size_t b = 0; b < nb; ++b) {
    const std::size_t o = 256 * b, cnt = std::min<std::size_t>(256, n - o);
    std::vector<float> v(cnt);
    float amax = 0.0f;
    for (std::size_t j = 0; j < cnt; ++j) {
      v[j] = res ? in[o + j] + (*res)[o + j] : in[o + j];
      amax = std::max(amax, std::fabs(v[j]));
    }
    const float scale = amax / static_cast<float>(L), inv = amax > 0.0f ? static_cast<float>(L) / amax : 0.0f;
    std::memcpy(out.data() + 4 * b, &scale, 4);
    std::vector<int> q(256, 0);
    for (std::size_t j = 0; j < cnt; ++j) {
      const auto r = rng(o / 8 + j % 32);
      const std::uint32_t words[4] = {r.x, r.y, r.z, r.w};
      const std::uint32_t bits = (words[(j % 128) / 32] >> (16 * (j / 128))) & 0xFFFFu;
      const float u = (static_cast<float>(bits) + 0.5f) * (1.0f / 65536.0f);
      const float t = v[j] * inv;
      q[j] = std::clamp(static_cast<int>(std::floor(t + u)), -L, L);
      if (res) (*res)[o + j] = v[j] - static_cast<float>(q[j]) * scale;
    }
    std::uint8_t* pc = codes + b * (Bits == 8 ? 256 : 128);
    if constexpr (Bits == 8)
      for (std::size_t j = 0; j < cnt; ++j) pc[j] = static_cast<std::uint8_t>(q[j]);
    else
      for (std::size_t j = 0; j < (cnt + 1) / 2; ++j)
        pc[j] = static_cast<std::uint8_t>((q[2 * j] + 8) | ((q[2 * j + 1] + 8) << 4));
  }
  return out;
}

TYPED_TEST(QuantizeTest, BitIdenticalToScalarReference) {
  TypeParam c;
  constexpr int bits = TypeParam::levels == 127 ? 8 : 4;
  for (std::size_t n : {1u, 7u, 255u, 256u, 257u, 1000u, 10007u})
    for (bool ef : {false, true}) {
      const auto v = normal_vec(n, 31, 0.1f, 3.0f);
      std::vector<float> res = normal_vec(n, 32, 0.0f, 0.05f), res_ref = res;
      const cx::encode_context ctx{0x0123456789abcdefull, 0xfedcba9876543210ull + n};
      const auto got = encode(c, v, ef ? res.data() : nullptr, ctx);
      const auto want = reference_encode<bits>(v, ef ? &res_ref : nullptr, {ctx.seed, ctx.stream});
      ASSERT_EQ(got, want) << "n=" << n << " ef=" << ef;
      if (ef) {
        ASSERT_EQ(res, res_ref) << "n=" << n;
      }
    }
}

TEST(Philox, LanesMatchScalarStream) {
  const cx::detail::philox_stream s{0x9e3779b97f4a7c15ull, 0x5555aaaa0f0f1234ull};
  // Groups straddling the 2^32 boundary exercise the counter's upper word.
  for (std::uint64_t first : {std::uint64_t{0}, std::uint64_t{32} * 12345, (std::uint64_t{1} << 32) - 16}) {
    std::uint32_t lanes[4 * 32];
    cx::detail::philox_lanes<32>(s, first, lanes);
    for (unsigned g = 0; g < 32; ++g) {
      const auto r = s(first + g);
      ASSERT_EQ(lanes[g], r.x) << first + g;
      ASSERT_EQ(lanes[32 + g], r.y) << first + g;
      ASSERT_EQ(lanes[64 + g], r.z) << first + g;
      ASSERT_EQ(lanes[96 + g], r.w) << first + g;
    }
    std::uint32_t few[4 * 8], odd[4 * 3];  // 8: AVX2 path with 2 vectors per word; 3: portable loop
    cx::detail::philox_lanes<8>(s, first, few);
    cx::detail::philox_lanes<3>(s, first, odd);
    for (unsigned w = 0; w < 4; ++w) {
      for (unsigned g = 0; g < 8; ++g) ASSERT_EQ(few[8 * w + g], lanes[32 * w + g]);
      for (unsigned g = 0; g < 3; ++g) ASSERT_EQ(odd[3 * w + g], lanes[32 * w + g]);
    }
  }
}

// Unbiasedness: over T independent streams, the mean decode of each element
// has standard deviation <= step / (2 sqrt(T)) (a rounding is a Bernoulli
// over one step). We require |mean - v| <= 5 sd for each of 512 elements: a
// correct codec fails this with probability < 512 * 5.7e-7 = 3e-4 (99.97 %
// confidence), while a biased rounding (round-to-nearest or floor) fails by
// hundreds of sd. The seed is fixed, so the test is deterministic.
TYPED_TEST(QuantizeTest, StochasticRoundingIsUnbiased) {
  TypeParam c;
  const std::size_t n = 512, T = 4000;
  auto v = normal_vec(n, 21);
  std::vector<double> mean(n, 0.0);
  for (std::size_t t = 0; t < T; ++t) {
    auto d = decode(c, encode(c, v, nullptr, {77, t}), n);
    for (std::size_t i = 0; i < n; ++i) mean[i] += d[i];
  }
  std::size_t nonzero_err = 0;
  for (std::size_t b = 0; b < n / 256; ++b) {
    float amax = 0;
    for (std::size_t i = b * 256; i < b * 256 + 256; ++i) amax = std::max(amax, std::fabs(v[i]));
    const double step = amax / TypeParam::levels, sd = step / (2.0 * std::sqrt(double(T)));
    for (std::size_t i = b * 256; i < b * 256 + 256; ++i) {
      const double m = mean[i] / T;
      ASSERT_LE(std::fabs(m - v[i]), 5 * sd) << "element " << i << " v=" << v[i];
      nonzero_err += std::fabs(m - v[i]) > 0;
    }
  }
  EXPECT_GT(nonzero_err, n / 2);  // it really is random (not an exact code)
}

// Error feedback: with residual e, sum_t decode_t = sum_t g_t - e_T exactly
// (up to float rounding of the accumulations), and e_T stays bounded, so the
// relative gap shrinks like 1/T when the gradients have a persistent mean.
template <class C>
double ef_gap(const C& c, std::size_t n, std::size_t steps, double* identity_err) {
  std::vector<float> res(n, 0.0f);
  std::vector<double> sum_g(n, 0.0), sum_d(n, 0.0);
  for (std::size_t t = 0; t < steps; ++t) {
    auto g = normal_vec(n, 1000 + static_cast<unsigned>(t), 0.05f, 1.0f);
    auto d = decode(c, encode(c, g, res.data(), {3, t}), n);
    for (std::size_t i = 0; i < n; ++i) sum_g[i] += g[i], sum_d[i] += d[i];
  }
  double num = 0, den = 0, id = 0;
  for (std::size_t i = 0; i < n; ++i) {
    num += (sum_d[i] - sum_g[i]) * (sum_d[i] - sum_g[i]);
    den += sum_g[i] * sum_g[i];
    id = std::max(id, std::fabs(sum_d[i] + res[i] - sum_g[i]));
  }
  *identity_err = id;
  return std::sqrt(num / den);
}

TYPED_TEST(ErrorFeedback, DecodedSumTracksGradientSum) {
  TypeParam c;
  double id = 0;
  const double gap_short = ef_gap(c, 4099, 20, &id);
  EXPECT_LT(id, 1e-3);  // sum d + e_T == sum g: nothing is lost
  const double gap_long = ef_gap(c, 4099, 400, &id);
  EXPECT_LT(id, 1e-2);
  // Residual bounded -> relative gap falls with T (top-k 1 %: the residual
  // holds ~100 steps of a coordinate, so it needs the long horizon most).
  EXPECT_LT(gap_long, 0.25) << c.name();
  EXPECT_LT(gap_long, gap_short + 1e-6) << c.name();
}

TEST(TopK, KeepsTheKLargestWithinSamplingTolerance) {
  for (double ratio : {0.01, 0.05}) {
    cx::topk_codec c(ratio);
    const std::size_t n = 200003;
    auto v = normal_vec(n, 5);
    auto e = encode(c, v, nullptr, {9, 1});
    const auto* h = reinterpret_cast<const std::uint32_t*>(e.data());
    const std::size_t k = c.slots(n), count = h[0];
    ASSERT_LE(count, k);
    EXPECT_GE(count, k * 85 / 100);  // the sampled threshold lands near the k-th largest
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::nth_element(order.begin(), order.begin() + static_cast<long>(k), order.end(),
                     [&](auto a, auto b) { return std::fabs(v[a]) > std::fabs(v[b]); });
    std::vector<bool> top(n, false);
    for (std::size_t i = 0; i < k; ++i) top[order[i]] = true;
    std::size_t hits = 0;
    for (std::size_t s = 0; s < count; ++s) {
      const std::uint32_t idx = h[2 + s];
      ASSERT_LT(idx, n);
      ASSERT_EQ(cx::detail::as_f32(h[2 + k + s]), v[idx]);  // values sent exactly
      hits += top[idx];
    }
    // With 16384 samples the k-th-largest estimate is within ~3 sd = 3/sqrt(s k/n)
    // relative (23 % at 1 %): at least 80 % of the true top k must be sent.
    EXPECT_GE(hits, k * 80 / 100) << "ratio " << ratio << " count " << count;
  }
}

// The single-thread CPU executor encodes top-k in one fused in-order pass
// (topk_select_inorder); a 2-thread executor takes the count / scan / write
// path that the GPU uses. Both must give the same encoding and residual,
// including when more than k elements pass the threshold (the cap), with
// zeros in the input (never sent), and for short tail blocks.
TEST(TopK, FusedInOrderPassMatchesCountScanWrite) {
  const auto run = [](const cx::topk_codec& c, const std::vector<float>& v, std::vector<float>* res, unsigned threads) {
    std::vector<std::byte> out(c.max_encoded_bytes(v.size()), std::byte{0x5a});
    std::vector<std::byte> ws(c.workspace_bytes(v.size()) + 8);
    ef::exec::cpu_executor ex(threads);
    c.encode(ex, v.data(), res ? res->data() : nullptr, out.data(), v.size(), {3, 4, ws.data()});
    return out;
  };
  std::size_t capped = 0;
  // 65536 elements make one scan group of 256 blocks: 300007 spans five
  // groups, the last one partial.
  for (std::size_t n : {1u, 7u, 255u, 256u, 257u, 1000u, 10007u, 65536u, 65537u, 100003u, 300007u})
    for (int kind = 0; kind < 3; ++kind)
      for (double ratio : {0.01, 0.2})
        for (bool ef : {false, true}) {
          auto v = normal_vec(n, 41 + static_cast<unsigned>(n));
          if (kind == 1)  // ties: every magnitude passes, the k cap decides
            for (std::size_t i = 0; i < n; ++i) v[i] = i % 3 == 0 ? -1.5f : 1.5f;
          if (kind == 2)  // mostly zeros
            for (std::size_t i = 0; i < n; ++i)
              if (i % 5 != 0) v[i] = 0.0f;
          const cx::topk_codec c(ratio, 64);
          std::vector<float> r1 = normal_vec(n, 43, 0.0f, 0.1f), r2 = r1;
          const auto fused = run(c, v, ef ? &r1 : nullptr, 1);
          const auto generic = run(c, v, ef ? &r2 : nullptr, 2);
          ASSERT_EQ(fused, generic) << "n=" << n << " kind=" << kind << " ratio=" << ratio << " ef=" << ef;
          if (ef) {
            ASSERT_EQ(r1, r2) << "n=" << n << " kind=" << kind;
          }
          capped += reinterpret_cast<const std::uint32_t*>(fused.data())[0] == c.slots(n) && kind == 1;
        }
  EXPECT_GT(capped, 0u);  // the cap really was exercised
}

// decode_sum (tiled on the single-thread CPU executor) must give the bits of
// decode(e0) + decode_add(e1) + ... in that order. The encodings overlap
// heavily (ratio 0.3 of inputs with very different scales), so adding them
// in another order would round differently.
TEST(TopK, DecodeSumMatchesDecodeThenDecodeAddInOrder) {
  const cx::topk_codec c(0.3, 256);
  for (std::size_t n : {1u, 300u, 4095u, 4096u, 4097u, 10007u, 70001u})
    for (std::size_t count : {1u, 2u, 5u}) {
      std::vector<std::vector<std::byte>> enc;
      std::vector<const std::byte*> ptrs;
      for (std::size_t e = 0; e < count; ++e) {
        const float scale = e % 2 == 0 ? 1.0f : 3.0e-4f;
        enc.push_back(encode(c, normal_vec(n, 60 + static_cast<unsigned>(e), 0.0f, scale), nullptr,
                             {7, static_cast<std::uint64_t>(e)}));
      }
      for (const auto& e : enc) ptrs.push_back(e.data());
      ef::exec::cpu_executor one, two(2);
      std::vector<float> want(n, 5.0f), tiled(n, 7.0f), generic(n, 9.0f);
      c.decode(one, ptrs[0], want.data(), n);
      for (std::size_t e = 1; e < count; ++e) c.decode_add(one, ptrs[e], want.data(), n);
      c.decode_sum(one, ptrs.data(), count, tiled.data(), n);
      c.decode_sum(two, ptrs.data(), count, generic.data(), n);
      ASSERT_EQ(tiled, want) << "n=" << n << " count=" << count;
      ASSERT_EQ(generic, want) << "n=" << n << " count=" << count;
    }
}

// Block floating point: each block of 256 has its own power-of-two scale,
// so values far beyond fp16's 65504 (they encoded as inf) and far below its
// normal range (6.1e-5) keep the format's relative error, the residual is
// exact and unscaled, and the scale is exact: values in the format's normal
// range with and without it decode to the plain cast's bits.
TYPED_TEST(CastRoundTrip, EachBlockIsScaledToTheFormatsRange) {
  const TypeParam c;
  for (const float mag : {1e-38f, 1e-20f, 1e-7f, 1.0f, 6e4f, 1e20f, 3e38f})
    for (std::size_t n : {1u, 255u, 257u, 4099u}) {
      auto v = normal_vec(n, 9);
      for (auto& x : v) x = std::clamp(x, -3.0f, 3.0f) * (mag / 3);
      std::vector<float> res(n, 0.0f);
      const auto d = decode(c, encode(c, v, res.data()), n);
      for (std::size_t i = 0; i < n; ++i) {
        // Within 2^-28 of the block's largest (at most mag): the relative
        // bound; below, fp16's subnormals: at most 2^-39 of that largest.
        const float floor = mag * 0x1p-39f;
        ASSERT_LE(std::fabs(d[i] - v[i]), TypeParam::unit_roundoff * std::fabs(v[i]) + floor)
            << mag << " n=" << n << " i=" << i;
        ASSERT_EQ(res[i], v[i] - d[i]) << mag << " i=" << i;
      }
    }
  // Normal range (fp16: 2^-14 to 65504) with and without the scale: the plain cast's value.
  auto v = normal_vec(1000, 3);
  for (auto& x : v) x = std::clamp(std::fabs(x), 0.05f, 3.0f) * (x < 0 ? -1.0f : 1.0f);
  const auto d = round_trip(c, v);
  for (std::size_t i = 0; i < v.size(); ++i) {
    const float plain = std::is_same_v<TypeParam, cx::fp16_codec>
                            ? ef::half::to_float(ef::half::from_float(v[i]))
                            : ef::bfloat16::to_float(ef::bfloat16::from_float(v[i]));
    ASSERT_EQ(d[i], plain) << i;
  }
}

// fp16 before block scaling guaranteed 2^-11 for every value in its normal
// range, 2^-14 to 65504. That still holds, bit for bit: a block whose
// largest |value| is in fp16's range is scaled by 2^e >= 1 (e = 0 from
// 2^15 up to 65504, and for values that round to 65504), so each of its
// values in the normal range decodes to the plain cast's value, whatever
// else the block holds.
TEST(Fp16Codec, BlocksWithinItsRangeKeepThePlainCastOfEveryNormalValue) {
  const cx::fp16_codec c;
  for (const float top : {65504.0f, 65519.0f, 60000.0f, 32768.0f, 32767.0f, 1.0f, 0x1p-14f}) {
    std::vector<float> v(512);
    for (std::size_t i = 0; i < v.size(); ++i)  // 2^-14 .. top, both signs, spread over the binades
      v[i] = std::clamp(top * std::ldexp(1.0f - static_cast<float>(i % 7) / 16, -static_cast<int>(i % 31)), 0x1p-14f,
                        top) *
             (i % 2 ? -1.0f : 1.0f);
    v[0] = top, v[300] = -top;
    const auto d = round_trip(c, v);
    for (std::size_t i = 0; i < v.size(); ++i) {
      ASSERT_EQ(d[i], ef::half::to_float(ef::half::from_float(v[i]))) << top << " i=" << i << " v=" << v[i];
    }
  }
}

// A block's inf or NaN passes as itself and does not change the scale of
// the block's finite values; the residual stays finite.
TYPED_TEST(CastRoundTrip, NonFiniteValuesPassAndLeaveAFiniteResidual) {
  const TypeParam c;
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> v{1.0f, inf, -inf, std::nanf(""), 1e30f, -2.5f};
  std::vector<float> res(v.size(), 0.0f);
  const auto d = decode(c, encode(c, v, res.data()), v.size());
  EXPECT_EQ(d[1], inf);
  EXPECT_EQ(d[2], -inf);
  EXPECT_TRUE(std::isnan(d[3]));
  EXPECT_NEAR(d[4], 1e30f, 1e30f * TypeParam::unit_roundoff);
  for (const float x : res) EXPECT_TRUE(std::isfinite(x));
}

// The ring's hop: decode(in) + own + residual, encoded, equals decoding,
// adding and encoding in float where nothing overflows, and where the
// running sum is beyond float's range on the way (2e38 + 2e38 - 3e38) it
// stays finite: the sum is never unscaled.
TYPED_TEST(CastRoundTrip, DecodeAddEncodeNeverUnscalesTheRunningSum) {
  const TypeParam c;
  ef::exec::cpu_executor ex;
  const std::size_t n = 700;
  for (const float mag : {1.0f, 1e-30f, 1e30f}) {
    auto run = normal_vec(n, 21), own = normal_vec(n, 22), r0 = normal_vec(n, 23);
    for (std::size_t i = 0; i < n; ++i) run[i] *= mag, own[i] *= mag * (i % 300 ? 1.0f : 1e3f), r0[i] *= mag / 4096;
    const auto in = encode(c, run, nullptr);
    std::vector<float> res = r0;
    std::vector<std::byte> out(c.max_encoded_bytes(n));
    const auto own_before = own;
    c.decode_add_encode(ex, in.data(), own.data(), res.data(), out.data(), n);
    ASSERT_EQ(own, own_before);
    const auto d = decode(c, out, n), dec_in = decode(c, in, n);
    for (std::size_t i = 0; i < n; ++i) {
      const double want = double(dec_in[i]) + own[i] + r0[i];
      const double mags = std::fabs(dec_in[i]) + std::fabs(own[i]) + std::fabs(r0[i]);  // float roundings of the adds
      ASSERT_LE(std::fabs(d[i] - want), 2 * TypeParam::unit_roundoff * std::fabs(want) + mags * 1e-6 + mag * 1e-8)
          << mag << " " << i;
      ASSERT_NEAR(d[i] + res[i], want, mags * 1e-6 + mag * 1e-9) << mag << " " << i;  // error feedback
    }
  }
  std::vector<float> run(300, 2e38f), own(300, 2e38f), res(300, 0.0f);
  std::vector<std::byte> out(c.max_encoded_bytes(300)), out2(c.max_encoded_bytes(300));
  c.decode_add_encode(ex, encode(c, run, nullptr).data(), own.data(), res.data(), out.data(), 300);  // 4e38
  std::vector<float> minus(300, -3e38f);
  c.decode_add_encode(ex, out.data(), minus.data(), res.data(), out2.data(), 300);  // 1e38
  for (const float x : decode(c, out2, 300)) ASSERT_NEAR(x, 1e38f, 1e38f * 3 * TypeParam::unit_roundoff);
  for (const float x : decode(c, out, 300)) ASSERT_TRUE(std::isinf(x));  // 4e38 itself is beyond float
  EXPECT_EQ(c.saturated(out.data(), decode(c, out, 300).data(), 300), 300u);
  EXPECT_EQ(c.saturated(out2.data(), decode(c, out2, 300).data(), 300), 0u);
}

// NaN is sent (it decoded as 0 and stayed in the residual before).
TEST(TopK, NaNIsSentNotZeroed) {
  const cx::topk_codec c(0.5);
  const std::vector<float> v{std::nanf(""), 1.0f, 2.0f, 3.0f};
  std::vector<float> res(v.size(), 0.0f);
  const auto d = decode(c, encode(c, v, res.data()), v.size());
  EXPECT_TRUE(std::isnan(d[0]));
  EXPECT_EQ(res[0], 0.0f);
  for (std::size_t i = 1; i < v.size(); ++i) EXPECT_EQ(d[i] + res[i], v[i]) << i;  // sent or kept, never lost
}

// Finite inputs whose l1 sum overflows float keep a finite mean (they
// decoded as +-inf before, with an infinite residual).
TEST(Sign, AnOverflowingL1SumKeepsAFiniteScale) {
  cx::sign_codec c;
  const std::vector<float> v{3e38f, 3e38f, -1.0f};
  std::vector<float> res(v.size(), 0.0f);
  const auto d = decode(c, encode(c, v, res.data()), v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    ASSERT_TRUE(std::isfinite(d[i])) << i;
    ASSERT_EQ(d[i] > 0, v[i] > 0) << i;
    ASSERT_TRUE(std::isfinite(res[i])) << i;
  }
  EXPECT_NEAR(d[0], 2e38f, 1e33f);
}

TEST(Sign, DecodeKeepsSignAndBlockL1Norm) {
  cx::sign_codec c;
  const std::size_t n = 1000;
  auto v = normal_vec(n, 8);
  auto d = decode(c, encode(c, v, nullptr), n);
  for (std::size_t b = 0; b * 256 < n; ++b) {
    double l1v = 0, l1d = 0;
    for (std::size_t i = b * 256; i < std::min(n, b * 256 + 256); ++i) {
      l1v += std::fabs(v[i]), l1d += std::fabs(d[i]);
      ASSERT_EQ(v[i] >= 0, d[i] >= 0);
    }
    EXPECT_NEAR(l1v, l1d, 1e-3 * l1v);
  }
}

// The factors' columns scaled by powers of two to a largest |entry| in
// [1, 2): exact (the ratios stay), zero and non-finite columns untouched.
TEST(PowerSgd, NormalizeScalesEachColumnByAPowerOfTwo) {
  const float inf = std::numeric_limits<float>::infinity();
  // 3 rows x 5 columns, row-major.
  std::vector<float> f{3e-30f,  0.0f, 1e30f,  5.0f, 1e-44f,  //
                       -1e-30f, 0.0f, 3e37f,  inf,  3e-45f,  //
                       7e-31f,  0.0f, -2e36f, 1.0f, 0.0f};
  const auto before = f;
  ef::exec::cpu_executor ex;
  cx::powersgd_codec(5).normalize(ex, f.data(), 3, cx::matrix_shape{8, 8});  // rank 5
  for (std::size_t j : {0u, 2u, 4u}) {
    float amax = 0;
    for (std::size_t k = 0; k < 3; ++k) amax = std::max(amax, std::fabs(f[k * 5 + j]));
    EXPECT_GE(amax, j == 4 ? 0x1p-21f : 1.0f) << j;  // subnormals: up by 2^126 at most
    EXPECT_LT(amax, 2.0f) << j;
    const float ratio = f[j] / before[j];
    EXPECT_EQ(std::exp2(std::round(std::log2(ratio))), ratio) << j;
    for (std::size_t k = 0; k < 3; ++k)
      if (before[k * 5 + j] != 0) {
        EXPECT_EQ(f[k * 5 + j] / before[k * 5 + j], ratio) << j << " " << k;
      }
  }
  for (std::size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(f[k * 5 + 1], 0.0f);               // zero column
    EXPECT_EQ(f[k * 5 + 3], before[k * 5 + 3]);  // a column holding inf
  }
}

namespace {
// One PowerSGD step on one rank: out = P Q^T with P = orth(M Q), Q = M^T P.
std::vector<float> powersgd_step(const cx::powersgd_codec& c, const std::vector<float>& m, cx::matrix_shape s,
                                 std::vector<float>& q) {
  ef::exec::cpu_executor ex;
  const std::size_t r = c.rank_for(s);
  std::vector<float> p(s.rows * r), out(s.size());
  c.compute_p(ex, m.data(), q.data(), p.data(), s);
  c.orthogonalize(ex, p.data(), s);
  c.compute_q(ex, m.data(), p.data(), q.data(), s);
  c.reconstruct(ex, p.data(), q.data(), out.data(), s);
  return out;
}
}  // namespace

TEST(PowerSgd, OrthogonalisedColumnsAreOrthonormal) {
  cx::powersgd_codec c(6);
  const cx::matrix_shape s{300, 40};
  auto p = normal_vec(s.rows * 6, 4);
  ef::exec::cpu_executor ex;
  c.orthogonalize(ex, p.data(), s);
  for (std::size_t i = 0; i < 6; ++i)
    for (std::size_t j = 0; j < 6; ++j) {
      double d = 0;
      for (std::size_t k = 0; k < s.rows; ++k) d += double(p[k * 6 + i]) * p[k * 6 + j];
      EXPECT_NEAR(d, i == j ? 1.0 : 0.0, 1e-5);
    }
}

TEST(PowerSgd, ReconstructsLowRankMatricesExactly) {
  for (std::size_t rank_m : {1u, 2u, 4u}) {
    const cx::matrix_shape s{97, 61};
    auto a = normal_vec(s.rows * rank_m, 1), b = normal_vec(s.cols * rank_m, 2);
    std::vector<float> m(s.size(), 0.0f);
    for (std::size_t i = 0; i < s.rows; ++i)
      for (std::size_t j = 0; j < s.cols; ++j)
        for (std::size_t k = 0; k < rank_m; ++k) m[i * s.cols + j] += a[i * rank_m + k] * b[j * rank_m + k];
    cx::powersgd_codec c(4);
    std::vector<float> q(s.cols * 4);
    ef::exec::cpu_executor ex;
    c.init_q(ex, q.data(), s, 42);
    auto out = powersgd_step(c, m, s, q);
    double err = 0, norm = 0;
    for (std::size_t i = 0; i < m.size(); ++i) err += (out[i] - m[i]) * (out[i] - m[i]), norm += m[i] * m[i];
    EXPECT_LT(std::sqrt(err / norm), 1e-5) << "rank " << rank_m;
  }
}

TEST(PowerSgd, ErrorFeedbackConvergesOnFullRankMatrices) {
  // Feeding the same full-rank M every step with error feedback, the average
  // of the decoded updates converges to M (the residual stays bounded).
  const cx::matrix_shape s{64, 48};
  auto m = normal_vec(s.size(), 9);
  cx::powersgd_codec c(2);
  ef::exec::cpu_executor ex;
  std::vector<float> q(s.cols * 2), res(s.size(), 0.0f), acc(s.size(), 0.0f);
  c.init_q(ex, q.data(), s, 1);
  auto rel_gap = [&](std::size_t steps) {
    double e = 0, nn = 0;
    for (std::size_t i = 0; i < m.size(); ++i) {
      const double d = acc[i] / double(steps) - m[i];
      e += d * d, nn += double(m[i]) * m[i];
    }
    return std::sqrt(e / nn);
  };
  double gap10 = 0;
  for (std::size_t t = 1; t <= 400; ++t) {
    std::vector<float> mm(s.size());
    for (std::size_t i = 0; i < mm.size(); ++i) mm[i] = m[i] + res[i];
    const std::size_t r = c.rank_for(s);
    std::vector<float> p(s.rows * r), out(s.size());
    c.compute_p(ex, mm.data(), q.data(), p.data(), s);
    c.orthogonalize(ex, p.data(), s);
    c.compute_q(ex, mm.data(), p.data(), q.data(), s);
    c.residual(ex, mm.data(), p.data(), q.data(), res.data(), s);
    c.reconstruct(ex, p.data(), q.data(), out.data(), s);
    for (std::size_t i = 0; i < acc.size(); ++i) acc[i] += out[i];
    if (t == 10) gap10 = rel_gap(10);
  }
  const double gap400 = rel_gap(400);
  EXPECT_LT(gap400, 0.1);
  EXPECT_LT(gap400, gap10 / 4);
}
