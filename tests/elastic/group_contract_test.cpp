// SPDX-License-Identifier: Apache-2.0
// The elastic group's contract with its caller: API misuse is diagnosed
// (never a silently lost or repeated step), membership bounds hold from the
// first generation, callbacks' errors reach the caller, and a leave request
// is honoured while waiting to join. Each test failed before its fix.
#include <ebbflow/elastic/group.hpp>
#include <ebbflow/elastic/loopback_network.hpp>

#include "group_harness.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <initializer_list>
#include <limits>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

using namespace ebbflow_test;  // ef, el, store_ref, test_group, the chrono literals

namespace {

el::group_options options(std::size_t B = 4, std::size_t N = 40) {
  el::group_options o;
  o.global_batch = B;
  o.dataset_size = N;
  o.heartbeat = 10ms;
  o.lease = 300ms;
  o.op_timeout = 3s;
  o.join_timeout = 5s;
  o.min_size_wait = 3s;
  o.initial_wait = 5s;
  o.admit_delay = 0ms;
  return o;
}

auto factory(std::shared_ptr<el::memory_store> s) {
  return [s] { return std::make_unique<store_ref>(store_ref{s}); };
}

ef::launch_info launch(int rank, int world) {
  ef::launch_info li;
  li.rank = rank;
  li.world_size = world;
  return li;
}

// One job's store and fabric, shared by its in-process members.
struct job {
  std::shared_ptr<el::memory_store> store = std::make_shared<el::memory_store>();
  std::shared_ptr<el::loopback_fabric> fabric = std::make_shared<el::loopback_fabric>();
};

// A member of job `j` with options `o`: launch rank `rank` of `world` (with
// o.join, a newcomer), on a loopback network of its own.
struct member {
  el::loopback_network net;
  test_group g;
  member(const job& j, const el::group_options& o, int rank = 0, int world = 1,
         std::unique_ptr<el::planning_policy> policy = std::make_unique<el::uniform_policy>())
      : net(j.fabric), g(factory(j.store), net, o, launch(rank, world), std::move(policy)) {}
};

// Runs `body(launch rank)` for ranks 0 to n - 1 at once, each on a thread of
// its own; returns when all have ended.
template <class Body>
void on_threads(int n, const Body& body) {
  std::vector<std::jthread> ts;
  for (int r = 0; r < n; ++r) ts.emplace_back(body, r);
}

// Runs `run(rank, false)` for `members` launched members, each on a thread
// of its own, and `run(-1, true)` for a newcomer on another once `start` is
// set (by a member); returns when all have ended.
template <class Run>
void with_late_joiner(int members, const std::atomic<bool>& start, const Run& run) {
  std::jthread joiner([&] {
    while (!start) std::this_thread::sleep_for(1ms);
    run(-1, true);
  });
  on_threads(members, [&](int r) { run(r, false); });
}

// group_options::from_environment refuses each of `bad` for `variable`,
// with an error that names the variable.
void expect_refused(const char* variable, std::initializer_list<const char*> bad) {
  for (const char* value : bad) {
    ::setenv(variable, value, 1);
    try {
      (void)el::group_options::from_environment();
      ADD_FAILURE() << variable << "=" << value << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(variable), std::string::npos) << e.what();
    }
  }
}

// A group built with options `o` is refused, with an error that holds
// `message`.
void expect_group_refused(const el::group_options& o, const std::string& message) {
  try {
    member m(job{}, o);
    ADD_FAILURE() << "accepted; expected: " << message;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
  }
}

}  // namespace

// end_step twice in one step is refused: the second call would commit a
// step that was never computed, and the cursor would skip a global batch
// (samples never trained on).
TEST(ElasticGroupContract, EndStepTwiceIsDiagnosed) {
  member m(job{}, options());
  auto& g = m.g;
  auto s = g.begin_step();
  std::vector<float> grad(4, 1.f);
  ASSERT_TRUE(g.allreduce(grad));
  g.end_step(0.01);
  EXPECT_EQ(g.step(), 1);
  EXPECT_EQ(g.cursor(), 4u);
  EXPECT_THROW(g.end_step(0.01), ef::system_error) << "second end_step of step " << s.step << " accepted";
  EXPECT_EQ(g.step(), 1) << "a step nobody computed was committed";
  EXPECT_EQ(g.cursor(), 4u) << "samples [4, 8) of epoch 0 are skipped";
}

// allreduce outside begin_step/end_step (here: before any begin_step) is
// refused.
TEST(ElasticGroupContract, AllreduceOutsideAStepIsDiagnosed) {
  member m(job{}, options());
  auto& g = m.g;
  std::vector<float> grad(4, 1.f);
  EXPECT_THROW((void)g.allreduce(grad), ef::system_error) << "allreduce before the first begin_step accepted";
}

// allreduce after this member left the group is refused (it dereferenced
// the empty communicator: undefined behaviour).
TEST(ElasticGroupContract, AllreduceAfterLeavingIsDiagnosed) {
  auto o = options();
  o.preconnect = false;  // leave at the first boundary
  member m(job{}, o);
  auto& g = m.g;
  (void)g.begin_step();
  g.request_leave();
  g.end_step(0.01);
  ASSERT_FALSE(g.active());
  EXPECT_THROW(g.begin_step(), ef::system_error);  // diagnosed
  std::vector<float> grad(1 << 20, 1.f);
  EXPECT_THROW((void)g.allreduce(grad), ef::system_error) << "allreduce after leaving: not diagnosed";
}

// register_state after training started is refused: the initial state
// transfer already happened without that buffer, and the replicas would
// differ with nothing said.
TEST(ElasticGroupContract, RegisterStateAfterStartIsDiagnosed) {
  const job j;
  std::atomic<int> accepted{0};
  on_threads(2, [&](int r) {
    member m(j, options(), r, 2);
    auto& g = m.g;
    std::vector<float> w(3, r == 0 ? 1.f : 2.f);  // different initialisation on each member
    (void)g.begin_step();
    try {
      g.register_state("w", std::as_writable_bytes(std::span(w)));
      ++accepted;
    } catch (const std::exception&) {
    }
    std::vector<float> grad(3, 0.f);
    if (g.allreduce(grad)) g.end_step(0.01);
  });
  EXPECT_EQ(accepted.load(), 0) << "register_state after begin_step accepted on " << accepted << " member(s)";
}

// A leave that would take the group below min_size waits: the leaver keeps
// training until a newcomer takes its place, then leaves (rank 0 trained on
// alone).
TEST(ElasticGroupContract, ALeaveBelowMinSizeWaitsForANewcomer) {
  const job j;
  std::atomic<int> min_seen{1 << 20};
  std::atomic<std::int64_t> left_after{-1};
  std::atomic<bool> start_joiner{false};
  auto o = options();
  o.min_size = 2;
  const auto run = [&](int r, bool join) {
    try {
      auto mo = o;
      mo.join = join;
      member m(j, mo, join ? 2 : r, 2);
      auto& g = m.g;
      while (g.active() && (g.step() < 200 || g.changing())) {
        const auto s = g.begin_step();
        if (!join) min_seen = std::min(min_seen.load(), s.world_size);
        if (!join && r == 1 && s.step == 5) g.request_leave();
        if (!join && r == 0 && s.step == 15) start_joiner = true;
        std::this_thread::sleep_for(2ms);  // a step of compute: the joiner is admitted meanwhile
        std::vector<float> grad(3, 0.f);
        if (!g.allreduce(grad)) continue;
        g.end_step(0.001);
      }
      if (!join && r == 1) left_after = g.step();
      if (g.rank() == 0 && g.active()) g.finish();
    } catch (const std::exception& e) {
      ADD_FAILURE() << (join ? "joiner" : "rank " + std::to_string(r)) << ": " << e.what();
    }
  };
  with_late_joiner(2, start_joiner, run);
  EXPECT_EQ(min_seen.load(), 2) << "a member trained with world_size " << min_seen << " < EBBFLOW_MIN_SIZE=2";
  EXPECT_GT(left_after.load(), 15) << "the leaver left before the newcomer came";
  EXPECT_LT(left_after.load(), 200) << "the leaver never left";
}

// A malformed join ticket is skipped: a newcomer whose ticket comes after it
// is admitted (the coordinator failed on it at every step, and no later
// ticket was ever read).
TEST(ElasticGroupContract, AMalformedJoinTicketDoesNotStopLaterOnes) {
  const job j;
  std::atomic<int> max_seen{0};
  std::atomic<bool> start_joiner{false};
  const auto run = [&](bool join) {
    try {
      auto o = options();
      o.join = join;
      member m(j, o, join ? 1 : 0, 1);
      auto& g = m.g;
      while (g.active() && (g.step() < 200 || g.changing())) {
        const auto s = g.begin_step();
        max_seen = std::max(max_seen.load(), s.world_size);
        if (!join && s.step == 3) {
          const auto seq = j.store->add("ebbflow/join_seq", 1, ef::deadline::after(1s));
          j.store->set("ebbflow/join/" + std::to_string(seq), "not-a-member 0 w", ef::deadline::after(1s));
          start_joiner = true;
        }
        std::this_thread::sleep_for(2ms);
        std::vector<float> grad(3, 0.f);
        if (!g.allreduce(grad)) continue;
        g.end_step(0.001);
        if (max_seen == 2 && g.rank() == 0 && !g.changing()) break;
      }
      if (g.rank() == 0) g.finish();
    } catch (const std::exception& e) {
      if (!join || max_seen < 2) ADD_FAILURE() << (join ? "joiner: " : "member: ") << e.what();
    }
  };
  std::jthread joiner([&] {
    while (!start_joiner) std::this_thread::sleep_for(1ms);
    run(true);
  });
  run(false);
  joiner.join();
  EXPECT_EQ(max_seen.load(), 2) << "the newcomer behind a malformed ticket was never admitted";
}

// min_size holds for the first generation: two launched workers with
// min_size 3 are refused at once (they formed a group of two).
TEST(ElasticGroupContract, InitialGenerationRespectsMinSize) {
  const job j;
  auto o = options();
  o.min_size = 3;
  o.join_timeout = 2s;
  std::atomic<int> trained_with{0}, refused{0};
  on_threads(2, [&](int r) {
    try {
      member m(j, o, r, 2);
      trained_with = m.g.begin_step().world_size;
      if (m.g.rank() == 0) m.g.finish();
    } catch (const std::invalid_argument& e) {
      if (std::string(e.what()).find("EBBFLOW_MIN_SIZE=3 but this launch starts 2 workers") != std::string::npos)
        ++refused;
    }
  });
  EXPECT_EQ(trained_with.load(), 0) << "a step ran with world_size " << trained_with << " < EBBFLOW_MIN_SIZE=3";
  EXPECT_EQ(refused.load(), 2);
}

// max_size holds for the first generation: of three launched workers with
// max_size 2, the third waits as a newcomer.
TEST(ElasticGroupContract, InitialGenerationRespectsMaxSize) {
  const job j;
  auto o = options();
  o.max_size = 2;
  o.join_timeout = 2s;
  std::atomic<int> max_seen{0};
  on_threads(3, [&](int r) {
    try {
      member m(j, o, r, 3);
      auto& g = m.g;
      max_seen = std::max(max_seen.load(), g.begin_step().world_size);
      std::vector<float> grad(3, 0.f);
      if (g.allreduce(grad)) g.end_step(0.001);
      if (g.rank() == 0) g.finish();
    } catch (const std::exception&) {
      // a worker over max_size waiting to join is fine
    }
  });
  EXPECT_EQ(max_seen.load(), 2) << "a generation of " << max_seen << " members with EBBFLOW_MAX_SIZE=2";
}

// A world-changed callback's exception reaches the caller, even an
// ebbflow::system_error with a code a member failure has (timeout): it was
// taken for a transport failure, the group re-formed and called the callback
// again, forever. (The test's callback stops throwing after 20 calls so that
// the test ends either way.)
TEST(ElasticGroupContract, ACallbackErrorIsNotTakenForAMemberFailure) {
  member m(job{}, options());
  auto& g = m.g;
  int calls = 0;
  g.on_world_changed([&](const el::world_change&) {
    if (++calls <= 20) throw ef::system_error(make_error_code(ef::error::timeout), {.operation = "user callback"});
  });
  bool threw = false;
  try {
    (void)g.begin_step();
  } catch (const ef::system_error&) {
    threw = true;
  }
  EXPECT_TRUE(threw) << "the callback's error did not reach the caller";
  EXPECT_EQ(calls, 1) << "callback called " << calls << " times; generation now " << g.generation()
                      << " (each call re-formed the group as after a failure)";
}

// restore_position honours drop_last: a cursor inside the epoch's short last
// batch is refused (the next step trained on that short batch).
TEST(ElasticGroupContract, RestorePositionHonoursDropLast) {
  auto o = options(4, 10);
  o.drop_last = true;
  member m(job{}, o);
  auto& g = m.g;
  bool threw = false;
  try {
    g.restore_position(2, 0, 8);
  } catch (const std::exception&) {
    threw = true;
  }
  if (!threw) {
    const auto s = g.begin_step();
    EXPECT_EQ(s.global_batch, 4u) << "drop_last, yet step " << s.step << " trains on a short batch of "
                                  << s.global_batch << " (cursor " << s.cursor << ")";
  }
}

// Zero-size registered state transfers with the rest.
TEST(ElasticGroupContract, ZeroSizeStateTransfers) {
  const job j;
  std::vector<float> final_w[2];
  std::vector<std::string> errors(2);
  on_threads(2, [&](int r) {
    try {
      member m(j, options(), r, 2);
      auto& g = m.g;
      std::vector<float> w(3, r == 0 ? 1.f : 2.f);
      std::vector<float> empty;
      g.register_state("empty", std::as_writable_bytes(std::span(empty)));
      g.register_state("w", std::as_writable_bytes(std::span(w)));
      (void)g.begin_step();
      std::vector<float> grad(3, 0.f);
      if (g.allreduce(grad)) g.end_step(0.01);
      final_w[r] = w;
    } catch (const std::exception& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_EQ(final_w[0], final_w[1]);
}

// The last member leaves at the boundary where the coordinator admits a
// joiner: it stays one more generation and hands the joiner the state (the
// generation held only the joiner, without state, and the state was lost
// although nobody failed).
TEST(ElasticGroupContract, TheLastLeaverHandsTheStateToAnAdmittedJoiner) {
  const job j;
  std::string joiner_error;
  std::vector<float> joiner_w;
  std::jthread joiner;
  {
    member m(j, options());
    auto& g = m.g;
    std::vector<float> w(3, 7.f);
    g.register_state("w", std::as_writable_bytes(std::span(w)));
    bool asked = false;
    while (g.active()) {
      const auto s = g.begin_step();
      if (s.step == 3 && !joiner.joinable())
        joiner = std::jthread([&] {
          try {
            auto o = options();
            o.join = true;
            member newcomer(j, o, 1, 1);
            std::vector<float> jw(3, 0.f);
            newcomer.g.register_state("w", std::as_writable_bytes(std::span(jw)));
            (void)newcomer.g.begin_step();
            joiner_w = jw;
          } catch (const std::exception& e) {
            joiner_error = e.what();
          }
        });
      if (joiner.joinable() && !asked && j.store->try_get("ebbflow/join/1", ef::deadline::after(1s))) {
        std::this_thread::sleep_for(100ms);  // the coordinator's heartbeat thread has seen the ticket
        g.request_leave();
        asked = true;
      }
      std::vector<float> grad(3, 0.f);
      if (!g.allreduce(grad)) continue;
      g.end_step(0.001);
    }
  }
  joiner.join();
  EXPECT_EQ(joiner_error, "");
  EXPECT_EQ(joiner_w, std::vector<float>(3, 7.f));
}

// A restored step near INT64_MAX is refused (the step counter overflowed:
// undefined behaviour).
TEST(ElasticGroupContract, HugeRestoredStepIsRejectedOrSafe) {
  member m(job{}, options());
  auto& g = m.g;
  try {
    g.restore_position(std::numeric_limits<std::int64_t>::max(), 0, 0);
  } catch (const std::exception&) {
    return;  // rejected: fine
  }
  (void)g.begin_step();
  std::vector<float> grad(3, 0.f);
  ASSERT_TRUE(g.allreduce(grad));
  g.end_step(0.001);
  EXPECT_GT(g.step(), 0) << "step counter wrapped to " << g.step();
}

// A planning policy whose plan has the wrong number of entries (here one
// share for two members) is diagnosed (rank 1 read its share past the end
// of the plan: ASan heap-buffer-overflow in current_slice).
namespace {
class short_plan_policy final : public el::planning_policy {
 public:
  void observe(el::member_id, std::size_t, double) override {}
  std::vector<std::size_t> plan(std::span<const el::member_id>, std::size_t B) override { return {B}; }
};
}  // namespace

TEST(ElasticGroupContract, APolicyPlanOfTheWrongSizeIsDiagnosed) {
  const job j;
  std::vector<std::string> errors(2);
  std::vector<std::size_t> batches(2, 0);
  on_threads(2, [&](int r) {
    try {
      member m(j, options(), r, 2, std::make_unique<short_plan_policy>());
      auto& g = m.g;
      batches[static_cast<std::size_t>(r)] = g.begin_step().batch;
      std::vector<float> grad(3, 0.f);
      if (g.allreduce(grad)) g.end_step(0.001);
    } catch (const std::exception& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  EXPECT_NE(errors[0] + errors[1], "") << "plan of 1 share for 2 members accepted; rank 1's batch: " << batches[1];
}

// A worker waiting to be admitted honours a leave request (SIGTERM with
// leave_on_signal, which ebbflow-run sends to retire the newest worker): it
// waited out the whole join timeout, then failed. (The flag is what
// detail::on_leave_signal sets; it is process-wide, so the member leaves too.)
TEST(ElasticGroupContract, AWaitingJoinerHonoursALeaveRequest) {
  const job j;
  std::string joiner_error;
  double joiner_seconds = 0;
  std::jthread joiner;
  {
    auto o = options();
    o.max_size = 1;  // the joiner waits
    member m(j, o);
    auto& g = m.g;
    joiner = std::jthread([&] {
      const auto t0 = ef::steady_clock::now();
      try {
        auto jo = options();
        jo.join = true;
        jo.join_timeout = 5s;
        member newcomer(j, jo, 1, 1);
      } catch (const std::exception& e) {
        joiner_error = e.what();
      }
      joiner_seconds = std::chrono::duration<double>(ef::steady_clock::now() - t0).count();
    });
    while (!j.store->try_get("ebbflow/join/1", ef::deadline::after(1s))) std::this_thread::sleep_for(1ms);
    el::detail::on_leave_signal(SIGTERM);  // as the signal handler does
    while (g.active()) {
      (void)g.begin_step();
      std::vector<float> grad(3, 0.f);
      if (!g.allreduce(grad)) continue;
      g.end_step(0.001);
    }
  }
  joiner.join();
  el::detail::signal_leave_flag().store(false);
  EXPECT_LT(joiner_seconds, 1.0) << "the joiner asked to leave waited " << joiner_seconds << " s: " << joiner_error;
}

// end_step after an allreduce that returned false is refused: the step was
// rolled back and must be redone (the aborted step, its gradients only
// partly reduced, was committed and never redone).
TEST(ElasticGroupContract, EndStepAfterAFailedAllreduceIsDiagnosed) {
  const job j;
  std::atomic<int> accepted{0}, failed_allreduces{0};
  on_threads(3, [&](int r) {
    try {
      member m(j, options(), r, 3);
      auto& g = m.g;
      while (g.active() && g.step() < 10) {
        const auto s = g.begin_step();
        std::vector<float> grad(64, 1.f);
        if (r == 2 && s.step == 5) {
          m.net.kill();  // crashes mid-step
          return;
        }
        if (!g.allreduce(grad)) {
          ++failed_allreduces;
          try {
            const auto before = g.step();
            g.end_step(0.001);  // misuse: the step must be redone
            if (g.step() == before + 1) ++accepted;
          } catch (const ef::system_error&) {
          }
          continue;
        }
        g.end_step(0.001);
      }
      if (g.rank() == 0) g.finish();
    } catch (const std::exception&) {
    }
  });
  ASSERT_GT(failed_allreduces.load(), 0);
  EXPECT_EQ(accepted.load(), 0) << accepted << " member(s) committed an aborted step";
}

// A heartbeat period longer than half the lease is refused: a live member
// whose training thread is 250 ms late to a recovery was judged dead after
// one lease (its counter moves only every heartbeat) and excluded, instead
// of being waited for.
namespace {
std::vector<el::world_change> late_survivor(std::chrono::milliseconds hb, std::chrono::milliseconds lease) {
  const job j;
  auto o = options();
  o.heartbeat = hb;
  o.lease = lease;
  o.op_timeout = 3s;
  std::vector<el::world_change> h0;
  on_threads(3, [&](int r) {
    try {
      member m(j, o, r, 3);
      auto& g = m.g;
      while (g.active() && (g.step() < 10 || g.changing())) {
        const auto s = g.begin_step();
        if (r == 2 && s.step == 5) {
          m.net.kill();
          return;
        }
        if (r == 1 && s.step == 5 && s.generation == 0) std::this_thread::sleep_for(250ms);  // a slow step
        std::vector<float> grad(3, 0.f);
        if (!g.allreduce(grad)) continue;
        g.end_step(0.001);
      }
      if (g.rank() == 0) {
        h0 = g.history();
        g.finish();
      }
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << ": " << e.what();
    }
  });
  return h0;
}
std::string describe(const std::vector<el::world_change>& h) {
  std::string s;
  for (auto& c : h)
    s += std::string(el::name(c.reason)) + " " + std::to_string(c.old_size) + "->" + std::to_string(c.new_size) + "; ";
  return s;
}
}  // namespace

TEST(ElasticGroupContract, HeartbeatLongerThanTheLeaseIsRejected) {
  EXPECT_EQ(describe(late_survivor(10ms, 300ms)), "initial 0->3; failure 3->2; ");
  auto o = options();
  o.heartbeat = 400ms;
  o.lease = 100ms;
  expect_group_refused(o, "EBBFLOW_LEASE_MS=100 must be at least twice EBBFLOW_HEARTBEAT_MS=400");
}

// EBBFLOW_INITIAL_STAGING_MB is in MiB (0 turns the copy off); a bad value
// names the variable.
TEST(ElasticGroupContract, InitialStagingComesFromTheEnvironmentInMiB) {
  ::unsetenv("EBBFLOW_INITIAL_STAGING_MB");
  EXPECT_EQ(el::group_options::from_environment().initial_staging, std::size_t{1024} << 20);
  ::setenv("EBBFLOW_INITIAL_STAGING_MB", "3", 1);
  EXPECT_EQ(el::group_options::from_environment().initial_staging, std::size_t{3} << 20);
  ::setenv("EBBFLOW_INITIAL_STAGING_MB", "0", 1);
  EXPECT_EQ(el::group_options::from_environment().initial_staging, 0u);
  expect_refused("EBBFLOW_INITIAL_STAGING_MB", {"-1", "lots"});
  ::unsetenv("EBBFLOW_INITIAL_STAGING_MB");
}

TEST(ElasticGroupContract, ASchedSliceOutsideTheKernelsRangeIsRefused) {
  expect_refused("EBBFLOW_SCHED_SLICE_US", {"50", "100001", "-1", "fast"});
  ::setenv("EBBFLOW_SCHED_SLICE_US", "100", 1);
  EXPECT_EQ(el::group_options::from_environment().sched_slice, std::chrono::microseconds(100));
  ::unsetenv("EBBFLOW_SCHED_SLICE_US");
  EXPECT_EQ(el::group_options::from_environment().sched_slice, std::chrono::microseconds(0));
  // The same range when the options are given in code.
  auto o = options();
  o.sched_slice = std::chrono::microseconds(50);
  expect_group_refused(o, "EBBFLOW_SCHED_SLICE_US=50: expected 0 or 100 to 100000");
}

TEST(ElasticGroupContract, ARtPriorityOutsideSchedRrsRangeIsRefused) {
  expect_refused("EBBFLOW_RT_PRIORITY", {"100", "-1", "high"});
  ::setenv("EBBFLOW_RT_PRIORITY", "5", 1);
  EXPECT_EQ(el::group_options::from_environment().rt_priority, 5);
  ::unsetenv("EBBFLOW_RT_PRIORITY");
  EXPECT_EQ(el::group_options::from_environment().rt_priority, 0);
  auto o = options();
  o.rt_priority = 100;
  expect_group_refused(o, "EBBFLOW_RT_PRIORITY=100: expected 0 (off) or 1 to 99");
}

// A store that outlives its jobs keeps a finished job's keys under its
// prefix. A second job under the same prefix took the first one's
// generations for its own: its launch ranks found generation 0 written,
// waited as newcomers and failed with "the job finished before this worker
// was admitted". Now the worker is told what happened and what to do, and
// a job under a prefix of its own runs on the same store.
TEST(ElasticGroupContract, AFinishedJobsPrefixIsRefusedWithAClearError) {
  const job j;
  {
    member m(j, options());
    auto& g = m.g;
    (void)g.begin_step();
    std::vector<float> grad(4, 1.f);
    ASSERT_TRUE(g.allreduce(grad));
    g.end_step(0.01);
    g.finish();
  }
  for (bool join : {false, true}) {
    auto o = options();
    o.join = join;
    try {
      member m(job{j.store}, o);  // the same store, a network of its own
      ADD_FAILURE() << "a worker (join " << join << ") joined the finished job";
    } catch (const ef::system_error& e) {
      EXPECT_EQ(e.code(), ef::errc::job_finished);
      const std::string what = e.what();
      EXPECT_NE(what.find("EBBFLOW_JOB='ebbflow'"), std::string::npos) << what;
      EXPECT_NE(what.find("has finished"), std::string::npos) << what;
    }
  }
  auto o = options();
  o.prefix = "second-job";
  member m(job{j.store}, o);
  const auto s = m.g.begin_step();
  EXPECT_EQ(s.step, 0);
  EXPECT_EQ(s.generation, 0);
}

// The group's store type is deduced from what the connect function returns,
// a lambda as well as a std::function (class template argument deduction
// failed for a lambda, as the docs' examples write it).
TEST(ElasticGroupContract, TheStoreTypeIsDeducedFromALambda) {
  auto store = std::make_shared<el::memory_store>();
  el::loopback_network net(std::make_shared<el::loopback_fabric>());
  el::group g([store] { return std::make_unique<store_ref>(store_ref{store}); }, net, options(), launch(0, 1));
  static_assert(std::is_same_v<decltype(g), test_group>);
  EXPECT_EQ(g.begin_step().step, 0);
}

// The documented loop, `while (g.keep_training(total))`: a newcomer whose
// admission is decided at the last step boundary is taken in (the members
// run on while the change finishes) instead of being stranded with
// job_finished, and every member, the newcomer too, ends the loop at the
// same step. Rank 0 holds its last step until the newcomer's ticket is in
// the store, so that the admission falls on the last boundary.
TEST(ElasticGroupContract, KeepTrainingTakesInANewcomerAdmittedAtTheEnd) {
  const job j;
  constexpr std::int64_t total = 6;
  std::atomic<bool> start_joiner{false};
  std::atomic<int> joiner_steps{0}, max_seen{0};
  std::atomic<std::int64_t> ended_at[3] = {-1, -1, -1};
  const auto run = [&](int r, bool join) {
    try {
      auto o = options();
      o.join = join;
      member m(j, o, join ? 2 : r, 2);
      auto& g = m.g;
      while (g.keep_training(total)) {
        const auto s = g.begin_step();
        max_seen = std::max(max_seen.load(), s.world_size);
        if (join) ++joiner_steps;
        if (!join && r == 0 && s.step == total - 1 && s.world_size == 2) {
          start_joiner = true;
          while (!j.store->try_get("ebbflow/join/1", ef::deadline::after(1s)))
            std::this_thread::sleep_for(1ms);
          std::this_thread::sleep_for(200ms);  // twenty heartbeats: the coordinator has read the ticket
        }
        std::vector<float> grad(3, 0.f);
        if (!g.allreduce(grad)) continue;
        g.end_step(0.001);
      }
      ended_at[join ? 2 : r] = g.step();
    } catch (const std::exception& e) {
      ADD_FAILURE() << (join ? "joiner" : "rank " + std::to_string(r)) << ": " << e.what();
    }
  };
  with_late_joiner(2, start_joiner, run);
  EXPECT_EQ(max_seen.load(), 3) << "the newcomer admitted at the last boundary never trained";
  EXPECT_GE(joiner_steps.load(), 1);
  EXPECT_GT(ended_at[0].load(), total) << "the members did not run on while the change finished";
  EXPECT_EQ(ended_at[0].load(), ended_at[1].load());
  EXPECT_EQ(ended_at[0].load(), ended_at[2].load()) << "the newcomer ended at another step";
  EXPECT_TRUE(j.store->try_get("ebbflow/done", ef::deadline::after(1s))) << "keep_training did not call finish()";
}

// Once keep_training found the steps done it marked the job finished: a
// worker started afterwards under the same job, on the still-running
// store, is refused at once with job_finished instead of waiting out its
// join timeout (here 5 s) as a newcomer.
TEST(ElasticGroupContract, AWorkerStartedAfterKeepTrainingEndedIsRefusedAtOnce) {
  const job j;
  {
    member m(j, options());
    auto& g = m.g;
    int steps = 0;
    while (g.keep_training(3)) {
      (void)g.begin_step();
      std::vector<float> grad(3, 0.f);
      if (!g.allreduce(grad)) continue;
      g.end_step(0.001);
      ++steps;
    }
    EXPECT_EQ(steps, 3);
    EXPECT_FALSE(g.keep_training(3)) << "keep_training turned true again";
  }
  for (bool join : {true, false}) {
    auto o = options();
    o.join = join;
    const auto t0 = ef::steady_clock::now();
    try {
      member m(job{j.store}, o);
      ADD_FAILURE() << "a worker (join " << join << ") started after the end was admitted";
    } catch (const ef::system_error& e) {
      EXPECT_EQ(e.code(), ef::errc::job_finished) << e.what();
    }
    EXPECT_LT(ef::steady_clock::now() - t0, 1s) << "refused only after waiting (join " << join << ")";
  }
}

// A member that left (request_leave) ends its loop without marking the job
// finished: the others train on, and a newcomer may still join them.
TEST(ElasticGroupContract, KeepTrainingAfterLeavingDoesNotFinishTheJob) {
  const job j;
  auto o = options();
  o.preconnect = false;  // leave at the first boundary
  member m(j, o);
  auto& g = m.g;
  (void)g.begin_step();
  g.request_leave();
  std::vector<float> grad(3, 0.f);
  ASSERT_TRUE(g.allreduce(grad));
  g.end_step(0.001);
  EXPECT_FALSE(g.keep_training(100));
  EXPECT_FALSE(j.store->try_get("ebbflow/done", ef::deadline::after(1s))) << "a leaver marked the job finished";
  EXPECT_THROW((void)g.keep_training(-1), std::invalid_argument);
}
