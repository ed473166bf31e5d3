// SPDX-License-Identifier: Apache-2.0
//! @file impl/group/join_tickets.hpp
//! The coordinator's queue of newcomers: join tickets (read ahead by its
//! heartbeat thread so a step that admits them makes no store call),
//! admission once no new ticket came for `admit_delay`, tickets skipped
//! when never written or malformed, and the join cool-down of workers whose
//! newcomers kept failing (counted once per failure by the recovery).
//! pending_joiners and count_join_failures: training thread;
//! prefetch_tickets: heartbeat thread (hb_tickets_ under hb_mutex_).
#pragma once

#include <ebbflow/elastic/detail/group_impl.hpp>
#include <ebbflow/elastic/detail/store_ops.hpp>

#include <algorithm>
#include <string>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

template <kv_store Store, network Net>
std::vector<member_id> group_impl<Store, Net>::pending_joiners(std::int64_t& seen, std::size_t room, bool settle,
                                                               std::vector<join_hold>& holds) {
  std::vector<member_id> out;
  // At a step boundary the heartbeat thread's hint (fresh within a few store
  // round trips of a ticket) stands in for the counter: while tickets keep
  // arriving, the coordinator's steps then make no store call at all.
  auto total =
      settle ? join_seq_hint_.load(std::memory_order_relaxed) : store_->add(key("join_seq"), 0, store_deadline());
  if (settle) {
    // Admit once no new ticket appeared for admit_delay (bounded by 10×):
    // workers started together register a few ms apart, and admitting them
    // together costs the members one switch instead of several.
    const auto now = steady_clock::now();
    if (total > ticket_seen_until_) {
      if (ticket_seen_until_ <= seen) ticket_first_seen_ = now;  // the oldest waiting ticket
      ticket_seen_until_ = total;
      ticket_last_change_ = now;
    }
    const bool quiet = now - ticket_last_change_ >= opts_.admit_delay;
    const bool overdue = now - ticket_first_seen_ >= 10 * opts_.admit_delay;
    if (!quiet && !overdue) total = seen;
  }
  std::vector<std::string> keys;
  for (std::int64_t t = seen + 1; t <= total && keys.size() < room; ++t)
    keys.push_back(key("join/" + std::to_string(t)));
  const bool with_failures = opts_.join_cooldown.count() > 0;
  // At a step boundary the heartbeat thread has read them (and their
  // workers' failure counts) before it raised the hint: no store call then.
  // Otherwise, or if any is missing, they are read here.
  std::vector<std::optional<std::string>> values, failures;
  bool cached = settle && !keys.empty();
  if (cached) {
    std::lock_guard lk(hb_mutex_);
    for (std::size_t i = 0; i < keys.size() && cached; ++i) {
      const auto it = hb_tickets_.find(seen + 1 + static_cast<std::int64_t>(i));
      cached = it != hb_tickets_.end() &&
               (!with_failures || it->second.failures_epoch == failures_epoch_.load(std::memory_order_acquire));
      if (cached) values.emplace_back(it->second.value), failures.push_back(it->second.failures);
    }
  }
  if (!cached) values = detail::try_get_all(*store_, keys, store_deadline());
  struct ticket {
    std::int64_t seq;
    member_id id;
    std::int64_t held_for = 0;
    std::string worker;
    std::optional<std::string> failures;
  };
  std::vector<ticket> tickets;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const auto& v = values[i];
    if (!v) {
      // Taken but not yet written: a newcomer writes its ticket right after
      // it takes the number, so it is picked up next time. One that stays
      // unwritten for a lease (its newcomer died in between) is skipped:
      // kept, it would stop every later ticket.
      const auto now = steady_clock::now();
      if (ticket_hole_ != seen + 1) ticket_hole_ = seen + 1, ticket_hole_since_ = now;
      if (now - ticket_hole_since_ < opts_.lease) break;
      ++seen;
      EBBFLOW_LOG_WARN(
          "join ticket " << seen << " was taken but not written for "
                         << std::chrono::duration_cast<std::chrono::milliseconds>(now - ticket_hole_since_).count()
                         << " ms (EBBFLOW_LEASE_MS=" << opts_.lease.count()
                         << "; did its newcomer die before writing it?): skipped");
      continue;
    }
    ++seen;
    auto p = detail::join_ticket::parse(*v);
    ticket t{seen, -1, p.held_for, std::move(p.worker), cached ? failures[i] : std::nullopt};
    try {
      t.id = detail::parse_i64(p.id);
    } catch (const system_error&) {
      // Consumed and skipped: kept, it would stop every later ticket.
      EBBFLOW_LOG_WARN("join ticket " << seen << " is malformed ('" << v->substr(0, 64) << "'): skipped");
      continue;
    }
    tickets.push_back(std::move(t));
  }
  // The failure counts of the tickets' workers, in one batch (only when a
  // ticket arrived and the heartbeat thread had not read them: this runs on
  // the coordinator's training thread).
  std::vector<std::optional<std::string>> counts(tickets.size());
  if (with_failures && !tickets.empty()) {
    if (cached) {
      for (std::size_t i = 0; i < tickets.size(); ++i) counts[i] = tickets[i].failures;
    } else {
      std::vector<std::string> ckeys;
      for (auto& t : tickets) ckeys.push_back(key("joinfail/" + t.worker));
      counts = detail::try_get_all(*store_, ckeys, store_deadline());
    }
  }
  for (std::size_t i = 0; i < tickets.size(); ++i) {
    const auto& t = tickets[i];
    // A member that filed a second ticket (after a cool-down) is admitted once.
    if (gen_.rank_of(t.id) >= 0 || std::find(out.begin(), out.end(), t.id) != out.end()) continue;
    const auto failures = detail::join_failures::parse(counts[i]).count;
    if (!t.worker.empty() && failures >= 2 && t.held_for < failures) {
      const auto wait = cooldown{opts_.join_cooldown, opts_.join_cooldown_max}.after(failures);
      holds.push_back({t.seq, wait.count(), failures, t.worker});
      continue;
    }
    out.push_back(t.id);
  }
  return out;
}

template <kv_store Store, network Net>
std::int64_t group_impl<Store, Net>::prefetch_tickets(Store& st, std::int64_t total) {
  // The coordinator's heartbeat thread: reads the tickets after those it
  // holds, up to `total`, in one batch (64 at most a round), then the
  // failure counts of their workers (and again those of held tickets read
  // before a recovery) in a second. No call while nothing is new. Returns
  // the number of the first ticket it does not hold.
  const std::int64_t floor = hb_tickets_floor_.load(std::memory_order_relaxed);
  const std::int64_t epoch = failures_epoch_.load(std::memory_order_acquire);
  const bool with_failures = opts_.join_cooldown.count() > 0;
  std::int64_t from = floor + 1;
  std::vector<std::pair<std::int64_t, std::string>> stale;  // held tickets whose counts are older: (number, worker)
  {
    std::lock_guard lk(hb_mutex_);
    std::erase_if(hb_tickets_, [&](const auto& e) { return e.first <= floor; });
    for (auto it = hb_tickets_.find(from); it != hb_tickets_.end() && it->first == from; ++it, ++from)
      if (with_failures && it->second.failures_epoch != epoch)
        stale.emplace_back(it->first, detail::join_ticket::parse(it->second.value).worker);
  }
  std::vector<std::string> keys;
  for (std::int64_t t = from; t <= total && t < from + 64; ++t) keys.push_back(key("join/" + std::to_string(t)));
  std::vector<std::pair<std::int64_t, prefetched_ticket>> got;
  for (auto& v : detail::try_get_all(st, keys, store_deadline())) {
    if (!v) break;  // taken but not yet written: the next round
    got.emplace_back(from + static_cast<std::int64_t>(got.size()), prefetched_ticket{std::move(*v), -1, std::nullopt});
  }
  std::map<std::int64_t, std::optional<std::string>> counts;  // by ticket number
  if (with_failures) {
    for (auto& [n, t] : got) stale.emplace_back(n, detail::join_ticket::parse(t.value).worker);
    std::vector<std::string> ckeys;
    std::vector<std::int64_t> of;
    for (auto& [n, worker] : stale) {
      if (worker.empty())
        counts[n] = std::nullopt;  // no worker key: no count to read
      else
        ckeys.push_back(key("joinfail/" + worker)), of.push_back(n);
    }
    auto values = detail::try_get_all(st, ckeys, store_deadline());
    for (std::size_t k = 0; k < of.size(); ++k) counts[of[k]] = std::move(values[k]);
  }
  std::lock_guard lk(hb_mutex_);
  for (auto& [n, t] : got) hb_tickets_.emplace(n, std::move(t));
  for (auto& [n, c] : counts)
    if (const auto it = hb_tickets_.find(n); it != hb_tickets_.end()) {
      it->second.failures = std::move(c);
      it->second.failures_epoch = epoch;
    }
  return from + static_cast<std::int64_t>(got.size());
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::answer_holds(Store& st, const std::vector<join_hold>& holds) const {
  for (auto& h : holds) {
    EBBFLOW_LOG_WARN("holding back worker '" << h.worker << "' (join ticket " << h.ticket << ") for "
                                             << static_cast<double>(h.ms) / 1000 << " s: it failed " << h.failures
                                             << " times in a row while joining");
    st.set(key("held/" + std::to_string(h.ticket)), std::to_string(h.ms) + " " + std::to_string(h.failures),
           store_deadline());
  }
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::count_join_failures(const std::vector<detail::member_entry>& alive,
                                                 std::set<member_id>& counted) {
  if (opts_.join_cooldown.count() <= 0) return;
  std::vector<member_id> lost;
  for (auto& m : gen_.members)
    if (!counted.contains(m.id) &&
        std::none_of(alive.begin(), alive.end(), [&](const auto& a) { return a.id == m.id; }))
      lost.push_back(m.id);
  if (lost.empty()) return;
  counted.insert(lost.begin(), lost.end());  // a recovery waiting below min_size asks again every few ms
  std::vector<std::string> keys;
  for (auto m : lost) keys.push_back(key("wkey/" + std::to_string(m)));
  const auto workers = detail::try_get_all(*store_, keys, store_deadline());
  for (std::size_t i = 0; i < lost.size(); ++i) {
    if (!workers[i] || workers[i]->empty()) continue;  // an initial member, or a newcomer past its probation
    // Every recovering member applies the failure before it reads join
    // tickets; the record of who was counted makes it count once.
    const std::string fkey = key("joinfail/" + *workers[i]);
    auto cur = store_->try_get(fkey, store_deadline()).value_or("");
    for (;;) {
      auto f = detail::join_failures::parse(cur);
      if (f.generation == gen_.generation && std::find(f.members.begin(), f.members.end(), lost[i]) != f.members.end())
        break;
      if (f.generation != gen_.generation) f.members.clear();
      ++f.count;
      f.generation = gen_.generation;
      f.members.push_back(lost[i]);
      const auto next = f.str();
      const auto r = store_->compare_set(fkey, cur, next, store_deadline());
      if (r.swapped) {
        EBBFLOW_LOG_WARN("member " << lost[i] << " of worker '" << *workers[i]
                                   << "' died while joining: its join failures in a row: " << f.count);
        break;
      }
      cur = r.current;
    }
  }
}

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
