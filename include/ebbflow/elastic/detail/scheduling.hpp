// SPDX-License-Identifier: Apache-2.0
//! @file detail/scheduling.hpp
//! Linux scheduling of the elastic group's threads: the priority a joiner
//! started lower gets back (EBBFLOW_JOIN_NICE), the members' scheduler slice
//! (EBBFLOW_SCHED_SLICE_US), their real-time class (EBBFLOW_RT_PRIORITY), and
//! the lowest priority of the admission helper. docs/elastic.md says when each
//! helps. Failures are logged, never thrown: training goes on without them.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/env.hpp>
#include <ebbflow/core/log.hpp>

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <span>
#include <system_error>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

// Calls f(tid) for every thread of this process (threads that end meanwhile
// are the callee's to skip: their calls fail).
template <class F>
void for_each_thread(F&& f) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task", ec))
    f(static_cast<pid_t>(std::strtol(e.path().filename().c_str(), nullptr, 10)));
}

// A joiner started with `ebbflow-run --join-nice N` runs N nice levels
// lower until the members switch to the generation that includes it (its
// start-up, connect and wait then do not slow the members on a shared host);
// it gets its priority back here, when the state starts to move. Linux nice values are per
// thread, so every thread of the process is raised again.
inline void restore_join_priority() {
  const auto n = env::get_int("EBBFLOW_JOIN_NICE", 0, 0, 19);
  if (n == 0) return;
  int failed = 0, err = 0;
  for_each_thread([&](pid_t t) {
    const auto tid = static_cast<id_t>(t);
    errno = 0;
    const int cur = ::getpriority(PRIO_PROCESS, tid);
    if (errno != 0) return;
    if (::setpriority(PRIO_PROCESS, tid, std::max(-20, cur - static_cast<int>(n))) != 0) {
      ++failed;
      err = errno;
    }
  });
  if (failed)
    EBBFLOW_LOG_WARN("admitted, but the CPU priority lowered by EBBFLOW_JOIN_NICE="
                     << n << " could not be restored (" << std::strerror(err) << "; needs CAP_SYS_NICE)");
  else
    EBBFLOW_LOG_INFO("the members switched: CPU priority raised back by EBBFLOW_JOIN_NICE="
                     << n << " (nice now " << ::getpriority(PRIO_PROCESS, 0) << ")");
}

// group_options::sched_slice: every thread of this process asks for a
// scheduler slice of `slice` (Linux 6.12+ EEVDF custom slices: sched_setattr
// with sched_runtime, keeping each thread's policy and nice; threads created
// later inherit it). Real-time and deadline threads are left alone. A
// kernel without per-task slices accepts and ignores the request: read
// back, that is logged once.
inline void request_sched_slice(std::chrono::microseconds slice) {
  struct sched_attr_v0 {  // struct sched_attr, SCHED_ATTR_SIZE_VER0 (glibc 2.36 has no wrapper)
    std::uint32_t size;
    std::uint32_t sched_policy;
    std::uint64_t sched_flags;
    std::int32_t sched_nice;
    std::uint32_t sched_priority;
    std::uint64_t sched_runtime;
    std::uint64_t sched_deadline;
    std::uint64_t sched_period;
  };
  static_assert(sizeof(sched_attr_v0) == 48);
  const auto ns = static_cast<std::uint64_t>(std::chrono::nanoseconds(slice).count());
  int failed = 0, err = 0, set = 0;
  for_each_thread([&](pid_t tid) {
    const int policy = ::sched_getscheduler(tid);
    if (policy < 0) return;  // the thread ended
    const int base = policy & ~SCHED_RESET_ON_FORK;
    if (base != SCHED_OTHER && base != SCHED_BATCH && base != SCHED_IDLE) return;
    errno = 0;
    const int nice = ::getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
    if (errno != 0) return;
    sched_attr_v0 a{};
    a.size = sizeof a;
    a.sched_policy = static_cast<std::uint32_t>(base);
    a.sched_flags = (policy & SCHED_RESET_ON_FORK) ? 0x01 : 0;  // SCHED_FLAG_RESET_ON_FORK
    a.sched_nice = nice;
    a.sched_runtime = ns;
    if (::syscall(SYS_sched_setattr, tid, &a, 0) != 0) {
      ++failed;
      err = errno;
    } else {
      ++set;
    }
  });
  sched_attr_v0 back{};
  const bool honoured =
      set > 0 && ::syscall(SYS_sched_getattr, 0, &back, sizeof back, 0) == 0 && back.sched_runtime == ns;
  if (failed)
    EBBFLOW_LOG_WARN("EBBFLOW_SCHED_SLICE_US=" << slice.count() << ": " << failed << " thread(s) refused ("
                                               << std::strerror(err) << ")");
  else if (!honoured)
    EBBFLOW_LOG_WARN("EBBFLOW_SCHED_SLICE_US=" << slice.count()
                                               << " has no effect: this kernel keeps no per-task slice (Linux 6.12+)");
  else
    EBBFLOW_LOG_INFO("scheduler slice " << slice.count() << " us for " << set << " thread(s)");
}

// group_options::rt_priority: the given threads (the group's: the thread
// that trains, its heartbeat) run under SCHED_RR at `priority`, with
// SCHED_RESET_ON_FORK: threads and processes they start later (clone resets
// it for both) are normal ones. Threads not named here stay normal: a
// real-time thread that spins while a normal one holds what it waits for
// keeps the core from it (UCX's progress thread at real-time priority kept
// the admission helper off both cores over tcp until the kernel throttled
// it).
inline void request_rt_priority(int priority, std::span<const pthread_t> threads) {
  int failed = 0, err = 0, set = 0;
  sched_param p{};
  p.sched_priority = priority;
  for (const pthread_t t : threads) {
    if (const int e = ::pthread_setschedparam(t, SCHED_RR | SCHED_RESET_ON_FORK, &p); e == 0) {
      ++set;
    } else {
      ++failed;
      err = e;
    }
  }
  if (failed)
    EBBFLOW_LOG_WARN("EBBFLOW_RT_PRIORITY=" << priority << ": " << failed << " thread(s) refused ("
                                            << std::strerror(err) << "; needs CAP_SYS_NICE or RLIMIT_RTPRIO >= "
                                            << priority << "), they stay normal threads");
  else
    EBBFLOW_LOG_INFO("SCHED_RR priority " << priority << " for " << set << " thread(s)");
}

// The calling thread at the lowest CPU priority of a normal thread: nice 19,
// and out of the real-time class that group_options::rt_priority may have
// handed down from the thread that started it.
inline void lowest_cpu_priority() {
  const int policy = ::sched_getscheduler(0) & ~SCHED_RESET_ON_FORK;
  if (policy == SCHED_RR || policy == SCHED_FIFO) {
    sched_param p{};
    ::sched_setscheduler(0, SCHED_OTHER, &p);  // lowering needs no privilege
  }
  const auto tid = static_cast<id_t>(::gettid());
  errno = 0;
  if (const int cur = ::getpriority(PRIO_PROCESS, tid); errno == 0) ::setpriority(PRIO_PROCESS, tid, std::max(cur, 19));
}

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
