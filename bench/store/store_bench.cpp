// SPDX-License-Identifier: Apache-2.0
// The store benchmark's client side for ebbflow's backends (any store
// address: the embedded store, its TLS form, etcd); bench/store/store_bench.py
// runs it against each backend, interleaved with PyTorch's TCPStore, and
// prints the tables of docs/benchmarks.md.
//
//   store_bench ops  --store ADDR --op set|get|add|cas|wait --n N [--key K]
//     N operations one after another on one connection; prints one JSON line:
//     {"op":..,"n":..,"t0_ns":..,"t1_ns":..,"lat_ns":[sorted samples...]}
//     (wait: the wake-up latency, from a set on a second connection to the
//     waiter's return, timed by CLOCK_MONOTONIC stamps in the value).
//   store_bench load --store ADDR --members M [--first F] --seconds S [--heartbeat-ms H]
//     members F..F+M-1 of a simulated elastic job, one thread and one
//     connection each, doing what the group's heartbeat thread does every
//     H ms: one batched add (its heartbeat +1, the coordinator's counter and
//     the exit-report counter read), then a wait for its generation's abort
//     key until the next beat; member 0, the coordinator, also reads every
//     member's counter. Prints one JSON line with every operation's latency
//     percentiles and the number done.
// The job token is EBBFLOW_TOKEN; TLS files are EBBFLOW_TLS_*.
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/elastic/any_store.hpp>

#include "../../examples/common/args.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ef = ebbflow;
namespace el = ebbflow::elastic;
using namespace std::chrono_literals;

namespace {

std::int64_t mono_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

el::any_store connect(const std::string& addr) {
  const char* t = std::getenv("EBBFLOW_TOKEN");
  return el::any_store::connect(addr, t ? t : "", 30s);
}

// Clients of one measurement start together: each says "ready" once it is
// connected and set up, then waits for the harness's "go" line on stdin
// (process start-up, e.g. Python importing torch, is not measured).
void ready_then_wait_for_go() {
  std::printf("ready\n");
  std::fflush(stdout);
  std::string line;
  std::getline(std::cin, line);
}

void print_samples(const char* op, std::vector<std::int64_t>& lat, std::int64_t t0, std::int64_t t1) {
  std::sort(lat.begin(), lat.end());
  std::printf("{\"op\":\"%s\",\"n\":%zu,\"t0_ns\":%lld,\"t1_ns\":%lld,\"lat_ns\":[", op, lat.size(),
              static_cast<long long>(t0), static_cast<long long>(t1));
  for (std::size_t i = 0; i < lat.size(); ++i) std::printf("%s%lld", i ? "," : "", static_cast<long long>(lat[i]));
  std::printf("]}\n");
}

int ops(const std::string& addr, const std::string& op, int n, const std::string& key) {
  auto s = connect(addr);
  const auto d = [] { return ef::deadline::after(30s); };
  s.set(key + "/v", "x", d());
  s.set(key + "/cas", "0", d());
  std::vector<std::int64_t> lat;
  lat.reserve(static_cast<std::size_t>(n));
  if (op == "wait") {
    auto setter = connect(addr);
    std::atomic<int> next{-1};
    setter.ping(d());
    ready_then_wait_for_go();
    std::thread t([&] {
      for (int i = 0; i < n; ++i) {
        while (next.load() < i) std::this_thread::yield();
        std::this_thread::sleep_for(200us);  // the waiter is waiting on the server by now
        setter.set(key + "/w/" + std::to_string(i), std::to_string(mono_ns()), d());
      }
    });
    const auto t0 = mono_ns();
    for (int i = 0; i < n; ++i) {
      const std::string k = key + "/w/" + std::to_string(i);
      next.store(i);
      s.wait({k}, d());
      const auto woke = mono_ns();
      const auto v = s.try_get(k, d());
      lat.push_back(woke - std::stoll(v.value_or("0")));
    }
    const auto t1 = mono_ns();
    t.join();
    print_samples("wait", lat, t0, t1);
    return 0;
  }
  ready_then_wait_for_go();
  const auto t0 = mono_ns();
  for (int i = 0; i < n; ++i) {
    const auto a = mono_ns();
    if (op == "set") {
      s.set(key + "/v", "value-of-16bytes", d());
    } else if (op == "get") {
      if (!s.try_get(key + "/v", d())) return 1;
    } else if (op == "add") {
      s.add(key + "/n", 1, d());
    } else if (op == "cas") {
      // A swap that succeeds: i -> i + 1.
      if (!s.compare_set(key + "/cas", std::to_string(i), std::to_string(i + 1), d()).swapped) return 1;
    } else {
      std::fprintf(stderr, "store_bench: unknown op '%s'\n", op.c_str());
      return 2;
    }
    lat.push_back(mono_ns() - a);
  }
  print_samples(op.c_str(), lat, t0, mono_ns());
  return 0;
}

int load(const std::string& addr, int members, int first, double seconds, int hb_ms, int total) {
  std::mutex mu;
  std::vector<std::int64_t> hb_lat, wait_lat, coord_lat;
  std::atomic<long> errors{0};
  std::atomic<bool> go{false};
  std::atomic<int> connected{0};
  const std::string job = "load";
  const auto beat = std::chrono::milliseconds(hb_ms);
  std::vector<std::thread> ts;
  for (int m = first; m < first + members; ++m) {
    ts.emplace_back([&, m] {
      std::vector<std::int64_t> my_hb, my_wait, my_coord;
      try {
        auto s = connect(addr);
        s.ping(ef::deadline::after(30s));
        ++connected;
        while (!go.load()) std::this_thread::sleep_for(1ms);
        const std::vector<std::string> keys = {job + "/hb/" + std::to_string(m), job + "/hb/0", job + "/gone_count"};
        const std::vector<std::int64_t> deltas = {1, 0, 0};
        std::vector<std::string> all;
        for (int w = 0; w < total; ++w) all.push_back(job + "/hb/" + std::to_string(w));
        const std::vector<std::int64_t> zeros(all.size(), 0);
        const std::vector<std::string> wake = {job + "/abort/0"};
        const auto until = ef::steady_clock::now() + std::chrono::duration<double>(seconds);
        // Members start spread over one beat, as a real job's do.
        std::this_thread::sleep_for(beat * (m % 97) / 97);
        while (ef::steady_clock::now() < until) {
          const auto round = ef::steady_clock::now();
          try {
            auto a = mono_ns();
            s.add_many(keys, deltas, ef::deadline::after(beat * 4 + 100ms));
            my_hb.push_back(mono_ns() - a);
            if (m == 0) {
              a = mono_ns();
              s.add_many(all, zeros, ef::deadline::after(beat * 4 + 100ms));
              my_coord.push_back(mono_ns() - a);
            }
            // The wait between beats: it times out on the server (nobody aborts).
            const auto rest = beat - (ef::steady_clock::now() - round);
            if (rest > 1ms) {
              a = mono_ns();
              try {
                s.wait_any(wake, ef::deadline::after(std::chrono::duration_cast<std::chrono::milliseconds>(rest)));
              } catch (const ef::system_error& e) {
                if (e.code() != ef::errc::timeout) throw;
              }
              // Past its deadline: what the reply added to it.
              my_wait.push_back(std::max<std::int64_t>(0, mono_ns() - a - std::chrono::nanoseconds(rest).count()));
            }
          } catch (const std::exception&) {
            ++errors;
          }
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "member %d: %s\n", m, e.what());
        ++errors;
        ++connected;  // counted, so that the others are not held up
      }
      std::lock_guard lk(mu);
      hb_lat.insert(hb_lat.end(), my_hb.begin(), my_hb.end());
      wait_lat.insert(wait_lat.end(), my_wait.begin(), my_wait.end());
      coord_lat.insert(coord_lat.end(), my_coord.begin(), my_coord.end());
    });
  }
  while (connected.load() < members) std::this_thread::sleep_for(1ms);
  ready_then_wait_for_go();
  const auto t0 = mono_ns();
  go = true;
  for (auto& t : ts) t.join();
  const auto t1 = mono_ns();
  auto pct = [](std::vector<std::int64_t>& v, double p) -> double {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return static_cast<double>(v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))]) /
           1e6;
  };
  std::printf(
      "{\"members\":%d,\"first\":%d,\"seconds\":%.3f,\"errors\":%ld,\"hb_n\":%zu,\"hb_p50_ms\":%.3f,\"hb_p99_ms\":%.3f,"
      "\"hb_max_ms\":%.3f,\"wait_n\":%zu,\"wait_late_p50_ms\":%.3f,\"wait_late_p99_ms\":%.3f,\"coord_n\":%zu,"
      "\"coord_p99_ms\":%.3f}\n",
      members, first, static_cast<double>(t1 - t0) / 1e9, errors.load(), hb_lat.size(), pct(hb_lat, 0.5),
      pct(hb_lat, 0.99), pct(hb_lat, 1.0), wait_lat.size(), pct(wait_lat, 0.5), pct(wait_lat, 0.99), coord_lat.size(),
      pct(coord_lat, 0.99));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: store_bench ops|load --store ADDR ... (see the file comment)\n");
    return 2;
  }
  const std::string mode = argv[1];
  std::string addr, op = "add", key = "bench";
  int n = 1000, members = 10, first = 0, hb_ms = 50, total = 0;
  double seconds = 5;
  cli::parser p("store_bench", "usage: store_bench ops|load [options]\n", "");
  p.text("--store", "ADDR", addr, "store address (host:port, tcp+tls://, etcd://, etcds://)")
      .text("--op", "OP", op, "ops: set, get, add, cas or wait")
      .number("--n", "N", n, 1, 10'000'000, "ops: operations")
      .text("--key", "K", key, "ops: key prefix (one per client process)")
      .number("--members", "M", members, 1, 100000, "load: simulated members in this process")
      .number("--first", "F", first, 0, 100000, "load: the first member's id")
      .number("--total", "T", total, 0, 100000, "load: members in the whole job (default: --members)")
      .number("--seconds", "S", seconds, 0.1, 3600.0, "load: how long")
      .number("--heartbeat-ms", "H", hb_ms, 1, 60000, "load: the heartbeat period");
  p.parse(argc - 1, argv + 1);
  if (addr.empty()) p.error("--store is required");
  if (total == 0) total = first + members;
  try {
    if (mode == "ops") return ops(addr, op, n, key);
    if (mode == "load") return load(addr, members, first, seconds, hb_ms, total);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "store_bench: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "store_bench: unknown mode '%s'\n", mode.c_str());
  return 2;
}
