// SPDX-License-Identifier: Apache-2.0
// What bench/compile/compile_bench.py compiles: a user's training loop with
// the elastic group (TCP store, UCX, the planner's policy) around a
// hand-written softmax regression, as one translation unit. It uses only
// names every release since 0.1 has, so the same file times older trees.
#include <ebbflow/elastic/group.hpp>
#include <ebbflow/elastic/planner_policy.hpp>
#include <ebbflow/elastic/store.hpp>
#include <ebbflow/elastic/ucx_network.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <span>
#include <vector>

namespace el = ebbflow::elastic;

int main() {
  constexpr std::size_t features = 64, classes = 10, samples = 4096;
  std::vector<float> x(samples * features), params(features * classes, 0.0f), grads(params.size());
  std::vector<int> y(samples);
  std::mt19937 rng(1);
  std::normal_distribution<float> noise;
  for (std::size_t i = 0; i < samples; ++i) {
    y[i] = static_cast<int>(i % classes);
    for (std::size_t f = 0; f < features; ++f) x[i * features + f] = noise(rng) + (f % classes == i % classes);
  }

  el::group_options opts;
  opts.global_batch = 256;
  opts.dataset_size = samples;
  el::ucx_network net;
  el::group g([] { return std::make_unique<el::store_client>(el::store_client::from_environment()); }, net,
              el::group_options::from_environment(opts), ebbflow::launch_info::from_environment(),
              std::make_unique<el::planner_policy>());
  g.register_state("params", std::as_writable_bytes(std::span(params)));
  const std::int64_t steps = 200;
  while (g.active() && (g.step() < steps || g.changing())) {
    const auto s = g.begin_step();
    const auto t0 = std::chrono::steady_clock::now();
    std::fill(grads.begin(), grads.end(), 0.0f);
    for (std::size_t k = 0; k < s.batch; ++k) {
      const std::size_t i = (s.cursor + s.offset + k) % samples;
      float logits[classes], z = 0;
      for (std::size_t c = 0; c < classes; ++c) {
        logits[c] = 0;
        for (std::size_t f = 0; f < features; ++f) logits[c] += x[i * features + f] * params[f * classes + c];
        z += logits[c] = std::exp(logits[c]);
      }
      for (std::size_t c = 0; c < classes; ++c) {
        const float d = logits[c] / z - (static_cast<int>(c) == y[i] ? 1.0f : 0.0f);
        for (std::size_t f = 0; f < features; ++f)
          grads[f * classes + c] += d * x[i * features + f] / static_cast<float>(s.global_batch);
      }
    }
    const double compute = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!g.allreduce(std::span(grads))) continue;  // a member failed: redo the step
    for (std::size_t j = 0; j < params.size(); ++j) params[j] -= 0.5f * grads[j];
    g.end_step(compute);
  }
  if (g.active()) g.finish();
  std::printf("rank %d: %lld steps, world size %d\n", g.rank(), static_cast<long long>(g.step()), g.size());
}
