// SPDX-License-Identifier: Apache-2.0
// CPU time of the calling thread: for tests that check a wait sleeps
// rather than spins (CPU time over wall time, which load on the machine
// does not inflate).
#pragma once

#include <time.h>

namespace ebbflow_test {

inline double thread_cpu_seconds() noexcept {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

}  // namespace ebbflow_test
