// SPDX-License-Identifier: Apache-2.0
//! @file deadline.hpp
//! Clocks, and deadlines for blocking calls. Every blocking call in ebbflow takes one
//! (or a timeout that is turned into one) and reports `errc::timeout` when it
//! passes.
#pragma once

#include <ebbflow/config.hpp>

#include <chrono>

EBBFLOW_BEGIN_NAMESPACE

//! The clock of every deadline and timeout in ebbflow.
using steady_clock = std::chrono::steady_clock;

//! Seconds since the Unix epoch on the system clock: the stamp of event and
//! log lines, comparable across processes and hosts (never used for
//! deadlines, which take the steady clock).
[[nodiscard]] inline double wall_seconds() noexcept {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

//! A point in time on the steady clock after which a blocking call gives up.
class deadline {
 public:
  //! A deadline `timeout` from now; saturates (a timeout beyond the clock's
  //! range, e.g. `seconds::max()`, never passes).
  template <class Rep, class Period>
  static deadline after(std::chrono::duration<Rep, Period> timeout) noexcept {
    using seconds = std::chrono::duration<double>;
    const auto now = steady_clock::now();
    const double at = seconds(now.time_since_epoch()).count() + seconds(timeout).count();
    if (at >= seconds(steady_clock::duration::max()).count() - 1) return never();  // 1 s: double rounding
    if (at <= seconds(steady_clock::duration::min()).count() + 1) return deadline(steady_clock::time_point::min());
    return deadline(now + std::chrono::duration_cast<steady_clock::duration>(timeout));
  }
  //! A deadline that never passes (use sparingly: prefer a bound).
  static deadline never() noexcept { return deadline(steady_clock::time_point::max()); }

  //! A deadline at the time point `t`.
  explicit deadline(steady_clock::time_point t) noexcept : at_(t) {}

  //! When it passes.
  [[nodiscard]] steady_clock::time_point at() const noexcept { return at_; }
  //! True once the deadline has passed.
  [[nodiscard]] bool expired() const noexcept { return steady_clock::now() >= at_; }
  //! Time left, zero once expired.
  [[nodiscard]] steady_clock::duration remaining() const noexcept {
    const auto now = steady_clock::now();
    return now >= at_ ? steady_clock::duration::zero() : at_ - now;
  }
  //! The earlier of two deadlines.
  [[nodiscard]] friend deadline min(deadline a, deadline b) noexcept { return a.at_ < b.at_ ? a : b; }

 private:
  steady_clock::time_point at_;
};

EBBFLOW_END_NAMESPACE
