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

//! Move-only owner of one handle of `Traits::value_type`; closes it with
//! `Traits::close` on destruction or reset. Not thread-safe.
template <class Traits>
class unique_handle {
 public:
  using value_type = typename Traits::value_type;  //!< the C handle type

  unique_handle() noexcept : h_(Traits::null()) {}
  //! Takes ownership of `h`.
  explicit unique_handle(value_type h) noexcept : h_(h) {}
  //! Takes `o`'s handle; `o` is left empty.
  unique_handle(unique_handle&& o) noexcept : h_(std::exchange(o.h_, Traits::null())) {}
  //! Closes the current handle and takes `o`'s.
  unique_handle& operator=(unique_handle&& o) noexcept {
    if (this != &o) reset(std::exchange(o.h_, Traits::null()));
    return *this;
  }
  unique_handle(const unique_handle&) = delete;
  unique_handle& operator=(const unique_handle&) = delete;
  ~unique_handle() { reset(); }

  //! The handle, still owned.
  [[nodiscard]] value_type get() const noexcept { return h_; }
  //! True when a handle is owned.
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
