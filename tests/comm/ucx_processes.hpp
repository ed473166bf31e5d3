// SPDX-License-Identifier: Apache-2.0
// Real processes over real UCX for the tests: a test binary is its own
// launcher. `launch` forks and execs N copies of it in worker mode
// (`--worker SCENARIO ...`, rank and size in EBBFLOW_RANK / EBBFLOW_WORLD_SIZE
// as ebbflow-run sets them), reaps them promptly (an unreaped dead peer is
// invisible to UCX keepalive over shared memory) and kills all of them at the
// limit, so nothing can hang. A worker connects with `worker_env::connect`:
// addresses travel through files in EBBFLOW_TEST_DIR when `launch` started
// it, and through the rendezvous store when ebbflow-run did.
#pragma once

#include <ebbflow/comm/communicator.hpp>
#include <ebbflow/comm/ucx/address_exchange.hpp>
#include <ebbflow/comm/ucx/transport.hpp>
#include <ebbflow/core/env.hpp>

#if EBBFLOW_HAS_ASIO
#include <ebbflow/elastic/tcp_store.hpp>
#include <ebbflow/elastic/store_address_exchange.hpp>
#endif

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

namespace ebbflow_test {

//! The communicator these tests run over.
using ucx_communicator = ebbflow::comm::transport_communicator<ebbflow::comm::ucx::transport>;

//! A worker's UCX context and its way to its peers' addresses.
struct worker_env {
  ebbflow::launch_info li = ebbflow::launch_info::from_environment();
  std::shared_ptr<ebbflow::comm::ucx::context> ctx = ebbflow::comm::ucx::context::create();
  ebbflow::comm::ucx::transport connect(std::int64_t g = 0) {
    using namespace std::chrono_literals;
#if EBBFLOW_HAS_ASIO
    if (li.store_port != 0) {
      auto store = ebbflow::elastic::store_client::from_environment();
      ebbflow::elastic::store_address_exchange<ebbflow::elastic::store_client> ex(store, "ucx-test");
      return ebbflow::comm::ucx::connect(ctx, ex, g, li.rank, li.world_size, ebbflow::deadline::after(20s));
    }
#endif
    ebbflow::comm::ucx::file_address_exchange ex{std::filesystem::path(ebbflow::env::get("EBBFLOW_TEST_DIR").value())};
    return ebbflow::comm::ucx::connect(ctx, ex, g, li.rank, li.world_size, ebbflow::deadline::after(20s));
  }
};

//! Marks that this worker reached `what` (a file in EBBFLOW_TEST_DIR), then
//! waits until `want` workers did (at most 10 s). For workers that must not
//! go on, or exit, before the others got somewhere: a peer that exits is a
//! lost peer to the others.
inline void reach(const std::string& what, int want) {
  using namespace std::chrono_literals;
  const auto dir = std::filesystem::path(ebbflow::env::get("EBBFLOW_TEST_DIR").value());
  const int n = static_cast<int>(ebbflow::env::get_int("EBBFLOW_WORLD_SIZE", 1, 1));
  const auto rank = ebbflow::env::get("EBBFLOW_RANK").value_or("0");
  std::ofstream(dir / (what + "-" + rank)) << "1";
  const auto until = ebbflow::deadline::after(10s);
  for (;;) {
    int got = 0;
    for (int q = 0; q < n; ++q) got += std::filesystem::exists(dir / (what + "-" + std::to_string(q)));
    if (got >= want || until.expired()) return;
    std::this_thread::sleep_for(1ms);
  }
}

//! A worker's failure: says what on stderr, returns 1 (an exit status).
inline int fail(const std::string& what) {
  std::cerr << "[worker " << ebbflow::env::get("EBBFLOW_RANK").value_or("?") << "] FAIL " << what << std::endl;
  return 1;
}

//! How the workers of one `launch` ended.
struct group_result {
  std::vector<int> status;                             //!< wait status per rank
  std::vector<ebbflow::steady_clock::time_point> end;  //!< when each was reaped (within ~1 ms of its end)
  bool timed_out = false;                              //!< the limit passed: the rest were killed
};

//! Runs `n` workers `--worker args...` of this binary and waits for them (at
//! most `limit`, then kills the rest). With `err_prefix`, rank r's stderr
//! goes to the file err_prefix + r.
inline group_result launch(int n, const std::vector<std::string>& args, std::chrono::seconds limit,
                           const std::string& err_prefix = {}) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("ebbflow-ucx-test-" + std::to_string(::getpid()) + "-" + std::to_string(std::rand()));
  std::filesystem::create_directories(dir);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setenv("EBBFLOW_RANK", std::to_string(r).c_str(), 1);
      ::setenv("EBBFLOW_WORLD_SIZE", std::to_string(n).c_str(), 1);
      ::setenv("EBBFLOW_LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("EBBFLOW_TEST_DIR", dir.c_str(), 1);
      if (!err_prefix.empty()) (void)std::freopen((err_prefix + std::to_string(r)).c_str(), "w", stderr);
      std::vector<std::string> a{"ebbflow-ucx-worker", "--worker"};
      a.insert(a.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& s : a) argv.push_back(s.data());
      argv.push_back(nullptr);
      ::execv("/proc/self/exe", argv.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  group_result res;
  res.status.assign(static_cast<std::size_t>(n), -1);
  res.end.assign(static_cast<std::size_t>(n), {});
  std::size_t left = pids.size();
  const auto until = ebbflow::deadline::after(limit);
  while (left) {
    for (std::size_t i = 0; i < pids.size(); ++i) {
      if (pids[i] <= 0) continue;
      int st = 0;
      if (::waitpid(pids[i], &st, WNOHANG) == pids[i]) {
        res.status[i] = st;
        res.end[i] = ebbflow::steady_clock::now();
        pids[i] = -1;
        --left;
      }
    }
    if (left && until.expired()) {
      res.timed_out = true;
      for (pid_t p : pids)
        if (p > 0) ::kill(p, SIGKILL);
      for (std::size_t i = 0; i < pids.size(); ++i)
        if (pids[i] > 0) ::waitpid(pids[i], &res.status[i], 0), res.end[i] = ebbflow::steady_clock::now();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::filesystem::remove_all(dir);
  return res;
}

//! Whether wait status `st` is a normal exit with status 0.
inline bool exited_ok(int st) { return WIFEXITED(st) && WEXITSTATUS(st) == 0; }

}  // namespace ebbflow_test
