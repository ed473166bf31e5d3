// SPDX-License-Identifier: Apache-2.0
//! @file group_options.hpp
//! Settings of an elastic group (`group_options`), the store keys a launcher
//! reads, and `report_process_exit`, with which a launcher tells a job that a
//! worker's process exited. Each field names its environment variable;
//! docs/elastic.md ("Configuration") says what each one is for and when to
//! change it.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/comm/transport.hpp>  // comm::max_collective_ranks
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/core/env.hpp>
#include <ebbflow/elastic/cooldown.hpp>
#include <ebbflow/elastic/kv_store.hpp>
#include <ebbflow/elastic/planning_policy.hpp>  // member_id

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

//! Settings of an elastic group. `from_environment()` reads the `EBBFLOW_*`
//! variables named beside each field (validated; a bad value throws
//! std::invalid_argument naming the variable). `global_batch` and
//! `dataset_size` have no default: set them in code.
struct group_options {
  std::string prefix = "ebbflow";                    //!< EBBFLOW_JOB: store key prefix of this job
  int min_size = 1;                                  //!< EBBFLOW_MIN_SIZE: below it the group waits
  int max_size = comm::max_collective_ranks;         //!< EBBFLOW_MAX_SIZE: joiners beyond it wait
  std::size_t global_batch = 0;                      //!< B, samples per step over all members (required)
  std::size_t dataset_size = 0;                      //!< N, samples per epoch (required)
  bool drop_last = false;                            //!< drop an epoch's short last batch
  bool join = false;                                 //!< EBBFLOW_JOIN=1: join a running job as a newcomer
  std::chrono::milliseconds heartbeat{50};           //!< EBBFLOW_HEARTBEAT_MS
  std::chrono::milliseconds lease{1000};             //!< EBBFLOW_LEASE_MS: silence after which a member is dead
  std::chrono::milliseconds op_timeout{30'000};      //!< EBBFLOW_OP_TIMEOUT_MS: deadline of each collective
  std::chrono::milliseconds join_timeout{120'000};   //!< EBBFLOW_JOIN_TIMEOUT_MS: admission, initial formation
  std::chrono::milliseconds min_size_wait{600'000};  //!< EBBFLOW_MIN_WAIT_MS: below min_size before giving up
  std::chrono::milliseconds initial_wait{30'000};    //!< EBBFLOW_INITIAL_WAIT_MS: for all launched workers
  std::chrono::milliseconds store_timeout{10'000};   //!< EBBFLOW_STORE_TIMEOUT_MS: deadline of each store call
  std::chrono::milliseconds admit_delay{50};         //!< EBBFLOW_ADMIT_DELAY_MS: batch join tickets this close
  std::chrono::milliseconds stall_warning{10'000};   //!< EBBFLOW_STALL_WARN_MS: name who is behind (0: off)
  //! EBBFLOW_STORE_OUTAGE_MS: a failure found while the store cannot be
  //! reached waits this long for the store (a replicated store regaining its
  //! quorum) before the group gives up; 0: gives up at once.
  std::chrono::milliseconds store_outage_wait{0};
  std::chrono::microseconds sched_slice{0};          //!< EBBFLOW_SCHED_SLICE_US: members' scheduler slice (0: off)
  static constexpr std::chrono::microseconds min_sched_slice{100};     //!< the kernel's shortest slice
  static constexpr std::chrono::microseconds max_sched_slice{100000};  //!< the kernel's longest slice
  //! EBBFLOW_RT_PRIORITY (0: off, else 1 to 99): the group's threads run
  //! under `SCHED_RR` once this process is a member. Opt-in; needs
  //! `CAP_SYS_NICE` or `RLIMIT_RTPRIO` (refused: logged, training goes on).
  int rt_priority = 0;
  static constexpr int max_rt_priority = 99;  //!< the highest `SCHED_RR` priority on Linux
  bool preconnect = true;                     //!< EBBFLOW_PRECONNECT: connect to joiners while training
  //! EBBFLOW_INITIAL_STAGING_MB (0: off): a launched worker receives the
  //! initial state into a copy of at most this size, so a sender's death
  //! midway leaves its own initial state whole.
  std::size_t initial_staging = std::size_t{1024} << 20;
  std::chrono::milliseconds join_cooldown{1'000};       //!< SEC of EBBFLOW_JOIN_COOLDOWN=SEC[:MAX] (0: off)
  std::chrono::milliseconds join_cooldown_max{60'000};  //!< MAX of EBBFLOW_JOIN_COOLDOWN
  std::string worker_key;   //!< EBBFLOW_WORKER_KEY: whose join failures count together (default: host name)
  std::string process_key;  //!< EBBFLOW_PROCESS_KEY: this process's name with its launcher (empty: none)

  //! The store key of generation `g`'s record, written when it forms (a
  //! launcher waits for generation 0 to know that training began).
  [[nodiscard]] std::string generation_key(std::int64_t g) const { return prefix + "/gen/" + std::to_string(g); }
  //! The store key under which the member that process `name` (its
  //! EBBFLOW_PROCESS_KEY) became records its member id.
  [[nodiscard]] std::string process_record_key(std::string_view name) const {
    return prefix + "/proc/" + std::string(name);
  }
  //! The store key that says member `m`'s process exited (`report_process_exit`).
  [[nodiscard]] std::string gone_key(member_id m) const { return prefix + "/gone/" + std::to_string(m); }
  //! The counter `report_process_exit` adds one to after each report.
  [[nodiscard]] std::string gone_count_key() const { return prefix + "/gone_count"; }

  //! The defaults, overridden by the environment. @throws std::invalid_argument naming the variable.
  static group_options from_environment() { return from_environment(group_options{}); }
  //! `o`, overridden by the environment. @throws std::invalid_argument naming the variable.
  static group_options from_environment(group_options o);
};

//! For a launcher: the process it started as `process_key` (the
//! EBBFLOW_PROCESS_KEY it gave it) exited, `how` (e.g. "killed by SIGKILL").
//! If that process became a member of the job, the members drop it at once
//! instead of waiting for its lease. Call it once the process and whatever it
//! started are gone. Returns the member id the process was, or nullopt when
//! it never registered. @throws system_error from the store (deadline `d`).
template <kv_store Store>
std::optional<member_id> report_process_exit(Store& st, const group_options& o, std::string_view process_key,
                                             std::string_view how, deadline d);

}  // namespace elastic
EBBFLOW_END_NAMESPACE

#include <ebbflow/elastic/impl/group_options.hpp>
