// SPDX-License-Identifier: Apache-2.0
//! @file impl/group/recovery.hpp
//! Re-forming the group after a failure: abort the generation everywhere,
//! report this member's committed step, decide who is alive (reported,
//! marked dead, process gone on this host, lease), wait below min_size, and
//! propose generation g+1 by compare-and-set (the first proposal wins);
//! the newest committed step becomes the state's source.
//! Training thread only.
#pragma once

#include <ebbflow/elastic/detail/group_impl.hpp>
#include <ebbflow/elastic/detail/store_ops.hpp>

#include <set>
#include <string>
#include <thread>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

template <kv_store Store, network Net>
void group_impl<Store, Net>::recover(std::int64_t g, int lost_peer) {
  // Everything a recovery decides goes through the store: without it the
  // survivors cannot agree on the next generation, so none is decided. A
  // replicated store that lost its quorum comes back: with
  // store_outage_wait the recovery waits for it (its steps are idempotent:
  // sets, and a compare-and-set whose first proposal wins), then goes on.
  const auto give_up = deadline::after(opts_.store_outage_wait);
  for (bool said = false;; said = true) {
    try {
      reform(g, lost_peer);
      if (said) EBBFLOW_LOG_WARN("the store is back: generation " << g << "'s failure was handled");
      return;
    } catch (const system_error& e) {
      if (!store_failure(e) || !recoverable(e.code())) throw;
      if (give_up.expired())
        fail(error::peer_lost, "generation " + std::to_string(g) + " failed and the store cannot be reached (" +
                                   e.what() +
                                   "): the group cannot re-form without its store (docs/elastic.md, \"When the "
                                   "store dies\")");
      if (!said)
        EBBFLOW_LOG_WARN("generation " << g << " failed and the store cannot be reached (" << e.what()
                                       << "): no membership decision until it is back; waiting up to "
                                          "EBBFLOW_STORE_OUTAGE_MS="
                                       << opts_.store_outage_wait.count() << " ms");
      std::this_thread::sleep_for(std::min<steady_clock::duration>(opts_.heartbeat * 4, give_up.remaining()));
    }
  }
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::reform(std::int64_t g, int lost_peer) {
  const auto started = steady_clock::now();
  next_.reset();  // a join still connecting is redone by the recovery below
  auto overall = deadline::after(opts_.op_timeout + opts_.min_size_wait);
  for (;;) {
    // 1. Stop every collective of g and tell the others. Its endpoints may
    // hold traffic its peers will never answer: the next opens its own.
    if (revoke_) revoke_->revoke();
    if constexpr (requires { net_->discard_endpoints(); }) net_->discard_endpoints();
    hb_generation_.store(-1);
    const std::string gs = std::to_string(g);
    store_->set(key("abort/" + gs), "1", store_deadline());
    if (lost_peer >= 0 && lost_peer < size() && gen_.generation == g)
      store_->set(dead_key(g, gen_.members[static_cast<std::size_t>(lost_peer)].id), "1", store_deadline());
    // What this member holds: its committed step, or (no step yet) whether
    // its buffers are still a launched worker's own initial state.
    const std::int64_t holds = step_ >= 0 ? step_ : own_initial_state_ ? detail::own_initial_state : -1;
    store_->set(key("recover/" + gs + "/" + std::to_string(id_)), std::to_string(holds), store_deadline());
    EBBFLOW_LOG_WARN("generation " << g << " failed at step " << step_ << ": re-forming the group");

    const std::string next_key = gen_key(g + 1);
    std::set<member_id> failures_counted;  // lost members of g whose join failure this member applied
    lease_seen hb_seen;
    const auto unresolved_deadline = deadline::after(opts_.op_timeout);
    const auto recovery_started = steady_clock::now();
    bool waiting_logged = false, stuck_logged = false;
    // Since when the members alive and the joiners waiting number fewer than
    // min_size: the group gives up min_size_wait after that, not later.
    std::optional<steady_clock::time_point> below_since;
    std::optional<detail::generation_record> next;
    // Each round asks the store in at most three pipelined batches, however
    // large the group: the next record and who reported; of the others, who
    // was reported lost; of the rest, their heartbeats.
    std::vector<std::string> reported_keys{next_key};
    for (auto& m : gen_.members)
      if (m.id != id_) reported_keys.push_back(key("recover/" + gs + "/" + std::to_string(m.id)));
    while (!next) {
      const auto reported = detail::try_get_all(*store_, reported_keys, store_deadline());
      if (const auto& cur = reported[0]) {
        next = detail::generation_record::decode(to_bytes(*cur));
        break;
      }
      // Who of g is alive (reported), dead (reported lost or lease expired), or undecided?
      // Lost: marked dead in g by a peer, or its launcher saw its process exit.
      std::vector<std::string> lost_keys, hb_keys;
      std::vector<std::size_t> unreported, maybe_alive;  // indices into gen_.members
      for (std::size_t i = 0, k = 1; i < gen_.members.size(); ++i) {
        if (gen_.members[i].id == id_) continue;
        if (!reported[k++]) {
          unreported.push_back(i);
          lost_keys.push_back(dead_key(g, gen_.members[i].id));
          lost_keys.push_back(opts_.gone_key(gen_.members[i].id));
        }
      }
      const auto lost_or_gone = detail::try_get_all(*store_, lost_keys, store_deadline());
      std::vector<std::uint8_t> lost(unreported.size());
      for (std::size_t j = 0; j < unreported.size(); ++j)
        lost[j] = lost_or_gone[2 * j].has_value() || lost_or_gone[2 * j + 1].has_value();
      // A member on this host whose process is gone is dead now, not only
      // after its lease: when several die at once, a survivor revoked before
      // its own transport saw a death reports none. Told to the others too
      // (read back as lost in the next round).
      std::vector<std::uint8_t> exited_here(unreported.size(), 0);
      if constexpr (requires(const transport_type& t) {
                      { t.peer_gone(0) } -> std::convertible_to<bool>;
                    }) {
        for (std::size_t j = 0; transport_ && gen_.generation == g && j < unreported.size(); ++j) {
          const std::size_t i = unreported[j];
          if (lost[j] || !transport_->peer_gone(static_cast<int>(i))) continue;
          exited_here[j] = 1;
          EBBFLOW_LOG_WARN("member " << gen_.members[i].id << " (rank " << i << " of generation " << g
                                     << ") is gone: its process on this host exited");
          store_->set(dead_key(g, gen_.members[i].id), "1", store_deadline());
        }
      }
      for (std::size_t j = 0; j < unreported.size(); ++j) {
        if (lost[j] || exited_here[j] || unresolved_deadline.expired())
          continue;  // reported lost, or its process exited on this host, or too late
        maybe_alive.push_back(unreported[j]);
        hb_keys.push_back(key("hb/" + std::to_string(gen_.members[unreported[j]].id)));
      }
      std::vector<std::uint8_t> heartbeating(gen_.members.size(), 0);  // unreported, lease fresh
      if (!hb_keys.empty()) {
        const auto hbs =
            detail::add_all(*store_, hb_keys, std::vector<std::int64_t>(hb_keys.size(), 0), store_deadline());
        const auto now = steady_clock::now();
        for (std::size_t j = 0; j < maybe_alive.size(); ++j)
          heartbeating[maybe_alive[j]] = fresh(gen_.members[maybe_alive[j]].id, hbs[j], now, hb_seen);
      }
      std::vector<detail::member_entry> alive;
      std::string undecided_ids;  // alive by their heartbeat, not yet in the recovery
      bool undecided = false;
      for (std::size_t i = 0, k = 1; i < gen_.members.size(); ++i) {
        const member_id m = gen_.members[i].id;
        if (m == id_) {
          alive.push_back({id_, holds});
        } else if (const auto& r = reported[k++]) {
          alive.push_back({m, detail::parse_i64(*r)});
        } else if (heartbeating[i]) {
          undecided = true;
          detail::append_listed(undecided_ids, std::to_string(m));
        }
      }
      // A member whose heartbeat goes on but whose training thread does not
      // come (stuck outside ebbflow: a data loader, a lock) is waited for
      // until the operation deadline, then left out; say so once.
      if (undecided && !stuck_logged && steady_clock::now() - recovery_started > opts_.lease) {
        EBBFLOW_LOG_WARN(
            "generation " << g << " failed; member(s) " << undecided_ids
                          << " still send heartbeats but have not reached the recovery (a training "
                             "thread stuck outside ebbflow?): waiting for them at most EBBFLOW_OP_TIMEOUT_MS="
                          << std::chrono::duration_cast<std::chrono::milliseconds>(opts_.op_timeout).count()
                          << " ms, then going on without them");
        stuck_logged = true;
      }
      if (!undecided) {
        count_join_failures(alive, failures_counted);  // before the tickets are read: a restarted newcomer's sees it
        // Failure counts the heartbeat thread read before this are stale.
        failures_epoch_.fetch_add(1, std::memory_order_acq_rel);
        std::int64_t seen = gen_.joins_seen;
        const std::size_t room =
            static_cast<std::size_t>(std::max<std::int64_t>(0, opts_.max_size - static_cast<int>(alive.size())));
        std::vector<join_hold> holds;
        auto joiners = pending_joiners(seen, room, false, holds);
        const int total = static_cast<int>(alive.size() + joiners.size());
        if (total < opts_.min_size) {
          const auto now = steady_clock::now();
          if (!below_since) below_since = now;
          if (!waiting_logged)
            EBBFLOW_LOG_WARN("only " << total << " workers left, below EBBFLOW_MIN_SIZE=" << opts_.min_size
                                     << ": waiting for workers to join (up to EBBFLOW_MIN_WAIT_MS="
                                     << opts_.min_size_wait.count() << " ms)");
          waiting_logged = true;
          if (now - *below_since >= opts_.min_size_wait)
            fail(error::timeout, "only " + std::to_string(total) + " worker(s) left after generation " + gs +
                                     " failed, below EBBFLOW_MIN_SIZE=" + std::to_string(opts_.min_size) +
                                     ", and none joined within EBBFLOW_MIN_WAIT_MS=" +
                                     std::to_string(opts_.min_size_wait.count()) + " ms");
        } else {
          detail::generation_record rec;
          rec.generation = g + 1;
          rec.reason = change_reason::failure;
          rec.members = alive;
          for (auto j : joiners) rec.members.push_back({j, -1});
          std::vector<member_id> ids;
          for (auto& m : rec.members) ids.push_back(m.id);
          rec.source = -1;
          rec.source_step = -1;
          for (auto& m : rec.members)
            if (m.committed > rec.source_step) {
              rec.source_step = m.committed;
              rec.source = m.id;
            }
          // If nobody holds a step, none was ever trained: the member that
          // formed generation 0 died before its state moved. A launched
          // worker whose buffers no transfer wrote holds an initial state as
          // valid as that one (as when launch rank 0 never registers): the
          // first becomes the source, the others receive its state.
          for (auto& m : rec.members) {
            if (m.committed != detail::own_initial_state) continue;
            m.committed = -1;
            if (rec.source_step < 0) {
              m.committed = rec.source_step = 0;
              rec.source = m.id;
            }
          }
          if (rec.source_step < 0) {  // only joiners that never got the state (and part-written members) are left
            if (job_done()) fail_job_finished("finished before this worker received the training state");
            fail(error::invalid_state, "no member holding the training state is left after generation " + gs +
                                           " failed: the state is lost (restart from a checkpoint)");
          }
          auto p = plan_of(ids);
          rec.plan.assign(p.begin(), p.end());
          rec.plan_version = gen_.plan_version + 1;
          rec.joins_seen = seen;
          const std::string mine = to_value(rec.encode());
          const std::string cur = store_->compare_set(next_key, "", mine, store_deadline()).current;
          if (cur == mine) {
            for (auto j : joiners)
              store_->set(key("joined/" + std::to_string(j)), std::to_string(g + 1), store_deadline());
            answer_holds(*store_, holds);
          }
          next = detail::generation_record::decode(to_bytes(cur));
          break;
        }
      }
      if (overall.expired())
        fail(error::timeout, "could not re-form the group after generation " + gs +
                                 " within EBBFLOW_OP_TIMEOUT_MS + EBBFLOW_MIN_WAIT_MS (" +
                                 std::to_string((opts_.op_timeout + opts_.min_size_wait).count()) + " ms)" +
                                 (undecided_ids.empty() ? "" : "; undecided: member(s) " + undecided_ids));
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (next->rank_of(id_) < 0 && leave_requested_.load()) {
      leave_now();  // it was leaving anyway
      return;
    }
    if (next->rank_of(id_) < 0) {
      EBBFLOW_LOG_WARN("member " << id_ << " was left out of generation " << next->generation << ": rejoining");
      wait_admission();
      return;
    }
    if (next->reason != change_reason::failure) {
      // A join or leave decided before the failure, whose members were
      // connecting in the background. Its committed steps date from that
      // decision, and the survivors may now be a step apart (a failure can
      // hit after some of them committed a step): adopting it could pair
      // different steps' gradients. Never adopted by a recovery: every member
      // fails it over in turn, so the next record holds the real steps.
      EBBFLOW_LOG_WARN("generation " << next->generation << " (" << name(next->reason)
                                     << ") was decided before generation " << gs << " failed: failing it over too");
      enter(std::move(*next));
      g = gen_.generation;
      lost_peer = -1;
      continue;
    }
    try {
      adopt(std::move(*next), started);
      return;
    } catch (const system_error& e) {
      if (!detail::recoverable(e.code())) throw;
      g = gen_.generation;
      lost_peer = lost_in_adopt(e);
    }
  }
}

template <kv_store Store, network Net>
int group_impl<Store, Net>::lost_peer_of(const system_error& e) const noexcept {
  // Only a transport that saw a peer die may name it: a collective's error
  // names the neighbour whose transfer failed, which in a ring is often a
  // live member stuck behind the dead one. Reporting it dead would exclude it.
  if (e.code() != errc::peer_lost) return -1;
  if constexpr (requires(const transport_type& t) {
                  { t.lost_peer() } -> std::convertible_to<int>;
                }) {
    return transport_ ? transport_->lost_peer() : -1;
  } else {
    return e.peer();
  }
}

template <kv_store Store, network Net>
int group_impl<Store, Net>::lost_in_adopt(const system_error& e) noexcept {
  // adopt() runs no collective: a member its error names stopped heartbeating
  // or never published its address, or its endpoint could not be made; it
  // is not a live neighbour stuck behind a dead one (lost_peer_of). Nor can
  // lost_peer_of ask the transport: the new one is not made yet.
  return e.code() == errc::peer_lost ? e.peer() : -1;
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::take_own_initial_state() {
  if (!own_initial_state_)
    fail(error::invalid_state, "member " + std::to_string(id_) + " was made the source of generation " +
                                   std::to_string(gen_.generation) + " without the training state");
  const auto p = restored_.value_or(position{0, 0, 0});
  step_ = p.step;
  epoch_ = p.epoch;
  cursor_ = p.cursor;
  EBBFLOW_LOG_WARN("the member that formed the first generation died before its state moved: member "
                   << id_ << " (launch rank " << launch_.rank << ") serves its own initial state"
                   << (restored_ ? " and restored position" : "") << " (step " << step_ << ")");
}

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
