// SPDX-License-Identifier: Apache-2.0
//! @file impl/batch_planner.hpp
//! Definitions for plan/batch_planner.hpp.
//!
//! How `solve` is exact. Write K = B − Σ lo_i and call the values
//! t_i(lo_i+1), ..., t_i(m_i) worker i's increments; they are non-decreasing
//! in b. Any split takes a prefix of each worker's increments, K in total, and
//! its step time is max(T_lo, largest increment taken) with T_lo = max_i
//! t_i(lo_i). Taking the K smallest increments therefore minimises the step
//! time, and taking them in (value, rank) order makes the choice unique.
//!
//! Finding them fast: a safeguarded Newton iteration solves the continuous
//! relaxation Σ clamp((S − a_i)/c_i, lo_i, m_i) = B for a level S (a few
//! O(n) passes; the function is monotone and piecewise linear). The level set
//! {increments <= S} is a downward-closed prefix of the (value, rank) order
//! whose size is within about n of K. A heap then adds the next-smallest
//! increments (or removes the largest ones) one at a time until exactly K are
//! taken: the result is the K-prefix of the order whatever S was, so rounding
//! in the Newton step never changes the plan, only the amount of heap work.
#pragma once

#include <ebbflow/core/error.hpp>  // EBBFLOW_EXPECTS
#include <ebbflow/plan/batch_planner.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

// Compiled into ebbflow::compiled in separate compilation (config.hpp).
#if EBBFLOW_HEADER_ONLY
EBBFLOW_BEGIN_NAMESPACE
namespace plan {

EBBFLOW_DECL double batch_plan::weight(std::size_t rank) const {
  EBBFLOW_PLAN_ENFORCE(rank < batch.size(), plan_errc::bad_rank,
                       "rank " << rank << " outside a plan of " << batch.size() << " workers");
  return static_cast<double>(batch[rank]) / static_cast<double>(global_batch);
}

EBBFLOW_DECL std::vector<double> batch_plan::weights() const {
  std::vector<double> w(batch.size());
  for (std::size_t r = 0; r < batch.size(); ++r)
    w[r] = static_cast<double>(batch[r]) / static_cast<double>(global_batch);
  return w;
}

EBBFLOW_DECL std::size_t batch_plan::rank_of(std::uint64_t id) const noexcept {
  auto it = std::find(worker_ids.begin(), worker_ids.end(), id);
  return static_cast<std::size_t>(it - worker_ids.begin());
}

EBBFLOW_DECL void validate(std::span<const worker_spec> workers) {
  EBBFLOW_PLAN_ENFORCE(!workers.empty(), plan_errc::empty_membership, "the membership has no workers");
  for (const worker_spec& w : workers) {
    // 1 / c must be finite too: the solver divides by c (a subnormal c gave a
    // NaN level and a search one sample at a time).
    EBBFLOW_PLAN_ENFORCE_W(std::isfinite(w.c) && w.c > 0 && std::isfinite(1.0 / w.c), plan_errc::bad_cost, w.id,
                           "seconds per sample c = " << w.c << " must be finite and > 0 (and 1 / c finite)");
    EBBFLOW_PLAN_ENFORCE_W(std::isfinite(w.a) && w.a >= 0, plan_errc::bad_cost, w.id,
                           "fixed seconds a = " << w.a << " must be finite and >= 0");
    EBBFLOW_PLAN_ENFORCE_W(std::isfinite(w.comm_s) && w.comm_s >= 0, plan_errc::bad_cost, w.id,
                           "communication seconds comm_s = " << w.comm_s << " must be finite and >= 0");
    EBBFLOW_PLAN_ENFORCE_W(w.min_batch <= w.max_batch, plan_errc::bad_bounds, w.id,
                           "min_batch " << w.min_batch << " > max_batch " << w.max_batch);
  }
  bool increasing = true;  // the common case needs no sort
  for (std::size_t i = 1; i < workers.size() && increasing; ++i) increasing = workers[i - 1].id < workers[i].id;
  if (!increasing) {
    std::vector<std::uint64_t> ids(workers.size());
    for (std::size_t i = 0; i < workers.size(); ++i) ids[i] = workers[i].id;
    std::sort(ids.begin(), ids.end());
    auto dup = std::adjacent_find(ids.begin(), ids.end());
    EBBFLOW_PLAN_ENFORCE_W(dup == ids.end(), plan_errc::duplicate_worker, (dup == ids.end() ? 0 : *dup),
                           "appears more than once in the membership");
  }
}

namespace detail {
EBBFLOW_DECL std::size_t saturating_add(std::size_t x, std::size_t y) noexcept {
  return x > std::numeric_limits<std::size_t>::max() - y ? std::numeric_limits<std::size_t>::max() : x + y;
}

//! A plan's step time `t`, or NaN when a placeholder model made it.
inline double known_step_time(std::span<const worker_spec> workers, double t) noexcept {
  for (const auto& w : workers)
    if (w.placeholder) return std::numeric_limits<double>::quiet_NaN();
  return t;
}

//! Largest b in [lo, m] with w.step_time(b) <= s; requires w.step_time(lo) <= s.
EBBFLOW_DECL std::size_t level_count(const worker_spec& w, double inv_c, std::size_t lo, std::size_t m, double s) noexcept {
  double x = (s - (w.a + w.comm_s)) * inv_c;
  std::size_t g = !(x > static_cast<double>(lo)) ? lo : x >= static_cast<double>(m) ? m : static_cast<std::size_t>(x);
  // The division above is within an ulp or two of the truth; step towards
  // the exact answer, which is defined by step_time alone.
  for (int k = 0; k < 4 && g < m && w.step_time(g + 1) <= s; ++k) ++g;
  for (int k = 0; k < 4 && g > lo && w.step_time(g) > s; ++k) --g;
  if (w.step_time(g) <= s && (g == m || w.step_time(g + 1) > s)) return g;
  std::size_t lo_b = lo, hi_b = m;  // invariant: step_time(lo_b) <= s; answer in [lo_b, hi_b]
  while (lo_b < hi_b) {
    std::size_t mid = lo_b + (hi_b - lo_b + 1) / 2;
    if (w.step_time(mid) <= s)
      lo_b = mid;
    else
      hi_b = mid - 1;
  }
  return lo_b;
}

struct increment {
  double value;
  std::size_t rank;
};

//! The relaxed counts at a level s: Σ clamp((s − base_i)/c_i, lo_i, hi_i),
//! each term whole (floored) or not, and the sum's slope in s.
struct level_sums {
  std::span<const double> base, inv_c, lo, hi;

  double operator()(double s, bool whole, double& slope) const noexcept {
    double sum = 0;
    slope = 0;
    for (std::size_t i = 0; i < base.size(); ++i) {
      const double x = (s - base[i]) * inv_c[i];
      if (x <= lo[i]) {
        sum += lo[i];
      } else if (x >= hi[i]) {
        sum += hi[i];
      } else {
        sum += whole ? std::floor(x) : x;
        slope += inv_c[i];
      }
    }
    return sum;
  }
};

//! A level in [lo_s, hi_s] whose whole counts sum to within a handful of B.
//! A safeguarded Newton iteration solves the continuous relaxation (its
//! sum is monotone and piecewise linear in the level); whole samples under
//! that level fall short of it by the fractional parts (about n/2 in
//! total), and a few secant steps on the whole counts shrink that gap, so
//! the repair after it does O(few log n) work instead of O(n log n).
EBBFLOW_DECL double search_level(const level_sums& sums, double B, double lo_s, double hi_s, double start) noexcept {
  const double bracket_lo = lo_s, bracket_hi = hi_s;
  double s = std::clamp(start, lo_s, hi_s), slope = 0;
  for (int it = 0; it < 200; ++it) {
    const double f = sums(s, false, slope) - B;
    if (std::abs(f) < 0.5) break;
    if (f < 0)
      lo_s = s;
    else
      hi_s = s;
    double next = slope > 0 ? s - f / slope : std::numeric_limits<double>::quiet_NaN();
    if (!(next > lo_s && next < hi_s)) next = lo_s + 0.5 * (hi_s - lo_s);
    if (next == s || !(hi_s > lo_s)) break;
    s = next;
  }
  for (int it = 0; it < 6; ++it) {
    const double gap = B - sums(s, true, slope);
    if (std::abs(gap) <= 8 || slope <= 0) break;
    s = std::clamp(s + gap / slope, bracket_lo, bracket_hi);
  }
  return s;
}

//! Moves the counts to exactly B samples in all along the (value, rank)
//! order of increments: adds the smallest next increments while short
//! (Add), takes back the largest taken ones while over (!Add).
template <bool Add>
void take_exactly(std::span<const worker_spec> workers, std::span<const std::size_t> hi,
                  std::vector<std::size_t>& batch, std::size_t taken, std::size_t B) {
  auto less = [](const increment& x, const increment& y) {
    return x.value < y.value || (x.value == y.value && x.rank < y.rank);
  };
  // std::pop_heap yields the greatest under `later`: the smallest increment
  // when adding, the largest when taking back.
  auto later = [&](const increment& x, const increment& y) { return Add ? less(y, x) : less(x, y); };
  auto movable = [&](std::size_t i) { return Add ? batch[i] < hi[i] : batch[i] > workers[i].min_batch; };
  auto next = [&](std::size_t i) { return increment{workers[i].step_time(Add ? batch[i] + 1 : batch[i]), i}; };
  std::vector<increment> heap;
  heap.reserve(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i)
    if (movable(i)) heap.push_back(next(i));
  std::make_heap(heap.begin(), heap.end(), later);
  for (; taken != B; Add ? ++taken : --taken) {
    EBBFLOW_EXPECTS(!heap.empty());
    std::pop_heap(heap.begin(), heap.end(), later);
    const std::size_t i = heap.back().rank;
    heap.pop_back();
    Add ? ++batch[i] : --batch[i];
    if (movable(i)) {
      heap.push_back(next(i));
      std::push_heap(heap.begin(), heap.end(), later);
    }
  }
}
}  // namespace detail

EBBFLOW_DECL batch_plan solve(std::span<const worker_spec> workers, std::size_t global_batch, std::uint64_t version) {
  validate(workers);
  EBBFLOW_PLAN_ENFORCE(global_batch > 0, plan_errc::zero_batch, "global batch must be at least 1");
  // Counts and levels go through doubles: beyond 2^53 samples they are no
  // longer exact (and n counts near B could overflow their sum).
  EBBFLOW_PLAN_ENFORCE(global_batch <= (std::size_t{1} << 53), plan_errc::infeasible,
                       "global batch " << global_batch << " above 2^53 samples");
  const std::size_t n = workers.size();
  const std::size_t B = global_batch;

  std::size_t sum_max = 0, sum_min = 0;
  for (const worker_spec& w : workers) {
    sum_max = detail::saturating_add(sum_max, w.max_batch);
    sum_min = detail::saturating_add(sum_min, w.min_batch);
  }
  EBBFLOW_PLAN_ENFORCE(sum_max >= B, plan_errc::infeasible, "sum of max_batch " << sum_max << " < global batch " << B);
  EBBFLOW_PLAN_ENFORCE(sum_min <= B, plan_errc::infeasible, "sum of min_batch " << sum_min << " > global batch " << B);

  // Caps above B never bind; clamping keeps every count below B (no overflow).
  std::vector<std::size_t> hi(n);
  std::vector<double> inv_c(n), base(n), lo_d(n), hi_d(n);
  double t_lo = -std::numeric_limits<double>::infinity();
  double t_hi = -std::numeric_limits<double>::infinity();
  double t_min = std::numeric_limits<double>::infinity();  // the fastest minimum step
  double num = static_cast<double>(B), den = 0;            // the level where no bound binds
  for (std::size_t i = 0; i < n; ++i) {
    hi[i] = std::min(workers[i].max_batch, B);
    inv_c[i] = 1.0 / workers[i].c;
    base[i] = workers[i].a + workers[i].comm_s;
    lo_d[i] = static_cast<double>(workers[i].min_batch);
    hi_d[i] = static_cast<double>(hi[i]);
    t_lo = std::max(t_lo, workers[i].step_time(workers[i].min_batch));
    t_min = std::min(t_min, workers[i].step_time(workers[i].min_batch));
    t_hi = std::max(t_hi, workers[i].step_time(hi[i]));
    num += base[i] * inv_c[i];
    den += inv_c[i];
  }

  const detail::level_sums sums{base, inv_c, lo_d, hi_d};
  double slope = 0;
  const double f = sums(t_lo, false, slope) - static_cast<double>(B);
  // The level is in [t_lo, t_hi] when the slowest minimum step leaves room
  // (f < 0); else in [t_min, t_lo]: a worker with a large fixed cost sets
  // t_lo, and the others' counts at t_lo may sum far past B, which the
  // repair would take back one sample at a time (O(B)).
  const double level = f == 0  ? t_lo
                       : f < 0 ? detail::search_level(sums, static_cast<double>(B), t_lo, t_hi, num / den)
                               : detail::search_level(sums, static_cast<double>(B), t_min, t_lo, num / den);

  batch_plan p;
  p.version = version;
  p.global_batch = B;
  p.batch.resize(n);
  std::size_t taken = 0;
  for (std::size_t i = 0; i < n; ++i) {
    p.batch[i] = detail::level_count(workers[i], inv_c[i], workers[i].min_batch, hi[i], level);
    taken = detail::saturating_add(taken, p.batch[i]);
  }
  // Integer repair: reach exactly B along the (value, rank) order.
  if (taken < B)
    detail::take_exactly<true>(workers, hi, p.batch, taken, B);
  else if (taken > B)
    detail::take_exactly<false>(workers, hi, p.batch, taken, B);

  p.worker_ids.resize(n);
  p.offsets.resize(n + 1);
  p.offsets[0] = 0;
  double t = -std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < n; ++i) {
    p.worker_ids[i] = workers[i].id;
    p.offsets[i + 1] = p.offsets[i] + p.batch[i];
    t = std::max(t, workers[i].step_time(p.batch[i]));
  }
  p.step_time = detail::known_step_time(workers, t);
  return p;
}

EBBFLOW_DECL double predict_step_time(const batch_plan& plan, std::span<const worker_spec> workers) {
  EBBFLOW_PLAN_ENFORCE(
      plan.size() == workers.size(), plan_errc::membership_mismatch,
      "plan v" << plan.version << " has " << plan.size() << " workers, models have " << workers.size());
  double t = -std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < workers.size(); ++i) {
    EBBFLOW_PLAN_ENFORCE_W(
        plan.worker_ids[i] == workers[i].id, plan_errc::membership_mismatch, workers[i].id,
        "is at rank " << i << " but plan v" << plan.version << " has worker " << plan.worker_ids[i] << " there");
    t = std::max(t, workers[i].step_time(plan.batch[i]));
  }
  return t;
}

EBBFLOW_DECL batch_plan make_plan(std::span<const worker_spec> workers, std::span<const std::size_t> sizes,
                            std::uint64_t version) {
  validate(workers);
  EBBFLOW_PLAN_ENFORCE(sizes.size() == workers.size(), plan_errc::membership_mismatch,
                       sizes.size() << " sizes for " << workers.size() << " workers");
  batch_plan p;
  p.version = version;
  p.batch.assign(sizes.begin(), sizes.end());
  p.worker_ids.resize(workers.size());
  p.offsets.resize(workers.size() + 1);
  p.offsets[0] = 0;
  double t = -std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < workers.size(); ++i) {
    EBBFLOW_PLAN_ENFORCE_W(
        sizes[i] >= workers[i].min_batch && sizes[i] <= workers[i].max_batch, plan_errc::infeasible, workers[i].id,
        "batch " << sizes[i] << " outside [" << workers[i].min_batch << ", " << workers[i].max_batch << "]");
    p.worker_ids[i] = workers[i].id;
    p.offsets[i + 1] = p.offsets[i] + sizes[i];
    t = std::max(t, workers[i].step_time(sizes[i]));
  }
  p.global_batch = p.offsets.back();
  EBBFLOW_PLAN_ENFORCE(p.global_batch > 0, plan_errc::zero_batch, "the sizes sum to 0");
  p.step_time = detail::known_step_time(workers, t);
  return p;
}

}  // namespace plan
EBBFLOW_END_NAMESPACE
#endif  // EBBFLOW_HEADER_ONLY
