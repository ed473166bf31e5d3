// SPDX-License-Identifier: Apache-2.0
// The fixture of the end-to-end tests that run real elastic jobs (ebbflow-run,
// its store, UCX, an example program as the workers): every test gets a fresh
// folder, removed when it ends whatever the outcome, and launches its group
// members there with one helper. The test's target defines EBBFLOW_RUN (the
// launcher's path).
#pragma once

#include "shell.hpp"
#include "temp_dir.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#ifndef EBBFLOW_RUN
#error "job_test.hpp: the test target defines EBBFLOW_RUN, the path of ebbflow-run"
#endif

namespace ebbflow_test {

//! The largest relative difference between two parameter files' values
//! (over the shorter one; the callers check the sizes).
inline double worst_relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (std::size_t k = 0; k < std::min(a.size(), b.size()); ++k)
    worst = std::max(worst, static_cast<double>(std::abs(a[k] - b[k])) / (1e-3 + std::abs(b[k])));
  return worst;
}

class job_test : public ::testing::Test {
 protected:
  //! Runs `cmd` with `sh -c` in the test's folder.
  [[nodiscard]] shell_result run_here(const std::string& cmd) const {
    return run_shell("cd " + dir_.string() + " && " + cmd);
  }

  //! Launches group members, `ebbflow-run <launcher> -- <worker>`, in the
  //! test's folder with EBBFLOW_LEASE_MS=500 (a silent member is dropped
  //! quickly) and `env` (NAME=VALUE ...), stopped after `timeout_s` seconds.
  [[nodiscard]] shell_result launch(const std::string& launcher, const std::string& worker,
                                    const std::string& env = "", int timeout_s = 120) const {
    return run_here("timeout " + std::to_string(timeout_s) + " env EBBFLOW_LEASE_MS=500 " + env + " " EBBFLOW_RUN " " +
                    launcher + " -- " + worker);
  }

  //! The parameters a job wrote (`job`, float32) against those of the
  //! single-process run (`reference`): the same but for sums taken in another
  //! order (float rounding, a few ulps a step). `log` is shown when not.
  void expect_same_parameters(const std::filesystem::path& job, const std::filesystem::path& reference,
                              const std::string& log) const {
    const auto a = read_floats(job), b = read_floats(reference);
    ASSERT_EQ(a.size(), b.size()) << log;
    ASSERT_FALSE(a.empty()) << log;
    EXPECT_LT(worst_relative_difference(a, b), 1e-3) << "parameters differ by more than float reassociation\n"
                                                       << log;
  }

  temp_dir dir_{"ebbflow-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name()) +
                "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name()};
};

}  // namespace ebbflow_test
