// SPDX-License-Identifier: Apache-2.0
// The flags both training examples take, with the same syntax and checks in
// each: the run (--steps, --batch, --lr, --momentum, --seed, --hidden), the
// emulated devices (--sample-us, --step-us, --slowdowns), the outputs
// (--params-out, --reference) and fault injection for the tests (--die-at).
// Shared by the examples; not part of the library.
#pragma once

#include "args.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace training_args {

//! --die-at WORKER:STEP: worker WORKER (EBBFLOW_WORKER_ID) SIGKILLs itself
//! in the middle of step STEP, after its gradient and before the allreduce.
struct die_at {
  long long worker = -1;
  std::int64_t step = -1;
  [[nodiscard]] bool now(long long worker_id, std::int64_t s) const noexcept {
    return worker >= 0 && worker_id == worker && s == step;
  }
};

inline constexpr std::int64_t most_steps = std::int64_t{1} << 40;

//! The shared flags' values. A program sets its defaults before add().
struct values {
  std::int64_t steps = 200;
  std::size_t batch = 64;  //!< global batch: samples per step over all workers
  double lr = 0.05, momentum = 0.9;
  std::uint64_t seed = 1;
  int hidden = 64;
  double sample_us = 0, step_us = 0;  //!< emulated device time per sample / per step (× the slowdown)
  std::vector<double> slowdowns;      //!< worker k is slowdowns[k mod size] times slower (empty: 1)
  std::string params_out;
  bool reference = false;
  die_at die;
};

//! Parses "WORKER:STEP" into `d`; false when it is not two whole integers in range.
inline bool parse_die_at(const std::string& v, die_at& d) {
  const auto colon = v.find(':');
  if (colon == std::string::npos) return false;
  const auto w = cli::parse_number<long long>(std::string_view(v).substr(0, colon), 0, 1 << 20);
  const auto s = cli::parse_number<std::int64_t>(std::string_view(v).substr(colon + 1), 0, most_steps);
  if (!w || !s) return false;
  d = {*w, *s};
  return true;
}

//! Declares the shared flags on `p`, setting `v` (whose values are the defaults the help shows).
inline void add(cli::parser& p, values& v) {
  const auto dflt = [](const auto& x) { return " (default " + cli::show(x) + ")"; };
  p.number("--steps", "N", v.steps, std::int64_t{1}, most_steps, "steps to train" + dflt(v.steps))
      .number("--batch", "B", v.batch, std::size_t{1}, std::size_t{1} << 30,
              "global batch, samples per step over all workers" + dflt(v.batch))
      .number("--lr", "X", v.lr, 0.0, 1e6, "SGD learning rate" + dflt(v.lr))
      .number("--momentum", "X", v.momentum, 0.0, 1.0, "SGD momentum" + dflt(v.momentum))
      .number("--seed", "N", v.seed, std::uint64_t{0}, ~std::uint64_t{0},
              "initial parameters and sample order" + dflt(v.seed))
      .number("--hidden", "N", v.hidden, 1, 1 << 16, "hidden units of the MLP" + dflt(v.hidden))
      .number("--sample-us", "U", v.sample_us, 0.0, 1e9,
              "emulated device time per sample, in microseconds (x the slowdown)")
      .number("--step-us", "U", v.step_us, 0.0, 1e9, "emulated device time per step, in microseconds (x the slowdown)")
      .value("--slowdowns", "F0,F1,..", "factors in [1, 1000], comma-separated",
             [&v](const std::string& t) {
               auto f = cli::parse_numbers(t, 1.0, 1000.0);
               if (f) v.slowdowns = std::move(*f);
               return f.has_value();
             },
             "worker k (EBBFLOW_WORKER_ID) is F[k mod count] times slower\n(EBBFLOW_SLOWDOWN: this worker's factor)")
      .text("--params-out", "FILE", v.params_out, "rank 0 writes the final parameters (float32)")
      .flag("--reference", v.reference, "the same global batches in one process (for checks)")
      .value("--die-at", "W:S", "WORKER:STEP, two integers",
             [&v](const std::string& t) { return parse_die_at(t, v.die); },
             "worker W SIGKILLs itself in the middle of step S (tests)");
}

}  // namespace training_args
