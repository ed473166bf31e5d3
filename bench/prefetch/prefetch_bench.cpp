// SPDX-License-Identifier: Apache-2.0
// Step time of a training loop fed three ways, side by side in one run
// (interleaved A B C A B C ..., warm-up steps untimed, data checked every step):
//   sync    load the batch, copy it to the devices, compute (no overlap)
//   double  one background thread loads the next batch into one of two
//           pageable buffers; the consumer copies to the devices, then computes
//   ebbflow prefetch::prefetcher: pinned staging, `--loaders` loader threads,
//           a copy thread into the device buffers, ring depth `--depth`
// Compute of T_c per step and loading of T_l per batch (T_l = cost of loading
// the batch on one thread), for T_l / T_c in --ratios.
//
// Compute models (--compute):
//   sleep (default)  the step waits T_c without using a CPU: a GPU computing
//                    while the host is free, the realistic case for a GPU trainer
//   spin             a calibrated busy loop of T_c on one core: a CPU trainer,
//                    which competes with the loaders for the 2 cores here
// Loading model: each sample's bytes are written (real memory traffic into the
// destination) and the rest of its cost is waited out (I/O latency), so
// T_l = batch * per-sample cost on one thread.
//
// Reported per contestant: step time min / median / p99, median step ÷
// max(T_c, T_l) with the measured T_c and T_l, the share of loading hidden
// (1 - max(0, step - T_c) / T_l), and ebbflow's median over each baseline's.
#include <ebbflow/prefetch/prefetcher.hpp>

#include "../../examples/common/args.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <sys/prctl.h>

namespace pf = ebbflow::prefetch;
using clk = std::chrono::steady_clock;
using secs = std::chrono::duration<double>;

namespace {
struct config {
  double tc_ms = 20;
  std::vector<double> ratios = {0.25, 0.5, 1, 2};
  std::size_t batch = 32, sample_bytes = 64 << 10, devices = 2;
  int steps = 40, warmup = 3, reps = 3;
  unsigned loaders = 4;
  std::size_t depth = 3;
  bool spin = false;
  std::string json;
};

// ------------------------------------------------------------ work models
void fill_sample(std::size_t index, std::span<std::byte> dst) {
  auto* w = reinterpret_cast<std::uint64_t*>(dst.data());
  const std::size_t n = dst.size() / 8;
  for (std::size_t k = 0; k < n; ++k) w[k] = index * 0x9e3779b97f4a7c15ull + k;
}
bool sample_ok(std::size_t index, std::span<const std::byte> s) {
  std::uint64_t first, last;
  std::memcpy(&first, s.data(), 8);
  std::memcpy(&last, s.data() + s.size() - 8, 8);
  return first == index * 0x9e3779b97f4a7c15ull && last == index * 0x9e3779b97f4a7c15ull + s.size() / 8 - 1;
}

struct loader_model {
  std::chrono::nanoseconds per_sample;
  void operator()(std::size_t index, std::span<std::byte> dst) const {
    const auto until = clk::now() + per_sample;
    fill_sample(index, dst);
    std::this_thread::sleep_until(until);
  }
};

// Busy loop calibrated to iterations per second before the runs.
volatile std::uint64_t spin_sink;
std::uint64_t spin_iters(std::uint64_t n) {
  std::uint64_t x = 88172645463325252ull;
  for (std::uint64_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
  }
  return x;
}
double calibrate_spin() {
  std::vector<double> r;
  for (int k = 0; k < 5; ++k) {
    const std::uint64_t n = 2'000'000;
    const auto t0 = clk::now();
    spin_sink = spin_iters(n);
    r.push_back(static_cast<double>(n) / secs(clk::now() - t0).count());
  }
  std::sort(r.begin(), r.end());
  return r[2];
}
struct compute_model {
  bool spin;
  double tc_s;
  double iters_per_s;
  void operator()() const {
    if (spin)
      spin_sink = spin_iters(static_cast<std::uint64_t>(tc_s * iters_per_s));
    else
      std::this_thread::sleep_for(secs(tc_s));
  }
};

// "Device" memory: one buffer per local device, the same for every contestant.
struct devices_mem {
  std::vector<std::vector<std::byte>> buf;
  devices_mem(std::size_t devices, std::size_t bytes) : buf(devices, std::vector<std::byte>(bytes)) {}
};
std::vector<std::size_t> even_split(std::size_t b, std::size_t devices) {
  std::vector<std::size_t> s(devices);
  for (std::size_t d = 0; d < devices; ++d) s[d] = b / devices + (d < b % devices ? 1 : 0);
  return s;
}
// Checks every sample's first and last word of a device sub-batch.
std::size_t wrong_in(std::span<const std::byte> bytes, std::size_t first_index, std::size_t n, std::size_t sb) {
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) wrong += !sample_ok(first_index + i, bytes.subspan(i * sb, sb));
  return wrong;
}

struct run_result {
  std::vector<double> step_s;     // timed steps
  std::vector<double> load_s;     // sync only: measured load time per batch
  std::vector<double> compute_s;  // sync only: measured compute time per step
  std::size_t wrong = 0;
};

// ------------------------------------------------------------ contestants
run_result run_sync(const config& c, const loader_model& load, const compute_model& compute) {
  run_result r;
  std::vector<std::byte> host(c.batch * c.sample_bytes);
  devices_mem dev(c.devices, c.batch * c.sample_bytes);
  const auto split = even_split(c.batch, c.devices);
  auto last = clk::now();
  for (int s = 0; s < c.warmup + c.steps; ++s) {
    const std::size_t base = static_cast<std::size_t>(s) * c.batch;
    const auto t0 = clk::now();
    for (std::size_t i = 0; i < c.batch; ++i)
      load(base + i, std::span(host).subspan(i * c.sample_bytes, c.sample_bytes));
    const auto t1 = clk::now();
    std::size_t off = 0;
    for (std::size_t d = 0; d < c.devices; ++d) {
      std::memcpy(dev.buf[d].data(), host.data() + off * c.sample_bytes, split[d] * c.sample_bytes);
      r.wrong += wrong_in(dev.buf[d], base + off, split[d], c.sample_bytes);
      off += split[d];
    }
    const auto t2 = clk::now();
    compute();
    const auto now = clk::now();
    if (s >= c.warmup) {
      r.step_s.push_back(secs(now - last).count());
      r.load_s.push_back(secs(t1 - t0).count());
      r.compute_s.push_back(secs(now - t2).count());
    }
    last = now;
  }
  return r;
}

run_result run_double(const config& c, const loader_model& load, const compute_model& compute) {
  run_result r;
  const std::size_t bytes = c.batch * c.sample_bytes;
  std::vector<std::byte> bufs[2] = {std::vector<std::byte>(bytes), std::vector<std::byte>(bytes)};
  bool full[2] = {false, false};
  std::mutex m;
  std::condition_variable cv;
  const int total = c.warmup + c.steps;
  std::jthread loader([&](std::stop_token tok) {
    for (int s = 0; s < total; ++s) {
      const int k = s % 2;
      {
        std::unique_lock lk(m);
        cv.wait(lk, [&] { return !full[k] || tok.stop_requested(); });
        if (tok.stop_requested()) return;
      }
      const std::size_t base = static_cast<std::size_t>(s) * c.batch;
      for (std::size_t i = 0; i < c.batch; ++i)
        load(base + i, std::span(bufs[k]).subspan(i * c.sample_bytes, c.sample_bytes));
      {
        std::lock_guard lk(m);
        full[k] = true;
      }
      cv.notify_all();
    }
  });
  devices_mem dev(c.devices, bytes);
  const auto split = even_split(c.batch, c.devices);
  auto last = clk::now();
  for (int s = 0; s < total; ++s) {
    const int k = s % 2;
    {
      std::unique_lock lk(m);
      cv.wait(lk, [&] { return full[k]; });
    }
    // Pageable memory: the copy to the device is synchronous on the consumer.
    const std::size_t base = static_cast<std::size_t>(s) * c.batch;
    std::size_t off = 0;
    for (std::size_t d = 0; d < c.devices; ++d) {
      std::memcpy(dev.buf[d].data(), bufs[k].data() + off * c.sample_bytes, split[d] * c.sample_bytes);
      r.wrong += wrong_in(dev.buf[d], base + off, split[d], c.sample_bytes);
      off += split[d];
    }
    {
      std::lock_guard lk(m);
      full[k] = false;
    }
    cv.notify_all();
    compute();
    const auto now = clk::now();
    if (s >= c.warmup) r.step_s.push_back(secs(now - last).count());
    last = now;
  }
  return r;
}

run_result run_ebbflow(const config& c, const loader_model& load, const compute_model& compute,
                       pf::prefetch_stats& st) {
  run_result r;
  const int total = c.warmup + c.steps;
  pf::prefetch_options o{
      .sample_bytes = c.sample_bytes, .max_batch_samples = c.batch, .depth = c.depth, .loaders = c.loaders};
  const std::size_t b = c.batch;
  pf::prefetcher p(pf::sequence_source(
                       b * static_cast<std::size_t>(total), [b](auto) { return b; }, c.devices),
                   load, pf::cpu_stage(c.devices), o);
  auto last = clk::now();
  for (int s = 0; s < total; ++s) {
    auto batch = p.next(std::chrono::seconds(30));
    if (!batch) {
      std::fprintf(stderr, "ebbflow ended early at step %d\n", s);
      r.wrong += 1;
      break;
    }
    std::size_t off = 0;
    for (std::size_t d = 0; d < c.devices; ++d) {
      r.wrong += wrong_in(batch.data(d), batch.indices()[0] + off, batch.sizes()[d], c.sample_bytes);
      off += batch.sizes()[d];
    }
    compute();
    batch.release();
    const auto now = clk::now();
    if (s >= c.warmup) r.step_s.push_back(secs(now - last).count());
    last = now;
  }
  st = p.stats();
  return r;
}

struct summary {
  double min = 0, med = 0, p99 = 0;
};
summary summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return {};
  const auto at = [&](double q) {
    return v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5))];
  };
  return {v.front(), at(0.5), at(0.99)};
}

}  // namespace

int main(int argc, char** argv) {
  config c;
  const auto dflt = [](const auto& x) { return " (default " + cli::show(x) + ")"; };
  cli::parser p("prefetch_bench", "usage: prefetch_bench [options]   (see the file comment)\n");
  p.number("--tc-ms", "MS", c.tc_ms, 0.0, 1e5, "compute time per step, T_c" + dflt(c.tc_ms))
      .value("--ratios", "R0,R1,..", "numbers in [0.001, 1e6], comma-separated",
             [&](const std::string& v) {
               auto r = cli::parse_numbers(v, 1e-3, 1e6);
               if (r) c.ratios = std::move(*r);
               return r.has_value();
             },
             "loading time over compute time, T_l / T_c, one run each (default 0.25,0.5,1,2)")
      .number("--batch", "B", c.batch, std::size_t{1}, std::size_t{1} << 20, "samples per step" + dflt(c.batch))
      .number("--sample-bytes", "N", c.sample_bytes, std::size_t{16}, std::size_t{1} << 30,
              "bytes per sample" + dflt(c.sample_bytes))
      .number("--devices", "N", c.devices, std::size_t{1}, std::size_t{64}, "devices the batch is split over" +
              dflt(c.devices))
      .number("--steps", "N", c.steps, 1, 1 << 20, "timed steps per contestant and round" + dflt(c.steps))
      .number("--warmup", "N", c.warmup, 0, 1 << 20, "untimed steps first" + dflt(c.warmup))
      .number("--reps", "N", c.reps, 1, 1 << 20, "rounds" + dflt(c.reps))
      .number("--loaders", "N", c.loaders, 1u, 256u, "ebbflow's loader threads" + dflt(c.loaders))
      .number("--depth", "N", c.depth, std::size_t{1}, std::size_t{64}, "ebbflow's ring depth" + dflt(c.depth))
      .value("--compute", "sleep|spin", "sleep or spin",
             [&](const std::string& v) {
               c.spin = v == "spin";
               return v == "sleep" || v == "spin";
             },
             "the compute model (default sleep; see the file comment)")
      .text("--json", "FILE", c.json, "also write the results there");
  p.parse(argc, argv);
  // Timer slack of 1 µs (default 50 µs) so that waited-out costs are accurate.
  ::prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  const double ips = c.spin ? calibrate_spin() : 0;
  std::FILE* json = c.json.empty() ? nullptr : std::fopen(c.json.c_str(), "w");

  std::printf(
      "# prefetch_bench: compute=%s T_c=%.1f ms batch=%zu sample=%zu B devices=%zu loaders=%u depth=%zu "
      "steps=%d (+%d warm-up) x %d reps, interleaved\n",
      c.spin ? "spin (CPU trainer)" : "sleep (GPU-like: CPU free while computing)", c.tc_ms, c.batch, c.sample_bytes,
      c.devices, c.loaders, c.depth, c.steps, c.warmup, c.reps);
  std::printf(
      "# step/max = median step / max(T_c, T_l) with measured T_c, T_l; hidden = 1 - max(0, step - T_c) / T_l\n");
  std::printf("# Tl/Tc: nominal; T_c_ms, T_l_ms: medians measured in the sync loop (sleep overshoot included)\n");
  std::printf("%6s %-8s %8s %8s %9s %9s %9s %9s %7s %6s\n", "Tl/Tc", "peer", "T_c_ms", "T_l_ms", "min_ms", "med_ms",
              "p99_ms", "step/max", "hidden", "#wrong");
  bool all_ok = true;
  for (double ratio : c.ratios) {
    const double tc = c.tc_ms * 1e-3, tl = ratio * tc;
    const loader_model load{std::chrono::nanoseconds(static_cast<long long>(tl / static_cast<double>(c.batch) * 1e9))};
    const compute_model compute{c.spin, tc, ips};
    run_result acc[3];
    pf::prefetch_stats st{};
    for (int rep = 0; rep < c.reps; ++rep) {
      for (int k = 0; k < 3; ++k) {
        const int who = (k + rep) % 3;  // rotate the order between repetitions
        run_result r = who == 0   ? run_sync(c, load, compute)
                       : who == 1 ? run_double(c, load, compute)
                                  : run_ebbflow(c, load, compute, st);
        acc[who].step_s.insert(acc[who].step_s.end(), r.step_s.begin(), r.step_s.end());
        acc[who].wrong += r.wrong;
        if (who == 0) {
          acc[0].load_s.insert(acc[0].load_s.end(), r.load_s.begin(), r.load_s.end());
          acc[0].compute_s.insert(acc[0].compute_s.end(), r.compute_s.begin(), r.compute_s.end());
        }
      }
    }
    // Medians, like the step times they are compared with.
    const double tl_m = summarize(acc[0].load_s).med, tc_m = summarize(acc[0].compute_s).med;
    const char* names[3] = {"sync", "double", "ebbflow"};
    summary sm[3];
    for (int w = 0; w < 3; ++w) {
      sm[w] = summarize(acc[w].step_s);
      const double norm = sm[w].med / std::max(tc_m, tl_m);
      const double hidden = 1.0 - std::max(0.0, sm[w].med - tc_m) / tl_m;
      all_ok = all_ok && acc[w].wrong == 0;
      std::printf("%6.2f %-8s %8.2f %8.2f %9.2f %9.2f %9.2f %9.3f %6.1f%% %6zu\n", ratio, names[w], tc_m * 1e3,
                  tl_m * 1e3, sm[w].min * 1e3, sm[w].med * 1e3, sm[w].p99 * 1e3, norm,
                  100 * std::clamp(hidden, 0.0, 1.0), acc[w].wrong);
      if (json)
        std::fprintf(
            json,
            "{\"bench\":\"prefetch\",\"compute\":\"%s\",\"ratio\":%g,\"peer\":\"%s\",\"tc_ms\":%.4f,\"tl_ms\":%.4f,"
            "\"min_ms\":%.4f,\"median_ms\":%.4f,\"p99_ms\":%.4f,\"step_over_max\":%.4f,\"hidden\":%.4f,"
            "\"wrong\":%zu,\"loaders\":%u,\"depth\":%zu,\"batch\":%zu,\"sample_bytes\":%zu}\n",
            c.spin ? "spin" : "sleep", ratio, names[w], tc_m * 1e3, tl_m * 1e3, sm[w].min * 1e3, sm[w].med * 1e3,
            sm[w].p99 * 1e3, norm, std::clamp(hidden, 0.0, 1.0), acc[w].wrong, c.loaders, c.depth, c.batch,
            c.sample_bytes);
    }
    // The goal: T_l <= T_c -> step <= 1.05 T_c; T_l > T_c -> step <= 1.05 T_l, i.e.
    // step <= 1.05 max(T_c, T_l), judged with the measured T_c and T_l.
    const bool tl_le_tc = tl_m <= tc_m;
    const double bound = 1.05 * std::max(tc_m, tl_m);
    std::printf(
        "%6.2f ratios  ebbflow/sync %.3f  ebbflow/double %.3f  measured T_l/T_c %.2f  goal step <= 1.05*%s = %.2f ms: "
        "%s  "
        "(stall %.3f s, pinned %s, pool peak %zu/%zu B)\n",
        ratio, sm[2].med / sm[0].med, sm[2].med / sm[1].med, tl_m / tc_m, tl_le_tc ? "T_c" : "T_l", bound * 1e3,
        sm[2].med <= bound ? "met" : "NOT met", st.consumer_stall_s, st.pool.locked ? "yes" : "no", st.pool.peak,
        st.pool.capacity);
    std::fflush(stdout);
  }
  if (json) std::fclose(json);
  if (!all_ok) {
    std::fprintf(stderr, "wrong data delivered\n");
    return 1;
  }
  return 0;
}
