// SPDX-License-Identifier: Apache-2.0
// Helper process for the store and launcher tests. Modes:
//   count N M     N x add("counter", 1) and M compare_set increments of "cas" (set to "0" first)
//   meet          set rank/<r>, wait for every rank's key, check every value;
//                 the rank named by EBBFLOW_TEST_DIE_RANK SIGKILLs itself first
//   wait-forever  print "ready", then wait 60 s for a key nobody sets
//   set-after MS KEY LIVE  rank 0 sets KEY after MS ms; every rank exits LIVE ms after its start
//   half-frame    authenticate, send half a frame, print "ready", sleep 60 s
//   steal S       S steps of plan::run_stealing_step over the store (4 slices of
//                 48 items, 200 us per item; rank 1 is 6x slower on odd steps),
//                 printing "chunk <step> <rank> <first> <last> <stolen>" per chunk
// The store address and token come from the environment (EBBFLOW_STORE, EBBFLOW_TOKEN).
#include "raw_client.hpp"

#include <ebbflow/core/env.hpp>
#include <ebbflow/elastic/tcp_store.hpp>
#include <ebbflow/plan/work_stealing.hpp>

#include <signal.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <thread>

namespace ef = ebbflow;
using namespace std::chrono_literals;

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const std::string mode = argv[1];
  try {
    const auto li = ef::launch_info::from_environment();
    if (mode == "half-frame") {
      ebbflow_test::raw_conn c(li.store_port);
      if (!c.authenticate(li.token)) return 3;
      std::string f =
          ebbflow_test::proto::frame_builder(ebbflow_test::proto::op::set).str("k").str(std::string(100, 'x')).finish();
      c.send(std::string_view(f).substr(0, f.size() / 2));
      std::cout << "ready" << std::endl;
      std::this_thread::sleep_for(60s);
      return 0;
    }
    auto store = ef::elastic::store_client::from_environment();
    if (mode == "count") {
      const int n = std::stoi(argv[2]), m = std::stoi(argv[3]);
      for (int i = 0; i < n; ++i) store.add("counter", 1);
      for (int i = 0; i < m; ++i) {
        // Optimistic increment (the test sets "cas" to "0" first): swap, retry on conflict.
        std::string cur = store.get("cas");
        for (;;) {
          auto r = store.compare_set("cas", cur, std::to_string(std::stoll(cur) + 1));
          if (r.swapped) break;
          cur = r.current;
        }
      }
      std::cout << "done" << std::endl;
      return 0;
    }
    if (mode == "steal") {
      namespace pl = ebbflow::plan;
      const int steps = std::stoi(argv[2]);
      const auto n = static_cast<std::size_t>(li.world_size);
      const std::vector<std::size_t> sizes(n, 48);
      std::vector<pl::worker_spec> m;
      for (std::size_t i = 0; i < n; ++i) m.push_back({i, 0.0, 200e-6, 1000, 0, 0});
      const pl::batch_plan plan = pl::make_plan(m, sizes, 1);
      const auto me = static_cast<std::size_t>(li.rank);
      for (int s = 0; s < steps; ++s) {
        // The steps of a real loop start together after the allreduce: a store barrier here.
        const std::string bar = "barrier/" + std::to_string(s);
        store.add(bar, 1);
        while (store.add(bar, 0) < static_cast<std::int64_t>(n)) std::this_thread::sleep_for(100us);
        pl::steal_options o;
        o.min_chunk = 2;
        pl::work_stealer<ef::elastic::store_client> ws(store, "steal", {0, static_cast<std::uint64_t>(s)}, plan, me, o);
        pl::steal_policy pol(m, plan, me, 50e-6, 20e-6);
        const auto per_item = std::chrono::microseconds(me == 1 && s % 2 == 1 ? 1200 : 200);
        std::string lines;
        const auto rep = pl::run_stealing_step(ws, pol, [&](const pl::chunk& c) {
          std::this_thread::sleep_for(per_item * c.size());
          lines += "chunk " + std::to_string(s) + " " + std::to_string(c.rank) + " " + std::to_string(c.first) + " " +
                   std::to_string(c.last) + " " + (c.stolen ? "1" : "0") + "\n";
        });
        std::cout << lines << "processed " << s << " " << rep.processed << std::endl;
      }
      return 0;
    }
    if (mode == "meet") {
      if (auto die = ef::env::get("EBBFLOW_TEST_DIE_RANK"); die && std::stoi(*die) == li.rank) {
        std::cout << "rank " << li.rank << " dies now" << std::endl;
        ::raise(SIGKILL);
      }
      store.set("rank/" + std::to_string(li.rank), "value of " + std::to_string(li.rank));
      std::vector<std::string> keys;
      for (int r = 0; r < li.world_size; ++r) keys.push_back("rank/" + std::to_string(r));
      store.wait(keys, ef::deadline::after(15s));
      for (int r = 0; r < li.world_size; ++r)
        if (store.get(keys[static_cast<std::size_t>(r)]) != "value of " + std::to_string(r)) {
          std::cerr << "rank " << li.rank << ": wrong value for rank " << r << std::endl;
          return 4;
        }
      store.add("met", 1);
      std::cout << "rank " << li.rank << " of " << li.world_size << " met everyone" << std::endl;
      return 0;
    }
    if (mode == "set-after" && argc == 5) {
      const auto t0 = std::chrono::steady_clock::now();
      if (li.rank == 0) {
        std::this_thread::sleep_until(t0 + std::chrono::milliseconds(std::stoi(argv[2])));
        store.set(argv[3], "1");
      }
      std::this_thread::sleep_until(t0 + std::chrono::milliseconds(std::stoi(argv[4])));
      return 0;
    }
    if (mode == "wait-forever") {
      store.ping(ef::deadline::after(5s));
      std::cout << "ready" << std::endl;
      store.wait({"never"}, ef::deadline::after(60s));
      return 0;
    }
  } catch (const std::exception& e) {
    std::cerr << "store_worker " << mode << ": " << e.what() << std::endl;
    return 1;
  }
  return 2;
}
