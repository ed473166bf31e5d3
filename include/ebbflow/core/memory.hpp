// SPDX-License-Identifier: Apache-2.0
//! @file memory.hpp
//! Spans that carry their memory space, so host and device pointers cannot be
//! mixed up at compile time, plus an untyped buffer view (pointer, count,
//! dtype, space) for APIs that choose the element type at run time.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/dtype.hpp>
#include <ebbflow/core/enum_names.hpp>

#include <cstddef>
#include <span>
#include <type_traits>

EBBFLOW_BEGIN_NAMESPACE

//! Where a buffer lives. `pinned` is page-locked host memory (host-accessible,
//! usable for asynchronous device copies).
enum class memory_space : std::uint8_t { host, pinned, device };

namespace detail {
inline constexpr auto memory_space_names = make_enum_names(memory_space::host, "host", "pinned", "device");
static_assert(memory_space_names.last() == memory_space::device);
}  // namespace detail

//! Lower-case name ("host", "pinned", "device").
constexpr std::string_view name(memory_space s) noexcept { return detail::memory_space_names(s); }

//! True when the CPU may dereference memory of this space.
constexpr bool host_accessible(memory_space s) noexcept { return s != memory_space::device; }

//! A `std::span` tagged with its memory space. Converts implicitly from
//! `std::span` only for host memory; device spans must be built explicitly.
template <class T, memory_space Space>
class mspan : public std::span<T> {
 public:
  static constexpr memory_space space = Space;  //!< where the elements live
  using std::span<T>::span;
  constexpr mspan() noexcept = default;
  //! `n` elements at `p`, which must point into `Space`.
  constexpr mspan(T* p, std::size_t n) noexcept : std::span<T>(p, n) {}
  //! Tags `s` as memory of `Space` (the caller vouches for it).
  constexpr explicit mspan(std::span<T> s) noexcept : std::span<T>(s) {}
  //! A span of const elements in the same space.
  template <class U>
  requires std::is_convertible_v<U (*)[], T (*)[]>
  constexpr mspan(mspan<U, Space> o) noexcept : std::span<T>(o.data(), o.size()) {}

  //! Like `std::span::subspan`, keeping the memory space.
  [[nodiscard]] constexpr mspan subspan(std::size_t off, std::size_t n = std::dynamic_extent) const noexcept {
    return mspan(std::span<T>::subspan(off, n));
  }
};

//! Pageable host memory.
template <class T>
using host_span = mspan<T, memory_space::host>;
//! Page-locked host memory.
template <class T>
using pinned_span = mspan<T, memory_space::pinned>;
//! Device memory: not to be dereferenced on the CPU.
template <class T>
using device_span = mspan<T, memory_space::device>;

//! An untyped view: `count` elements of `type` at `data` in `space`.
struct buffer_view {
  void* data = nullptr;                     //!< first element, in `space`
  std::size_t count = 0;                    //!< number of elements
  dtype type = dtype::f32;                  //!< element type
  memory_space space = memory_space::host;  //!< where `data` lives

  //! Size in bytes.
  [[nodiscard]] constexpr std::size_t bytes() const noexcept { return count * size_of(type); }
  //! The bytes of the buffer (in `space`).
  [[nodiscard]] std::span<std::byte> as_bytes() const noexcept { return {static_cast<std::byte*>(data), bytes()}; }
  //! Elements [off, off + n).
  [[nodiscard]] buffer_view slice(std::size_t off, std::size_t n) const noexcept {
    return {static_cast<std::byte*>(data) + off * size_of(type), n, type, space};
  }
};

//! A view over a typed span, keeping its space.
template <class T, memory_space S>
buffer_view view(mspan<T, S> s) noexcept {
  return {const_cast<std::remove_const_t<T>*>(s.data()), s.size(), dtype_of_v<std::remove_const_t<T>>, S};
}
//! A view over host memory.
template <class T>
buffer_view view(std::span<T> s) noexcept {
  return {const_cast<std::remove_const_t<T>*>(s.data()), s.size(), dtype_of_v<std::remove_const_t<T>>,
          memory_space::host};
}

EBBFLOW_END_NAMESPACE
