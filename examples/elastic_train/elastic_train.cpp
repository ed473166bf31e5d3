// SPDX-License-Identifier: Apache-2.0
// Elastic, heterogeneity-aware data-parallel training of a small MLP on the
// digits data set, in plain C++: the ebbflow lines are marked "ebbflow:".
//
//   ebbflow-run -n 4 --add 3 --kill 6:2 -- elastic_train --steps 300 --metrics run.csv
//
// Each worker can be made slower (an emulated slower GPU): --slowdowns
// F0,F1,... makes worker k (EBBFLOW_WORKER_ID) F[k mod count] times slower,
// and EBBFLOW_SLOWDOWN=<factor> sets one worker's factor; with --sample-us U
// every sample costs U µs of emulated device time (× the slowdown), so speeds
// differ in a known way and the planner gives the faster workers more.
// --straggle ID:FROM:TO:FACTOR makes worker ID (EBBFLOW_WORKER_ID) FACTOR
// times slower still during steps [FROM, TO) (a transient straggler: thermal
// throttling, a noisy neighbour). With --steal the workers process their
// slices in chunks and take over the tails of slices whose owners fall
// behind (in-step work stealing through the job's store).
// --reference runs the same global batches in one process (for checks);
// --die-at W:S makes worker W SIGKILL itself in step S (tests).
// --trace DIR writes, per process, the positions of each step's global batch it
// trained on and the steps it committed (tests/elastic/check_trace.py checks
// that every committed step saw each sample exactly once). --help lists the
// flags; those both examples take are in ../common/training_args.hpp.
#include <ebbflow/elastic/group.hpp>
#include <ebbflow/elastic/planner_policy.hpp>
#include <ebbflow/elastic/any_store.hpp>  // the job's store, picked by EBBFLOW_STORE (embedded, TLS, etcd)
#include <ebbflow/elastic/ucx_network.hpp>
#include <ebbflow/plan/sampler.hpp>

#include "../common/digits.hpp"
#include "../common/exit_status.hpp"
#include "../common/join.hpp"
#include "../common/factors.hpp"
#include "../common/mlp.hpp"
#include "../common/training_args.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace ef = ebbflow;
namespace el = ebbflow::elastic;
using clk = std::chrono::steady_clock;

namespace {

// --straggle ID:FROM:TO:FACTOR[:PERIOD]: worker ID runs steps [FROM, TO)
// FACTOR times slower (and again every PERIOD steps).
struct straggle {
  long long id = -1, from = 0, to = 0, period = 0;
  double factor = 1;
  double at(long long worker, std::int64_t step) const {
    if (worker != id || step < from) return 1.0;
    const long long s = period > 0 ? from + (step - from) % period : step;
    return s < to ? factor : 1.0;
  }
};

// The shared flags (training_args.hpp) and this example's own.
struct args : training_args::values {
  std::string metrics;
  std::string checkpoint;  // with checkpoint_at: save there and stop; with resume: load from there
  std::int64_t checkpoint_at = -1;
  bool resume = false;
  bool steal = false;
  bool joiners_start_only = false;  // a newcomer exits where it would join (benchmarks)
  straggle straggler;
  std::string trace;  // directory: one file per process of attempted and committed samples (tests)
};

args parse(int argc, char** argv) {
  args a;
  cli::parser p("elastic_train", "usage: elastic_train [options]   (under ebbflow-run; see the file comment)\n");
  training_args::add(p, a);
  p.value(
       "--straggle", "ID:FROM:TO:FACTOR[:PERIOD]",
       "ID:FROM:TO:FACTOR[:PERIOD] (FACTOR in [1, 1000], PERIOD >= TO - FROM)",
       [&a](const std::string& t) {
         straggle& g = a.straggler;
         char tail = 0;
         const int n =
             std::sscanf(t.c_str(), "%lld:%lld:%lld:%lf:%lld%c", &g.id, &g.from, &g.to, &g.factor, &g.period, &tail);
         return (n == 4 || n == 5) && g.id >= 0 && g.from >= 0 && g.to >= g.from && g.factor >= 1 && g.factor <= 1000 &&
                g.period >= 0 && (g.period == 0 || g.period >= g.to - g.from);
       },
       "worker ID FACTOR times slower in steps [FROM, TO) (and again every\nPERIOD steps)")
      .flag("--steal", a.steal, "in-step work stealing through the job's store")
      .flag("--joiners-start-only", a.joiners_start_only,
            "a newcomer (EBBFLOW_JOIN=1) starts as every worker does (data set,\nmodel) and exits where it would "
            "join (benchmarks: what start-up alone\ncosts the running workers)")
      .text("--metrics", "FILE", a.metrics, "rank 0 appends one CSV line per step")
      .text("--checkpoint", "FILE", a.checkpoint,
            "with --checkpoint-at S: rank 0 saves there after step S, all stop;\nwith --resume: start from it")
      .number("--checkpoint-at", "S", a.checkpoint_at, std::int64_t{0}, training_args::most_steps,
              "the step after which --checkpoint is saved")
      .flag("--resume", a.resume, "start from --checkpoint")
      .text("--trace", "DIR", a.trace, "per-process trace of the samples each step trained on (tests)");
  p.parse(argc, argv);
  return a;
}

void write_params(const std::string& path, const std::vector<float>& p) {
  if (path.empty()) return;
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(p.data()), static_cast<std::streamsize>(p.size() * sizeof(float)));
}

// The checkpoint-restart baseline: the state and position in one file.
struct checkpoint_header {
  std::int64_t step, epoch;
  std::uint64_t cursor, n;
};
void save_checkpoint(const std::string& path, const checkpoint_header& h, const std::vector<float>& p,
                     const std::vector<float>& v) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    f.write(reinterpret_cast<const char*>(&h), sizeof h);
    f.write(reinterpret_cast<const char*>(p.data()), static_cast<std::streamsize>(p.size() * sizeof(float)));
    f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
    f.flush();
  }
  std::rename(tmp.c_str(), path.c_str());
}
checkpoint_header load_checkpoint(const std::string& path, std::vector<float>& p, std::vector<float>& v) {
  std::ifstream f(path, std::ios::binary);
  checkpoint_header h{};
  if (!f.read(reinterpret_cast<char*>(&h), sizeof h) || h.n != p.size() ||
      !f.read(reinterpret_cast<char*>(p.data()), static_cast<std::streamsize>(p.size() * sizeof(float))) ||
      !f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float))))
    throw std::runtime_error("cannot read checkpoint " + path);
  return h;
}

// Emulated device time of one step's fixed part (with `fixed`) and of `b`
// samples (a slower GPU takes longer).
void emulate_device(const args& a, std::size_t b, double slowdown, bool fixed = true) {
  const double us = slowdown * ((fixed ? a.step_us : 0) + a.sample_us * static_cast<double>(b));
  if (us > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(us));
}

// FNV-1a 64 of the bytes of `v`, continuing from `x` (default: the offset basis). For --trace.
std::uint64_t fnv1a(std::span<const float> v, std::uint64_t x = 0xcbf29ce484222325ull) {
  for (const std::byte b : std::as_bytes(v)) x = (x ^ static_cast<std::uint64_t>(b)) * 0x100000001b3ull;
  return x;
}

// Σ p (in double): compared step by step with the reference's, within rounding. For --trace.
double sum_of(std::span<const float> p) {
  double x = 0;
  for (float v : p) x += v;
  return x;
}

int reference(const args& a, const digits::data_set& train, const digits::data_set& test) {
  const mlp::shape sh{64, a.hidden, 10};
  auto p = mlp::init(sh, a.seed);
  std::vector<float> v(p.size(), 0.f), g(p.size());
  std::size_t cursor = 0;
  std::int64_t epoch = 0;
  // --trace: "R step Σparams" after each step, for a step-by-step comparison with an elastic run's C lines.
  std::FILE* trace = a.trace.empty() ? nullptr : std::fopen((a.trace + "/reference.txt").c_str(), "w");
  for (std::int64_t t = 0; t < a.steps; ++t) {
    const ef::plan::epoch_permutation order(train.size(), a.seed, static_cast<std::uint64_t>(epoch));
    const std::size_t B = std::min(a.batch, train.size() - cursor);
    std::fill(g.begin(), g.end(), 0.f);
    for (std::size_t j = 0; j < B; ++j) {
      const auto i = order(cursor + j);
      mlp::accumulate(sh, p, &train.x[i * 64], train.y[i], 1.f / static_cast<float>(B), g);
    }
    mlp::sgd_step(p, v, g, static_cast<float>(a.lr), static_cast<float>(a.momentum));
    if (trace) std::fprintf(trace, "R %lld %.9e\n", static_cast<long long>(t), sum_of(p));
    cursor += B;
    if (cursor >= train.size()) cursor = 0, ++epoch;
  }
  std::printf("reference: %lld steps, test accuracy %.4f\n", static_cast<long long>(a.steps),
              mlp::accuracy(sh, p, test.x, test.y));
  write_params(a.params_out, p);
  if (trace) std::fclose(trace);
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  const args a = parse(argc, argv);
  digits::data_set all = digits::load(), train, test;
  digits::split(all, train, test);
  if (a.reference) return reference(a, train, test);

  const long long worker_id = ef::env::get_int("EBBFLOW_WORKER_ID", -1);
  const double slowdown = ef::env::get_double("EBBFLOW_SLOWDOWN", factors::of(a.slowdowns, worker_id), 1.0, 1000.0);
  std::uint64_t stolen = 0, chunks = 0, claims = 0, steal_steps = 0;
  const mlp::shape sh{64, a.hidden, 10};
  auto params = mlp::init(sh, a.seed);
  std::vector<float> velocity(params.size(), 0.f);
  std::vector<float> grad(params.size() + 1);  // + 1: the weighted loss rides along

  if (a.joiners_start_only && ef::env::get_bool("EBBFLOW_JOIN", false)) return 0;

  // ebbflow: join the job (initial worker or newcomer) with the exact batch planner (../common/join.hpp).
  el::ucx_network net;
  auto g = examples::join_job(net, a.batch, train.size());
  // ebbflow: the training state joiners receive.
  g.register_state("params", std::as_writable_bytes(std::span(params)));
  g.register_state("velocity", std::as_writable_bytes(std::span(velocity)));
  g.on_world_changed([&](const el::world_change& w) {
    std::fprintf(stderr, "world changed (%s): %d -> %d workers at step %lld, ready after %.1f ms\n",
                 std::string(el::name(w.reason)).c_str(), w.old_size, w.new_size, static_cast<long long>(w.step),
                 w.stall_seconds * 1e3);
  });

  if (a.resume) {
    const auto h = load_checkpoint(a.checkpoint, params, velocity);
    g.restore_position(h.step, h.epoch, h.cursor);
  }

  std::FILE* metrics = nullptr;
  // --trace: per attempt "A generation step epoch cursor global_batch first-last ..." (positions in
  // the global batch this process trained on, written before the allreduce, so a killed process
  // leaves its last attempt), and "C generation step H(gradient) H(parameters, velocity) Σparameters"
  // once the allreduce succeeded and the update was applied (H: FNV-1a 64 of the bytes). Checked by
  // tests/elastic/check_trace.py: every committed step's samples exactly once, every member that
  // committed a (generation, step) holds the same sums and the same state after it, and (with
  // --reference --trace DIR beside it) where the parameters first drift from the reference.
  std::FILE* trace = nullptr;
  if (!a.trace.empty()) {
    // The pid, and a random part: in pid namespaces (containers) several workers may be pid 1.
    char id[32];
    std::snprintf(id, sizeof id, "%d-%08x", static_cast<int>(::getpid()), std::random_device{}());
    const std::string path = a.trace + "/trace." + id + ".txt";
    trace = std::fopen(path.c_str(), "w");
    if (!trace) {
      std::cerr << "elastic_train: cannot write " << path << "\n";
      return 2;
    }
  }
  std::string ranges;
  const auto t0 = clk::now();
  auto last = t0;
  const std::int64_t steps = a.steps;
  bool stopped_for_checkpoint = false;
  // ebbflow: the documented loop (docs/snippets/training_loop.cpp): runs on while a join finishes, and
  // marks the job finished once the steps are done.
  while (g.keep_training(steps)) {
    const auto s = g.begin_step();  // ebbflow: my slice of the global batch
    if (!a.metrics.empty() && s.rank == 0 && !metrics) {
      // Appended to: after a failure another member may become rank 0 and go on writing.
      metrics = std::fopen(a.metrics.c_str(), "a");
      if (metrics && std::ftell(metrics) == 0)
        std::fprintf(metrics, "step,time_s,generation,world_size,loss,test_acc,samples_per_s,plan,samples\n");
    }
    const auto c0 = clk::now();
    ranges.clear();
    const ef::plan::epoch_permutation order(train.size(), a.seed, static_cast<std::uint64_t>(s.epoch));
    std::fill(grad.begin(), grad.end(), 0.f);
    float loss = 0;
    // Gradient of the global mean loss: every sample weighs 1 / B_t (= w_i × my mean).
    const auto train_on = [&](std::size_t first, std::size_t last) {  // positions in the global batch
      if (trace) ranges += " " + std::to_string(first) + "-" + std::to_string(last);
      for (std::size_t p = first; p < last; ++p) {
        const auto i = order(s.cursor + p);
        loss += mlp::accumulate(sh, params, &train.x[i * 64], train.y[i], 1.f / static_cast<float>(s.global_batch),
                                std::span(grad).first(params.size()));
      }
    };
    const double slow = slowdown * a.straggler.at(worker_id, s.step);
    std::size_t processed = s.batch;
    if (a.steal) {
      emulate_device(a, 0, slow);  // the step's fixed part
      // ebbflow: my slice in chunks, then the tails of members that fall behind.
      const auto rep = g.steal_step([&](std::size_t first, std::size_t last) {
        train_on(first, last);
        emulate_device(a, last - first, slow, false);
      });
      processed = rep.processed;
      stolen += rep.stolen;
      chunks += rep.chunks;
      claims += rep.store_calls;
      ++steal_steps;
    } else {
      train_on(s.offset, s.offset + s.batch);
      emulate_device(a, s.batch, slow);
    }
    grad.back() = loss / static_cast<float>(s.global_batch);
    const double compute_s = std::chrono::duration<double>(clk::now() - c0).count();
    if (a.die.now(worker_id, s.step)) std::raise(SIGKILL);  // fault injection for tests

    if (trace) {
      std::fprintf(trace, "A %lld %lld %lld %zu %zu%s\n", static_cast<long long>(s.generation),
                   static_cast<long long>(s.step), static_cast<long long>(s.epoch), s.cursor, s.global_batch,
                   ranges.c_str());
      std::fflush(trace);
    }
    // Per allreduce segment (the elements rank k reduces): this member's part before the
    // allreduce, the reduced sums after ("P" and "S" lines): a wrong segment reduction
    // shows as a segment whose members' parts do not add up to the sum.
    const auto segment_sums = [&] {
      std::string out;
      for (int k = 0; k < s.world_size; ++k) {
        const auto [b, e] = ef::comm::allreduce_segment(grad.size(), s.world_size, k);
        const std::span<const float> part(grad.data() + b, e - b);
        char txt[32];
        std::snprintf(txt, sizeof txt, " %.9e", sum_of(part));
        out += txt;
      }
      return out;
    };
    if (trace)
      std::fprintf(trace, "P %lld %lld%s\n", static_cast<long long>(s.generation), static_cast<long long>(s.step),
                   segment_sums().c_str());
    if (!g.allreduce(grad)) continue;  // ebbflow: a member failed; the step is redone
    mlp::sgd_step(params, velocity, std::span(grad).first(params.size()), static_cast<float>(a.lr),
                  static_cast<float>(a.momentum));
    if (trace) {
      std::fprintf(trace, "S %lld %lld%s\n", static_cast<long long>(s.generation), static_cast<long long>(s.step),
                   segment_sums().c_str());
      std::fprintf(trace, "C %lld %lld %016llx %016llx %.9e %.6f\n", static_cast<long long>(s.generation),
                   static_cast<long long>(s.step), static_cast<unsigned long long>(fnv1a(grad)),
                   static_cast<unsigned long long>(fnv1a(velocity, fnv1a(params))), sum_of(params),
                   ebbflow::wall_seconds());
      std::fflush(trace);
    }
    g.end_step(compute_s, processed);  // ebbflow: commit; joins, leaves and re-plans happen here
    const bool stop_for_checkpoint = a.checkpoint_at >= 0 && g.step() == a.checkpoint_at;
    if (stop_for_checkpoint && g.rank() == 0)
      save_checkpoint(a.checkpoint, {g.step(), g.epoch(), g.cursor(), params.size()}, params, velocity);

    if (metrics && s.rank == 0) {
      const auto now = clk::now();
      const double dt = std::chrono::duration<double>(now - last).count();
      last = now;
      const bool eval = s.step % 10 == 0 || g.step() == steps;
      // Stamped before the evaluation: its time falls in the next step's
      // interval, whichever order a compiler evaluates arguments in.
      const double stamp = ebbflow::wall_seconds();
      std::string plan;
      for (auto b : g.plan()) plan += (plan.empty() ? "" : ";") + std::to_string(b);
      std::fprintf(metrics, "%lld,%.6f,%lld,%d,%.6f,%s,%.1f,%s,%zu\n", static_cast<long long>(s.step), stamp,
                   static_cast<long long>(s.generation), s.world_size, grad.back(),
                   eval ? std::to_string(mlp::accuracy(sh, params, test.x, test.y)).c_str() : "",
                   dt > 0 ? static_cast<double>(s.global_batch) / dt : 0.0, plan.c_str(), s.global_batch);
      std::fflush(metrics);
    }
    if (stop_for_checkpoint) {
      stopped_for_checkpoint = true;
      break;
    }
  }
  // A loop that ends before keep_training does marks the job finished itself.
  if (stopped_for_checkpoint) g.finish();
  if (g.active() && g.rank() == 0) {
    std::printf("finished %lld steps in %.2f s: world size %d, test accuracy %.4f\n", static_cast<long long>(g.step()),
                std::chrono::duration<double>(clk::now() - t0).count(), g.size(),
                mlp::accuracy(sh, params, test.x, test.y));
    write_params(a.params_out, params);
  }
  if (metrics) std::fclose(metrics);
  if (trace) std::fclose(trace);
  if (a.steal)
    std::fprintf(stderr, "work stealing: stole %llu samples in %llu steps (%llu chunks, %llu store round trips)\n",
                 static_cast<unsigned long long>(stolen), static_cast<unsigned long long>(steal_steps),
                 static_cast<unsigned long long>(chunks), static_cast<unsigned long long>(claims));
  return 0;
} catch (const std::exception& e) {
  return exit_status::of("elastic_train", e);
}
