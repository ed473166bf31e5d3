// SPDX-License-Identifier: Apache-2.0
// Separate compilation (ebbflow::compiled, config.hpp) changes where the code
// is compiled, not what it does: examples/elastic_train built against the
// compiled library trains, with a join and a SIGKILL under ebbflow-run, to
// the parameters of the header-only build's single-process reference.
#include <gtest/gtest.h>

#include "../common/job_test.hpp"

#include <string>

namespace {

class Compiled : public ebbflow_test::job_test {};

TEST_F(Compiled, TheSeparatelyCompiledGroupTrainsAsTheHeaderOnlyOne) {
  const std::string flags = " --steps 300 --sample-us 150 --step-us 1500";
  const auto job = launch("--event-clock training -n 2 --add 0.4 --kill 0.9:1",
                          ELASTIC_TRAIN_COMPILED + flags + " --params-out elastic.bin");
  ASSERT_EQ(job.status, 0) << job.output;
  EXPECT_NE(job.output.find("world changed (join)"), std::string::npos) << job.output;
  EXPECT_NE(job.output.find("world changed (failure)"), std::string::npos) << job.output;
  const auto ref = run_here(ELASTIC_TRAIN + flags + " --reference --params-out ref.bin");
  ASSERT_EQ(ref.status, 0) << ref.output;
  expect_same_parameters(dir_ / "elastic.bin", dir_ / "ref.bin", job.output);
}

}  // namespace
