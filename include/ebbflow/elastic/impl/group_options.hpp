// SPDX-License-Identifier: Apache-2.0
//! @file impl/group_options.hpp
//! Definitions of elastic/group_options.hpp.
#pragma once

#include <ebbflow/elastic/group_options.hpp>
#include <ebbflow/elastic/detail/records.hpp>  // parse_i64

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

inline group_options group_options::from_environment(group_options o) {
  constexpr std::int64_t day_ms = 24LL * 3'600'000;
  if (auto j = env::get("EBBFLOW_JOB")) o.prefix = *j;
  // Both bounds within the collectives' most ranks, so a minimum above it
  // is refused naming EBBFLOW_MIN_SIZE rather than the maximum's default.
  o.min_size = static_cast<int>(env::get_int("EBBFLOW_MIN_SIZE", o.min_size, 1, comm::max_collective_ranks));
  o.max_size = static_cast<int>(env::get_int("EBBFLOW_MAX_SIZE", o.max_size, o.min_size, comm::max_collective_ranks));
  o.join = env::get_bool("EBBFLOW_JOIN", o.join);
  o.heartbeat = env::get_ms("EBBFLOW_HEARTBEAT_MS", o.heartbeat, 1, 60'000);
  o.store_timeout = env::get_ms("EBBFLOW_STORE_TIMEOUT_MS", o.store_timeout, 1);
  o.store_outage_wait = env::get_ms("EBBFLOW_STORE_OUTAGE_MS", o.store_outage_wait, 0, day_ms);
  o.lease = env::get_ms("EBBFLOW_LEASE_MS", o.lease, 10, 3'600'000);
  o.op_timeout = env::get_ms("EBBFLOW_OP_TIMEOUT_MS", o.op_timeout, 10, day_ms);
  o.stall_warning = env::get_ms("EBBFLOW_STALL_WARN_MS", o.stall_warning, 0, day_ms);
  o.sched_slice = std::chrono::microseconds(env::get_int_or_zero("EBBFLOW_SCHED_SLICE_US", o.sched_slice.count(),
                                                                 min_sched_slice.count(), max_sched_slice.count()));
  o.rt_priority = static_cast<int>(env::get_int_or_zero("EBBFLOW_RT_PRIORITY", o.rt_priority, 1, max_rt_priority));
  o.join_timeout = env::get_ms("EBBFLOW_JOIN_TIMEOUT_MS", o.join_timeout, 10, day_ms);
  o.min_size_wait = env::get_ms("EBBFLOW_MIN_WAIT_MS", o.min_size_wait, 10, day_ms);
  o.initial_wait = env::get_ms("EBBFLOW_INITIAL_WAIT_MS", o.initial_wait, 0, day_ms);
  o.admit_delay = env::get_ms("EBBFLOW_ADMIT_DELAY_MS", o.admit_delay, 0, 3'600'000);
  o.preconnect = env::get_bool("EBBFLOW_PRECONNECT", o.preconnect);
  o.initial_staging =
      static_cast<std::size_t>(env::get_int(
          "EBBFLOW_INITIAL_STAGING_MB", static_cast<std::int64_t>(o.initial_staging >> 20), 0, std::int64_t{1} << 30))
      << 20;
  if (auto c = env::get("EBBFLOW_JOIN_COOLDOWN")) {
    const auto cd = cooldown::parse(*c, "EBBFLOW_JOIN_COOLDOWN", {o.join_cooldown, o.join_cooldown_max});
    o.join_cooldown = cd.sec;
    o.join_cooldown_max = cd.max;
  }
  if (auto k = env::get("EBBFLOW_WORKER_KEY")) o.worker_key = *k;
  if (auto k = env::get("EBBFLOW_PROCESS_KEY")) o.process_key = *k;
  return o;
}

template <kv_store Store>
std::optional<member_id> report_process_exit(Store& st, const group_options& o, std::string_view process_key,
                                             std::string_view how, deadline d) {
  const auto v = st.try_get(o.process_record_key(process_key), d);
  if (!v) return std::nullopt;
  const member_id m = detail::parse_i64(*v);
  st.set(o.gone_key(m), how, d);
  st.add(o.gone_count_key(), 1, d);  // after the report: who reads the new count finds it
  return m;
}

}  // namespace elastic
EBBFLOW_END_NAMESPACE
