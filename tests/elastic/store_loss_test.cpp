// SPDX-License-Identifier: Apache-2.0
// What a job does when what it waits for is gone, with real processes
// (ebbflow-run, a standalone ebbflow-store, UCX, examples/elastic_train):
// the store SIGKILLed while training (docs/elastic.md, "When the store
// dies"), and a group left below its minimum size with nobody to join. Each
// ends within a bound and says why; none waits for a deadline it need not.
#include <gtest/gtest.h>

#include "../common/job_test.hpp"

#include <fstream>
#include <string>

namespace {

using namespace std::chrono_literals;

// Seconds between two `date +%s.%N` stamps the job's shell left in the folder.
double seconds_between(const std::filesystem::path& dir, const std::string& from, const std::string& to) {
  double a = 0, b = 0;
  std::ifstream(dir / from) >> a;
  std::ifstream(dir / to) >> b;
  return b - a;
}

class StoreLoss : public ebbflow_test::job_test {
 protected:
  // Runs 2 workers of elastic_train (`steps` steps) under `ebbflow-run
  // --attach --elastic <flags>` to a standalone ebbflow-store, SIGKILLs the
  // store 0.3 s after the first generation formed (stamp `store_killed`),
  // then runs `then` (shell; `$job` is the launcher's pid) and waits for the
  // job (stamp `job_end`). Returns the job's output; its exit status is the
  // result's. when(pattern, stamp) is a `then` that stamps the moment the
  // job's output first shows `pattern`: times are taken from events the job
  // reports, so a loaded machine's slow training does not count.
  ebbflow_test::shell_result run_losing_the_store(const std::string& flags, int steps, const std::string& then) {
    const std::string script = "{ " EBBFLOW_STORE_TOOL
                               " --port 0 --token tok > store.out 2>&1 & echo $! > store.pid; }"
                               " && for i in $(seq 100); do grep -q listening store.out && break; sleep 0.1; done"
                               " && port=$(sed -n 's/.*listening on 127.0.0.1:\\([0-9]*\\).*/\\1/p' store.out)"
                               " && { EBBFLOW_TOKEN=tok EBBFLOW_LOG=info EBBFLOW_LEASE_MS=500 " EBBFLOW_RUN
                               " -n 2 --attach --store 127.0.0.1:$port --elastic " +
                               flags + " -- " ELASTIC_TRAIN " --steps " + std::to_string(steps) +
                               " --step-us 2000 > job.out 2>&1 & job=$!; }"
                               " && for i in $(seq 600); do grep -q '(initial)' job.out && break; sleep 0.05; done"
                               " && sleep 0.3 && kill -9 $(cat store.pid) && date +%s.%N > store_killed\n" +
                               then + "\nwait $job; rc=$?; date +%s.%N > job_end; cat job.out; exit $rc";
    return run_here("timeout 120 bash -c \"" + escape(script) + "\"");
  }

  static std::string when(const std::string& pattern, const std::string& stamp) {
    return "{ until grep -q '" + pattern + "' job.out; do sleep 0.02; done; date +%s.%N > " + stamp + "; } &";
  }

  static std::string escape(const std::string& s) {
    std::string out;
    for (char c : s) {
      if (c == '"' || c == '$' || c == '\\' || c == '`') out += '\\';
      out += c;
    }
    return out;
  }
};

// The job trains on without its store and completes its steps: every worker
// exits 0 (finish() says it could not record the end instead of throwing),
// soon after the last step, not a store timeout (10 s) later.
TEST_F(StoreLoss, AJobThatCompletesItsStepsExitsZeroSoonAfterItsStoreDied) {
  const auto r = run_losing_the_store("", 1500, when("could not record it", "finished"));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("the store cannot be reached"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the job finished, but the store could not record it"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("finished 1500 steps"), std::string::npos) << r.output;
  // From the last step's finish() to the end of the job: no store timeout
  // (10 s) on the way out.
  EXPECT_LT(seconds_between(dir_.path(), "finished", "job_end"), 2.0) << r.output;
}

// SIGTERM without a store: the members leave at the next step boundary
// (the coordinator without writing the leave's record) and the job ends at
// once, before ebbflow-run's --kill-after (5 s) would SIGKILL them.
TEST_F(StoreLoss, SigtermWithoutAStoreEndsTheJobAtOnce) {
  const auto r = run_losing_the_store("", 100000, "sleep 0.5 && date +%s.%N > term && kill -TERM $job");
  EXPECT_NE(r.output.find("leaving without it"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("SIGKILL"), std::string::npos) << r.output;
  EXPECT_LT(seconds_between(dir_.path(), "term", "job_end"), 2.0) << r.output;
}

// A worker dies after the store did (SIGKILLed by the launcher 1 s into
// training, 0.7 s after the store): the survivor cannot re-form the group and
// says so, within a lease or so of the kill, instead of failing on a store key.
TEST_F(StoreLoss, AFailureWithoutAStoreStopsTheSurvivorWithAClearError) {
  const auto r = run_losing_the_store("--event-clock training --kill 1:1", 100000, when("killing worker 1", "killed"));
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("generation 0 failed and the store cannot be reached"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the group cannot re-form without its store"), std::string::npos) << r.output;
  EXPECT_LT(seconds_between(dir_.path(), "killed", "job_end"), 3.0) << r.output;
}

// Below EBBFLOW_MIN_SIZE with nobody to join: the survivor gives up once it
// waited EBBFLOW_MIN_WAIT_MS, not the operation deadline on top, and names
// the minimum, the workers left and the wait.
TEST_F(StoreLoss, BelowTheMinimumTheSurvivorGivesUpAtTheMinimumWaitNamingIt) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = launch("--event-clock training -n 2 --min 2 --kill 0.4:1",
                        ELASTIC_TRAIN " --steps 100000 --step-us 2000", "EBBFLOW_MIN_WAIT_MS=2000", 120);
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("only 1 worker(s) left after generation 0 failed, below EBBFLOW_MIN_SIZE=2, and none "
                          "joined within EBBFLOW_MIN_WAIT_MS=2000 ms"),
            std::string::npos)
      << r.output;
  // The kill 0.4 s into training, then 2 s (and a loaded machine's start-up): far from the 32 s
  // of the operation deadline on top.
  EXPECT_LT(took, 20s) << r.output;
}

}  // namespace
