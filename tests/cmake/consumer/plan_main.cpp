// SPDX-License-Identifier: Apache-2.0
// A consumer program of the batch planner, which needs no optional
// dependency: links only ebbflow::ebbflow (or nothing but the single header).
// Plans a global batch of 100 over three workers of different speeds and
// checks the result against properties any correct plan has, plus the exact
// optimum computed here by brute force. Exits non-zero, naming the check,
// when something is wrong.
#include <ebbflow/ebbflow.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <vector>

namespace {
int failures = 0;
void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "consumer_plan: FAILED: %s\n", what);
    ++failures;
  }
}
}  // namespace

int main() {
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
  if (p.size() != workers.size()) return EXIT_FAILURE;
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
  if (failures) return EXIT_FAILURE;
  std::printf("consumer_plan OK\n");
  return EXIT_SUCCESS;
}
