// SPDX-License-Identifier: Apache-2.0
// Helper process for the store and launcher tests. Modes:
//   count N M     N x add("counter", 1) and M compare_set increments of "cas" (set to "0" first)
//   meet          set rank/<r>, wait for every rank's key, check every value;
//                 the rank named by EBBFLOW_TEST_DIE_RANK SIGKILLs itself first
//   wait-forever  print "ready", then wait 60 s for a key nobody sets
//   half-frame    authenticate, send half a frame, print "ready", sleep 60 s
// The store address and token come from the environment (EBBFLOW_STORE, EBBFLOW_TOKEN).
#include "raw_client.hpp"

#include <ebbflow/core/env.hpp>
#include <ebbflow/elastic/store.hpp>

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
