// SPDX-License-Identifier: Apache-2.0
//! @file detail/group_impl.hpp
//! The state of an elastic group and the operations on it, behind the public
//! `elastic::group` (elastic/group.hpp, the contract). One class, because
//! every part works on the same generation; its definitions are split by
//! concern, one file each, under elastic/impl/group/:
//!
//! | file                  | owns                                                           |
//! |-----------------------|----------------------------------------------------------------|
//! | lifecycle.hpp         | construction, the end of a member, registered state, finish,   |
//! |                       | keep_training                                                  |
//! | formation.hpp         | generation 0 and waiting to be admitted as a newcomer          |
//! | generation.hpp        | entering a generation: addresses, wire-up, install, leaving    |
//! | step.hpp              | the user's step: begin, collectives, work stealing, commit     |
//! | join_tickets.hpp      | the coordinator's queue of newcomers and their cool-downs      |
//! | membership_change.hpp | joins and leaves decided at a step boundary, connected in the  |
//! |                       | background by the admission helper thread                      |
//! | state_transfer.hpp    | streaming the committed state to members that lack it          |
//! | recovery.hpp          | re-forming the group after a failure                           |
//! | heartbeat.hpp         | the heartbeat thread: leases, exit reports, aborts, stalls     |
//!
//! Threads: the training thread (the user's, calling the group) owns
//! everything not marked otherwise. The heartbeat thread touches only the
//! `hb_*` members (under `hb_mutex_` or atomic), the atomics it shares with
//! the training thread, and its own store client. The admission helper
//! thread touches only what `start_admission` hands it and its
//! `admission_result`. The protocol is described in docs/elastic.md.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/comm/communicator.hpp>
#include <ebbflow/comm/revocable.hpp>
#include <ebbflow/comm/transport.hpp>
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/core/env.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/core/log.hpp>
#include <ebbflow/elastic/detail/progress.hpp>
#include <ebbflow/elastic/detail/records.hpp>
#include <ebbflow/elastic/group_options.hpp>
#include <ebbflow/elastic/group_types.hpp>
#include <ebbflow/elastic/kv_store.hpp>
#include <ebbflow/elastic/network.hpp>
#include <ebbflow/elastic/planning_policy.hpp>
#include <ebbflow/plan/work_stealing.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

template <kv_store Store, network Net>
class group;

namespace detail {

// Set by `leave_on_signal`'s handler: every group of the process leaves at
// its next step boundary.
inline std::atomic<bool>& signal_leave_flag() noexcept {
  static std::atomic<bool> f{false};
  return f;
}
extern "C" inline void on_leave_signal(int) { signal_leave_flag().store(true); }

// Errors after which the group re-forms instead of giving up.
inline bool recoverable(const std::error_code& ec) noexcept {
  return ec == errc::peer_lost || ec == errc::timeout || ec == errc::revoked;
}

template <kv_store Store, network Net>
class group_impl {
 public:
  using transport_type = comm::revocable<typename Net::transport_type>;
  using communicator_type = comm::transport_communicator<transport_type>;
  using store_factory = std::function<std::unique_ptr<Store>()>;

  // The public operations (elastic/group.hpp documents each).
  group_impl(store_factory connect_store, Net& net, group_options opts, launch_info launch,
             std::unique_ptr<planning_policy> policy);
  group_impl(const group_impl&) = delete;
  group_impl& operator=(const group_impl&) = delete;
  ~group_impl();
  void register_state(std::string name, std::span<std::byte> host_bytes);
  step_info begin_step();
  template <class F>
  bool collective(F&& f);
  bool allreduce(std::span<float> data);
  bool allreduce(std::span<double> data);
  template <class Process>
  plan::steal_report steal_step(Process&& process, const steal_settings& settings);
  // end_step: `processed` samples (the own slice when nullopt).
  void commit(double compute_seconds, std::optional<std::size_t> processed);
  void restore_position(std::int64_t step, std::int64_t epoch, std::size_t cursor);
  void finish();
  bool keep_training(std::int64_t total_steps);
  // A membership change is unfinished (group::changing).
  bool changing() const noexcept { return next_.has_value() || pending_.has_value(); }

 private:
  friend class elastic::group<Store, Net>;  // reads the state its accessors return

  // ---- store keys and failures (lifecycle.hpp)
  std::string key(const std::string& k) const { return opts_.prefix + "/" + k; }
  // The store key of generation g's record.
  std::string gen_key(std::int64_t g) const { return opts_.generation_key(g); }
  // The store key that marks member m dead in generation g (a recovery leaves it out).
  std::string dead_key(std::int64_t g, member_id m) const {
    return key("dead/" + std::to_string(g) + "/" + std::to_string(m));
  }
  // Whether the job was marked finished (`finish`).
  bool job_done() { return store_->try_get(key("done"), store_deadline()).has_value(); }
  // The deadline of a store call: store_timeout, or at most a lease while
  // the heartbeat finds the store unreachable (a call then fails fast).
  deadline store_deadline() const {
    return deadline::after(store_unreachable() ? std::min<std::chrono::milliseconds>(opts_.store_timeout, opts_.lease)
                                               : opts_.store_timeout);
  }
  bool store_unreachable() const noexcept { return store_down_since_.load(std::memory_order_relaxed) != 0; }
  // Whether `e` came from a store call (its operation is "store.<op>").
  static bool store_failure(const system_error& e) noexcept { return e.operation().starts_with("store"); }
  static constexpr std::chrono::seconds store_warning_period{10};
  [[noreturn]] void fail(std::error_code ec, const std::string& what) const;
  // Fails with job_finished: "the job EBBFLOW_JOB='<prefix>' <what>".
  [[noreturn]] void fail_job_finished(std::string_view what) const;
  // EBBFLOW_FAULT (detail/fault_injection.hpp), claimed on the training
  // thread's store connection, or on `st` from another thread.
  void fault_point(const char* point);
  void fault_point(const char* point, Store& st, std::stop_token stop);
  // The end of the job: see ~group.
  void wait_for_peers_to_end() noexcept;
  static constexpr std::chrono::seconds end_wait_max{2};

  // ---- generation 0 and newcomers (formation.hpp)
  void form_initial();
  // Writes generation 0 of the registered workers (compare-and-set: the first proposal wins).
  void propose_initial(const std::vector<std::optional<std::string>>& registered);
  void wait_admission();

  // ---- entering a generation (generation.hpp)
  int size() const noexcept { return static_cast<int>(gen_.members.size()); }  // members of gen_
  // `begun`: a transport this member already started for rec (the
  // background connect of a join that now goes the blocking way).
  void adopt(generation_record rec, steady_clock::time_point started,
             std::optional<typename Net::transport_type> begun = {});
  // adopt(), and on a recoverable error the recovery of rec's generation.
  void adopt_or_recover(generation_record rec, steady_clock::time_point started,
                        std::optional<typename Net::transport_type> begun = {});
  void enter(generation_record rec);
  void became_member();
  void take_member_scheduling();
  void install(generation_record rec, typename Net::transport_type t, steady_clock::time_point started,
               double prepared_seconds);
  typename Net::transport_type connect_watched(const generation_record& rec, const std::vector<bytes>& addrs,
                                               std::optional<typename Net::transport_type> begun = {});
  std::vector<bytes> gather_addresses(const generation_record& rec);
  // As above, on `st` with `cache`: callable from the admission helper.
  std::vector<bytes> gather_addresses(const generation_record& rec, Store& st, std::map<member_id, bytes>& cache,
                                      int rank, const std::shared_ptr<comm::revoke_flag>& revoke, std::stop_token stop);
  void leave_now();

  // ---- the user's step (step.hpp)
  step_info current_slice() const;
  // Throws group_error (invalid_state) unless a step is open on an active member.
  void require_open_step(const char* what) const;
  // The policy's plan for `ids`, checked: one entry each, summing to the global batch.
  std::vector<std::size_t> plan_of(const std::vector<member_id>& ids) const;
  void control_allreduce(std::span<double> v);
  void notify(change_reason reason, int old_size, double stall);
  void release_steal_counter();

  // ---- state transfer (state_transfer.hpp)
  void sync_state();

  // ---- the coordinator's join tickets (join_tickets.hpp)
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
  void count_join_failures(const std::vector<member_entry>& alive, std::set<member_id>& counted);
  // The heartbeat thread's read-ahead of new tickets (see hb_tickets_).
  std::int64_t prefetch_tickets(Store& st, std::int64_t total);

  // ---- joins and leaves at a step boundary (membership_change.hpp)
  // Forms generation g+1 without the members `leaving` marks (1 per rank of
  // the `n`) and with the joiners being admitted.
  void change_membership(const std::vector<char>& leaving, int n);
  // The leaves the control exchange `ctl` applies (1 per rank): a leave that
  // would take the group below min_size, or leave newcomers without a state
  // holder, waits (the lowest-ranked leavers stay one more generation).
  std::vector<char> leaves_applied(const std::vector<double>& ctl, int n);
  bool deferral_logged_ = false;  // the coordinator said why leaves wait
  void write_record(Store& st, const std::string& gkey, const std::string& rec, const std::vector<member_id>& joiners,
                    std::int64_t g1) const;
  void start_admission(std::optional<std::string> record, std::string gkey, std::int64_t g1,
                       std::vector<member_id> leavers, steady_clock::time_point started);
  void take_admission();
  void adopt_announced(std::int64_t g1, steady_clock::time_point started,
                       std::optional<typename Net::transport_type> begun = {});
  int poll_next();

  // ---- recovery after a failure (recovery.hpp)
  // Re-forms the group after generation `failed_generation` failed (its
  // rank `lost_peer` seen dead, or -1); a store that cannot be reached makes
  // it fail with a clear group_error.
  void recover(std::int64_t failed_generation, int lost_peer);
  void reform(std::int64_t failed_generation, int lost_peer);
  int lost_peer_of(const system_error& e) const noexcept;
  static int lost_in_adopt(const system_error& e) noexcept;
  // This member takes its own buffers as the job's initial state (recover() chose it).
  void take_own_initial_state();

  // ---- leases (heartbeat.hpp)
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
  // The rank in `rec` of a member whose lease expired (with `joiners_only`,
  // a joiner), else -1; reads the store at most once a heartbeat.
  int stale_member(const generation_record& rec, lease_watch& w, bool joiners_only);
  void heartbeat_loop(std::stop_token st);
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
  // A heartbeat round could not reach the store: marks it unreachable and
  // warns (at once, then every store_warning_period).
  void note_store_unreachable(const char* why, steady_clock::time_point& next_warning);
  // Whole seconds from steady_clock tick `since` to now.
  static long long seconds_since(steady_clock::rep since) noexcept {
    return std::chrono::duration_cast<std::chrono::seconds>(steady_clock::now().time_since_epoch() -
                                                            steady_clock::duration(since))
        .count();
  }

  // ---- the state, in declaration order (which is destruction order)

  group_options opts_;
  launch_info launch_;
  store_factory connect_store_;
  std::unique_ptr<Store> store_;
  Net* net_;
  std::unique_ptr<planning_policy> policy_;
  member_id id_ = -1;
  comm::collective_options coll_opts_;
  std::map<member_id, bytes> address_cache_;  // stable-address networks only

  generation_record gen_;
  int rank_ = -1;
  bool active_ = true;
  bool became_member_ = false;      // became_member() ran: once per process
  bool member_scheduling_ = false;  // take_member_scheduling() ran: once per process
  bool started_ = false;            // begin_step was called
  bool finished_ = false;           // keep_training found the job's steps done and called finish()
  // Where the user's step is: begin_step opens it, end_step closes it, a
  // collective that returns false aborts it (redo from begin_step).
  enum class step_phase : unsigned char { closed, open, aborted };
  step_phase phase_ = step_phase::closed;
  bool callback_threw_ = false;  // a world-changed callback's exception is passing through
  static constexpr std::int64_t max_step = std::int64_t{1} << 62;
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
    std::optional<generation_record> rec;
    std::vector<bytes> addrs;
    std::optional<typename Net::transport_type> transport;
    std::map<member_id, bytes> cache;  // the address cache, updated, handed back
    bool excluded = false;             // rec leaves this member out (a concurrent recovery): rejoin
    bool blocking = false;             // rec leaves a current member out: the blocking way sorts it out
  };
  // A join whose transport is wiring up while the current generation trains.
  struct next_generation {
    generation_record rec;
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
  // Since when the heartbeat finds the store unreachable (steady_clock ticks; 0: it is reachable).
  std::atomic<steady_clock::rep> store_down_since_{0};
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
  // stall warning (an encoded progress: a member behind another
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

}  // namespace detail
}  // namespace elastic
EBBFLOW_END_NAMESPACE

#include <ebbflow/elastic/impl/group/lifecycle.hpp>
#include <ebbflow/elastic/impl/group/heartbeat.hpp>
#include <ebbflow/elastic/impl/group/formation.hpp>
#include <ebbflow/elastic/impl/group/generation.hpp>
#include <ebbflow/elastic/impl/group/state_transfer.hpp>
#include <ebbflow/elastic/impl/group/step.hpp>
#include <ebbflow/elastic/impl/group/join_tickets.hpp>
#include <ebbflow/elastic/impl/group/membership_change.hpp>
#include <ebbflow/elastic/impl/group/recovery.hpp>
