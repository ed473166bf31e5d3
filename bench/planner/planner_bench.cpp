// SPDX-License-Identifier: Apache-2.0
// bench/planner: (a) plan time from 8 to 100,000 workers; (b) a simulated
// heterogeneous cluster run side by side under a uniform split, a split
// proportional to measured speed (LB-BSP style), ebbflow's planner, and the
// oracle (exact plan from the true, noise-free models). See
// docs/benchmarks/planner.md for definitions and results.
//
// usage: planner_bench [--json FILE] [--steps N] [--workers N] [--max-n N] [--quick]
#include <ebbflow/plan.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
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
  std::mt19937_64 rng(2024);
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
  double best_sum = 0;  // Σ over steps of Σ_i own best samples/s
  std::vector<std::size_t> prev_prop;
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
  std::printf("%-13s %11s %11s %14s %16s %8s\n", "contestant", "samples/s", "efficiency", "batch_err_%",
              "step_excess_%", "replans");
  double eff[4];
  for (int k = 0; k < 4; ++k) {
    const double sps = cs[k].samples / cs[k].time;
    eff[k] = sps / best;
    std::printf("%-13s %11.1f %10.2f%% %14.3f %16.3f %8zu\n", cs[k].name, sps, 100 * eff[k],
                100 * cs[k].batch_err / steps, 100 * cs[k].step_excess / steps,
                k == 0   ? std::size_t{0}
                : k == 3 ? std::size_t(steps)
                         : cs[k].replans);
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  R"({"bench":"simulator","config":"%s","contestant":"%s","samples_per_s":%.3f,"efficiency":%.5f,)"
                  R"("batch_error":%.6f,"step_excess":%.6f,"steps":%d,"workers":%d})",
                  cfg.name, cs[k].name, sps, eff[k], cs[k].batch_err / steps, cs[k].step_excess / steps, steps,
                  a.workers);
    emit(buf);
  }
  std::printf("ratios (samples/s): ebbflow/uniform %.3f  ebbflow/proportional %.3f  ebbflow/oracle %.4f\n",
              eff[2] / eff[0], eff[2] / eff[1], eff[2] / eff[3]);
}

}  // namespace

int main(int argc, char** argv) {
  args a;
  for (int i = 1; i < argc; ++i) {
    auto next = [&] {
      return i + 1 < argc ? argv[++i] : (std::fprintf(stderr, "missing value\n"), std::exit(2), nullptr);
    };
    if (!std::strcmp(argv[i], "--json"))
      a.json = next();
    else if (!std::strcmp(argv[i], "--steps"))
      a.steps = std::atoi(next());
    else if (!std::strcmp(argv[i], "--workers"))
      a.workers = std::max(3, std::atoi(next()));
    else if (!std::strcmp(argv[i], "--max-n"))
      a.max_n = std::strtoull(next(), nullptr, 10);
    else if (!std::strcmp(argv[i], "--quick"))
      a.quick = true;
    else if (!std::strcmp(argv[i], "--threshold"))
      a.threshold = std::atof(next());
    else if (!std::strcmp(argv[i], "--persist"))
      a.persist = static_cast<unsigned>(std::atoi(next()));
    else {
      std::fprintf(stderr, "usage: %s [--json FILE] [--steps N] [--workers N] [--max-n N] [--quick]\n", argv[0]);
      return 2;
    }
  }
  if (!a.json.empty()) json_out.open(a.json);
  plan_time(a);
  simulate(a, {"clean", 0.005, 0.02, 0.0});
  simulate(a, {"default", 0.005, 0.02, 0.002});
  simulate(a, {"noisy", 0.02, 0.05, 0.01});
  simulate(a, {"fixed-cost-heavy", 0.005, 0.02, 0.002, 0.08});
  return 0;
}
