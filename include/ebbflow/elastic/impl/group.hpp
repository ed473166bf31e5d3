// SPDX-License-Identifier: Apache-2.0
//! @file impl/group.hpp
//! Definitions of elastic::group (see elastic/group.hpp for the contract).
#pragma once

#include <ebbflow/elastic/group.hpp>
#include <ebbflow/core/thread_name.hpp>

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <ctime>

#include <cerrno>
#include <charconv>
#include <filesystem>
#include <iomanip>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <set>
#include <span>
#include <sstream>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {
namespace detail {

// Sleeps until `until` or until `stop` is requested, whichever comes first
// (in slices of at most 10 ms, so a stop is seen soon).
inline void sleep_until(steady_clock::time_point until, const std::stop_token& stop) {
  while (!stop.stop_requested() && steady_clock::now() < until)
    std::this_thread::sleep_for(
        std::min<steady_clock::duration>(until - steady_clock::now(), std::chrono::milliseconds(10)));
}

// Integers the group stores as decimal text; anything else is a corrupt store.
inline std::int64_t parse_i64(const std::string& v) {
  std::int64_t x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc{} || p != v.data() + v.size())
    throw system_error(
        make_error_code(error::bad_message),
        {.operation = "elastic group", .detail = "store value '" + v.substr(0, 32) + "' is not an integer"});
  return x;
}

// Appends `item` to a list for a message: "1", then "1, 4".
inline void append_listed(std::string& list, const std::string& item) {
  if (!list.empty()) list += ", ";
  list += item;
}

template <class N>
constexpr bool stable_address() {
  if constexpr (requires {
                  { N::stable_address() } -> std::convertible_to<bool>;
                })
    return N::stable_address();
  else
    return false;
}

// Networks that can wire up a generation's transport in the background.
template <class N>
constexpr bool can_preconnect() {
  return requires(N & n, std::int64_t g, int rank, const std::vector<bytes>& addrs, typename N::transport_type& t) {
    { n.start_connect(g, rank, addrs) } -> std::same_as<typename N::transport_type>;
    { t.poll_connect() } -> std::convertible_to<bool>;
  };
}

// The values of `keys`: in one pipelined batch where the store offers
// try_get_many, else one by one.
template <class S>
std::vector<std::optional<std::string>> try_get_all(S& st, const std::vector<std::string>& keys, deadline d) {
  if (keys.empty()) return {};  // no round trip for nothing
  if constexpr (requires { st.try_get_many(std::span<const std::string>(keys), d); }) {
    return st.try_get_many(std::span<const std::string>(keys), d);
  } else {
    std::vector<std::optional<std::string>> out;
    for (const auto& k : keys) out.push_back(st.try_get(k, d));
    return out;
  }
}

// A join ticket reads "<member> <failures whose cool-down it waited out>
// <worker key>"; the member id is parsed (and checked) by its reader.
struct join_ticket {
  std::string id;
  std::int64_t held_for = 0;
  std::string worker;
  static join_ticket parse(const std::string& v) {
    join_ticket t;
    std::istringstream in(v);
    in >> t.id >> t.held_for >> std::ws;
    std::getline(in, t.worker);
    return t;
  }
};

// `add(keys[i], deltas[i])` for every i: in one pipelined batch where the
// store offers add_many, else one by one.
template <class S>
std::vector<std::int64_t> add_all(S& st, const std::vector<std::string>& keys, const std::vector<std::int64_t>& deltas,
                                  deadline d) {
  if constexpr (requires {
                  st.add_many(std::span<const std::string>(keys), std::span<const std::int64_t>(deltas), d);
                }) {
    return st.add_many(std::span<const std::string>(keys), std::span<const std::int64_t>(deltas), d);
  } else {
    std::vector<std::int64_t> out;
    for (std::size_t i = 0; i < keys.size(); ++i) out.push_back(st.add(keys[i], deltas[i], d));
    return out;
  }
}

// Waits on the server until any of `keys` exists, in 50 ms slices so that a
// stop request is noticed: the index of one that does, or nullopt when
// stopped or past `d`. A store without wait_any waits for the first key and
// looks for the others at the end of each slice.
template <class S>
std::optional<std::size_t> wait_any_key(S& st, const std::vector<std::string>& keys, deadline d,
                                        const std::stop_token& stop) {
  constexpr bool has_wait_any = requires { st.wait_any(keys, d); };
  while (!stop.stop_requested() && !d.expired()) {
    try {
      const auto slice = min(d, deadline::after(std::chrono::milliseconds(50)));
      if constexpr (has_wait_any) {
        return st.wait_any(keys, slice);
      } else {
        st.wait({keys.front()}, slice);
        return 0;
      }
    } catch (const system_error& e) {
      if (e.code() != errc::timeout) throw;
    }
    if constexpr (!has_wait_any)
      for (std::size_t i = 1; i < keys.size() && !d.expired(); ++i)
        if (st.try_get(keys[i], d)) return i;
  }
  return std::nullopt;
}

// The same for one key: true once it exists.
template <class S>
bool wait_key(S& st, const std::string& k, deadline d, const std::stop_token& stop) {
  return wait_any_key(st, {k}, d, stop).has_value();
}

// Networks whose start_connect may run on a helper thread while the current
// generation trains on the same network (ucx_network on a UCX with threads).
template <class N>
bool concurrent_connect(const N& n) {
  if constexpr (requires {
                  { n.concurrent_connect() } -> std::convertible_to<bool>;
                })
    return n.concurrent_connect();
  else
    return false;
}

// Calls f(tid) for every thread of this process (threads that end meanwhile
// are the callee's to skip: their calls fail).
template <class F>
void for_each_thread(F&& f) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task", ec))
    f(static_cast<pid_t>(std::strtol(e.path().filename().c_str(), nullptr, 10)));
}

// A joiner started with `ebbflow-run --join-nice N` runs N nice levels
// lower until the members switch to the generation that includes it (its
// start-up, connect and wait then do not slow the members on a shared host);
// it gets its priority back here, when the state starts to move. Linux nice values are per
// thread, so every thread of the process is raised again.
inline void restore_join_priority() {
  const auto n = env::get_int("EBBFLOW_JOIN_NICE", 0, 0, 19);
  if (n == 0) return;
  int failed = 0, err = 0;
  for_each_thread([&](pid_t t) {
    const auto tid = static_cast<id_t>(t);
    errno = 0;
    const int cur = ::getpriority(PRIO_PROCESS, tid);
    if (errno != 0) return;
    if (::setpriority(PRIO_PROCESS, tid, std::max(-20, cur - static_cast<int>(n))) != 0) {
      ++failed;
      err = errno;
    }
  });
  if (failed)
    EBBFLOW_LOG_WARN("admitted, but the CPU priority lowered by EBBFLOW_JOIN_NICE="
                     << n << " could not be restored (" << std::strerror(err) << "; needs CAP_SYS_NICE)");
  else
    EBBFLOW_LOG_INFO("the members switched: CPU priority raised back by EBBFLOW_JOIN_NICE="
                     << n << " (nice now " << ::getpriority(PRIO_PROCESS, 0) << ")");
}

// group_options::sched_slice: every thread of this process asks for a
// scheduler slice of `slice` (Linux 6.12+ EEVDF custom slices: sched_setattr
// with sched_runtime, keeping each thread's policy and nice; threads created
// later inherit it). Real-time and deadline threads are left alone. A
// kernel without per-task slices accepts and ignores the request: read
// back, that is logged once.
inline void request_sched_slice(std::chrono::microseconds slice) {
  struct sched_attr_v0 {  // struct sched_attr, SCHED_ATTR_SIZE_VER0 (glibc 2.36 has no wrapper)
    std::uint32_t size;
    std::uint32_t sched_policy;
    std::uint64_t sched_flags;
    std::int32_t sched_nice;
    std::uint32_t sched_priority;
    std::uint64_t sched_runtime;
    std::uint64_t sched_deadline;
    std::uint64_t sched_period;
  };
  static_assert(sizeof(sched_attr_v0) == 48);
  const auto ns = static_cast<std::uint64_t>(std::chrono::nanoseconds(slice).count());
  int failed = 0, err = 0, set = 0;
  for_each_thread([&](pid_t tid) {
    const int policy = ::sched_getscheduler(tid);
    if (policy < 0) return;  // the thread ended
    const int base = policy & ~SCHED_RESET_ON_FORK;
    if (base != SCHED_OTHER && base != SCHED_BATCH && base != SCHED_IDLE) return;
    errno = 0;
    const int nice = ::getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
    if (errno != 0) return;
    sched_attr_v0 a{};
    a.size = sizeof a;
    a.sched_policy = static_cast<std::uint32_t>(base);
    a.sched_flags = (policy & SCHED_RESET_ON_FORK) ? 0x01 : 0;  // SCHED_FLAG_RESET_ON_FORK
    a.sched_nice = nice;
    a.sched_runtime = ns;
    if (::syscall(SYS_sched_setattr, tid, &a, 0) != 0) {
      ++failed;
      err = errno;
    } else {
      ++set;
    }
  });
  sched_attr_v0 back{};
  const bool honoured =
      set > 0 && ::syscall(SYS_sched_getattr, 0, &back, sizeof back, 0) == 0 && back.sched_runtime == ns;
  if (failed)
    EBBFLOW_LOG_WARN("EBBFLOW_SCHED_SLICE_US=" << slice.count() << ": " << failed << " thread(s) refused ("
                                               << std::strerror(err) << ")");
  else if (!honoured)
    EBBFLOW_LOG_WARN("EBBFLOW_SCHED_SLICE_US=" << slice.count()
                                               << " has no effect: this kernel keeps no per-task slice (Linux 6.12+)");
  else
    EBBFLOW_LOG_INFO("scheduler slice " << slice.count() << " us for " << set << " thread(s)");
}

// group_options::rt_priority: the given threads (the group's: the thread
// that trains, its heartbeat) run under SCHED_RR at `priority`, with
// SCHED_RESET_ON_FORK: threads and processes they start later (clone resets
// it for both) are normal ones. Threads not named here stay normal: a
// real-time thread that spins while a normal one holds what it waits for
// keeps the core from it (UCX's progress thread at real-time priority kept
// the admission helper off both cores over tcp until the kernel throttled
// it).
inline void request_rt_priority(int priority, std::span<const pthread_t> threads) {
  int failed = 0, err = 0, set = 0;
  sched_param p{};
  p.sched_priority = priority;
  for (const pthread_t t : threads) {
    if (const int e = ::pthread_setschedparam(t, SCHED_RR | SCHED_RESET_ON_FORK, &p); e == 0) {
      ++set;
    } else {
      ++failed;
      err = e;
    }
  }
  if (failed)
    EBBFLOW_LOG_WARN("EBBFLOW_RT_PRIORITY=" << priority << ": " << failed << " thread(s) refused ("
                                            << std::strerror(err) << "; needs CAP_SYS_NICE or RLIMIT_RTPRIO >= "
                                            << priority << "), they stay normal threads");
  else
    EBBFLOW_LOG_INFO("SCHED_RR priority " << priority << " for " << set << " thread(s)");
}

// The calling thread at the lowest CPU priority of a normal thread: nice 19,
// and out of the real-time class that group_options::rt_priority may have
// handed down from the thread that started it.
inline void lowest_cpu_priority() {
  const int policy = ::sched_getscheduler(0) & ~SCHED_RESET_ON_FORK;
  if (policy == SCHED_RR || policy == SCHED_FIFO) {
    sched_param p{};
    ::sched_setscheduler(0, SCHED_OTHER, &p);  // lowering needs no privilege
  }
  const auto tid = static_cast<id_t>(::gettid());
  errno = 0;
  if (const int cur = ::getpriority(PRIO_PROCESS, tid); errno == 0) ::setpriority(PRIO_PROCESS, tid, std::max(cur, 19));
}

// A worker's join failures in a row, as stored: "<count>" (after a reset),
// or "<count> <generation> <member>,<member>,..." naming the members of the
// failed generation already counted, so every recovering member can apply
// the same failure and only the first one counts it.
struct join_failures {
  std::int64_t count = 0;
  std::int64_t generation = -1;
  std::vector<member_id> members;

  static join_failures parse(const std::optional<std::string>& v) {
    join_failures f;
    if (!v || v->empty()) return f;
    std::istringstream in(*v);
    in >> f.count;
    if (in >> f.generation) {
      std::string ids;
      in >> ids;
      for (std::size_t at = 0; at < ids.size();) {
        const auto comma = std::min(ids.find(',', at), ids.size());
        f.members.push_back(parse_i64(ids.substr(at, comma - at)));
        at = comma + 1;
      }
    }
    if (in.fail() && !in.eof()) f = {};
    return f;
  }
  std::string str() const {
    std::string s = std::to_string(count) + " " + std::to_string(generation) + " ";
    for (std::size_t i = 0; i < members.size(); ++i) {
      if (i) s += ',';
      s += std::to_string(members[i]);
    }
    return s;
  }
};

inline bool recoverable(const std::error_code& ec) noexcept {
  return ec == errc::peer_lost || ec == errc::timeout || ec == errc::revoked;
}
}  // namespace detail

template <kv_store Store>
std::optional<member_id> report_process_exit(Store& st, const group_options& o, std::string_view process_key,
                                             std::string_view how, deadline d) {
  const auto v = st.try_get(o.process_record_key(process_key), d);
  if (!v) return std::nullopt;
  const member_id m = detail::parse_i64(*v);
  st.set(o.gone_key(m), how, d);
  st.add(o.gone_count_key(), 1, d);  // after the report: who reads the new count finds it
  return m;
}

template <kv_store Store, network Net>
group<Store, Net>::group(store_factory connect_store, Net& net, group_options opts, launch_info launch,
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
group<Store, Net>::~group() {
  wait_for_peers_to_end();
  heartbeat_.request_stop();
  if (heartbeat_.joinable()) heartbeat_.join();
  next_.reset();  // stops and joins an admission helper first
  retiring_.reset();
  comm_.reset();
  transport_.reset();
}

template <kv_store Store, network Net>
void group<Store, Net>::wait_for_peers_to_end() noexcept {
  // A member that ends between steps (its training done) keeps its
  // transport until every member of its generation has ended too: a peer
  // still inside the last control exchange would take this one's closing
  // endpoints for a death (over tcp a close can reset what the peer has
  // not read yet) and fail the step it has in fact finished. A store
  // barrier, not a collective: its own last message cannot race a close.
  if (!active_ || !transport_ || phase_ != step_phase::closed || step_ <= 0 || !store_) return;
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
void group<Store, Net>::register_state(std::string name, std::span<std::byte> host_bytes) {
  if (started_)
    fail(error::invalid_state, "register_state('" + name +
                                   "') after the first begin_step: the state moved to the other members without it "
                                   "(register every buffer before training)");
  for (auto& s : state_) EBBFLOW_ENFORCE(s.name != name, "elastic group: state '" << name << "' registered twice");
  state_.push_back({std::move(name), host_bytes});
}

template <kv_store Store, network Net>
void group<Store, Net>::fail(std::error_code ec, const std::string& what) const {
  throw group_error(ec, {.rank = rank_, .generation = gen_.generation, .operation = "elastic group", .detail = what});
}

template <kv_store Store, network Net>
void group<Store, Net>::fail_job_finished(std::string_view what) const {
  fail(error::job_finished, "the job EBBFLOW_JOB='" + opts_.prefix + "' " + std::string(what));
}

template <kv_store Store, network Net>
void group<Store, Net>::heartbeat_loop(std::stop_token st) {
  std::unique_ptr<Store> s;
  bool warned = false;
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
      if (!warned) EBBFLOW_LOG_WARN("heartbeat of member " << id_ << " failed: " << e.what());
      warned = true;
      s.reset();
    }
    // Not a member (yet): the next round comes at the next beat, or as soon
    // as this process becomes one (it then waits for its generation's abort).
    std::unique_lock lk(hb_wake_m_);
    hb_wake_.wait_for(lk, st, opts_.heartbeat, [&] { return round_generation < 0 && hb_generation_.load() >= 0; });
  }
}

template <kv_store Store, network Net>
void group<Store, Net>::check_gone(Store& st, std::int64_t g, const std::vector<member_id>& ids,
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
bool group<Store, Net>::abort_due(Store& st, std::int64_t g) {
  if (st.try_get(key("done"), store_deadline())) return false;  // the job finished: its members stop and exit
  return hb_generation_.load() == g;                            // else the generation changed meanwhile
}

template <kv_store Store, network Net>
void group<Store, Net>::abort_without(Store& st, std::int64_t g, member_id m, peer_watch& w) {
  st.set(dead_key(g, m), "1", store_deadline());
  st.set(key("abort/" + std::to_string(g)), "1", store_deadline());
  w.aborted = g;
  std::lock_guard lk(hb_mutex_);
  if (hb_revoke_ && !hb_revoke_->revoked()) hb_revoke_->revoke();
}

template <kv_store Store, network Net>
void group<Store, Net>::check_leases(Store& st, std::int64_t g, const std::vector<member_id>& ids,
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
void group<Store, Net>::propose_initial(const std::vector<std::optional<std::string>>& registered) {
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
void group<Store, Net>::form_initial() {
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
void group<Store, Net>::wait_admission() {
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

template <kv_store Store, network Net>
std::vector<bytes> group<Store, Net>::gather_addresses(const detail::generation_record& rec) {
  return gather_addresses(rec, *store_, address_cache_, rank_, revoke_, {});
}

template <kv_store Store, network Net>
std::vector<bytes> group<Store, Net>::gather_addresses(const detail::generation_record& rec, Store& st,
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
void group<Store, Net>::enter(detail::generation_record rec) {
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
void group<Store, Net>::became_member() {
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
void group<Store, Net>::take_member_scheduling() {
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
void group<Store, Net>::adopt(detail::generation_record rec, steady_clock::time_point started,
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
void group<Store, Net>::adopt_or_recover(detail::generation_record rec, steady_clock::time_point started,
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
int group<Store, Net>::lost_in_adopt(const system_error& e) noexcept {
  // adopt() runs no collective: a member its error names stopped heartbeating
  // or never published its address, or its endpoint could not be made; it
  // is not a live neighbour stuck behind a dead one (lost_peer_of). Nor can
  // lost_peer_of ask the transport: the new one is not made yet.
  return e.code() == errc::peer_lost ? e.peer() : -1;
}

template <kv_store Store, network Net>
typename Net::transport_type group<Store, Net>::connect_watched(const detail::generation_record& rec,
                                                                const std::vector<bytes>& addrs,
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
int group<Store, Net>::poll_next() {
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

template <kv_store Store, network Net>
void group<Store, Net>::install(detail::generation_record rec, typename Net::transport_type t,
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
void group<Store, Net>::sync_state() {
  if (gen_.source == id_ && step_ < 0) take_own_initial_state();
  const auto d = deadline::after(opts_.op_timeout);
  auto& c = *comm_;
  auto raw = [](void* p, std::size_t n) { return buffer_view{p, n, dtype::u8, memory_space::host}; };
  // Point-to-point tags of the state transfer (collectives never use p2p tags).
  constexpr std::uint32_t tag_size = 1, tag_header = 2, tag_first = 3;
  // Every member holding the newest state (they committed the same steps,
  // so they hold the same bits) serves a share of those that lack it:
  // receiver i (in rank order) gets it from holder i mod S, so k newcomers
  // cost the members about k/S transfers' time, not k.
  std::vector<std::size_t> holders, receivers;
  for (std::size_t j = 0; j < gen_.members.size(); ++j)
    (gen_.members[j].committed >= gen_.source_step ? holders : receivers).push_back(j);
  if (holders.empty() && !receivers.empty())
    fail(error::invalid_state, "no member of generation " + std::to_string(gen_.generation) + " holds the state");
  auto sender_of = [&](std::size_t i) { return holders[i % holders.size()]; };
  const auto me = static_cast<std::size_t>(rank_);
  std::vector<std::size_t> to;  // the receivers this member serves
  for (std::size_t i = 0; i < receivers.size(); ++i)
    if (sender_of(i) == me) to.push_back(receivers[i]);
  if (!to.empty()) {
    if (gen_.generation == 0) fault_point("initial-sync");  // formed generation 0; nothing sent yet
    detail::writer w;
    w.put(step_).put(epoch_).put<std::uint64_t>(cursor_).put<std::uint64_t>(state_.size());
    for (auto& s : state_) {
      w.put_bytes(elastic::to_bytes(s.name));
      w.put<std::uint64_t>(s.data.size());
    }
    bytes header = w.take();
    std::uint64_t header_size = header.size();
    // Post every send to every receiver first, then wait: the receivers
    // are served in parallel, and a slow one does not hold up the others.
    std::vector<comm::request<transport_type>> sends;
    for (auto j : to) {
      const int peer = static_cast<int>(j);
      sends.push_back(c.isend(raw(&header_size, sizeof header_size), peer, tag_size));
      sends.push_back(c.isend(raw(header.data(), header.size()), peer, tag_header));
    }
    if (step_ > 0) fault_point("sync-send");
    for (std::size_t k = 0; k < state_.size(); ++k) {
      for (auto j : to)
        sends.push_back(c.isend(raw(state_[k].data.data(), state_[k].data.size()), static_cast<int>(j),
                                tag_first + static_cast<std::uint32_t>(k)));
      if (k == 0 && gen_.generation == 0) fault_point("initial-sync-part");  // headers and first buffers posted
    }
    for (auto& r : sends) r.wait(d);
    for (auto j : to)
      EBBFLOW_LOG_INFO("sent state of step " << step_ << " to member " << gen_.members[j].id << " (rank " << j << ")");
  } else if (const auto it = std::ranges::find(receivers, me); it != receivers.end()) {
    const auto from = sender_of(static_cast<std::size_t>(it - receivers.begin()));
    const int src = static_cast<int>(from);
    const member_id source = gen_.members[from].id;
    std::uint64_t header_size = 0;
    {
      // A newcomer waits here until the members switch, which may be many
      // steps away: poll gently (the members' CPU is not ours to spin on),
      // then take the state at full speed. If the job ends first (the
      // members finished before they switched), `finish` said so: a clear
      // error, not a timeout.
      if (opts_.join && opts_.rt_priority > 0) take_member_scheduling();
      auto first = c.irecv(raw(&header_size, sizeof header_size), src, tag_size);
      std::error_code ec;
      auto next_check = steady_clock::now() + opts_.heartbeat;
      while (!first.test(ec) && !d.expired()) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        if (steady_clock::now() < next_check) continue;
        next_check = steady_clock::now() + opts_.heartbeat;
        if (job_done())
          fail_job_finished("finished before the members switched to generation " + std::to_string(gen_.generation) +
                            ": this worker never received the state");
      }
      first.wait(d);  // returns at once when done; throws naming the peer on an error or the deadline
    }
    if (opts_.join) became_member();  // the members switched: from here on this newcomer is one of them
    if (header_size > (std::uint64_t{1} << 24))
      fail(error::bad_message, "state header of " + std::to_string(header_size) + " bytes");
    bytes header(header_size);
    c.recv(raw(header.data(), header.size()), src, tag_header, d);
    if (opts_.join) fault_point("sync-recv");
    detail::reader rd(header, "state header");
    const auto step = rd.get<std::int64_t>();
    const auto epoch = rd.get<std::int64_t>();
    const auto cursor = rd.get<std::uint64_t>();
    const auto n = rd.get<std::uint64_t>();
    if (n != state_.size())
      fail(error::invalid_state, "member " + std::to_string(source) + " has " + std::to_string(n) +
                                     " registered state buffers, this member " + std::to_string(state_.size()));
    for (std::size_t k = 0; k < state_.size(); ++k) {
      auto nm = rd.get_bytes();
      const auto sz = rd.get<std::uint64_t>();
      const std::string name(reinterpret_cast<const char*>(nm.data()), nm.size());
      if (name != state_[k].name || sz != state_[k].data.size()) {
        std::ostringstream os;
        os << "state buffer " << k << " is '" << name << "' of " << sz << " bytes on member " << source << " but '"
           << state_[k].name << "' of " << state_[k].data.size() << " bytes here";
        fail(error::invalid_state, os.str());
      }
    }
    // A launched worker whose buffers still hold its own initial state
    // receives into a copy first: should the sender die midway, its buffers
    // stay a valid initial state (recover() may make it the source).
    std::size_t total = 0;
    for (auto& s : state_) total += s.data.size();
    if (own_initial_state_ && total <= opts_.initial_staging) {
      auto staged = std::make_unique_for_overwrite<std::byte[]>(total);
      for (std::size_t k = 0, off = 0; k < state_.size(); off += state_[k++].data.size()) {
        c.recv(raw(staged.get() + off, state_[k].data.size()), src, tag_first + static_cast<std::uint32_t>(k), d);
      }
      own_initial_state_ = false;
      for (std::size_t k = 0, off = 0; k < state_.size(); off += state_[k++].data.size())
        if (!state_[k].data.empty()) std::memcpy(state_[k].data.data(), staged.get() + off, state_[k].data.size());
    } else {
      own_initial_state_ = false;  // from here on a failure may leave the buffers part written
      for (std::size_t k = 0; k < state_.size(); ++k)
        c.recv(raw(state_[k].data.data(), state_[k].data.size()), src, tag_first + static_cast<std::uint32_t>(k), d);
    }
    step_ = step;
    epoch_ = epoch;
    cursor_ = cursor;
    EBBFLOW_LOG_INFO("received state of step " << step_ << " from member " << source);
  }
}

template <kv_store Store, network Net>
void group<Store, Net>::notify(change_reason reason, int old_size, double stall) {
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
step_info group<Store, Net>::begin_step() {
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
step_info group<Store, Net>::current_slice() const {
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
template <class F>
bool group<Store, Net>::collective(F&& f) {
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
std::vector<std::size_t> group<Store, Net>::plan_of(const std::vector<member_id>& ids) const {
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
void group<Store, Net>::require_open_step(const char* what) const {
  if (!active_) fail(error::invalid_state, std::string(what) + " after this member left the group");
  if (phase_ == step_phase::closed)
    fail(error::invalid_state,
         std::string(what) + " outside a step: call begin_step first (step " + std::to_string(step_) + " is not open)");
  if (phase_ == step_phase::aborted)
    fail(error::invalid_state, std::string(what) + " after a collective of step " + std::to_string(step_) +
                                   " returned false: the step was rolled back; redo it from begin_step");
}

template <kv_store Store, network Net>
bool group<Store, Net>::allreduce(std::span<float> data) {
  return collective(
      [&](communicator_type& c) { c.allreduce(view(data), reduce_op::sum, deadline::after(opts_.op_timeout)); });
}
template <kv_store Store, network Net>
bool group<Store, Net>::allreduce(std::span<double> data) {
  return collective(
      [&](communicator_type& c) { c.allreduce(view(data), reduce_op::sum, deadline::after(opts_.op_timeout)); });
}

template <kv_store Store, network Net>
void group<Store, Net>::control_allreduce(std::span<double> v) {
  // The communicator's allreduce gives bitwise-identical results on every
  // rank, so every member's policy observes exactly the same numbers.
  const auto w = enter_collective(true);
  comm_->allreduce(view(v), reduce_op::sum, deadline::after(opts_.op_timeout));
}

template <kv_store Store, network Net>
typename group<Store, Net>::waiting group<Store, Net>::enter_collective(bool control) noexcept {
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
void group<Store, Net>::report_stall(std::int64_t mine, steady_clock::duration waited,
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
std::vector<member_id> group<Store, Net>::pending_joiners(std::int64_t& seen, std::size_t room, bool settle,
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
std::int64_t group<Store, Net>::prefetch_tickets(Store& st, std::int64_t total) {
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
void group<Store, Net>::answer_holds(Store& st, const std::vector<join_hold>& holds) const {
  for (auto& h : holds) {
    EBBFLOW_LOG_WARN("holding back worker '" << h.worker << "' (join ticket " << h.ticket << ") for "
                                             << static_cast<double>(h.ms) / 1000 << " s: it failed " << h.failures
                                             << " times in a row while joining");
    st.set(key("held/" + std::to_string(h.ticket)), std::to_string(h.ms) + " " + std::to_string(h.failures),
           store_deadline());
  }
}

template <kv_store Store, network Net>
void group<Store, Net>::count_join_failures(const std::vector<detail::member_entry>& alive,
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

template <kv_store Store, network Net>
template <class Process>
plan::steal_report group<Store, Net>::steal_step(Process&& process, const steal_settings& settings) {
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
void group<Store, Net>::release_steal_counter() {
  if (steal_key_.empty()) return;
  // Erased by the heartbeat thread, on its own connection: no round trip here.
  if constexpr (requires(Store & s) { s.erase(steal_key_); }) {
    std::lock_guard lk(hb_mutex_);
    hb_erase_.push_back(std::move(steal_key_));
  }
  steal_key_.clear();
}

template <kv_store Store, network Net>
void group<Store, Net>::end_step(double compute_seconds) {
  commit(compute_seconds, std::nullopt);
}

template <kv_store Store, network Net>
void group<Store, Net>::end_step(double compute_seconds, std::size_t processed) {
  commit(compute_seconds, processed);
}

template <kv_store Store, network Net>
void group<Store, Net>::commit(double compute_seconds, std::optional<std::size_t> processed) {
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

template <kv_store Store, network Net>
std::vector<char> group<Store, Net>::leaves_applied(const std::vector<double>& v, int n) {
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
void group<Store, Net>::write_record(Store& st, const std::string& gkey, const std::string& rec,
                                     const std::vector<member_id>& joiners, std::int64_t g1) const {
  // The record must be written before the joiners are told, and before the
  // coordinator itself leaves. A concurrent recovery may have written
  // another one first: then the joiners are not told (that record does not
  // have them; they stay in the queue).
  if (st.compare_set(gkey, "", rec, store_deadline()).current == rec)
    for (auto j : joiners) st.set(key("joined/" + std::to_string(j)), std::to_string(g1), store_deadline());
}

template <kv_store Store, network Net>
void group<Store, Net>::change_membership(const std::vector<char>& leaving, int n) {
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
    if (!background) write_record(*store_, gkey, *record, admitting_, g1);
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
void group<Store, Net>::adopt_announced(std::int64_t g1, steady_clock::time_point started,
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
void group<Store, Net>::start_admission(std::optional<std::string> record, std::string gkey, std::int64_t g1,
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
void group<Store, Net>::take_admission() {
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
void group<Store, Net>::leave_now() {
  active_ = false;
  EBBFLOW_LOG_INFO("member " << id_ << " left the group after step " << step_);
  hb_generation_.store(-1);
  next_.reset();
  comm_.reset();
  transport_.reset();
  heartbeat_.request_stop();
}

template <kv_store Store, network Net>
int group<Store, Net>::stale_member(const detail::generation_record& rec, lease_watch& w, bool joiners_only) {
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
bool group<Store, Net>::fresh(Store& st, member_id m, lease_seen& seen) const {
  const std::int64_t hb = st.add(key("hb/" + std::to_string(m)), 0, store_deadline());
  return fresh(m, hb, steady_clock::now(), seen);
}

template <kv_store Store, network Net>
bool group<Store, Net>::fresh(member_id m, std::int64_t hb, steady_clock::time_point now, lease_seen& seen) const {
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
void group<Store, Net>::recover(std::int64_t g, int lost_peer) {
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
          if (!waiting_logged)
            EBBFLOW_LOG_WARN("only " << total << " workers left, below EBBFLOW_MIN_SIZE=" << opts_.min_size
                                     << ": waiting for workers to join (up to EBBFLOW_MIN_WAIT_MS)");
          waiting_logged = true;
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
        fail(error::timeout, "could not re-form the group after generation " + gs + " within the deadline");
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
int group<Store, Net>::lost_peer_of(const system_error& e) const noexcept {
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
void group<Store, Net>::restore_position(std::int64_t step, std::int64_t epoch, std::size_t cursor) {
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
void group<Store, Net>::take_own_initial_state() {
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

template <kv_store Store, network Net>
void group<Store, Net>::fault_point(const char* point) {
  fault_point(point, *store_, {});
}

template <kv_store Store, network Net>
void group<Store, Net>::fault_point(const char* point, Store& st, std::stop_token stop) {
  // Fault injection for tests (EBBFLOW_FAULT=<point>[*N][:hang=MS|:sleep=MS]):
  // the first member of the job to reach the point dies there, as a crashed
  // process would; with *N, each of the first N to reach it; with :hang=MS,
  // it hangs there instead (the whole process stopped for MS ms, as a
  // SIGSTOPped one); with :sleep=MS, only the calling thread waits MS ms
  // (or until `stop`), as a thread that gets no CPU.
  static const std::optional<std::string> fault = env::get("EBBFLOW_FAULT");
  if (!fault) return;
  std::string_view f = *fault;
  enum class mode { die, hang, sleep } how = mode::die;
  std::int64_t ms = 0;
  if (const auto colon = f.find(':'); colon != std::string_view::npos) {
    const std::string_view m = f.substr(colon + 1);
    if (m.starts_with("hang="))
      how = mode::hang;
    else if (m.starts_with("sleep="))
      how = mode::sleep;
    else
      throw std::invalid_argument("EBBFLOW_FAULT='" + *fault + "': expected <point>[*N][:hang=MS|:sleep=MS]");
    ms = detail::parse_i64(std::string(m.substr(m.find('=') + 1)));
    f = f.substr(0, colon);
  }
  const auto star = f.find('*');
  if (f.substr(0, star) != point) return;
  const std::int64_t times = star == std::string_view::npos ? 1 : detail::parse_i64(std::string(f.substr(star + 1)));
  if (st.add(key(std::string("fault/") + point), 1, store_deadline()) > times) return;
  switch (how) {
    case mode::die:
      EBBFLOW_LOG_WARN("EBBFLOW_FAULT=" << point << ": member " << id_ << " dies here");
      std::raise(SIGKILL);
      return;
    case mode::sleep:
      EBBFLOW_LOG_WARN("EBBFLOW_FAULT=" << point << ": member " << id_ << "'s thread sleeps here for " << ms << " ms");
      detail::sleep_until(steady_clock::now() + std::chrono::milliseconds(ms), stop);
      return;
    case mode::hang:
      break;
  }
  EBBFLOW_LOG_WARN("EBBFLOW_FAULT=" << point << ": member " << id_ << " hangs here for " << ms << " ms");
  // A child continues this process: fork() leaves it one thread, which
  // calls only async-signal-safe functions.
  const pid_t self = ::getpid();
  if (const pid_t waker = ::fork(); waker == 0) {
    const timespec t{static_cast<time_t>(ms / 1000), static_cast<long>(ms % 1000) * 1'000'000};
    ::nanosleep(&t, nullptr);
    ::kill(self, SIGCONT);
    ::_exit(0);
  } else if (waker > 0) {
    ::kill(self, SIGSTOP);
    ::waitpid(waker, nullptr, 0);
    EBBFLOW_LOG_WARN("EBBFLOW_FAULT=" << point << ": member " << id_ << " goes on after its hang [t=" << std::fixed
                                      << std::setprecision(3) << wall_seconds() << "]");
  }
}

template <kv_store Store, network Net>
void group<Store, Net>::finish() {
  store_->set(key("done"), "1", store_deadline());
}

}  // namespace elastic
EBBFLOW_END_NAMESPACE
