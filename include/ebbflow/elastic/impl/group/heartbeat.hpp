// SPDX-License-Identifier: Apache-2.0
//! @file impl/group/heartbeat.hpp
//! The heartbeat thread and leases: each beat adds to this member's counter
//! and reads, in one round trip, the counters of the members it watches (the
//! coordinator watches all, the others the coordinator), the launchers'
//! exit reports and, when stalled, the others' progress. A member silent
//! for a lease or reported gone is marked dead and its generation aborted.
//! Between beats it waits on the server for its generation's abort (and the
//! coordinator for the next join ticket).
//! Threads: heartbeat_loop, check_*, abort_* and report_stall run on the
//! heartbeat thread, on its own store client; besides the settings they touch
//! only the hb_* members (under hb_mutex_) and the atomics the training thread
//! publishes (progress_, waiting_since_, probation_end_, join_seq_hint_).
//! fresh and stale_member serve any thread, with its store and lease map.
#pragma once

#include <ebbflow/elastic/detail/group_impl.hpp>
#include <ebbflow/elastic/detail/store_ops.hpp>

#include <sstream>
#include <string>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

template <kv_store Store, network Net>
void group_impl<Store, Net>::heartbeat_loop(std::stop_token st) {
  std::unique_ptr<Store> s;
  bool warned = false;                      // a failure other than the store's was logged
  steady_clock::time_point next_warning{};  // while the store is unreachable: when to say so again
  peer_watch peers;
  std::vector<std::string> keys;
  std::vector<std::int64_t> deltas;
  std::vector<std::string> wake;  // the keys to wait for between beats
  std::vector<member_id> watched;
  std::vector<int> watched_ranks;
  std::int64_t published = 0;          // this member's progress counter in the store, as last read
  std::int64_t next_ticket = 1;        // coordinator: the first join ticket not read yet
  steady_clock::rep stall_warned = 0;  // the wait (its start) last reported
  struct {
    std::int64_t reports = 0, generation = -1;
  } gone;  // the count of exit reports last read, for the watched members of which generation
  std::int64_t round_generation = -1;  // the generation this round was for
  while (!st.stop_requested()) {
    try {
      if (!s) s = connect_store_();
      const std::int64_t g = round_generation = hb_generation_.load();
      const bool watch = hb_watch_joins_.load(std::memory_order_relaxed);
      {
        std::lock_guard lk(hb_mutex_);
        if (g >= 0 && hb_watched_gen_ == g)
          watched = hb_watched_, watched_ranks = hb_watched_ranks_;
        else
          watched.clear(), watched_ranks.clear();
      }
      // A wait in one collective longer than stall_warning: this round also
      // reads the watched members' progress, to say who is behind.
      const std::int64_t progress = progress_.load(std::memory_order_relaxed);
      const auto since = waiting_since_.load(std::memory_order_relaxed);
      const auto waited = steady_clock::now() - steady_clock::time_point(steady_clock::duration(since));
      const bool stalled = opts_.stall_warning.count() > 0 && since != 0 && since != stall_warned &&
                           waited >= opts_.stall_warning && !watched.empty();
      // One round trip: this member's heartbeat and progress, the counters of
      // the members whose leases it watches, (coordinator) the join-ticket
      // counter and (stalled) the watched members' progress.
      keys.assign({key("hb/" + std::to_string(id_))});
      deltas.assign({1});
      const bool publish = progress != published;
      if (publish) keys.push_back(key("progress/" + std::to_string(id_))), deltas.push_back(progress - published);
      const std::size_t hb_at = keys.size();
      for (auto w : watched) keys.push_back(key("hb/" + std::to_string(w))), deltas.push_back(0);
      const std::size_t join_at = keys.size();
      if (watch) keys.push_back(key("join_seq")), deltas.push_back(0);
      const std::size_t gone_at = keys.size();
      keys.push_back(opts_.gone_count_key()), deltas.push_back(0);
      const std::size_t progress_at = keys.size();
      if (stalled)
        for (auto w : watched) keys.push_back(key("progress/" + std::to_string(w))), deltas.push_back(0);
      const auto counters =
          detail::add_all(*s, keys, deltas, deadline::after(opts_.heartbeat * 4 + std::chrono::milliseconds(100)));
      if (publish) published = counters[1];
      if (watch) {
        // The new tickets first, then the hint: a step that sees the hint
        // finds them read (prefetch_tickets makes no call while none is new).
        next_ticket = prefetch_tickets(*s, counters[join_at]);
        join_seq_hint_.store(counters[join_at], std::memory_order_relaxed);
      }
      if (const auto end = probation_end_.load(std::memory_order_relaxed);
          end != 0 && steady_clock::now().time_since_epoch().count() >= end) {
        // A newcomer that stayed: its worker's join failures no longer run in a row.
        s->set(key("wkey/" + std::to_string(id_)), "", store_deadline());
        s->set(key("joinfail/" + opts_.worker_key), "0", store_deadline());
        probation_end_.store(0, std::memory_order_relaxed);
      }
      if constexpr (requires { s->erase(std::string()); }) {
        std::vector<std::string> erase;
        {
          std::lock_guard lk(hb_mutex_);
          erase.swap(hb_erase_);
        }
        for (auto& k : erase) s->erase(k);
      }
      if (g >= 0 && s->try_get(key("abort/" + std::to_string(g)), store_deadline())) {
        peers.aborted = g;
        std::lock_guard lk(hb_mutex_);
        if (hb_revoke_ && !hb_revoke_->revoked()) {
          EBBFLOW_LOG_DEBUG("generation " << g << " aborted by a peer: revoking the transport");
          hb_revoke_->revoke();
        }
      } else if (!watched.empty()) {
        // A launcher's report of an exit (report_process_exit) is read once
        // per new report, and once per generation (new members watched).
        if (const auto reports = counters[gone_at];
            g >= 0 && reports != 0 && (reports != gone.reports || g != gone.generation)) {
          check_gone(*s, g, watched, watched_ranks, peers);
          gone = {reports, g};
        }
        check_leases(*s, g, watched, std::span(counters).subspan(hb_at, watched.size()), peers);
        if (stalled && detail::progress::decode(progress).generation == detail::progress::stored_generation(g)) {
          stall_warned = since;
          report_stall(progress, waited, watched, watched_ranks,
                       std::span(counters).subspan(progress_at, watched.size()), watch);
        }
      }
      warned = false;
      if (const auto down = store_down_since_.exchange(0, std::memory_order_relaxed); down != 0)
        EBBFLOW_LOG_WARN("the store is reachable again, after " << seconds_since(down) << " s");
      // Between beats the thread waits on the server instead of sleeping:
      // for its generation's abort, which then revokes this member's
      // transport at once, not at its next beat (a survivor whose own peers
      // are alive learns of a death only this way); and the coordinator for
      // the next join ticket too, which then reaches the hint at once (one
      // counted but not yet written is the next one to wait for).
      wake.clear();
      if (watch) wake.push_back(key("join/" + std::to_string(next_ticket)));
      if (g >= 0 && g != peers.aborted) wake.push_back(key("abort/" + std::to_string(g)));
      if (!wake.empty()) {
        detail::wait_any_key(*s, wake, deadline::after(opts_.heartbeat), st);
        continue;
      }
    } catch (const std::exception& e) {
      const auto* se = dynamic_cast<const system_error*>(&e);
      if (se && store_failure(*se) && (se->code() == errc::peer_lost || se->code() == errc::timeout)) {
        note_store_unreachable(e.what(), next_warning);
      } else if (!warned) {
        EBBFLOW_LOG_WARN("heartbeat of member " << id_ << " failed: " << e.what());
        warned = true;
      }
      s.reset();
    }
    // Not a member (yet): the next round comes at the next beat, or as soon
    // as this process becomes one (it then waits for its generation's abort).
    std::unique_lock lk(hb_wake_m_);
    hb_wake_.wait_for(lk, st, opts_.heartbeat, [&] { return round_generation < 0 && hb_generation_.load() >= 0; });
  }
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::check_gone(Store& st, std::int64_t g, const std::vector<member_id>& ids,
                                        const std::vector<int>& ranks, peer_watch& w) {
  if (w.aborted == g) return;
  std::vector<std::string> keys;
  for (auto m : ids) keys.push_back(opts_.gone_key(m));
  const auto how = detail::try_get_all(st, keys, store_deadline());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (!how[i]) continue;
    if (!abort_due(st, g)) return;
    EBBFLOW_LOG_WARN("member " << ids[i] << " (rank " << ranks[i] << " of generation " << g
                               << ") is gone: its launcher saw its process exit (" << *how[i]
                               << "); aborting generation " << g << " without it");
    abort_without(st, g, ids[i], w);
    return;
  }
}

template <kv_store Store, network Net>
bool group_impl<Store, Net>::abort_due(Store& st, std::int64_t g) {
  if (st.try_get(key("done"), store_deadline())) return false;  // the job finished: its members stop and exit
  return hb_generation_.load() == g;                            // else the generation changed meanwhile
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::abort_without(Store& st, std::int64_t g, member_id m, peer_watch& w) {
  st.set(dead_key(g, m), "1", store_deadline());
  st.set(key("abort/" + std::to_string(g)), "1", store_deadline());
  w.aborted = g;
  std::lock_guard lk(hb_mutex_);
  if (hb_revoke_ && !hb_revoke_->revoked()) hb_revoke_->revoke();
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::check_leases(Store& st, std::int64_t g, const std::vector<member_id>& ids,
                                          std::span<const std::int64_t> hb, peer_watch& w) {
  // A member that hangs inside a collective (a stopped process, a livelock)
  // fails no transport operation: without this, its peers would wait for the
  // collective's deadline (op_timeout). Its silent lease aborts the step.
  const auto now = steady_clock::now();
  if (w.generation != g || now - w.last_round > opts_.lease / 2) {
    // A new generation, or a gap in this thread's own rounds (it was
    // descheduled, the machine paused): that says nothing of the others, so
    // their leases are timed afresh.
    w.seen.clear();
    w.generation = g;
  }
  w.last_round = now;
  if (w.aborted == g) return;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (fresh(ids[i], hb[i], now, w.seen)) continue;
    if (!abort_due(st, g)) return;
    EBBFLOW_LOG_WARN("member " << ids[i] << " sent no heartbeat for EBBFLOW_LEASE_MS="
                               << std::chrono::duration_cast<std::chrono::milliseconds>(opts_.lease).count()
                               << " ms: aborting generation " << g << " without it");
    abort_without(st, g, ids[i], w);
    return;
  }
}

template <kv_store Store, network Net>
bool group_impl<Store, Net>::fresh(Store& st, member_id m, lease_seen& seen) const {
  const std::int64_t hb = st.add(key("hb/" + std::to_string(m)), 0, store_deadline());
  return fresh(m, hb, steady_clock::now(), seen);
}

template <kv_store Store, network Net>
bool group_impl<Store, Net>::fresh(member_id m, std::int64_t hb, steady_clock::time_point now, lease_seen& seen) const {
  auto it = seen.find(m);
  if (it == seen.end()) {
    seen.emplace(m, std::make_pair(hb, now));
    return true;
  }
  if (it->second.first != hb) {
    it->second = {hb, now};
    return true;
  }
  return now - it->second.second < opts_.lease;
}

template <kv_store Store, network Net>
int group_impl<Store, Net>::stale_member(const detail::generation_record& rec, lease_watch& w, bool joiners_only) {
  // The rank in `rec` of a member (other than this one; with `joiners_only`,
  // a joiner) whose lease expired, else -1. Reads the store at most once per
  // heartbeat period.
  const auto now = steady_clock::now();
  if (now < w.next_check) return -1;
  w.next_check = now + opts_.heartbeat;
  for (std::size_t j = 0; j < rec.members.size(); ++j) {
    const auto& m = rec.members[j];
    if (m.id == id_ || (joiners_only && m.committed >= 0)) continue;
    if (!fresh(*store_, m.id, w.seen)) return static_cast<int>(j);
  }
  return -1;
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::report_stall(std::int64_t mine, steady_clock::duration waited,
                                          const std::vector<member_id>& ids, const std::vector<int>& ranks,
                                          std::span<const std::int64_t> progress, bool coordinator) const {
  std::string behind;
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (progress[i] < mine)
      behind += (behind.empty() ? "" : ", ") + std::to_string(ids[i]) + " (rank " + std::to_string(ranks[i]) +
                (coordinator ? ")" : ", the coordinator)");
  const auto ms = [](auto d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); };
  std::ostringstream where;
  const auto at = detail::progress::decode(mine);
  where << "generation " << at.generation << ": member " << id_ << " has waited " << ms(waited) << " ms in ";
  if (at.collective == 0)
    where << "the control exchange after step " << at.step - 1;
  else
    where << "collective " << at.collective << " of step " << at.step;
  if (behind.empty()) {
    // A member this one does not watch is behind: the coordinator names it.
    EBBFLOW_LOG_DEBUG(where.str() << "; the members it watches have reached it");
    return;
  }
  EBBFLOW_LOG_WARN(where.str() << "; member(s) " << behind
                               << " have not reached it while their heartbeats go on (a training thread stuck "
                                  "outside ebbflow, e.g. in a data loader or a lock, or a collective skipped); "
                                  "EBBFLOW_OP_TIMEOUT_MS="
                               << ms(opts_.op_timeout) << " ms after it began, the step aborts and the group "
                               << "goes on without them");
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::note_store_unreachable(const char* why, steady_clock::time_point& next_warning) {
  // Training goes on without the store (a steady step makes no store call),
  // but nothing that needs it can happen: said at once, and again every
  // store_warning_period while it lasts. Meanwhile every store call of this
  // member fails within a lease (store_deadline).
  const auto now = steady_clock::now();
  steady_clock::rep since = 0;
  if (store_down_since_.compare_exchange_strong(since, now.time_since_epoch().count(), std::memory_order_relaxed)) {
    since = now.time_since_epoch().count();
    next_warning = now;
  }
  if (now < next_warning) return;
  next_warning = now + store_warning_period;
  const auto down_s = seconds_since(since);
  EBBFLOW_LOG_WARN("the store " << (down_s > 0 ? "has been unreachable for " + std::to_string(down_s) + " s"
                                               : std::string("cannot be reached"))
                                << " (" << why
                                << "): training goes on, but no worker can join, leave or fail over until it is back "
                                   "(docs/elastic.md, \"When the store dies\")");
}

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
