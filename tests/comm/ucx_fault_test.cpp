// SPDX-License-Identifier: Apache-2.0
// Failure attribution over real UCX between real processes: one rank is
// SIGKILLed as a 64 MiB allreduce starts (right after a completed barrier),
// on every allreduce algorithm. Every survivor must get `errc::peer_lost`
// naming the dead rank within the deadline + 1 s, and no survivor may crash
// (UCX 1.13.1 aborts on some ways of failing or closing an endpoint while a
// peer's traffic is in flight). Survivors either stay up until every one of
// them has its error (as the elastic group's do, to form the next generation)
// or exit at once (a training script that dies on the error): then a later
// survivor may also name one that exited before it saw its own error, which
// is dead too.
//
// UcxFault runs a few cases per algorithm (label ucx). UcxFaultSlow runs 50
// per algorithm on 3 and 4 ranks and prints the counts (label slow; the
// ctest entry ucx_fault_slow; about 2.5 minutes).
#include <ebbflow/comm/communicator.hpp>
#include <ebbflow/comm/ucx/transport.hpp>
#include <ebbflow/core/env.hpp>

#include "ucx_processes.hpp"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace ef = ebbflow;
namespace et = ebbflow_test;
using namespace std::chrono_literals;
using comm_t = et::ucx_communicator;

namespace {

ef::comm::allreduce_algorithm algorithm_named(const std::string& s) {
  if (s == "ring") return ef::comm::allreduce_algorithm::ring;
  if (s == "recursive_doubling") return ef::comm::allreduce_algorithm::recursive_doubling;
  if (s == "single_copy") return ef::comm::allreduce_algorithm::single_copy;
  return ef::comm::allreduce_algorithm::automatic;
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(ef::steady_clock::now().time_since_epoch()).count();
}

// ------------------------------------------------------------------ worker
// kill-start ALGO VICTIM TIMEOUT_MS EXIT(0|1) KILL_AFTER BYTES: a barrier
// that every rank completes (the victim waits until all have), then rank
// VICTIM posts the allreduce, progresses it KILL_AFTER times and SIGKILLs
// itself; the others run it with a TIMEOUT_MS deadline and print
//   RESULT rank=R cond=C peer=P ms=M at=NS
// (C: peer_lost, timeout, the error's message, or without an error
// `completed` (the victim died after its part was done; the sum is right)
// or `wrong_result`; NS: when the error came, on the steady clock every
// process of this host shares), then stay until every survivor printed its
// result (EXIT 0) or return at once (1).
int run_kill_start(char** argv) {
  const auto algo = algorithm_named(argv[0]);
  const int victim = std::stoi(argv[1]);
  const std::chrono::milliseconds timeout(std::stoi(argv[2]));
  const bool exit_at_once = std::stoi(argv[3]) != 0;
  const int kill_after = std::stoi(argv[4]);
  const std::size_t bytes = std::stoull(argv[5]);
  et::worker_env w;
  auto t = w.connect();
  ef::comm::collective_options o;
  o.allreduce = algo;
  o.timeout = timeout;
  comm_t c(t, o);
  const int n = t.size(), r = t.rank();
  std::vector<float> v(bytes / sizeof(float), 1.0f);
  c.barrier(ef::deadline::after(20s));
  if (r != victim) {
    et::reach("barrier", 0);  // the victim waits for it
  } else {
    et::reach("barrier", n);
    auto req = c.iallreduce(ef::view(std::span(v)), ef::view(std::span(v)), ef::reduce_op::sum);
    std::error_code ec;
    for (int i = 0; i < kill_after; ++i) req.test(ec);
    ::raise(SIGKILL);
  }
  const auto start = ef::steady_clock::now();
  std::string cond = "completed";
  int peer = -1;
  std::string what;
  try {
    c.allreduce(ef::view(std::span(v)), ef::reduce_op::sum, ef::deadline::after(timeout));
    if (std::ranges::any_of(v, [&](float x) { return x != static_cast<float>(n); })) cond = "wrong_result";
  } catch (const ef::system_error& e) {
    cond = e.code() == ef::errc::peer_lost ? "peer_lost"
           : e.code() == ef::errc::timeout ? "timeout"
                                           : e.code().message();
    peer = e.peer();
    what = e.what();
  }
  std::replace(cond.begin(), cond.end(), ' ', '_');  // one word
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(ef::steady_clock::now() - start).count();
  std::fprintf(stderr, "RESULT rank=%d cond=%s peer=%d ms=%lld at=%lld\n[worker %d] %s\n", r, cond.c_str(), peer,
               static_cast<long long>(ms), static_cast<long long>(now_ns()), r, what.c_str());
  std::fflush(stderr);
  if (!exit_at_once) et::reach("reported", n - 1);
  return 0;
}

int worker_main(char** argv) {
  const std::string scenario = argv[2];
  try {
    if (scenario == "kill-start") return run_kill_start(argv + 3);
  } catch (const std::exception& e) {
    return et::fail(std::string("exception: ") + e.what());
  }
  return et::fail("unknown scenario " + scenario);
}

// ------------------------------------------------------------------ launcher
//! What the survivors of kill-start runs got.
struct tally {
  int runs = 0;
  int survivors = 0;
  int crashed = 0;          // killed by a signal, exited non-zero, hung, or printed no result
  int wrong_peer = 0;       // peer_lost naming a peer that was alive
  int wrong_condition = 0;  // anything but peer_lost (a rank died)
  int late = 0;             // after the deadline + 1 s
  int named_exited = 0;     // peer_lost naming a survivor that had exited (dead too: counted right)
  int completed = 0;        // no error: the victim died after its part was done, and the sum is right
  std::vector<long long> ms;
  std::vector<std::string> slow;  // errors after more than a second (within the limit)
  std::vector<std::string> problems;

  [[nodiscard]] bool clean() const { return crashed + wrong_peer + wrong_condition + late == 0; }
  void add(const tally& o) {
    runs += o.runs, survivors += o.survivors, crashed += o.crashed, wrong_peer += o.wrong_peer;
    wrong_condition += o.wrong_condition, late += o.late, named_exited += o.named_exited;
    completed += o.completed;
    ms.insert(ms.end(), o.ms.begin(), o.ms.end());
    slow.insert(slow.end(), o.slow.begin(), o.slow.end());
    problems.insert(problems.end(), o.problems.begin(), o.problems.end());
  }
  [[nodiscard]] long long percentile(double p) const {
    if (ms.empty()) return -1;
    auto s = ms;
    std::sort(s.begin(), s.end());
    return s[static_cast<std::size_t>(p * static_cast<double>(s.size() - 1))];
  }
};

struct kill_case {
  int n;
  std::string algo;
  int victim;
  bool exit_at_once;
  int kill_after;
  std::size_t bytes = std::size_t{64} << 20;
  std::chrono::milliseconds timeout{3000};
};

std::string describe(const kill_case& k) {
  std::ostringstream s;
  s << k.n << " ranks, " << k.algo << ", victim " << k.victim << ", kill after " << k.kill_after << " polls, "
    << (k.exit_at_once ? "survivors exit at once" : "survivors stay");
  return s.str();
}

tally run_case(const kill_case& k) {
  const auto err = std::filesystem::temp_directory_path() / ("ebbflow-ucx-fault-" + std::to_string(::getpid()) + "-");
  auto res = et::launch(k.n,
                        {"kill-start", k.algo, std::to_string(k.victim), std::to_string(k.timeout.count()),
                         k.exit_at_once ? "1" : "0", std::to_string(k.kill_after), std::to_string(k.bytes)},
                        60s, err.string());
  tally t;
  t.runs = 1;
  const auto problem = [&](int r, const std::string& what, const std::string& text) {
    t.problems.push_back(describe(k) + ": rank " + std::to_string(r) + " " + what + "\n" + text);
  };
  const auto vs = res.status[static_cast<std::size_t>(k.victim)];
  if (!(WIFSIGNALED(vs) && WTERMSIG(vs) == SIGKILL)) problem(k.victim, "(the victim) did not die of SIGKILL", "");
  for (int r = 0; r < k.n; ++r) {
    const auto file = err.string() + std::to_string(r);
    std::ifstream f(file);
    const std::string text{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
    std::filesystem::remove(file);
    if (r == k.victim) continue;
    ++t.survivors;
    const int st = res.status[static_cast<std::size_t>(r)];
    const auto at = text.find("RESULT ");
    if (!et::exited_ok(st) || at == std::string::npos) {
      ++t.crashed;
      problem(r,
              WIFSIGNALED(st) ? "died of signal " + std::to_string(WTERMSIG(st))
              : res.timed_out ? "hung"
                              : "exited with status " + std::to_string(WEXITSTATUS(st)) + " or printed no result",
              text);
      continue;
    }
    char cond[128] = {};
    int rank = -1, peer = -1;
    long long ms = -1, when = 0;
    if (std::sscanf(text.c_str() + at, "RESULT rank=%d cond=%127s peer=%d ms=%lld at=%lld", &rank, cond, &peer, &ms,
                    &when) != 5) {
      ++t.crashed;
      problem(r, "printed a malformed result", text);
      continue;
    }
    if (std::string(cond) == "completed") {
      ++t.completed;
      continue;
    }
    t.ms.push_back(ms);
    if (ms > (k.timeout + 1s).count()) {
      ++t.late;
      problem(r, "got its error after " + std::to_string(ms) + " ms", text);
    } else if (ms > 1000) {
      t.slow.push_back(describe(k) + ": rank " + std::to_string(r) + " after " + std::to_string(ms) + " ms\n" +
                       text.substr(at));
    }
    if (std::string(cond) != "peer_lost") {
      ++t.wrong_condition;
      problem(r, std::string("got ") + cond, text);
    } else if (peer != k.victim) {
      // A survivor that exited before this one's error is dead as well (the
      // launcher reaps within a millisecond; 100 ms of slack for one exiting).
      const auto exited = peer >= 0 && peer < k.n && k.exit_at_once &&
                          std::chrono::duration_cast<std::chrono::nanoseconds>(
                              res.end[static_cast<std::size_t>(peer)].time_since_epoch())
                                  .count() <= when + 100'000'000;
      if (exited) {
        ++t.named_exited;
      } else {
        ++t.wrong_peer;
        problem(r, "named peer " + std::to_string(peer) + ", which was alive", text);
      }
    }
  }
  return t;
}

void print(const std::string& label, const tally& t) {
  std::cerr << label << ": " << t.runs << " runs, " << t.survivors << " survivors: " << t.crashed << " crashed, "
            << t.wrong_peer << " named a live peer, " << t.wrong_condition << " wrong condition, " << t.late
            << " late; " << t.named_exited << " named a survivor that had exited, " << t.completed
            << " completed (the victim had done its part); error after p50 " << t.percentile(0.5) << " ms, max "
            << t.percentile(1.0) << " ms" << std::endl;
  for (const auto& p : t.problems) std::cerr << "  " << p << "\n";
  for (const auto& p : t.slow) std::cerr << "  slow: " << p << "\n";
}

const char* const algorithms[] = {"ring", "recursive_doubling", "single_copy", "automatic"};

class UcxFault : public ::testing::TestWithParam<const char*> {};
TEST_P(UcxFault, EverySurvivorGetsPeerLostNamingTheKilledRank) {
  const std::string algo = GetParam();
  tally all;
  for (const kill_case& k : {kill_case{3, algo, 1, false, 0}, kill_case{3, algo, 2, true, 2},
                             kill_case{4, algo, 1, false, 10}, kill_case{4, algo, 0, true, 0}})
    all.add(run_case(k));
  print(algo, all);
  EXPECT_TRUE(all.clean());
}
INSTANTIATE_TEST_SUITE_P(Algorithms, UcxFault, ::testing::ValuesIn(algorithms));

// With UCX's keepalive off, only the transport's own probe of the processes
// on this host finds a dead rank that a survivor never talks to directly
// (in a ring, the ranks behind a live neighbour; in recursive doubling, the
// partners of the partner that found it).
TEST(UcxFaultProbe, WithoutKeepaliveEverySurvivorStillNamesTheKilledRank) {
  const char* before = std::getenv("UCX_KEEPALIVE_INTERVAL");
  const std::string saved = before ? before : "";
  ::setenv("UCX_KEEPALIVE_INTERVAL", "inf", 1);
  tally all;
  for (const kill_case& k : {kill_case{3, "ring", 1, false, 0}, kill_case{4, "ring", 2, false, 2},
                             kill_case{4, "recursive_doubling", 0, false, 0}})
    all.add(run_case(k));
  if (before)
    ::setenv("UCX_KEEPALIVE_INTERVAL", saved.c_str(), 1);
  else
    ::unsetenv("UCX_KEEPALIVE_INTERVAL");
  print("keepalive off", all);
  EXPECT_TRUE(all.clean());
}

// 50 repetitions per algorithm on 3 and 4 ranks: the victim, the kill point
// and whether survivors stay or exit vary with the repetition.
class UcxFaultSlow : public ::testing::TestWithParam<int> {};
TEST_P(UcxFaultSlow, FiftyKillsAtStartPerAlgorithm) {
  const int n = GetParam();
  const int reps = static_cast<int>(ef::env::get_int("EBBFLOW_FAULT_REPS", 50, 1));
  bool clean = true;
  for (const char* algo : algorithms) {
    tally t;
    for (int rep = 0; rep < reps; ++rep)
      t.add(run_case({n, algo, rep % n, rep % 2 == 1, (rep / 2) % 3 == 0 ? 0 : (rep / 2) % 3 == 1 ? 2 : 10}));
    print(std::to_string(n) + " ranks, " + algo, t);
    clean = clean && t.clean();
  }
  EXPECT_TRUE(clean);
}
INSTANTIATE_TEST_SUITE_P(Ranks, UcxFaultSlow, ::testing::Values(3, 4));

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::strcmp(argv[1], "--worker") == 0) return worker_main(argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
