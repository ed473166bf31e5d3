// SPDX-License-Identifier: Apache-2.0
//! Test data and an independent reference for collectives. Inputs are small
//! integers, so every summation order is exact in every dtype (f16/bf16
//! included) and floats can be compared bit for bit; `avg` is one division
//! of the exact sum, which the reference performs in the element type too.
#pragma once

#include <ebbflow/core/dtype.hpp>
#include <ebbflow/core/half.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

namespace ebbflow_test {
namespace ef = ebbflow;

//! Every input repeats with this period in the element index (11 for the
//! sums, 6 for the products), so the checks below compute one period of the
//! reference and walk it: 64 MiB buffers are checked at memory speed.
inline constexpr std::size_t period = 66;

//! Input element i of rank r for reduce op `op` (sum data also serves
//! allgather/broadcast). Values keep every reduction exact in every dtype.
inline double input_value(ef::reduce_op op, ef::dtype t, int r, std::size_t i) {
  i %= period;  // the same values as without it: 66 is a multiple of 11, 3 and 2
  const bool unsigned_type = t == ef::dtype::u8;
  if (op == ef::reduce_op::prod) {
    if ((i + static_cast<std::size_t>(r)) % 3 == 0) return 2;
    return (!unsigned_type && (i * 5 + static_cast<std::size_t>(r)) % 2) ? -1 : 1;
  }
  const double v = static_cast<double>((i * 7 + static_cast<std::size_t>(r) * 13) % 11);
  return unsigned_type ? v : v - 5;
}

template <class T>
T to_elem(double v) {
  if constexpr (std::is_same_v<T, ef::half> || std::is_same_v<T, ef::bfloat16>)
    return T(static_cast<float>(v));
  else
    return static_cast<T>(v);
}
template <class T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

//! Expected element i of an allreduce over ranks 0..n-1, in the element type.
template <class T>
T expected(ef::reduce_op op, int n, std::size_t i) {
  const ef::dtype t = ef::dtype_of_v<T>;
  double acc = input_value(op, t, 0, i);
  for (int r = 1; r < n; ++r) {
    const double v = input_value(op, t, r, i);
    switch (op) {
      case ef::reduce_op::sum:
      case ef::reduce_op::avg:
        acc += v;
        break;
      case ef::reduce_op::prod:
        acc *= v;
        break;
      case ef::reduce_op::min:
        acc = v < acc ? v : acc;
        break;
      case ef::reduce_op::max:
        acc = v > acc ? v : acc;
        break;
    }
  }
  if (op != ef::reduce_op::avg) return to_elem<T>(acc);
  if constexpr (std::is_integral_v<T>)
    return static_cast<T>(static_cast<T>(acc) / static_cast<T>(n));
  else if constexpr (std::is_same_v<T, double>)
    return acc / n;
  else
    return to_elem<T>(static_cast<float>(acc) / static_cast<float>(n));
}

namespace detail {
//! Calls f(q[i], pattern[(first_index + i) % period]) for i in [0, count),
//! where pattern[j] = make(j); returns how many calls returned true.
template <class T, class Ptr, class Make, class F>
std::size_t walk_periodic(Ptr* q, std::size_t count, std::size_t first_index, Make make, F f) {
  T pattern[period];
  for (std::size_t j = 0; j < period; ++j) pattern[j] = make(j);
  std::size_t hits = 0, j = first_index % period;
  for (std::size_t i = 0; i < count; ++i) {
    hits += f(q[i], pattern[j]);
    if (++j == period) j = 0;
  }
  return hits;
}
}  // namespace detail

//! Fills `count` elements of type `t` at `p` with rank r's input.
inline void fill(ef::dtype t, ef::reduce_op op, int r, void* p, std::size_t count, std::size_t first_index = 0) {
  ef::visit_dtype(t, [&](auto z) {
    using T = decltype(z);
    detail::walk_periodic<T>(
        static_cast<T*>(p), count, first_index, [&](std::size_t j) { return to_elem<T>(input_value(op, t, r, j)); },
        [](T& dst, T v) {
          dst = v;
          return false;
        });
  });
}

namespace detail {
//! Number of the `count` elements of type `t` at `p` whose bits differ from
//! `want(T{}, i)` (element j of `p` is global element i = first_index + j).
template <class Want>
std::size_t count_wrong(ef::dtype t, const void* p, std::size_t count, std::size_t first_index, Want want) {
  std::size_t wrong = 0;
  ef::visit_dtype(t, [&](auto z) {
    using T = decltype(z);
    wrong = walk_periodic<T>(
        static_cast<const T*>(p), count, first_index, [&](std::size_t j) { return want(z, j); },
        [](T got, T w) { return !same_bits(got, w); });
  });
  return wrong;
}
}  // namespace detail

//! Number of elements of an allreduce result that differ from the reference
//! (element j of `p` is global element first_index + j).
inline std::size_t wrong_reduced(ef::dtype t, ef::reduce_op op, int n, const void* p, std::size_t count,
                                 std::size_t first_index = 0) {
  return detail::count_wrong(t, p, count, first_index,
                             [&](auto z, std::size_t j) { return expected<decltype(z)>(op, n, j); });
}

//! Number of elements that differ from rank r's input.
inline std::size_t wrong_input(ef::dtype t, ef::reduce_op op, int r, const void* p, std::size_t count,
                               std::size_t first_index = 0) {
  return detail::count_wrong(t, p, count, first_index,
                             [&](auto z, std::size_t j) { return to_elem<decltype(z)>(input_value(op, t, r, j)); });
}

}  // namespace ebbflow_test
