// SPDX-License-Identifier: Apache-2.0
// A consumer program of the header-only core and of the batch planner (which
// needs no optional dependency), built by every packaging test (find_package,
// FetchContent, add_subdirectory, single header, Conan); the Asio store and
// the UCX collectives have their own programs (asio_main.cpp, ucx_main.cpp).
// Includes only the umbrella, so the same file proves the umbrella and the
// single-include header; links only ebbflow::ebbflow (or nothing but the
// single header), and does not set the C++ standard: the target must carry
// C++20. Exits non-zero, naming the check, when something is wrong.
#include <ebbflow/ebbflow.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#if defined(EBBFLOW_EXPECT_SINGLE_INCLUDE)
static_assert(EBBFLOW_SINGLE_INCLUDE == 1, "expected the single-include header");
#else
#if defined(EBBFLOW_SINGLE_INCLUDE)
#error "the single-include header was picked up instead of the package's headers"
#endif
#endif

namespace {
int failures = 0;
void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "consumer_core: FAILED: %s\n", what);
    ++failures;
  }
}

// The batch planner: a global batch of 100 over three workers of different
// speeds, checked against properties any correct plan has and the exact
// optimum computed here by brute force.
void check_planner() {
  namespace plan = ebbflow::plan;
  // Seconds per sample 1 ms, 2 ms and 4 ms: worker 0 is the fastest.
  const std::vector<plan::worker_spec> workers = {
      {.id = 10, .a = 0.010, .c = 0.001, .max_batch = 100},
      {.id = 11, .a = 0.010, .c = 0.002, .max_batch = 100},
      {.id = 12, .a = 0.010, .c = 0.004, .max_batch = 100},
  };
  constexpr std::size_t global_batch = 100;
  const plan::batch_plan p = plan::solve(workers, global_batch);
  check(p.size() == workers.size(), "one batch per worker");
  if (p.size() != workers.size()) return;
  std::size_t sum = 0;
  for (std::size_t b : p.batch) sum += b;
  check(sum == global_batch && p.global_batch == global_batch, "the batches sum to B");
  check(p.batch[0] > p.batch[1] && p.batch[1] > p.batch[2], "a faster worker gets a larger batch");
  check(p.offsets.size() == 4 && p.offsets[3] == global_batch, "offsets are the prefix sums");
  double wsum = 0;
  for (double w : p.weights()) wsum += w;
  check(wsum > 1 - 1e-12 && wsum < 1 + 1e-12, "gradient weights sum to 1");

  // The optimum by brute force over every split: the planner is exact.
  double best = std::numeric_limits<double>::infinity();
  for (std::size_t b0 = 0; b0 <= global_batch; ++b0)
    for (std::size_t b1 = 0; b0 + b1 <= global_batch; ++b1) {
      const std::size_t b2 = global_batch - b0 - b1;
      best = std::min(best, std::max({workers[0].step_time(b0), workers[1].step_time(b1), workers[2].step_time(b2)}));
    }
  check(p.step_time == best, "the plan's step time is the brute-force optimum");
  check(plan::predict_step_time(p, workers) == p.step_time, "predict_step_time agrees with the plan");

  // Bad input is reported as plan_error, not a wrong plan.
  bool threw = false;
  try {
    (void)plan::solve(workers, 301);  // more than Σ max_batch
  } catch (const plan::plan_error&) {
    threw = true;
  }
  check(threw, "an infeasible batch raises plan_error");

  std::printf("plan of B=%zu: %zu %zu %zu, step %.4f s\n", global_batch, p.batch[0], p.batch[1], p.batch[2],
              p.step_time);
}
}  // namespace

int main() {
  namespace ef = ebbflow;
#if defined(EBBFLOW_EXPECTED_VERSION)
  check(std::string_view(EBBFLOW_VERSION_STRING) == EBBFLOW_EXPECTED_VERSION,
        "EBBFLOW_VERSION_STRING matches the packaged version");
#endif
  check(EBBFLOW_VERSION == EBBFLOW_VERSION_MAJOR * 10000 + EBBFLOW_VERSION_MINOR * 100 + EBBFLOW_VERSION_PATCH,
        "EBBFLOW_VERSION encoding");

  // dtype.hpp
  check(ef::size_of(ef::dtype::bf16) == 2 && ef::size_of(ef::dtype::i64) == 8, "dtype sizes");
  check(ef::parse_dtype("f16") == ef::dtype::f16 && !ef::parse_dtype("f128"), "parse_dtype");

  // env.hpp: validated environment, launch_info.
  ::setenv("EBBFLOW_CONSUMER_N", "42", 1);
  check(ef::env::get_int("EBBFLOW_CONSUMER_N", 0, 0, 100) == 42, "env::get_int");
  ::setenv("EBBFLOW_CONSUMER_N", "4x2", 1);
  bool threw = false;
  try {
    (void)ef::env::get_int("EBBFLOW_CONSUMER_N", 0);
  } catch (const std::invalid_argument& e) {
    threw = std::string(e.what()).find("EBBFLOW_CONSUMER_N") != std::string::npos;
  }
  check(threw, "env::get_int rejects a malformed value, naming the variable");
  ::setenv("EBBFLOW_RANK", "2", 1);
  ::setenv("EBBFLOW_WORLD_SIZE", "3", 1);
  const auto li = ef::launch_info::from_environment();
  check(li.rank == 2 && li.world_size == 3 && li.source == "ebbflow", "launch_info from EBBFLOW_*");

  // error.hpp: portable conditions and the exception's message.
  const std::error_code ec = ef::make_error_code(ef::error::peer_lost);
  check(ec == ef::errc::peer_lost && ec != ef::errc::timeout, "error code maps onto errc condition");
  try {
    ef::throw_if(ec, {.rank = 2, .generation = 5, .peer = 1, .operation = "allreduce"});
    check(false, "throw_if throws");
  } catch (const ef::system_error& e) {
    const std::string w = e.what();
    check(w.find("allreduce") != std::string::npos && w.find("rank 2") != std::string::npos &&
              w.find("generation 5") != std::string::npos && e.code() == ef::errc::peer_lost,
          "system_error names operation, rank and generation");
  }

  check_planner();

  if (failures) return EXIT_FAILURE;
  std::printf("consumer_core OK (ebbflow %s)\n", EBBFLOW_VERSION_STRING);
  return EXIT_SUCCESS;
}
