// SPDX-License-Identifier: Apache-2.0
// ebbflow-run and ebbflow-store as real processes.
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/elastic/tcp_store.hpp>

#include "../../tools/ebbflow-run/child_processes.hpp"
#include "../common/temp_dir.hpp"
#include "../thread_cpu.hpp"

#include <gtest/gtest.h>

#include <sched.h>
#include <sys/resource.h>

#include <cerrno>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace ef = ebbflow;
namespace el = ebbflow::elastic;
using namespace std::chrono_literals;

namespace {
struct run_result {
  ebbflow_run::child_exit exit;
  std::string out, err;
  double seconds = 0;
};

//! Runs `argv` to completion (at most `limit`), capturing its output.
run_result run(std::vector<std::string> argv, std::vector<std::pair<std::string, std::string>> env = {},
               std::chrono::milliseconds limit = 20s, std::function<void(pid_t)> meanwhile = {}) {
  run_result r;
  ebbflow_run::child_processes g(
      [&](int, int stream, std::string_view line) { (stream == 1 ? r.out : r.err).append(line).push_back('\n'); });
  ebbflow_run::child_spec s;
  s.argv = std::move(argv);
  s.env = std::move(env);
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = g.spawn(s);
  if (meanwhile) meanwhile(pid);
  const auto d = ef::deadline::after(limit);
  while (g.running() > 0 && !d.expired()) {
    auto e = g.poll(d);
    if (!e.empty()) r.exit = e.front();
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(g.running(), 0u) << "did not finish within the limit";
  return r;
}
}  // namespace

// A wait for children sleeps in the kernel until its deadline. It used to
// wait in poll(2)'s whole milliseconds, which rounded the last fraction of one
// down to 0 and spun through it: ebbflow-run, which waits in 20 ms slices,
// kept a core 5 % busy that way, beside the workers it launched.
TEST(Launcher, WaitingForChildrenSleepsInsteadOfSpinning) {
  ebbflow_run::child_processes g([](int, int, std::string_view) {});
  ebbflow_run::child_spec s;
  s.argv = {"sleep", "0.5"};
  g.spawn(s);
  const auto cpu = ebbflow_test::thread_cpu_seconds;
  const double c0 = cpu();
  const auto t0 = std::chrono::steady_clock::now();
  const auto limit = ef::deadline::after(10s);
  int waits = 0;
  while (g.running() > 0 && !limit.expired()) {
    (void)g.poll(ef::deadline::after(2500us));  // 2.5 ms: poll(2) would wait 2 and spin through the half
    ++waits;
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double busy = (cpu() - c0) / wall;
  ASSERT_EQ(g.running(), 0u) << "sleep 0.5 did not end";
  EXPECT_GT(waits, 50) << "each wait should have lasted about 2.5 ms";
  EXPECT_LT(busy, 0.08) << "the waiting thread was busy " << busy * 100 << " % of " << wall << " s, over " << waits
                        << " waits";
}

TEST(Launcher, FourRanksMeetInTheStore) {
  auto r = run({EBBFLOW_RUN, "-n", "4", "--", EBBFLOW_STORE_WORKER, "meet"});
  EXPECT_TRUE(r.exit.ok()) << r.exit.describe() << "\nstdout:\n" << r.out << "stderr:\n" << r.err;
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_NE(r.out.find("[rank " + std::to_string(rank) + "] rank " + std::to_string(rank) + " of 4 met everyone"),
              std::string::npos)
        << r.out;
}

TEST(Launcher, AKilledRankFailsTheJobAndIsNamed) {
  auto r = run({EBBFLOW_RUN, "-n", "4", "--", EBBFLOW_STORE_WORKER, "meet"}, {{"EBBFLOW_TEST_DIE_RANK", "2"}});
  EXPECT_EQ(r.exit.code, 128 + SIGKILL) << r.exit.describe() << "\n" << r.err;
  const auto at = r.err.find("rank 2 (pid ");
  ASSERT_NE(at, std::string::npos) << r.err;
  EXPECT_NE(r.err.find(") failed: killed by signal 9 (SIGKILL); stopping the other ranks", at), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("job failed: rank 2 killed by signal 9"), std::string::npos) << r.err;
  EXPECT_LT(r.seconds, 8.0) << "the surviving ranks were not stopped promptly";
}

TEST(Launcher, ANonZeroExitIsNamedAndReturned) {
  auto r = run(
      {EBBFLOW_RUN, "-n", "3", "--", "sh", "-c", "echo hello from $EBBFLOW_RANK; [ $EBBFLOW_RANK != 1 ] || exit 3"});
  EXPECT_EQ(r.exit.code, 3) << r.err;
  EXPECT_NE(r.err.find("failed: exited with status 3"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("job failed: rank 1 exited with status 3"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("[rank 1] hello from 1"), std::string::npos) << r.out;
}

TEST(Launcher, JobTimeoutStopsEveryRank) {
  auto r = run({EBBFLOW_RUN, "-n", "2", "--timeout", "0.3", "--", "sleep", "30"});
  EXPECT_EQ(r.exit.code, 124) << r.err;
  EXPECT_NE(r.err.find("job timeout"), std::string::npos) << r.err;
  EXPECT_LT(r.seconds, 5.0);
}

TEST(Launcher, ForwardsSigterm) {
  auto r = run({EBBFLOW_RUN, "-n", "2", "--", "sleep", "30"}, {}, 20s, [](pid_t launcher) {
    std::this_thread::sleep_for(300ms);
    ::kill(launcher, SIGTERM);
  });
  EXPECT_EQ(r.exit.code, 128 + SIGTERM) << r.err;
  EXPECT_NE(r.err.find("received SIGTERM; forwarding it to the ranks"), std::string::npos) << r.err;
  EXPECT_LT(r.seconds, 5.0);
}

//! A standalone store (`argv` runs ebbflow-store on a free port): the
//! process and the port from its "listening on" line (0 if none came).
struct standalone_store {
  std::string out;
  ebbflow_run::child_processes group{[this](int, int stream, std::string_view line) {
    if (stream == 1) out.append(line).push_back('\n');
  }};
  std::uint16_t port = 0;
  explicit standalone_store(std::vector<std::string> argv, std::vector<std::pair<std::string, std::string>> env = {}) {
    ebbflow_run::child_spec s;
    s.argv = std::move(argv);
    s.env = std::move(env);
    group.spawn(s);
    const auto d = ef::deadline::after(10s);
    while (out.find('\n') == std::string::npos && !d.expired()) group.poll(ef::deadline::after(20ms));
    const std::string banner = "listening on 127.0.0.1:";
    if (const auto at = out.find(banner); at != std::string::npos)
      port = static_cast<std::uint16_t>(std::stoi(out.substr(at + banner.size())));
  }
};

TEST(Launcher, AttachesToAStandaloneStore) {
  standalone_store store({EBBFLOW_STORE_TOOL, "--port", "0", "--token", "standalone-token"});
  ASSERT_NE(store.port, 0) << store.out;
  const std::string addr = "127.0.0.1:" + std::to_string(store.port);
  auto r = run({EBBFLOW_RUN, "-n", "3", "--attach", "--store", addr, "--token", "standalone-token", "--",
                EBBFLOW_STORE_WORKER, "meet"});
  EXPECT_TRUE(r.exit.ok()) << r.err;
  el::store_client c("127.0.0.1", store.port, "standalone-token");
  EXPECT_EQ(c.get("met", ef::deadline::after(2s)), "3");
  store.group.signal_all(SIGTERM);
  auto e = store.group.poll(ef::deadline::after(5s));
  ASSERT_EQ(e.size(), 1u);
  EXPECT_TRUE(e[0].ok()) << e[0].describe();
}

// A standalone store outlives its jobs. Each job the launcher attaches to it
// gets a fresh key prefix (EBBFLOW_JOB) unless one is named; a named job
// that already finished there is refused (its workers took the old job's
// generations for theirs and failed as newcomers nobody admitted).
TEST(Launcher, AttachGivesEachJobAPrefixOfItsOwn) {
  standalone_store store({EBBFLOW_STORE_TOOL, "--port", "0", "--token", "standalone-token"});
  ASSERT_NE(store.port, 0) << store.out;
  const std::string addr = "127.0.0.1:" + std::to_string(store.port);
  const std::vector<std::string> job = {EBBFLOW_RUN, "-n", "1",       "--attach",
                                        "--store",   addr, "--token", "standalone-token",
                                        "--",        "sh", "-c",      "echo job=$EBBFLOW_JOB"};
  auto job_of = [](const run_result& r) {
    const auto at = r.out.find("job=");
    return at == std::string::npos ? std::string() : r.out.substr(at + 4, r.out.find('\n', at) - at - 4);
  };
  auto a = run(job), b = run(job);
  ASSERT_TRUE(a.exit.ok() && b.exit.ok()) << a.err << b.err;
  EXPECT_TRUE(job_of(a).starts_with("ebbflow-")) << a.out;
  EXPECT_NE(job_of(a), job_of(b)) << "two jobs on one store share a prefix";
  EXPECT_NE(a.err.find("job " + job_of(a) + " on the store at " + addr), std::string::npos) << a.err;

  el::store_client c("127.0.0.1", store.port, "standalone-token");
  c.set("finished-job/done", "1", ef::deadline::after(2s));
  auto refused = run(job, {{"EBBFLOW_JOB", "finished-job"}});
  EXPECT_EQ(refused.exit.code, 2) << refused.exit.describe();
  EXPECT_NE(refused.err.find("already holds a finished job EBBFLOW_JOB=finished-job"), std::string::npos)
      << refused.err;
  EXPECT_EQ(refused.out.find("job="), std::string::npos) << "a worker started: " << refused.out;
  auto named = run(job, {{"EBBFLOW_JOB", "named-job"}});
  EXPECT_TRUE(named.exit.ok()) << named.err;
  EXPECT_EQ(job_of(named), "named-job");
  store.group.signal_all(SIGTERM);
  (void)store.group.poll(ef::deadline::after(5s));
}

// With --attach the launcher checks the store first: a token the store
// refuses is one clear line (not every worker failing on its own), and
// without --token or EBBFLOW_TOKEN it uses the empty token, as a store
// started without one expects (a random one could never match).
TEST(Launcher, AttachChecksTheStoreAndItsToken) {
  standalone_store guarded({EBBFLOW_STORE_TOOL, "--port", "0", "--token", "right"});
  ASSERT_NE(guarded.port, 0) << guarded.out;
  auto wrong = run({EBBFLOW_RUN, "-n", "2", "--attach", "--store", "127.0.0.1:" + std::to_string(guarded.port),
                    "--token", "wrong", "--", "sh", "-c", "echo started"});
  EXPECT_EQ(wrong.exit.code, 1) << wrong.exit.describe();
  EXPECT_NE(wrong.err.find("refused the job token"), std::string::npos) << wrong.err;
  EXPECT_EQ(wrong.out.find("started"), std::string::npos) << "workers were started: " << wrong.out;

  standalone_store open({EBBFLOW_STORE_TOOL, "--port", "0"}, {{"EBBFLOW_TOKEN", ""}});
  ASSERT_NE(open.port, 0) << open.out;
  auto r = run({EBBFLOW_RUN, "-n", "2", "--attach", "--store", "127.0.0.1:" + std::to_string(open.port), "--",
                EBBFLOW_STORE_WORKER, "meet"},
               {{"EBBFLOW_TOKEN", ""}});
  EXPECT_TRUE(r.exit.ok()) << r.exit.describe() << "\n" << r.err;
  for (auto* s : {&guarded, &open}) {
    s->group.signal_all(SIGTERM);
    (void)s->group.poll(ef::deadline::after(5s));
  }
}

// EBBFLOW_LOCAL_RANK (a GPU index) is the lowest index no running worker
// holds: a joiner started after worker 1 died takes index 1 (it was its
// worker id, 2, past the devices of a 2-GPU host).
TEST(Launcher, AJoinerTakesTheLocalRankAWorkerLeftFree) {
  auto r = run({EBBFLOW_RUN, "-n", "2", "--elastic", "--kill", "0.3:1", "--add", "0.8", "--", "sh", "-c",
                "echo id=$EBBFLOW_WORKER_ID local=$EBBFLOW_LOCAL_RANK; sleep 1.5"});
  EXPECT_TRUE(r.exit.ok()) << r.exit.describe() << "\n" << r.err;
  EXPECT_NE(r.out.find("[worker 0] id=0 local=0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[worker 1] id=1 local=1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[worker 2] id=2 local=1"), std::string::npos) << r.out << r.err;
}

// Usage errors are one line that names the option (exit status 2), not the
// whole help text after it.
TEST(Launcher, UsageErrorsNameTheOptionInOneLine) {
  for (const auto& [args, says] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"-n", "2", "--store", "bogus", "--", "true"}, "--store 'bogus': expected HOST:PORT"},
           {{"-n", "2", "--min", "3", "--", "true"}, "--min 3 is larger than -n 2"},
           {{"-n", "2", "--attach", "--", "true"}, "--attach needs --store HOST:PORT with a port"},
           {{"-n", "2", "--bogus", "--", "true"}, "unknown option --bogus"}}) {
    std::vector<std::string> argv{EBBFLOW_RUN};
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = run(argv);
    EXPECT_EQ(r.exit.code, 2) << says;
    EXPECT_NE(r.err.find(says), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

TEST(Launcher, JoinersStartAtTheLowerPriorityAskedFor) {
  // `nice` prints the niceness: the initial worker keeps ours, the joiner
  // starts 7 lower and is told so (EBBFLOW_JOIN_NICE) so the group can
  // restore it once admitted.
  errno = 0;
  const int ours = ::getpriority(PRIO_PROCESS, 0);
  ASSERT_EQ(errno, 0);
  auto r = run({EBBFLOW_RUN, "-n", "1", "--elastic", "--join-nice", "7", "--add", "0.1", "--", "sh", "-c",
                "echo nice=$(nice) join_nice=${EBBFLOW_JOIN_NICE:-none}; sleep 0.5"});
  EXPECT_TRUE(r.exit.ok()) << r.exit.describe() << "\n" << r.err;
  EXPECT_NE(r.out.find("[worker 0] nice=" + std::to_string(ours) + " join_nice=none"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[worker 1] nice=" + std::to_string(std::min(19, ours + 7)) + " join_nice=7"), std::string::npos)
      << r.out;
  auto bad = run({EBBFLOW_RUN, "-n", "1", "--join-nice", "25", "--", "true"});
  EXPECT_EQ(bad.exit.code, 2);
  EXPECT_NE(bad.err.find("--join-nice"), std::string::npos) << bad.err;
}

TEST(Launcher, AWorkerThatKeepsFailingIsRestartedAfterACoolDown) {
  // Every joiner fails at once. The first failure of a slot restarts it at
  // once; the second and later wait 0.2 s, 0.4 s, ... (--restart-cooldown),
  // stamped on the launcher's lines.
  auto r = run({EBBFLOW_RUN, "-n", "1", "--add", "0.1", "--restart", "3", "--restart-cooldown", "0.2", "--", "sh", "-c",
                "if [ -n \"$EBBFLOW_JOIN\" ]; then exit 3; fi; sleep 2"});
  EXPECT_TRUE(r.exit.ok()) << r.exit.describe() << "\n" << r.err;
  std::vector<double> starts;  // the joiners' start stamps
  for (std::size_t p = r.err.find("(joins the running job) [t="); p != std::string::npos;
       p = r.err.find("(joins the running job) [t=", p + 1))
    starts.push_back(std::stod(r.err.substr(p + 27)));
  ASSERT_EQ(starts.size(), 4u) << r.err;
  EXPECT_LT(starts[1] - starts[0], 0.15) << r.err;  // first failure: at once
  EXPECT_GE(starts[2] - starts[1], 0.2) << r.err;
  EXPECT_GE(starts[3] - starts[2], 0.4) << r.err;
  EXPECT_NE(r.err.find("worker slot 1 failed 3 times in a row: restarting it as a joiner in 0.4 s"), std::string::npos)
      << r.err;
  for (const char* bad_value : {"x", "1:0.5", "-1"}) {
    auto bad = run({EBBFLOW_RUN, "-n", "1", "--restart-cooldown", bad_value, "--", "true"});
    EXPECT_EQ(bad.exit.code, 2) << bad_value;
    EXPECT_NE(bad.err.find("--restart-cooldown"), std::string::npos) << bad.err;
  }
}

TEST(Launcher, CpuBindGivesEachWorkerItsCpuBeforeExec) {
  // Worker ID runs on our (ID / K)-th CPU, wrapping around; the binding is
  // in place when the program starts (the shell reads its own status), for
  // initial workers and joiners alike.
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(::sched_getaffinity(0, sizeof set, &set), 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  auto r = run({EBBFLOW_RUN, "-n", "3", "--elastic", "--cpu-bind", "core:2", "--add", "0.1", "--", "sh", "-c",
                "echo cpus=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status); sleep 0.3"});
  EXPECT_TRUE(r.exit.ok()) << r.exit.describe() << "\n" << r.err;
  for (int id = 0; id < 4; ++id) {
    const int cpu = cpus[static_cast<std::size_t>(id / 2) % cpus.size()];
    EXPECT_NE(r.out.find("[worker " + std::to_string(id) + "] cpus=" + std::to_string(cpu) + "\n"), std::string::npos)
        << "worker " << id << " should run on CPU " << cpu << ":\n"
        << r.out;
  }
  for (const char* bad_value : {"socket", "core:0", "core:x", ""}) {
    auto bad = run({EBBFLOW_RUN, "-n", "1", "--cpu-bind", bad_value, "--", "true"});
    EXPECT_EQ(bad.exit.code, 2) << bad_value;
    EXPECT_NE(bad.err.find("--cpu-bind"), std::string::npos) << bad.err;
  }
  // --store-cpu moves the launcher (and its store) only: the workers keep their CPUs.
  const int last = cpus.back();
  auto moved = run({EBBFLOW_RUN, "-n", "2", "--cpu-bind", "core", "--store-cpu", std::to_string(last), "--", "sh", "-c",
                    "echo cpus=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status) "
                    "launcher=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/$PPID/status)"});
  EXPECT_TRUE(moved.exit.ok()) << moved.exit.describe() << "\n" << moved.err;
  EXPECT_NE(moved.out.find("[rank 0] cpus=" + std::to_string(cpus[0]) + " launcher=" + std::to_string(last) + "\n"),
            std::string::npos)
      << moved.out;
  auto not_ours = run({EBBFLOW_RUN, "-n", "1", "--cpu-bind", "core", "--store-cpu", "1023", "--", "true"});
  EXPECT_EQ(not_ours.exit.code, 2);
  EXPECT_NE(not_ours.err.find("--store-cpu 1023: not one of the CPUs this launcher may use"), std::string::npos)
      << not_ours.err;
  auto alone = run({EBBFLOW_RUN, "-n", "1", "--store-cpu", std::to_string(last), "--", "true"});
  EXPECT_EQ(alone.exit.code, 2);
  EXPECT_NE(alone.err.find("--store-cpu needs --cpu-bind"), std::string::npos) << alone.err;
}

TEST(Launcher, SpawnNamesACpuItCannotBindTo) {
  ebbflow_run::child_processes g;
  ebbflow_run::child_spec s;
  s.argv = {"true"};
  s.cpus = {CPU_SETSIZE - 1};  // valid index, but no such CPU here
  try {
    g.spawn(s);
    FAIL() << "spawn bound a child to a CPU that does not exist";
  } catch (const std::system_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot bind 'true' to CPUs " + std::to_string(CPU_SETSIZE - 1)),
              std::string::npos)
        << e.what();
  }
  s.cpus = {-1};
  EXPECT_THROW(g.spawn(s), std::system_error);
}

// --stop SEC:ID:FOR stops a worker (a hung process) and continues it FOR
// seconds later: its clock readings, taken every 20 ms, show one gap of
// about that length, the other worker's none.
TEST(Launcher, StopHangsAWorkerForTheTimeAskedFor) {
  auto r = run({EBBFLOW_RUN, "-n", "2", "--stop", "0.3:0:0.6", "--", "sh", "-c",
                "i=0; while [ $i -lt 60 ]; do cut -d' ' -f1 /proc/uptime; sleep 0.02; i=$((i+1)); done"});
  EXPECT_TRUE(r.exit.ok()) << r.exit.describe() << "\n" << r.err;
  EXPECT_NE(r.err.find("stopping worker 0 (SIGSTOP) for 0.6 s"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("continuing worker 0 (SIGCONT)"), std::string::npos) << r.err;
  std::map<int, std::vector<double>> t;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    int w = -1;
    double x = 0;
    if (std::sscanf(line.c_str(), "[worker %d] %lf", &w, &x) == 2) t[w].push_back(x);
  }
  ASSERT_EQ(t[0].size(), 60u) << r.out;
  ASSERT_EQ(t[1].size(), 60u) << r.out;
  const auto widest = [](const std::vector<double>& v) {
    double g = 0;
    for (std::size_t k = 1; k < v.size(); ++k) g = std::max(g, v[k] - v[k - 1]);
    return g;
  };
  EXPECT_GE(widest(t[0]), 0.5) << r.out;
  EXPECT_LT(widest(t[1]), 0.4) << r.out;

  auto bad = run({EBBFLOW_RUN, "-n", "1", "--stop", "1:0", "--", "true"});
  EXPECT_EQ(bad.exit.code, 2);
  EXPECT_NE(bad.err.find("--stop '1:0': expected SEC:ID:FOR"), std::string::npos) << bad.err;
}

// The embedded store holds three connections per worker, so the launcher
// lifts its soft open-file limit to the hard one; its workers start with the
// limit it was given (here 256).
TEST(Launcher, LiftsItsOpenFileLimitForTheStoreButNotForTheWorkers) {
  rlimit l{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &l), 0);
  if (l.rlim_max <= 256) GTEST_SKIP() << "hard open-file limit " << l.rlim_max << " leaves nothing to lift";
  auto r = run({"sh", "-c",
                std::string("ulimit -Sn 256 && exec ") + EBBFLOW_RUN +
                    " -n 1 -- sh -c 'ulimit -Sn; grep \"Max open files\" /proc/$PPID/limits'"});
  EXPECT_TRUE(r.exit.ok()) << r.exit.describe() << "\n" << r.err;
  EXPECT_NE(r.out.find("[rank 0] 256\n"), std::string::npos) << r.out;
  unsigned long long soft = 0, hard = 0;
  const auto at = r.out.find("Max open files");
  ASSERT_NE(at, std::string::npos) << r.out;
  ASSERT_EQ(std::sscanf(r.out.c_str() + at, "Max open files %llu %llu", &soft, &hard), 2) << r.out;
  EXPECT_EQ(soft, hard) << r.out;
  EXPECT_EQ(hard, static_cast<unsigned long long>(l.rlim_max)) << r.out;
}

// A standalone store started with a soft open-file limit of 64 serves 150
// clients (a job of 50 workers): it lifts the limit to the hard one.
TEST(Launcher, AStandaloneStoreServesMoreClientsThanItsSoftFileLimit) {
  rlimit l{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &l), 0);
  if (l.rlim_max <= 256) GTEST_SKIP() << "hard open-file limit " << l.rlim_max << " leaves nothing to lift";
  standalone_store store(
      {"sh", "-c", std::string("ulimit -Sn 64 && exec ") + EBBFLOW_STORE_TOOL + " --port 0 --token t"});
  ASSERT_NE(store.port, 0) << store.out;
  std::vector<el::store_client> clients;
  for (int i = 0; i < 150; ++i) clients.emplace_back("127.0.0.1", store.port, "t");
  int served = 0;
  for (auto& c : clients) {
    std::error_code ec;
    c.add("clients", 1, ef::deadline::after(2s), ec);
    if (ec) break;
    ++served;
  }
  EXPECT_EQ(served, 150);
  store.group.signal_all(SIGTERM);
  store.group.poll(ef::deadline::after(5s));
}

// Wall-clock stamp ("[t=...]") of the first stderr line holding `what`; -1 if none.
double stamp_of(const std::string& err, const std::string& what) {
  const auto at = err.find(what);
  if (at == std::string::npos) return -1;
  const auto t = err.find("[t=", at);
  return t == std::string::npos ? -1 : std::stod(err.substr(t + 3));
}

// --event-clock training: the timed events count from the first generation
// (the store's ebbflow/gen/0), not from the launch. Here rank 0 writes that
// key 0.6 s after its start, so a kill 0.2 s "in" lands about 0.8 s after
// the launch; with the launch clock it lands 0.2 s after it.
TEST(Launcher, EventClockTrainingCountsFromTheFirstGeneration) {
  for (const std::string clock : {"training", "launch"}) {
    const double t0 = ebbflow::wall_seconds();
    auto r = run({EBBFLOW_RUN, "-n", "2", "--event-clock", clock, "--kill", "0.2:1", "--", EBBFLOW_STORE_WORKER,
                  "set-after", "600", "ebbflow/gen/0", "1500"});
    EXPECT_TRUE(r.exit.ok()) << r.exit.describe() << "\n" << r.err;
    const double formed = stamp_of(r.err, "the first generation formed"), killed = stamp_of(r.err, "killing worker 1");
    ASSERT_GT(killed, 0) << r.err;
    if (clock == "training") {
      ASSERT_GT(formed, 0) << r.err;
      // The stamps have millisecond resolution: 0.2 s may read as 0.199.
      EXPECT_GE(formed - t0, 0.59) << r.err;
      EXPECT_GE(killed - formed, 0.19) << r.err;
      EXPECT_LT(killed - formed, 0.6) << r.err;
    } else {
      EXPECT_LT(formed, 0) << r.err;  // no probe of the store
      EXPECT_LT(killed - t0, 0.6) << r.err;
    }
  }
  auto bad = run({EBBFLOW_RUN, "-n", "1", "--event-clock", "soon", "--", "true"});
  EXPECT_EQ(bad.exit.code, 2);
  EXPECT_NE(bad.err.find("--event-clock 'soon': expected launch or training"), std::string::npos) << bad.err;
}

TEST(Launcher, WorkStealingAcrossProcessesCoversEveryItemOnce) {
  // plan::run_stealing_step in four real processes over the launcher's store:
  // every item of every slice of every step is processed exactly once, and on
  // the steps where rank 1 is 6x slower the others take part of its slice.
  constexpr int steps = 12, ranks = 4, items = 48;
  auto r = run({EBBFLOW_RUN, "-n", std::to_string(ranks), "--", EBBFLOW_STORE_WORKER, "steal", std::to_string(steps)},
               {}, 60s);
  ASSERT_TRUE(r.exit.ok()) << r.exit.describe() << "\n" << r.err;
  std::vector<int> seen(steps * ranks * items, 0);
  std::vector<int> stolen_from_1(steps, 0);
  std::istringstream in(r.out);
  std::string line;
  int chunks = 0;
  while (std::getline(in, line)) {
    const auto at = line.find("chunk ");
    if (at == std::string::npos) continue;
    std::istringstream f(line.substr(at + 6));
    int s = -1, rank = -1, first = -1, last = -1, stolen = 0;
    f >> s >> rank >> first >> last >> stolen;
    ASSERT_TRUE(s >= 0 && s < steps && rank >= 0 && rank < ranks && first >= 0 && first < last && last <= items)
        << line;
    for (int i = first; i < last; ++i) ++seen[(s * ranks + rank) * items + i];
    if (rank == 1 && stolen) stolen_from_1[s] += last - first;
    ++chunks;
  }
  EXPECT_GT(chunks, steps * ranks) << r.out;
  for (std::size_t k = 0; k < seen.size(); ++k)
    ASSERT_EQ(seen[k], 1) << "step " << k / (ranks * items) << ", slice " << k / items % ranks << ", item " << k % items
                          << "\n"
                          << r.out;
  int slow_steps_helped = 0;
  for (int s = 1; s < steps; s += 2) slow_steps_helped += stolen_from_1[s] > 0;
  EXPECT_GE(slow_steps_helped, steps / 2 - 1) << r.out;
}

namespace {
// pids of the processes whose command line is `cmdline` (arguments joined by
// spaces): what a test leaves behind. Zombies have none and do not count.
std::vector<pid_t> processes_running(const std::string& cmdline) {
  std::vector<pid_t> found;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(entry.path() / "cmdline", std::ios::binary);
    std::string cmd((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    while (!cmd.empty() && cmd.back() == '\0') cmd.pop_back();
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (cmd == cmdline) found.push_back(static_cast<pid_t>(std::stoi(name)));
  }
  return found;
}

// True when no process runs `cmdline` within `limit` (SIGKILL takes a moment
// to land); kills what is left so that a failing test leaves nothing behind.
bool none_left(const std::string& cmdline, std::chrono::milliseconds limit = 1s) {
  const auto d = ef::deadline::after(limit);
  while (!processes_running(cmdline).empty() && !d.expired()) std::this_thread::sleep_for(20ms);
  const auto left = processes_running(cmdline);
  for (pid_t p : left) ::kill(p, SIGKILL);
  return left.empty();
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}
}  // namespace

// A --discovery command runs beside the job, never in its way: a command that
// hangs holds up neither the workers' exits, nor --timeout, nor a signal; it
// is killed (with what it started) after --discovery-timeout, named, and the
// job keeps its workers.
TEST(Launcher, ADiscoveryCommandThatHangsDoesNotHoldUpTheJob) {
  const std::string hang = "sleep 600.25";
  auto done = run({EBBFLOW_RUN, "-n", "1", "--discovery", hang, "--timeout", "3", "--", "sleep", "1"}, {}, 8s);
  EXPECT_TRUE(done.exit.ok()) << done.exit.describe() << "\n" << done.err;
  EXPECT_LT(done.seconds, 2.5) << done.err;

  auto timed_out = run({EBBFLOW_RUN, "-n", "1", "--discovery", hang, "--timeout", "0.5", "--", "sleep", "30"}, {}, 8s);
  EXPECT_EQ(timed_out.exit.code, 124) << timed_out.exit.describe() << "\n" << timed_out.err;
  EXPECT_LT(timed_out.seconds, 3.0) << timed_out.err;

  auto interrupted = run({EBBFLOW_RUN, "-n", "1", "--discovery", hang, "--", "sleep", "30"}, {}, 8s, [](pid_t l) {
    std::this_thread::sleep_for(500ms);
    ::kill(l, SIGTERM);
  });
  EXPECT_EQ(interrupted.exit.code, 128 + SIGTERM) << interrupted.exit.describe() << "\n" << interrupted.err;
  EXPECT_LT(interrupted.seconds, 3.0) << interrupted.err;

  auto killed = run({EBBFLOW_RUN, "-n", "1", "--discovery", "sh -c '" + hang + "; echo 3'", "--discovery-interval",
                     "0.2", "--discovery-timeout", "0.3", "--", "sleep", "1.2"},
                    {}, 8s);
  EXPECT_TRUE(killed.exit.ok()) << killed.exit.describe() << "\n" << killed.err;
  EXPECT_NE(killed.err.find("--discovery 'sh -c '" + hang +
                            "; echo 3'' did not finish within 0.3 s: killed it; "
                            "keeping 1 worker(s)"),
            std::string::npos)
      << killed.err;
  EXPECT_EQ(count(killed.err, "started worker"), 0u) << killed.err;
  EXPECT_TRUE(none_left(hang)) << "a --discovery command outlived its deadline or the launcher";

  auto bad = run({EBBFLOW_RUN, "-n", "1", "--discovery-timeout", "0", "--", "true"});
  EXPECT_EQ(bad.exit.code, 2);
  EXPECT_NE(bad.err.find("--discovery-timeout '0'"), std::string::npos) << bad.err;
}

// --discovery must print a whole number of workers: anything else is named
// (with what it printed) and the job keeps its size, never scaling to zero
// because of garbage. Spaces and a trailing newline around the number are fine.
TEST(Launcher, DiscoveryOutputThatIsNotAWholeNumberKeepsTheWorkers) {
  const std::vector<std::pair<std::string, std::string>> bad_outputs = {
      {"echo garbage", "garbage"},
      {"echo 3abc", "3abc"},
      {"echo", ""},
      {"echo -1", "-1"},
      {"echo 4097", "4097"},
      {"echo 99999999999999999999", "99999999999999999999"},
      {"printf '1\\n2\\n'", "1\\n2"},
      {"echo 1.5", "1.5"}};
  for (const auto& [cmd, printed] : bad_outputs) {
    auto r = run({EBBFLOW_RUN, "-n", "2", "--discovery", cmd, "--discovery-interval", "0.2", "--", "sleep", "0.6"});
    EXPECT_TRUE(r.exit.ok()) << cmd << ": " << r.exit.describe() << "\n" << r.err;
    EXPECT_NE(r.err.find("--discovery '" + cmd + "' printed \"" + printed +
                         "\", not a number of workers (0..4096); keeping 2 worker(s)"),
              std::string::npos)
        << cmd << "\n"
        << r.err;
    EXPECT_EQ(count(r.err, "to leave"), 0u) << cmd << "\n" << r.err;
    EXPECT_EQ(count(r.err, "started worker"), 0u) << cmd << "\n" << r.err;
  }
  auto failed = run(
      {EBBFLOW_RUN, "-n", "2", "--discovery", "echo 5; exit 3", "--discovery-interval", "0.2", "--", "sleep", "0.6"});
  EXPECT_TRUE(failed.exit.ok()) << failed.exit.describe() << "\n" << failed.err;
  EXPECT_NE(failed.err.find("--discovery 'echo 5; exit 3' exited with status 3; keeping 2 worker(s)"),
            std::string::npos)
      << failed.err;
  EXPECT_EQ(count(failed.err, "started worker"), 0u) << failed.err;

  // One poll: workers that finish would be replaced for as long as it asks for 3.
  auto grows =
      run({EBBFLOW_RUN, "-n", "1", "--discovery", "echo ' 3 '", "--discovery-interval", "100", "--", "sleep", "0.6"});
  EXPECT_TRUE(grows.exit.ok()) << grows.exit.describe() << "\n" << grows.err;
  EXPECT_EQ(count(grows.err, "started worker"), 2u) << grows.err;
}

// The documented exit status: a --timeout gives 124 and an interrupt
// 128 + signal even after an elastic worker failed (the failure did not stop
// the job: the timeout or the signal did); a rank failure that stopped the
// job keeps its status even if the timeout passes while the others stop.
TEST(Launcher, WhatStoppedTheJobDecidesTheExitStatus) {
  auto timed_out = run({EBBFLOW_RUN, "-n", "2", "--kill", "0.3:1", "--timeout", "1.5", "--", "sleep", "10"});
  EXPECT_EQ(timed_out.exit.code, 124) << timed_out.exit.describe() << "\n" << timed_out.err;

  auto interrupted = run({EBBFLOW_RUN, "-n", "2", "--kill", "0.3:1", "--", "sleep", "10"}, {}, 20s, [](pid_t l) {
    std::this_thread::sleep_for(1s);
    ::kill(l, SIGTERM);
  });
  EXPECT_EQ(interrupted.exit.code, 128 + SIGTERM) << interrupted.exit.describe() << "\n" << interrupted.err;

  auto failed = run({EBBFLOW_RUN, "-n", "2", "--timeout", "0.6", "--kill-after", "1", "--", "sh", "-c",
                     "[ $EBBFLOW_RANK = 1 ] && { sleep 0.2; exit 3; }; trap '' TERM; sleep 3"});
  EXPECT_EQ(failed.exit.code, 3) << failed.exit.describe() << "\n" << failed.err;
  EXPECT_NE(failed.err.find("job failed: rank 1 exited with status 3"), std::string::npos) << failed.err;
}

// A worker the launcher asked to leave (--discovery asking for fewer,
// SIGUSR2, --leave) retires, however it ends: it is neither restarted nor a
// failure of the job.
TEST(Launcher, AWorkerAskedToLeaveRetiresAndIsNotRestarted) {
  auto r = run({EBBFLOW_RUN, "-n", "2", "--restart", "3", "--discovery", "echo 1", "--discovery-interval", "0.3", "--",
                "sleep", "1.5"});
  EXPECT_TRUE(r.exit.ok()) << r.exit.describe() << "\n" << r.err;
  EXPECT_EQ(count(r.err, "asking worker 1 to leave"), 1u) << r.err;
  EXPECT_EQ(count(r.err, "restart"), 0u) << r.err;
  EXPECT_NE(r.err.find("worker 1 (pid "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(") retired as asked: killed by signal 15 (SIGTERM)"), std::string::npos) << r.err;

  auto usr2 = run({EBBFLOW_RUN, "-n", "2", "--", "sleep", "1.5"}, {}, 20s, [](pid_t l) {
    std::this_thread::sleep_for(300ms);
    ::kill(l, SIGUSR2);
  });
  EXPECT_TRUE(usr2.exit.ok()) << usr2.exit.describe() << "\n" << usr2.err;
  EXPECT_EQ(count(usr2.err, "stopping the other ranks"), 0u) << usr2.err;

  auto left = run({EBBFLOW_RUN, "-n", "2", "--restart", "2", "--leave", "0.3:1", "--", "sleep", "1.5"});
  EXPECT_TRUE(left.exit.ok()) << left.exit.describe() << "\n" << left.err;
  EXPECT_EQ(count(left.err, "restart"), 0u) << left.err;
}

// Each worker leads its own process group; whatever is left in it when the
// launcher ends (a background process that outlived the worker, one that
// ignored SIGTERM) is killed. (A launcher killed by SIGKILL can do nothing:
// docs/launcher.md.)
TEST(Launcher, NothingAWorkerStartedOutlivesTheLauncher) {
  const std::string bg = "sleep 77.125";
  auto r = run({EBBFLOW_RUN, "-n", "1", "--", "sh", "-c", bg + " & echo started"});
  EXPECT_TRUE(r.exit.ok()) << r.exit.describe() << "\n" << r.err;
  EXPECT_NE(r.out.find("[rank 0] started"), std::string::npos) << r.out;
  EXPECT_TRUE(none_left(bg)) << "a worker's background process outlived the launcher\n" << r.err;

  auto stubborn =
      run({EBBFLOW_RUN, "-n", "1", "--timeout", "0.5", "--", "sh", "-c", "(trap '' TERM; exec " + bg + ") & sleep 30"});
  EXPECT_EQ(stubborn.exit.code, 124) << stubborn.exit.describe() << "\n" << stubborn.err;
  EXPECT_TRUE(none_left(bg)) << "a process that ignored SIGTERM outlived the launcher\n" << stubborn.err;
}

// An elastic worker that fails takes what it started with it at once (its
// process group), not only when the launcher ends: the launcher then tells
// the job that the member it was is gone (report_process_exit), and that
// must be true. Each elastic worker is named EBBFLOW_PROCESS_KEY=
// "<launcher>/<worker id>" for that report; a static job names none.
TEST(Launcher, AFailedElasticWorkerLeavesNothingRunningAndIsNamedForItsReport) {
  const ebbflow_test::temp_dir dir("ebbflow-launcher");
  const std::string bgpid = (dir / "bgpid").string();
  const std::string script =
      "echo \"key=$EBBFLOW_PROCESS_KEY\"; if [ \"$EBBFLOW_WORKER_ID\" = 0 ]; then sleep 77.25 & "
      "echo $! > " +
      bgpid +
      "; exit 3; fi; sleep 1; "
      "s=$(sed -n 's/^State:.\\(.\\).*/\\1/p' /proc/$(cat " +
      bgpid +
      ")/status 2>/dev/null); "
      "if [ -z \"$s\" ] || [ \"$s\" = Z ]; then echo gone; else echo left $s; fi";  // a zombie is gone
  auto r = run({EBBFLOW_RUN, "--elastic", "-n", "2", "--", "sh", "-c", script});
  EXPECT_TRUE(r.exit.ok()) << r.exit.describe() << "\n" << r.err;
  EXPECT_NE(r.err.find("worker 0 (pid "), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("[worker 1] gone"), std::string::npos) << "the failed worker's background process lived on\n"
                                                              << r.out;
  std::smatch m0, m1;
  const std::regex key0(R"(\[worker 0\] key=([0-9a-f]{12})/0\n)"), key1(R"(\[worker 1\] key=([0-9a-f]{12})/1\n)");
  ASSERT_TRUE(std::regex_search(r.out, m0, key0)) << r.out;
  ASSERT_TRUE(std::regex_search(r.out, m1, key1)) << r.out;
  EXPECT_EQ(m0[1], m1[1]) << "one launcher, one name";

  auto fixed = run({EBBFLOW_RUN, "-n", "1", "--", "sh", "-c", "echo \"key=$EBBFLOW_PROCESS_KEY\""});
  EXPECT_NE(fixed.out.find("[rank 0] key=\n"), std::string::npos) << fixed.out;
}

// The reports of failed workers go to the store beside the launcher's loop: a
// store that stopped answering (SIGSTOP, after the launcher attached to it)
// holds up none of the exits, signals or --timeout. Six workers fail at once
// 0.5 s in; each report waits for its deadline (1 s). Reported in the loop,
// --timeout 2 came after all six, 6.5 s in.
TEST(Launcher, ReportsToAStoreThatStoppedAnsweringHoldUpNothing) {
  standalone_store store({EBBFLOW_STORE_TOOL, "--port", "0", "--token", "report-token"});
  ASSERT_NE(store.port, 0) << store.out;
  const std::string addr = "127.0.0.1:" + std::to_string(store.port);
  std::jthread stopper([&] {
    std::this_thread::sleep_for(250ms);
    store.group.signal_all(SIGSTOP);
  });
  auto r = run({EBBFLOW_RUN, "--elastic", "-n", "7", "--timeout", "2", "--attach", "--store", addr, "--token",
                "report-token", "--", "sh", "-c",
                "if [ \"$EBBFLOW_WORKER_ID\" = 0 ]; then exec sleep 30; fi; sleep 0.5; exit 1"});
  stopper.join();
  store.group.signal_all(SIGCONT);
  store.group.signal_all(SIGTERM);
  (void)store.group.poll(ef::deadline::after(5s));
  EXPECT_EQ(r.exit.code, 124) << r.exit.describe() << "\n" << r.err;
  EXPECT_LT(r.seconds, 4.0) << "the reports held up the launcher's loop\n" << r.err;
  EXPECT_NE(r.err.find("could not tell the store that worker"), std::string::npos) << r.err;
  // Six reports of 1 s each cannot all be tried by the end: the rest are dropped, and said to be, in one line.
  const auto dropped = r.err.find("did not tell the store that worker(s) ");
  EXPECT_NE(dropped, std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("did not tell the store", dropped + 1), std::string::npos) << r.err;
}

// A job whose workers all failed has nobody left to tell: the launcher adds
// no report lines. It used to try once the store was gone and add "could not
// tell the store that worker 0 exited (... connection reset ...)" and a "did
// not tell" line for each other worker.
TEST(Launcher, WorkersThatAllFailedAddNoReportLines) {
  for (const char* worker : {"exit 1", "sleep 0.$EBBFLOW_WORKER_ID; exit 3"}) {
    auto r = run({EBBFLOW_RUN, "--elastic", "-n", "3", "--", "sh", "-c", worker});
    EXPECT_NE(r.exit.code, 0) << r.err;
    EXPECT_NE(r.err.find("job failed: no worker finished successfully"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("tell the store"), std::string::npos) << r.err;
  }
}

// A timed event whose time never comes is said, one line each, not dropped
// silently (an --add after the job ended exited 0 with nothing said).
TEST(Launcher, AnEventDueAfterTheJobEndedIsSaid) {
  auto r = run({EBBFLOW_RUN, "-n", "2", "--add", "30", "--kill", "40:1", "--stop", "50:0:2", "--", "sleep", "0.3"});
  EXPECT_TRUE(r.exit.ok()) << r.exit.describe() << "\n" << r.err;
  for (const char* ev : {"--add 30:1", "--kill 40:1", "--stop 50:0:2"})
    EXPECT_NE(r.err.find(std::string("ebbflow-run: ") + ev + " not done: the job ended first (at 0.3"),
              std::string::npos)
        << ev << "\n"
        << r.err;
  auto stopped = run({EBBFLOW_RUN, "-n", "1", "--timeout", "0.3", "--leave", "20:0", "--", "sleep", "30"});
  EXPECT_EQ(stopped.exit.code, 124) << stopped.err;
  EXPECT_NE(stopped.err.find("--leave 20:0 not done: the job was stopped first"), std::string::npos) << stopped.err;
}

// One prefix per line: the launcher's and the library's log prefix ("[worker
// 2] [ebbflow rank 1] warn: ...") become one, "[worker 2, ebbflow rank 1]".
TEST(Launcher, ALibraryLogLineCarriesOnePrefix) {
  const char* script = "echo '[ebbflow rank 5] warn: from the library' >&2; echo plain";
  auto elastic = run({EBBFLOW_RUN, "--elastic", "-n", "1", "--", "sh", "-c", script});
  EXPECT_NE(elastic.err.find("[worker 0, ebbflow rank 5] warn: from the library\n"), std::string::npos) << elastic.err;
  EXPECT_NE(elastic.out.find("[worker 0] plain\n"), std::string::npos) << elastic.out;
  auto fixed = run({EBBFLOW_RUN, "-n", "1", "--", "sh", "-c", script});
  EXPECT_NE(fixed.err.find("[rank 0, ebbflow rank 5] warn: from the library\n"), std::string::npos) << fixed.err;
  auto bare = run({EBBFLOW_RUN, "--no-prefix", "-n", "1", "--", "sh", "-c", script});
  EXPECT_NE(bare.err.find("[ebbflow rank 5] warn: from the library\n"), std::string::npos) << bare.err;
  EXPECT_EQ(elastic.err.find("] ["), std::string::npos) << elastic.err;
}
