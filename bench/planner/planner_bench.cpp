// SPDX-License-Identifier: Apache-2.0
// bench/planner: (a) plan time from 8 to 100,000 workers; (b) a simulated
// heterogeneous cluster run side by side under a uniform split, a split
// proportional to measured speed (LB-BSP style), ebbflow's planner, ebbflow's
// planner plus in-step work stealing (plan/work_stealing.hpp, the real protocol
// code driven in simulated time), and the oracle (exact plan from the true,
// noise-free models). See docs/benchmarks/planner.md for definitions and results.
// `planner_bench --help` lists the options.
#include <ebbflow/plan.hpp>
#ifdef EBBFLOW_BENCH_STORE
#include <ebbflow/elastic/tcp_store.hpp>
#endif

#include "../../examples/common/args.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <span>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <random>
#include <queue>
#include <string>
#include <unordered_map>
#include <vector>

namespace pl = ebbflow::plan;
using clk = std::chrono::steady_clock;

namespace {

struct args {
  std::string json;
  int steps = 5000;
  int workers = 16;
  std::size_t max_n = 100000;
  bool quick = false;
  double threshold = pl::replan_options{}.threshold;
  unsigned persist = pl::replan_options{}.persist;
  double claim_us = -1;         // store round trip per claim; < 0: measure the real store on loopback
  double chunk_overhead = 0.1;  // extra cost of each chunk after the first, as a share of a_i
  bool claim_measured = false;
  double batch_key_us = -1;      // extra cost per key of a batched read (add_many) beyond one round trip
  double first_fraction = 0.25;  // work stealing: the owner's first chunk
  unsigned owner_divisor = 2;    // work stealing: later owner chunks ceil(rest / divisor)
  double chunk_share = 0.25;     // work stealing: min chunk so that its overhead <= this share of its compute
  std::uint64_t seed = 2024;     // simulator: the noise realisation (every contestant sees the same one)
  double tail_reserve = 0.03;    // work stealing: share of the slice the owner leaves for small chunks at the end
};

std::ofstream json_out;
void emit(const std::string& line) {
  if (json_out.is_open()) json_out << line << "\n";
}

struct stats {
  double min, median, p99;
};
stats summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[std::min(v.size() - 1, static_cast<std::size_t>(q * (v.size() - 1) + 0.5))]; };
  return {v.front(), at(0.5), at(0.99)};
}

// ------------------------------------------------------------------ baselines
// Largest-remainder rounding of real shares x_i (Σ x_i = B) under caps:
// water-filling redistributes what a capped worker cannot take.
std::vector<std::size_t> split_by_shares(const std::vector<pl::worker_spec>& w, const std::vector<double>& share,
                                         std::size_t B) {
  const std::size_t n = w.size();
  std::vector<std::size_t> b(n, 0);
  std::vector<char> capped(n, 0);
  std::size_t left = B;
  for (int round = 0; round < 64 && left > 0; ++round) {
    double total = 0;
    for (std::size_t i = 0; i < n; ++i)
      if (!capped[i]) total += share[i];
    if (total <= 0) break;
    std::vector<std::pair<double, std::size_t>> frac;
    std::size_t given = 0;
    std::vector<std::size_t> add(n, 0);
    for (std::size_t i = 0; i < n; ++i) {
      if (capped[i]) continue;
      const double x = static_cast<double>(left) * share[i] / total;
      add[i] = static_cast<std::size_t>(x);
      frac.push_back({x - static_cast<double>(add[i]), i});
      given += add[i];
    }
    std::sort(frac.begin(), frac.end(),
              [](auto& p, auto& q) { return p.first > q.first || (p.first == q.first && p.second < q.second); });
    for (std::size_t k = 0; k < left - given && k < frac.size(); ++k) ++add[frac[k].second];
    bool any_cap = false;
    std::size_t used = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (capped[i]) continue;
      const std::size_t room = w[i].max_batch - b[i];
      const std::size_t take = std::min(room, add[i]);
      b[i] += take;
      used += take;
      if (take < add[i] || b[i] == w[i].max_batch) {
        capped[i] = 1;
        any_cap = any_cap || take < add[i];
      }
    }
    left -= used;
    if (!any_cap && left == 0) break;
  }
  return b;
}

std::vector<std::size_t> uniform_split(const std::vector<pl::worker_spec>& w, std::size_t B) {
  return split_by_shares(w, std::vector<double>(w.size(), 1.0), B);
}

// ------------------------------------------------------------------ (a) plan time
std::vector<pl::worker_spec> cluster(std::size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0, 1);
  const double speed[] = {1.0, 2.2, 4.0};
  const std::size_t cap[] = {192, 448, 768};
  std::vector<pl::worker_spec> w(n);
  for (std::size_t i = 0; i < n; ++i) {
    const int k = static_cast<int>(u(rng) * 3) % 3;
    w[i] = {i, 0.002 * (0.5 + u(rng)), 0.0025 / speed[k] * (0.95 + 0.1 * u(rng)), cap[k], 0, 0};
  }
  return w;
}

bool certified_optimal(const pl::batch_plan& p, const std::vector<pl::worker_spec>& w) {
  std::size_t below = 0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    if (w[i].step_time(w[i].min_batch) >= p.step_time) return true;
    std::size_t k = p.batch[i];
    while (k > w[i].min_batch && !(w[i].step_time(k) < p.step_time)) --k;
    below += k;
  }
  return below < p.global_batch;
}

void plan_time(const args& a) {
  std::printf("# (a) plan time: exact solve vs proportional split (LB-BSP), interleaved, microseconds\n");
  std::printf("%8s %9s | %10s %10s %10s | %10s %10s %10s | %8s %6s\n", "workers", "B", "ebb_min", "ebb_med", "ebb_p99",
              "prop_min", "prop_med", "prop_p99", "ebb/prop", "#wrong");
  for (std::size_t n : {8ul, 64ul, 1000ul, 10000ul, 100000ul}) {
    if (n > a.max_n) break;
    std::mt19937_64 rng(n);
    auto w = cluster(n, rng);
    const std::size_t B = n * 200;
    std::vector<double> share(n);
    for (std::size_t i = 0; i < n; ++i) share[i] = 1.0 / w[i].c;
    // Check before timing.
    pl::batch_plan check = pl::solve(w, B);
    int wrong = certified_optimal(check, w) ? 0 : 1;
    const int reps =
        a.quick ? std::max<int>(5, static_cast<int>(20000 / n)) : std::max<int>(15, static_cast<int>(400000 / n));
    std::vector<double> te, tp;
    volatile std::size_t sink = 0;
    for (int r = -3; r < reps; ++r) {  // 3 warm-up rounds
      auto t0 = clk::now();
      pl::batch_plan p = pl::solve(w, B);
      auto t1 = clk::now();
      auto q = split_by_shares(w, share, B);
      auto t2 = clk::now();
      sink = sink + p.batch[0] + q[0];
      if (r >= 0) {
        te.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        tp.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
      }
    }
    stats e = summarize(te), p = summarize(tp);
    std::printf("%8zu %9zu | %10.2f %10.2f %10.2f | %10.2f %10.2f %10.2f | %8.2f %6d\n", n, B, e.min, e.median, e.p99,
                p.min, p.median, p.p99, e.median / p.median, wrong);
    char buf[512];
    std::snprintf(
        buf, sizeof buf,
        R"({"bench":"plan_time","workers":%zu,"batch":%zu,"ebbflow_us":{"min":%.3f,"median":%.3f,"p99":%.3f},)"
        R"("proportional_us":{"min":%.3f,"median":%.3f,"p99":%.3f},"ratio_median":%.4f,"wrong":%d})",
        n, B, e.min, e.median, e.p99, p.min, p.median, p.p99, e.median / p.median, wrong);
    emit(buf);
  }
}

// ------------------------------------------------------------------ (c) stealing
// One store round trip (an `add` on the real Boost.Asio store over loopback TCP):
// what every claim and every peek of work stealing costs. Median of 2000.
struct rtt_stats {
  double median_us = 0, p99_us = 0;
  double batch15_us = 0;  // median of add_many over 15 keys (what a thief of 16 workers reads at once)
  bool measured = false;
};
rtt_stats measure_store_rtt() {
  rtt_stats r;
#ifdef EBBFLOW_BENCH_STORE
  namespace el = ebbflow::elastic;
  el::server_options o;
  o.token = "planner-bench";
  el::store_server srv(o);
  el::store_client c("127.0.0.1", srv.port(), o.token);
  std::vector<double> t;
  for (int k = -200; k < 2000; ++k) {
    const auto t0 = clk::now();
    (void)c.add("bench/claim", k % 2 ? std::int64_t{1} << 32 : 1, ebbflow::deadline::after(std::chrono::seconds(10)));
    const double us = std::chrono::duration<double, std::micro>(clk::now() - t0).count();
    if (k >= 0) t.push_back(us);
  }
  const stats s = summarize(t);
  std::vector<std::string> keys;
  for (int k = 0; k < 15; ++k) keys.push_back("bench/slice/" + std::to_string(k));
  const std::vector<std::int64_t> zeros(keys.size(), 0);
  std::vector<double> tb;
  for (int k = -50; k < 1000; ++k) {
    const auto t0 = clk::now();
    (void)c.add_many(keys, zeros, ebbflow::deadline::after(std::chrono::seconds(10)));
    const double us = std::chrono::duration<double, std::micro>(clk::now() - t0).count();
    if (k >= 0) tb.push_back(us);
  }
  r = {s.median, s.p99, summarize(tb).median, true};
#endif
  return r;
}

// An in-process counter store for the simulator: the work_stealer's protocol
// code runs unchanged; time is simulated (each store call costs claim_s).
struct sim_store {
  std::unordered_map<std::string, std::int64_t> kv;
  std::int64_t add(const std::string& k, std::int64_t d, ebbflow::deadline) { return kv[k] += d; }
  std::vector<std::int64_t> add_many(std::span<const std::string> keys, std::span<const std::int64_t> deltas,
                                     ebbflow::deadline) {
    std::vector<std::int64_t> out;
    for (std::size_t i = 0; i < keys.size(); ++i) out.push_back(kv[keys[i]] += deltas[i]);
    return out;
  }
};
static_assert(pl::batch_counter_store<sim_store>);

struct steal_params {
  double claim_s;             // seconds per store round trip (claim or peek), not overlapped with compute
  double batch_key_s;         // a batched read of k slices costs claim_s + (k - 1) * batch_key_s
  double chunk_overhead;      // h: every chunk after a worker's first costs h·a_i (its own, true, slowed a_i)
  double chunk_share = 0.25;  // min_chunk_i: smallest chunk whose overhead is <= 25 % of its compute (estimated)
  double first_fraction = 0.25;
  std::uint32_t owner_divisor = 2;
  double tail_reserve = 0.03;
};

struct steal_outcome {
  double step_time = 0;
  double claims = 0;  // store calls (claims + peeks), all workers
  double chunks = 0;  // non-empty chunks processed, all workers
  double stolen = 0;  // items processed by a thief
};

// One synchronous step with work stealing, event-driven in simulated time.
// Worker i: true fixed time a_i·jit_i once, then chunks of true per-item time
// c_i·jit_i (a transient straggler is slower for the whole step), each chunk
// after its first plus h·a_i·jit_i, each store call claim_s. The decisions are
// the library's own (`plan::steal_policy`, as `run_stealing_step` makes them on
// a real clock): they use only the plan, the estimated models every rank holds,
// the worker's own measured speed in this step, the time since the step
// started, and the counters it reads (progress). The step ends when the last
// worker stops.
steal_outcome steal_step(const steal_params& sp, const std::vector<pl::worker_spec>& truth,
                         const std::vector<double>& jit, const std::vector<pl::worker_spec>& est,
                         const pl::batch_plan& plan, std::uint64_t step) {
  const std::size_t n = truth.size();
  sim_store store;
  std::vector<pl::work_stealer<sim_store>> w;
  std::vector<pl::steal_policy> pol;
  w.reserve(n);
  pol.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    pl::steal_options o;
    o.first_fraction = sp.first_fraction;
    o.owner_divisor = sp.owner_divisor;
    o.tail_reserve = sp.tail_reserve;
    o.min_chunk = pl::recommended_min_chunk(sp.chunk_overhead * est[i].a, est[i].c, sp.chunk_share);
    w.emplace_back(store, "sim", pl::step_id{0, step}, plan, i, o);
    pol.emplace_back(est, plan, i, sp.claim_s, sp.chunk_overhead * est[i].a);
  }
  enum class phase { own, scan, claim, done };
  struct state {
    phase ph = phase::own;
    bool first_chunk = true;
    pl::steal_policy::choice pick;
    double end = 0;
  };
  std::vector<state> st(n);
  steal_outcome out;
  using ev = std::pair<double, std::size_t>;
  std::priority_queue<ev, std::vector<ev>, std::greater<>> q;
  for (std::size_t i = 0; i < n; ++i) q.push({truth[i].a * jit[i], i});  // fixed part first
  auto chunk_cost = [&](std::size_t i, std::uint64_t items) {
    double t = static_cast<double>(items) * truth[i].c * jit[i];
    if (!st[i].first_chunk) t += sp.chunk_overhead * truth[i].a * jit[i];
    st[i].first_chunk = false;
    ++out.chunks;
    return t;
  };
  while (!q.empty()) {
    const auto [t, i] = q.top();
    q.pop();
    state& s = st[i];
    if (s.ph == phase::own) {
      const pl::chunk c = w[i].claim_own(pol[i].own_cap(t));
      ++out.claims;
      if (!c.empty()) {
        const double busy = chunk_cost(i, c.size());
        pol[i].observe_own(c.size(), busy);  // what its clock sees: compute plus the chunk's overhead
        q.push({t + sp.claim_s + busy, i});
      } else {
        s.ph = phase::scan;
        q.push({t + sp.claim_s, i});
      }
    } else if (s.ph == phase::scan) {
      // Read the other slices not yet seen exhausted in one batch (`steal_policy::scan`).
      std::size_t keys = 0;
      for (std::size_t r = 0; r < n; ++r) keys += r != i && !w[i].last_seen(r).exhausted();
      const std::uint64_t calls0 = w[i].store_calls();
      s.pick = pol[i].scan(w[i], t);
      const auto trips = static_cast<double>(w[i].store_calls() - calls0);
      out.claims += trips;
      const double t_scan = t + trips * sp.claim_s + (keys > 0 ? static_cast<double>(keys - 1) : 0.0) * sp.batch_key_s;
      if (s.pick.items == 0) {  // nothing worth taking: this worker is done with the step
        s.ph = phase::done;
        s.end = t_scan;
        continue;
      }
      s.ph = phase::claim;
      q.push({t_scan, i});  // the claim reaches the store after the peeks
    } else if (s.ph == phase::claim) {
      const pl::chunk c = w[i].steal_from(s.pick.victim, s.pick.items);
      ++out.claims;
      s.ph = phase::scan;
      if (!c.empty()) {
        out.stolen += static_cast<double>(c.size());
        q.push({t + sp.claim_s + chunk_cost(i, c.size()), i});
      } else {
        q.push({t + sp.claim_s, i});
      }
    }
  }
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < n; ++i) {
    total += w[i].processed();
    out.step_time = std::max(out.step_time, st[i].end);
  }
  if (total != plan.global_batch) {
    std::fprintf(stderr, "work stealing lost or duplicated items: %llu of %zu\n",
                 static_cast<unsigned long long>(total), plan.global_batch);
    std::exit(1);
  }
  return out;
}

// ------------------------------------------------------------------ (b) simulator
struct sim_config {
  const char* name;
  double jitter;           // true per-step compute variation (relative sd)
  double meas_noise;       // timer / host noise on what the cost model sees (relative sd)
  double straggle_p;       // probability per worker-step of a transient straggler
  double fixed_s = 0.002;  // mean fixed seconds per step a_i
};

struct gpu {
  std::uint64_t id;
  double a, c;  // true model (seconds, seconds per sample)
  std::size_t cap;
  const char* kind;
};

struct contestant {
  const char* name;
  double time = 0;  // Σ actual step time
  double samples = 0;
  double batch_err = 0;    // Σ over steps of Σ|b − b*| / B
  double step_excess = 0;  // Σ over steps of T_true(plan) / T* − 1
  std::size_t replans = 0;
};

void simulate(const args& a, const sim_config& cfg) {
  std::mt19937_64 rng(a.seed);
  std::uniform_real_distribution<double> u(0, 1);
  std::normal_distribution<double> z(0, 1);
  const double speed[] = {1.0, 2.2, 4.0};  // V100 : A100 : H100
  const char* kinds[] = {"V100", "A100", "H100"};
  const std::size_t caps[] = {192, 512, 768};
  std::vector<gpu> all;
  std::uint64_t next_id = 0;
  auto new_gpu = [&](int k) {
    gpu g{next_id++, cfg.fixed_s * (0.8 + 0.4 * u(rng)), 0.0025 / speed[k] * (0.95 + 0.1 * u(rng)), caps[k], kinds[k]};
    return g;
  };
  for (int i = 0; i < a.workers; ++i) all.push_back(new_gpu(i % 3));
  all[1].cap = 256;  // an A100 40GB variant: its cap binds
  const std::size_t B = static_cast<std::size_t>(a.workers) * 256;
  const int steps = a.quick ? std::min(a.steps, 1500) : a.steps;
  const int slow_from = steps * 2 / 5, slow_to = steps * 2 / 5 + steps / 8;  // one H100 at 1.8x for a while
  const int leave_at = steps * 13 / 20, join_at = steps * 3 / 4;
  const std::uint64_t slow_id = 2;

  std::vector<gpu> members = all;
  // ebbflow state: a probe-seeded cost model per worker.
  std::vector<pl::cost_model> models;
  auto probe = [&](const gpu& g) {
    std::vector<pl::timing_sample> s;
    for (std::size_t b : {32ul, 128ul, 32ul, 128ul}) s.push_back({b, (g.a + g.c * b) * (1 + cfg.meas_noise * z(rng))});
    return pl::cost_model::from_probe(s);
  };
  for (auto& g : members) models.push_back(probe(g));
  pl::replanner ebb_rp({.threshold = a.threshold, .persist = a.persist});
  // LB-BSP state: exponentially averaged measured throughput per worker.
  std::vector<double> thr;
  for (auto& g : members) thr.push_back(1.0 / (g.a / 128 + g.c) * (1 + cfg.meas_noise * z(rng)));

  contestant cs[4] = {{"uniform"}, {"proportional"}, {"ebbflow"}, {"oracle"}};
  // ebbflow's plan plus in-step work stealing: the stated per-chunk overhead,
  // and the pessimistic setting where every extra chunk pays the full a_i.
  const steal_params sp[2] = {{a.claim_us * 1e-6, a.batch_key_us * 1e-6, a.chunk_overhead, a.chunk_share,
                               a.first_fraction, a.owner_divisor, a.tail_reserve},
                              {a.claim_us * 1e-6, a.batch_key_us * 1e-6, 1.0, a.chunk_share, a.first_fraction,
                               a.owner_divisor, a.tail_reserve}};
  contestant cst[2] = {{"ebb+steal"}, {"ebb+steal/h1"}};
  // Fluid bound: perfect, free, instantaneous in-step balancing (every worker
  // busy until the same instant, items divisible, no claim or chunk cost) on
  // the true, slowed speeds of the step. No in-step scheme can beat it.
  contestant fluid{"fluid-bound"};
  steal_outcome sst[2];
  double best_sum = 0;  // Σ over steps of Σ_i own best samples/s
  std::vector<std::size_t> prev_prop;
  // Where ebb+steal loses against the fluid bound: steps with a transient straggler or without.
  double gap[2] = {0, 0}, gap_steps[2] = {0, 0}, gap_fluid[2] = {0, 0};
  for (int s = 0; s < steps; ++s) {
    if (s == leave_at) {  // graceful leave of worker 0 (a V100)
      members.erase(members.begin());
      models.erase(models.begin());
      thr.erase(thr.begin());
    }
    if (s == join_at) {  // a new H100 joins
      gpu g = new_gpu(2);
      members.push_back(g);
      models.push_back(probe(g));
      thr.push_back(1.0 / (g.a / 128 + g.c) * (1 + cfg.meas_noise * z(rng)));
    }
    const std::size_t n = members.size();
    std::vector<pl::worker_spec> truth(n);
    for (std::size_t i = 0; i < n; ++i) {
      const double f = (members[i].id == slow_id && s >= slow_from && s < slow_to) ? 1.8 : 1.0;
      truth[i] = {members[i].id, f * members[i].a, f * members[i].c, members[i].cap, 0, 0};
      best_sum += static_cast<double>(truth[i].max_batch) / truth[i].step_time(truth[i].max_batch);
    }
    // The same noise realisation for every contestant.
    std::vector<double> jit(n), meas(n);
    for (std::size_t i = 0; i < n; ++i) {
      jit[i] = 1 + cfg.jitter * z(rng);
      if (u(rng) < cfg.straggle_p) jit[i] *= 2 + 2 * u(rng);
      meas[i] = 1 + cfg.meas_noise * z(rng);
    }
    const pl::batch_plan oracle = pl::solve(truth, B);
    double fluid_s = 0;
    std::vector<pl::worker_spec> est(n);
    for (std::size_t i = 0; i < n; ++i) est[i] = models[i].spec(members[i].id, members[i].cap);
    const std::uint64_t v_before = ebb_rp.current().version;
    const pl::batch_plan ebb = ebb_rp.update(est, B);
    if (ebb.version != v_before) ++cs[2].replans;
    std::vector<double> share(n);
    for (std::size_t i = 0; i < n; ++i) share[i] = thr[i];
    const std::vector<std::size_t> prop = split_by_shares(truth, share, B);
    if (prop != prev_prop) ++cs[1].replans;
    prev_prop = prop;
    const std::vector<std::vector<std::size_t>> splits = {uniform_split(truth, B), prop, ebb.batch, oracle.batch};
    for (int k = 0; k < 4; ++k) {
      const auto& b = splits[k];
      double t_actual = 0, t_true = 0, err = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const double ti = truth[i].step_time(b[i]);
        t_true = std::max(t_true, ti);
        t_actual = std::max(t_actual, ti * jit[i]);
        err += std::abs(static_cast<double>(b[i]) - static_cast<double>(oracle.batch[i]));
      }
      cs[k].time += t_actual;
      cs[k].samples += static_cast<double>(B);
      cs[k].batch_err += err / static_cast<double>(B);
      cs[k].step_excess += t_true / oracle.step_time - 1;
    }
    {
      auto done_by = [&](double T) {
        double items = 0;
        for (std::size_t i = 0; i < n; ++i) items += std::max(0.0, (T - truth[i].a * jit[i]) / (truth[i].c * jit[i]));
        return items;
      };
      double lo = 0, hi = 1;
      while (done_by(hi) < static_cast<double>(B)) hi *= 2;
      for (int it = 0; it < 100; ++it) (done_by((lo + hi) / 2) < static_cast<double>(B) ? lo : hi) = (lo + hi) / 2;
      fluid.time += hi;
      fluid.samples += static_cast<double>(B);
      fluid_s = hi;
    }
    for (int k = 0; k < 2; ++k) {
      const steal_outcome o = steal_step(sp[k], truth, jit, est, ebb, static_cast<std::uint64_t>(s));
      cst[k].time += o.step_time;
      if (k == 0) {
        const int cls = *std::max_element(jit.begin(), jit.end()) > 1.5 ? 1 : 0;  // stragglers are 2-4x
        gap[cls] += o.step_time - fluid_s;
        gap_steps[cls] += 1;
        gap_fluid[cls] += fluid_s;
      }
      cst[k].samples += static_cast<double>(B);
      double err = 0, t_true = 0;
      for (std::size_t i = 0; i < n; ++i) {
        err += std::abs(static_cast<double>(ebb.batch[i]) - static_cast<double>(oracle.batch[i]));
        t_true = std::max(t_true, truth[i].step_time(ebb.batch[i]));
      }
      cst[k].batch_err += err / static_cast<double>(B);  // of the plan it starts from
      cst[k].step_excess += t_true / oracle.step_time - 1;
      sst[k].claims += o.claims / static_cast<double>(n);
      sst[k].chunks += o.chunks / static_cast<double>(n);
      sst[k].stolen += o.stolen / static_cast<double>(B);
    }
    // Feedback: each worker's own compute time as measured.
    for (std::size_t i = 0; i < n; ++i) {
      const double seen = truth[i].step_time(ebb.batch[i]) * jit[i] * meas[i];
      models[i].observe(ebb.batch[i], seen);
      const double seen_p = truth[i].step_time(prop[i]) * jit[i] * meas[i];
      thr[i] = 0.9 * thr[i] + 0.1 * static_cast<double>(prop[i]) / seen_p;
    }
  }
  const double best = best_sum / steps;
  std::printf(
      "\n# (b) simulated cluster '%s': %d workers (V100:A100:H100 speed 1:2.2:4), B=%zu, %d steps,\n"
      "#     a_i ~ %.0f ms, jitter %.1f%%, measurement noise %.1f%%, stragglers p=%.2f%% x(2..4), one H100 1.8x slower "
      "for "
      "steps [%d,%d), leave at %d, join at %d\n",
      cfg.name, a.workers, B, steps, 1000 * cfg.fixed_s, 100 * cfg.jitter, 100 * cfg.meas_noise, 100 * cfg.straggle_p,
      slow_from, slow_to, leave_at, join_at);
  std::printf(
      "#     stealing: store round trip %.1f us per claim or batched read, +%.2f us per extra key in a batch (%s), "
      "chunk overhead h = %.2f x a_i (ebb+steal) and 1.0 x a_i (ebb+steal/h1)\n",
      a.claim_us, a.batch_key_us, a.claim_measured ? "measured on loopback" : "given", a.chunk_overhead);
  std::printf(
      "#     stealing policy: first chunk %.2f of the slice, then all but a %.0f %% tail reserve, then ceil(rest/%u), "
      "paced against the planned step time; min chunk: overhead <= %.0f %% of its compute; seed %llu\n",
      a.first_fraction, 100 * a.tail_reserve, a.owner_divisor, 100 * a.chunk_share,
      static_cast<unsigned long long>(a.seed));
  std::printf("%-13s %11s %11s %14s %16s %8s %9s %9s %9s\n", "contestant", "samples/s", "efficiency", "batch_err_%",
              "step_excess_%", "replans", "calls/w", "chunks/w", "stolen_%");
  for (int k = 0; k < 2; ++k)
    if (gap_steps[k] > 0)
      std::printf("#     ebb+steal vs fluid bound, steps %s a straggler (%.0f): %.3f ms longer on average (%.2f %%)\n",
                  k ? "with" : "without", gap_steps[k], 1e3 * gap[k] / gap_steps[k], 100 * gap[k] / gap_fluid[k]);
  auto row = [&](const contestant& c, std::size_t replans, const steal_outcome* so) {
    const double sps = c.samples / c.time;
    const double e = sps / best;
    if (so)
      std::printf("%-13s %11.1f %10.2f%% %14.3f %16.3f %8zu %9.2f %9.2f %9.3f\n", c.name, sps, 100 * e,
                  100 * c.batch_err / steps, 100 * c.step_excess / steps, replans, so->claims / steps,
                  so->chunks / steps, 100 * so->stolen / steps);
    else
      std::printf("%-13s %11.1f %10.2f%% %14.3f %16.3f %8zu %9s %9s %9s\n", c.name, sps, 100 * e,
                  100 * c.batch_err / steps, 100 * c.step_excess / steps, replans, "-", "-", "-");
    char buf[640];
    std::snprintf(buf, sizeof buf,
                  R"({"bench":"simulator","config":"%s","contestant":"%s","samples_per_s":%.3f,"efficiency":%.5f,)"
                  R"("batch_error":%.6f,"step_excess":%.6f,"steps":%d,"workers":%d,"store_calls_per_worker":%.3f,)"
                  R"("chunks_per_worker":%.3f,"stolen_share":%.6f,"claim_us":%.3f,"chunk_overhead":%.3f})",
                  cfg.name, c.name, sps, e, c.batch_err / steps, c.step_excess / steps, steps, a.workers,
                  so ? so->claims / steps : 0.0, so ? so->chunks / steps : 0.0, so ? so->stolen / steps : 0.0,
                  so ? a.claim_us : 0.0, so ? (so == &sst[0] ? a.chunk_overhead : 1.0) : 0.0);
    emit(buf);
    return e;
  };
  const double e_uni = row(cs[0], 0, nullptr);
  const double e_prop = row(cs[1], cs[1].replans, nullptr);
  const double e_ebb = row(cs[2], cs[2].replans, nullptr);
  const double e_st = row(cst[0], cs[2].replans, &sst[0]);
  const double e_st1 = row(cst[1], cs[2].replans, &sst[1]);
  const double e_or = row(cs[3], std::size_t(steps), nullptr);
  (void)row(fluid, 0, nullptr);
  std::printf("ratios (samples/s): ebbflow/uniform %.3f  ebbflow/proportional %.3f  ebbflow/oracle %.4f\n",
              e_ebb / e_uni, e_ebb / e_prop, e_ebb / e_or);
  std::printf(
      "ratios (samples/s): ebb+steal/uniform %.3f  ebb+steal/proportional %.3f  ebb+steal/oracle %.4f  "
      "(h1: %.3f %.3f %.4f)\n",
      e_st / e_uni, e_st / e_prop, e_st / e_or, e_st1 / e_uni, e_st1 / e_prop, e_st1 / e_or);
  std::printf("goal efficiency >= 97 %%: ebb+steal %s (%.2f %%), ebb+steal/h1 %s (%.2f %%)\n",
              e_st >= 0.97 ? "MET" : "not met", 100 * e_st, e_st1 >= 0.97 ? "MET" : "not met", 100 * e_st1);
}

}  // namespace

int main(int argc, char** argv) {
  args a;
  cli::parser p("planner_bench", "usage: planner_bench [options]   (see the file comment)\n");
  p.text("--json", "FILE", a.json, "also write the results there, one JSON object a line")
      .number("--steps", "N", a.steps, 1, 1 << 30, "simulated steps (default 5000; --quick: at most 1500)")
      .number("--workers", "N", a.workers, 3, 1 << 20, "simulated workers (default 16)")
      .number("--max-n", "N", a.max_n, std::size_t{1}, std::size_t{1} << 30,
              "plan time: up to N workers (default 100000)")
      .flag("--quick", a.quick, "fewer repetitions and steps (the CI smoke run)")
      .number("--threshold", "X", a.threshold, 0.0, 1e6, "re-plan threshold (default: replan_options)")
      .number("--persist", "N", a.persist, 0u, 1u << 20, "re-plan persistence in steps (default: replan_options)")
      .number("--claim-us", "X", a.claim_us, -1.0, 1e6,
              "store round trip per work-stealing claim (default -1: measured on loopback)")
      .number("--batch-key-us", "X", a.batch_key_us, -1.0, 1e6,
              "cost per key of a batched read beyond one round trip (default -1: measured)")
      .number("--chunk-overhead", "H", a.chunk_overhead, 0.0, 1e3,
              "cost of each chunk after the first, as a share of a_i (default 0.1)")
      .number("--first-fraction", "F", a.first_fraction, 0.0, 1.0, "work stealing: the owner's first chunk (default 0.25)")
      .number("--owner-divisor", "K", a.owner_divisor, 1u, 1u << 20,
              "work stealing: later owner chunks ceil(rest / K) (default 2)")
      .number("--chunk-share", "S", a.chunk_share, 0.0, 1.0,
              "work stealing: a chunk's overhead at most this share of its compute (default 0.25)")
      .number("--tail-reserve", "R", a.tail_reserve, 0.0, 1.0,
              "work stealing: share of the slice the owner leaves for small chunks (default 0.03)")
      .number("--seed", "N", a.seed, std::uint64_t{0}, ~std::uint64_t{0}, "the simulated noise (default 2024)");
  p.parse(argc, argv);
  if (!a.json.empty()) json_out.open(a.json);
  plan_time(a);
  if (a.claim_us < 0 || a.batch_key_us < 0) {
    const rtt_stats r = measure_store_rtt();
    const double per_key = r.measured ? std::max(0.0, (r.batch15_us - r.median_us) / 14) : 0;
    if (!r.measured) {
      // Built without the asio component: the medians measured by this
      // benchmark with the store on the reference machine (docs/benchmarks/planner.md).
      if (a.claim_us < 0) a.claim_us = 55.0;
      if (a.batch_key_us < 0) a.batch_key_us = 5.0;
      std::printf(
          "\n# claim cost: no asio store in this build: round trip %.1f us, +%.1f us per extra key in a batch "
          "(measured constants)\n",
          a.claim_us, a.batch_key_us);
    } else {
      if (a.claim_us < 0) a.claim_us = r.median_us, a.claim_measured = true;
      if (a.batch_key_us < 0) a.batch_key_us = per_key;
      std::printf(
          "\n# claim cost: store add round trip on loopback TCP (Boost.Asio store, 2000 calls): median %.1f us, p99 "
          "%.1f us; add_many of 15 keys (1000 calls): median %.1f us = round trip + 14 x %.2f us\n",
          r.median_us, r.p99_us, r.batch15_us, per_key);
      char buf[240];
      std::snprintf(buf, sizeof buf, R"({"bench":"store_rtt","median_us":%.3f,"p99_us":%.3f,"add_many15_us":%.3f})",
                    r.median_us, r.p99_us, r.batch15_us);
      emit(buf);
    }
  }
  simulate(a, {"clean", 0.005, 0.02, 0.0});
  simulate(a, {"default", 0.005, 0.02, 0.002});
  simulate(a, {"noisy", 0.02, 0.05, 0.01});
  simulate(a, {"fixed-cost-heavy", 0.005, 0.02, 0.002, 0.08});
  return 0;
}
