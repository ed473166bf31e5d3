// SPDX-License-Identifier: Apache-2.0
//! @file impl/group/formation.hpp
//! Becoming a member: generation 0 formed from the launched workers (launch
//! rank 0 proposes it once all registered or after `initial_wait`; the
//! others take over when it never came), and a newcomer's join ticket and
//! its wait for admission (with the join cool-down).
//! Training thread only.
#pragma once

#include <ebbflow/elastic/detail/group_impl.hpp>
#include <ebbflow/elastic/detail/store_ops.hpp>

#include <algorithm>
#include <sstream>
#include <string>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

template <kv_store Store, network Net>
void group_impl<Store, Net>::propose_initial(const std::vector<std::optional<std::string>>& registered) {
  detail::generation_record rec;
  rec.generation = 0;
  rec.reason = change_reason::initial;
  std::vector<member_id> ids;
  std::string missing, over;
  for (std::size_t r = 0; r < registered.size(); ++r) {
    if (!registered[r]) {
      detail::append_listed(missing, std::to_string(r));
      continue;
    }
    const member_id m = detail::parse_i64(*registered[r]);
    if (static_cast<int>(ids.size()) >= opts_.max_size && m != id_) {
      detail::append_listed(over, std::to_string(r));
      continue;
    }
    rec.members.push_back({m, m == id_ ? 0 : -1});  // the proposer holds the initial state
    ids.push_back(m);
  }
  if (!over.empty())
    EBBFLOW_LOG_WARN("launch rank(s) " << over << " above EBBFLOW_MAX_SIZE=" << opts_.max_size
                                       << ": they wait to join as newcomers");
  // Launch rank 0 names the workers it starts without; another launch rank
  // proposes only when rank 0 is gone, and has said so (form_initial).
  if (!missing.empty() && launch_.rank == 0)
    EBBFLOW_LOG_WARN("initial worker(s) " << missing << " did not register within EBBFLOW_INITIAL_WAIT_MS="
                                          << opts_.initial_wait.count() << " ms: starting with " << ids.size() << " of "
                                          << registered.size() << "; a late one joins as a newcomer");
  rec.source = id_;
  rec.source_step = 0;
  auto p = plan_of(ids);
  rec.plan.assign(p.begin(), p.end());
  rec.plan_version = 1;
  rec.joins_seen = 0;
  const std::string mine = to_value(rec.encode());
  if (store_->compare_set(gen_key(0), "", mine, store_deadline()).current == mine) step_ = 0;
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::form_initial() {
  const auto started = steady_clock::now();
  store_->set(key("init/" + std::to_string(launch_.rank)), std::to_string(id_), store_deadline());
  const std::string gkey = gen_key(0);
  std::vector<std::string> keys;
  for (int r = 0; r < launch_.world_size; ++r) keys.push_back(key("init/" + std::to_string(r)));
  const auto overall = deadline::after(opts_.join_timeout);
  const auto registered = [&] {
    auto got = detail::try_get_all(*store_, keys, store_deadline());
    return std::pair{got,
                     static_cast<int>(std::count_if(got.begin(), got.end(), [](auto& v) { return v.has_value(); }))};
  };
  if (launch_.rank == 0) {
    // Every launched worker, for up to initial_wait; then those registered,
    // if at least min_size (a worker that died while starting must not stop
    // the job), waiting on for min_size of them until join_timeout.
    const auto all_by = std::min(deadline::after(opts_.initial_wait).at(), overall.at());
    for (bool first = true;; first = false) {
      try {
        store_->wait(keys, first ? deadline(all_by) : deadline::after(std::chrono::milliseconds(100)));
      } catch (const system_error& e) {
        if (e.code() != errc::timeout) throw;
      }
      auto [got, present] = registered();
      if (present == launch_.world_size || present >= opts_.min_size) {
        propose_initial(got);
        break;
      }
      if (overall.expired())
        fail(error::timeout, "only " + std::to_string(present) + " of the " + std::to_string(launch_.world_size) +
                                 " initial workers registered within EBBFLOW_JOIN_TIMEOUT_MS, fewer than "
                                 "EBBFLOW_MIN_SIZE=" +
                                 std::to_string(opts_.min_size));
    }
  } else {
    // Launch rank 0 writes generation 0 within initial_wait. If it has not
    // by then (plus a lease) and it never registered or its heartbeat has
    // stopped, the registered workers propose generation 0 without it: the
    // first compare-and-set wins.
    const auto takeover_at = deadline::after(opts_.initial_wait + opts_.lease);
    lease_seen seen;
    for (;;) {
      try {
        const bool early = !takeover_at.expired();
        store_->wait({gkey}, early ? deadline(std::min(takeover_at.at(), overall.at()))
                                   : deadline::after(std::chrono::milliseconds(100)));
        break;
      } catch (const system_error& e) {
        if (e.code() != errc::timeout) throw;
      }
      if (overall.expired())
        fail(error::timeout, "the initial generation was not formed within EBBFLOW_JOIN_TIMEOUT_MS");
      if (!takeover_at.expired()) continue;
      auto [got, present] = registered();
      if (got[0] && fresh(*store_, detail::parse_i64(*got[0]), seen)) continue;  // rank 0 lives: it decides
      if (got[0]) got[0].reset(), --present;
      if (present >= opts_.min_size) {
        EBBFLOW_LOG_WARN("launch rank 0 did not form the initial generation within EBBFLOW_INITIAL_WAIT_MS="
                         << opts_.initial_wait.count() << " ms ("
                         << (seen.empty() ? "it never registered" : "its heartbeat stopped") << "): launch rank "
                         << launch_.rank << " proposes it without rank 0");
        propose_initial(got);
        break;
      }
    }
  }
  auto rec = detail::generation_record::decode(to_bytes(*store_->try_get(gkey, store_deadline())));
  if (rec.rank_of(id_) < 0) {  // registered after the initial generation was formed without it
    EBBFLOW_LOG_WARN("the initial generation was formed without launch rank " << launch_.rank
                                                                              << ": joining as a newcomer");
    wait_admission();
    return;
  }
  adopt_or_recover(std::move(rec), started);
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::wait_admission() {
  const auto started = steady_clock::now();
  step_ = -1;
  own_initial_state_ = false;  // the group went on without this member: its buffers are not the job's
  const bool cooldown = opts_.join_cooldown.count() > 0;
  // Until its probation ends, a newcomer that dies counts as a join failure
  // of its worker (count_join_failures).
  if (cooldown) store_->set(key("wkey/" + std::to_string(id_)), opts_.worker_key, store_deadline());
  const std::string jkey = key("joined/" + std::to_string(id_));
  // A member left out of its generation rejoins here; its key still names
  // the generation it was admitted to before, which it must not adopt again.
  const std::int64_t left = gen_.generation;
  const auto admitted = [&]() -> bool {
    auto v = store_->try_get(jkey, store_deadline());
    if (!v) return false;
    const auto g = detail::parse_i64(*v);
    if (g <= left) return false;
    if (cooldown)
      probation_end_.store((steady_clock::now() + opts_.join_cooldown_max).time_since_epoch().count(),
                           std::memory_order_relaxed);
    adopt_or_recover(detail::generation_record::decode(to_bytes(*store_->try_get(gen_key(g), store_deadline()))),
                     started);
    return true;
  };
  // A leave request (SIGTERM through leave_on_signal: the launcher retiring
  // its newest worker) ends the wait: this worker leaves without joining.
  // Were it admitted meanwhile, the others find its lease expired.
  const auto asked_to_leave = [&] {
    if (detail::signal_leave_flag().load()) leave_requested_.store(true);
    if (!leave_requested_.load()) return false;
    EBBFLOW_LOG_INFO("member " << id_ << " asked to leave while waiting to be admitted: leaving without joining");
    leave_now();
    return true;
  };
  // Waits on the server (no polling: waiting newcomers cost the running
  // members nothing), in slices so the job's end is noticed.
  const auto wait_slice = [&](const deadline& d) {
    if (job_done()) fail_job_finished("finished before this worker was admitted");
    try {
      store_->wait({jkey}, min(d, deadline::after(std::chrono::milliseconds(200))));
    } catch (const system_error& e) {
      if (e.code() != errc::timeout) throw;
    }
  };
  std::int64_t held_for = 0;  // join failures in a row whose cool-down this worker waited out
  for (;;) {                  // one ticket per pass; a cool-down answer starts the next
    const auto seq = store_->add(key("join_seq"), 1, store_deadline());
    store_->set(key("join/" + std::to_string(seq)),
                std::to_string(id_) + " " + std::to_string(held_for) + " " + opts_.worker_key, store_deadline());
    EBBFLOW_LOG_INFO("member " << id_ << " waiting to be admitted (join ticket " << seq << ")");
    const auto d = deadline::after(opts_.join_timeout);
    const std::string hkey = key("held/" + std::to_string(seq));
    std::optional<std::string> hold;
    while (!hold) {
      if (admitted() || asked_to_leave()) return;
      if (cooldown) hold = store_->try_get(hkey, store_deadline());
      if (hold) break;
      if (d.expired())
        fail(error::timeout, "not admitted within EBBFLOW_JOIN_TIMEOUT_MS (group at max size, or no coordinator)");
      wait_slice(d);
    }
    std::istringstream in(*hold);
    std::int64_t ms = 0;
    in >> ms >> held_for;
    EBBFLOW_LOG_WARN("worker '" << opts_.worker_key << "' failed " << held_for
                                << " times in a row while joining: held back " << static_cast<double>(ms) / 1000
                                << " s (EBBFLOW_JOIN_COOLDOWN)");
    const auto until = deadline::after(std::chrono::milliseconds(ms));
    while (!until.expired()) {
      if (admitted() || asked_to_leave()) return;  // an older ticket of this member was admitted after all
      wait_slice(until);
    }
  }
}

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
