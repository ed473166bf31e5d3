// SPDX-License-Identifier: Apache-2.0
//! @file dtype.hpp
//! Element types and reduction operators that collectives and codecs accept.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/enum_names.hpp>
#include <ebbflow/core/half.hpp>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string_view>
#include <type_traits>

EBBFLOW_BEGIN_NAMESPACE

//! Element type of a buffer.
enum class dtype : std::uint8_t { f32, f64, f16, bf16, i32, i64, u8 };

//! Every dtype, for iteration in tests and benchmarks.
inline constexpr dtype all_dtypes[] = {dtype::f32, dtype::f64, dtype::f16, dtype::bf16,
                                       dtype::i32, dtype::i64, dtype::u8};

//! Size of one element in bytes.
constexpr std::size_t size_of(dtype t) noexcept {
  switch (t) {
    case dtype::f64:
    case dtype::i64:
      return 8;
    case dtype::f32:
    case dtype::i32:
      return 4;
    case dtype::f16:
    case dtype::bf16:
      return 2;
    case dtype::u8:
      return 1;
  }
  return 0;
}

namespace detail {
inline constexpr auto dtype_names = make_enum_names(dtype::f32, "f32", "f64", "f16", "bf16", "i32", "i64", "u8");
static_assert(dtype_names.last() == dtype::u8 && dtype_names.size() == std::size(all_dtypes));
}  // namespace detail

//! Short name ("f32", "bf16", ...), as printed by benchmarks and errors.
constexpr std::string_view name(dtype t) noexcept { return detail::dtype_names(t); }

//! Parses a name produced by `name(dtype)`.
constexpr std::optional<dtype> parse_dtype(std::string_view s) noexcept { return detail::dtype_names.parse(s); }

//! True for f32, f64, f16 and bf16.
constexpr bool is_floating(dtype t) noexcept {
  return t == dtype::f32 || t == dtype::f64 || t == dtype::f16 || t == dtype::bf16;
}

//! The dtype of a C++ element type; `dtype_of_v<float> == dtype::f32`.
template <class T>
struct dtype_of;
template <>
struct dtype_of<float> : std::integral_constant<dtype, dtype::f32> {};
template <>
struct dtype_of<double> : std::integral_constant<dtype, dtype::f64> {};
template <>
struct dtype_of<half> : std::integral_constant<dtype, dtype::f16> {};
template <>
struct dtype_of<bfloat16> : std::integral_constant<dtype, dtype::bf16> {};
template <>
struct dtype_of<std::int32_t> : std::integral_constant<dtype, dtype::i32> {};
template <>
struct dtype_of<std::int64_t> : std::integral_constant<dtype, dtype::i64> {};
template <>
struct dtype_of<std::uint8_t> : std::integral_constant<dtype, dtype::u8> {};
//! `dtype_of<T>::value`, ignoring cv-qualifiers.
template <class T>
inline constexpr dtype dtype_of_v = dtype_of<std::remove_cv_t<T>>::value;

//! Calls `f(T{})` with the C++ type of `t` (a tag value), returning its result.
template <class F>
constexpr decltype(auto) visit_dtype(dtype t, F&& f) {
  switch (t) {
    case dtype::f32:
      return f(float{});
    case dtype::f64:
      return f(double{});
    case dtype::f16:
      return f(half{});
    case dtype::bf16:
      return f(bfloat16{});
    case dtype::i32:
      return f(std::int32_t{});
    case dtype::i64:
      return f(std::int64_t{});
    case dtype::u8:
      return f(std::uint8_t{});
  }
  return f(float{});
}

//! Reduction operator of a collective. `avg` is `sum` divided by the world
//! size (integers: truncating division).
enum class reduce_op : std::uint8_t { sum, avg, min, max, prod };

//! Every reduce_op, for iteration in tests and benchmarks.
inline constexpr reduce_op all_reduce_ops[] = {reduce_op::sum, reduce_op::avg, reduce_op::min, reduce_op::max,
                                               reduce_op::prod};

namespace detail {
inline constexpr auto reduce_op_names = make_enum_names(reduce_op::sum, "sum", "avg", "min", "max", "prod");
static_assert(reduce_op_names.last() == reduce_op::prod && reduce_op_names.size() == std::size(all_reduce_ops));
}  // namespace detail

//! Short name ("sum", "avg", ...).
constexpr std::string_view name(reduce_op op) noexcept { return detail::reduce_op_names(op); }

//! Parses a name produced by `name(reduce_op)`.
constexpr std::optional<reduce_op> parse_reduce_op(std::string_view s) noexcept {
  return detail::reduce_op_names.parse(s);
}

EBBFLOW_END_NAMESPACE
