// SPDX-License-Identifier: Apache-2.0
//! @file impl/group/lifecycle.hpp
//! Construction and the end of a member: the checks of the options, the
//! store connections, registration with the job, the end-of-job wait, the
//! registered state and a restored position, `finish` and `keep_training`,
//! and the fault points.
//! May touch any member: it runs before and after the other threads.
#pragma once

#include <ebbflow/elastic/detail/group_impl.hpp>
#include <ebbflow/core/thread_name.hpp>
#include <ebbflow/elastic/detail/fault_injection.hpp>

#include <algorithm>
#include <string>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

template <kv_store Store, network Net>
group_impl<Store, Net>::group_impl(store_factory connect_store, Net& net, group_options opts, launch_info launch,
                                   std::unique_ptr<planning_policy> policy)
    : opts_(std::move(opts)),
      launch_(std::move(launch)),
      connect_store_(std::move(connect_store)),
      net_(&net),
      policy_(std::move(policy)) {
  EBBFLOW_ENFORCE(opts_.global_batch > 0, "elastic group: global_batch must be > 0");
  EBBFLOW_ENFORCE(opts_.dataset_size > 0, "elastic group: dataset_size must be > 0");
  EBBFLOW_ENFORCE(!opts_.drop_last || opts_.global_batch <= opts_.dataset_size,
                  "elastic group: drop_last with global_batch " << opts_.global_batch << " > dataset_size "
                                                                << opts_.dataset_size << " leaves no step");
  EBBFLOW_ENFORCE(
      opts_.min_size >= 1 && opts_.max_size >= opts_.min_size && opts_.max_size <= comm::max_collective_ranks,
      "elastic group: need 1 <= min_size (" << opts_.min_size << ") <= max_size (" << opts_.max_size << ") <= "
                                            << comm::max_collective_ranks << " (the collectives' most ranks)");
  EBBFLOW_ENFORCE(opts_.join_cooldown.count() >= 0 && opts_.join_cooldown_max >= opts_.join_cooldown,
                  "elastic group: need 0 <= join_cooldown ("
                      << opts_.join_cooldown.count() << " ms) <= join_cooldown_max (" << opts_.join_cooldown_max.count()
                      << " ms)");
  // A lease spans at least two heartbeats: a member whose counter moves only
  // once per lease would be judged dead for one late beat.
  EBBFLOW_ENFORCE(opts_.heartbeat.count() > 0 && opts_.lease >= 2 * opts_.heartbeat,
                  "elastic group: EBBFLOW_LEASE_MS=" << opts_.lease.count() << " must be at least twice "
                                                     << "EBBFLOW_HEARTBEAT_MS=" << opts_.heartbeat.count());
  EBBFLOW_ENFORCE(opts_.sched_slice.count() == 0 || (opts_.sched_slice >= group_options::min_sched_slice &&
                                                     opts_.sched_slice <= group_options::max_sched_slice),
                  "elastic group: EBBFLOW_SCHED_SLICE_US="
                      << opts_.sched_slice.count() << ": expected 0 or " << group_options::min_sched_slice.count()
                      << " to " << group_options::max_sched_slice.count() << " (the kernel's range)");
  EBBFLOW_ENFORCE(opts_.rt_priority >= 0 && opts_.rt_priority <= group_options::max_rt_priority,
                  "elastic group: EBBFLOW_RT_PRIORITY=" << opts_.rt_priority << ": expected 0 (off) or 1 to "
                                                        << group_options::max_rt_priority);
  // The first generation is formed from the launched workers alone (a
  // newcomer joins a running group): fewer than min_size could never start.
  EBBFLOW_ENFORCE(opts_.join || launch_.world_size >= opts_.min_size,
                  "elastic group: EBBFLOW_MIN_SIZE=" << opts_.min_size << " but this launch starts "
                                                     << launch_.world_size
                                                     << " workers; the first generation is formed from the "
                                                        "launched workers, so launch at least min_size of them");
  EBBFLOW_ENFORCE(policy_ != nullptr, "elastic group: null planning policy");
  EBBFLOW_ENFORCE(connect_store_ != nullptr, "elastic group: null store factory");
  if (opts_.worker_key.empty()) opts_.worker_key = env::host_name();
  store_ = connect_store_();
  // A store that outlives its jobs keeps a finished job's keys under its
  // prefix: this worker would take that job's generations for its own.
  if (job_done())
    fail_job_finished(
        "on this store has finished: a worker started now cannot join it, and a new job needs a prefix of its own "
        "(EBBFLOW_JOB; ebbflow-run --attach picks a fresh one) or a fresh store");
  // The admission helper's own connection, made now rather than in the
  // middle of a membership change (a joiner makes it later, when needed:
  // its start-up is already part of one).
  if (detail::can_preconnect<Net>() && opts_.preconnect && !opts_.join) aux_store_ = connect_store_();
  coll_opts_ = comm::collective_options::from_environment();
  coll_opts_.timeout = opts_.op_timeout;
  id_ = store_->add(key("next_id"), 1, store_deadline());
  // Which member this process is, for its launcher's report of its exit.
  if (!opts_.process_key.empty())
    store_->set(opts_.process_record_key(opts_.process_key), std::to_string(id_), store_deadline());
  if constexpr (detail::stable_address<Net>()) {
    const bytes mine = net_->prepare(0);
    store_->set(key("addr/" + std::to_string(id_)), to_value(mine), store_deadline());
  }
  heartbeat_ = std::jthread([this](std::stop_token st) { heartbeat_loop(st); });
  ::ebbflow::detail::name_thread(heartbeat_, "ebbflow-beat");
  if (!opts_.join && launch_.rank < launch_.world_size) {
    own_initial_state_ = true;
    form_initial();
  } else {
    wait_admission();  // a newcomer keeps a lowered priority (--join-nice) until the state moves (sync_state)
  }
}

template <kv_store Store, network Net>
group_impl<Store, Net>::~group_impl() {
  wait_for_peers_to_end();
  heartbeat_.request_stop();
  if (heartbeat_.joinable()) heartbeat_.join();
  next_.reset();  // stops and joins an admission helper first
  retiring_.reset();
  comm_.reset();
  transport_.reset();
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::wait_for_peers_to_end() noexcept {
  // A member that ends between steps (its training done) keeps its
  // transport until every member of its generation has ended too: a peer
  // still inside the last control exchange would take this one's closing
  // endpoints for a death (over tcp a close can reset what the peer has
  // not read yet) and fail the step it has in fact finished. A store
  // barrier, not a collective: its own last message cannot race a close.
  // Without a store there is nothing to wait on: the peers then see this
  // member's close at worst (a lease at most, as before this wait existed).
  if (!active_ || !transport_ || phase_ != step_phase::closed || step_ <= 0 || !store_ || store_unreachable()) return;
  try {
    const std::string prefix = "ended/" + std::to_string(gen_.generation) + "/";
    store_->set(key(prefix + std::to_string(id_)), std::to_string(step_), store_deadline());
    std::vector<std::string> keys;
    for (const auto& m : gen_.members)
      if (m.id != id_) keys.push_back(key(prefix + std::to_string(m.id)));
    if (!keys.empty()) store_->wait(keys, deadline::after(std::min<steady_clock::duration>(opts_.lease, end_wait_max)));
  } catch (const std::exception&) {
    // A member that is gone, or one that trains on: it was waited for long enough.
  }
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::register_state(std::string name, std::span<std::byte> host_bytes) {
  if (started_)
    fail(error::invalid_state, "register_state('" + name +
                                   "') after the first begin_step: the state moved to the other members without it "
                                   "(register every buffer before training)");
  for (auto& s : state_) EBBFLOW_ENFORCE(s.name != name, "elastic group: state '" << name << "' registered twice");
  state_.push_back({std::move(name), host_bytes});
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::fail(std::error_code ec, const std::string& what) const {
  throw system_error(ec, {.rank = rank_, .generation = gen_.generation, .operation = "elastic group", .detail = what});
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::fail_job_finished(std::string_view what) const {
  fail(error::job_finished, "the job EBBFLOW_JOB='" + opts_.prefix + "' " + std::string(what));
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::restore_position(std::int64_t step, std::int64_t epoch, std::size_t cursor) {
  if (started_) fail(error::invalid_state, "restore_position after the first begin_step");
  EBBFLOW_ENFORCE(step >= 0 && step <= max_step && epoch >= 0 && epoch <= max_step && cursor < opts_.dataset_size,
                  "restore_position: step " << step << ", epoch " << epoch << ", cursor " << cursor << " (dataset_size "
                                            << opts_.dataset_size << ", steps and epochs up to 2^62)");
  // With drop_last an epoch ends before a short last batch.
  EBBFLOW_ENFORCE(!opts_.drop_last || opts_.dataset_size - cursor >= opts_.global_batch,
                  "restore_position: cursor " << cursor << " is inside the short last batch of an epoch of "
                                              << opts_.dataset_size << " with global_batch " << opts_.global_batch
                                              << " and drop_last (that batch is never trained on)");
  // The source's position reaches everybody with the state. Every member
  // keeps it: should the source die before the state moved, another member
  // may become the source with its own initial state (take_own_initial_state).
  restored_ = position{step, epoch, cursor};
  if (gen_.source != id_) return;
  step_ = step;
  epoch_ = epoch;
  cursor_ = cursor;
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::finish() {
  // The training is complete whether or not the store can record it: a
  // store that is gone is said, not thrown (the job exits as it should).
  try {
    store_->set(key("done"), "1", store_deadline());
  } catch (const system_error& e) {
    if (!store_failure(e) || !recoverable(e.code())) throw;
    EBBFLOW_LOG_WARN("the job finished, but the store could not record it ("
                     << e.what() << "): workers still waiting to join it are not told, and wait until "
                     << "EBBFLOW_JOIN_TIMEOUT_MS");
  }
}

template <kv_store Store, network Net>
bool group_impl<Store, Net>::keep_training(std::int64_t total_steps) {
  EBBFLOW_ENFORCE(total_steps >= 0 && total_steps <= max_step,
                  "keep_training: total_steps " << total_steps << " (expected 0 to 2^62)");
  if (!active_ || finished_) return false;
  // A joiner (step_ -1 until its state arrives) and a change still in flight
  // keep the loop going: the members that admitted a newcomer wait for it
  // rather than leave it stranded. Every member sees the same step_ and the
  // same change after end_step, so they all stop at the same boundary.
  if (step_ < total_steps || changing()) return true;
  // Marked once, on every member (the same key: the calls after the first
  // change nothing): a worker started later under this job is refused at
  // once (job_finished) instead of waiting out its join timeout.
  finished_ = true;
  finish();
  return false;
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::fault_point(const char* point) {
  fault_point(point, *store_, {});
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::fault_point(const char* point, Store& st, std::stop_token stop) {
  detail::fault_point(point, st, opts_.prefix, id_, store_deadline(), stop);
}

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
