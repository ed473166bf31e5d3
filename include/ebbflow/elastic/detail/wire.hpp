// SPDX-License-Identifier: Apache-2.0
//! @file wire.hpp
//! Little-endian byte writer/reader for the elastic group's records. The
//! reader checks every length, so a truncated or corrupted record becomes
//! `errc::bad_message`, never an out-of-bounds read.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/error.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

class writer {
 public:
  template <class T>
  requires std::is_trivially_copyable_v<T> writer& put(const T& v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    out_.insert(out_.end(), p, p + sizeof v);
    return *this;
  }
  writer& put_bytes(std::span<const std::byte> b) {
    put<std::uint64_t>(b.size());
    out_.insert(out_.end(), b.begin(), b.end());
    return *this;
  }
  [[nodiscard]] std::vector<std::byte> take() { return std::move(out_); }

 private:
  std::vector<std::byte> out_;
};

class reader {
 public:
  reader(std::span<const std::byte> in, const char* what) : in_(in), what_(what) {}
  template <class T>
  requires std::is_trivially_copyable_v<T> T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, in_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  std::vector<std::byte> get_bytes() {
    const auto n = get<std::uint64_t>();
    need(n);
    std::vector<std::byte> b(in_.begin() + static_cast<std::ptrdiff_t>(pos_),
                             in_.begin() + static_cast<std::ptrdiff_t>(pos_ + n));
    pos_ += n;
    return b;
  }
  //! Elements of a length-prefixed array, bounded by what is left.
  std::uint64_t get_count(std::size_t elem_size) {
    const auto n = get<std::uint64_t>();
    if (elem_size && n > (in_.size() - pos_) / elem_size) fail();
    return n;
  }
  void expect_end() const {
    if (pos_ != in_.size()) fail();
  }

 private:
  void need(std::uint64_t n) const {
    if (n > in_.size() - pos_) fail();
  }
  [[noreturn]] void fail() const {
    throw system_error(
        make_error_code(error::bad_message),
        {.operation = "decode", .detail = std::string(what_) + " of " + std::to_string(in_.size()) + " bytes"});
  }
  std::span<const std::byte> in_;
  std::size_t pos_ = 0;
  const char* what_;
};

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
