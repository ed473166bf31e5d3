// SPDX-License-Identifier: Apache-2.0
// How the examples end on an exception: the message, prefixed with the
// program's name, and the exit status. Shared by the examples; not part of
// the library.
#pragma once

#include <ebbflow/core/error.hpp>

#include <cstdio>
#include <exception>
#include <system_error>

namespace exit_status {

//! Prints `e` and returns the exit status: 0 when the elastic job ended
//! before this worker joined it (e.g. started by --add or --restart near
//! the last step: nothing left to train, not a failure), 1 otherwise.
inline int of(const char* program, const std::exception& e) {
  const auto* se = dynamic_cast<const std::system_error*>(&e);
  if (se && se->code() == ebbflow::errc::job_finished) {
    std::fprintf(stderr, "%s: %s; nothing left to do\n", program, e.what());
    return 0;
  }
  std::fprintf(stderr, "%s: %s\n", program, e.what());
  return 1;
}

}  // namespace exit_status
