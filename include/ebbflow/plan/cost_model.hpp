// SPDX-License-Identifier: Apache-2.0
//! @file cost_model.hpp
//! Online fit of one worker's step time t(b) = a + c·b from measured
//! (batch size, seconds) pairs.
//!
//! What to measure: the seconds the worker itself spent on the step's compute
//! (data to device, forward, backward, optimizer), *not* the time it waited
//! for slower peers in the allreduce; otherwise every worker looks as slow as
//! the slowest. Every rank must feed identical observations to its copy of a
//! worker's model (e.g. after an allgather of the timings), so that all ranks
//! hold identical models and compute identical plans.
//!
//! How it fits:
//! * exponentially forgetting weighted least squares (half-life
//!   `half_life_steps` observations) over the sufficient statistics, so the
//!   model follows slow drift (thermal throttling) and recovery;
//! * robust: each residual is scaled by a running robust scale (exponentially
//!   weighted mean absolute residual, floored at `min_rel_scale` of the
//!   prediction). Residuals beyond `huber_k` scales are down-weighted (Huber),
//!   beyond `reject_k` scales they are not used at all: an isolated GC pause
//!   or transient straggler does not move the model;
//! * change detector: `change_window` consecutive residuals on the same side
//!   beyond `change_k` scales mean the speed really changed (a neighbour job);
//!   the model restarts from exactly those observations (keeping the shape
//!   a : c, fitting the scale), so a step change is followed after
//!   `change_window` steps;
//! * drift: a tracking signal (exponentially weighted mean of the residuals ÷
//!   that of their absolute values, in [-1, 1]) near ±1 means the model lags
//!   a trend (thermal throttling); while |signal| > `drift_signal` the
//!   forgetting uses the shorter `fast_half_life_steps` and large residuals
//!   keep their full weight;
//! * identifiability: a and c separately need batch sizes that vary. While the
//!   (weighted) batch sizes vary by less than `min_batch_spread` (coefficient
//!   of variation) the model keeps the last known *shape* a : c (from a probe,
//!   an earlier full fit, or a = 0 when nothing is known) and fits only a
//!   common scale factor, which is what a slowdown of the whole device does.
//!
//! Thread safety: none; a value type (copy it freely).
//! Errors: `plan_error(bad_observation)` for NaN, infinite or non-positive seconds;
//! `plan_fault(bad_state)` from `decode` for bytes that are not an encoded model.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/enum_names.hpp>
#include <ebbflow/plan/batch_planner.hpp>
#include <ebbflow/plan/plan_error.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace plan {

//! Tuning of `cost_model`; the defaults suit step-time noise of a few percent.
struct cost_model_options {
  double half_life_steps = 50;      //!< weight of an observation halves after this many newer ones
  double huber_k = 2.5;             //!< residuals beyond this many robust scales are down-weighted
  double reject_k = 6.0;            //!< residuals beyond this many robust scales are ignored
  unsigned change_window = 3;       //!< same-side residuals beyond change_k in a row that mean a real change (1..8)
  double change_k = 4.5;            //!< residual size (robust scales) that counts towards a change
  double fast_half_life_steps = 4;  //!< forgetting used while the residuals show a persistent bias (drift)
  double drift_signal = 0.6;        //!< |tracking signal| above which the fast forgetting applies
  unsigned min_slope_samples = 8;   //!< effective samples needed before a and c are fitted apart
  double min_rel_scale = 0.005;     //!< floor of the robust scale, relative to the prediction
  double min_batch_spread = 0.05;   //!< batch-size coefficient of variation needed to fit a and c apart
  double initial_rel_scale = 0.05;  //!< robust scale assumed before there is data, relative
};

//! What one observation did to the model.
enum class observation_kind {
  accepted,      //!< used with full weight
  downweighted,  //!< used with a Huber weight < 1
  outlier,       //!< ignored (isolated outlier)
  change,        //!< a step change was detected; the model restarted from recent data
};

namespace detail {
inline constexpr auto observation_kind_names =
    make_enum_names(observation_kind::accepted, "accepted", "downweighted", "outlier", "change");
static_assert(observation_kind_names.last() == observation_kind::change);
}  // namespace detail

//! Short stable name of `k` ("accepted", "downweighted", "outlier", "change").
constexpr std::string_view to_string(observation_kind k) noexcept { return detail::observation_kind_names(k); }

//! One measured step: `batch` samples took `seconds`.
struct timing_sample {
  std::size_t batch = 0;  //!< samples in the step
  double seconds = 0;     //!< measured step time (must be finite and > 0)
};

//! Online robust model of one worker's step time. Value type.
class cost_model {
 public:
  //! An empty model (not ready()). Out-of-range options are clamped into
  //! their documented ranges rather than rejected; see `options()`.
  explicit cost_model(cost_model_options opts = {}) noexcept;

  //! A model seeded from a short probe (e.g. a few steps at two or three
  //! batch sizes when the worker joins). With two or more distinct batch
  //! sizes a and c are fitted apart; with one, a = 0 is assumed until the
  //! batch sizes vary. @throws plan_error(bad_observation).
  [[nodiscard]] static cost_model from_probe(std::span<const timing_sample> probe, cost_model_options opts = {});

  //! Feeds one measured step. O(1), no allocation. @throws plan_error(bad_observation).
  observation_kind observe(std::size_t batch, double seconds);

  //! True once at least one observation was used.
  [[nodiscard]] bool ready() const noexcept { return used_ > 0; }
  //! Fixed seconds per step (0 before ready()).
  [[nodiscard]] double a() const noexcept { return a_; }
  //! Seconds per sample (0 before ready()).
  [[nodiscard]] double c() const noexcept { return c_; }
  //! a + c·b.
  [[nodiscard]] double predict(std::size_t batch) const noexcept { return a_ + c_ * static_cast<double>(batch); }
  //! Sum of the (forgotten, Huber) weights now in the fit: the number of
  //! equivalent fresh observations behind it.
  [[nodiscard]] double effective_samples() const noexcept { return w_; }
  //! Estimated relative standard error of predict() at the recent batch
  //! sizes: 1.25·scale / prediction / sqrt(effective_samples) (1.25 turns a
  //! mean absolute deviation into a standard deviation). +inf before ready().
  [[nodiscard]] double relative_error() const noexcept;
  //! Confidence in [0, 1): 1 / (1 + (relative_error / 1 %)^2); 0.5 means the
  //! prediction is good to about 1 %.
  [[nodiscard]] double confidence() const noexcept;
  //! True when the batch sizes in the fit vary enough to separate a from c.
  [[nodiscard]] bool slope_identified() const noexcept { return full_fit_; }
  //! Observations used so far (accepted or down-weighted, plus restarts).
  [[nodiscard]] std::size_t observations() const noexcept { return used_; }
  //! Observations ignored as outliers so far.
  [[nodiscard]] std::size_t outliers() const noexcept { return outliers_; }
  //! Step changes detected so far.
  [[nodiscard]] std::size_t changes() const noexcept { return changes_; }
  //! Tracking signal in [-1, 1]: persistent bias of the recent residuals.
  [[nodiscard]] double tracking_signal() const noexcept { return ew_abs_r_ > 0 ? ew_r_ / ew_abs_r_ : 0; }
  //! Robust residual scale in seconds.
  [[nodiscard]] double scale() const noexcept { return scale_; }

  //! The planner's view of this worker: {id, a, c, max_batch, min_batch, comm_s}.
  //! Before ready() this has c = 0 and is rejected by the planner (bad_cost),
  //! so a worker without a model cannot be planned by accident.
  [[nodiscard]] worker_spec spec(std::uint64_t id, std::size_t max_batch, std::size_t min_batch = 0,
                                 double comm_s = 0) const noexcept {
    return worker_spec{id, a_, c_, max_batch, min_batch, comm_s};
  }

  //! The options in effect, after clamping.
  [[nodiscard]] const cost_model_options& options() const noexcept { return opts_; }

  //! The whole model (options, fit, recent observations) as bytes, for
  //! `decode` on another worker: a worker that joins a loop without the
  //! elastic group takes the others' models and so makes the same plans.
  //! Little endian, with a magic and a format version; 392 bytes.
  [[nodiscard]] std::vector<std::byte> encode() const;
  //! The model `encode` wrote, bit for bit.
  //! @throws plan_fault(bad_state) for bytes that are truncated, corrupt or of another format.
  [[nodiscard]] static cost_model decode(std::span<const std::byte> bytes);

 private:
  static constexpr std::size_t max_window = 8;
  void add(double b, double t, double weight, double lambda) noexcept;
  void refit(double min_samples) noexcept;
  void restart_from_recent() noexcept;

  cost_model_options opts_;
  double lambda_;                   // per-observation forgetting factor
  double lambda_fast_;              // forgetting while drifting
  double ew_r_ = 0, ew_abs_r_ = 0;  // tracking signal state
  // Weighted sufficient statistics, batch sizes shifted by b0_ against cancellation.
  double b0_ = 0, w_ = 0, wb_ = 0, wbb_ = 0, wt_ = 0, wbt_ = 0;
  double a_ = 0, c_ = 0;
  double shape_a_ = 0, shape_c_ = 1;  // a : c kept while the slope is not identified
  bool full_fit_ = false;
  double scale_ = 0;
  std::size_t used_ = 0, outliers_ = 0, changes_ = 0;
  int run_sign_ = 0;
  unsigned run_ = 0;
  std::array<timing_sample, max_window> recent_{};  // ring of the last observations
  std::size_t recent_count_ = 0, recent_head_ = 0;
};

}  // namespace plan
EBBFLOW_END_NAMESPACE

#include <ebbflow/plan/impl/cost_model.hpp>
