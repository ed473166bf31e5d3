// SPDX-License-Identifier: Apache-2.0
//! @file elastic/detail/io_deadline.hpp
//! One blocking Asio operation under a deadline, as the store clients run
//! theirs (the embedded store's connection and the etcd gateway's): the
//! caller starts the asynchronous operation, whose handler sets `done`,
//! then runs the io_context until it finished or the deadline passed.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/deadline.hpp>

#include <boost/asio/error.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/system/error_code.hpp>

#include <algorithm>
#include <chrono>
#include <optional>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

//! Runs `ioc` until `done` is set or `d` passes; past `d` it calls `cancel`
//! and runs the cancelled handler. True when the operation finished in time
//! (`*done` holds its result); false at the deadline.
template <class Cancel>
bool run_io_until(boost::asio::io_context& ioc, deadline d, std::optional<boost::system::error_code>& done,
                  Cancel cancel) {
  // run_until with time_point::max() would overflow inside Asio.
  const auto cap = std::chrono::steady_clock::now() + std::chrono::hours(24 * 365);
  ioc.restart();
  ioc.run_until(std::min(d.at(), cap));
  if (done) return true;
  cancel();
  ioc.restart();
  ioc.run();  // let the cancelled handler run
  return done && *done != boost::asio::error::operation_aborted;
}

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
