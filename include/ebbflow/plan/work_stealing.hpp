// SPDX-License-Identifier: Apache-2.0
//! @file work_stealing.hpp
//! In-step work stealing with exactly-once claims: a transient straggler's
//! unfinished tail is taken over by workers that finished early.
//!
//! A plan splits a step's B samples into per-rank slices (rank r owns the
//! b_r items [0, b_r) of its slice; `epoch_sampler::slice` maps them to data-set
//! indices). With stealing, each slice is consumed from the FRONT by its owner
//! and from the BACK by thieves, in chunks. Every claim on slice r is ONE
//! atomic fetch-add on one 64-bit store counter, `key(r)`, which packs two
//! counts: bits 32..62 hold F, the items the owner has requested so far, and
//! bits 0..31 hold K, the items thieves have requested. A claim of q items
//! adds q·2^32 (owner) or q (thief); `add` returns the value after the claim,
//! so the claimant knows the exact state (F, K) just before it and is granted
//! g = min(q, max(0, b_r − F − K)) items: the owner [F, F + g), a thief
//! [b_r − K − g, b_r − K).
//!
//! Exactly once, never out of range: the store applies the adds of one key in
//! a total order. While F + K <= b_r every claim so far was granted in full,
//! so the owner holds [0, F) and the thieves hold [b_r − K, b_r), disjoint
//! since F + K <= b_r. The claim that first makes F + K >= b_r is granted
//! exactly the gap b_r − F − K, and every later claim 0. Hence every item of
//! [0, b_r) is granted to exactly one claim. Every item is also processed:
//! the owner keeps claiming until a claim comes back short (its slice is
//! exhausted), so stealing is only an optimisation; a thief may stop whenever
//! it likes. The fields cannot overflow: the owner is the only writer of F and
//! never requests more than b_r − F (it knows F exactly), so F <= b_r < 2^31;
//! a thief requests at most what it last saw remaining and at most
//! `thief_request_limit(b_r, slices)`, and it makes at most one short claim
//! per slice (after one it knows the slice is exhausted), so
//! K <= b_r + slices·limit < 2^32 and never carries into F.
//!
//! Keys: `<prefix>/<generation>/<step>/<rank>`. The pair (generation, step)
//! must be unique per step *attempt*: a rolled-back step that is redone must
//! use a new generation (the elastic group's generation changes whenever a
//! step is rolled back) or a new step number, so counters of an old attempt,
//! and late claims of a zombie member, can never touch the new one. Cost:
//! one small integer key per (attempt, slice). `release()` erases the own
//! slice's key when the store supports `erase(key)` (the Boost.Asio store
//! client and memory_store do): call it once no member can claim in
//! this step any more, e.g. after the step's gradient allreduce. A late claim
//! on an erased key recreates a junk key of a dead attempt that nobody reads.
//!
//! Gradient weights (the loss-scaling contract): with stealing, worker i
//! trains on p_i = `processed()` samples (own and stolen) instead of b_i, and
//! Σ_i p_i = B. Each worker must weight each of its samples by 1/B: compute
//! the SUM of the per-sample losses over everything it processed in the step
//! (accumulating gradients over its chunks) and divide by B, or equivalently
//! scale its mean-loss gradient by w_i = p_i / B (`weight(B)`), not by the
//! plan's b_i / B. The allreduced sum is then the mean-loss gradient of the
//! step's B samples, exactly as without stealing. A worker that processed
//! nothing contributes a zero gradient and still takes part in the allreduce.
//!
//! Samples and data: a thief reads the data-set indices of another rank's
//! slice (`samples_of`), so stealing fits `epoch_sampler` over a data set
//! every worker can read; it does not fit `shard_sampler`, where only a shard's
//! owner reads it.
//!
//! Chunk sizes (`steal_options`, `owner_request`, `thief_request`): the owner
//! claims a first chunk (first_fraction·b_r, small enough that an owner up to
//! 1/first_fraction times slower than planned still finishes it in the planned
//! step time, and that measures its speed in this step), then everything but a
//! tail reserve (tail_reserve·b_r) at once, then guided chunks
//! ceil(rest / owner_divisor) of the reserve, never below min_chunk and never
//! leaving less than min_chunk behind. A step on plan thus costs about
//! 2 + log_{owner_divisor}(tail_reserve·b_r / min_chunk) claims; the reserve
//! is what thieves can take from an owner that is a little slow (noise),
//! while pacing leaves a straggler's whole rest to them. Callers may cap a
//! claim (`steal_policy` and `run_stealing_step` do all of this), e.g. with
//! `paced_owner_cap` so an owner that falls behind its planned step time
//! claims little and leaves its tail to thieves, and with `balanced_steal` so
//! a thief takes no more than it can finish before the victim would.
//!
//! Thread safety: a `work_stealer` is used by one thread (one per worker and
//! step); any number of workers, threads or processes may claim concurrently
//! through one store, which must make `add` atomic. Blocking: every claim and
//! `peek` is one store round trip, bounded by `steal_options::timeout`.
//! Errors: plan_error (empty_membership, slice_too_large, bad_rank,
//! bad_steal_request) for bad arguments; plan_fault(bad_counter) for a store
//! counter no valid claim sequence makes; store errors propagate unchanged
//! (e.g. `ebbflow::system_error` with errc::timeout or errc::peer_lost).
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/plan/batch_planner.hpp>
#include <ebbflow/plan/plan_error.hpp>
#include <ebbflow/plan/sampler.hpp>

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace plan {

//! What work stealing needs from a store: an atomic 64-bit fetch-add with a
//! deadline that returns the value after the add (an absent key counts as 0).
//! `elastic::memory_store` and `elastic::store_client` model it (as does every
//! `elastic::kv_store`); plan/ names no elastic/ type.
template <class S>
concept counter_store = requires(S& s, const std::string& key, std::int64_t delta, deadline d) {
  { s.add(key, delta, d) } -> std::convertible_to<std::int64_t>;
};

//! A `counter_store` that can also apply many adds in about one round trip
//! (`add_many(keys, deltas, d)` returns the values after each add, in
//! order); `elastic::store_client` pipelines them, `elastic::memory_store`
//! takes one lock. Thieves then read every slice at once.
template <class S>
concept batch_counter_store = counter_store<S> &&
    requires(S& s, std::span<const std::string> keys, std::span<const std::int64_t> deltas, deadline d) {
  { s.add_many(keys, deltas, d) } -> std::convertible_to<std::vector<std::int64_t>>;
};

//! The largest slice work stealing accepts: each count must fit in 31 bits.
inline constexpr std::uint64_t max_slice_items = (std::uint64_t{1} << 31) - 1;

//! Identifies one step attempt; see the file comment for why both parts.
struct step_id {
  std::uint64_t generation = 0;  //!< membership generation (changes on every rollback)
  std::uint64_t step = 0;        //!< step number within the generation
};

//! The decoded counter of one slice at one moment. Value type.
struct slice_state {
  std::uint64_t size = 0;   //!< b_r, the slice's items
  std::uint64_t front = 0;  //!< F: items the owner has requested (granted: min(F, size − back) once exhausted)
  std::uint64_t back = 0;   //!< K: items thieves have requested
  //! Items not yet claimed by anyone.
  [[nodiscard]] std::uint64_t remaining() const noexcept { return front + back >= size ? 0 : size - front - back; }
  //! True when every item has been claimed.
  [[nodiscard]] bool exhausted() const noexcept { return remaining() == 0; }
};

//! Items [first, last) of rank `rank`'s slice, granted to one claim. Value type.
struct chunk {
  std::size_t rank = 0;     //!< owner rank of the slice the items belong to
  std::uint64_t first = 0;  //!< first item (inclusive), an offset into the slice
  std::uint64_t last = 0;   //!< last item (exclusive)
  bool stolen = false;      //!< true when a thief claimed it from the back
  //! Number of items.
  [[nodiscard]] std::uint64_t size() const noexcept { return last - first; }
  //! True when nothing was granted.
  [[nodiscard]] bool empty() const noexcept { return first == last; }
};

//! Chunk-size policy. Value type.
struct steal_options {
  double first_fraction = 0.25;     //!< the owner's first claim: ceil(first_fraction · b_r); in (0, 1]
  std::uint32_t owner_divisor = 2;  //!< guided owner claims: ceil(unclaimed-by-owner / owner_divisor); >= 1
  std::uint32_t thief_divisor = 2;  //!< a thief claims ceil(victim's remaining / thief_divisor); >= 1
  std::uint64_t min_chunk = 1;      //!< no claim asks for fewer (unless fewer are left); >= 1
  double tail_reserve = 0.03;  //!< then the owner claims all but max(ceil(tail_reserve · b_r), min_chunk) at once (0:
                               //!< guided chunks only); in [0, 1)
  std::chrono::milliseconds timeout{30000};  //!< deadline of each store call
};

//! Checks `o`. @throws plan_error(bad_steal_request) naming the bad field.
EBBFLOW_DECL void validate(const steal_options& o);

//! The owner's next request on a slice of `size` items of which it has
//! requested `front` so far: the first chunk, then all but the tail reserve,
//! then the guided size; at most `cap` but at least min_chunk (min_chunk wins:
//! it is the smallest chunk worth its overhead); the whole rest when less than
//! min_chunk would be left behind and `cap` is short of the rest by less
//! than min_chunk. 0 when front >= size. Pure.
[[nodiscard]] EBBFLOW_DECL std::uint64_t owner_request(const steal_options& o, std::uint64_t size, std::uint64_t front,
                                                 std::uint64_t cap = std::numeric_limits<std::uint64_t>::max());

//! A thief's request on a victim with `remaining` unclaimed items:
//! ceil(remaining / thief_divisor), at most `cap` but at least min_chunk, and
//! at most `remaining`. 0 when remaining == 0. Pure.
[[nodiscard]] EBBFLOW_DECL std::uint64_t thief_request(const steal_options& o, std::uint64_t remaining,
                                                 std::uint64_t cap = std::numeric_limits<std::uint64_t>::max());

//! The most a thief may request in one claim on a slice of `size` items when
//! `slices` workers share the store (keeps K < 2^32; see the file comment).
[[nodiscard]] constexpr std::uint64_t thief_request_limit(std::uint64_t size, std::uint64_t slices) noexcept {
  const std::uint64_t room = (std::uint64_t{1} << 32) - 1 - size;
  return slices == 0 ? room : room / slices;
}

//! A cap for an owner's request that paces it against its planned step time:
//! the items it can still finish by `planned_s` at its observed rate,
//! floor((planned_s − elapsed_s) / s_per_item), at least 1. An owner that runs
//! on plan is not limited; one that has fallen behind (a transient straggler,
//! detected by its own progress) claims little, leaving its tail to thieves.
//! `s_per_item` > 0: seconds per item measured in this step (or the model's
//! estimate before the first chunk). Pure.
[[nodiscard]] EBBFLOW_DECL std::uint64_t paced_owner_cap(double planned_s, double elapsed_s, double s_per_item) noexcept;

//! How many of a victim's `remaining` items a thief should take so that both
//! finish together: the g with overhead_s + g·thief_s = (remaining − g)·victim_s,
//! rounded down; 0 when stealing would not finish earlier than the victim.
//! `victim_s`, `thief_s`: seconds per item (estimates; use the larger of the
//! victim's planned and progress-observed time); `overhead_s`: the thief's
//! cost of one claim plus one extra chunk. Pure.
[[nodiscard]] EBBFLOW_DECL std::uint64_t balanced_steal(std::uint64_t remaining, double victim_s, double thief_s,
                                                  double overhead_s) noexcept;

//! The most a thief should take so that it does not become the new straggler
//! when everyone helps: the items it can finish within the horizon
//! total_remaining / fleet_items_per_s (the time the whole fleet needs for
//! all unclaimed items), floor(horizon / thief_s), at least 1 when anything
//! is left. `total_remaining`: unclaimed items over all slices it read;
//! `fleet_items_per_s`: Σ_j 1 / (seconds per item of worker j); `thief_s`:
//! its own seconds per item. Pure.
[[nodiscard]] EBBFLOW_DECL std::uint64_t fair_steal_cap(std::uint64_t total_remaining, double fleet_items_per_s,
                                                  double thief_s) noexcept;

//! One worker's claims in one step. Not thread-safe (one per worker per step);
//! see the file comment for the protocol, errors and the weight contract.
template <counter_store Store>
class work_stealer {
 public:
  //! Worker `rank` of a step whose slices have `slice_sizes` items (rank
  //! order, as `batch_plan::batch`). Does not touch the store. `store` must
  //! outlive this object.
  //! @throws plan_error: empty_membership (no slices), slice_too_large (a
  //!         slice > max_slice_items), bad_rank (rank >= slices),
  //!         bad_steal_request (bad options).
  work_stealer(Store& store, std::string prefix, step_id id, std::span<const std::size_t> slice_sizes, std::size_t rank,
               steal_options opts = {});
  //! As above with the slices of `plan`.
  work_stealer(Store& store, std::string prefix, step_id id, const batch_plan& plan, std::size_t rank,
               steal_options opts = {})
      : work_stealer(store, std::move(prefix), id, std::span<const std::size_t>(plan.batch), rank, opts) {}

  //! Claims the next chunk of the own slice from the front (`owner_request`
  //! items, at most `cap`). Empty once the own slice is exhausted (by the
  //! owner or by thieves); after that it does not call the store.
  //! @throws plan_error(bad_steal_request) when cap == 0; plan_fault(bad_counter); store errors.
  [[nodiscard]] chunk claim_own(std::uint64_t cap = std::numeric_limits<std::uint64_t>::max());
  //! True once the own slice is known to be exhausted.
  [[nodiscard]] bool own_done() const noexcept { return own_done_; }

  //! Reads slice `r`'s counter (an add of 0; one round trip).
  //! @throws plan_error(bad_rank); plan_fault(bad_counter); store errors.
  [[nodiscard]] slice_state peek(std::size_t r);
  //! Reads every other slice not yet seen exhausted: one batched round trip
  //! when `Store` is a `batch_counter_store`, else one `peek` each. The states
  //! are then in `last_seen`. Returns the number of slices read.
  //! @throws plan_fault(bad_counter); store errors.
  std::size_t peek_others();
  //! Claims up to `request` items from the back of slice `victim` (`victim`
  //! != own rank), clamped to what was last seen remaining and to
  //! `thief_request_limit`. Empty when the slice is (now) exhausted; a slice
  //! seen exhausted is never claimed again.
  //! @throws plan_error(bad_rank | bad_steal_request); plan_fault(bad_counter); store errors.
  [[nodiscard]] chunk steal_from(std::size_t victim, std::uint64_t request);
  //! Peeks every other slice not yet seen exhausted, picks the one with the
  //! most remaining items (lowest rank on ties) and claims `thief_request`
  //! items of it, at most `cap`. Empty when every other slice is exhausted.
  //! Errors as for `steal_from`.
  [[nodiscard]] chunk steal(std::uint64_t cap = std::numeric_limits<std::uint64_t>::max());
  //! `claim_own` until the own slice is exhausted, then `steal`. Empty: this
  //! worker is done with the step. Errors as above.
  [[nodiscard]] chunk next(std::uint64_t cap = std::numeric_limits<std::uint64_t>::max());

  //! The last state seen of slice `r` (from a peek or a claim; zeros before).
  [[nodiscard]] const slice_state& last_seen(std::size_t r) const { return seen_.at(r); }
  //! Items this worker has been granted in this step (own and stolen).
  [[nodiscard]] std::uint64_t processed() const noexcept { return processed_; }
  //! Items this worker has stolen from others.
  [[nodiscard]] std::uint64_t stolen() const noexcept { return stolen_; }
  //! Store round trips made so far (claims and peeks; a batched read counts once).
  [[nodiscard]] std::uint64_t store_calls() const noexcept { return calls_; }
  //! w = processed() / global_batch, the factor for this worker's mean-loss
  //! gradient (see the file comment). @throws plan_error(zero_batch) when global_batch == 0.
  [[nodiscard]] double weight(std::size_t global_batch) const;
  //! The store key of slice `r`'s counter. @throws plan_error(bad_rank).
  [[nodiscard]] std::string key(std::size_t r) const;
  //! Number of slices.
  [[nodiscard]] std::size_t slices() const noexcept { return size_.size(); }
  //! This worker's rank.
  [[nodiscard]] std::size_t rank() const noexcept { return rank_; }
  //! Erases the own slice's counter when `Store` has `erase(key)`; otherwise
  //! does nothing. Call only when no member can claim in this step any more.
  //! Store errors propagate.
  void release();

 private:
  slice_state decode(std::size_t r, std::int64_t after, std::int64_t delta) const;
  Store* store_;
  std::string prefix_;
  steal_options opts_;
  std::size_t rank_;
  std::vector<std::uint64_t> size_;
  std::vector<slice_state> seen_;
  std::vector<char> exhausted_;
  bool own_done_ = false;
  std::uint64_t processed_ = 0, stolen_ = 0, calls_ = 0;
};

//! The smallest chunk whose fixed overhead is at most `share` of its compute:
//! ceil(overhead_s / (share · s_per_item)), at least 1. Use it as
//! `steal_options::min_chunk`. The default share 0.25 balances the two costs
//! of the chunk size at the end of a step: the last chunks leave workers
//! finishing apart by about half a chunk, and halving the smallest chunk adds
//! one more chunk's overhead, so the expected loss is least when a smallest
//! chunk computes for about 4× its overhead. Pure.
[[nodiscard]] EBBFLOW_DECL std::uint64_t recommended_min_chunk(double overhead_s, double s_per_item,
                                                         double share = 0.25) noexcept;

//! The decisions of one worker in one step, free of clocks and stores so that
//! a real worker (`run_stealing_step`) and a simulation make them alike. Knows
//! only what a worker knows: the plan, every member's estimated model (the
//! inputs of the plan), its own measured speed in this step, the time since
//! the step started on its clock, and counters it read. Stragglers are seen
//! only through progress. Times are seconds since the step started; members
//! start a synchronous step together (after the previous allreduce), so one
//! worker's clock approximates the others'. Value type; not thread-safe.
class steal_policy {
 public:
  //! Worker `rank` of `plan`, made from `models` (rank order, the specs the
  //! plan was solved from; only a, comm_s and c are used). `claim_s`: one
  //! store round trip; `chunk_overhead_s`: this worker's cost of one extra chunk.
  //! @throws plan_error(membership_mismatch | bad_rank | bad_cost).
  steal_policy(std::span<const worker_spec> models, const batch_plan& plan, std::size_t rank, double claim_s,
               double chunk_overhead_s);

  //! Records `items` of its own slice processed in `seconds` (the speed it measures).
  void observe_own(std::uint64_t items, double seconds) noexcept;
  //! Its seconds per item: measured in this step when it has processed any, else its model's c.
  [[nodiscard]] double s_per_item() const noexcept;
  //! The cap of its next own claim: `paced_owner_cap(planned step time, elapsed_s, s_per_item())`.
  [[nodiscard]] std::uint64_t own_cap(double elapsed_s) const noexcept;

  //! A steal decision: `items` == 0 means stop stealing in this step.
  struct choice {
    std::size_t victim = 0;   //!< rank of the slice to steal from
    std::uint64_t items = 0;  //!< how many to request
  };
  //! Picks, among the slices in `seen` (index = rank; its own and exhausted ones
  //! are skipped) the victim with the longest estimated time to finish:
  //! remaining × max(planned c_r, (elapsed_s − a_r) / F_r), and requests
  //! min(`balanced_steal`, `fair_steal_cap`) of it.
  [[nodiscard]] choice choose(std::span<const slice_state> seen, double elapsed_s) const;
  //! Slice `r`'s estimated time to finish as `choose` rates it, from state `s`:
  //! remaining × max(c_r, (elapsed_s − a_r) / F_r) (planned c_r while F_r = 0).
  [[nodiscard]] double time_left(std::size_t r, const slice_state& s, double elapsed_s) const noexcept;
  //! An upper bound of `time_left` now for a slice last seen in state `stale`
  //! (its remaining only shrinks and its F only grows): the same formula, with
  //! F_r >= 1 assumed when `stale` shows F_r = 0.
  [[nodiscard]] double time_left_bound(std::size_t r, const slice_state& stale, double elapsed_s) const noexcept;
  //! The steal decision with as few store round trips as possible. With a
  //! `batch_counter_store` it reads every other slice not yet seen exhausted
  //! in one batch (`peek_others`). Otherwise it peeks them one by one in
  //! decreasing order of `time_left_bound` from their last-seen states and
  //! stops once no unread slice can beat the best one read. Then it
  //! `choose`s at `elapsed_s` (unread slices count with their last-seen
  //! states, which can only overstate the work left), so the victim is the
  //! one `choose` would pick after peeking every slice, except on exact ties.
  //! Errors as `work_stealer::peek`.
  template <counter_store Store>
  [[nodiscard]] choice scan(work_stealer<Store>& stealer, double elapsed_s) const;

 private:
  std::vector<double> a_, c_;
  double planned_s_, claim_s_, overhead_s_, fleet_rate_ = 0;
  std::size_t rank_;
  double own_items_ = 0, own_seconds_ = 0;
};

//! What `run_stealing_step` did.
struct steal_report {
  std::uint64_t processed = 0;    //!< items processed (own and stolen): the weight is processed / B
  std::uint64_t stolen = 0;       //!< of which stolen from others
  std::uint64_t chunks = 0;       //!< chunks processed
  std::uint64_t store_calls = 0;  //!< store round trips
  double seconds = 0;             //!< wall time of the step's claim-and-process loop
};

//! Runs one worker's step: claims its own slice paced by `policy`, calls
//! `process(chunk)` for each (which trains on it and blocks until done), then
//! steals as `policy` decides until it says stop. Every item of the own slice
//! is processed here or by a thief. Blocking; uses the steady clock.
//! @throws what `work_stealer` or `process` throw (a throwing `process` leaves
//! claimed items unprocessed: abandon the step attempt).
template <counter_store Store, class Process>
steal_report run_stealing_step(work_stealer<Store>& stealer, steal_policy& policy, Process&& process);
//! As above without a policy (no models to pace with): the own slice in
//! `next()`'s chunks, then the largest tails of the others, unpaced.
template <counter_store Store, class Process>
steal_report run_stealing_step(work_stealer<Store>& stealer, Process&& process);

//! The samples of chunk `c` of the step that `plan` makes from `state`: the
//! positions [first, last) of rank c.rank's slice (`slice_of`).
//! @throws plan_error as `slice_of`, and bad_rank when c lies beyond the slice.
[[nodiscard]] EBBFLOW_DECL sample_range samples_of(const sampler_state& state, const batch_plan& plan, const chunk& c);

}  // namespace plan
EBBFLOW_END_NAMESPACE

#include <ebbflow/plan/impl/work_stealing.hpp>
