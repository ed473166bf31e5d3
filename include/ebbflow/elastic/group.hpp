// SPDX-License-Identifier: Apache-2.0
//! @file group.hpp
//! The elastic group: data-parallel training whose workers join, leave and
//! fail while training goes on, with no restart and no lost or repeated
//! sample.
//!
//! A training loop joins the job and trains like this (docs/elastic.md
//! explains each line; docs/snippets/training_loop.cpp is the whole program,
//! which the tests build and run):
//! <!-- snippet: docs/snippets/training_loop.cpp#join -->
//! @code
//!   el::leave_on_signal(SIGTERM);                                    // SIGTERM: leave at the next step boundary
//!   el::group_options opts = el::group_options::from_environment();  // EBBFLOW_* settings (docs/elastic.md)
//!   opts.global_batch = 128;                                         // required: B, samples per step
//!   opts.dataset_size = dataset_size;                                // required: N, samples per epoch
//!   el::ucx_network net;
//!   el::group g([] { return std::make_unique<el::any_store>(el::any_store::from_environment()); }, net, opts,
//!               ef::launch_info::from_environment(), std::make_unique<el::planner_policy>());
//!   g.register_state("params", std::as_writable_bytes(std::span(params)));      // what must be equal on every
//!   g.register_state("velocity", std::as_writable_bytes(std::span(velocity)));  // member: model and optimizer
//! @endcode
//! <!-- snippet: docs/snippets/training_loop.cpp#loop -->
//! @code
//!   while (g.keep_training(steps)) {
//!     const el::step_info s = g.begin_step();  // my slice: positions [s.cursor + s.offset, + s.batch) of epoch s.epoch
//!     const auto t0 = std::chrono::steady_clock::now();
//!     compute_gradients(s, params, grads);
//!     const std::chrono::duration<double> compute = std::chrono::steady_clock::now() - t0;
//!     if (!g.allreduce(grads)) continue;  // a member failed: the step was rolled back; redo it
//!     sgd_step(params, velocity, grads);
//!     g.end_step(compute.count());  // commit; joins, leaves and re-plans take effect here
//!   }
//! @endcode
//! `keep_training` ends the loop once `total_steps` steps are committed and
//! no membership change is unfinished, and then marks the job finished
//! (`finish`); a loop that ends otherwise calls `finish` itself.
//!
//! Guarantees (docs/elastic.md gives the protocol and the argument for each):
//! * Every member applies the same update every step: the gradient of the
//!   step's global batch, each sample of an epoch used exactly once across
//!   joins, leaves and failures, so the parameters equal a single-process
//!   run over the same global batches.
//! * A failure (a peer's death or hang) makes a collective return false on
//!   every survivor: the step was rolled back (no update applied, the cursor
//!   did not advance) and the group re-formed; the caller redoes it.
//! * Joins and leaves take effect at step boundaries; newcomers connect in
//!   the background while the members train, and receive the committed state
//!   from the members holding it.
//! * Every wait has a deadline (group_options); what the group cannot
//!   recover from throws `group_error` naming the rank, generation and cause.
//!
//! Thread safety: one thread drives a group; `request_leave` may be called
//! from any thread or a signal handler (through `leave_on_signal`).
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/env.hpp>    // launch_info
#include <ebbflow/core/error.hpp>  // system_error
#include <ebbflow/elastic/detail/group_impl.hpp>
#include <ebbflow/elastic/group_options.hpp>
#include <ebbflow/elastic/group_types.hpp>
#include <ebbflow/elastic/kv_store.hpp>
#include <ebbflow/elastic/network.hpp>
#include <ebbflow/elastic/planning_policy.hpp>
#include <ebbflow/plan/work_stealing.hpp>  // plan::steal_report

#include <csignal>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

//! Raised by `group` when it cannot go on: the store is gone, the membership
//! stayed below `min_size` for `min_size_wait`, or this worker was never
//! admitted. Carries errc::timeout / peer_lost / invalid_state / job_finished.
using group_error = system_error;

//! The elastic group. `Store` models `kv_store`, `Net` models `network`.
//! `connect_store` makes one store client per thread that talks to the store:
//! the training thread, the heartbeat thread (again after a lost connection)
//! and the admission helper. The heartbeat thread and the helper may call it
//! at the same time, so it must be thread-safe; the clients it returns need
//! not be.
template <kv_store Store, network Net>
class group {
  using impl_type = detail::group_impl<Store, Net>;

 public:
  //! The transport handed to `collective`: `Net`'s, revocable by the heartbeat thread.
  using transport_type = typename impl_type::transport_type;
  //! Collectives over the current generation's transport.
  using communicator_type = typename impl_type::communicator_type;
  //! Connects a new store client (must not return nullptr; may throw, which the constructor passes on).
  using store_factory = typename impl_type::store_factory;

  //! Joins the job: as one of the initial `launch.world_size` workers (rank
  //! `launch.rank`), or, with `opts.join`, as a newcomer admitted at a step
  //! boundary. Blocks until this worker is a member (deadline
  //! `opts.join_timeout`). Registered state is synchronised at the first
  //! `begin_step`; register it before that.
  //! @throws group_error, std::invalid_argument for bad options.
  group(store_factory connect_store, Net& net, group_options opts, launch_info launch,
        std::unique_ptr<planning_policy> policy = std::make_unique<uniform_policy>())
      : impl_(std::move(connect_store), net, std::move(opts), std::move(launch), std::move(policy)) {}

  group(const group&) = delete;
  group& operator=(const group&) = delete;
  //! Stops the heartbeat (the others see this worker as failed unless it left).
  //! A member that ends between steps first waits, for at most a lease
  //! (2 s at most), until every member of its generation ended too, so its
  //! closing transport fails no peer still in the last step's exchange.
  ~group() = default;

  //! Registers a buffer that is part of the training state (parameters,
  //! optimizer state, ...): streamed to joiners and to members behind after a
  //! failure, each from one of the members holding the newest committed
  //! step. Host memory; same name and size on every member; replicated
  //! state (the same bits on members that committed the same steps).
  //! @throws group_error (invalid_state) after the first `begin_step`.
  void register_state(std::string name, std::span<std::byte> host_bytes) {
    impl_.register_state(std::move(name), host_bytes);
  }
  //! Called after every membership change (e.g. to rescale the learning
  //! rate). An exception it throws leaves `begin_step` as it is; the change
  //! stays in effect.
  void on_world_changed(std::function<void(const world_change&)> cb) { impl_.callbacks_.push_back(std::move(cb)); }

  //! This member's share of the next step. Applies a pending switch or state
  //! transfer first. @throws group_error when the group cannot go on.
  step_info begin_step() { return impl_.begin_step(); }

  //! Runs `f(communicator&)` (any collectives over this generation).
  //! Returns false when a member failed: the step is aborted, the group
  //! re-formed, and the caller must redo the step from `begin_step`.
  //! Between `begin_step` and `end_step` only; after a false return, only
  //! `begin_step` (@throws group_error, invalid_state, otherwise).
  template <class F>
  [[nodiscard]] bool collective(F&& f) {
    return impl_.collective(std::forward<F>(f));
  }
  //! Sums `data` over all members (host memory). False: redo the step.
  [[nodiscard]] bool allreduce(std::span<float> data) { return impl_.allreduce(data); }
  //! As above, for doubles.
  [[nodiscard]] bool allreduce(std::span<double> data) { return impl_.allreduce(data); }

  //! In-step work stealing (plan/work_stealing.hpp) instead of processing
  //! the own slice whole: calls `process(first, last)` for positions
  //! [first, last) of this step's global batch (the sample at position p is
  //! the one at `cursor + p` of the epoch's order), first for chunks of its
  //! own slice, paced against its planned step time when the policy has
  //! models, then for chunks taken from the ends of slices whose owners fall
  //! behind. Each position is processed by exactly one member (atomic claims
  //! on the job's store, keyed by generation and step). Call between
  //! `begin_step` and the gradient allreduce on every member; weigh each
  //! sample by 1 / global_batch (a member that processed nothing still
  //! allreduces its zeros), and pass `processed` to `end_step`. `process`
  //! must not call the group. Once per step attempt.
  //! @throws group_error (invalid_state) when called twice, plan::plan_error
  //! (bad settings), plan::plan_fault (a corrupt claim counter in the store),
  //! the store's errors, and what `process` throws.
  template <class Process>
  plan::steal_report steal_step(Process&& process, const steal_settings& settings = {}) {
    return impl_.steal_step(std::forward<Process>(process), settings);
  }

  //! Commits the step (call after the optimizer step) and runs the control
  //! exchange: feeds every member's timing to the policy, applies new plans,
  //! leaves and joins. `compute_seconds`: this member's compute time of the step.
  void end_step(double compute_seconds) { impl_.commit(compute_seconds, std::nullopt); }
  //! As above, after `steal_step`: `processed` samples (its report) took
  //! `compute_seconds`, which is what the policy learns from.
  void end_step(double compute_seconds, std::size_t processed) { impl_.commit(compute_seconds, processed); }

  //! Resumes from a checkpoint: the step, epoch and cursor the job had
  //! reached. Call before the first `begin_step` on every member (the
  //! source's position travels with the initial state). Steps and epochs
  //! up to 2^62; with `drop_last`, not a cursor inside the short last batch.
  //! @throws group_error after the first begin_step, std::invalid_argument.
  void restore_position(std::int64_t step, std::int64_t epoch, std::size_t cursor) {
    impl_.restore_position(step, epoch, cursor);
  }

  //! Asks to leave at the next step boundary (thread-safe).
  void request_leave() noexcept { impl_.leave_requested_.store(true); }
  //! Marks the job finished: workers still waiting to join stop waiting, and
  //! joiners admitted to a change still in flight (see `changing`) stop
  //! waiting for the state with a clear error (job_finished); a worker
  //! started later under this job is refused at once. `keep_training` calls
  //! it when the steps are done; a loop that ends otherwise calls it after
  //! its last step (on one member or on all: the same mark).
  //! @throws system_error from the store.
  void finish() { impl_.finish(); }
  //! True while a membership change is unfinished: decided at an earlier
  //! step boundary and still being prepared in the background, or switched
  //! to with the state still to move at the next `begin_step`. Every member
  //! sees the same value after `end_step` returns, so a loop that must not
  //! end with a joiner stranded can run on while it is true.
  [[nodiscard]] bool changing() const noexcept { return impl_.changing(); }

  //! The condition of the training loop, `while (g.keep_training(total_steps))`:
  //! true while this member should run another step, that is while it is
  //! `active()` and either fewer than `total_steps` steps are committed or a
  //! membership change is unfinished (`changing()`: a joiner admitted near
  //! the end is taken in rather than stranded, so the job may commit a few
  //! steps more than `total_steps`). Every member gets the same answer after
  //! `end_step`. The first time it returns false because the steps are done,
  //! it calls `finish()`, so a worker started later under this job is refused
  //! at once (job_finished); a member that left returns false without it.
  //! Once false, it stays false. A loop that ends otherwise (on a loss
  //! target, a time limit, a signal) calls `finish()` itself.
  //! @throws std::invalid_argument when total_steps is negative; what `finish` throws.
  [[nodiscard]] bool keep_training(std::int64_t total_steps) { return impl_.keep_training(total_steps); }

  //! False once this member left the group (after `request_leave` took effect).
  [[nodiscard]] bool active() const noexcept { return impl_.active_; }
  //! This member's rank in the current generation.
  [[nodiscard]] int rank() const noexcept { return impl_.rank_; }
  //! Members in the current generation.
  [[nodiscard]] int size() const noexcept { return impl_.size(); }
  //! The current generation (grows by one with every membership change).
  [[nodiscard]] std::int64_t generation() const noexcept { return impl_.gen_.generation; }
  //! Steps committed so far; -1 on a joiner until its state arrived at the first `begin_step`.
  [[nodiscard]] std::int64_t step() const noexcept { return impl_.step_; }
  //! The epoch of the next step.
  [[nodiscard]] std::int64_t epoch() const noexcept { return impl_.epoch_; }
  //! Position in the epoch's sample order where the next step's global batch starts.
  [[nodiscard]] std::size_t cursor() const noexcept { return impl_.cursor_; }
  //! This worker's job-wide id (from the store; never reused).
  [[nodiscard]] member_id id() const noexcept { return impl_.id_; }
  //! The plan in force: every member's batch for a full global batch, rank
  //! order. Valid until the next membership change or re-plan.
  [[nodiscard]] std::span<const std::uint64_t> plan() const noexcept { return impl_.gen_.plan; }
  //! Every membership change this member saw, oldest first.
  [[nodiscard]] const std::vector<world_change>& history() const noexcept { return impl_.history_; }
  //! The transport of the current generation (valid until the next change).
  [[nodiscard]] transport_type& transport() { return *impl_.transport_; }
  //! The communicator of the current generation (valid until the next change).
  [[nodiscard]] communicator_type& communicator() { return *impl_.comm_; }

 private:
  impl_type impl_;  // all state and the protocol: elastic/detail/group_impl.hpp
};

//! Deduces the store type from what `connect_store` returns, so that a
//! lambda works as well as a `std::function`:
//! `elastic::group g([] { return std::make_unique<store_client>(...); }, net, opts, launch);`
template <class Connect, class Net, class... Policy>
requires std::invocable<Connect&> && requires { typename std::invoke_result_t<Connect&>::element_type; }
group(Connect, Net&, group_options, launch_info, Policy&&...)
    ->group<typename std::invoke_result_t<Connect&>::element_type, Net>;

//! Makes `sig` (e.g. SIGTERM) request a graceful leave of every group in this
//! process at its next step boundary, instead of killing it.
inline void leave_on_signal(int sig = SIGTERM) { std::signal(sig, detail::on_leave_signal); }

}  // namespace elastic
EBBFLOW_END_NAMESPACE

// Separate compilation (config.hpp): the group over UCX and store_client or
// any_store is instantiated once, in ebbflow::compiled; tcp_store.hpp and
// any_store.hpp declare that instantiation (extern template), so a
// translation unit pays for no store it does not include. The member
// definitions stay visible: a group over another store or network
// instantiates as in header-only mode.
