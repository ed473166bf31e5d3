// SPDX-License-Identifier: Apache-2.0
//! @file index_source.hpp
//! `index_source`: what the prefetcher asks, step by step, for the samples of
//! the global batch and how they are split over this process's local devices.
//! `sequence_source` and `list_source` are simple models for tests,
//! benchmarks and users without a planner. No model here draws from the
//! planner's epoch sampler: write one whose `plan` fills `indices` from the
//! epoch's visiting order (`plan::epoch_permutation`) and `split` from the
//! plan, as `slice_source` in examples/torch_elastic/torch_elastic.cpp does.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/error.hpp>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace prefetch {

//! The plan of one step: the global batch's sample indices, in order, and the
//! per-device sub-batch sizes. Device d receives the `split[d]` samples that
//! follow those of devices 0..d-1 (CPU-centric splitting: the global batch is
//! loaded once and sliced, not loaded by each device).
//! Invariant checked by the prefetcher: sum(split) == indices.size().
struct step_plan {
  std::vector<std::size_t> indices;  //!< sample indices of the global batch
  std::vector<std::size_t> split;    //!< samples per local device
};

//! A source of step plans. `s.plan(step, out)` fills `out` for `step` and
//! returns true, or returns false when there is no such step (end of data).
//! The prefetcher calls it from one thread at a time, with steps 0, 1, 2, ...
//! in increasing order, reusing `out` (so a model can avoid allocations by
//! assigning into it). It may throw; the exception surfaces from
//! `prefetcher::next()` at that step and stops the prefetcher.
template <class S>
concept index_source = requires(S& s, std::uint64_t step, step_plan& out) {
  { s.plan(step, out) } -> std::convertible_to<bool>;
};

//! Samples 0, 1, 2, ... in order; the batch size of each step comes
//! from `batch_size(step)` (which may change every step) and is split over
//! `devices` devices as evenly as possible (the first devices get one more),
//! or by `weights` when given (largest remainder rounding). Ends when fewer
//! samples than the step's batch size remain, or after `steps` steps.
//!
//! The last partial batch is dropped: with 10 samples and batches of 4, steps
//! 0 and 1 serve samples 0-7 and samples 8 and 9 are never served. A first
//! step whose batch is larger than the whole data set is an error (it would
//! serve nothing), not an empty sequence.
class sequence_source {
 public:
  //! Batch size of a step; 0 ends the sequence.
  using batch_size_fn = std::function<std::size_t(std::uint64_t step)>;

  //! @throws std::invalid_argument for 0 devices or a weight vector of the wrong size.
  sequence_source(std::size_t samples, batch_size_fn batch_size, std::size_t devices = 1,
                  std::vector<double> weights = {}, std::uint64_t steps = UINT64_MAX)
      : samples_(samples),
        batch_size_(std::move(batch_size)),
        devices_(devices),
        weights_(std::move(weights)),
        steps_(steps) {
    EBBFLOW_ENFORCE(devices_ > 0, "sequence_source: need at least one device");
    EBBFLOW_ENFORCE(weights_.empty() || weights_.size() == devices_, "sequence_source: one weight per device");
    for (std::size_t d = 0; d < weights_.size(); ++d)
      EBBFLOW_ENFORCE(std::isfinite(weights_[d]) && weights_[d] >= 0, "sequence_source: weight of device "
                                                                          << d << " is " << weights_[d]
                                                                          << " (expected finite and >= 0)");
    EBBFLOW_ENFORCE(static_cast<bool>(batch_size_), "sequence_source: batch_size function is empty");
  }

  //! Fills `out` with the next `batch_size(step)` samples and their split;
  //! false at the end (see above). @throws std::invalid_argument when `step`
  //! is not the next one (steps must be asked for in order, without gaps), or
  //! when step 0's batch is larger than the data set.
  bool plan(std::uint64_t step, step_plan& out) {
    if (step >= steps_) return false;
    if (step != next_step_) {  // only forward, in order (the concept's contract)
      EBBFLOW_ENFORCE(step == next_step_, "sequence_source: steps must be asked for in order");
    }
    const std::size_t b = batch_size_(step);
    EBBFLOW_ENFORCE(step != 0 || b <= samples_, "sequence_source: the batch of step 0 is "
                                                    << b << " samples, more than the data set's " << samples_
                                                    << " (nothing would be served)");
    if (b == 0 || cursor_ + b > samples_) return false;
    out.indices.resize(b);
    for (std::size_t i = 0; i < b; ++i) out.indices[i] = cursor_ + i;
    split(b, out.split);
    cursor_ += b;
    ++next_step_;
    return true;
  }

  //! Per-device sizes for a batch of `b` samples (the rule described above).
  void split(std::size_t b, std::vector<std::size_t>& out) const {
    out.assign(devices_, 0);
    if (weights_.empty()) {
      for (std::size_t d = 0; d < devices_; ++d) out[d] = b / devices_ + (d < b % devices_ ? 1 : 0);
      return;
    }
    double total = 0;
    for (double w : weights_) total += w;
    std::size_t given = 0;
    std::vector<std::pair<double, std::size_t>> rem;
    rem.reserve(devices_);
    for (std::size_t d = 0; d < devices_; ++d) {
      const double exact = total > 0 ? static_cast<double>(b) * weights_[d] / total : 0.0;
      out[d] = static_cast<std::size_t>(exact);
      given += out[d];
      rem.emplace_back(exact - static_cast<double>(out[d]), d);
    }
    std::stable_sort(rem.begin(), rem.end(), [](auto& x, auto& y) { return x.first > y.first; });
    for (std::size_t k = 0; given < b; ++k, ++given) ++out[rem[k % devices_].second];
  }

 private:
  std::size_t samples_;
  batch_size_fn batch_size_;
  std::size_t devices_;
  std::vector<double> weights_;
  std::uint64_t steps_;
  std::size_t cursor_ = 0;
  std::uint64_t next_step_ = 0;
};
static_assert(index_source<sequence_source>);

//! A fixed list of step plans (plan k is step k). Useful in tests.
class list_source {
 public:
  //! The plans, used as given (not validated here; the prefetcher checks them).
  explicit list_source(std::vector<step_plan> plans) : plans_(std::move(plans)) {}
  //! Copies plan `step` into `out`; false when `step` >= the number of plans.
  //! Any order; const, so concurrent calls are safe.
  bool plan(std::uint64_t step, step_plan& out) const {
    if (step >= plans_.size()) return false;
    out = plans_[static_cast<std::size_t>(step)];
    return true;
  }

 private:
  std::vector<step_plan> plans_;
};
static_assert(index_source<list_source>);

}  // namespace prefetch
EBBFLOW_END_NAMESPACE
