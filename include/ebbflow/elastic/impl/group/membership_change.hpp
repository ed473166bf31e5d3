// SPDX-License-Identifier: Apache-2.0
//! @file impl/group/membership_change.hpp
//! Joins and leaves decided at a step boundary: which leaves apply, the
//! next generation's record, and its wire-up in the background by the
//! admission helper thread (lowest CPU priority, own store connection)
//! while training goes on; or the blocking way, which falls back to
//! recovery. The helper touches only what start_admission hands it.
#pragma once

#include <ebbflow/elastic/detail/group_impl.hpp>
#include <ebbflow/core/thread_name.hpp>
#include <ebbflow/elastic/detail/scheduling.hpp>
#include <ebbflow/elastic/detail/store_ops.hpp>

#include <algorithm>
#include <string>
#include <thread>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

template <kv_store Store, network Net>
std::vector<char> group_impl<Store, Net>::leaves_applied(const std::vector<double>& v, int n) {
  // Every member decides from the control exchange alone, so all agree.
  const std::size_t un = static_cast<std::size_t>(n);
  const int joiners = static_cast<int>(v[0]);
  std::vector<char> out(un, 0);
  int leaving = 0;
  for (std::size_t i = 0; i < un; ++i) leaving += out[i] = v[3 + 2 * un + i] > 0 ? 1 : 0;
  if (leaving == 0 || (leaving == n && joiners == 0)) {  // no leave, or everybody leaves: the job ends
    deferral_logged_ = false;
    return out;
  }
  // The members that stay and the newcomers admitted with them must number
  // at least min_size, and one member holding the state must stay when
  // newcomers come: the lowest-ranked leavers stay one more generation
  // (their leave request stands; they leave once others take their place).
  const int below = opts_.min_size - (n - leaving + joiners);
  int keep = std::max(below, leaving == n ? 1 : 0);
  std::string kept;
  for (std::size_t i = 0; i < un && keep > 0; ++i)
    if (out[i]) {
      out[i] = 0;
      --keep;
      detail::append_listed(kept, std::to_string(gen_.members[i].id));
    }
  if (!kept.empty() && rank_ == 0 && !deferral_logged_) {
    if (below > 0)
      EBBFLOW_LOG_WARN("member(s) " << kept << " asked to leave after step " << step_ - 1
                                    << ", but the group would fall below EBBFLOW_MIN_SIZE=" << opts_.min_size
                                    << ": they keep training until newcomers take their place");
    else
      EBBFLOW_LOG_INFO("member " << kept << " stays one more generation to hand the newcomers the state");
  }
  deferral_logged_ = !kept.empty();
  return out;
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::write_record(Store& st, const std::string& gkey, const std::string& rec,
                                          const std::vector<member_id>& joiners, std::int64_t g1) const {
  // The record must be written before the joiners are told, and before the
  // coordinator itself leaves. A concurrent recovery may have written
  // another one first: then the joiners are not told (that record does not
  // have them; they stay in the queue).
  if (st.compare_set(gkey, "", rec, store_deadline()).current == rec)
    for (auto j : joiners) st.set(key("joined/" + std::to_string(j)), std::to_string(g1), store_deadline());
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::change_membership(const std::vector<char>& leaving, int n) {
  const auto started = steady_clock::now();
  const std::size_t un = static_cast<std::size_t>(n);
  const std::int64_t g1 = gen_.generation + 1;
  const std::string gkey = gen_key(g1);
  const auto leaves = [&](std::size_t i) { return leaving[i] != 0; };
  const bool me_leaving = leaves(static_cast<std::size_t>(rank_));
  // With a network that connects in the background, the rest of the change
  // is done by a helper thread while this member keeps training.
  const bool background = detail::can_preconnect<Net>() && opts_.preconnect && !me_leaving;
  std::optional<std::string> record;  // the coordinator's, to write
  if (rank_ == 0) {
    detail::generation_record rec;
    rec.generation = g1;
    rec.reason = admitting_.empty() ? change_reason::leave : change_reason::join;
    std::vector<member_id> ids;
    for (std::size_t i = 0; i < un; ++i)
      if (!leaves(i)) {
        rec.members.push_back({gen_.members[i].id, step_});
        ids.push_back(gen_.members[i].id);
      }
    for (auto j : admitting_) {
      rec.members.push_back({j, -1});
      ids.push_back(j);
    }
    rec.source = rec.members.empty() ? -1 : rec.members.front().id;
    rec.source_step = step_;
    if (!ids.empty()) {
      auto p = plan_of(ids);
      rec.plan.assign(p.begin(), p.end());
    }
    rec.plan_version = gen_.plan_version + 1;
    rec.joins_seen = gen_.joins_seen;
    record = to_value(rec.encode());
    if (!background) {
      try {
        write_record(*store_, gkey, *record, admitting_, g1);
      } catch (const system_error& e) {
        // A coordinator that leaves goes even when the store is gone (a
        // SIGTERMed job whose store died): the others cannot switch without
        // the record and fail over, or end too when they all leave.
        if (!me_leaving || !store_failure(e)) throw;
        EBBFLOW_LOG_WARN("could not write the record of generation " << g1 << " (" << e.what()
                                                                     << "): leaving without it");
      }
    }
  }
  if (me_leaving) {
    if (detail::can_preconnect<Net>() && opts_.preconnect) {
      // The others connect among themselves in the background; this member
      // keeps training with them until they switch, then leaves.
      next_generation nx;
      nx.leaving = true;
      nx.since = steady_clock::now();
      next_ = std::move(nx);
      return;
    }
    leave_now();
    return;
  }
  std::vector<member_id> leavers;
  for (std::size_t i = 0; i < un; ++i)
    if (leaves(i)) leavers.push_back(gen_.members[i].id);
  if (background) {
    start_admission(std::move(record), gkey, g1, std::move(leavers), started);
    return;
  }
  adopt_announced(g1, started);
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::adopt_announced(std::int64_t g1, steady_clock::time_point started,
                                             std::optional<typename Net::transport_type> begun) {
  // The blocking way: wait for generation g1's record (the coordinator wrote
  // it, or a concurrent recovery did) and connect to it.
  const std::string gkey = gen_key(g1);
  try {
    store_->wait({gkey}, deadline::after(opts_.op_timeout));
  } catch (const system_error& e) {
    EBBFLOW_LOG_WARN("generation " << g1 << " was not announced: " << e.what() << "; re-forming");
    recover(gen_.generation, -1);
    return;
  }
  auto rec = detail::generation_record::decode(to_bytes(*store_->try_get(gkey, store_deadline())));
  if (rec.rank_of(id_) < 0) {  // a concurrent recovery excluded this member: rejoin
    wait_admission();
    return;
  }
  adopt_or_recover(std::move(rec), started, std::move(begun));
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::start_admission(std::optional<std::string> record, std::string gkey, std::int64_t g1,
                                             std::vector<member_id> leavers, steady_clock::time_point started) {
  // Joins and leaves without suspension: a helper thread writes the
  // coordinator's record, reads the next generation's record and addresses
  // and (where the network allows it) creates its endpoints, on a store
  // connection of its own, while this member's training thread goes on; the
  // members then connect to each other in the background, and end_step
  // switches once all are wired up (poll_next).
  if constexpr (detail::can_preconnect<Net>()) {
    next_generation nx;
    nx.since = started;
    nx.g1 = g1;
    nx.record = record;
    nx.admitted = admitting_;
    auto res = std::make_shared<admission_result>();
    nx.admission = res;
    std::vector<member_id> current;
    for (auto& m : gen_.members) current.push_back(m.id);
    // The helper starts a fifth of a step after the boundary (at most a
    // quarter lease): right after a boundary every member needs its CPU (the
    // control exchange completing, the next step's launches), and on a
    // kernel without preemption even a lowest-priority thread's system calls
    // (store requests, thread start-up) hold a shared core until they return.
    const auto delay = std::min<steady_clock::duration>(step_interval_ / 5, opts_.lease / 4);
    nx.helper = std::jthread([this, delay, res, record = std::move(record), joiners = admitting_,
                              gkey = std::move(gkey), g1, leavers = std::move(leavers), current = std::move(current),
                              rank = rank_, revoke = revoke_, cache = address_cache_,
                              concurrent = detail::concurrent_connect(*net_)](std::stop_token stop) mutable {
      // The lowest CPU priority: on a host whose cores the workers share,
      // this work fills their idle time (their device time) and never delays
      // a training thread that is ready to run.
      detail::lowest_cpu_priority();
      detail::sleep_until(steady_clock::now() + delay, stop);
      try {
        if (!aux_store_) aux_store_ = connect_store_();
        Store& st = *aux_store_;
        // The coordinator writes the record the others wait for. Tests make
        // another member's helper late here (EBBFLOW_FAULT=admission-helper:
        // sleep=MS) while the others' helpers start their transports.
        if (record)
          write_record(st, gkey, *record, joiners, g1);
        else
          fault_point("admission-helper", st, stop);
        const auto d = deadline::after(opts_.op_timeout);
        if (!detail::wait_key(st, gkey, d, stop))
          throw system_error(make_error_code(stop.stop_requested() ? error::revoked : error::timeout),
                             {.rank = rank,
                              .generation = g1,
                              .operation = "admission",
                              .detail = "waiting for the record of generation " + std::to_string(g1)});
        auto rec = detail::generation_record::decode(to_bytes(*st.try_get(gkey, store_deadline())));
        const int r = rec.rank_of(id_);
        if (r < 0) {
          res->excluded = true;  // a concurrent recovery excluded this member
        } else {
          for (auto m : current)
            if (rec.rank_of(m) < 0 && std::find(leavers.begin(), leavers.end(), m) == leavers.end())
              res->blocking = true;  // excluded by a concurrent recovery: the blocking way sorts it out
          if (!res->blocking) {
            res->addrs = gather_addresses(rec, st, cache, rank, revoke, stop);
            // The endpoints are made here, and their wire-up is driven from
            // here while the training thread computes: the peers' connect
            // messages are then handled in its compute (device) time rather
            // than inside its collectives. Never while it is inside the group
            // (in_group_), where it progresses the worker itself: this thread
            // would hold the worker's lock at the lowest priority, and the
            // training thread would wait for it. Bounded well below the lease
            // (past which the members finish the change themselves); what
            // is left completes as the training thread progresses the worker.
            if (concurrent) {
              res->transport.emplace(net_->start_connect(rec.generation, r, res->addrs));
              const auto until =
                  steady_clock::now() + std::min<steady_clock::duration>(4 * opts_.heartbeat, opts_.lease / 2);
              while (!stop.stop_requested() && steady_clock::now() < until) {
                if (in_group_.load(std::memory_order_relaxed) == 0 && res->transport->poll_connect()) break;
                std::this_thread::sleep_for(std::chrono::microseconds(100));
              }
            }
          }
        }
        res->cache = std::move(cache);
        res->rec = std::move(rec);
      } catch (...) {
        res->error = std::current_exception();
      }
      res->done.store(true, std::memory_order_release);
    });
    ::ebbflow::detail::name_thread(nx.helper, "ebbflow-admit");
    nx.prepared_seconds = std::chrono::duration<double>(steady_clock::now() - started).count();
    next_ = std::move(nx);
  } else {
    (void)record, (void)gkey, (void)g1, (void)leavers, (void)started;
  }
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::take_admission() {
  // The helper is done: its result becomes this member's next generation.
  auto res = std::move(next_->admission);
  next_->helper.join();
  if (res->rec) next_->rec = std::move(*res->rec);
  if (res->error) {
    next_->failed = true;
    std::rethrow_exception(res->error);
  }
  address_cache_ = std::move(res->cache);
  if (res->excluded || res->blocking) {
    next_->excluded = res->excluded;
    next_->failed = true;
    return;
  }
  if (res->transport) {
    next_->transport = std::move(res->transport);
  } else {  // the network cannot connect from another thread: here, then
    const auto t0 = steady_clock::now();
    next_->transport.emplace(net_->start_connect(next_->rec.generation, next_->rec.rank_of(id_), res->addrs));
    next_->prepared_seconds += std::chrono::duration<double>(steady_clock::now() - t0).count();
  }
  const double after_ms = std::chrono::duration<double>(steady_clock::now() - next_->since).count() * 1e3;
  EBBFLOW_LOG_INFO("generation " << next_->rec.generation << ": connecting " << next_->rec.members.size()
                                 << " members in the background (" << after_ms << " ms after the decision; "
                                 << next_->prepared_seconds * 1e3 << " ms of it on the training thread)");
}

template <kv_store Store, network Net>
int group_impl<Store, Net>::poll_next() {
  // 1: wired up; 0: not yet; -1: failed or overdue (the group then switches
  // the blocking way, which fails over to recovery).
  if constexpr (detail::can_preconnect<Net>()) {
    if (next_->leaving) return 1;  // nothing to connect: it leaves at the switch
    if (next_->failed) return -1;
    fault_point("preconnect");
    try {
      if (next_->admission) {
        // The helper runs at the lowest CPU priority: on a host whose cores
        // are all busy it may get no time at all. It has one lease; past
        // that, the members finish the change on their training threads.
        if (!next_->admission->done.load(std::memory_order_acquire)) {
          if (steady_clock::now() - next_->since <= opts_.lease) return 0;
          EBBFLOW_LOG_WARN("admission helper of generation "
                           << next_->g1 << " not done after EBBFLOW_LEASE_MS=" << opts_.lease.count()
                           << ": finishing the change on the training thread");
          return -1;
        }
        take_admission();
        if (next_->failed) return -1;
      }
      if (next_->transport->poll_connect()) return 1;
      // A joiner that died before it wired up: noticed through its lease.
      if (const int j = stale_member(next_->rec, next_->joiners, true); j >= 0) {
        EBBFLOW_LOG_WARN("joiner " << next_->rec.members[static_cast<std::size_t>(j)].id
                                   << " stopped heartbeating before it connected");
        return -1;
      }
    } catch (const system_error& e) {
      if (!detail::recoverable(e.code())) throw;
      EBBFLOW_LOG_WARN("background connect of generation " << next_->rec.generation << " failed: " << e.what());
      return -1;
    }
    return steady_clock::now() - next_->since > opts_.op_timeout ? -1 : 0;
  } else {
    return -1;
  }
}

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
