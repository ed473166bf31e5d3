// SPDX-License-Identifier: Apache-2.0
// The training loop the docs show (README.md, docs/tutorial.md,
// docs/elastic.md, the comment at the top of elastic/group.hpp): they quote
// the regions between the `// [name]` lines of this file verbatim, and the
// tests compile it, run it under ebbflow-run with a joiner, and check that
// the quotes still equal these lines (tests/docs). A complete program: a
// linear model fitted by SGD with momentum to a synthetic data set.
// [includes]
#include <ebbflow/elastic/any_store.hpp>       // elastic::any_store: the job's store, picked by EBBFLOW_STORE
#include <ebbflow/elastic/group.hpp>           // elastic::group, group_options, step_info, leave_on_signal
#include <ebbflow/elastic/planner_policy.hpp>  // elastic::planner_policy: batch sizes by measured speed
#include <ebbflow/elastic/ucx_network.hpp>     // elastic::ucx_network: collectives over UCX
#include <ebbflow/plan/sampler.hpp>            // plan::epoch_permutation: each epoch's sample order
namespace ef = ebbflow;
namespace el = ebbflow::elastic;
// [includes]

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

namespace {

constexpr std::size_t features = 8;
constexpr std::size_t dataset_size = 1000;
constexpr std::uint64_t seed = 42;

// Sample i: features x_k = sin(i + k), target the sum of k·x_k.
float feature(std::uint64_t i, std::size_t k) { return static_cast<float>(std::sin(static_cast<double>(i + k))); }
float target(std::uint64_t i) {
  float y = 0;
  for (std::size_t k = 0; k < features; ++k) y += static_cast<float>(k) * feature(i, k);
  return y;
}

// Adds `scale` times the gradient of sample i's squared error to `grads`.
void add_loss_gradient(std::uint64_t i, std::span<const float> params, float scale, std::span<float> grads) {
  float err = -target(i);
  for (std::size_t k = 0; k < features; ++k) err += params[k] * feature(i, k);
  for (std::size_t k = 0; k < features; ++k) grads[k] += scale * err * feature(i, k);
}

// [gradients]
// My part of the gradient of the global batch's mean loss: each of my samples weighs 1 / B_t.
void compute_gradients(const el::step_info& s, std::span<const float> params, std::span<float> grads) {
  const ef::plan::epoch_permutation order(dataset_size, seed, static_cast<std::uint64_t>(s.epoch));
  std::fill(grads.begin(), grads.end(), 0.f);
  for (std::size_t j = 0; j < s.batch; ++j)
    add_loss_gradient(order(s.cursor + s.offset + j), params, 1.f / static_cast<float>(s.global_batch), grads);
}
// [gradients]

void sgd_step(std::span<float> params, std::span<float> velocity, std::span<const float> grads) {
  for (std::size_t k = 0; k < params.size(); ++k) {
    velocity[k] = 0.9f * velocity[k] + grads[k];
    params[k] -= 0.01f * velocity[k];
  }
}

// The loop: one step of SGD on the global batch per iteration.
template <class Group>
void train(Group& g, std::vector<float>& params, std::vector<float>& velocity, std::vector<float>& grads,
           std::int64_t steps) {
  // [loop]
  while (g.keep_training(steps)) {
    const el::step_info s = g.begin_step();  // my slice: positions [s.cursor + s.offset, + s.batch) of epoch s.epoch
    const auto t0 = std::chrono::steady_clock::now();
    compute_gradients(s, params, grads);
    const std::chrono::duration<double> compute = std::chrono::steady_clock::now() - t0;
    if (!g.allreduce(grads)) continue;  // a member failed: the step was rolled back; redo it
    sgd_step(params, velocity, grads);
    g.end_step(compute.count());  // commit; joins, leaves and re-plans take effect here
  }
  // [loop]
}

// The same loop with in-step work stealing: the members that finish early
// take over the tail of a straggler's slice.
template <class Group>
void train_stealing(Group& g, std::vector<float>& params, std::vector<float>& velocity, std::vector<float>& grads,
                    std::int64_t steps) {
  // [steal]
  while (g.keep_training(steps)) {
    const el::step_info s = g.begin_step();
    const auto t0 = std::chrono::steady_clock::now();
    const ef::plan::epoch_permutation order(dataset_size, seed, static_cast<std::uint64_t>(s.epoch));
    std::fill(grads.begin(), grads.end(), 0.f);
    const auto rep = g.steal_step([&](std::size_t first, std::size_t last) {  // positions in the global batch
      for (std::size_t p = first; p < last; ++p)  // every sample weighs 1 / B_t, whoever processes it
        add_loss_gradient(order(s.cursor + p), params, 1.f / static_cast<float>(s.global_batch), grads);
    });
    const std::chrono::duration<double> compute = std::chrono::steady_clock::now() - t0;
    if (!g.allreduce(grads)) continue;
    sgd_step(params, velocity, grads);
    g.end_step(compute.count(), rep.processed);  // the policy learns from what this member processed
  }
  // [steal]
}

void run(std::int64_t steps, bool steal) {
  std::vector<float> params(features, 0.f), velocity(features, 0.f), grads(features, 0.f);
  // [join]
  el::leave_on_signal(SIGTERM);                                    // SIGTERM: leave at the next step boundary
  el::group_options opts = el::group_options::from_environment();  // EBBFLOW_* settings (docs/elastic.md)
  opts.global_batch = 128;                                         // required: B, samples per step
  opts.dataset_size = dataset_size;                                // required: N, samples per epoch
  el::ucx_network net;
  el::group g([] { return std::make_unique<el::any_store>(el::any_store::from_environment()); }, net, opts,
              ef::launch_info::from_environment(), std::make_unique<el::planner_policy>());
  g.register_state("params", std::as_writable_bytes(std::span(params)));      // what must be equal on every
  g.register_state("velocity", std::as_writable_bytes(std::span(velocity)));  // member: model and optimizer
  // [join]
  if (steal)
    train_stealing(g, params, velocity, grads, steps);
  else
    train(g, params, velocity, grads, steps);
  if (g.active() && g.rank() == 0)
    std::printf("trained %lld steps with %d members\n", static_cast<long long>(g.step()), g.size());
}

}  // namespace

// training_loop [STEPS [steal]]: one worker of a job (under ebbflow-run, or
// with the EBBFLOW_* variables of docs/launcher.md).
int main(int argc, char** argv) try {
  run(argc > 1 ? std::atoll(argv[1]) : 50, argc > 2 && std::string_view(argv[2]) == "steal");
  return 0;
} catch (const ebbflow::system_error& e) {
  std::fprintf(stderr, "training_loop: %s\n", e.what());
  return e.code() == ebbflow::errc::job_finished ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "training_loop: %s\n", e.what());
  return 1;
}
