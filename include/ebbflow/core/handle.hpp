// SPDX-License-Identifier: Apache-2.0
//! @file handle.hpp
//! `unique_handle<Traits>`: a move-only owner of a C handle (UCX worker, CUDA
//! stream, NCCL communicator, ...). `Traits` provides `using value_type`,
//! `static value_type null() noexcept` and `static void close(value_type) noexcept`.
//! Closing never throws; a failed close is the traits' job to log.
#pragma once

#include <ebbflow/config.hpp>

#include <utility>

EBBFLOW_BEGIN_NAMESPACE

template <class Traits>
class unique_handle {
 public:
  using value_type = typename Traits::value_type;

  unique_handle() noexcept : h_(Traits::null()) {}
  explicit unique_handle(value_type h) noexcept : h_(h) {}
  unique_handle(unique_handle&& o) noexcept : h_(std::exchange(o.h_, Traits::null())) {}
  unique_handle& operator=(unique_handle&& o) noexcept {
    if (this != &o) reset(std::exchange(o.h_, Traits::null()));
    return *this;
  }
  unique_handle(const unique_handle&) = delete;
  unique_handle& operator=(const unique_handle&) = delete;
  ~unique_handle() { reset(); }

  [[nodiscard]] value_type get() const noexcept { return h_; }
  explicit operator bool() const noexcept { return h_ != Traits::null(); }
  //! Gives up ownership without closing.
  [[nodiscard]] value_type release() noexcept { return std::exchange(h_, Traits::null()); }
  //! Closes the current handle (if any) and takes `h`.
  void reset(value_type h = Traits::null()) noexcept {
    value_type old = std::exchange(h_, h);
    if (old != Traits::null()) Traits::close(old);
  }

 private:
  value_type h_;
};

EBBFLOW_END_NAMESPACE
