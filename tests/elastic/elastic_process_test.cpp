// SPDX-License-Identifier: Apache-2.0
// The elastic group with real processes: ebbflow-run, the Asio store, UCX,
// examples/elastic_train. Each scenario trains with workers joining, leaving
// and being SIGKILLed, then checks that the final parameters equal a
// single-process run over the same global batches (the proof that no sample
// was lost or repeated and that the gradient weighting is exact), and the
// world-size history the workers reported.
#include <gtest/gtest.h>

#include "../common/job_test.hpp"

#include <sys/resource.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <regex>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

using ebbflow_test::run_shell;

int count(const std::string& hay, const std::string& needle) {
  int n = 0;
  for (auto pos = hay.find(needle); pos != std::string::npos; pos = hay.find(needle, pos + 1)) ++n;
  return n;
}

// Shell commands that start a standalone ebbflow-store with `token` in the
// current folder, stop it when the shell exits, and set $port to its port
// (their status is non-zero when it did not come up within 10 s).
std::string standalone_store(const std::string& token) {
  return "{ " EBBFLOW_STORE_TOOL " --port 0 --token " + token +
         " > store.out 2>&1 & echo $! > store.pid; }"
         " && trap 'kill $(cat store.pid)' EXIT"
         " && for i in $(seq 100); do grep -q listening store.out && break; sleep 0.1; done"
         " && port=$(sed -n 's/.*listening on 127.0.0.1:\\([0-9]*\\).*/\\1/p' store.out) && [ -n \"$port\" ]";
}

// Jobs of examples/elastic_train, each checked against the single-process
// run over the same global batches.
class ElasticProcess : public ebbflow_test::job_test {
 protected:
  // Runs the elastic job and the reference; returns the job's output. The
  // launcher's timed events count from the first generation, so on a loaded
  // machine none lands while the workers still start (unless a test asks
  // for --event-clock launch: the last flag wins).
  // `wrapper`: a command prefix for every worker (e.g. into a namespace).
  std::string train(const std::string& launcher_flags, const std::string& env = "", int steps = 300,
                    const std::string& extra = "", const std::string& wrapper = "") {
    const std::string common = " --steps " + std::to_string(steps) + " --sample-us 150 --step-us 1500 " + extra;
    auto job = launch("--event-clock training " + launcher_flags,
                      wrapper + " " ELASTIC_TRAIN + common + " --params-out elastic.bin --trace .", env);
    EXPECT_EQ(job.status, 0) << job.output;
    // The loop runs on while a join finishes (keep_training), so a job may
    // commit more steps than asked: the reference runs as many.
    const std::string ref_common = " --steps " + std::to_string(committed_steps(job.output, steps)) +
                                   " --sample-us 150 --step-us 1500 " + extra;
    auto ref = reference(ref_common + " --trace .");
    EXPECT_EQ(ref.status, 0) << ref.output;
    // Sample by sample: every committed step trained on each sample of its
    // global batch exactly once, across all processes and attempts, with the
    // same sums and state on every member; and the first step, if any, whose
    // parameters drift from the single-process run's.
    const auto traced = run_shell("python3 " CHECK_TRACE " " + dir_.string() + " --steps " + std::to_string(steps));
    EXPECT_EQ(traced.status, 0) << traced.output << job.output;
    expect_equals_reference(job.output);
    return job.output;
  }

  // The steps the job committed, from rank 0's "finished N steps" line
  // (`asked` when there is none).
  static int committed_steps(const std::string& out, int asked) {
    std::smatch m;
    if (std::regex_search(out, m, std::regex("finished ([0-9]+) steps"))) return std::stoi(m[1]);
    return asked;
  }

  // The single-process run over the same global batches, with `flags`: its
  // parameters go to ref.bin in the test's folder.
  ebbflow_test::shell_result reference(const std::string& flags) const {
    return run_here(ELASTIC_TRAIN + flags + " --reference --params-out ref.bin");
  }

  // train(), which must also end within `limit`: a member that waited for an
  // operation deadline (60 s in the tests that use this) would show.
  std::string train_within(std::chrono::seconds limit, const std::string& launcher_flags, const std::string& env,
                           int steps) {
    const auto t0 = std::chrono::steady_clock::now();
    auto out = train(launcher_flags, env, steps);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, limit) << out;
    return out;
  }

  // The job's parameters (elastic.bin) against the reference's (ref.bin),
  // both in the test's folder; `log` is shown on a failure.
  void expect_equals_reference(const std::string& log) {
    expect_same_parameters(dir_ / "elastic.bin", dir_ / "ref.bin", log);
  }

  // A worker that hangs at fault point `fault` (2.5 s) is dropped on its
  // lease and rejoins; the job ends equal to the reference.
  void expect_hang_survived(const std::string& fault);
};

}  // namespace

// A newcomer started lower (--join-nice) waits for the switch at that
// priority and is raised back when the state moves (the only place that
// logs this line); the parameters still equal the reference.
TEST_F(ElasticProcess, JoinNiceNewcomerGetsItsPriorityBackAtTheSwitch) {
  const int ours = ::getpriority(PRIO_PROCESS, 0);
  const auto out = train("-n 2 --join-nice 5 --add 0.4", "EBBFLOW_LOG=info");
  EXPECT_GE(count(out, "world changed (join)"), 1) << out;
  EXPECT_EQ(count(out, "raised back by EBBFLOW_JOIN_NICE=5 (nice now " + std::to_string(ours) + ")"), 1) << out;
}

// --sched-slice-us: each member asks for the slice once it is one (the
// two launched workers at the start, the newcomer at the switch): each
// logs it once, or once that this kernel keeps no per-task slice. The
// parameters still equal the reference.
TEST_F(ElasticProcess, SchedSliceIsAskedForOnceByEveryMember) {
  const auto out = train("-n 2 --sched-slice-us 250 --add 0.4", "EBBFLOW_LOG=info");
  EXPECT_GE(count(out, "world changed (join)"), 1) << out;
  EXPECT_EQ(count(out, "scheduler slice 250 us for") + count(out, "EBBFLOW_SCHED_SLICE_US=250 has no effect"), 3)
      << out;
  EXPECT_EQ(count(out, "refused"), 0) << out;
}

// --rt-priority: each member switches to SCHED_RR once it is one (the three
// launched workers at the start, the newcomer as it waits for the switch),
// or says once why it could not; a member SIGKILLed later is recovered from
// by survivors that run at that priority. The parameters still equal the
// reference.
TEST_F(ElasticProcess, RtPriorityIsTakenOnceByEveryMember) {
  const auto out = train("-n 3 --rt-priority 2 --add 0.4 --kill 0.9:1", "EBBFLOW_LOG=info");
  EXPECT_GE(count(out, "world changed (join)"), 1) << out;
  EXPECT_GE(count(out, "world changed (failure)"), 1) << out;
  EXPECT_EQ(count(out, "SCHED_RR priority 2 for") + count(out, "EBBFLOW_RT_PRIORITY=2: "), 4) << out;
}

// The members that stay keep their endpoints to each other (install logs
// how many; a member that had to fall back to the blocking switch logs none).
TEST_F(ElasticProcess, JoinOfOneAndOfSeveralAtOnce) {
  const auto out = train("-n 2 --add 0.4 --add 0.9:2", "EBBFLOW_LOG=info");
  EXPECT_GE(count(out, "world changed (join)"), 2) << out;
  EXPECT_NE(out.find("-> 5 workers"), std::string::npos) << out;
  EXPECT_GE(count(out, " endpoints kept from generation"), 1) << out;
  EXPECT_EQ(count(out, ": 0 of 2 endpoints kept") + count(out, ": 0 of 4 endpoints kept") +
                count(out, ": 1 of 4 endpoints kept"),
            0)
      << out;
}

// Two jobs in a row on one standalone store (ebbflow-run --attach): each
// trains to the end. The second used to find the first one's generations
// under the shared key prefix and fail as a newcomer nobody admitted.
TEST_F(ElasticProcess, TwoJobsInARowOnOneStandaloneStore) {
  const auto r = run_here(standalone_store("two-jobs") +
                           " && for job in 1 2; do timeout 60 env EBBFLOW_TOKEN=two-jobs " EBBFLOW_RUN
                           " -n 2 --attach --store 127.0.0.1:$port -- " ELASTIC_TRAIN
                           " --steps 20 --sample-us 0 --step-us 0 || exit 1; done");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(count(r.output, "finished 20 steps"), 2) << r.output;
  EXPECT_EQ(count(r.output, " on the store at 127.0.0.1:"), 2) << r.output;  // a fresh prefix each
}

// A newcomer whose registered state differs from the members' (another
// build of the model, say: --hidden 32 against 64) stops with an error that
// names both sizes; the members roll back the step, go on without it, and
// end equal to the single-process run.
TEST_F(ElasticProcess, ANewcomerWithOtherStateFailsClearlyAndTheJobGoesOn) {
  const std::string common = " --steps 600 --sample-us 150 --step-us 1500";
  const auto r =
      run_here(standalone_store("other") +
                " || exit 1; export EBBFLOW_TOKEN=other EBBFLOW_JOB=other-state EBBFLOW_LEASE_MS=500;"
                " { timeout 60 " EBBFLOW_RUN " -n 2 --elastic --attach --store 127.0.0.1:$port -- " ELASTIC_TRAIN +
                common +
                " --params-out elastic.bin > job.out 2>&1; echo \"job exit $?\" >> job.out; } & job=$!;"
                " sleep 1; timeout 60 env EBBFLOW_JOIN=1 EBBFLOW_STORE=127.0.0.1:$port " ELASTIC_TRAIN +
                common + " --hidden 32 > joiner.out 2>&1; echo \"joiner exit $?\"; wait $job; cat joiner.out job.out");
  EXPECT_EQ(count(r.output, "joiner exit 1"), 1) << r.output;
  EXPECT_EQ(count(r.output, "job exit 0"), 1) << r.output;
  EXPECT_NE(r.output.find("state buffer 0 is 'params' of 19240 bytes on member "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("but 'params' of 9640 bytes here"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("finished 600 steps"), std::string::npos) << r.output;
  const auto ref = reference(common);
  ASSERT_EQ(ref.status, 0) << ref.output;
  expect_equals_reference(r.output);
}

TEST_F(ElasticProcess, GracefulLeave) {
  const auto out = train("-n 3 --leave 0.5:2");
  EXPECT_NE(out.find("world changed (leave): 3 -> 2"), std::string::npos) << out;
  EXPECT_EQ(out.find("(failure)"), std::string::npos) << out;
}

TEST_F(ElasticProcess, KillDuringStep) {
  const auto out = train("-n 3 --kill 0.5:1");
  EXPECT_NE(out.find("world changed (failure): 3 -> 2"), std::string::npos) << out;
}

// A launched worker killed while it starts: the others start without it
// after EBBFLOW_INITIAL_WAIT_MS (or, if it registered first, fail it over).
// Either way the job ends and equals the single-process run. A failover
// during the initial state transfer reports "0 -> 2": the members never
// saw the world of 3 (their first notice is the failure's).
TEST_F(ElasticProcess, KillOfAWorkerWhileItStarts) {
  const auto out = train("-n 3 --event-clock launch --kill 0.005:1", "EBBFLOW_INITIAL_WAIT_MS=1000");
  EXPECT_TRUE(out.find("initial worker(s) 1 did not register") != std::string::npos ||
              out.find("world changed (failure): 3 -> 2") != std::string::npos ||
              out.find("world changed (failure): 0 -> 2") != std::string::npos)
      << out;
}

// The same for launch rank 0, which writes the first generation: after the
// initial wait (and a lease) the others propose it without rank 0; or, if
// it wrote it and died before its state moved, one of the others serves its
// own initial state (the two tests below reach that point every time), or
// one that got all of it serves that ("0 -> 2", as above).
TEST_F(ElasticProcess, KillOfLaunchRankZeroWhileItStarts) {
  const auto out = train("-n 3 --event-clock launch --kill 0.005:0", "EBBFLOW_INITIAL_WAIT_MS=1000");
  EXPECT_TRUE(out.find("proposes it without rank 0") != std::string::npos ||
              out.find("world changed (failure): 3 -> 2") != std::string::npos ||
              out.find("world changed (failure): 0 -> 2") != std::string::npos ||
              out.find("serves its own initial state (step 0)") != std::string::npos)
      << out;
}

// Launch rank 0 dies after it wrote the first generation and before its
// initial state reached the others (EBBFLOW_FAULT=initial-sync: no timing
// involved). The two others re-form the group; the first of them serves its
// own initial state, which every launched worker holds as rank 0 did, and
// the job ends equal to the single-process run.
TEST_F(ElasticProcess, KillOfLaunchRankZeroBeforeItsInitialStateMoved) {
  const auto out = train("-n 3 --elastic", "EBBFLOW_FAULT=initial-sync");
  EXPECT_EQ(count(out, "EBBFLOW_FAULT=initial-sync"), 1) << out;
  EXPECT_EQ(count(out, "serves its own initial state (step 0)"), 1) << out;
  EXPECT_NE(out.find("-> 2 workers"), std::string::npos) << out;
}

// The same when it dies in the middle of sending it
// (EBBFLOW_FAULT=initial-sync-part: every receiver has the header and the
// first has a buffer). The receivers took it into a copy, so their own
// initial state is still whole, and one of them serves it.
TEST_F(ElasticProcess, KillOfLaunchRankZeroWhileItSendsItsInitialState) {
  const auto out = train("-n 3 --elastic", "EBBFLOW_FAULT=initial-sync-part");
  EXPECT_EQ(count(out, "EBBFLOW_FAULT=initial-sync-part"), 1) << out;
  EXPECT_EQ(count(out, "serves its own initial state (step 0)"), 1) << out;
  EXPECT_NE(out.find("-> 2 workers"), std::string::npos) << out;
}

// Without that copy (EBBFLOW_INITIAL_STAGING_MB=0, as for a state larger
// than the limit) both survivors were part written: the state is lost, and
// they stop with a clear error instead of training on mixed buffers.
TEST_F(ElasticProcess, WithoutStagingASenderDeathMidwayLosesTheInitialStateWithAClearError) {
  auto job = launch("-n 3 --elastic", ELASTIC_TRAIN " --steps 300 --sample-us 150 --step-us 1500 --params-out elastic.bin",
                    "EBBFLOW_FAULT=initial-sync-part EBBFLOW_INITIAL_STAGING_MB=0", 60);
  EXPECT_NE(job.status, 0) << job.output;
  EXPECT_EQ(count(job.output, "EBBFLOW_FAULT=initial-sync-part"), 1) << job.output;
  EXPECT_EQ(count(job.output, "no member holding the training state is left"), 2) << job.output;
  EXPECT_EQ(count(job.output, "serves its own initial state"), 0) << job.output;
  EXPECT_FALSE(fs::exists(dir_ / "elastic.bin")) << job.output;
}

// The same on a job resumed from a checkpoint: the survivor that serves its
// own state serves its restored position (step, epoch, cursor) with it, and
// the job ends where a run that never stopped ends.
TEST_F(ElasticProcess, KillOfLaunchRankZeroBeforeItsRestoredStateMoved) {
  const std::string common = " --steps 300 --sample-us 150 --step-us 1500 --checkpoint ck.bin";
  auto first = launch("-n 2", ELASTIC_TRAIN + common + " --checkpoint-at 120", "", 60);
  ASSERT_EQ(first.status, 0) << first.output;
  auto job = launch("-n 3 --elastic", ELASTIC_TRAIN + common + " --resume --params-out elastic.bin",
                    "EBBFLOW_FAULT=initial-sync", 60);
  ASSERT_EQ(job.status, 0) << job.output;
  EXPECT_EQ(count(job.output, "serves its own initial state and restored position (step 120)"), 1) << job.output;
  auto ref = reference(" --steps 300 --sample-us 150 --step-us 1500");
  ASSERT_EQ(ref.status, 0) << ref.output;
  expect_equals_reference(job.output);
}

// Must-show of the equivalence property in one run: heterogeneous workers
// (worker k is 1, 2 or 3 times slower, so the planner gives them unequal
// slices and the gradient weighting is tested) join, leave and are SIGKILLed
// at random times. The schedule comes from a seed named in any failure;
// EBBFLOW_TEST_SEED=S runs that schedule again.
TEST_F(ElasticProcess, HeterogeneousWorkersJoinLeaveAndDieAtRandomTimes) {
  const char* fixed = std::getenv("EBBFLOW_TEST_SEED");
  const std::uint64_t seed = fixed ? std::stoull(fixed) : std::random_device{}();
  std::mt19937_64 rng(seed);
  auto at = [&] {
    char b[16];
    std::snprintf(b, sizeof b, "%.2f", std::uniform_real_distribution<double>(0.2, 1.6)(rng));
    return std::string(b);
  };
  const int added = 1 + static_cast<int>(rng() % 2), leaver = static_cast<int>(rng() % 3);
  const int victim = (leaver + 1 + static_cast<int>(rng() % 2)) % 3;
  const std::string flags = "-n 3 --add " + at() + ":" + std::to_string(added) + " --add " + at() + " --leave " + at() +
                            ":" + std::to_string(leaver) + " --kill " + at() + ":" + std::to_string(victim);
  SCOPED_TRACE("EBBFLOW_TEST_SEED=" + std::to_string(seed) + ": ebbflow-run " + flags);
  const auto out = train(flags, "", 800, "--slowdowns 1,2,3");
  EXPECT_EQ(count(out, "worker " + std::to_string(victim) + " (pid"), 1) << out;
  EXPECT_NE(out.find("asking worker " + std::to_string(leaver) + " to leave"), std::string::npos) << out;
  for (int w = 3; w < 4 + added; ++w)  // every newcomer took part
    EXPECT_GE(count(out, "[worker " + std::to_string(w) + "] world changed"), 1) << w << "\n" << out;
  const auto spread = run_shell("python3 " CHECK_TRACE " " + dir_.string() +
                                " --steps 800 --min-spread 3");  // 1x against 2x and 3x: about 6x
  EXPECT_EQ(spread.status, 0) << spread.output;
}

TEST_F(ElasticProcess, KillOfTheCoordinator) {
  const auto out = train("-n 3 --kill 0.5:0");
  EXPECT_NE(out.find("world changed (failure): 3 -> 2"), std::string::npos) << out;
}

// Two failures at once, one of them the coordinator's: the survivors may see
// them in one recovery (5 -> 3) or in two (5 -> 4 -> 3); either way the job
// ends with three workers and equal to the reference.
TEST_F(ElasticProcess, TwoWorkersKilledAtOnceOneOfThemTheCoordinator) {
  const auto out = train("-n 5 --kill 0.5:0 --kill 0.5:2");
  for (int w : {0, 2}) EXPECT_EQ(count(out, "worker " + std::to_string(w) + " (pid"), 1) << w << "\n" << out;
  EXPECT_TRUE(out.find("world changed (failure): 5 -> 3") != std::string::npos ||
              out.find("world changed (failure): 4 -> 3") != std::string::npos)
      << out;
  EXPECT_EQ(count(out, "steps in"), 1) << out;
  EXPECT_NE(out.find("world size 3,"), std::string::npos) << out;
}

// Three SIGKILLs at once in a group of 8 while two newcomers join, then a
// leave: the newcomers come in with the recovery or after it, the leave is
// applied, six workers finish, and the job ends equal to the reference
// (trace and parameters). A survivor revoked before its own transport saw a
// death reports none, so some death is often reported by nobody; the
// survivors then find its process gone on this host instead of waiting for
// its lease, which is made 20 s here so that a wait for it would show.
TEST_F(ElasticProcess, ThreeKilledAtOnceWhileTwoJoinThenALeave) {
  const auto out =
      train("-n 8 --kill 0.5:1 --kill 0.5:4 --kill 0.5:6 --add 0.5:2 --leave 1.0:3", "EBBFLOW_LEASE_MS=20000", 400);
  for (int w : {1, 4, 6}) EXPECT_EQ(count(out, "worker " + std::to_string(w) + " (pid"), 1) << w << "\n" << out;
  for (int w : {8, 9}) EXPECT_GE(count(out, "[worker " + std::to_string(w) + "] world changed"), 1) << w << "\n" << out;
  EXPECT_NE(out.find("asking worker 3 to leave"), std::string::npos) << out;
  EXPECT_NE(out.find("world size 6,"), std::string::npos) << out;
  const std::regex failure(R"(world changed \(failure\): \d+ -> \d+ workers at step \d+, ready after ([0-9.]+) ms)");
  double worst = 0;
  for (std::sregex_iterator m(out.begin(), out.end(), failure), end; m != end; ++m)
    worst = std::max(worst, std::stod((*m)[1]));
  EXPECT_GT(worst, 0) << out;
  EXPECT_LT(worst, 10000) << "a survivor waited for a dead member's lease\n" << out;
}

// A failure while two newcomers join: whichever stage the join has reached
// (waiting for admission, connecting in the background, receiving the
// state), the job ends with both newcomers in and equal to the reference.
TEST_F(ElasticProcess, KillOfAMemberWhileTwoNewcomersJoin) {
  const auto out = train("-n 3 --add 0.5:2 --kill 0.5:1");
  EXPECT_EQ(count(out, "worker 1 (pid"), 1) << out;
  for (int w : {3, 4}) EXPECT_GE(count(out, "[worker " + std::to_string(w) + "] world changed"), 1) << w << "\n" << out;
  EXPECT_NE(out.find("world size 4,"), std::string::npos) << out;
}

// A stopped worker (SIGSTOP: a hung process) fails no transport operation:
// only its silent lease (500 ms here) tells the others. They drop it and
// train on; continued 1.5 s later, it finds itself left out and rejoins. The
// operation deadline is 60 s, so only the lease can have ended the wait.
TEST_F(ElasticProcess, AStoppedWorkerIsDroppedWhenItsLeaseExpiresAndRejoins) {
  const auto out = train_within(std::chrono::seconds(30), "-n 3 --stop 0.5:1:1.5", "EBBFLOW_OP_TIMEOUT_MS=60000", 800);
  EXPECT_NE(out.find("sent no heartbeat for EBBFLOW_LEASE_MS=500 ms"), std::string::npos) << out;
  EXPECT_NE(out.find("world changed (failure): 3 -> 2"), std::string::npos) << out;
  EXPECT_NE(out.find("left out of generation"), std::string::npos) << out;
  EXPECT_NE(out.find("world changed (join): 2 -> 3"), std::string::npos) << out;
}

// Hangs during the state transfer (Elastic Horovod's "hang during the state
// broadcast"): the sender (the coordinator, which serves the first newcomer)
// or the newcomer stops for 2.5 s in the middle of it. The others drop it
// when its lease runs out, the state comes from another holder, and the hung
// worker rejoins when it wakes. The operation deadline is 60 s.
void ElasticProcess::expect_hang_survived(const std::string& fault) {
  const auto out = train_within(std::chrono::seconds(30), "-n 3 --add 0.5",
                                "EBBFLOW_OP_TIMEOUT_MS=60000 EBBFLOW_FAULT=" + fault + ":hang=2500", 1000);
  EXPECT_NE(out.find("hangs here for 2500 ms"), std::string::npos) << out;
  EXPECT_NE(out.find("sent no heartbeat for EBBFLOW_LEASE_MS=500 ms"), std::string::npos) << out;
  EXPECT_NE(out.find("(failure)"), std::string::npos) << out;
  // Once: a member left out rejoins as a newcomer and never adopts the
  // generation it was admitted to before (it did, over and over, until its
  // new admission: thirteen times in one run).
  EXPECT_EQ(count(out, "left out of generation"), 1) << out;
}

TEST_F(ElasticProcess, HangOfTheSenderDuringStateTransfer) { expect_hang_survived("sync-send"); }

TEST_F(ElasticProcess, HangOfTheJoinerDuringStateTransfer) { expect_hang_survived("sync-recv"); }

// One member's admission helper is overdue (EBBFLOW_FAULT=admission-helper:
// it sleeps two leases), so every member finishes the join the blocking way
// while the others' helpers have already started their transports, which
// took the peers' one-time wire-up messages. Finishing those transports
// (not starting second ones, which waited for the messages until the 60 s
// operation deadline) keeps the join quick; the job equals the reference.
TEST_F(ElasticProcess, AnOverdueAdmissionHelperFinishesTheJoinTheBlockingWayWithoutAStall) {
  const auto out = train_within(std::chrono::seconds(30), "-n 3 --add 0.5",
                                "EBBFLOW_OP_TIMEOUT_MS=60000 EBBFLOW_FAULT=admission-helper:sleep=1000", 600);
  EXPECT_EQ(count(out, "EBBFLOW_FAULT=admission-helper: member "), 1) << out;
  EXPECT_NE(out.find("'s thread sleeps here for 1000 ms"), std::string::npos) << out;
  EXPECT_NE(out.find("world changed (join): 3 -> 4"), std::string::npos) << out;
}

TEST_F(ElasticProcess, KillOfTheSenderDuringStateTransfer) {
  const auto out = train("-n 3 --add 0.5", "EBBFLOW_FAULT=sync-send");
  EXPECT_NE(out.find("EBBFLOW_FAULT=sync-send"), std::string::npos) << out;
  EXPECT_NE(out.find("(failure)"), std::string::npos) << out;
}

TEST_F(ElasticProcess, LosingEveryHolderOfTheStateIsAClearError) {
  // The only member dies while it sends the state to a joiner: nobody holds
  // the training state any more. The joiner must say so and exit, never
  // re-form a group of its own and train on from zeroed parameters.
  auto job = launch("-n 1 --add 0.5", ELASTIC_TRAIN " --steps 300 --sample-us 150 --step-us 1500 --params-out elastic.bin",
                    "EBBFLOW_FAULT=sync-send", 60);
  EXPECT_NE(job.status, 0) << job.output;
  EXPECT_NE(job.output.find("EBBFLOW_FAULT=sync-send"), std::string::npos) << job.output;
  EXPECT_NE(job.output.find("no member holding the training state is left"), std::string::npos) << job.output;
  EXPECT_FALSE(fs::exists(dir_ / "elastic.bin")) << job.output;
}

TEST_F(ElasticProcess, KillOfTheJoinerDuringStateTransfer) {
  const auto out = train("-n 2 --add 0.5", "EBBFLOW_FAULT=sync-recv");
  EXPECT_NE(out.find("EBBFLOW_FAULT=sync-recv"), std::string::npos) << out;
  EXPECT_NE(out.find("(failure)"), std::string::npos) << out;
}

TEST_F(ElasticProcess, JoinAndLeaveWithoutBackgroundConnect) {
  // EBBFLOW_PRECONNECT=0: the members stop at the change until wired up.
  const auto out = train("-n 2 --add 0.4 --add 0.9:2 --leave 1.4:1", "EBBFLOW_PRECONNECT=0");
  EXPECT_GE(count(out, "world changed (join)"), 2) << out;
  EXPECT_NE(out.find("-> 5 workers"), std::string::npos) << out;
  EXPECT_NE(out.find("world changed (leave): 5 -> 4"), std::string::npos) << out;
}

TEST_F(ElasticProcess, KillWhileALeaveIsConnectingInTheBackground) {
  // Worker 1 asks to leave; the others start connecting without it while it
  // keeps training, and one of them dies then (EBBFLOW_FAULT=preconnect).
  // The leaver must leave (not rejoin), the dead one is failed over.
  const auto out = train("-n 4 --leave 0.5:1", "EBBFLOW_FAULT=preconnect");
  EXPECT_NE(out.find("EBBFLOW_FAULT=preconnect"), std::string::npos) << out;
  EXPECT_NE(out.find("(failure)"), std::string::npos) << out;
  EXPECT_NE(out.find("-> 2 workers"), std::string::npos) << out;
  EXPECT_EQ(out.find("rejoining"), std::string::npos) << out;
}

TEST_F(ElasticProcess, KillOfAMemberWhileConnectingToAJoiner) {
  // Known fault, open: about 2 runs in 5 under load or ASan, a member left
  // out of the failure generation ("left out of generation N: rejoining")
  // never rejoins: every rejoin generation fails at once until the job is
  // killed. Seen 2026-12-07 after the UCX failure-attribution and etcd
  // merges; passes alone. Skipped until fixed (issue note of that day);
  // EBBFLOW_TEST_KNOWN_FAULTS=1 runs it.
  if (const char* k = std::getenv("EBBFLOW_TEST_KNOWN_FAULTS"); !k || std::string(k) != "1")
    GTEST_SKIP() << "known fault: a left-out joiner's rejoin can livelock (EBBFLOW_TEST_KNOWN_FAULTS=1 runs it)";
  const auto out = train("-n 3 --add 0.5", "EBBFLOW_FAULT=preconnect");
  EXPECT_NE(out.find("EBBFLOW_FAULT=preconnect"), std::string::npos) << out;
  EXPECT_NE(out.find("(failure)"), std::string::npos) << out;
  EXPECT_NE(out.find("-> 3 workers"), std::string::npos) << out;
}

TEST_F(ElasticProcess, KillOfAJoinerWhileTheMembersConnectInTheBackground) {
  // Known fault, open: about 2 runs in 5 under load or ASan, a member left
  // out of the failure generation ("left out of generation N: rejoining")
  // never rejoins: every rejoin generation fails at once until the job is
  // killed. Seen 2026-12-07 after the UCX failure-attribution and etcd
  // merges; passes alone. Skipped until fixed (issue note of that day);
  // EBBFLOW_TEST_KNOWN_FAULTS=1 runs it.
  if (const char* k = std::getenv("EBBFLOW_TEST_KNOWN_FAULTS"); !k || std::string(k) != "1")
    GTEST_SKIP() << "known fault: a left-out joiner's rejoin can livelock (EBBFLOW_TEST_KNOWN_FAULTS=1 runs it)";
  // The joiner dies after it was admitted, before it wired up: the members,
  // still training on the old generation, must not wait for it forever.
  const auto out = train("-n 2 --add 0.5:2", "EBBFLOW_FAULT=join-connect");
  EXPECT_NE(out.find("EBBFLOW_FAULT=join-connect"), std::string::npos) << out;
  EXPECT_NE(out.find("-> 3 workers"), std::string::npos) << out;
}

// A joiner that dies during the state transfer (EBBFLOW_FAULT=sync-recv*3:
// the first three to get there), restarted by the launcher each time: from
// its slot's second failure in a row on, the launcher waits a cool-down
// (--restart-cooldown, doubling) before it restarts it, so the members fail
// over less often; the fourth incarnation joins, and nothing is lost.
TEST_F(ElasticProcess, AJoinerThatKeepsFailingIsRestartedAfterACoolDown) {
  const auto out = train("-n 2 --add 0.3 --restart 3 --restart-cooldown 0.3",
                         "EBBFLOW_FAULT='sync-recv*3' EBBFLOW_JOIN_COOLDOWN=0", 1500);
  EXPECT_EQ(count(out, "held back"), 0) << out;  // the group's own cool-down is off here
  EXPECT_EQ(count(out, "EBBFLOW_FAULT=sync-recv"), 3) << out;
  EXPECT_GE(count(out, "world changed (failure)"), 3) << out;
  EXPECT_EQ(count(out, "restarting it as a joiner ("), 1) << out;  // the first failure: at once
  EXPECT_NE(out.find("failed 2 times in a row: restarting it as a joiner in 0.3 s"), std::string::npos) << out;
  EXPECT_NE(out.find("failed 3 times in a row: restarting it as a joiner in 0.6 s"), std::string::npos) << out;
  EXPECT_NE(out.find("-> 3 workers"), std::string::npos) << out;
}

// The same without the launcher's cool-down: the group holds the worker's
// next tickets back (EBBFLOW_JOIN_COOLDOWN), whoever restarts it. Its join
// failures count per worker key (ebbflow-run: host/slot): none after the
// first, then SEC, doubling.
TEST_F(ElasticProcess, AJoinerThatKeepsFailingIsHeldBackByTheGroup) {
  const auto out = train("-n 2 --add 0.3 --restart 3 --restart-cooldown 0",
                         "EBBFLOW_FAULT='sync-recv*3' EBBFLOW_JOIN_COOLDOWN=0.3:5", 1500);
  EXPECT_EQ(count(out, "EBBFLOW_FAULT=sync-recv"), 3) << out;
  EXPECT_EQ(count(out, "died while joining: its join failures in a row: "), 3) << out;
  EXPECT_EQ(count(out, "held back"), 2) << out;
  EXPECT_NE(out.find("failed 2 times in a row while joining: held back 0.3 s"), std::string::npos) << out;
  EXPECT_NE(out.find("failed 3 times in a row while joining: held back 0.6 s"), std::string::npos) << out;
  EXPECT_EQ(count(out, "cool-down over"), 0) << out;  // the launcher restarted at once every time
  EXPECT_NE(out.find("-> 3 workers"), std::string::npos) << out;
}

// In-step work stealing with real processes (claims on the Asio store):
// worker 0 is 4 times slower in 3 steps of every 10, the others take over
// its tails, and a join, a SIGKILL and a leave happen meanwhile; every
// sample is still processed exactly once (the parameters equal the
// reference). A newcomer still starting when the kill lands is admitted by
// the recovery instead ("generation 1 (join) was decided before generation 0
// failed"; seen under ASan): either way worker 3 must take part.
TEST_F(ElasticProcess, WorkStealingAcrossAJoinAKillAndALeave) {
  const auto out = train("-n 3 --add 0.3 --kill 1.0:1 --leave 1.4:2", "", 400, "--steal --straggle 0:0:3:4:10");
  EXPECT_GE(count(out, "[worker 3] world changed (join)") + count(out, "[worker 3] world changed (failure)"), 1) << out;
  EXPECT_GE(count(out, "world changed (failure)"), 1) << out;
  EXPECT_GE(count(out, "world changed (leave)"), 1) << out;
  long long stolen = 0;
  for (auto pos = out.find("work stealing: stole "); pos != std::string::npos;
       pos = out.find("work stealing: stole ", pos + 1))
    stolen += std::stoll(out.substr(pos + 21));
  EXPECT_GT(stolen, 0) << out;
}

// A training thread stuck for 1.5 s outside ebbflow (its heartbeat goes on,
// so its lease stays fresh): the coordinator, waiting in the step's
// allreduce, names it after EBBFLOW_STALL_WARN_MS (in a line with one
// prefix, the launcher's and the log's: "[rank 0, ebbflow rank 0]"); nobody
// is dropped (the operation deadline is 30 s) and the job equals the
// reference.
TEST_F(ElasticProcess, TheStallWarningNamesAWorkerStuckOutsideEbbflow) {
  const auto out = train("-n 3", "EBBFLOW_STALL_WARN_MS=500", 60, "--straggle 1:30:31:1000");
  const std::regex warning(
      R"(\[rank 0, ebbflow rank 0\] warn: .*member \d+ has waited \d+ ms in collective 1 of step 30; )"
      R"(member\(s\) \d+ \(rank 1\) have not reached it while their heartbeats go on)");
  EXPECT_TRUE(std::regex_search(out, warning)) << out;
  EXPECT_EQ(count(out, "world changed (failure)"), 0) << out;
}

// The survivor of a failure below --min waits: no group of one is ever
// formed (nothing is trained alone), and the failure's generation comes when
// the newcomer is there to take the dead worker's place (2 -> 2). Every step
// is committed once (the trace) and the job equals the reference.
TEST_F(ElasticProcess, BelowMinSizeWaitsThenResumesWhenAWorkerArrives) {
  const auto out = train("-n 2 --min 2 --kill 0.4:1 --add 1.5");
  EXPECT_NE(out.find("below EBBFLOW_MIN_SIZE=2: waiting for workers"), std::string::npos) << out;
  EXPECT_EQ(out.find("-> 1 workers"), std::string::npos) << out;
  EXPECT_NE(out.find("world changed (failure): 2 -> 2 workers"), std::string::npos) << out;
  EXPECT_NE(out.find("world size 2,"), std::string::npos) << out;
}

// Workers in containers of one host share the boot id, but a pid means
// another process in each pid namespace, and with address randomisation off
// two workers there can even have their probe word at the same address:
// here each worker runs as pid 1 of its own pid namespace with the same
// layout. Before the per-transport nonce and the pid-namespace check, ranks
// 1 and 2 took each other for local peers (a single-copy read of pid 1 read
// the reader itself). No peer may be local; the job equals the reference.
TEST_F(ElasticProcess, WorkersInOtherPidNamespacesAreNeverSingleCopyPeers) {
  if (run_shell("unshare --pid --fork --kill-child setarch $(uname -m) -R true").status != 0)
    GTEST_SKIP() << "cannot make pid namespaces here (not root, or a container without CAP_SYS_ADMIN)";
  const auto out =
      train("-n 3", "EBBFLOW_LOG=debug", 100, "", "unshare --pid --fork --kill-child setarch $(uname -m) -R");
  EXPECT_EQ(count(out, "peers on this host (single-copy reads)"), 3) << out;
  EXPECT_EQ(count(out, ": 0 of 2 peers on this host"), 3) << out;
}

TEST_F(ElasticProcess, WorkerWithoutTheJobTokenIsRefused) {
  // A store with one token, a worker with another.
  auto r = launch("-n 1 --token right", "env EBBFLOW_TOKEN=wrong " ELASTIC_TRAIN " --steps 5", "", 30);
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("unauthorized"), std::string::npos) << r.output;
}

// A newcomer whose admission the members decided but that connects only
// after the job's last step (here it sleeps 4 s at join-connect) is taken
// in: the documented loop (keep_training) runs on while the change
// finishes, so nobody is stranded. It used to get errc::job_finished. The
// job exits 0 with no failed worker, and commits more than the 100 steps
// asked.
TEST_F(ElasticProcess, ANewcomerStillConnectingAtTheEndIsTakenIn) {
  auto r = launch("--event-clock training -n 2 --add 0.2:1", ELASTIC_TRAIN " --steps 100 --sample-us 150 --step-us 1500",
                  "EBBFLOW_FAULT=join-connect:sleep=4000", 60);
  EXPECT_EQ(r.status, 0) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex(R"(\[worker 0\] finished ([0-9]+) steps in [0-9.]+ s: world size 3)")))
      << r.output;
  EXPECT_GT(std::stoi(m[1]), 100) << r.output;
  EXPECT_EQ(r.output.find("exited with status"), std::string::npos) << r.output;
}

// A worker started after the job finished, under the same EBBFLOW_JOB on
// a store that is still up, is refused at once (job_finished: the example
// says so and exits 0) instead of waiting out its join timeout as a
// newcomer: keep_training marked the job finished.
TEST_F(ElasticProcess, AWorkerStartedAfterTheEndIsRefusedAtOnce) {
  const auto r = run_here(standalone_store("t") +
                          " && export EBBFLOW_STORE=127.0.0.1:$port EBBFLOW_TOKEN=t EBBFLOW_JOB=late"
                          " && " EBBFLOW_RUN " --attach --store 127.0.0.1:$port -n 2 -- " ELASTIC_TRAIN
                          " --steps 30 --sample-us 150 --step-us 1500"
                          " && start=$(date +%s%N)"
                          " && EBBFLOW_JOIN=1 EBBFLOW_JOIN_TIMEOUT_MS=60000 " ELASTIC_TRAIN " --steps 30 2>&1"
                          " && echo late worker took $(( ($(date +%s%N) - start) / 1000000 )) ms");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 0] finished 30 steps"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the job EBBFLOW_JOB='late' on this store has finished"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("nothing left to do"), std::string::npos) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex("late worker took ([0-9]+) ms"))) << r.output;
  EXPECT_LT(std::stoi(m[1]), 5000) << "the late worker waited to join: " << r.output;
}
