// SPDX-License-Identifier: Apache-2.0
//! @file impl/group/step.hpp
//! The user's step: begin_step (pending switch and state transfer first),
//! the collectives (a failure aborts the step and recovers), in-step work
//! stealing, and end_step: commit, then the control exchange that feeds the
//! policy and decides re-plans, joins and leaves, and switches to a
//! generation wired up in the background.
//! Training thread only.
#pragma once

#include <ebbflow/elastic/detail/group_impl.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

// Member templates: instantiated in the user's translation unit in either mode.
template <kv_store Store, network Net>
template <class F>
bool group_impl<Store, Net>::collective(F&& f) {
  const inside busy(in_group_);
  require_open_step("a collective");
  try {
    {
      const auto w = enter_collective();
      f(*comm_);
    }
    return true;
  } catch (const system_error& e) {
    if (!detail::recoverable(e.code())) throw;
    EBBFLOW_LOG_WARN("step " << step_ << " aborted: " << e.what());
    phase_ = step_phase::aborted;
    recover(gen_.generation, lost_peer_of(e));
    return false;
  }
}


template <kv_store Store, network Net>
template <class Process>
plan::steal_report group_impl<Store, Net>::steal_step(Process&& process, const steal_settings& settings) {
  require_open_step("steal_step");
  if (!steal_key_.empty() && steal_attempt_ == std::pair{gen_.generation, step_})
    fail(error::invalid_state, "steal_step called twice in step " + std::to_string(step_));
  release_steal_counter();  // an aborted attempt's
  steal_attempt_ = {gen_.generation, step_};
  const auto info = current_slice();
  const std::vector<std::size_t> full(gen_.plan.begin(), gen_.plan.end());
  const auto slices = scale_plan(full, info.global_batch);
  std::vector<std::size_t> offset(slices.size(), 0);
  for (std::size_t r = 1; r < slices.size(); ++r) offset[r] = offset[r - 1] + slices[r - 1];
  plan::work_stealer<Store> stealer(
      *store_, key("steal"), {static_cast<std::uint64_t>(gen_.generation), static_cast<std::uint64_t>(step_)},
      std::span<const std::size_t>(slices), static_cast<std::size_t>(rank_), settings.chunks);
  steal_key_ = stealer.key(static_cast<std::size_t>(rank_));
  const auto run = [&](const plan::chunk& c) { process(offset[c.rank] + c.first, offset[c.rank] + c.last); };

  std::vector<member_id> ids;
  for (auto& m : gen_.members) ids.push_back(m.id);
  const auto models = policy_->models(ids);
  const bool paced = models.size() == ids.size() && std::all_of(models.begin(), models.end(), [](const auto& m) {
                       return std::isfinite(m.fixed_seconds) && m.fixed_seconds >= 0 &&
                              std::isfinite(m.seconds_per_sample) && m.seconds_per_sample > 0;
                     });
  if (paced && info.global_batch > 0) {
    std::vector<plan::worker_spec> specs;
    for (std::size_t i = 0; i < ids.size(); ++i)
      specs.push_back({static_cast<std::uint64_t>(ids[i]), models[i].fixed_seconds, models[i].seconds_per_sample,
                       std::numeric_limits<std::size_t>::max(), 0, 0});
    const auto bp = plan::make_plan(specs, slices, gen_.plan_version);
    plan::steal_policy pacing(specs, bp, static_cast<std::size_t>(rank_), settings.claim_seconds,
                              settings.chunk_overhead_seconds);
    return plan::run_stealing_step(stealer, pacing, run);
  }
  return plan::run_stealing_step(stealer, run);  // no models yet: unpaced
}


template <kv_store Store, network Net>
step_info group_impl<Store, Net>::begin_step() {
  const inside busy(in_group_);
  if (!active_) fail(error::invalid_state, "begin_step after this member left the group");
  if (detail::signal_leave_flag().load()) leave_requested_.store(true);
  started_ = true;
  while (pending_) {
    try {
      sync_state();
      const auto p = *pending_;
      pending_.reset();
      const double at_switch = std::chrono::duration<double>(steady_clock::now() - p.started).count();
      if (p.prepared_seconds > 0)
        EBBFLOW_LOG_INFO("stall: " << p.prepared_seconds * 1e3 << " ms starting the connect at admission, "
                                   << at_switch * 1e3 << " ms at the switch");
      notify(p.reason, p.old_size, p.prepared_seconds + at_switch);
    } catch (const system_error& e) {
      if (!detail::recoverable(e.code()) || std::exchange(callback_threw_, false)) throw;
      EBBFLOW_LOG_WARN("state transfer failed: " << e.what());
      recover(gen_.generation, lost_peer_of(e));
    }
  }
  phase_ = step_phase::open;
  return current_slice();
}

template <kv_store Store, network Net>
step_info group_impl<Store, Net>::current_slice() const {
  step_info s;
  s.step = step_;
  s.epoch = epoch_;
  s.cursor = cursor_;
  s.global_batch = std::min(opts_.global_batch, opts_.dataset_size - cursor_);
  std::vector<std::size_t> plan(gen_.plan.begin(), gen_.plan.end());
  auto p = scale_plan(plan, s.global_batch);
  s.offset = std::accumulate(p.begin(), p.begin() + rank_, std::size_t{0});
  s.batch = p[static_cast<std::size_t>(rank_)];
  s.weight = s.global_batch ? static_cast<double>(s.batch) / static_cast<double>(s.global_batch) : 0.0;
  s.rank = rank_;
  s.world_size = size();
  s.generation = gen_.generation;
  s.plan_version = gen_.plan_version;
  return s;
}

template <kv_store Store, network Net>
std::vector<std::size_t> group_impl<Store, Net>::plan_of(const std::vector<member_id>& ids) const {
  auto p = policy_->plan(ids, opts_.global_batch);
  std::size_t sum = 0;
  bool wrapped = false;
  for (auto b : p) wrapped = wrapped || __builtin_add_overflow(sum, b, &sum);
  if (p.size() != ids.size() || wrapped || sum != opts_.global_batch)
    fail(error::invalid_state, "the planning policy's plan has " + std::to_string(p.size()) + " entries summing to " +
                                   (wrapped ? std::string("more than 2^64") : std::to_string(sum)) + " for " +
                                   std::to_string(ids.size()) + " members and a global batch of " +
                                   std::to_string(opts_.global_batch));
  return p;
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::require_open_step(const char* what) const {
  if (!active_) fail(error::invalid_state, std::string(what) + " after this member left the group");
  if (phase_ == step_phase::closed)
    fail(error::invalid_state,
         std::string(what) + " outside a step: call begin_step first (step " + std::to_string(step_) + " is not open)");
  if (phase_ == step_phase::aborted)
    fail(error::invalid_state, std::string(what) + " after a collective of step " + std::to_string(step_) +
                                   " returned false: the step was rolled back; redo it from begin_step");
}

template <kv_store Store, network Net>
bool group_impl<Store, Net>::allreduce(std::span<float> data) {
  return collective(
      [&](communicator_type& c) { c.allreduce(view(data), reduce_op::sum, deadline::after(opts_.op_timeout)); });
}

template <kv_store Store, network Net>
bool group_impl<Store, Net>::allreduce(std::span<double> data) {
  return collective(
      [&](communicator_type& c) { c.allreduce(view(data), reduce_op::sum, deadline::after(opts_.op_timeout)); });
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::control_allreduce(std::span<double> v) {
  // The communicator's allreduce gives bitwise-identical results on every
  // rank, so every member's policy observes exactly the same numbers.
  const auto w = enter_collective(true);
  comm_->allreduce(view(v), reduce_op::sum, deadline::after(opts_.op_timeout));
}

template <kv_store Store, network Net>
typename group_impl<Store, Net>::waiting group_impl<Store, Net>::enter_collective(bool control) noexcept {
  // The control exchange runs after the commit (step_ already advanced):
  // it counts as collective 0 of the next step.
  const std::pair<std::int64_t, std::int64_t> at{gen_.generation, step_};
  if (at != progress_at_) progress_at_ = at, progress_k_ = 0;
  if (!control) progress_k_ = std::min(progress_k_ + 1, detail::progress::max_collective);
  progress_.store(detail::progress{step_, gen_.generation, progress_k_}.encode(), std::memory_order_relaxed);
  waiting_since_.store(steady_clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  return waiting{waiting_since_};
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::notify(change_reason reason, int old_size, double stall) {
  world_change wc{gen_.generation, reason, old_size, size(), rank_, step_, stall};
  history_.push_back(wc);
  EBBFLOW_LOG_INFO("generation " << wc.generation << " (" << name(reason) << "): " << old_size << " -> " << wc.new_size
                                 << " members, rank " << rank_ << ", step " << step_ << ", ready after " << stall * 1e3
                                 << " ms");
  // A callback's exception reaches the caller of begin_step as it is, even
  // an ebbflow::system_error whose code a member failure would have: the
  // change it announced stays in effect.
  for (auto& cb : callbacks_) {
    try {
      cb(wc);
    } catch (...) {
      callback_threw_ = true;
      throw;
    }
  }
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::release_steal_counter() {
  if (steal_key_.empty()) return;
  // Erased by the heartbeat thread, on its own connection: no round trip here.
  if constexpr (requires(Store & s) { s.erase(steal_key_); }) {
    std::lock_guard lk(hb_mutex_);
    hb_erase_.push_back(std::move(steal_key_));
  }
  steal_key_.clear();
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::commit(double compute_seconds, std::optional<std::size_t> processed) {
  const inside busy(in_group_);
  // A second end_step would commit a step nobody computed (its samples
  // lost); one after a failed collective, a rolled-back step.
  require_open_step("end_step");
  phase_ = step_phase::closed;
  if (!std::isfinite(compute_seconds) || compute_seconds < 0) compute_seconds = 0;
  const auto now = steady_clock::now();
  if (last_commit_ != steady_clock::time_point{}) step_interval_ = now - last_commit_;
  last_commit_ = now;
  if constexpr (requires(typename Net::transport_type & x) { x.poll_close(); }) {
    if (retiring_ && retiring_->poll_close()) retiring_.reset();
  }
  // Commit: the gradient collectives completed and the optimizer stepped.
  const auto info = current_slice();
  ++step_;
  cursor_ += info.global_batch;
  if (cursor_ >= opts_.dataset_size || (opts_.drop_last && opts_.dataset_size - cursor_ < opts_.global_batch)) {
    ++epoch_;
    cursor_ = 0;
  }
  if (detail::signal_leave_flag().load()) leave_requested_.store(true);

  const int n = size();
  const std::size_t un = static_cast<std::size_t>(n);
  std::vector<double> v(4 + 4 * un, 0.0);
  const std::size_t r = static_cast<std::size_t>(rank_);
  v[3 + r] = compute_seconds;
  v[3 + un + r] = static_cast<double>(processed.value_or(info.batch));
  // Every member's claims ended before the gradient allreduce completed.
  release_steal_counter();
  v[3 + 2 * un + r] = leave_requested_.load() ? 1.0 : 0.0;
  std::vector<member_id> ids;
  for (auto& m : gen_.members) ids.push_back(m.id);
  admitting_.clear();
  std::int64_t seen = gen_.joins_seen;
  // A join connecting in the background: every member says whether its
  // side is wired up; nothing else changes the membership or the plan
  // until the switch (plan versions stay unique).
  if (next_) {
    const int ready = poll_next();
    v[2] = ready > 0 ? 1.0 : ready < 0 ? -1e6 : 0.0;
  }
  if (rank_ == 0 && !next_) {
    // The join tickets are read only once the heartbeat thread saw a new
    // one (or some still wait): a steady step waits on no store.
    if (join_seq_hint_.load(std::memory_order_relaxed) > seen || ticket_seen_until_ > seen) {
      try {
        const std::size_t room = static_cast<std::size_t>(std::max(0, opts_.max_size - n));
        std::vector<join_hold> holds;
        admitting_ = pending_joiners(seen, room, true, holds);
        if (!holds.empty()) answer_holds(*store_, holds);
        // Tickets handled without an admission (held, malformed, or never
        // written) are not read again; the next record carries the count.
        if (admitting_.empty() && seen > gen_.joins_seen) {
          gen_.joins_seen = seen;
          hb_tickets_floor_.store(seen, std::memory_order_relaxed);
        }
      } catch (const system_error& e) {
        EBBFLOW_LOG_WARN("coordinator could not read join tickets: " << e.what());
      }
    }
    v[0] = static_cast<double>(admitting_.size());
    std::vector<std::size_t> cur(gen_.plan.begin(), gen_.plan.end());
    if (policy_->should_replan(ids, cur, opts_.global_batch)) {
      auto p = plan_of(ids);
      v[1] = 1;
      for (std::size_t i = 0; i < un; ++i) v[3 + 3 * un + i] = static_cast<double>(p[i]);
    }
  }
  try {
    control_allreduce(v);
  } catch (const system_error& e) {
    if (!detail::recoverable(e.code())) throw;
    EBBFLOW_LOG_WARN("control exchange after step " << step_ << " failed: " << e.what());
    recover(gen_.generation, lost_peer_of(e));
    return;
  }
  for (std::size_t i = 0; i < un; ++i)
    if (v[3 + un + i] > 0) policy_->observe(ids[i], static_cast<std::size_t>(v[3 + un + i]), v[3 + i]);
  if constexpr (detail::can_preconnect<Net>()) {
    if (next_) {
      if (v[2] >= static_cast<double>(n)) {  // everybody wired up: switch now, only the state moves
        auto nx = std::move(*next_);
        next_.reset();
        if (nx.leaving)
          leave_now();
        else
          install(std::move(nx.rec), std::move(*nx.transport), steady_clock::now(), nx.prepared_seconds);
      } else if (v[2] < 0 && next_->leaving) {
        leave_now();          // the others switch the blocking way
      } else if (v[2] < 0) {  // somebody's connect failed or is overdue: the blocking way (and recovery)
        auto nx = std::move(*next_);
        next_.reset();
        if (nx.helper.joinable()) {  // overdue: stop it before going on without it
          nx.helper.request_stop();
          nx.helper.join();
        }
        // A transport this member already started for g1 (here or by the
        // helper) has taken wire-up messages its peers send only once: the
        // blocking way finishes that one. A second transport for g1 would
        // wait for them until the operation deadline (so would its peers).
        auto begun = [&]() -> std::optional<typename Net::transport_type> {
          if (nx.transport) return std::move(nx.transport);
          if (nx.admission && nx.admission->transport) return std::move(nx.admission->transport);
          return std::nullopt;
        }();
        nx.admission.reset();
        if (nx.excluded) {  // a concurrent recovery excluded this member: rejoin
          wait_admission();
          return;
        }
        // The helper may have stopped anywhere: redo what it may not have
        // done (writing the record twice is harmless), then the blocking way.
        if (nx.record) write_record(*store_, gen_key(nx.g1), *nx.record, nx.admitted, nx.g1);
        adopt_announced(nx.g1, steady_clock::now(), std::move(begun));
      }
      return;  // leave requests are taken at the first boundary after the switch
    }
  }
  if (v[1] > 0) {
    for (std::size_t i = 0; i < un; ++i) gen_.plan[i] = static_cast<std::uint64_t>(v[3 + 3 * un + i]);
    ++gen_.plan_version;
  }
  const auto leaves = leaves_applied(v, n);
  const bool leaving = std::find(leaves.begin(), leaves.end(), char{1}) != leaves.end();
  if (v[0] > 0 || leaving) {
    if (rank_ == 0) {
      gen_.joins_seen = seen;
      hb_tickets_floor_.store(seen, std::memory_order_relaxed);
    }
    change_membership(leaves, n);
  }
}


}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
