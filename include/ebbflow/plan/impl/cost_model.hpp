// SPDX-License-Identifier: Apache-2.0
//! @file impl/cost_model.hpp
//! Definitions for plan/cost_model.hpp.
#pragma once

#include <ebbflow/plan/cost_model.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

EBBFLOW_BEGIN_NAMESPACE
namespace plan {
// The encoded model's fields (worker_models.hpp encodes sets of models with them too).
namespace detail {
inline constexpr std::uint32_t cost_model_magic = 0x4d434245;  // "EBCM"
inline constexpr std::uint32_t cost_model_format = 1;

// Little-endian fields in and out of a byte buffer.
struct model_writer {
  std::vector<std::byte> out;
  void u64(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::byte>(v >> (8 * i)));
  }
  void f64(double v) { u64(std::bit_cast<std::uint64_t>(v)); }
};
struct model_reader {
  std::span<const std::byte> in;
  std::size_t at = 0;
  std::uint64_t u64() {
    EBBFLOW_PLAN_VERIFY(at + 8 <= in.size(), plan_errc::bad_state,
                         "cost model of " << in.size() << " bytes is truncated (field at byte " << at << ")");
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= std::to_integer<std::uint64_t>(in[at + static_cast<std::size_t>(i)]) << (8 * i);
    at += 8;
    return v;
  }
  double f64() { return std::bit_cast<double>(u64()); }
};
}  // namespace detail
}  // namespace plan
EBBFLOW_END_NAMESPACE

// Compiled into ebbflow::compiled in separate compilation (config.hpp).
#if EBBFLOW_HEADER_ONLY
EBBFLOW_BEGIN_NAMESPACE
namespace plan {

EBBFLOW_DECL cost_model::cost_model(cost_model_options opts) noexcept : opts_(opts) {
  opts_.change_window = std::clamp(opts_.change_window, 1u, static_cast<unsigned>(max_window));
  opts_.half_life_steps = std::max(opts_.half_life_steps, 1.0);
  opts_.reject_k = std::max(opts_.reject_k, opts_.huber_k);
  opts_.fast_half_life_steps = std::clamp(opts_.fast_half_life_steps, 1.0, opts_.half_life_steps);
  opts_.change_k = std::clamp(opts_.change_k, opts_.huber_k, opts_.reject_k);
  lambda_ = std::exp2(-1.0 / opts_.half_life_steps);
  lambda_fast_ = std::exp2(-1.0 / opts_.fast_half_life_steps);
}


EBBFLOW_DECL std::vector<std::byte> cost_model::encode() const {
  detail::model_writer w;
  w.u64(std::uint64_t{detail::cost_model_format} << 32 | detail::cost_model_magic);
  for (double v : {opts_.half_life_steps, opts_.huber_k, opts_.reject_k, opts_.change_k, opts_.fast_half_life_steps,
                   opts_.drift_signal, opts_.min_rel_scale, opts_.min_batch_spread, opts_.initial_rel_scale})
    w.f64(v);
  w.u64(opts_.change_window);
  w.u64(opts_.min_slope_samples);
  for (double v : {ew_r_, ew_abs_r_, b0_, w_, wb_, wbb_, wt_, wbt_, a_, c_, shape_a_, shape_c_, scale_}) w.f64(v);
  w.u64(full_fit_ ? 1 : 0);
  w.u64(used_);
  w.u64(outliers_);
  w.u64(changes_);
  w.u64(static_cast<std::uint64_t>(static_cast<std::int64_t>(run_sign_)));
  w.u64(run_);
  w.u64(recent_count_);
  w.u64(recent_head_);
  for (const timing_sample& t : recent_) {
    w.u64(t.batch);
    w.f64(t.seconds);
  }
  return std::move(w.out);
}

EBBFLOW_DECL cost_model cost_model::decode(std::span<const std::byte> bytes) {
  detail::model_reader r{bytes};
  const std::uint64_t head = r.u64();
  EBBFLOW_PLAN_VERIFY(static_cast<std::uint32_t>(head) == detail::cost_model_magic, plan_errc::bad_state,
                       "not an encoded cost model (bad magic)");
  EBBFLOW_PLAN_VERIFY(head >> 32 == detail::cost_model_format, plan_errc::bad_state,
                       "cost model format " << (head >> 32) << ", expected " << detail::cost_model_format);
  cost_model_options o;
  for (double* v : {&o.half_life_steps, &o.huber_k, &o.reject_k, &o.change_k, &o.fast_half_life_steps, &o.drift_signal,
                    &o.min_rel_scale, &o.min_batch_spread, &o.initial_rel_scale}) {
    *v = r.f64();
    EBBFLOW_PLAN_VERIFY(std::isfinite(*v), plan_errc::bad_state, "cost model with an option that is not finite");
  }
  const std::uint64_t window = r.u64(), slope = r.u64();
  EBBFLOW_PLAN_VERIFY(window >= 1 && window <= max_window && slope <= 0xffffffffu, plan_errc::bad_state,
                       "cost model options out of range (change_window " << window << ")");
  o.change_window = static_cast<unsigned>(window);
  o.min_slope_samples = static_cast<unsigned>(slope);
  cost_model m(o);
  // An encoded model's options were clamped when it was made: the same
  // clamping must leave them as they are.
  EBBFLOW_PLAN_VERIFY(m.opts_.half_life_steps == o.half_life_steps && m.opts_.reject_k == o.reject_k &&
                           m.opts_.change_k == o.change_k && m.opts_.fast_half_life_steps == o.fast_half_life_steps,
                       plan_errc::bad_state, "cost model options that no model holds");
  for (double* v : {&m.ew_r_, &m.ew_abs_r_, &m.b0_, &m.w_, &m.wb_, &m.wbb_, &m.wt_, &m.wbt_, &m.a_, &m.c_, &m.shape_a_,
                    &m.shape_c_, &m.scale_}) {
    *v = r.f64();
    EBBFLOW_PLAN_VERIFY(std::isfinite(*v), plan_errc::bad_state, "cost model with a value that is not finite");
  }
  const std::uint64_t full = r.u64();
  EBBFLOW_PLAN_VERIFY(full <= 1, plan_errc::bad_state, "cost model with a bad flag");
  m.full_fit_ = full == 1;
  m.used_ = static_cast<std::size_t>(r.u64());
  m.outliers_ = static_cast<std::size_t>(r.u64());
  m.changes_ = static_cast<std::size_t>(r.u64());
  const auto sign = static_cast<std::int64_t>(r.u64());
  const std::uint64_t run = r.u64(), count = r.u64(), at = r.u64();
  EBBFLOW_PLAN_VERIFY(sign >= -1 && sign <= 1 && run <= max_window && count <= max_window && at < max_window,
                       plan_errc::bad_state, "cost model with a recent-observation ring out of range");
  m.run_sign_ = static_cast<int>(sign);
  m.run_ = static_cast<unsigned>(run);
  m.recent_count_ = static_cast<std::size_t>(count);
  m.recent_head_ = static_cast<std::size_t>(at);
  for (timing_sample& t : m.recent_) {
    t.batch = static_cast<std::size_t>(r.u64());
    t.seconds = r.f64();
    EBBFLOW_PLAN_VERIFY(std::isfinite(t.seconds) && t.seconds >= 0, plan_errc::bad_state,
                         "cost model with a recent step time that is not finite");
  }
  EBBFLOW_PLAN_VERIFY(r.at == bytes.size(), plan_errc::bad_state,
                       "cost model of " << bytes.size() << " bytes, expected " << r.at);
  return m;
}

EBBFLOW_DECL cost_model cost_model::from_probe(std::span<const timing_sample> probe, cost_model_options opts) {
  cost_model m(opts);
  for (const timing_sample& s : probe) {
    EBBFLOW_PLAN_ENFORCE(std::isfinite(s.seconds) && s.seconds > 0, plan_errc::bad_observation,
                         "probe step of batch " << s.batch << " took " << s.seconds << " s");
    // A probe is a short controlled measurement: all of it counts.
    m.add(static_cast<double>(s.batch), s.seconds, 1.0, 1.0);
    m.recent_[m.recent_head_] = s;
    m.recent_head_ = (m.recent_head_ + 1) % max_window;
    m.recent_count_ = std::min(m.recent_count_ + 1, max_window);
    ++m.used_;
  }
  if (m.used_ == 0) return m;
  m.refit(2);  // a controlled probe pins the slope with two batch sizes
  double dev = 0;
  for (const timing_sample& s : probe) dev += std::abs(s.seconds - m.predict(s.batch));
  dev /= static_cast<double>(probe.size());
  // Two points fit exactly: do not trust a zero residual as the noise level.
  const double typical = m.wt_ / m.w_;
  m.scale_ = probe.size() > 2 ? std::max(dev, opts.min_rel_scale * typical) : opts.initial_rel_scale * typical;
  return m;
}

EBBFLOW_DECL void cost_model::add(double b, double t, double weight, double lambda) noexcept {
  if (w_ == 0) b0_ = b;
  const double x = b - b0_;
  w_ = lambda * w_ + weight;
  wb_ = lambda * wb_ + weight * x;
  wbb_ = lambda * wbb_ + weight * x * x;
  wt_ = lambda * wt_ + weight * t;
  wbt_ = lambda * wbt_ + weight * x * t;
}

EBBFLOW_DECL void cost_model::refit(double min_samples) noexcept {
  const double mb = wb_ / w_, mt = wt_ / w_;
  const double var = std::max(wbb_ / w_ - mb * mb, 0.0);
  const double cov = wbt_ / w_ - mb * mt;
  const double mean_b = mb + b0_;
  const double spread = opts_.min_batch_spread * mean_b;
  full_fit_ = false;
  if (var > 0 && var > spread * spread && w_ >= min_samples) {
    double c = cov / var;
    double a = mt - c * mb - c * b0_;
    if (c > 0 && a < 0) {
      // Through the origin: a = 0, c = Σwbt / Σwb² in unshifted terms.
      const double sbt = wbt_ + b0_ * wt_;
      const double sbb = wbb_ + 2 * b0_ * wb_ + b0_ * b0_ * w_;
      a = 0;
      c = sbb > 0 ? sbt / sbb : 0;
    }
    if (c > 0 && std::isfinite(c) && std::isfinite(a)) {
      a_ = a;
      c_ = c;
      shape_a_ = a;
      shape_c_ = c;
      full_fit_ = true;
      return;
    }
  }
  // Slope not identified: keep the shape a : c, fit the common scale.
  const double f = shape_a_ + shape_c_ * mean_b;
  if (f > 0) {
    const double k = mt / f;
    a_ = k * shape_a_;
    c_ = k * shape_c_;
  } else {
    a_ = mt;  // only empty batches seen: they measure a alone
  }
}

EBBFLOW_DECL void cost_model::restart_from_recent() noexcept {
  const double rel = scale_ / std::max(wt_ / w_, std::numeric_limits<double>::min());
  w_ = wb_ = wbb_ = wt_ = wbt_ = 0;
  const std::size_t k = std::min<std::size_t>(opts_.change_window, recent_count_);
  for (std::size_t j = k; j > 0; --j) {
    const timing_sample& s = recent_[(recent_head_ + max_window - j) % max_window];
    add(static_cast<double>(s.batch), s.seconds, 1.0, 1.0);
  }
  // A few points cannot pin the slope: keep the shape, fit the scale.
  refit(opts_.min_slope_samples);
  scale_ = rel * (wt_ / w_);
  ew_r_ = ew_abs_r_ = 0;
}

EBBFLOW_DECL observation_kind cost_model::observe(std::size_t batch, double seconds) {
  EBBFLOW_PLAN_ENFORCE(std::isfinite(seconds) && seconds > 0, plan_errc::bad_observation,
                       "a step of batch " << batch << " took " << seconds << " s");
  recent_[recent_head_] = timing_sample{batch, seconds};
  recent_head_ = (recent_head_ + 1) % max_window;
  recent_count_ = std::min(recent_count_ + 1, max_window);
  const auto b = static_cast<double>(batch);
  if (used_ == 0) {
    add(b, seconds, 1.0, lambda_);
    refit(opts_.min_slope_samples);
    scale_ = opts_.initial_rel_scale * seconds;
    ++used_;
    return observation_kind::accepted;
  }
  const double pred = predict(batch);
  const double r = seconds - pred;
  const double s = std::max(scale_, opts_.min_rel_scale * std::abs(pred));
  const double z = std::abs(r) / s;
  if (z > opts_.change_k) {
    const int sign = r > 0 ? 1 : -1;
    run_ = sign == run_sign_ ? run_ + 1 : 1;
    run_sign_ = sign;
  } else {
    run_ = 0;
    run_sign_ = 0;
  }
  if (run_ >= opts_.change_window) {
    restart_from_recent();
    run_ = 0;
    run_sign_ = 0;
    ++changes_;
    ++used_;
    return observation_kind::change;
  }
  if (z > opts_.reject_k) {
    ++outliers_;
    return observation_kind::outlier;
  }
  // Tracking signal over about the last 7 used observations (Trigg).
  const double rc = std::clamp(r, -opts_.huber_k * s, opts_.huber_k * s);
  ew_r_ = 0.85 * ew_r_ + 0.15 * rc;
  ew_abs_r_ = 0.85 * ew_abs_r_ + 0.15 * std::abs(rc);
  const bool drifting = used_ >= 8 && std::abs(tracking_signal()) > opts_.drift_signal;
  // While drifting, large residuals are the trend, not noise: full weight.
  const double h = z <= opts_.huber_k || drifting ? 1.0 : opts_.huber_k / z;
  add(b, seconds, h, drifting ? lambda_fast_ : lambda_);
  const double alpha = std::max(1.0 / static_cast<double>(used_ + 1), 1.0 - lambda_);
  scale_ = (1 - alpha) * scale_ + alpha * std::min(std::abs(r), opts_.huber_k * s);
  refit(opts_.min_slope_samples);
  ++used_;
  return h == 1.0 ? observation_kind::accepted : observation_kind::downweighted;
}

EBBFLOW_DECL double cost_model::relative_error() const noexcept {
  if (used_ == 0 || w_ <= 0) return std::numeric_limits<double>::infinity();
  const double mean_t = wt_ / w_;
  return 1.25 * scale_ / mean_t / std::sqrt(w_);
}

EBBFLOW_DECL double cost_model::confidence() const noexcept {
  const double e = relative_error();
  if (!std::isfinite(e)) return 0;
  const double q = e / 0.01;
  return 1.0 / (1.0 + q * q);
}

}  // namespace plan
EBBFLOW_END_NAMESPACE
#endif  // EBBFLOW_HEADER_ONLY
