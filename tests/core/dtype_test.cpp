// SPDX-License-Identifier: Apache-2.0
#include <ebbflow/core/dtype.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

namespace ef = ebbflow;

TEST(Dtype, SizesNamesAndParsing) {
  EXPECT_EQ(ef::size_of(ef::dtype::f32), 4u);
  EXPECT_EQ(ef::size_of(ef::dtype::bf16), 2u);
  EXPECT_EQ(ef::size_of(ef::dtype::i64), 8u);
  EXPECT_EQ(ef::size_of(ef::dtype::u8), 1u);
  for (auto t : ef::all_dtypes) {
    EXPECT_EQ(ef::parse_dtype(ef::name(t)), t);
    ef::visit_dtype(t, [&](auto v) { EXPECT_EQ(sizeof(v), ef::size_of(t)); });
  }
  for (auto op : ef::all_reduce_ops) EXPECT_EQ(ef::parse_reduce_op(ef::name(op)), op);
  EXPECT_FALSE(ef::parse_dtype("f8"));
  static_assert(ef::dtype_of_v<float> == ef::dtype::f32);
  static_assert(ef::dtype_of_v<const ef::bfloat16> == ef::dtype::bf16);
}

// The compiler's _Float16 (GCC 12, x86-64) is the independent reference for
// binary16 rounding.
TEST(Half, EveryHalfRoundTripsAndMatchesCompilerConversion) {
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const float f = ef::half::to_float(static_cast<std::uint16_t>(b));
    _Float16 ref;
    std::uint16_t rb = static_cast<std::uint16_t>(b);
    std::memcpy(&ref, &rb, 2);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(static_cast<float>(ref)));
      continue;
    }
    ASSERT_EQ(f, static_cast<float>(ref)) << b;
    ASSERT_EQ(ef::half::from_float(f), b) << b;
  }
}

TEST(Half, RandomFloatsRoundLikeTheCompiler) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 2'000'000; ++i) {
    std::uint32_t u = bits(rng);
    // Concentrate on the representable range and the subnormal boundary.
    if (i % 2) u = (u & 0x807fffffu) | ((0x60u + (u >> 24) % 0x30u) << 23);
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    const _Float16 ref = static_cast<_Float16>(f);
    std::uint16_t rb;
    std::memcpy(&rb, &ref, 2);
    ASSERT_EQ(ef::half::from_float(f), rb) << std::hexfloat << f;
  }
}

TEST(BFloat16, RoundsToNearestEven) {
  EXPECT_EQ(ef::bfloat16::from_float(1.0f), 0x3f80);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(ef::bfloat16::from_float(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(ef::bfloat16::from_float(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
  EXPECT_EQ(ef::bfloat16::to_float(0x4049), 3.140625f);
  EXPECT_TRUE(std::isnan(ef::bfloat16::to_float(ef::bfloat16::from_float(NAN))));
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const float f = ef::bfloat16::to_float(static_cast<std::uint16_t>(b));
    if (!std::isnan(f)) {
      ASSERT_EQ(ef::bfloat16::from_float(f), b);
    }
  }
}
