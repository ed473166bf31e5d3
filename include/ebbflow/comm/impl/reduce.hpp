// SPDX-License-Identifier: Apache-2.0
//! @file impl/reduce.hpp
//! Definitions for comm/reduce.hpp. Every kernel works on 16-byte vectors
//! (GCC/Clang vector extensions: the SSE2 / NEON width, so no ABI
//! warning without -mavx) in blocks of four vectors, then a scalar tail. Loads and stores go through
//! memcpy, so no alignment is assumed; a whole block is loaded before it is
//! stored, which keeps `dst == a` (in-place) correct.
#pragma once

#include <ebbflow/comm/reduce.hpp>
#include <ebbflow/core/half.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

EBBFLOW_BEGIN_NAMESPACE
namespace comm::detail {

//! The 16-byte GCC vector of `T` lanes (typedef form: an alias declaration
//! would drop the attribute on a dependent type).
template <class T>
struct vec_of {
  typedef T type __attribute__((vector_size(16)));
};
using v_f32 = vec_of<float>::type;
using v_u32 = vec_of<std::uint32_t>::type;
using v4_u16 = std::uint16_t __attribute__((vector_size(8)));

struct op_sum {
  template <class V>
  static V apply(V a, V b) noexcept {
    return a + b;
  }
};
struct op_prod {
  template <class V>
  static V apply(V a, V b) noexcept {
    return a * b;
  }
};
//! Whether V is a GCC vector of floating-point lanes.
template <class V>
constexpr bool is_float_vector() noexcept {
  if constexpr (requires(V v) { v[0]; })
    return std::is_floating_point_v<std::remove_cvref_t<decltype(std::declval<V>()[0])>>;
  else
    return false;
}

//! min and max must not depend on the order of their operands: each rank
//! combines its own value first, so an asymmetric rule would give ranks
//! different bits. Floating point follows IEEE 754-2019 minimum/maximum: a
//! NaN operand gives the canonical quiet NaN, and -0 is below +0.
template <bool Max>
struct op_minmax {
  template <class V>
  static V apply(V a, V b) noexcept {
    if constexpr (std::is_floating_point_v<V>) {
      if (a != a || b != b) return std::numeric_limits<V>::quiet_NaN();
      if (a == b) return std::signbit(a) == Max ? b : a;  // equal, or +0 and -0
      return (Max ? a < b : b < a) ? b : a;
    } else if constexpr (is_float_vector<V>()) {
      using T = std::remove_cvref_t<decltype(a[0])>;
      using M = decltype(a < b);  // the signed integer vector of V's shape
      const V picked = (Max ? a < b : b < a) ? b : a;
      M pb, ab, bb;
      std::memcpy(&pb, &picked, sizeof pb);
      std::memcpy(&ab, &a, sizeof ab);
      std::memcpy(&bb, &b, sizeof bb);
      // Equal lanes (+0 and -0 among them): -0 wins the min, +0 the max.
      pb = a == b ? (Max ? ab & bb : ab | bb) : pb;
      const V quiet = V{} + std::numeric_limits<T>::quiet_NaN();
      M qb;
      std::memcpy(&qb, &quiet, sizeof qb);
      pb = (a != a) | (b != b) ? qb : pb;
      V r;
      std::memcpy(&r, &pb, sizeof r);
      return r;
    } else {
      return (Max ? a < b : b < a) ? b : a;
    }
  }
};
using op_min = op_minmax<false>;
using op_max = op_minmax<true>;

template <class V>
inline V load(const void* p) noexcept {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class V>
inline void store(void* p, const V& v) noexcept {
  std::memcpy(p, &v, sizeof v);
}

//! Native types: four vectors per block, then scalars.
template <class T, class Op>
inline void reduce_native(T* dst, const T* a, const T* __restrict b, std::size_t n) noexcept {
  using V = typename vec_of<T>::type;
  constexpr std::size_t lanes = sizeof(V) / sizeof(T);
  std::size_t i = 0;
  for (; i + 4 * lanes <= n; i += 4 * lanes) {
    const V a0 = load<V>(a + i), a1 = load<V>(a + i + lanes), a2 = load<V>(a + i + 2 * lanes),
            a3 = load<V>(a + i + 3 * lanes);
    const V b0 = load<V>(b + i), b1 = load<V>(b + i + lanes), b2 = load<V>(b + i + 2 * lanes),
            b3 = load<V>(b + i + 3 * lanes);
    store(dst + i, Op::apply(a0, b0));
    store(dst + i + lanes, Op::apply(a1, b1));
    store(dst + i + 2 * lanes, Op::apply(a2, b2));
    store(dst + i + 3 * lanes, Op::apply(a3, b3));
  }
  for (; i < n; ++i) dst[i] = Op::apply(a[i], b[i]);
}

//! bfloat16: widen 4 lanes to f32 by a shift, combine, round to nearest even
//! (NaN stays a quiet NaN, as `bfloat16::from_float`).
template <class Op>
inline void reduce_bf16(std::uint16_t* dst, const std::uint16_t* a, const std::uint16_t* __restrict b,
                        std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const v_u32 wa = __builtin_convertvector(load<v4_u16>(a + i), v_u32) << 16;
    const v_u32 wb = __builtin_convertvector(load<v4_u16>(b + i), v_u32) << 16;
    v_f32 fa, fb;
    std::memcpy(&fa, &wa, sizeof fa);
    std::memcpy(&fb, &wb, sizeof fb);
    const v_f32 fr = Op::apply(fa, fb);
    v_u32 x;
    std::memcpy(&x, &fr, sizeof x);
    const v_u32 rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    const v_u32 nan = (x >> 16) | 0x40u;
    const v_u32 r = (x & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
    store(dst + i, __builtin_convertvector(r, v4_u16));
  }
  for (; i < n; ++i) {
    const float r = Op::apply(bfloat16::to_float(a[i]), bfloat16::to_float(b[i]));
    dst[i] = bfloat16::from_float(r);
  }
}

//! IEEE half: scalar widening (the bit conversion is branchy), f32 combine.
template <class Op>
inline void reduce_f16(std::uint16_t* dst, const std::uint16_t* a, const std::uint16_t* __restrict b,
                       std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) dst[i] = half::from_float(Op::apply(half::to_float(a[i]), half::to_float(b[i])));
}

template <class Op>
inline constexpr bool wraps = std::is_same_v<Op, op_sum> || std::is_same_v<Op, op_prod>;

//! `reduce_native` on untyped buffers of `T`.
template <class T, class Op>
inline void reduce_as(void* dst, const void* a, const void* b, std::size_t n) noexcept {
  reduce_native<T, Op>(static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), n);
}

template <class Op>
inline void reduce_typed(dtype type, void* dst, const void* a, const void* b, std::size_t n) noexcept {
  // A sum or product of integers past the range wraps (two's complement, in
  // the unsigned type), the same on every rank; signed overflow would be undefined.
  switch (type) {
    case dtype::f32:
      return reduce_as<float, Op>(dst, a, b, n);
    case dtype::f64:
      return reduce_as<double, Op>(dst, a, b, n);
    case dtype::i32:
      return reduce_as<std::conditional_t<wraps<Op>, std::uint32_t, std::int32_t>, Op>(dst, a, b, n);
    case dtype::i64:
      return reduce_as<std::conditional_t<wraps<Op>, std::uint64_t, std::int64_t>, Op>(dst, a, b, n);
    case dtype::u8:
      return reduce_as<std::uint8_t, Op>(dst, a, b, n);
    case dtype::bf16:
      return reduce_bf16<Op>(static_cast<std::uint16_t*>(dst), static_cast<const std::uint16_t*>(a),
                             static_cast<const std::uint16_t*>(b), n);
    case dtype::f16:
      return reduce_f16<Op>(static_cast<std::uint16_t*>(dst), static_cast<const std::uint16_t*>(a),
                            static_cast<const std::uint16_t*>(b), n);
  }
}

template <class T>
inline void divide_native(T* p, std::size_t n, T d) noexcept {
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] / d);
}

}  // namespace comm::detail

namespace comm {

inline void reduce(dtype type, reduce_op op, void* dst, const void* a, const void* b, std::size_t count) noexcept {
  if (count == 0) return;
  switch (op) {
    case reduce_op::sum:
    case reduce_op::avg:
      return detail::reduce_typed<detail::op_sum>(type, dst, a, b, count);
    case reduce_op::prod:
      return detail::reduce_typed<detail::op_prod>(type, dst, a, b, count);
    case reduce_op::min:
      return detail::reduce_typed<detail::op_min>(type, dst, a, b, count);
    case reduce_op::max:
      return detail::reduce_typed<detail::op_max>(type, dst, a, b, count);
  }
}

inline void finish_avg(dtype type, void* dst, std::size_t count, int divisor) noexcept {
  if (count == 0 || divisor == 1) return;
  switch (type) {
    case dtype::f32: {
      // Multiply by the reciprocal would differ from sum / n in the last bit;
      // keep the division so every algorithm gives the same result.
      return detail::divide_native(static_cast<float*>(dst), count, static_cast<float>(divisor));
    }
    case dtype::f64:
      return detail::divide_native(static_cast<double*>(dst), count, static_cast<double>(divisor));
    case dtype::i32:
      return detail::divide_native(static_cast<std::int32_t*>(dst), count, std::int32_t{divisor});
    case dtype::i64:
      return detail::divide_native(static_cast<std::int64_t*>(dst), count, std::int64_t{divisor});
    case dtype::u8: {
      auto* p = static_cast<std::uint8_t*>(dst);
      for (std::size_t i = 0; i < count; ++i) p[i] = static_cast<std::uint8_t>(p[i] / divisor);
      return;
    }
    case dtype::f16: {
      auto* p = static_cast<std::uint16_t*>(dst);
      for (std::size_t i = 0; i < count; ++i)
        p[i] = half::from_float(half::to_float(p[i]) / static_cast<float>(divisor));
      return;
    }
    case dtype::bf16: {
      auto* p = static_cast<std::uint16_t*>(dst);
      for (std::size_t i = 0; i < count; ++i)
        p[i] = bfloat16::from_float(bfloat16::to_float(p[i]) / static_cast<float>(divisor));
      return;
    }
  }
}

}  // namespace comm
EBBFLOW_END_NAMESPACE
