// SPDX-License-Identifier: Apache-2.0
//! @file impl/work_stealing.hpp
//! Definitions for plan/work_stealing.hpp.
#pragma once

#include <ebbflow/plan/work_stealing.hpp>

#include <algorithm>
#include <cmath>
#include <utility>

EBBFLOW_BEGIN_NAMESPACE
namespace plan {
namespace detail {
//! The owner count lives in bits 32..62 of the counter, the thief count in bits 0..31.
inline constexpr std::int64_t owner_unit = std::int64_t{1} << 32;
inline constexpr std::uint64_t thief_mask = (std::uint64_t{1} << 32) - 1;

//! ceil(a / b) for b >= 1 without overflow.
constexpr std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) noexcept { return a / b + (a % b != 0); }

//! The items a claim of `request` is granted, given the state just before it:
//! the owner [F, F + g), a thief [n − K − g, n − K), g = min(request, remaining).
inline chunk grant(std::size_t rank, const slice_state& before, std::uint64_t request, bool from_back) noexcept {
  const std::uint64_t g = std::min(request, before.remaining());
  if (g == 0) return chunk{rank, 0, 0, from_back};
  if (from_back) return chunk{rank, before.size - before.back - g, before.size - before.back, true};
  return chunk{rank, before.front, before.front + g, false};
}
}  // namespace detail

// Compiled into ebbflow::compiled in separate compilation (config.hpp).
#if EBBFLOW_HEADER_ONLY
EBBFLOW_DECL void validate(const steal_options& o) {
  EBBFLOW_PLAN_ENFORCE(std::isfinite(o.first_fraction) && o.first_fraction > 0 && o.first_fraction <= 1,
                       plan_errc::bad_steal_request, "first_fraction " << o.first_fraction << " outside (0, 1]");
  EBBFLOW_PLAN_ENFORCE(o.owner_divisor >= 1, plan_errc::bad_steal_request, "owner_divisor 0");
  EBBFLOW_PLAN_ENFORCE(std::isfinite(o.tail_reserve) && o.tail_reserve >= 0 && o.tail_reserve < 1,
                       plan_errc::bad_steal_request, "tail_reserve " << o.tail_reserve << " outside [0, 1)");
  EBBFLOW_PLAN_ENFORCE(o.thief_divisor >= 1, plan_errc::bad_steal_request, "thief_divisor 0");
  EBBFLOW_PLAN_ENFORCE(o.min_chunk >= 1, plan_errc::bad_steal_request, "min_chunk 0");
  EBBFLOW_PLAN_ENFORCE(o.timeout.count() > 0, plan_errc::bad_steal_request,
                       "timeout " << o.timeout.count() << " ms is not positive");
}

EBBFLOW_DECL std::uint64_t owner_request(const steal_options& o, std::uint64_t size, std::uint64_t front, std::uint64_t cap) {
  if (front >= size) return 0;
  const std::uint64_t rest = size - front;
  // The tail reserve is at least one smallest chunk (a smaller one could not be split).
  const std::uint64_t reserve =
      o.tail_reserve > 0
          ? std::max(static_cast<std::uint64_t>(std::ceil(o.tail_reserve * static_cast<double>(size))), o.min_chunk)
          : 0;
  std::uint64_t q = front == 0 ? static_cast<std::uint64_t>(std::ceil(o.first_fraction * static_cast<double>(size)))
                    : reserve > 0 && rest > reserve ? rest - reserve
                                                    : detail::ceil_div(rest, o.owner_divisor);
  // min_chunk wins over cap: it is the smallest chunk worth its overhead.
  q = std::max(std::min(q, cap), o.min_chunk);
  // Never leave a remainder smaller than min_chunk: it would cost a whole
  // chunk's overhead for less than a chunk's worth of work. Unless the cap
  // is short of the rest by more than that (a paced straggler leaves its
  // tail to thieves; an owner on plan is only a little short).
  if (q >= rest || (rest - q < o.min_chunk && (cap >= rest || rest - cap < o.min_chunk))) return rest;
  return q;
}

EBBFLOW_DECL std::uint64_t thief_request(const steal_options& o, std::uint64_t remaining, std::uint64_t cap) {
  if (remaining == 0) return 0;
  const std::uint64_t q = std::max(std::min(detail::ceil_div(remaining, o.thief_divisor), cap), o.min_chunk);
  return std::min(q, remaining);
}

EBBFLOW_DECL std::uint64_t paced_owner_cap(double planned_s, double elapsed_s, double s_per_item) noexcept {
  if (!(s_per_item > 0) || !std::isfinite(s_per_item)) return std::numeric_limits<std::uint64_t>::max();
  const double left = (planned_s - elapsed_s) / s_per_item;
  if (!(left >= 1)) return 1;
  if (left >= 9e18) return std::numeric_limits<std::uint64_t>::max();
  return static_cast<std::uint64_t>(left);
}

EBBFLOW_DECL std::uint64_t balanced_steal(std::uint64_t remaining, double victim_s, double thief_s,
                                    double overhead_s) noexcept {
  if (remaining == 0 || !(victim_s > 0) || !(thief_s > 0)) return 0;
  const double g = (static_cast<double>(remaining) * victim_s - std::max(overhead_s, 0.0)) / (thief_s + victim_s);
  if (!(g >= 1)) return 0;
  return std::min(remaining, static_cast<std::uint64_t>(g));
}

EBBFLOW_DECL std::uint64_t fair_steal_cap(std::uint64_t total_remaining, double fleet_items_per_s, double thief_s) noexcept {
  if (total_remaining == 0) return 0;
  if (!(fleet_items_per_s > 0) || !(thief_s > 0)) return total_remaining;
  const double g = static_cast<double>(total_remaining) / fleet_items_per_s / thief_s;
  if (!(g >= 1)) return 1;
  return std::min(total_remaining, static_cast<std::uint64_t>(g));
}

#endif  // EBBFLOW_HEADER_ONLY

template <counter_store Store>
work_stealer<Store>::work_stealer(Store& store, std::string prefix, step_id id,
                                  std::span<const std::size_t> slice_sizes, std::size_t rank, steal_options opts)
    : store_(&store), opts_(opts), rank_(rank) {
  validate(opts_);
  EBBFLOW_PLAN_ENFORCE(!slice_sizes.empty(), plan_errc::empty_membership, "no slices to steal from");
  EBBFLOW_PLAN_ENFORCE(rank < slice_sizes.size(), plan_errc::bad_rank,
                       "rank " << rank << " outside a step of " << slice_sizes.size() << " slices");
  size_.reserve(slice_sizes.size());
  for (std::size_t r = 0; r < slice_sizes.size(); ++r) {
    EBBFLOW_PLAN_ENFORCE_W(slice_sizes[r] <= max_slice_items, plan_errc::slice_too_large, r,
                           "slice of " << slice_sizes[r] << " items exceeds " << max_slice_items
                                       << " (2^31 - 1): its claim counter would overflow");
    size_.push_back(slice_sizes[r]);
  }
  seen_.resize(size_.size());
  exhausted_.assign(size_.size(), 0);
  for (std::size_t r = 0; r < size_.size(); ++r) {
    seen_[r].size = size_[r];
    exhausted_[r] = size_[r] == 0;
  }
  own_done_ = exhausted_[rank_] != 0;
  prefix_ = std::move(prefix) + "/" + std::to_string(id.generation) + "/" + std::to_string(id.step) + "/";
}

template <counter_store Store>
std::string work_stealer<Store>::key(std::size_t r) const {
  EBBFLOW_PLAN_ENFORCE(r < size_.size(), plan_errc::bad_rank, "rank " << r << " outside " << size_.size() << " slices");
  return prefix_ + std::to_string(r);
}

template <counter_store Store>
slice_state work_stealer<Store>::decode(std::size_t r, std::int64_t after, std::int64_t delta) const {
  // `after - delta` is the exact value just before this add. Both fields are
  // bounded (file comment), so any other value means the key was written by
  // something that is not this protocol (a reused key, a corrupt store).
  const std::int64_t before = after - delta;
  EBBFLOW_PLAN_VERIFY_W(before >= 0 && after >= 0, plan_errc::bad_counter, r,
                         "counter '" << key(r) << "' reads " << after << " after adding " << delta << " (negative)");
  const auto b = static_cast<std::uint64_t>(before);
  slice_state s{size_[r], b >> 32, b & detail::thief_mask};
  EBBFLOW_PLAN_VERIFY_W(s.front <= s.size, plan_errc::bad_counter, r,
                         "counter '" << key(r) << "' has owner count " << s.front << " > slice size " << s.size);
  return s;
}

template <counter_store Store>
chunk work_stealer<Store>::claim_own(std::uint64_t cap) {
  EBBFLOW_PLAN_ENFORCE(cap >= 1, plan_errc::bad_steal_request, "claim_own with cap 0");
  if (own_done_) return chunk{rank_, 0, 0, false};
  // The owner is the only writer of F, so seen_.front is exact and the request
  // never takes F beyond the slice.
  const std::uint64_t q = owner_request(opts_, size_[rank_], seen_[rank_].front, cap);
  const std::int64_t delta = static_cast<std::int64_t>(q) * detail::owner_unit;
  const std::int64_t after = store_->add(key(rank_), delta, deadline::after(opts_.timeout));
  ++calls_;
  const slice_state before = decode(rank_, after, delta);
  const chunk c = detail::grant(rank_, before, q, false);
  seen_[rank_] = slice_state{size_[rank_], before.front + q, before.back};
  if (c.size() < q || seen_[rank_].exhausted()) {
    own_done_ = true;
    exhausted_[rank_] = 1;
  }
  processed_ += c.size();
  return c;
}

template <counter_store Store>
slice_state work_stealer<Store>::peek(std::size_t r) {
  EBBFLOW_PLAN_ENFORCE(r < size_.size(), plan_errc::bad_rank, "rank " << r << " outside " << size_.size() << " slices");
  if (size_[r] == 0) return seen_[r];
  const std::int64_t after = store_->add(key(r), 0, deadline::after(opts_.timeout));
  ++calls_;
  seen_[r] = decode(r, after, 0);
  if (seen_[r].exhausted()) exhausted_[r] = 1;
  if (r == rank_ && exhausted_[r]) own_done_ = true;
  return seen_[r];
}

template <counter_store Store>
std::size_t work_stealer<Store>::peek_others() {
  std::vector<std::size_t> which;
  for (std::size_t r = 0; r < size_.size(); ++r)
    if (r != rank_ && !exhausted_[r]) which.push_back(r);
  if (which.empty()) return 0;
  if constexpr (batch_counter_store<Store>) {
    std::vector<std::string> keys;
    keys.reserve(which.size());
    for (std::size_t r : which) keys.push_back(key(r));
    const std::vector<std::int64_t> zeros(which.size(), 0);
    const std::vector<std::int64_t> after = store_->add_many(
        std::span<const std::string>(keys), std::span<const std::int64_t>(zeros), deadline::after(opts_.timeout));
    ++calls_;
    EBBFLOW_PLAN_VERIFY(after.size() == which.size(), plan_errc::bad_counter,
                         "store answered " << after.size() << " of " << which.size() << " batched reads");
    for (std::size_t k = 0; k < which.size(); ++k) {
      const std::size_t r = which[k];
      seen_[r] = decode(r, after[k], 0);
      if (seen_[r].exhausted()) exhausted_[r] = 1;
    }
  } else {
    for (std::size_t r : which) (void)peek(r);
  }
  return which.size();
}

template <counter_store Store>
chunk work_stealer<Store>::steal_from(std::size_t victim, std::uint64_t request) {
  EBBFLOW_PLAN_ENFORCE(victim < size_.size(), plan_errc::bad_rank,
                       "victim " << victim << " outside " << size_.size() << " slices");
  EBBFLOW_PLAN_ENFORCE(victim != rank_, plan_errc::bad_steal_request,
                       "rank " << rank_ << " cannot steal from its own slice (use claim_own)");
  EBBFLOW_PLAN_ENFORCE(request >= 1, plan_errc::bad_steal_request, "steal of 0 items");
  if (exhausted_[victim]) return chunk{victim, 0, 0, true};
  // Clamp to what was last seen remaining (never more than the slice) and to
  // the per-claim limit: this is what bounds K below 2^32.
  const std::uint64_t q =
      std::min({request, seen_[victim].remaining(), thief_request_limit(size_[victim], size_.size())});
  if (q == 0) {
    exhausted_[victim] = 1;
    return chunk{victim, 0, 0, true};
  }
  const std::int64_t delta = static_cast<std::int64_t>(q);
  const std::int64_t after = store_->add(key(victim), delta, deadline::after(opts_.timeout));
  ++calls_;
  const slice_state before = decode(victim, after, delta);
  const chunk c = detail::grant(victim, before, q, true);
  seen_[victim] = slice_state{size_[victim], before.front, before.back + q};
  if (c.size() < q || seen_[victim].exhausted()) exhausted_[victim] = 1;
  processed_ += c.size();
  stolen_ += c.size();
  return c;
}

template <counter_store Store>
chunk work_stealer<Store>::steal(std::uint64_t cap) {
  EBBFLOW_PLAN_ENFORCE(cap >= 1, plan_errc::bad_steal_request, "steal with cap 0");
  for (;;) {
    (void)peek_others();
    std::size_t best = size_.size();
    std::uint64_t most = 0;
    for (std::size_t r = 0; r < size_.size(); ++r) {
      if (r == rank_ || exhausted_[r]) continue;
      const std::uint64_t rest = seen_[r].remaining();
      if (rest > most) most = rest, best = r;
    }
    if (best == size_.size()) return chunk{rank_, 0, 0, true};
    const chunk c = steal_from(best, thief_request(opts_, most, cap));
    if (!c.empty()) return c;
    // Lost the race for that tail; rescan (the slice is now marked exhausted).
  }
}

template <counter_store Store>
chunk work_stealer<Store>::next(std::uint64_t cap) {
  if (!own_done_) {
    const chunk c = claim_own(cap);
    if (!c.empty()) return c;
  }
  return steal(cap);
}

template <counter_store Store>
double work_stealer<Store>::weight(std::size_t global_batch) const {
  EBBFLOW_PLAN_ENFORCE(global_batch > 0, plan_errc::zero_batch, "weight of a step with global batch 0");
  return static_cast<double>(processed_) / static_cast<double>(global_batch);
}

template <counter_store Store>
void work_stealer<Store>::release() {
  if constexpr (requires(Store & s, const std::string& k) { s.erase(k); }) {
    if (size_[rank_] > 0) (void)store_->erase(key(rank_));
  }
}

// Compiled into ebbflow::compiled in separate compilation (config.hpp).
#if EBBFLOW_HEADER_ONLY
EBBFLOW_DECL std::uint64_t recommended_min_chunk(double overhead_s, double s_per_item, double share) noexcept {
  if (!(overhead_s > 0) || !(s_per_item > 0) || !(share > 0)) return 1;
  const double k = std::ceil(overhead_s / (share * s_per_item));
  if (!(k >= 1)) return 1;
  return k >= 9e18 ? std::numeric_limits<std::uint64_t>::max() : static_cast<std::uint64_t>(k);
}

EBBFLOW_DECL steal_policy::steal_policy(std::span<const worker_spec> models, const batch_plan& plan, std::size_t rank,
                                  double claim_s, double chunk_overhead_s)
    : planned_s_(std::isnan(plan.step_time) ? predict_step_time(plan, models) : plan.step_time),
      claim_s_(std::max(claim_s, 0.0)),
      overhead_s_(std::max(chunk_overhead_s, 0.0)),
      rank_(rank) {
  EBBFLOW_PLAN_ENFORCE(models.size() == plan.size(), plan_errc::membership_mismatch,
                       models.size() << " models for a plan of " << plan.size() << " workers");
  EBBFLOW_PLAN_ENFORCE(rank < plan.size(), plan_errc::bad_rank,
                       "rank " << rank << " outside plan v" << plan.version << " of " << plan.size() << " workers");
  for (std::size_t r = 0; r < models.size(); ++r) {
    const worker_spec& m = models[r];
    EBBFLOW_PLAN_ENFORCE_W(std::isfinite(m.c) && m.c > 0 && std::isfinite(m.a) && m.a >= 0, plan_errc::bad_cost, m.id,
                           "a = " << m.a << ", c = " << m.c << " cannot pace work stealing");
    a_.push_back(m.a + m.comm_s);
    c_.push_back(m.c);
    fleet_rate_ += 1 / m.c;
  }
}

EBBFLOW_DECL void steal_policy::observe_own(std::uint64_t items, double seconds) noexcept {
  if (items == 0 || !(seconds >= 0)) return;
  own_items_ += static_cast<double>(items);
  own_seconds_ += seconds;
}

EBBFLOW_DECL double steal_policy::s_per_item() const noexcept {
  return own_items_ > 0 && own_seconds_ > 0 ? own_seconds_ / own_items_ : c_[rank_];
}

EBBFLOW_DECL std::uint64_t steal_policy::own_cap(double elapsed_s) const noexcept {
  return paced_owner_cap(planned_s_, elapsed_s, s_per_item());
}

EBBFLOW_DECL steal_policy::choice steal_policy::choose(std::span<const slice_state> seen, double elapsed_s) const {
  EBBFLOW_PLAN_ENFORCE(seen.size() == c_.size(), plan_errc::membership_mismatch,
                       seen.size() << " slice states for " << c_.size() << " workers");
  double worst = 0, victim_s = 0, all_rest = 0;
  std::size_t victim = seen.size();
  for (std::size_t r = 0; r < seen.size(); ++r) {
    if (r == rank_ || seen[r].exhausted()) continue;
    all_rest += static_cast<double>(seen[r].remaining());
    // Progress: the owner requested F items in (elapsed − a_r) seconds; F
    // includes the chunk in flight, so this errs towards the planned speed.
    const double left = time_left(r, seen[r], elapsed_s);
    if (left > worst) worst = left, victim = r, victim_s = left / static_cast<double>(seen[r].remaining());
  }
  if (victim == seen.size()) return {};
  const std::uint64_t g =
      std::min(balanced_steal(seen[victim].remaining(), victim_s, s_per_item(), claim_s_ + overhead_s_),
               fair_steal_cap(static_cast<std::uint64_t>(all_rest), fleet_rate_, s_per_item()));
  return {victim, g};
}

EBBFLOW_DECL double steal_policy::time_left(std::size_t r, const slice_state& s, double elapsed_s) const noexcept {
  double v = c_[r];
  if (s.front > 0 && elapsed_s > a_[r]) v = std::max(v, (elapsed_s - a_[r]) / static_cast<double>(s.front));
  return static_cast<double>(s.remaining()) * v;
}

EBBFLOW_DECL double steal_policy::time_left_bound(std::size_t r, const slice_state& stale, double elapsed_s) const noexcept {
  double v = c_[r];
  if (elapsed_s > a_[r])
    v = std::max(v, (elapsed_s - a_[r]) / static_cast<double>(std::max<std::uint64_t>(stale.front, 1)));
  return static_cast<double>(stale.remaining()) * v;
}

#endif  // EBBFLOW_HEADER_ONLY

template <counter_store Store>
steal_policy::choice steal_policy::scan(work_stealer<Store>& stealer, double elapsed_s) const {
  const std::size_t n = stealer.slices();
  EBBFLOW_PLAN_ENFORCE(n == c_.size(), plan_errc::membership_mismatch,
                       "a stealer of " << n << " slices for a policy of " << c_.size() << " workers");
  if constexpr (batch_counter_store<Store>) {
    (void)stealer.peek_others();  // one round trip for all
  } else {
    std::vector<std::pair<double, std::size_t>> order;  // (bound, rank), largest bound first
    for (std::size_t r = 0; r < n; ++r)
      if (r != rank_ && !stealer.last_seen(r).exhausted())
        order.emplace_back(time_left_bound(r, stealer.last_seen(r), elapsed_s), r);
    std::sort(order.begin(), order.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
    double best = 0;
    for (const auto& [bound, r] : order) {
      if (bound <= best) break;  // neither this slice nor any later one can beat the best read
      best = std::max(best, time_left(r, stealer.peek(r), elapsed_s));
    }
  }
  std::vector<slice_state> seen(n);
  for (std::size_t r = 0; r < n; ++r) seen[r] = stealer.last_seen(r);
  return choose(seen, elapsed_s);
}

template <counter_store Store, class Process>
steal_report run_stealing_step(work_stealer<Store>& stealer, steal_policy& policy, Process&& process) {
  using seconds = std::chrono::duration<double>;
  const auto t0 = steady_clock::now();
  const auto elapsed = [&] { return seconds(steady_clock::now() - t0).count(); };
  steal_report rep;
  for (;;) {
    const chunk c = stealer.claim_own(policy.own_cap(elapsed()));
    if (c.empty()) break;
    const auto t = steady_clock::now();
    process(c);
    policy.observe_own(c.size(), seconds(steady_clock::now() - t).count());
    ++rep.chunks;
  }
  for (;;) {
    const steal_policy::choice ch = policy.scan(stealer, elapsed());
    if (ch.items == 0) break;
    const chunk c = stealer.steal_from(ch.victim, ch.items);
    if (c.empty()) continue;  // lost the race for that tail; look again
    process(c);
    ++rep.chunks;
  }
  rep.processed = stealer.processed();
  rep.stolen = stealer.stolen();
  rep.store_calls = stealer.store_calls();
  rep.seconds = elapsed();
  return rep;
}

template <counter_store Store, class Process>
steal_report run_stealing_step(work_stealer<Store>& stealer, Process&& process) {
  const auto t0 = steady_clock::now();
  steal_report rep;
  for (chunk c = stealer.next(); !c.empty(); c = stealer.next()) {
    process(c);
    ++rep.chunks;
  }
  rep.processed = stealer.processed();
  rep.stolen = stealer.stolen();
  rep.store_calls = stealer.store_calls();
  rep.seconds = std::chrono::duration<double>(steady_clock::now() - t0).count();
  return rep;
}

// Compiled into ebbflow::compiled in separate compilation (config.hpp).
#if EBBFLOW_HEADER_ONLY
EBBFLOW_DECL sample_range samples_of(const sampler_state& state, const batch_plan& plan, const chunk& c) {
  sample_range s = slice_of(state, plan, c.rank);
  EBBFLOW_PLAN_ENFORCE(
      c.first <= c.last && c.last <= s.size(), plan_errc::bad_rank,
      "chunk [" << c.first << ", " << c.last << ") outside rank " << c.rank << "'s slice of " << s.size() << " items");
  s.last = s.first + c.last;
  s.first = s.first + c.first;
  return s;
}

#endif  // EBBFLOW_HEADER_ONLY

}  // namespace plan
EBBFLOW_END_NAMESPACE
