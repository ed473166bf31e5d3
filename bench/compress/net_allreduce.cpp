// SPDX-License-Identifier: Apache-2.0
// Compressed vs dense allreduce between real processes over TCP (one process
// per rank; run by net_allreduce.sh inside network namespaces joined by veth
// pairs with a tc netem rate). All codecs run in one invocation, interleaved
// per iteration after a warm-up; results are checked (relative l2 error vs
// the exact sum, computed by rank 0 from the regenerated inputs) before
// timing. Rank 0 prints nccl-tests style columns plus wire bytes, ratio vs
// dense and error.
//
//   net_allreduce --rank R --addrs ip:port,ip:port,... [--mib 32] [--iters 5] [--json FILE] [--label L]
#include <ebbflow/compress.hpp>

#include "bench_util.hpp"
#include "tcp_transport.hpp"

#include <sys/resource.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace ef = ebbflow;
namespace cx = ebbflow::compress;
using tp = bench::tcp_transport;

namespace {
double cpu_s() {  // this process, every thread, user + system
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}
std::vector<float> input(int rank, std::size_t n) {
  std::mt19937 g(1000 + static_cast<unsigned>(rank));
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

struct contestant {
  std::string name;
  std::function<void(std::vector<float>&)> run;
  std::function<std::size_t()> wire;  // bytes sent by this rank, cumulative
  double tolerance;                   // max relative l2 error of one call
  std::vector<double> times;
  std::vector<double> cpu;  // CPU seconds (user + system, all threads) of this rank per call
  std::size_t wire_per_call = 0;
  double rel_err = 0;
};

// `dense`: every tensor goes dense, i.e. through the communicator's allreduce.
template <class Codec>
contestant make(ef::comm::transport_communicator<tp>& comm, const char* name, Codec c, double tol, std::size_t key,
                bool dense = false) {
  cx::allreduce_options o{.timeout = std::chrono::minutes(5)};
  if (dense) o.dense_threshold_bytes = SIZE_MAX;
  auto ar = std::make_shared<cx::compressed_allreduce<Codec, tp>>(comm, c, ef::exec::cpu_executor{}, o);
  return {name,
          [ar, key](std::vector<float>& g) { ar->run(g, key); },
          [ar] { return ar->stats().wire_bytes_sent; },
          tol,
          {}};
}
}  // namespace

int main(int argc, char** argv) {
  const int rank = std::stoi(bench::arg(argc, argv, "--rank", "0"));
  std::vector<std::string> addrs;
  {
    std::stringstream ss(bench::arg(argc, argv, "--addrs", ""));
    std::string a;
    while (std::getline(ss, a, ',')) addrs.push_back(a);
  }
  const std::size_t n = std::stoul(bench::arg(argc, argv, "--mib", "32")) * (1u << 20) / 4;
  const int iters = std::stoi(bench::arg(argc, argv, "--iters", "5"));
  const std::string label = bench::arg(argc, argv, "--label", "");
  bench::json_lines json(rank == 0 ? bench::arg(argc, argv, "--json", "") : "");
  tp t(rank, addrs);
  const int p = t.size();
  ef::comm::collective_options co;
  co.timeout = std::chrono::minutes(5);
  ef::comm::transport_communicator<tp> comm(t, co);

  std::vector<contestant> cs;
  cs.push_back(make(comm, "dense", cx::fp16_codec{}, 1e-6, 1, true));
  cs.push_back(make(comm, "fp16", cx::fp16_codec{}, 1e-3, 2));
  cs.push_back(make(comm, "int8", cx::int8_codec{}, 0.05, 3));
  cs.push_back(make(comm, "int4", cx::int4_codec{}, 0.6, 4));
  cs.push_back(make(comm, "sign1", cx::sign_codec{}, 1.0, 5));
  cs.push_back(make(comm, "topk1%", cx::topk_codec(0.01), 1.0, 6));
  const auto barrier = [&] { comm.barrier(); };

  const std::vector<float> mine = input(rank, n);
  std::vector<double> exact;
  if (rank == 0) {
    exact.assign(n, 0.0);
    for (int r = 0; r < p; ++r) {
      auto v = input(r, n);
      for (std::size_t i = 0; i < n; ++i) exact[i] += v[i];
    }
  }
  std::vector<float> buf;
  // Warm-up + check (iteration -1), then timed iterations, interleaved.
  for (int it = -1; it < iters; ++it)
    for (auto& c : cs) {
      buf = mine;
      barrier();
      const std::size_t w0 = c.wire();
      const double c0 = cpu_s(), t0 = bench::now_s();
      c.run(buf);
      const double dt = bench::now_s() - t0, dc = cpu_s() - c0;
      if (it < 0) {
        c.wire_per_call = c.wire() - w0;
        if (rank == 0) {
          double e = 0, d = 0;
          for (std::size_t i = 0; i < n; ++i) e += (buf[i] - exact[i]) * (buf[i] - exact[i]), d += exact[i] * exact[i];
          c.rel_err = std::sqrt(e / d);
          if (!(c.rel_err <= c.tolerance)) {
            std::fprintf(stderr, "%s: relative l2 error %.3e above %.1e: WRONG\n", c.name.c_str(), c.rel_err,
                         c.tolerance);
            return 1;
          }
        }
      } else {
        c.times.push_back(dt);
        c.cpu.push_back(dc);
      }
    }
  // CPU per call summed over the ranks (median per rank, then summed): with
  // p ranks on fewer cores, cpu_ms / cores is a floor on the time of a call.
  std::vector<float> cpu_sum;
  for (auto& c : cs) cpu_sum.push_back(static_cast<float>(bench::summarize(c.cpu).median));
  barrier();
  comm.allreduce(ef::view(std::span(cpu_sum)), ef::reduce_op::sum);
  if (rank == 0) {
    const double bytes = double(n) * 4;
    const auto dense = bench::summarize(cs[0].times);
    std::printf("# %s: %d ranks, %zu floats (%.0f MiB) per rank, %d iterations interleaved, TCP between namespaces\n",
                label.c_str(), p, n, bytes / (1 << 20), iters);
    std::printf("%-8s %12s %10s %10s %10s %10s %10s %14s %8s %11s %9s\n", "codec", "size", "min_ms", "p50_ms", "p99_ms",
                "algbw_GBps", "busbw_GBps", "wire_bytes", "ratio", "rel_l2_err", "cpu_ms");
    for (std::size_t ci = 0; ci < cs.size(); ++ci) {
      auto& c = cs[ci];
      const auto s = bench::summarize(c.times);
      const double algbw = bytes / s.median / 1e9, busbw = algbw * 2 * (p - 1) / p;
      const double ratio = dense.median / s.median;
      std::printf("%-8s %12.0f %10.1f %10.1f %10.1f %10.3f %10.3f %14zu %7.2fx %11.3e %9.1f\n", c.name.c_str(), bytes,
                  1e3 * s.min, 1e3 * s.median, 1e3 * s.p99, algbw, busbw, c.wire_per_call, ratio, c.rel_err,
                  1e3 * cpu_sum[ci]);
      json.write("\"bench\":\"net_allreduce\",\"label\":\"" + label + "\",\"codec\":\"" + c.name + "\",\"ranks\":" +
                 std::to_string(p) + ",\"bytes\":" + std::to_string(n * 4) + ",\"min_s\":" + std::to_string(s.min) +
                 ",\"median_s\":" + std::to_string(s.median) + ",\"p99_s\":" + std::to_string(s.p99) +
                 ",\"algbw_GBps\":" + std::to_string(algbw) + ",\"wire_bytes\":" + std::to_string(c.wire_per_call) +
                 ",\"ratio_vs_dense\":" + std::to_string(ratio) + ",\"rel_l2_error\":" + std::to_string(c.rel_err) +
                 ",\"cpu_s_all_ranks\":" + std::to_string(cpu_sum[ci]));
    }
  }
  barrier();
  return 0;
}
