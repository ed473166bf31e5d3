// SPDX-License-Identifier: Apache-2.0
// Elastic group over in-process workers (threads, loopback transport, memory
// store). The multi-process tests over UCX and the Asio store are in
// tests/elastic/elastic_process_test.*; these pin down the protocol.
#include <ebbflow/elastic/group.hpp>
#include <ebbflow/elastic/loopback_network.hpp>
#include <ebbflow/elastic/planner_policy.hpp>

#include "group_harness.hpp"
#include "../thread_names.hpp"

#include <gtest/gtest.h>

#include <sched.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <numeric>
#include <random>
#include <regex>
#include <set>
#include <thread>
#include <tuple>

using namespace ebbflow_test;  // ef, el, store_ref, test_group, the chrono literals

namespace {

// Uneven but deterministic shares, to exercise the gradient weighting.
class skewed_policy final : public el::planning_policy {
 public:
  void observe(el::member_id, std::size_t, double) override {}
  std::vector<std::size_t> plan(std::span<const el::member_id> m, std::size_t B) override {
    std::vector<std::size_t> w;
    for (auto id : m) w.push_back(static_cast<std::size_t>(1 + id % 3));
    return el::scale_plan(w, B);
  }
};

// Softmax regression on a synthetic, linearly separable-ish problem.
constexpr int features = 6, classes = 3;
constexpr std::size_t dataset = 203;  // odd: epochs end with a short batch
constexpr std::size_t batch = 16;
constexpr float lr = 0.5f;

struct data_set {
  std::vector<float> x;
  std::vector<int> y;
  data_set() {
    std::mt19937 rng(11);
    std::normal_distribution<float> n(0, 1);
    for (std::size_t i = 0; i < dataset; ++i) {
      float s = 0;
      for (int f = 0; f < features; ++f) {
        const float v = n(rng);
        x.push_back(v);
        s += v * static_cast<float>(f + 1);
      }
      y.push_back(s > 2 ? 2 : s < -2 ? 0 : 1);
    }
  }
};
const data_set& data() {
  static data_set d;
  return d;
}

// The epoch's sample order (a stand-in for plan::sampler: a seeded shuffle).
std::vector<std::size_t> order(std::int64_t epoch) {
  std::vector<std::size_t> o(dataset);
  std::iota(o.begin(), o.end(), 0);
  std::mt19937_64 rng(1234 + static_cast<std::uint64_t>(epoch));
  std::shuffle(o.begin(), o.end(), rng);
  return o;
}

// Adds the cross-entropy gradient of sample i, times `scale`, to g.
void add_grad(const std::vector<float>& w, std::size_t i, float scale, std::vector<float>& g) {
  const float* xi = &data().x[i * features];
  float z[classes], m = -1e30f, s = 0;
  for (int c = 0; c < classes; ++c) {
    z[c] = 0;
    for (int f = 0; f < features; ++f) z[c] += w[static_cast<std::size_t>(c * features + f)] * xi[f];
    m = std::max(m, z[c]);
  }
  for (int c = 0; c < classes; ++c) s += (z[c] = std::exp(z[c] - m));
  for (int c = 0; c < classes; ++c) {
    const float p = z[c] / s - (c == data().y[i] ? 1.f : 0.f);
    for (int f = 0; f < features; ++f) g[static_cast<std::size_t>(c * features + f)] += scale * p * xi[f];
  }
}

std::vector<float> reference(std::int64_t steps) {
  std::vector<float> w(features * classes, 0.f);
  std::size_t cursor = 0;
  std::int64_t epoch = 0;
  for (std::int64_t t = 0; t < steps; ++t) {
    const auto o = order(epoch);
    const std::size_t B = std::min(batch, dataset - cursor);
    std::vector<float> g(w.size(), 0.f);
    for (std::size_t j = 0; j < B; ++j) add_grad(w, o[cursor + j], 1.f / static_cast<float>(B), g);
    for (std::size_t k = 0; k < w.size(); ++k) w[k] -= lr * g[k];
    cursor += B;
    if (cursor >= dataset) cursor = 0, ++epoch;
  }
  return w;
}

struct scenario {
  int initial = 3;
  std::int64_t steps = 30;
  std::vector<std::pair<int, std::int64_t>> kills;   // (initial launch rank, step at which it dies mid-step)
  std::vector<std::pair<int, std::int64_t>> leaves;  // (launch rank, step at which it asks to leave)
  // (launch rank, step, how long): the member hangs before that step's
  // allreduce, its heartbeat silent too (a stopped process), then goes on.
  std::vector<std::tuple<int, std::int64_t, std::chrono::milliseconds>> hangs;
  // (launch rank, step, how long): the training thread stops before that
  // step's allreduce while the heartbeat goes on (a stuck data loader).
  std::vector<std::tuple<int, std::int64_t, std::chrono::milliseconds>> stalls;
  // (launch rank, step): the member stops dead before that step's allreduce
  // with no transport error (a process whose peers' transports never saw it
  // die), and its launcher reports the exit (report_process_exit). Its
  // thread lingers for `exit_linger`, its connections frozen, then returns.
  std::vector<std::pair<int, std::int64_t>> reported_exits;
  std::chrono::milliseconds exit_linger{3000};
  std::chrono::milliseconds lease{300};
  std::chrono::milliseconds heartbeat{10};
  std::chrono::milliseconds end_linger{0};  // launch rank 0 keeps its group this long after the last step
  std::vector<std::int64_t> joins;          // steps (seen by rank 0) at which a newcomer starts
  // A newcomer starts this long after the first kill (for a survivor that
  // trains no step meanwhile, as below min_size).
  std::vector<std::chrono::milliseconds> joins_after_kill;
  int min_size = 1;
  bool run_on_while_changing = true;  // the loop also runs while g.changing()
  bool adaptive = false;  // planner_policy with emulated speeds (seconds per sample = 1 ms × (launch rank + 1))
  std::chrono::microseconds step_time{0};  // slept per step (time-based behaviour)
  std::chrono::milliseconds join_cooldown{1000}, join_cooldown_max{60'000};
  std::vector<std::pair<std::string, std::string>> store_init;  // keys set before the workers start
  int ticket_holes = 0;  // join-ticket numbers taken before the job, never written (newcomers that died)
  bool steal = false;    // steal_step instead of the own slice
  int straggler = -1;    // this launch rank sleeps per sample
  std::chrono::microseconds straggle{0};
  std::size_t joiner_extra_state = 0;  // a newcomer registers this many floats (0: as the members)
  std::chrono::milliseconds op_timeout{5000};
  std::chrono::milliseconds stall_warning{10'000};
  // Initial workers that start late (launch rank, delay) or never (a worker
  // that died while starting), and how long the first generation waits.
  std::vector<std::pair<int, std::chrono::milliseconds>> late_starts;
  std::vector<int> never_start;
  std::chrono::milliseconds initial_wait{30'000};
};

// A step a member committed: after a successful allreduce and end_step.
struct commit {
  int launch_rank = -1;  // -1: a newcomer
  int joiner = -1;       // which newcomer (in the order they started); -1: a launched worker
  std::int64_t step = 0, generation = 0;
  int world_size = 0;  // of the generation it was committed in
  std::chrono::steady_clock::time_point at;
};

struct outcome {
  std::mutex m;
  std::vector<commit> commits;                                 // every member's, in the order made
  std::optional<std::chrono::steady_clock::time_point> killed;  // the first kill
  std::vector<std::chrono::steady_clock::time_point> late_joins;  // the starts of joins_after_kill
  std::vector<std::vector<float>> finals;
  std::set<std::pair<std::int64_t, std::size_t>> committed_samples;  // (step, sample) from the final rank-0 view
  std::vector<el::world_change> history0;
  std::vector<std::string> errors;
  std::vector<std::uint64_t> last_plan;
  std::set<std::int64_t> final_steps;                          // the step every survivor ended at (one value)
  std::shared_ptr<el::memory_store> store;                     // as the job left it
  std::uint64_t stolen = 0;                                    // samples stolen over all members and steps
  std::string steal_twice_error;                               // what a second steal_step in one step said
  std::atomic<long> join_seq_reads{0};                         // reads of the join-ticket counter, all members
  std::atomic<long> rank0_calls{0};                            // store calls of launch rank 0's training thread
  std::vector<long> rank0_calls_at_step;                       // rank0_calls at each of its begin_steps (index: step)
  std::atomic<long> rank0_ticket_reads{0};                     // join tickets read by launch rank 0's training thread
  std::atomic<int> joiners_started{0};                         // names the newcomers' process keys
  std::chrono::steady_clock::time_point rank0_ends;            // launch rank 0 begins to end its group
  std::map<int, std::chrono::steady_clock::time_point> ended;  // by launch rank: its group destroyed
};

void worker(const scenario& sc, std::shared_ptr<el::memory_store> store, std::shared_ptr<el::loopback_fabric> fabric,
            int launch_rank, bool join, outcome& out, std::vector<std::jthread>& joiners, std::mutex& joiners_m) {
  if (!join && std::ranges::count(sc.never_start, launch_rank)) return;
  for (auto [r, delay] : sc.late_starts)
    if (!join && r == launch_rank) std::this_thread::sleep_for(delay);
  try {
    el::loopback_network net(fabric);
    el::group_options o;
    o.global_batch = batch;
    o.dataset_size = dataset;
    o.join = join;
    o.min_size = sc.min_size;
    o.heartbeat = sc.heartbeat;
    o.lease = sc.lease;
    const int joiner = join ? out.joiners_started++ : -1;
    o.process_key = "test-launcher/" + (join ? "joiner-" + std::to_string(joiner)
                                             : "initial-" + std::to_string(launch_rank));
    o.op_timeout = sc.op_timeout;
    o.stall_warning = sc.stall_warning;
    o.join_timeout = 20s;
    o.min_size_wait = 20s;
    o.initial_wait = sc.initial_wait;
    o.admit_delay = 0ms;  // steps take microseconds here
    o.join_cooldown = sc.join_cooldown;
    o.join_cooldown_max = sc.join_cooldown_max;
    o.worker_key = join ? "joiner" : "initial-" + std::to_string(launch_rank);
    ef::launch_info li;
    li.rank = join ? sc.initial : launch_rank;
    li.world_size = sc.initial;
    std::unique_ptr<el::planning_policy> policy;
    if (sc.adaptive)
      policy = std::make_unique<el::planner_policy>();
    else
      policy = std::make_unique<skewed_policy>();
    // The connection made on this thread is the training thread's (the
    // heartbeat and admission threads make their own).
    const auto training_thread = std::this_thread::get_id();
    const bool count_calls = !join && launch_rank == 0;
    auto frozen = std::make_shared<std::atomic<bool>>(false);
    test_group g(
        [store, &out, training_thread, count_calls, frozen] {
          store_ref r{store, nullptr, &out.join_seq_reads, frozen};
          if (count_calls && std::this_thread::get_id() == training_thread) {
            r.calls = &out.rank0_calls;
            r.ticket_reads = &out.rank0_ticket_reads;
          }
          return std::make_unique<store_ref>(r);
        },
        net, o, li, std::move(policy));
    const double per_sample = 1e-3 * (join ? 2 : launch_rank + 1);
    std::vector<float> w(features * classes, 0.f);
    std::vector<float> w_registered(join ? sc.joiner_extra_state : 0, 0.f);
    g.register_state("w", std::as_writable_bytes(std::span(w_registered.empty() ? w : w_registered)));
    std::set<std::int64_t> join_started;
    std::set<std::int64_t> hung;  // steps at which this member hung (once each)
    // Runs on past sc.steps while a join or leave is still being prepared
    // (it may take many of these microsecond steps): nobody is stranded.
    while (g.active() && (g.step() < sc.steps || (sc.run_on_while_changing && g.changing()))) {
      const auto s = g.begin_step();
      if (count_calls && s.step >= 0) {
        std::lock_guard lk(out.m);
        out.rank0_calls_at_step.resize(static_cast<std::size_t>(s.step) + 1, -1);
        out.rank0_calls_at_step[static_cast<std::size_t>(s.step)] = out.rank0_calls.load();
      }
      if (!join && launch_rank == 0)
        for (auto js : sc.joins)
          if (s.step == js && join_started.insert(js).second) {
            std::lock_guard lk(joiners_m);
            joiners.emplace_back([&sc, store, fabric, &out, &joiners, &joiners_m] {
              worker(sc, store, fabric, -1, true, out, joiners, joiners_m);
            });
            // Steps take microseconds here: wait until the newcomer wrote its
            // join ticket and this coordinator's heartbeat thread read the
            // ticket counter after that (twice: the first read may have
            // begun before), so it is admitted now, not after the end.
            const auto want = static_cast<std::int64_t>(join_started.size()) + sc.ticket_holes;
            const auto d = ef::deadline::after(10s);
            while (!store->try_get("ebbflow/join/" + std::to_string(want), d) && !d.expired())
              std::this_thread::sleep_for(100us);
            const long reads = out.join_seq_reads.load();
            while (out.join_seq_reads.load() < reads + 2 && !d.expired()) std::this_thread::sleep_for(100us);
          }
      for (auto [r, ls] : sc.leaves)
        if (!join && r == launch_rank && s.step == ls) g.request_leave();
      const auto o2 = order(s.epoch);
      std::vector<float> grad(w.size(), 0.f);
      std::size_t processed = s.batch;
      if (sc.steal) {
        const auto rep = g.steal_step([&](std::size_t first, std::size_t last) {
          for (auto p = first; p < last; ++p)
            add_grad(w, o2[s.cursor + p], 1.f / static_cast<float>(s.global_batch), grad);
          if (!join && launch_rank == sc.straggler) std::this_thread::sleep_for(sc.straggle * (last - first));
        });
        processed = rep.processed;
        if (!join && launch_rank == 0 && s.step == 3) {
          try {
            (void)g.steal_step([](std::size_t, std::size_t) {});
          } catch (const ef::system_error& e) {
            std::lock_guard lk(out.m);
            out.steal_twice_error = e.what();
          }
        }
        std::lock_guard lk(out.m);
        out.stolen += rep.stolen;
      } else {
        for (std::size_t j = 0; j < s.batch; ++j)
          add_grad(w, o2[s.cursor + s.offset + j], 1.f / static_cast<float>(s.global_batch), grad);
      }
      for (auto [r, ks] : sc.kills)
        if (!join && r == launch_rank && s.step == ks) {
          {
            std::lock_guard lk(out.m);
            if (!out.killed) out.killed = std::chrono::steady_clock::now();
          }
          net.kill();  // crash mid-step: peers are inside the allreduce
          return;
        }
      for (auto [r, es] : sc.reported_exits)
        if (!join && r == launch_rank && s.step == es) {
          frozen->store(true);  // its heartbeat stops with it
          el::report_process_exit(*store, o, o.process_key, "killed by the test", ef::deadline::after(1s));
          std::this_thread::sleep_for(sc.exit_linger);
          frozen->store(false);
          return;  // no further call: the members went on without it
        }
      for (auto [r, hs, how_long] : sc.hangs)
        if (!join && r == launch_rank && s.step == hs && hung.insert(hs).second) {
          frozen->store(true);
          std::this_thread::sleep_for(how_long);
          frozen->store(false);
        }
      for (auto [r, ss, how_long] : sc.stalls)
        if (!join && r == launch_rank && s.step == ss && hung.insert(-ss - 1).second)
          std::this_thread::sleep_for(how_long);
      if (sc.step_time.count()) std::this_thread::sleep_for(sc.step_time);
      if (!g.allreduce(grad)) continue;
      for (std::size_t k = 0; k < w.size(); ++k) w[k] -= lr * grad[k];
      g.end_step(2e-3 + per_sample * static_cast<double>(processed), processed);
      std::lock_guard lk(out.m);
      out.commits.push_back({join ? -1 : launch_rank, joiner, s.step, s.generation, s.world_size,
                             std::chrono::steady_clock::now()});
    }
    if (g.active()) {
      std::lock_guard lk(out.m);
      out.finals.push_back(w);
      out.final_steps.insert(g.step());
      out.last_plan.assign(g.plan().begin(), g.plan().end());
      if (g.rank() == 0) {
        out.history0 = g.history();
        g.finish();
      }
    }
    if (!join && launch_rank == 0 && sc.end_linger.count()) {
      std::this_thread::sleep_for(sc.end_linger);  // evaluating, saving: the group lives on
      std::lock_guard lk(out.m);
      out.rank0_ends = std::chrono::steady_clock::now();
    }
  } catch (const std::exception& e) {
    std::lock_guard lk(out.m);
    out.errors.push_back(e.what());
  }
  if (!join) {
    std::lock_guard lk(out.m);
    out.ended[launch_rank] = std::chrono::steady_clock::now();  // its group destroyed
  }
}

std::unique_ptr<outcome> run(const scenario& sc) {
  auto store = std::make_shared<el::memory_store>();
  for (auto& [k, v] : sc.store_init) store->set(k, v, ef::deadline::after(1s));
  if (sc.ticket_holes > 0) store->add("ebbflow/join_seq", sc.ticket_holes, ef::deadline::after(1s));
  auto fabric = std::make_shared<el::loopback_fabric>();
  auto result = std::make_unique<outcome>();
  result->store = store;
  outcome& out = *result;
  std::vector<std::jthread> joiners;
  std::mutex joiners_m;
  {
    std::vector<std::jthread> ts;
    for (int r = 0; r < sc.initial; ++r)
      ts.emplace_back([&, r] { worker(sc, store, fabric, r, false, out, joiners, joiners_m); });
    if (!sc.joins_after_kill.empty())
      ts.emplace_back([&] {
        const auto d = ef::deadline::after(20s);
        std::optional<std::chrono::steady_clock::time_point> killed;
        while (!killed && !d.expired()) {
          std::this_thread::sleep_for(1ms);
          std::lock_guard lk(out.m);
          killed = out.killed;
        }
        if (!killed) return;  // nobody died: the scenario's kill step was never reached
        for (auto after : sc.joins_after_kill) {
          std::this_thread::sleep_until(*killed + after);
          std::lock_guard lk(joiners_m), lo(out.m);
          out.late_joins.push_back(std::chrono::steady_clock::now());
          joiners.emplace_back([&] { worker(sc, store, fabric, -1, true, out, joiners, joiners_m); });
        }
      });
  }
  for (;;) {  // joiners may still be starting threads of their own: drain
    std::vector<std::jthread> batch_;
    {
      std::lock_guard lk(joiners_m);
      if (joiners.empty()) break;
      batch_.swap(joiners);
    }
  }
  return result;
}

// (reason, old size, new size) of each world change, for comparisons.
std::vector<std::tuple<el::change_reason, int, int>> changes_of(const std::vector<el::world_change>& history) {
  std::vector<std::tuple<el::change_reason, int, int>> out;
  for (auto& c : history) out.emplace_back(c.reason, c.old_size, c.new_size);
  return out;
}

void expect_equal_to_reference(const scenario& sc, outcome& out, std::size_t survivors) {
  ASSERT_TRUE(out.errors.empty()) << out.errors.front();
  ASSERT_EQ(out.finals.size(), survivors);
  ASSERT_EQ(out.final_steps.size(), 1u) << "the survivors ended at different steps";
  ASSERT_GE(*out.final_steps.begin(), sc.steps);
  const auto ref = reference(*out.final_steps.begin());
  for (auto& w : out.finals)
    for (std::size_t k = 0; k < w.size(); ++k) ASSERT_NEAR(w[k], ref[k], 2e-5f * (1 + std::abs(ref[k]))) << k;
}

// The members came and went as `sc` has them (from what each committed): a
// killed member committed nothing from the step it died in, a leaver the
// step it asked in but not the last, and every newcomer trained.
void expect_changes_as_scheduled(const scenario& sc, const outcome& out) {
  ASSERT_EQ(out.final_steps.size(), 1u);
  const std::int64_t last = *out.final_steps.begin() - 1;  // the survivors' last step
  std::map<int, std::int64_t> last_of;                     // launch rank -> its last committed step
  std::set<int> joiners;
  for (const auto& c : out.commits) {
    if (c.joiner >= 0) joiners.insert(c.joiner);
    if (c.launch_rank >= 0 && (!last_of.count(c.launch_rank) || last_of[c.launch_rank] < c.step))
      last_of[c.launch_rank] = c.step;
  }
  const auto last_step_of = [&](int r) { return last_of.count(r) ? last_of[r] : std::int64_t{-1}; };
  for (auto [r, ks] : sc.kills) EXPECT_LT(last_step_of(r), ks) << "killed launch rank " << r;
  for (auto [r, ls] : sc.leaves) {
    EXPECT_GE(last_step_of(r), ls) << "leaver " << r << " stopped before the step it asked in";
    EXPECT_LT(last_step_of(r), last) << "leaver " << r << " never left";
  }
  EXPECT_EQ(joiners.size(), sc.joins.size() + sc.joins_after_kill.size()) << "newcomers that trained";
}

// Runs `sc`: the result equals the single-process run, with `survivors`
// members at the end, and the members came and went as `sc` has them.
std::unique_ptr<outcome> run_as_scheduled(const scenario& sc, std::size_t survivors) {
  auto out = run(sc);
  expect_equal_to_reference(sc, *out, survivors);
  expect_changes_as_scheduled(sc, *out);
  return out;
}

// Runs `sc`, in which one of its `sc.initial` members dies: the run must
// end within `limit` (`late` says what a longer one means), equal the
// single-process reference, and change the world once for the failure.
void expect_one_failure_within(const scenario& sc, std::chrono::milliseconds limit, const std::string& late) {
  const auto t0 = std::chrono::steady_clock::now();
  auto out_p = run(sc);
  auto& out = *out_p;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, limit) << late;
  const int n = sc.initial;
  expect_equal_to_reference(sc, out, static_cast<std::size_t>(n - 1));
  const auto changes = changes_of(out.history0);
  ASSERT_GE(changes.size(), 2u) << late;
  EXPECT_EQ(changes[1], std::make_tuple(el::change_reason::failure, n, n - 1)) << late;
}

}  // namespace

// The stall warning compares packed progress counters: a member behind
// another must read lower, whatever the fields' sizes.
TEST(ElasticProgress, APackedCounterOrdersAsStepGenerationCollective) {
  using el::detail::progress;
  const progress p{123456789, 42, 7};
  const auto q = progress::decode(p.encode());
  EXPECT_EQ(q.step, p.step);
  EXPECT_EQ(q.generation, p.generation);
  EXPECT_EQ(q.collective, p.collective);
  EXPECT_LT((progress{5, 9, 255}.encode()), (progress{6, 0, 0}.encode()));
  EXPECT_LT((progress{5, 8, 255}.encode()), (progress{5, 9, 0}.encode()));
  EXPECT_LT((progress{5, 9, 3}.encode()), (progress{5, 9, 4}.encode()));
  // Saturation keeps the fields apart instead of carrying into the next one.
  const auto big = progress::decode(progress{7, 1 << 20, 1000}.encode());
  EXPECT_EQ(big.step, 7);
  EXPECT_EQ(big.generation, progress::max_generation);
  EXPECT_EQ(big.collective, progress::max_collective);
  EXPECT_EQ(progress::decode(progress{-3, -1, -1}.encode()).step, 0);
}

// The heartbeat's wait for any of several keys, on a store that has no
// wait_any: it waits for the first key and finds the others at the end of
// each 50 ms slice; nullopt at the deadline or when stopped.
TEST(ElasticDetail, WaitAnyKeyOnAStoreThatOnlyWaitsForEveryKey) {
  struct all_only {
    el::memory_store m;
    void set(const std::string& k, std::string_view v, ef::deadline d) { m.set(k, v, d); }
    std::optional<std::string> try_get(const std::string& k, ef::deadline d) { return m.try_get(k, d); }
    std::int64_t add(const std::string& k, std::int64_t x, ef::deadline d) { return m.add(k, x, d); }
    auto compare_set(const std::string& k, std::string_view e, std::string_view v, ef::deadline d) {
      return m.compare_set(k, e, v, d);
    }
    void wait(const std::vector<std::string>& keys, ef::deadline d) { m.wait(keys, d); }
  } st;
  static_assert(el::kv_store<all_only>);
  std::stop_source stop;
  const auto d = [] { return ef::deadline::after(2s); };
  EXPECT_EQ(el::detail::wait_any_key(st, {"a", "b"}, ef::deadline::after(120ms), stop.get_token()), std::nullopt);
  std::jthread setter([&] {
    std::this_thread::sleep_for(60ms);
    st.set("b", "1", d());
  });
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(el::detail::wait_any_key(st, {"a", "b"}, d(), stop.get_token()), std::optional<std::size_t>(1));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 500ms);
  st.set("a", "1", d());
  EXPECT_EQ(el::detail::wait_any_key(st, {"a", "b"}, d(), stop.get_token()), std::optional<std::size_t>(0));
  stop.request_stop();
  EXPECT_EQ(el::detail::wait_any_key(st, {"c"}, d(), stop.get_token()), std::nullopt);
}

// group_options::rt_priority, in a child process (it changes the
// scheduling of its threads): the threads named (the group's) then run
// SCHED_RR; another thread already running (a library's, such as UCX's
// progress thread) stays normal; threads and processes they start later do
// not (SCHED_RESET_ON_FORK: a loader thread the user starts later cannot hog
// a core at real-time priority); a real-time thread that asks for the
// lowest CPU priority (the admission helper, should the user have started
// the process real-time) leaves the real-time class for nice 19.
TEST(ElasticDetail, RtPriorityCoversTheGroupsThreadsButNotOthersLaterOnesOrTheHelper) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const auto base = [](pid_t tid) { return ::sched_getscheduler(tid) & ~SCHED_RESET_ON_FORK; };
    std::atomic<pid_t> named{0}, other{0};
    std::atomic<bool> done{false};
    const auto idle = [&](std::atomic<pid_t>& tid) {
      tid = ::gettid();
      while (!done) std::this_thread::sleep_for(1ms);
    };
    std::thread t(idle, std::ref(named)), u(idle, std::ref(other));
    while (named == 0 || other == 0) std::this_thread::sleep_for(1ms);
    const pthread_t group_threads[] = {::pthread_self(), t.native_handle()};
    el::detail::request_rt_priority(3, group_threads);
    int bad = 0;
    if (base(0) != SCHED_RR) {
      done = true;
      t.join();
      u.join();
      ::_exit(77);  // not permitted here (no CAP_SYS_NICE, no RLIMIT_RTPRIO): logged, and nothing to test
    }
    sched_param p{};
    if (::sched_getparam(0, &p) != 0 || p.sched_priority != 3) bad |= 1;
    if (base(named) != SCHED_RR) bad |= 2;
    if (base(other) != SCHED_OTHER) bad |= 32;
    done = true;
    t.join();
    u.join();
    int later = -1, helper = -1, helper_nice = 0;
    std::thread([&] {
      later = base(0);
      sched_param rt{};
      rt.sched_priority = 3;
      ::sched_setscheduler(0, SCHED_RR, &rt);
      el::detail::lowest_cpu_priority();
      helper = base(0);
      helper_nice = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()));
    }).join();
    if (later != SCHED_OTHER) bad |= 4;
    if (helper != SCHED_OTHER || helper_nice != 19) bad |= 8;
    const pid_t child = ::fork();
    if (child == 0) ::_exit(base(0) == SCHED_OTHER ? 0 : 1);
    int st = 0;
    if (child < 0 || ::waitpid(child, &st, 0) != child || !WIFEXITED(st) || WEXITSTATUS(st) != 0) bad |= 16;
    ::_exit(bad);
  }
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st)) << st;
  if (WEXITSTATUS(st) == 77) GTEST_SKIP() << "SCHED_RR not permitted here (needs CAP_SYS_NICE or RLIMIT_RTPRIO)";
  EXPECT_EQ(WEXITSTATUS(st), 0) << "1: priority; 2: a thread named; 4: a thread started later; "
                                   "8: the helper's thread; 16: a forked child; 32: a thread not named";
}

TEST(ElasticGroup, StaticGroupEqualsSingleProcess) {
  scenario sc;
  auto out_p = run(sc);
  auto& out = *out_p;
  expect_equal_to_reference(sc, out, 3);
  ASSERT_EQ(out.history0.size(), 1u);
  EXPECT_EQ(out.history0[0].reason, el::change_reason::initial);
}

#if defined(__linux__)
// top -H, perf and gdb tell a member's heartbeat and admission helper from
// the training thread.
TEST(ElasticGroup, ItsThreadsAreNamed) {
  scenario sc;
  sc.steps = 60;
  sc.step_time = std::chrono::milliseconds(10);
  sc.joins = {10};
  std::atomic<bool> done{false};
  bool beat = false, admit = false;
  std::thread job([&] {
    run(sc);
    done = true;
  });
  while (!done) {
    for (const auto& n : ebbflow_test::thread_names()) {
      beat = beat || n == "ebbflow-beat";
      admit = admit || n == "ebbflow-admit";
    }
    std::this_thread::yield();
  }
  job.join();
  EXPECT_TRUE(beat);
  EXPECT_TRUE(admit);
}
#endif

// The coordinator learns of join tickets from its heartbeat thread: a steady
// step, on any member, waits on no store call (the store may be busy, or far).
TEST(ElasticGroup, ASteadyStepMakesNoStoreCall) {
  scenario sc;
  sc.steps = 40;
  sc.step_time = 200us;  // several heartbeats (10 ms) pass during the job
  auto out_p = run(sc);
  auto& out = *out_p;
  expect_equal_to_reference(sc, out, 3);
  const auto& at = out.rank0_calls_at_step;
  ASSERT_GE(at.size(), 36u);
  EXPECT_EQ(at[35] - at[5], 0) << "store calls of the coordinator's training thread in steps 5 to 35";
  EXPECT_GT(out.join_seq_reads.load(), 0) << "the heartbeat thread watches the join tickets";
}

// A newcomer that died between taking a ticket number and writing the
// ticket leaves a hole: the coordinator skips it after a lease (300 ms
// here) and admits the newcomers behind it.
TEST(ElasticGroup, ATicketNeverWrittenDoesNotStopTheOnesAfterIt) {
  scenario sc;
  sc.steps = 60;
  sc.step_time = 20ms;
  sc.ticket_holes = 1;
  sc.joins = {5};
  auto out_p = run(sc);
  auto& out = *out_p;
  expect_equal_to_reference(sc, out, 4);
  const auto changes = changes_of(out.history0);
  ASSERT_GE(changes.size(), 2u);
  EXPECT_EQ(changes.back(), std::make_tuple(el::change_reason::join, 3, 4));
}

TEST(ElasticGroup, JoinMidTrainingGetsStateAndEqualsSingleProcess) {
  scenario sc;
  sc.joins = {4, 9};
  auto out_p = run_as_scheduled(sc, 5);
  auto& out = *out_p;
  int joins = 0;
  for (auto& h : out.history0) joins += h.reason == el::change_reason::join;
  EXPECT_GE(joins, 1);
  EXPECT_EQ(out.history0.back().new_size, 5);
  // The step that admits newcomers reads no join ticket either: the
  // coordinator's heartbeat thread read them (and their workers' failure
  // counts) before it told the training thread that they wait.
  EXPECT_EQ(out.rank0_ticket_reads.load(), 0) << "join tickets read on the coordinator's training thread";
}

TEST(ElasticGroup, GracefulLeave) {
  scenario sc;
  sc.leaves = {{2, 7}};
  auto out_p = run_as_scheduled(sc, 2);
  auto& out = *out_p;
  EXPECT_EQ(out.history0.back().reason, el::change_reason::leave);
}

TEST(ElasticGroup, KillDuringStepRollsBackAndRedoes) {
  scenario sc;
  sc.kills = {{1, 6}};
  auto out_p = run_as_scheduled(sc, 2);
  auto& out = *out_p;
  EXPECT_EQ(out.history0.back().reason, el::change_reason::failure);
  EXPECT_EQ(out.history0.back().new_size, 2);
}

TEST(ElasticGroup, KillOfCoordinator) {
  scenario sc;
  sc.initial = 4;
  sc.kills = {{0, 5}};
  auto out_p = run_as_scheduled(sc, 3);
  auto& out = *out_p;
  EXPECT_EQ(changes_of(out.history0), (std::vector<std::tuple<el::change_reason, int, int>>{
                                          {el::change_reason::initial, 0, 4}, {el::change_reason::failure, 4, 3}}));
}

// A member that hangs inside a step (a stopped process, a livelock, a store
// partition) fails no transport operation: its peers would wait in the
// allreduce until op_timeout, or until it wakes. Its lease runs out instead
// (300 ms here): the others abort the step, go on without it and admit it
// again when it wakes. Both a member (watched by the coordinator) and the
// coordinator (watched by every member) hang.
TEST(ElasticGroup, AHungMemberIsDroppedWhenItsLeaseExpiresAndRejoins) {
  for (const int hung : {1, 0}) {
    scenario sc;
    sc.steps = 60;
    sc.step_time = 20ms;
    sc.hangs = {{hung, 6, 900ms}};
    sc.op_timeout = 20s;
    auto out_p = run(sc);
    auto& out = *out_p;
    expect_equal_to_reference(sc, out, 3);
    const auto changes = changes_of(out.history0);
    ASSERT_GE(changes.size(), 3u) << "hung member " << hung;
    EXPECT_EQ(changes[1], std::make_tuple(el::change_reason::failure, 3, 2)) << "hung member " << hung;
    EXPECT_EQ(changes[2], std::make_tuple(el::change_reason::join, 2, 3)) << "hung member " << hung;
    // The survivors did not wait for the hung member: they trained on while
    // it slept (its 900 ms are 45 of their 20 ms steps).
    EXPECT_GE(out.history0[2].step, out.history0[1].step + 10) << "hung member " << hung;
  }
}

// A member whose own peers are alive learns of a death only from the
// abort that another posts in the store. Its heartbeat thread waits for
// that key on the server between beats, so it leaves the collective at
// once, not at its next beat (5 s apart here, and all of them just beat).
// Rank 1 dies next to the coordinator, whose transport sees it; rank 3 away
// from it, so the abort tells the coordinator too (its heartbeat waits for
// the abort together with the next join ticket).
TEST(ElasticGroup, TheAbortReachesEveryMemberAtOnceNotAtItsNextHeartbeat) {
  for (const int dead : {1, 3}) {
    scenario sc;
    sc.initial = 6;
    sc.steps = 30;
    sc.heartbeat = 5s;
    sc.lease = 12s;
    sc.op_timeout = 30s;
    sc.kills = {{dead, 6}};
    expect_one_failure_within(
        sc, 2500ms, "a member learned of the abort at its next heartbeat (rank " + std::to_string(dead) + " killed)");
  }
}

// The report names the member the process became, and nothing for a
// process that never registered (it died starting: no member to drop).
TEST(ElasticGroup, AnExitReportNamesTheMemberTheProcessBecameOrNothing) {
  el::memory_store st;
  el::group_options o;
  o.prefix = "job";
  const auto d = ef::deadline::after(1s);
  EXPECT_EQ(el::report_process_exit(st, o, "l/0", "killed by signal 9 (SIGKILL)", d), std::nullopt);
  EXPECT_EQ(st.try_get(o.gone_count_key(), d), std::nullopt);
  st.set(o.process_record_key("l/1"), "7", d);
  EXPECT_EQ(el::report_process_exit(st, o, "l/1", "exited with status 3", d), std::optional<el::member_id>(7));
  EXPECT_EQ(st.try_get("job/gone/7", d), std::optional<std::string>("exited with status 3"));
  EXPECT_EQ(st.add(o.gone_count_key(), 0, d), 1);
  st.set(o.process_record_key("l/2"), "not a number", d);
  EXPECT_THROW(el::report_process_exit(st, o, "l/2", "exited with status 1", d), ef::system_error);
}

// The end of a job: a member that ends keeps its transport until every
// member has ended, at most a lease (300 ms here), so a peer still in the
// last step's exchange never sees it close. Launch rank 0 keeps its group
// 150 ms after the last step (evaluating, say); then 1 s, past the lease.
TEST(ElasticGroup, AMemberThatEndsWaitsForTheOthersToEndForAtMostALease) {
  for (const auto linger : {150ms, 1000ms}) {
    scenario sc;
    sc.steps = 20;
    sc.end_linger = linger;
    auto out_p = run(sc);
    auto& out = *out_p;
    expect_equal_to_reference(sc, out, 3);
    ASSERT_EQ(out.ended.size(), 3u);
    for (int r : {1, 2}) {
      const auto after = out.ended[r] - out.rank0_ends;
      if (linger < sc.lease)
        EXPECT_GE(after, 0ms) << "launch rank " << r << " closed its transport while rank 0 still had its group";
      else
        EXPECT_LT(after, -300ms) << "launch rank " << r << " waited past the lease for rank 0";
    }
  }
}

// A process that dies where no peer's transport sees it (every process of a
// host killed at once, peers already revoked) fails no operation of theirs,
// and its lease is 20 s here. Its launcher's report of the exit is what the
// others act on: they drop it at once and train on while its thread lingers
// (3 s). Both a member (the coordinator's heartbeat reads the report) and
// the coordinator (every member's does) die.
TEST(ElasticGroup, AProcessExitItsLauncherReportsEndsTheStepWithoutWaitingForTheLease) {
  for (const int dead : {1, 0}) {
    scenario sc;
    sc.steps = 60;
    sc.step_time = 20ms;
    sc.lease = 20s;
    sc.op_timeout = 30s;
    sc.reported_exits = {{dead, 6}};
    expect_one_failure_within(sc, 10s, "the members waited for the lease, dead member " + std::to_string(dead));
  }
}

// A member whose training thread is stuck outside ebbflow (a deadlocked data
// loader) while its heartbeat thread goes on: no lease expires, so the others
// wait for it until the operation deadline, once in the allreduce and once in
// the recovery, then go on without it; it rejoins when it gets unstuck.
// Nothing hangs, and the result equals the single-process run.
TEST(ElasticGroup, AMemberWithAStuckTrainingThreadIsDroppedAtTheOperationDeadline) {
  scenario sc;
  sc.steps = 150;
  sc.step_time = 20ms;
  sc.stalls = {{1, 6, 1500ms}};
  sc.op_timeout = 500ms;
  sc.stall_warning = 200ms;
  const auto t0 = std::chrono::steady_clock::now();
  ::testing::internal::CaptureStderr();
  auto out_p = run(sc);
  const std::string log = ::testing::internal::GetCapturedStderr();
  auto& out = *out_p;
  // The others say whom they wait for and why: the coordinator while it
  // waits in the collective (the stall warning), then in the recovery.
  std::smatch recovery, stall;
  ASSERT_TRUE(std::regex_search(
      log, recovery, std::regex(R"(member\(s\) (\d+) still send heartbeats but have not reached the recovery)")))
      << log;
  ASSERT_TRUE(std::regex_search(
      log, stall,
      std::regex(
          R"(generation \d+: member \d+ has waited \d+ ms in collective 1 of step 6; member\(s\) (\d+) \(rank 1\) have not reached it while their heartbeats go on)")))
      << log;
  EXPECT_EQ(stall[1], recovery[1]) << log;
  expect_equal_to_reference(sc, out, 3);
  const auto changes = changes_of(out.history0);
  ASSERT_GE(changes.size(), 3u);
  EXPECT_EQ(changes[1], std::make_tuple(el::change_reason::failure, 3, 2));
  EXPECT_EQ(changes[2], std::make_tuple(el::change_reason::join, 2, 3));
  // The others went on before the stuck member woke: it was dropped about
  // 1 s (two deadlines) into its 1.5 s, and the rest are 25 steps of 20 ms.
  EXPECT_GE(out.history0[2].step, out.history0[1].step + 10);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);
}

// A stuck coordinator: the others, which watch only its lease, name it.
TEST(ElasticGroup, TheStallWarningNamesAStuckCoordinator) {
  scenario sc;
  sc.steps = 60;
  sc.step_time = 20ms;
  sc.stalls = {{0, 6, 1200ms}};
  sc.op_timeout = 800ms;
  sc.stall_warning = 200ms;
  ::testing::internal::CaptureStderr();
  auto out_p = run(sc);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(std::regex_search(
      log,
      std::regex(
          R"(generation 0: member \d+ has waited \d+ ms in collective 1 of step 6; member\(s\) \d+ \(rank 0, the coordinator\) have not reached it)")))
      << log;
  expect_equal_to_reference(sc, *out_p, 3);
}

// A launched worker that dies while starting (or never starts) must not stop
// the job: after EBBFLOW_INITIAL_WAIT_MS the first generation starts with the
// workers registered, if at least min_size; a late one joins as a newcomer.
namespace {
// Launch rank `never` of three never starts: the first generation is formed
// of the other two after the initial wait (200 ms here), and the job equals
// the single-process run.
void expect_started_without(int never) {
  scenario sc;
  sc.never_start = {never};
  sc.initial_wait = 200ms;
  auto out_p = run(sc);
  expect_equal_to_reference(sc, *out_p, 2);
  const auto changes = changes_of(out_p->history0);
  ASSERT_FALSE(changes.empty());
  EXPECT_EQ(changes[0], std::make_tuple(el::change_reason::initial, 0, 2));
}
}  // namespace

TEST(ElasticGroup, AnInitialWorkerThatNeverStartsIsLeftOutAfterTheInitialWait) { expect_started_without(2); }

TEST(ElasticGroup, ALateInitialWorkerJoinsAsANewcomer) {
  scenario sc;
  sc.steps = 100;
  sc.step_time = 20ms;
  sc.late_starts = {{2, 600ms}};
  sc.initial_wait = 200ms;
  auto out_p = run(sc);
  auto& out = *out_p;
  expect_equal_to_reference(sc, out, 3);
  const auto changes = changes_of(out.history0);
  ASSERT_GE(changes.size(), 2u);
  EXPECT_EQ(changes[0], std::make_tuple(el::change_reason::initial, 0, 2));
  EXPECT_EQ(changes[1], std::make_tuple(el::change_reason::join, 2, 3));
}

// Launch rank 0 writes generation 0. If it never comes (or stops
// heartbeating before it does), the registered workers propose generation 0
// without it after the initial wait and a lease.
TEST(ElasticGroup, WithoutLaunchRankZeroTheOthersProposeTheInitialGeneration) { expect_started_without(0); }

// Below min_size after the initial wait, the first generation waits for
// min_size workers (here the late one), not for all of them.
TEST(ElasticGroup, TheInitialGenerationWaitsForMinSizeNotForEveryWorker) {
  scenario sc;
  sc.min_size = 2;
  sc.never_start = {1};
  sc.late_starts = {{2, 500ms}};
  sc.initial_wait = 100ms;
  const auto t0 = std::chrono::steady_clock::now();
  auto out_p = run(sc);
  auto& out = *out_p;
  expect_equal_to_reference(sc, out, 2);
  ASSERT_FALSE(out.history0.empty());
  EXPECT_EQ(out.history0[0].new_size, 2);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 500ms);
}

TEST(ElasticGroup, TwoFailuresAtOnceThenJoinAndLeave) {
  scenario sc;
  sc.initial = 5;
  sc.steps = 40;
  sc.kills = {{1, 8}, {3, 8}};
  sc.leaves = {{4, 20}};
  sc.joins = {12};
  (void)run_as_scheduled(sc, 3);  // 5 - 2 killed - 1 left + 1 joined
}

// Sixteen members (on however few cores): three die at once, two join, one
// leaves; the result still equals the single-process run.
TEST(ElasticGroup, SixteenMembersThreeFailAtOnceTwoJoinOneLeaves) {
  scenario sc;
  sc.initial = 16;
  sc.steps = 40;
  sc.kills = {{3, 8}, {7, 8}, {11, 8}};
  sc.joins = {14, 15};
  sc.leaves = {{5, 24}};
  (void)run_as_scheduled(sc, 14);  // 16 - 3 killed + 2 joined - 1 left
}

TEST(ElasticGroup, KillOfALeaverWhileTheOthersConnectIsAFailureNotALeave) {
  // Member 2 asks to leave at step 20 (the others start connecting without
  // it) and dies at step 21, before the switch. The leave's record has the
  // steps of its decision, not the ones the survivors hold after the
  // failure: the recovery must fail it over to a record of its own.
  scenario sc;
  sc.initial = 4;
  sc.leaves = {{2, 20}};
  sc.kills = {{2, 21}};
  auto out_p = run(sc);
  auto& out = *out_p;
  expect_equal_to_reference(sc, out, 3);
  ASSERT_GE(out.history0.size(), 2u);
  EXPECT_EQ(out.history0.back().reason, el::change_reason::failure);
  EXPECT_EQ(out.history0.back().generation, 2);  // generation 1, the leave's, was failed over
  EXPECT_EQ(out.history0.back().new_size, 3);
}

TEST(ElasticGroup, JobEndingBeforeTheSwitchTellsTheJoinerClearly) {
  // A newcomer asks to join at the last step, and the loop ends at sc.steps
  // whatever is in flight: the members never switch to it. It must fail at
  // once with a clear error (not wait out its deadline, not train alone).
  scenario sc;
  sc.steps = 10;
  sc.joins = {9};
  sc.run_on_while_changing = false;
  const auto t0 = std::chrono::steady_clock::now();
  auto out_p = run(sc);
  auto& out = *out_p;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);  // join_timeout and op_timeout are 20 s and 5 s
  ASSERT_EQ(out.errors.size(), 1u);
  EXPECT_NE(out.errors[0].find("finished before the members switched"), std::string::npos) << out.errors[0];
  ASSERT_EQ(out.finals.size(), 3u);
  const auto ref = reference(sc.steps);
  for (auto& w : out.finals)
    for (std::size_t k = 0; k < w.size(); ++k) ASSERT_NEAR(w[k], ref[k], 2e-5f * (1 + std::abs(ref[k]))) << k;
}

// A newcomer whose registered state differs from the members' (smaller or
// larger) fails with a message that names the buffer, both sizes and the
// sender; the members go on.
TEST(ElasticGroup, NewcomerWithOtherStateFailsClearlyAndTheMembersGoOn) {
  for (const std::size_t floats : {std::size_t{5}, std::size_t{4096}}) {  // smaller, larger than the members'
    scenario sc;
    sc.steps = 20;
    sc.joins = {4};
    sc.joiner_extra_state = floats;
    // The failed newcomer's thread ends without its endpoint failing (no
    // process dies here): its silent lease (300 ms) or the deadline of the
    // members' next collective ends their wait.
    sc.op_timeout = 1s;
    auto out_p = run(sc);
    auto& out = *out_p;
    ASSERT_EQ(out.errors.size(), 1u) << floats;
    const std::string want =
        "state buffer 0 is 'w' of " + std::to_string(features * classes * sizeof(float)) + " bytes on member ";
    EXPECT_NE(out.errors[0].find(want), std::string::npos) << out.errors[0];
    EXPECT_NE(out.errors[0].find("of " + std::to_string(floats * sizeof(float)) + " bytes here"), std::string::npos)
        << out.errors[0];
    ASSERT_EQ(out.finals.size(), 3u);
    ASSERT_EQ(out.final_steps.size(), 1u);
    const auto ref = reference(*out.final_steps.begin());
    for (auto& w : out.finals)
      for (std::size_t k = 0; k < w.size(); ++k) ASSERT_NEAR(w[k], ref[k], 2e-5f * (1 + std::abs(ref[k]))) << k;
  }
}

// A failure that leaves fewer than min_size members: the survivor commits
// nothing until a newcomer (started 300 ms after the death) is in, then the
// two redo the failed step and train on; the result equals the
// single-process run. (With min_size 1 the survivor trains on alone at
// once: every check below but the reference fails.)
TEST(ElasticGroup, BelowMinSizeWaitsForAJoiner) {
  scenario sc;
  sc.initial = 2;
  sc.min_size = 2;
  sc.kills = {{1, 4}};
  sc.joins_after_kill = {300ms};
  auto out_p = run(sc);
  auto& out = *out_p;
  expect_equal_to_reference(sc, out, 2);
  ASSERT_TRUE(out.killed.has_value());
  ASSERT_EQ(out.late_joins.size(), 1u);
  bool joiner_committed = false;
  for (const auto& c : out.commits) {
    EXPECT_GE(c.world_size, 2) << "step " << c.step << " committed by a group of " << c.world_size
                                         << " (generation " << c.generation << ")";
    if (c.step >= 4) {  // the step the death failed, and every one after it
      EXPECT_GT(c.at, out.late_joins[0]) << "step " << c.step << " committed before the newcomer started";
      EXPECT_GT(c.generation, 0) << "step " << c.step;
    }
    joiner_committed = joiner_committed || c.launch_rank == -1;
  }
  EXPECT_TRUE(joiner_committed) << "the newcomer never trained";
  // One change after the initial one: the failure, formed once the newcomer
  // was there to take the dead member's place (2 -> 2, never 2 -> 1).
  EXPECT_EQ(changes_of(out.history0), (std::vector<std::tuple<el::change_reason, int, int>>{
                                          {el::change_reason::initial, 0, 2}, {el::change_reason::failure, 2, 2}}));
}

// A newcomer whose worker failed twice in a row while joining is held back
// (EBBFLOW_JOIN_COOLDOWN: SEC after the second failure), then admitted; once
// it stayed MAX s, its worker's count is cleared.
TEST(ElasticGroup, JoinerOfAWorkerThatKeptFailingIsHeldBackThenAdmitted) {
  scenario sc;
  sc.steps = 500;
  sc.step_time = 1ms;
  sc.joins = {5};
  sc.join_cooldown = 100ms;
  sc.join_cooldown_max = 200ms;
  sc.store_init = {{"ebbflow/joinfail/joiner", "2 7 12"}};  // generation 7 lost member 12 of worker "joiner"
  auto out_p = run(sc);
  auto& out = *out_p;
  expect_equal_to_reference(sc, out, 4);
  auto store_value = [&](const std::string& k) { return out.store->try_get(k, ef::deadline::after(1s)); };
  EXPECT_EQ(store_value("ebbflow/held/1"), std::optional<std::string>("100 2"));       // its first ticket: held 0.1 s
  EXPECT_FALSE(store_value("ebbflow/held/2").has_value());                             // its second: admitted
  EXPECT_EQ(store_value("ebbflow/joinfail/joiner"), std::optional<std::string>("0"));  // it stayed 0.2 s
  int joins = 0;
  for (auto& h : out.history0) joins += h.reason == el::change_reason::join;
  EXPECT_EQ(joins, 1);
}

TEST(ElasticGroup, BadOptionsAreNamed) {
  auto store = std::make_shared<el::memory_store>();
  auto fabric = std::make_shared<el::loopback_fabric>();
  el::loopback_network net(fabric);
  el::group_options o;
  o.dataset_size = 10;
  try {
    test_group g([store] { return std::make_unique<store_ref>(store_ref{.s = store}); }, net, o, ef::launch_info{});
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("global_batch must be > 0"), std::string::npos);
  }
}

// In-step work stealing through the group: a straggler's tail is taken by
// the others, every sample of every step is processed exactly once (the
// parameters equal the single-process run), also across a join, a failure
// and a leave (claims are keyed by generation and step).
TEST(ElasticGroup, WorkStealingProcessesEverySampleOnceAcrossChanges) {
  scenario sc;
  sc.initial = 4;
  sc.steps = 40;
  sc.steal = true;
  sc.straggler = 2;
  sc.straggle = 100us;
  sc.step_time = 1ms;
  sc.joins = {6};
  sc.kills = {{1, 15}};
  sc.leaves = {{3, 25}};
  sc.adaptive = true;  // models after a few steps: paced stealing from then on
  auto out_p = run_as_scheduled(sc, 3);  // 4 + 1 joined - 1 killed - 1 left
  auto& out = *out_p;
  EXPECT_GT(out.stolen, 0u);
  EXPECT_NE(out.steal_twice_error.find("steal_step called twice in step 3"), std::string::npos)
      << out.steal_twice_error;
  // Each step's counters are erased once it ends, by the heartbeat threads
  // (every 10 ms here, steps take over 1 ms): of the 160-odd made (one per
  // slice and step), only those of about the last heartbeat period's steps
  // are left, and those of a killed member's last period.
  EXPECT_LT(out.store->keys("ebbflow/steal/").size(), 80u);
}

TEST(ElasticGroup, JoinCooldownFromTheEnvironment) {
  const auto with = [](const char* v) {
    ::setenv("EBBFLOW_JOIN_COOLDOWN", v, 1);
    struct unset {
      ~unset() { ::unsetenv("EBBFLOW_JOIN_COOLDOWN"); }
    } guard;
    return el::group_options::from_environment();
  };
  auto o = with("0.25:8");
  EXPECT_EQ(o.join_cooldown, 250ms);
  EXPECT_EQ(o.join_cooldown_max, 8000ms);
  o = with("2");
  EXPECT_EQ(o.join_cooldown, 2000ms);
  EXPECT_EQ(o.join_cooldown_max, 60'000ms);
  EXPECT_EQ(with("0").join_cooldown, 0ms);
  for (const char* bad : {"x", "1:", "-1", "5:2", "1:2:3"}) {
    try {
      with(bad);
      ADD_FAILURE() << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("EBBFLOW_JOIN_COOLDOWN='" + std::string(bad) + "'"), std::string::npos)
          << e.what();
    }
  }
}

TEST(ElasticGroup, PlannerPolicyBalancesHeterogeneousWorkersExactly) {
  scenario sc;
  sc.adaptive = true;
  sc.steps = 40;
  auto out_p = run(sc);
  auto& out = *out_p;
  expect_equal_to_reference(sc, out, 3);
  // t_i(b) = 2 ms + (i+1) ms · b: the optimum of B = 16 gives the fastest the most.
  ASSERT_EQ(out.last_plan.size(), 3u);
  EXPECT_EQ(out.last_plan[0] + out.last_plan[1] + out.last_plan[2], batch);
  EXPECT_GT(out.last_plan[0], out.last_plan[1]);
  EXPECT_GT(out.last_plan[1], out.last_plan[2]);
  // Exact optimum for (c = 1, 2, 3 ms, a = 2 ms, B = 16): (9, 4, 3) → max(11, 10, 11) ms.
  const double t0 = 2 + 1.0 * out.last_plan[0], t1 = 2 + 2.0 * out.last_plan[1], t2 = 2 + 3.0 * out.last_plan[2];
  EXPECT_LE(std::max({t0, t1, t2}), 11.0 + 1e-9);
}
