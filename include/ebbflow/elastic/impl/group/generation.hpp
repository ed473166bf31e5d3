// SPDX-License-Identifier: Apache-2.0
//! @file impl/group/generation.hpp
//! Entering a generation: publishing and gathering the members' addresses,
//! wiring up its transport while watching leases, installing it (the old
//! one closes in the background), handing the heartbeat thread what to
//! watch, and the members' scheduling; leaving the group.
//! Training thread, except gather_addresses(rec, st, ...), which the
//! admission helper also calls with its own store.
#pragma once

#include <ebbflow/elastic/detail/group_impl.hpp>
#include <ebbflow/elastic/detail/scheduling.hpp>
#include <ebbflow/elastic/detail/store_ops.hpp>

#include <pthread.h>
#include <string>
#include <thread>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

template <kv_store Store, network Net>
std::vector<bytes> group_impl<Store, Net>::gather_addresses(const detail::generation_record& rec) {
  return gather_addresses(rec, *store_, address_cache_, rank_, revoke_, {});
}

template <kv_store Store, network Net>
std::vector<bytes> group_impl<Store, Net>::gather_addresses(const detail::generation_record& rec, Store& st,
                                                            std::map<member_id, bytes>& cache, int rank,
                                                            const std::shared_ptr<comm::revoke_flag>& revoke,
                                                            std::stop_token stop) {
  // Every member publishes the address of its endpoint for this generation;
  // a member that stops heartbeating before it published is reported lost,
  // so the others fail over instead of waiting for the full deadline.
  constexpr bool stable = detail::stable_address<Net>();
  const std::string gs = std::to_string(rec.generation);
  std::vector<std::optional<bytes>> found(rec.members.size());
  if constexpr (stable)
    for (std::size_t j = 0; j < found.size(); ++j)
      if (auto it = cache.find(rec.members[j].id); it != cache.end()) found[j] = it->second;
  std::size_t cached = 0;
  for (auto& f : found) cached += f.has_value();
  lease_seen hb;
  const auto d = deadline::after(opts_.op_timeout);
  for (std::size_t missing = found.size() - cached;;) {
    std::vector<std::size_t> which;
    std::vector<std::string> keys;
    for (std::size_t j = 0; j < found.size(); ++j) {
      if (found[j]) continue;
      const member_id m = rec.members[j].id;
      which.push_back(j);
      keys.push_back(stable ? key("addr/" + std::to_string(m)) : key("addr/" + gs + "/" + std::to_string(m)));
    }
    auto values = detail::try_get_all(st, keys, store_deadline());
    for (std::size_t i = 0; i < which.size(); ++i) {
      const std::size_t j = which[i];
      const member_id m = rec.members[j].id;
      if (auto& v = values[i]) {
        found[j] = to_bytes(*v);
        if constexpr (stable) cache[m] = *found[j];
        --missing;
      } else if (!fresh(st, m, hb)) {
        throw system_error(make_error_code(error::peer_lost),
                           {.rank = rank,
                            .generation = rec.generation,
                            .peer = static_cast<int>(j),
                            .operation = "connect",
                            .detail = "member " + std::to_string(m) + " stopped before publishing its address"});
      }
    }
    if (missing == 0) break;
    if ((revoke && revoke->revoked()) || stop.stop_requested())
      throw system_error(make_error_code(error::revoked),
                         {.rank = rank, .generation = rec.generation, .operation = "connect"});
    if (d.expired())
      throw system_error(make_error_code(error::timeout),
                         {.rank = rank,
                          .generation = rec.generation,
                          .operation = "connect",
                          .detail = std::to_string(missing) + " members published no address"});
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  std::vector<bytes> out;
  for (auto& f : found) out.push_back(std::move(*f));
  return out;
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::enter(detail::generation_record rec) {
  // Becomes a member of `rec`'s generation: rank, revocation flag watched by
  // the heartbeat thread; the old transport is released.
  const int r = rec.rank_of(id_);
  EBBFLOW_EXPECTS(r >= 0);
  if (!opts_.join) became_member();  // a newcomer becomes one at the switch (sync_state)
  gen_ = std::move(rec);
  rank_ = r;
  log::set_rank(rank_);
  revoke_ = std::make_shared<comm::revoke_flag>();
  {
    std::lock_guard lk(hb_mutex_);
    hb_revoke_ = revoke_;
    hb_watched_gen_ = gen_.generation;
    hb_watched_.clear();
    hb_watched_ranks_.clear();
    for (std::size_t j = 0; j < gen_.members.size(); ++j)
      if (gen_.members[j].id != id_ && (rank_ == 0 || j == 0)) {
        hb_watched_.push_back(gen_.members[j].id);
        hb_watched_ranks_.push_back(static_cast<int>(j));
      }
  }
  hb_tickets_floor_.store(gen_.joins_seen, std::memory_order_relaxed);
  // Join-failure counts the heartbeat thread read are kept only while this
  // member stays the coordinator and no failure intervenes (the recovery's
  // coordinator counted it before it wrote this generation's record).
  if (gen_.reason == change_reason::failure || !hb_watch_joins_.load(std::memory_order_relaxed))
    failures_epoch_.fetch_add(1, std::memory_order_acq_rel);
  hb_generation_.store(gen_.generation);
  hb_watch_joins_.store(rank_ == 0, std::memory_order_relaxed);
  {
    std::lock_guard lk(hb_wake_m_);  // the heartbeat thread sees the generation before it waits, or is woken
  }
  hb_wake_.notify_all();
  comm_.reset();
  transport_.reset();
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::became_member() {
  // The one moment this process starts doing the members' work: a launched
  // worker as it enters its first generation, a newcomer once the members
  // switched to its generation and the state starts to move (until then its
  // start-up and waits leave the CPU to them). It gets back the priority
  // --join-nice took, and takes the members' scheduling.
  if (became_member_) return;
  became_member_ = true;
  if (opts_.join) detail::restore_join_priority();
  take_member_scheduling();
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::take_member_scheduling() {
  // The scheduler slice, then the real-time class (a slice is asked for on
  // a normal thread only). A newcomer with a real-time priority takes both
  // as it starts to wait for the members' switch (sync_state): from there it
  // only waits, and once they switch the members wait for it. As an equal
  // real-time thread it then runs as soon as a member waiting for it yields,
  // not only once that member's wait stops spinning and sleeps.
  if (member_scheduling_) return;
  member_scheduling_ = true;
  if (opts_.sched_slice.count() > 0) detail::request_sched_slice(opts_.sched_slice);
  if (opts_.rt_priority > 0) {
    // The thread that trains (this one) and the heartbeat, which finds a
    // dead member: the group's threads; the others stay normal.
    const pthread_t mine[] = {::pthread_self(), heartbeat_.native_handle()};
    detail::request_rt_priority(opts_.rt_priority, std::span<const pthread_t>(mine, heartbeat_.joinable() ? 2 : 1));
  }
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::adopt(detail::generation_record rec, steady_clock::time_point started,
                                   std::optional<typename Net::transport_type> begun) {
  next_.reset();
  const int old_size = static_cast<int>(gen_.members.size());
  enter(std::move(rec));
  const auto t0 = steady_clock::now();
  if constexpr (!detail::stable_address<Net>()) {
    if (!begun) {
      const bytes mine = net_->prepare(gen_.generation);
      store_->set(key("addr/" + std::to_string(gen_.generation) + "/" + std::to_string(id_)), to_value(mine),
                  store_deadline());
    }
  }
  const auto t1 = steady_clock::now();
  if (opts_.join && step_ < 0) fault_point("join-connect");
  auto addrs = begun ? std::vector<bytes>{} : gather_addresses(gen_);
  const auto t2 = steady_clock::now();
  transport_.emplace(connect_watched(gen_, addrs, std::move(begun)), revoke_);
  comm_.emplace(*transport_, coll_opts_);
  const auto t3 = steady_clock::now();
  auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  EBBFLOW_LOG_INFO("generation " << gen_.generation << " connect: prepare " << ms(t0, t1) << " ms, addresses "
                                 << ms(t1, t2) << " ms, wire-up " << ms(t2, t3) << " ms");
  // The state moves at the next begin_step: a newcomer registers its buffers
  // after the constructor returned.
  if (!pending_) pending_ = pending_change{gen_.reason, old_size, started};
  pending_->reason = gen_.reason;
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::adopt_or_recover(detail::generation_record rec, steady_clock::time_point started,
                                              std::optional<typename Net::transport_type> begun) {
  const std::int64_t g = rec.generation;
  try {
    adopt(std::move(rec), started, std::move(begun));
  } catch (const system_error& e) {
    if (!detail::recoverable(e.code())) throw;
    recover(g, lost_in_adopt(e));
  }
}

template <kv_store Store, network Net>
typename Net::transport_type group_impl<Store, Net>::connect_watched(
    const detail::generation_record& rec, const std::vector<bytes>& addrs,
    std::optional<typename Net::transport_type> begun) {
  const auto d = deadline::after(opts_.op_timeout);
  if constexpr (detail::can_preconnect<Net>()) {
    // Wire up while watching the members' leases: a member that died before
    // it connected (UCX may only notice at its own timeout) is reported lost
    // within about one lease, and the group fails over instead of waiting.
    // A transport already started for this generation has taken its peers'
    // wire-up messages: it must be the one that finishes (they come once).
    auto t = begun ? std::move(*begun) : net_->start_connect(rec.generation, rank_, addrs);
    lease_watch leases;
    while (!t.poll_connect()) {
      if (revoke_ && revoke_->revoked())
        throw system_error(make_error_code(error::revoked),
                           {.rank = rank_, .generation = rec.generation, .operation = "connect"});
      if (d.expired())
        throw system_error(make_error_code(error::timeout),
                           {.rank = rank_, .generation = rec.generation, .operation = "connect"});
      if (const int j = stale_member(rec, leases, false); j >= 0)
        throw system_error(make_error_code(error::peer_lost),
                           {.rank = rank_,
                            .generation = rec.generation,
                            .peer = j,
                            .operation = "connect",
                            .detail = "member " + std::to_string(rec.members[static_cast<std::size_t>(j)].id) +
                                      " stopped heartbeating"});
      // A newcomer connects while the members train: poll gently so its
      // wait costs them no CPU (on a shared host it would take their cores).
      // A real-time member sleeps between polls too: yielding, it would
      // keep the core from the normal threads the wire-up may wait for.
      if (opts_.join && step_ < 0)
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      else if (member_scheduling_ && opts_.rt_priority > 0)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      else
        std::this_thread::yield();
    }
    return t;
  } else {
    (void)begun;
    return net_->connect(rec.generation, rank_, addrs, d);
  }
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::install(detail::generation_record rec, typename Net::transport_type t,
                                     steady_clock::time_point started, double prepared_seconds) {
  const int old_size = static_cast<int>(gen_.members.size());
  comm_.reset();  // before its transport moves away (enter() resets the rest)
  if constexpr (requires(typename Net::transport_type & x) {
                  x.start_close();
                  { x.poll_close() } -> std::convertible_to<bool>;
                }) {
    // Close the replaced generation's endpoints in the background: over tcp
    // their flush takes round trips that would otherwise stall the switch.
    if (transport_) {
      retiring_.reset();  // an older one still closing: finish it (bounded)
      retiring_.emplace(std::move(transport_->inner()));
      transport_.reset();
      retiring_->start_close();
    }
  }
  if constexpr (requires { t.reused_endpoints(); })
    EBBFLOW_LOG_INFO("generation " << rec.generation << ": " << t.reused_endpoints() << " of " << rec.members.size() - 1
                                   << " endpoints kept from generation " << gen_.generation);
  enter(std::move(rec));
  transport_.emplace(std::move(t), revoke_);
  comm_.emplace(*transport_, coll_opts_);
  if (!pending_) pending_ = pending_change{gen_.reason, old_size, started, prepared_seconds};
  pending_->reason = gen_.reason;
}

template <kv_store Store, network Net>
void group_impl<Store, Net>::leave_now() {
  active_ = false;
  EBBFLOW_LOG_INFO("member " << id_ << " left the group after step " << step_);
  hb_generation_.store(-1);
  next_.reset();
  comm_.reset();
  transport_.reset();
  heartbeat_.request_stop();
}

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
