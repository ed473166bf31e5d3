// SPDX-License-Identifier: Apache-2.0
//! @file detail/fault_injection.hpp
//! Fault injection for the multi-process tests: EBBFLOW_FAULT=<point>[*N]
//! [:hang=MS|:sleep=MS] makes the first member of the job (the first N) that
//! reaches `point` die there as a crashed process would (SIGKILL), hang
//! there as a SIGSTOPped one would, or sleep on the calling thread only.
//! Claims go through the job's store, so exactly N members fire. The points
//! are listed in docs/elastic.md ("Testing aids"). Unset, a point costs one
//! comparison.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/core/env.hpp>
#include <ebbflow/core/log.hpp>
#include <ebbflow/elastic/detail/records.hpp>    // parse_i64
#include <ebbflow/elastic/detail/store_ops.hpp>  // sleep_until
#include <ebbflow/elastic/planning_policy.hpp>   // member_id

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <ctime>
#include <iomanip>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

//! Fires EBBFLOW_FAULT at `point` when it names that point and this member
//! (`id`, of the job under `prefix` in `st`) is among the first N to get
//! there. `stop` cuts a `:sleep` short.
//! @throws std::invalid_argument for a malformed EBBFLOW_FAULT.
template <class Store>
void fault_point(std::string_view point, Store& st, const std::string& prefix, member_id id, deadline d,
                 const std::stop_token& stop) {
  static const std::optional<std::string> fault = env::get("EBBFLOW_FAULT");
  if (!fault) return;
  std::string_view f = *fault;
  enum class mode { die, hang, sleep } how = mode::die;
  std::int64_t ms = 0;
  if (const auto colon = f.find(':'); colon != std::string_view::npos) {
    const std::string_view m = f.substr(colon + 1);
    if (m.starts_with("hang="))
      how = mode::hang;
    else if (m.starts_with("sleep="))
      how = mode::sleep;
    else
      throw std::invalid_argument("EBBFLOW_FAULT='" + *fault + "': expected <point>[*N][:hang=MS|:sleep=MS]");
    ms = parse_i64(std::string(m.substr(m.find('=') + 1)));
    f = f.substr(0, colon);
  }
  const auto star = f.find('*');
  if (f.substr(0, star) != point) return;
  const std::int64_t times = star == std::string_view::npos ? 1 : parse_i64(std::string(f.substr(star + 1)));
  if (st.add(prefix + "/fault/" + std::string(point), 1, d) > times) return;
  switch (how) {
    case mode::die:
      EBBFLOW_LOG_WARN("EBBFLOW_FAULT=" << point << ": member " << id << " dies here");
      std::raise(SIGKILL);
      return;
    case mode::sleep:
      EBBFLOW_LOG_WARN("EBBFLOW_FAULT=" << point << ": member " << id << "'s thread sleeps here for " << ms << " ms");
      sleep_until(std::chrono::steady_clock::now() + std::chrono::milliseconds(ms), stop);
      return;
    case mode::hang:
      break;
  }
  EBBFLOW_LOG_WARN("EBBFLOW_FAULT=" << point << ": member " << id << " hangs here for " << ms << " ms");
  // A child continues this process: fork() leaves it one thread, which
  // calls only async-signal-safe functions.
  const pid_t self = ::getpid();
  if (const pid_t waker = ::fork(); waker == 0) {
    const timespec t{static_cast<time_t>(ms / 1000), static_cast<long>(ms % 1000) * 1'000'000};
    ::nanosleep(&t, nullptr);
    ::kill(self, SIGCONT);
    ::_exit(0);
  } else if (waker > 0) {
    ::kill(self, SIGSTOP);
    ::waitpid(waker, nullptr, 0);
    EBBFLOW_LOG_WARN("EBBFLOW_FAULT=" << point << ": member " << id << " goes on after its hang [t=" << std::fixed
                                      << std::setprecision(3) << wall_seconds() << "]");
  }
}

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
