// SPDX-License-Identifier: Apache-2.0
// A consumer program of the `ucx` component: a real two-process allreduce
// over UCX on this host. The parent fork()s two ranks (it never touches UCX
// itself), which exchange their UCX worker addresses through files in a fresh
// temporary directory (comm::ucx::file_address_exchange), connect
// (comm::ucx::connect) and run an allreduce, a broadcast and a barrier
// through comm::basic_communicator, each checking its results. The parent
// reaps both, killing them when they outlive 45 s; every blocking call in a
// rank has its own deadline. Exits non-zero, naming the failure, when a rank
// fails, crashes or times out.
#include <ebbflow/ebbflow.hpp>

#if !EBBFLOW_HAS_UCX
#error "ebbflow::ucx (or the single header with ucx::ucp) must put UCX's headers on the include path"
#endif

#include <signal.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace {
namespace ef = ebbflow;
using namespace std::chrono_literals;
constexpr int world = 2;
constexpr std::size_t count = 4099;  // not a multiple of the rank count: exercises uneven chunks

// One rank: connect, allreduce, broadcast, barrier. Returns the exit code.
int run_rank(int rank, const std::filesystem::path& dir) try {
  ef::comm::ucx::file_address_exchange exchange(dir);
  auto ctx = ef::comm::ucx::context::create();
  auto transport = ef::comm::ucx::connect(ctx, exchange, /*generation=*/0, rank, world, ef::deadline::after(20s));
  ef::comm::basic_communicator comm(transport);

  // Rank r contributes (r + 1) * (i + 1); the sum is (1 + 2) * (i + 1).
  std::vector<std::int64_t> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<std::int64_t>((rank + 1) * (i + 1));
  comm.allreduce(ef::view(std::span(v)), ef::reduce_op::sum, ef::deadline::after(10s));
  int bad = 0;
  for (std::size_t i = 0; i < count; ++i)
    if (v[i] != static_cast<std::int64_t>(3 * (i + 1))) ++bad;
  if (bad) {
    std::fprintf(stderr, "consumer_ucx: rank %d: allreduce: %d of %zu elements wrong (v[0] = %lld)\n", rank, bad, count,
                 static_cast<long long>(v[0]));
    return 1;
  }

  std::vector<float> f(17, rank == 1 ? 2.5F : -1.0F);
  comm.broadcast(ef::view(std::span(f)), /*root=*/1, ef::deadline::after(10s));
  for (float x : f)
    if (x != 2.5F) {
      std::fprintf(stderr, "consumer_ucx: rank %d: broadcast from rank 1 delivered %g\n", rank, double(x));
      return 1;
    }
  comm.barrier(ef::deadline::after(10s));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "consumer_ucx: rank %d: %s\n", rank, e.what());
  return 1;
}
}  // namespace

int main() {
  char tmpl[] = "/tmp/ebbflow-consumer-ucx-XXXXXX";
  if (!::mkdtemp(tmpl)) {
    std::perror("consumer_ucx: mkdtemp");
    return EXIT_FAILURE;
  }
  const std::filesystem::path dir = tmpl;
  std::fflush(nullptr);  // nothing buffered may be written twice by the children
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("consumer_ucx: fork");
      for (pid_t p : pids) ::kill(p, SIGKILL);
      for (pid_t p : pids) ::waitpid(p, nullptr, 0);
      std::filesystem::remove_all(dir);
      return EXIT_FAILURE;
    }
    if (pid == 0) {
      const int rc = run_rank(r, dir);
      std::fflush(nullptr);
      ::_exit(rc);  // not exit(): the parent's atexit handlers and static destructors are not ours to run
    }
    pids.push_back(pid);
  }

  // Reap both; kill what outlives the limit.
  std::vector<int> status(world, -1);
  int left = world;
  const auto until = ef::deadline::after(45s);
  bool timed_out = false;
  while (left > 0) {
    for (int r = 0; r < world; ++r) {
      if (pids[r] <= 0) continue;
      int st = 0;
      if (::waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        status[r] = st;
        pids[r] = -1;
        --left;
      }
    }
    if (left > 0 && until.expired()) {
      timed_out = true;
      for (int r = 0; r < world; ++r)
        if (pids[r] > 0) {
          ::kill(pids[r], SIGKILL);
          ::waitpid(pids[r], &status[r], 0);
        }
      break;
    }
    std::this_thread::sleep_for(2ms);
  }
  std::filesystem::remove_all(dir);

  int failures = 0;
  for (int r = 0; r < world; ++r) {
    const int st = status[r];
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) continue;
    ++failures;
    if (WIFSIGNALED(st))
      std::fprintf(stderr, "consumer_ucx: FAILED: rank %d killed by signal %d%s\n", r, WTERMSIG(st),
                   timed_out ? " (timed out after 45 s)" : "");
    else
      std::fprintf(stderr, "consumer_ucx: FAILED: rank %d exited with %d\n", r, WEXITSTATUS(st));
  }
  if (failures) return EXIT_FAILURE;
  std::printf("2-process UCX allreduce of %zu int64 and broadcast: correct\n", count);
  std::printf("consumer_ucx OK\n");
  return EXIT_SUCCESS;
}
