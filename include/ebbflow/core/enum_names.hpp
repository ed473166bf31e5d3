// SPDX-License-Identifier: Apache-2.0
//! @file enum_names.hpp
//! `enum_names`: the names of an enum's enumerators as one constexpr table,
//! looked up both ways, in place of a switch per enum. Declare the table
//! next to the enum and tie it to the enum's last enumerator, so that an
//! enumerator added without a name fails to compile:
//!
//! ```cpp
//! enum class color { red, green, blue };
//! inline constexpr auto color_names = make_enum_names(color::red, "red", "green", "blue");
//! static_assert(color_names.last() == color::blue);
//! constexpr std::string_view name(color c) noexcept { return color_names(c); }
//! ```
#pragma once

#include <ebbflow/config.hpp>

#include <array>
#include <cstddef>
#include <optional>
#include <string_view>
#include <type_traits>

EBBFLOW_BEGIN_NAMESPACE

//! The names of the N enumerators `first`, `first` + 1, ... of `E`, which
//! must have no gaps, in that order. A constexpr value; make one with
//! `make_enum_names`. Thread safety: immutable.
template <class E, std::size_t N>
requires std::is_enum_v<E> &&(N > 0) struct enum_names {
  std::array<std::string_view, N> names;  //!< `names[i]` is the name of `first` + i
  E first;                                //!< the enumerator `names[0]` names

  //! The name of `e`, or `unknown` for a value outside the table. O(1).
  [[nodiscard]] constexpr std::string_view operator()(E e, std::string_view unknown = "?") const noexcept {
    const long long d = value(e) - value(first);
    return d >= 0 && d < static_cast<long long>(N) ? names[static_cast<std::size_t>(d)] : unknown;
  }
  //! The enumerator named `s` (an exact match), or nullopt. O(N).
  [[nodiscard]] constexpr std::optional<E> parse(std::string_view s) const noexcept {
    for (std::size_t i = 0; i < N; ++i)
      if (names[i] == s) return at(i);
    return std::nullopt;
  }
  //! The enumerator of `names[i]` (i < N).
  [[nodiscard]] constexpr E at(std::size_t i) const noexcept {
    return static_cast<E>(value(first) + static_cast<long long>(i));
  }
  //! The enumerator the last name belongs to.
  [[nodiscard]] constexpr E last() const noexcept { return at(N - 1); }
  //! Number of names.
  [[nodiscard]] static constexpr std::size_t size() noexcept { return N; }

 private:
  static constexpr long long value(E e) noexcept { return static_cast<long long>(e); }
};

//! The table naming `first` and the enumerators after it, in order:
//! `make_enum_names(level::off, "off", "error", "warn")`.
template <class E, class... Names>
requires std::is_enum_v<E> &&(sizeof...(Names) > 0) &&
    (std::is_convertible_v<const Names&, std::string_view> && ...)
        [[nodiscard]] constexpr enum_names<E, sizeof...(Names)> make_enum_names(E first,
                                                                                const Names&... names) noexcept {
  return {{std::string_view(names)...}, first};
}

EBBFLOW_END_NAMESPACE
