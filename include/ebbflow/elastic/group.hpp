// SPDX-License-Identifier: Apache-2.0
//! @file group.hpp
//! The elastic group: data-parallel training whose workers join, leave and
//! fail while training goes on, with no restart and no lost or repeated
//! sample.
//!
//! A training loop uses it like this (see examples/elastic_train/elastic_train.cpp):
//! @code
//!   elastic::group g(connect_store, net, elastic::group_options::from_environment(opts),
//!                    launch_info::from_environment(), std::make_unique<my_policy>());  // joins the job
//!   g.register_state("params", std::as_writable_bytes(std::span(params)));
//!   while (g.active() && g.step() < total_steps) {
//!     auto s = g.begin_step();                           // my slice and weight
//!     compute gradients over samples [s.cursor + s.offset, + s.batch) of s.epoch,
//!       scaled by s.weight (mean loss over my slice × b_i / B)
//!     if (!g.allreduce(grads)) continue;                 // a member failed: redo the step
//!     optimizer step
//!     g.end_step(compute_seconds);                       // commit; membership changes happen here
//!   }
//! @endcode
//!
//! Protocol (docs/elastic.md has the full argument):
//! * The store is the single source of truth. Generation g has a fixed member
//!   list (rank = position) recorded under `<prefix>/gen/<g>`; every message
//!   of g carries g in its tag (comm/transport.hpp), so traffic of an older
//!   generation is never consumed by a newer one.
//! * Every step ends with a small control exchange (an allreduce of a few
//!   doubles per member): each member's batch and compute time (so every
//!   member's planning policy sees the same history), leave requests, whether
//!   each member is wired up to a pending generation, and the coordinator's
//!   (rank 0's) decisions: a new plan, or admitted joiners.
//! * Start: launch rank 0 writes generation 0 once every launched worker
//!   registered, or after `initial_wait` with those registered if at least
//!   `min_size`; a launched worker that comes later joins as a newcomer. If
//!   rank 0 never registered or stopped heartbeating, the others propose
//!   generation 0 without it after `initial_wait` and a lease.
//! * Join: a newcomer registers its transport address and a join ticket and
//!   waits, while the others keep training. The coordinator admits it at a step
//!   boundary by writing generation g+1. The members connect to the newcomers
//!   in the background (a helper thread; the network's `start_connect`) while
//!   they keep training on g, and all switch to g+1 at a later step boundary,
//!   the first at which every member is wired up. The members holding the
//!   newest committed step then stream the state (registered buffers plus
//!   step, epoch and cursor) to the newcomers, each newcomer from one of them
//!   (see `register_state`). Survivors stall for the switch and the transfer.
//!   A network without `start_connect`, or `EBBFLOW_PRECONNECT=0`, connects
//!   and switches at the admission boundary instead. While a change is
//!   connecting, no other change or re-plan is taken.
//! * Leave (`request_leave`, e.g. from SIGTERM): announced in the control
//!   exchange; no rollback, no state transfer. The others connect among
//!   themselves in the background while the leaver keeps training its share;
//!   it leaves when they switch (at once where they connect at the boundary).
//!   A leave that would take the group below `min_size` waits, the leaver
//!   training on, until newcomers take its place.
//! * Failure: a transport error (peer_lost, timeout) or a revocation aborts
//!   the step on every survivor: the first to notice posts `abort/<g>`, whose
//!   heartbeat threads revoke their transports. Survivors report their last
//!   committed step under `recover/<g>/<id>`; a member is judged dead when
//!   reported lost by a peer's transport or when its heartbeat lease expires.
//!   Leases are watched during training too (the coordinator's heartbeat
//!   thread watches every member's, the others the coordinator's): a member
//!   that hangs in a step is marked dead and `abort/<g>` posted once it has
//!   been silent for a lease, not only at the operation deadline.
//!   One survivor proposes g+1 by compare-and-set (the first proposal wins);
//!   the members holding the newest committed step stream the state to any
//!   member behind it. A step is committed by `end_step`, after the gradient
//!   allreduce completed and the optimizer stepped, so the rolled-back step
//!   applied no update and did not advance the cursor: it is simply redone.
//! * Below `min_size` the survivors wait (logging why) until workers join.
//!
//! Thread safety: one thread drives a group; `request_leave` may be called
//! from any thread or a signal handler (through `leave_on_signal`).
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/comm/communicator.hpp>
#include <ebbflow/comm/revocable.hpp>
#include <ebbflow/comm/transport.hpp>
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/core/env.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/core/log.hpp>
#include <ebbflow/elastic/cooldown.hpp>
#include <ebbflow/elastic/detail/progress.hpp>
#include <ebbflow/elastic/detail/wire.hpp>
#include <ebbflow/elastic/kv_store.hpp>
#include <ebbflow/elastic/policy.hpp>
#include <ebbflow/plan/work_stealing.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <exception>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

//! A network builds the transport of each generation. `prepare(g)` creates
//! this process's endpoint for generation g and returns its address (the
//! group publishes it in the store); `connect(g, rank, addresses, d)` returns
//! the transport of generation g given every member's address in rank order.
//! The UCX network (elastic/ucx_network.hpp) and the loopback network model this.
//! A network whose `stable_address()` is true returns the same address for
//! every generation; the group then publishes it once, at registration.
//! A network may also offer `start_connect(g, rank, addresses)`, returning a
//! transport whose wire-up completes in the background (finished by its
//! `poll_connect()` / `finish_connect(d)`): the group then connects to
//! joiners while it keeps training and switches only once every member is
//! wired up (see docs/elastic.md, "Join without suspension"). When it also
//! offers `concurrent_connect()` returning true, `start_connect` is called
//! from the group's admission helper thread while the training thread goes
//! on using the current generation's transport on the same network.
//! A network that lets consecutive generations share connections (the UCX
//! network shares endpoints) offers `discard_endpoints()`: the group calls it
//! when a generation failed, so the recovered one opens its own.
template <class N>
concept network = requires(N& n, std::int64_t g, int rank, const std::vector<bytes>& addrs, deadline d) {
  typename N::transport_type;
  requires comm::transport<typename N::transport_type>;
  { n.prepare(g) } -> std::convertible_to<bytes>;
  { n.connect(g, rank, addrs, d) } -> std::same_as<typename N::transport_type>;
};

//! Settings of an elastic group. `from_environment()` reads the `EBBFLOW_*`
//! variables named beside each field (validated; bad values throw).
struct group_options {
  std::string prefix = "ebbflow";                //!< store key prefix of this job (EBBFLOW_JOB)
  int min_size = 1;                              //!< EBBFLOW_MIN_SIZE: below it the group waits
  int max_size = comm::max_collective_ranks;     //!< EBBFLOW_MAX_SIZE: joiners beyond it wait
  std::size_t global_batch = 0;                  //!< B, samples per step over all members (required)
  std::size_t dataset_size = 0;                  //!< N, samples per epoch (required)
  bool drop_last = false;                        //!< drop an epoch's short last batch
  bool join = false;                             //!< EBBFLOW_JOIN=1: join a running job instead of starting one
  std::chrono::milliseconds heartbeat{50};       //!< EBBFLOW_HEARTBEAT_MS
  std::chrono::milliseconds lease{1000};         //!< EBBFLOW_LEASE_MS: silence after which a member is dead
  std::chrono::milliseconds op_timeout{30'000};  //!< EBBFLOW_OP_TIMEOUT_MS: deadline of each collective
  std::chrono::milliseconds join_timeout{
      120'000};  //!< EBBFLOW_JOIN_TIMEOUT_MS: waiting to be admitted / initial formation
  std::chrono::milliseconds min_size_wait{600'000};  //!< EBBFLOW_MIN_WAIT_MS: waiting below min_size before giving up
  std::chrono::milliseconds initial_wait{30000};     //!< EBBFLOW_INITIAL_WAIT_MS: waiting for all launched workers
  std::chrono::milliseconds store_timeout{10'000};   //!< EBBFLOW_STORE_TIMEOUT_MS: deadline of each store call
  //! EBBFLOW_ADMIT_DELAY_MS: join tickets are admitted once no new one
  //! appeared for this long (at most 10× this after the oldest), so
  //! newcomers started together join in one switch.
  std::chrono::milliseconds admit_delay{50};
  //! EBBFLOW_STALL_WARN_MS (0: off): a member that has waited this long in
  //! one collective says which members have not reached it while their
  //! heartbeats go on (a training thread stuck outside ebbflow). The
  //! coordinator names any member; the others name the coordinator.
  std::chrono::milliseconds stall_warning{10000};
  //! EBBFLOW_SCHED_SLICE_US (0: the kernel's default; else 100 to 100000):
  //! once this process is a member (a joiner: when the members switch to
  //! its generation), every thread of it asks the scheduler for this time
  //! slice (Linux 6.12+, EEVDF: `sched_setattr` with `sched_runtime` on the
  //! thread's own policy and nice). A short slice gives its wake-ups the
  //! earlier deadline, so a member woken from its device wait or by its
  //! peers' data takes the core from a process that merely computes beside
  //! it (a worker starting up on a shared host) instead of waiting for that
  //! one's slice to end. Kernels without per-task slices ignore it (logged).
  std::chrono::microseconds sched_slice{0};
  //! The shortest slice the kernel takes (sched_setattr's lower bound).
  static constexpr std::chrono::microseconds min_sched_slice{100};
  //! The longest slice the kernel takes (sched_setattr's upper bound).
  static constexpr std::chrono::microseconds max_sched_slice{100000};
  //! EBBFLOW_RT_PRIORITY (0: off; else 1 to 99): once this process is a
  //! member, the group's threads (the one that trains, i.e. that calls the
  //! group, and the heartbeat) switch to `SCHED_RR` at this priority (a
  //! newcomer: once it waits for the members to switch to its generation,
  //! so that, when they do, it runs as soon as a member waiting for it
  //! yields). Other threads stay normal: a real-time thread that spins
  //! while a normal one holds what it waits for keeps the core from it (UCX
  //! over tcp, its progress thread at real-time priority: the admission
  //! helper that wires up newcomers got no core for about a second, until
  //! the kernel's throttling). `SCHED_RESET_ON_FORK`: threads and processes they
  //! start later are normal ones, so a loader thread cannot hog a core at
  //! real-time priority. A process that is not yet a member, such as a
  //! worker starting up beside the members on a shared host, then runs only
  //! on cores they leave idle: a member that wakes, or yields while it waits
  //! for a peer, takes the core back at once rather than at the scheduler's
  //! next tick. Meant for members that leave the CPU idle while their device
  //! computes; members that keep every core busy would leave a newcomer on
  //! those cores only what the kernel's real-time throttling keeps back (5 %
  //! of each second by default). Opt-in: it needs `CAP_SYS_NICE` or an
  //! `RLIMIT_RTPRIO` of at least this (refused: logged, training goes on).
  //! The group's background work (the admission helper) stays a normal
  //! thread at the lowest priority. A collective's wait blocks after 2 ms
  //! (`EBBFLOW_UCX_WAIT=auto`), so members waiting for the store or a
  //! straggler leave the CPU to it, and the group's own polls (wiring up a
  //! new generation) sleep between tries; with `EBBFLOW_UCX_WAIT=yield`
  //! they would keep it until the throttling stepped in.
  int rt_priority = 0;
  //! The highest priority `SCHED_RR` takes on Linux.
  static constexpr int max_rt_priority = 99;
  //! EBBFLOW_PRECONNECT (default on, where the network can): members connect
  //! to admitted joiners in the background while training goes on, and the
  //! group switches at the first step boundary at which every member is wired
  //! up; off: every member stops at the admission step until connected. On,
  //! the store work of a change (the next generation's record, the joiners'
  //! addresses) and, where the network allows, the endpoints are done by a
  //! helper thread at the lowest CPU priority, on a store connection of its
  //! own, so the training thread spends microseconds on a join or a leave.
  bool preconnect = true;
  //! EBBFLOW_INITIAL_STAGING_MB (default 1024; 0: off). A launched worker
  //! receives the job's initial state into a copy of this size at most, then
  //! moves it into its registered buffers. Should the sender die during that
  //! transfer, the buffers still hold this worker's own initial state, and
  //! the group goes on with it. A larger state is received in place. Then
  //! such a death loses the state if every survivor was part written.
  std::size_t initial_staging = std::size_t{1024} << 20;
  //! EBBFLOW_JOIN_COOLDOWN=SEC[:MAX] (default 1:60; 0 turns it off). A
  //! worker whose newcomers failed n >= 2 times in a row while joining (from
  //! the join ticket until MAX s after admission) is held back SEC * 2^(n-2)
  //! s, at most MAX, before its next ticket is admitted. A newcomer that
  //! stays MAX s clears the count. Failures count per `worker_key`.
  std::chrono::milliseconds join_cooldown{1'000};
  std::chrono::milliseconds join_cooldown_max{60'000};  //!< MAX of EBBFLOW_JOIN_COOLDOWN
  //! EBBFLOW_WORKER_KEY: whose join failures count together (default: this
  //! host's name, so a flaky host is held back; ebbflow-run sets host/slot,
  //! so a restarted worker keeps the key of the one it replaces).
  std::string worker_key;
  //! EBBFLOW_PROCESS_KEY: the name the launcher gave this process, unique in
  //! the job (ebbflow-run sets `<launcher>/<worker id>`; empty: none). The
  //! member records which member it is under `process_record_key`, so the
  //! launcher that sees the process exit tells the others at once
  //! (`report_process_exit`) instead of leaving the death to their
  //! transports or to its lease.
  std::string process_key;

  //! The store key of generation `g`'s record, which the members write when
  //! it forms (e.g. a launcher waits for generation 0 to know training began).
  std::string generation_key(std::int64_t g) const { return prefix + "/gen/" + std::to_string(g); }
  //! The store key under which the member that process `name` (its
  //! EBBFLOW_PROCESS_KEY) became records its member id.
  std::string process_record_key(std::string_view name) const { return prefix + "/proc/" + std::string(name); }
  //! The store key that says member `m`'s process exited (`report_process_exit`).
  std::string gone_key(member_id m) const { return prefix + "/gone/" + std::to_string(m); }
  //! The store counter `report_process_exit` adds one to after each report,
  //! so the members read the reports only when there is a new one.
  std::string gone_count_key() const { return prefix + "/gone_count"; }

  //! Reads the fields named above from the environment (launch rank and world
  //! come from `launch_info`). @throws std::invalid_argument naming the variable.
  static group_options from_environment() { return from_environment(group_options{}); }
  //! As above, starting from `o` instead of the defaults.
  static group_options from_environment(group_options o) {
    if (auto j = env::get("EBBFLOW_JOB")) o.prefix = *j;
    o.min_size = static_cast<int>(env::get_int("EBBFLOW_MIN_SIZE", o.min_size, 1, 1 << 20));
    o.max_size = static_cast<int>(env::get_int("EBBFLOW_MAX_SIZE", o.max_size, o.min_size, comm::max_collective_ranks));
    o.join = env::get_bool("EBBFLOW_JOIN", o.join);
    o.heartbeat = env::get_ms("EBBFLOW_HEARTBEAT_MS", o.heartbeat, 1, 60'000);
    o.store_timeout = env::get_ms("EBBFLOW_STORE_TIMEOUT_MS", o.store_timeout, 1);
    o.lease = env::get_ms("EBBFLOW_LEASE_MS", o.lease, 10, 3'600'000);
    o.op_timeout = env::get_ms("EBBFLOW_OP_TIMEOUT_MS", o.op_timeout, 10, 24LL * 3'600'000);
    o.stall_warning = env::get_ms("EBBFLOW_STALL_WARN_MS", o.stall_warning, 0, 24LL * 3'600'000);
    o.sched_slice = std::chrono::microseconds(env::get_int_or_zero("EBBFLOW_SCHED_SLICE_US", o.sched_slice.count(),
                                                                   min_sched_slice.count(), max_sched_slice.count()));
    o.rt_priority = static_cast<int>(env::get_int_or_zero("EBBFLOW_RT_PRIORITY", o.rt_priority, 1, max_rt_priority));
    o.join_timeout = env::get_ms("EBBFLOW_JOIN_TIMEOUT_MS", o.join_timeout, 10, 24LL * 3'600'000);
    o.min_size_wait = env::get_ms("EBBFLOW_MIN_WAIT_MS", o.min_size_wait, 10, 24LL * 3'600'000);
    o.initial_wait = env::get_ms("EBBFLOW_INITIAL_WAIT_MS", o.initial_wait, 0, 24LL * 3'600'000);
    o.admit_delay = env::get_ms("EBBFLOW_ADMIT_DELAY_MS", o.admit_delay, 0, 3'600'000);
    o.preconnect = env::get_bool("EBBFLOW_PRECONNECT", o.preconnect);
    o.initial_staging =
        static_cast<std::size_t>(env::get_int(
            "EBBFLOW_INITIAL_STAGING_MB", static_cast<std::int64_t>(o.initial_staging >> 20), 0, std::int64_t{1} << 30))
        << 20;
    if (auto c = env::get("EBBFLOW_JOIN_COOLDOWN")) {
      const auto cd = cooldown::parse(*c, "EBBFLOW_JOIN_COOLDOWN", {o.join_cooldown, o.join_cooldown_max});
      o.join_cooldown = cd.sec;
      o.join_cooldown_max = cd.max;
    }
    if (auto k = env::get("EBBFLOW_WORKER_KEY")) o.worker_key = *k;
    if (auto k = env::get("EBBFLOW_PROCESS_KEY")) o.process_key = *k;
    return o;
  }
};

//! For a launcher: the process it started as `process_key` (the
//! EBBFLOW_PROCESS_KEY it gave it) has exited, `how` (e.g. "killed by
//! SIGKILL"). If that process became a member of the job, the members drop
//! it at once: those training with it abort their step (their heartbeat
//! reads the report), and a recovery counts it dead. Without a report, a
//! death that no survivor's transport saw (every process of one host killed
//! at once, say) waits for the member's lease. Call it only once the process
//! and whatever it started are gone. Returns the member id the process was,
//! or nullopt when it never registered (nothing to tell then).
//! @throws system_error from the store (its deadline `d`).
template <kv_store Store>
std::optional<member_id> report_process_exit(Store& st, const group_options& o, std::string_view process_key,
                                             std::string_view how, deadline d);

//! What this member does in the current step.
struct step_info {
  std::int64_t step = 0;           //!< committed steps so far (this step's number)
  std::int64_t epoch = 0;          //!< epoch of this step
  std::size_t cursor = 0;          //!< position in the epoch's sample order where this step's global batch starts
  std::size_t global_batch = 0;    //!< B_t (B, or less for an epoch's short last batch)
  std::size_t offset = 0;          //!< start of this member's slice inside the global batch
  std::size_t batch = 0;           //!< b_i, this member's slice length (may be 0)
  double weight = 0;               //!< b_i / B_t: scale of this member's mean-loss gradient
  int rank = 0;                    //!< rank in the current generation
  int world_size = 1;              //!< members in the current generation
  std::int64_t generation = 0;     //!< current generation
  std::uint64_t plan_version = 0;  //!< identifies the plan (same on every member)
};

//! Settings of `group::steal_step`.
struct steal_settings {
  plan::steal_options chunks{};       //!< chunk sizes (and the deadline of each claim)
  double claim_seconds = 60e-6;       //!< one store round trip (what a claim costs a thief)
  double chunk_overhead_seconds = 0;  //!< this member's cost of processing one more chunk
};

//! Why the membership changed (passed to world-changed callbacks).
enum class change_reason : std::uint8_t { initial, join, leave, failure };

//! The reason as a lower-case word ("initial", "join", "leave", "failure"), for logs.
constexpr std::string_view name(change_reason r) noexcept {
  switch (r) {
    case change_reason::initial:
      return "initial";
    case change_reason::join:
      return "join";
    case change_reason::leave:
      return "leave";
    case change_reason::failure:
      return "failure";
  }
  return "?";
}

//! A membership change as seen by callbacks and the event log.
struct world_change {
  std::int64_t generation = 0;                    //!< the generation that the change created
  change_reason reason = change_reason::initial;  //!< why it changed
  int old_size = 0;                               //!< members before the change (0 for the initial formation)
  int new_size = 0;                               //!< members after the change
  int rank = 0;                                   //!< this member's new rank
  std::int64_t step = 0;                          //!< committed step at which the change took effect
  double stall_seconds = 0;                       //!< time from the change's start to this member being ready again
};

namespace detail {
struct member_entry {
  member_id id = -1;
  std::int64_t committed = -1;  // newest committed step the member holds; -1: no state
};
// What a member with no step reports to a recovery when its buffers still
// hold its own launch-time initial state (never in a generation record).
inline constexpr std::int64_t own_initial_state = -2;

struct generation_record {
  std::int64_t generation = 0;
  change_reason reason = change_reason::initial;
  std::vector<member_entry> members;
  member_id source = -1;  // holds the newest committed state
  std::int64_t source_step = 0;
  std::vector<std::uint64_t> plan;  // full-B plan, rank order
  std::uint64_t plan_version = 0;
  std::int64_t joins_seen = 0;  // join tickets handled so far

  [[nodiscard]] bytes encode() const {
    writer w;
    w.put<std::uint32_t>(0xEBBF1001u).put(generation).put(static_cast<std::uint8_t>(reason));
    w.put<std::uint64_t>(members.size());
    for (auto& m : members) w.put(m.id).put(m.committed);
    w.put(source).put(source_step).put<std::uint64_t>(plan.size());
    for (auto b : plan) w.put(b);
    w.put(plan_version).put(joins_seen);
    return w.take();
  }
  static generation_record decode(std::span<const std::byte> in) {
    reader r(in, "generation record");
    generation_record g;
    if (r.get<std::uint32_t>() != 0xEBBF1001u)
      throw system_error(make_error_code(error::bad_message),
                         {.operation = "decode", .detail = "generation record magic"});
    g.generation = r.get<std::int64_t>();
    g.reason = static_cast<change_reason>(r.get<std::uint8_t>());
    const auto n = r.get_count(16);
    for (std::uint64_t i = 0; i < n; ++i) {
      member_entry m;
      m.id = r.get<member_id>();
      m.committed = r.get<std::int64_t>();
      g.members.push_back(m);
    }
    g.source = r.get<member_id>();
    g.source_step = r.get<std::int64_t>();
    const auto p = r.get_count(8);
    for (std::uint64_t i = 0; i < p; ++i) g.plan.push_back(r.get<std::uint64_t>());
    g.plan_version = r.get<std::uint64_t>();
    g.joins_seen = r.get<std::int64_t>();
    r.expect_end();
    return g;
  }
  [[nodiscard]] int rank_of(member_id id) const noexcept {
    for (std::size_t i = 0; i < members.size(); ++i)
      if (members[i].id == id) return static_cast<int>(i);
    return -1;
  }
};

inline std::atomic<bool>& signal_leave_flag() noexcept {
  static std::atomic<bool> f{false};
  return f;
}
extern "C" inline void on_leave_signal(int) { signal_leave_flag().store(true); }

}  // namespace detail

//! Makes `sig` (e.g. SIGTERM) request a graceful leave of every group in this
//! process at its next step boundary, instead of killing it.
inline void leave_on_signal(int sig = SIGTERM) { std::signal(sig, detail::on_leave_signal); }

//! Raised by `group` when it cannot go on: the store is gone, the membership
//! stayed below `min_size` for `min_size_wait`, or this worker was never
//! admitted. Carries errc::timeout / peer_lost / invalid_state.
using group_error = system_error;

//! The elastic group. `Store` models `kv_store`, `Net` models `network`.
//! `connect_store` makes one store client per thread that talks to the store:
//! the training thread, the heartbeat thread (again after a lost
//! connection) and the admission helper. The heartbeat thread and the helper
//! may call it at the same time, so it must be thread-safe; the clients it
//! returns need not be.
template <kv_store Store, network Net>
class group {
 public:
  //! The transport handed to `collective`: `Net`'s, revocable by the heartbeat thread.
  using transport_type = comm::revocable<typename Net::transport_type>;
  //! Collectives over the current generation's transport.
  using communicator_type = comm::basic_communicator<transport_type>;
  //! Connects a new store client (must not return nullptr; may throw, which the constructor passes on).
  using store_factory = std::function<std::unique_ptr<Store>()>;

  //! Joins the job: as one of the initial `launch.world_size` workers (rank
  //! `launch.rank`), or, with `opts.join`, as a newcomer admitted at a step
  //! boundary. Blocks until this worker is a member (deadline
  //! `opts.join_timeout`). Registered state is synchronised at the first
  //! `begin_step`; register it before that.
  //! @throws group_error, std::invalid_argument for bad options.
  group(store_factory connect_store, Net& net, group_options opts, launch_info launch,
        std::unique_ptr<planning_policy> policy = std::make_unique<uniform_policy>());

  group(const group&) = delete;
  group& operator=(const group&) = delete;
  //! Stops the heartbeat (the others see this worker as failed unless it left).
  //! A member that ends between steps first waits, for at most a lease
  //! (2 s at most), until every member of its generation ended too, so its
  //! closing transport fails no peer still in the last step's exchange.
  ~group();

  //! Registers a buffer that is part of the training state (parameters,
  //! optimizer state, ...): streamed to joiners and to members behind after a
  //! failure, each from one of the members holding the newest committed
  //! step. Host memory; same name and size on every member; replicated
  //! state (the same bits on members that committed the same steps), as
  //! data-parallel parameters and optimizer state are.
  void register_state(std::string name, std::span<std::byte> host_bytes);
  //! Called after every membership change (e.g. to rescale the learning
  //! rate). An exception it throws leaves `begin_step` as it is; the change
  //! stays in effect.
  void on_world_changed(std::function<void(const world_change&)> cb) { callbacks_.push_back(std::move(cb)); }

  //! This member's share of the next step. Applies a pending switch or state
  //! transfer first. @throws group_error when the group cannot go on.
  step_info begin_step();

  //! Runs `f(communicator&)` (any collectives over this generation).
  //! Returns false when a member failed: the step is aborted, the group
  //! re-formed, and the caller must redo the step from `begin_step`.
  //! Between `begin_step` and `end_step` only; after a false return, only
  //! `begin_step` (@throws group_error, invalid_state, otherwise).
  template <class F>
  [[nodiscard]] bool collective(F&& f);
  //! Sums `data` over all members (host memory). False: redo the step.
  [[nodiscard]] bool allreduce(std::span<float> data);
  //! As above, for doubles.
  [[nodiscard]] bool allreduce(std::span<double> data);

  //! In-step work stealing (plan/work_stealing.hpp) instead of processing
  //! the own slice whole: calls `process(first, last)` for positions
  //! [first, last) of this step's global batch (the sample at position p is
  //! the one at `cursor + p` of the epoch's order), first for chunks of its
  //! own slice, paced against its planned step time when the policy has
  //! models (`planning_policy::models`), then for chunks taken from the ends
  //! of slices whose owners fall behind. Each position is processed by exactly
  //! one member (claims are atomic adds on the job's store, keyed by
  //! generation and step, so a redone step never meets an aborted attempt's
  //! claims). Call between `begin_step` and the gradient allreduce on every
  //! member; weigh each sample by 1 / global_batch, as without stealing (a
  //! member that processed nothing still allreduces its zeros), and pass
  //! `processed` to `end_step`. `process` must not call the group. Once per
  //! step attempt (a second call throws group_error, invalid_state).
  //! @throws plan::plan_error, the store's errors, and what `process` throws.
  template <class Process>
  plan::steal_report steal_step(Process&& process, const steal_settings& settings = {});

  //! Commits the step (call after the optimizer step) and runs the control
  //! exchange: feeds every member's timing to the policy, applies new plans,
  //! leaves and joins. `compute_seconds`: this member's compute time of the step.
  void end_step(double compute_seconds);
  //! As above, after `steal_step`: `processed` samples (its report) took
  //! `compute_seconds`, which is what the policy learns from.
  void end_step(double compute_seconds, std::size_t processed);

  //! Resumes from a checkpoint: the step, epoch and cursor the job had
  //! reached. Call before the first `begin_step` on every member (the
  //! source's position travels with the initial state). Steps and epochs
  //! up to 2^62; with `drop_last`, not a cursor inside the short last batch.
  //! @throws group_error after the first begin_step, std::invalid_argument.
  void restore_position(std::int64_t step, std::int64_t epoch, std::size_t cursor);

  //! Asks to leave at the next step boundary (thread-safe).
  void request_leave() noexcept { leave_requested_.store(true); }
  //! Marks the job finished: workers still waiting to join stop waiting, and
  //! joiners admitted to a change still in flight (see `changing`) stop
  //! waiting for the state with a clear error.
  void finish();
  //! True while a membership change is unfinished: decided at an earlier
  //! step boundary and still being prepared in the background (joiners
  //! connecting, a leave pending), or switched to with the state still to
  //! move at the next `begin_step`. Every member sees the same value after
  //! `end_step` returns, so a loop that must not end with a joiner stranded
  //! can run on while it is true.
  [[nodiscard]] bool changing() const noexcept { return next_.has_value() || pending_.has_value(); }

  //! False once this member left the group (after `request_leave` took effect).
  [[nodiscard]] bool active() const noexcept { return active_; }
  //! This member's rank in the current generation.
  [[nodiscard]] int rank() const noexcept { return rank_; }
  //! Members in the current generation.
  [[nodiscard]] int size() const noexcept { return static_cast<int>(gen_.members.size()); }
  //! The current generation (grows by one with every membership change).
  [[nodiscard]] std::int64_t generation() const noexcept { return gen_.generation; }
  //! Steps committed so far; -1 on a joiner until its state arrived at the first `begin_step`.
  [[nodiscard]] std::int64_t step() const noexcept { return step_; }
  //! The epoch of the next step.
  [[nodiscard]] std::int64_t epoch() const noexcept { return epoch_; }
  //! Position in the epoch's sample order where the next step's global batch starts.
  [[nodiscard]] std::size_t cursor() const noexcept { return cursor_; }
  //! This worker's job-wide id (from the store; never reused).
  [[nodiscard]] member_id id() const noexcept { return id_; }
  //! The plan in force: every member's batch for a full global batch, rank
  //! order. Valid until the next membership change or re-plan.
  [[nodiscard]] std::span<const std::uint64_t> plan() const noexcept { return gen_.plan; }
  //! Every membership change this member saw, oldest first.
  [[nodiscard]] const std::vector<world_change>& history() const noexcept { return history_; }
  //! The transport of the current generation (valid until the next change).
  [[nodiscard]] transport_type& transport() { return *transport_; }
  //! The communicator of the current generation (valid until the next change).
  [[nodiscard]] communicator_type& communicator() { return *comm_; }

 private:
  std::string key(const std::string& k) const { return opts_.prefix + "/" + k; }
  // The store key of generation g's record.
  std::string gen_key(std::int64_t g) const { return opts_.generation_key(g); }
  // The store key that marks member m dead in generation g (a recovery leaves it out).
  std::string dead_key(std::int64_t g, member_id m) const {
    return key("dead/" + std::to_string(g) + "/" + std::to_string(m));
  }
  // Whether the job was marked finished (`finish`).
  bool job_done() { return store_->try_get(key("done"), store_deadline()).has_value(); }
  deadline store_deadline() const { return deadline::after(opts_.store_timeout); }
  void heartbeat_loop(std::stop_token st);
  // The end of the job: see ~group.
  void wait_for_peers_to_end() noexcept;
  static constexpr std::chrono::seconds end_wait_max{2};
  step_info current_slice() const;
  void form_initial();
  // Writes generation 0 of the registered workers (compare-and-set: the first proposal wins).
  void propose_initial(const std::vector<std::optional<std::string>>& registered);
  void wait_admission();
  // `begun`: a transport this member already started for rec (the
  // background connect of a join that now goes the blocking way).
  void adopt(detail::generation_record rec, steady_clock::time_point started,
             std::optional<typename Net::transport_type> begun = {});
  // adopt(), and on a recoverable error the recovery of rec's generation.
  void adopt_or_recover(detail::generation_record rec, steady_clock::time_point started,
                        std::optional<typename Net::transport_type> begun = {});
  void enter(detail::generation_record rec);
  void became_member();
  void take_member_scheduling();
  void install(detail::generation_record rec, typename Net::transport_type t, steady_clock::time_point started,
               double prepared_seconds);
  void write_record(Store& st, const std::string& gkey, const std::string& rec, const std::vector<member_id>& joiners,
                    std::int64_t g1) const;
  void start_admission(std::optional<std::string> record, std::string gkey, std::int64_t g1,
                       std::vector<member_id> leavers, steady_clock::time_point started);
  void take_admission();
  void adopt_announced(std::int64_t g1, steady_clock::time_point started,
                       std::optional<typename Net::transport_type> begun = {});
  void leave_now();
  typename Net::transport_type connect_watched(const detail::generation_record& rec, const std::vector<bytes>& addrs,
                                               std::optional<typename Net::transport_type> begun = {});
  int poll_next();
  void sync_state();
  void recover(std::int64_t failed_generation, int lost_peer);
  // Forms generation g+1 without the members `leaving` marks (1 per rank of
  // the `n`) and with the joiners being admitted.
  void change_membership(const std::vector<char>& leaving, int n);
  // The leaves the control exchange `ctl` applies (1 per rank): a leave that
  // would take the group below min_size, or leave newcomers without a state
  // holder, waits (the lowest-ranked leavers stay one more generation).
  std::vector<char> leaves_applied(const std::vector<double>& ctl, int n);
  bool deferral_logged_ = false;  // the coordinator said why leaves wait
  std::vector<bytes> gather_addresses(const detail::generation_record& rec);
  // As above, on `st` with `cache`: callable from the admission helper.
  std::vector<bytes> gather_addresses(const detail::generation_record& rec, Store& st,
                                      std::map<member_id, bytes>& cache, int rank,
                                      const std::shared_ptr<comm::revoke_flag>& revoke, std::stop_token stop);
  // A join ticket answered with a cool-down instead of an admission.
  struct join_hold {
    std::int64_t ticket = 0;
    std::int64_t ms = 0;        // how long the joiner waits before it files a new ticket
    std::int64_t failures = 0;  // its worker's join failures in a row
    std::string worker;         // its worker key
  };
  // The join tickets after `seen` (advanced past those handled), at most
  // `room` of them admitted; tickets of workers in a cool-down go to `holds`.
  std::vector<member_id> pending_joiners(std::int64_t& seen, std::size_t room, bool settle,
                                         std::vector<join_hold>& holds);
  void answer_holds(Store& st, const std::vector<join_hold>& holds) const;
  // The recovery's winner: the members lost from gen_ that were still in their
  // probation as newcomers count one join failure for their worker key.
  void count_join_failures(const std::vector<detail::member_entry>& alive, std::set<member_id>& counted);
  // Each member's heartbeat counter as last read, and when it last changed.
  using lease_seen = std::map<member_id, std::pair<std::int64_t, steady_clock::time_point>>;
  // Lease checks of a connect in progress: at most one round per heartbeat.
  struct lease_watch {
    lease_seen seen;
    steady_clock::time_point next_check{};
  };
  bool fresh(Store& st, member_id m, lease_seen& seen) const;
  // Whether member m, whose heartbeat counter reads `hb` at `now`, counted on
  // within the lease (its first reading counts as fresh).
  bool fresh(member_id m, std::int64_t hb, steady_clock::time_point now, lease_seen& seen) const;
  // The heartbeat thread's watch of the current generation's leases.
  struct peer_watch {
    std::int64_t generation = -1;
    lease_seen seen;
    steady_clock::time_point last_round{};
    std::int64_t aborted = -1;  // the generation this thread aborted, or saw aborted
  };
  // After a heartbeat round that read `ids`' counters `hb` for generation g:
  // a member silent for a lease is marked dead in g and g is aborted.
  void check_leases(Store& st, std::int64_t g, const std::vector<member_id>& ids, std::span<const std::int64_t> hb,
                    peer_watch& w);
  // The same for a launcher's report (report_process_exit) that one of
  // `ids` (ranks `ranks` in g) exited: it is marked dead and g aborted.
  void check_gone(Store& st, std::int64_t g, const std::vector<member_id>& ids, const std::vector<int>& ranks,
                  peer_watch& w);
  // Whether a heartbeat thread that found a member of g dead should still
  // abort g: the job has not finished and g is still this member's.
  bool abort_due(Store& st, std::int64_t g);
  // Marks m dead in g, posts abort/<g> and revokes this member's transport.
  void abort_without(Store& st, std::int64_t g, member_id m, peer_watch& w);
  int stale_member(const detail::generation_record& rec, lease_watch& w, bool joiners_only);
  void control_allreduce(std::span<double> v);
  void notify(change_reason reason, int old_size, double stall);
  [[noreturn]] void fail(std::error_code ec, const std::string& what) const;
  // Fails with invalid_state: "the job EBBFLOW_JOB='<prefix>' <what>".
  [[noreturn]] void fail_job_finished(std::string_view what) const;
  void fault_point(const char* point);
  void fault_point(const char* point, Store& st, std::stop_token stop);
  void release_steal_counter();
  // end_step: `processed` samples (the own slice when nullopt).
  void commit(double compute_seconds, std::optional<std::size_t> processed);
  int lost_peer_of(const system_error& e) const noexcept;
  static int lost_in_adopt(const system_error& e) noexcept;

  group_options opts_;
  launch_info launch_;
  store_factory connect_store_;
  std::unique_ptr<Store> store_;
  Net* net_;
  std::unique_ptr<planning_policy> policy_;
  member_id id_ = -1;
  comm::collective_options coll_opts_;
  std::map<member_id, bytes> address_cache_;  // stable-address networks only

  detail::generation_record gen_;
  int rank_ = -1;
  bool active_ = true;
  bool became_member_ = false;      // became_member() ran: once per process
  bool member_scheduling_ = false;  // take_member_scheduling() ran: once per process
  bool started_ = false;            // begin_step was called
  // Where the user's step is: begin_step opens it, end_step closes it, a
  // collective that returns false aborts it (redo from begin_step).
  enum class step_phase : unsigned char { closed, open, aborted };
  step_phase phase_ = step_phase::closed;
  bool callback_threw_ = false;  // a world-changed callback's exception is passing through
  static constexpr std::int64_t max_step = std::int64_t{1} << 62;
  // Throws group_error (invalid_state) unless a step is open on an active member.
  void require_open_step(const char* what) const;
  // The policy's plan for `ids`, checked: one entry each, summing to the global batch.
  std::vector<std::size_t> plan_of(const std::vector<member_id>& ids) const;
  std::int64_t step_ = -1;  // committed steps; -1 until state arrives
  std::int64_t epoch_ = 0;
  std::size_t cursor_ = 0;
  // The job's initial state is the registered buffers of the member that
  // formed generation 0. Should it die before that state moved, another
  // launched worker's own buffers serve instead, as if it had formed it:
  // only while no transfer has written them and the member was never left
  // out (a newcomer's buffers are never the job's state). See recover().
  bool own_initial_state_ = false;
  struct position {
    std::int64_t step, epoch;
    std::size_t cursor;
  };
  std::optional<position> restored_;  // restore_position's, kept by every member
  // This member takes its own buffers as the job's initial state (recover() chose it).
  void take_own_initial_state();
  struct pending_change {
    change_reason reason;
    int old_size;
    steady_clock::time_point started;
    double prepared_seconds = 0;  // spent before the switch connecting in the background (counted as stall)
  };
  std::optional<pending_change> pending_;  // state transfer and notification still to do
  // What the admission helper thread hands back: the store work of a
  // membership change (the coordinator's record, the next generation's
  // record and addresses) and, where the network allows it from another
  // thread, the endpoints, done while this member's training thread goes on.
  struct admission_result {
    std::atomic<bool> done{false};  // release: everything below is written
    std::exception_ptr error;
    std::optional<detail::generation_record> rec;
    std::vector<bytes> addrs;
    std::optional<typename Net::transport_type> transport;
    std::map<member_id, bytes> cache;  // the address cache, updated, handed back
    bool excluded = false;             // rec leaves this member out (a concurrent recovery): rejoin
    bool blocking = false;             // rec leaves a current member out: the blocking way sorts it out
  };
  // A join whose transport is wiring up while the current generation trains.
  struct next_generation {
    detail::generation_record rec;
    std::int64_t g1 = -1;               // the generation being prepared
    std::optional<std::string> record;  // the coordinator's record (the helper writes it)
    std::vector<member_id> admitted;    // the joiners that record admits
    std::optional<typename Net::transport_type> transport;
    steady_clock::time_point since;               // connect started
    double prepared_seconds = 0;                  // this member's training-thread time spent starting it
    bool leaving = false;                         // this member leaves at the switch (no transport)
    bool failed = false;                          // starting the connect failed here: fall back at the next exchange
    bool excluded = false;                        // the next generation leaves this member out: it rejoins
    lease_watch joiners;                          // joiners' leases
    std::shared_ptr<admission_result> admission;  // the helper's result while it runs
    std::jthread helper;                          // declared last: joined first
  };
  std::unique_ptr<Store> aux_store_;  // the admission helper's own connection (store clients are not thread-safe)
  std::optional<next_generation> next_;
  std::optional<transport_type> transport_;
  std::optional<typename Net::transport_type> retiring_;  // the replaced generation's, closing in the background
  std::optional<communicator_type> comm_;
  std::shared_ptr<comm::revoke_flag> revoke_;
  std::atomic<std::int64_t> hb_generation_{-1};
  std::mutex hb_wake_m_;                 // with hb_wake_: the heartbeat thread's sleep between beats,
  std::condition_variable_any hb_wake_;  // cut short when this process becomes a member
  std::mutex hb_mutex_;
  std::shared_ptr<comm::revoke_flag> hb_revoke_;
  std::vector<std::string> hb_erase_;  // store keys the heartbeat thread erases (under hb_mutex_)
  // The members of generation hb_watched_gen_ whose leases the heartbeat
  // thread watches (under hb_mutex_): the coordinator watches every other
  // member, the others the coordinator.
  std::int64_t hb_watched_gen_ = -1;
  std::vector<member_id> hb_watched_;
  std::vector<int> hb_watched_ranks_;  // their ranks in that generation
  std::atomic<bool> leave_requested_{false};
  // Nonzero while the training thread is inside begin_step, allreduce or
  // end_step (where it progresses the network itself): the admission helper
  // drives a background wire-up only while it is zero.
  std::atomic<int> in_group_{0};
  // Where the training thread is, published with its heartbeat for the
  // stall warning (an encoded detail::progress: a member behind another
  // reads lower); and since when the training thread waits inside a
  // collective (steady_clock ticks; 0: it does not).
  std::atomic<std::int64_t> progress_{0};
  std::atomic<steady_clock::rep> waiting_since_{0};
  std::pair<std::int64_t, std::int64_t> progress_at_{-1, -1};  // (generation, step) progress_k_ counts in
  int progress_k_ = 0;
  struct waiting {
    std::atomic<steady_clock::rep>& since;
    explicit waiting(std::atomic<steady_clock::rep>& s) noexcept : since(s) {}
    ~waiting() { since.store(0, std::memory_order_relaxed); }
    waiting(const waiting&) = delete;
    waiting& operator=(const waiting&) = delete;
  };
  // The training thread enters a collective: counts it and marks the wait.
  [[nodiscard]] waiting enter_collective(bool control = false) noexcept;
  // After a heartbeat round that found this member waiting for
  // stall_warning: names the watched members whose progress is behind.
  void report_stall(std::int64_t mine, steady_clock::duration waited, const std::vector<member_id>& ids,
                    const std::vector<int>& ranks, std::span<const std::int64_t> progress, bool coordinator) const;
  struct inside {
    std::atomic<int>& n;
    explicit inside(std::atomic<int>& c) noexcept : n(c) { n.fetch_add(1, std::memory_order_relaxed); }
    ~inside() { n.fetch_sub(1, std::memory_order_relaxed); }
    inside(const inside&) = delete;
    inside& operator=(const inside&) = delete;
  };
  // A newcomer until its probation ends (steady_clock ticks; 0: not one):
  // then the heartbeat thread clears its join-failure marks.
  std::atomic<steady_clock::rep> probation_end_{0};
  std::pair<std::int64_t, std::int64_t> steal_attempt_{-1, -1};  // (generation, step) of the last steal_step
  std::string steal_key_;             // this step's work-stealing counter of the own slice (erased when the step ends)
  std::vector<member_id> admitting_;  // joiners the coordinator flagged in this step's control exchange
  steady_clock::time_point last_commit_{};  // the previous end_step
  steady_clock::duration step_interval_{};  // from the previous end_step to this one
  // The coordinator's heartbeat thread reads the join-ticket counter into
  // join_seq_hint_, so that a coordinator's step reads the store only
  // while join tickets wait: a steady step makes no store call.
  std::atomic<bool> hb_watch_joins_{false};
  std::atomic<std::int64_t> join_seq_hint_{0};
  // It also reads the tickets themselves as they appear, and their workers'
  // join-failure counts, so that the step that admits them makes no store
  // call either (under hb_mutex_, by ticket number; tickets up to
  // hb_tickets_floor_ are handled). A ticket never changes once written; a
  // count only in a recovery (count_join_failures), which bumps
  // failures_epoch_ after it: a count read before that is read again.
  struct prefetched_ticket {
    std::string value;
    std::int64_t failures_epoch = -1;  // failures_epoch_ when `failures` was read (-1: not read)
    std::optional<std::string> failures;
  };
  std::map<std::int64_t, prefetched_ticket> hb_tickets_;
  std::atomic<std::int64_t> hb_tickets_floor_{0};
  std::atomic<std::int64_t> failures_epoch_{0};
  std::int64_t prefetch_tickets(Store& st, std::int64_t total);
  std::int64_t ticket_seen_until_ = 0;  // coordinator: newest join ticket seen
  std::int64_t ticket_hole_ = 0;        // coordinator: a ticket taken but not written, since:
  steady_clock::time_point ticket_hole_since_;
  steady_clock::time_point ticket_first_seen_;   // when the oldest waiting ticket was seen
  steady_clock::time_point ticket_last_change_;  // when the newest ticket was seen

  struct state_entry {
    std::string name;
    std::span<std::byte> data;
  };
  std::vector<state_entry> state_;
  std::vector<std::function<void(const world_change&)>> callbacks_;
  std::vector<world_change> history_;
  std::jthread heartbeat_;
};

//! Deduces the store type from what `connect_store` returns, so that a
//! lambda works as well as a `std::function`:
//! `elastic::group g([] { return std::make_unique<store_client>(...); }, net, opts, launch);`
template <class Connect, class Net, class... Policy>
requires std::invocable<Connect&> && requires { typename std::invoke_result_t<Connect&>::element_type; }
group(Connect, Net&, group_options, launch_info, Policy&&...)
    ->group<typename std::invoke_result_t<Connect&>::element_type, Net>;

}  // namespace elastic
EBBFLOW_END_NAMESPACE

#include <ebbflow/elastic/impl/group.hpp>
