// SPDX-License-Identifier: Apache-2.0
//! @file sampler.hpp
//! Exactly-once epoch sampler.
//!
//! Epoch e visits the data set [0, N) in the order pos -> order(pos), where
//! `order` is a keyed pseudo-random bijection of [0, N) derived from (seed, e)
//! (a 6-round Feistel network on the smallest even-bit power of two >= N,
//! cycle-walked into [0, N)); nothing of size N is ever materialised.
//!
//! A cursor counts the positions of the current epoch already consumed by
//! *committed* steps. A step under plan p takes the B = p.global_batch
//! positions [cursor, cursor + B); rank r gets the contiguous part
//! [cursor + p.offsets[r], cursor + p.offsets[r+1]) of it (prefix sums of
//! b_i in rank order). Every worker's indices are therefore a pure function
//! of (N, seed, epoch, cursor, policy) and the plan (`slice_of`): no worker
//! communicates to learn its indices. `commit(p)` advances the cursor by B; a
//! step that is rolled back simply is not committed, and its samples are
//! served again to whichever plan the redone step uses. Because each committed
//! step consumes the next B positions whatever the plan, the number of workers
//! or their split, every sample is consumed exactly once per epoch across
//! re-plans, joins, leaves, failures and changes of B.
//!
//! End of an epoch (`last_batch`):
//! * `short_batch`: the final step of an epoch may be shorter than the nominal
//!   batch. `step_size(B)` says how large it may be; pass a plan for that size
//!   (e.g. `plan::solve(models, sampler.step_size(B))`). Every sample is seen
//!   exactly once per epoch.
//! * `drop`: a step whose plan does not fit in what is left of the epoch
//!   starts the next epoch instead; the unvisited tail (< B samples, a
//!   different random subset every epoch) is skipped. Every sample is seen at
//!   most once per epoch, and all but the tail exactly once.
//!
//! Asynchronous extensions (out of scope here): the state already separates
//! what is committed (epoch, cursor) from who takes which part (the plan), so
//! an asynchronous mode can hand out position ranges per worker from the same
//! permutation.
//!
//! Thread safety: `epoch_sampler` is a value type with no internal
//! synchronisation; const members may be called concurrently.
//! Errors: plan_error (bad_dataset, bad_rank, batch_exceeds_epoch,
//! stale_plan); plan_fault(bad_state) for a state that no sampler holds.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/plan/batch_planner.hpp>
#include <ebbflow/plan/plan_error.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <span>

EBBFLOW_BEGIN_NAMESPACE
namespace plan {

//! A keyed pseudo-random bijection of [0, n): the visiting order of one epoch.
//! Value type; O(1) memory; each call costs a few hash rounds (expected < 4
//! Feistel evaluations from cycle walking).
class epoch_permutation {
 public:
  static constexpr int rounds = 6;  //!< Feistel rounds per evaluation

  //! @throws plan_error(bad_dataset) when n == 0.
  epoch_permutation(std::uint64_t n, std::uint64_t seed, std::uint64_t epoch);

  //! Number of elements n.
  [[nodiscard]] std::uint64_t size() const noexcept { return n_; }
  //! The data-set index visited at position `pos` (< size()).
  [[nodiscard]] std::uint64_t operator()(std::uint64_t pos) const noexcept;

 private:
  [[nodiscard]] std::uint64_t encrypt(std::uint64_t x) const noexcept;
  std::uint64_t n_;
  unsigned half_bits_;
  std::uint64_t mask_;
  std::array<std::uint64_t, rounds> keys_;
};

//! The samples of one worker in one step: positions [first, last) of the
//! epoch order. `indices()` is a view of the data-set indices.
struct sample_range {
  epoch_permutation order;  //!< the epoch's visiting order
  std::uint64_t epoch = 0;  //!< epoch these positions belong to
  std::uint64_t first = 0;  //!< first position (inclusive)
  std::uint64_t last = 0;   //!< last position (exclusive)

  [[nodiscard]] std::uint64_t size() const noexcept { return last - first; }  //!< number of samples
  [[nodiscard]] bool empty() const noexcept { return first == last; }         //!< true when size() == 0
  //! The i-th data-set index of this range (i < size()).
  [[nodiscard]] std::uint64_t operator[](std::uint64_t i) const noexcept { return order(first + i); }
  //! A view over the data-set indices, in order.
  [[nodiscard]] auto indices() const { return std::views::iota(first, last) | std::views::transform(order); }
};

//! What happens at the end of an epoch; see the file comment.
enum class last_batch : std::uint32_t { short_batch = 0, drop = 1 };

//! Everything a joiner needs to continue the sampling: a small POD.
struct sampler_state {
  std::uint64_t dataset_size = 0;               //!< N
  std::uint64_t seed = 0;                       //!< key of every epoch's permutation
  std::uint64_t epoch = 0;                      //!< current epoch
  std::uint64_t cursor = 0;                     //!< positions of `epoch` consumed by committed steps
  std::uint64_t plan_version = 0;               //!< version of the plan of the last committed step
  last_batch policy = last_batch::short_batch;  //!< end-of-epoch behaviour

  //! Bytes of `encode()`: magic, format version, five u64, policy; little endian.
  static constexpr std::size_t encoded_size = 4 + 4 + 5 * 8 + 4;
  //! The state as `encoded_size` bytes, for `decode` on another worker.
  [[nodiscard]] std::array<std::byte, encoded_size> encode() const noexcept;
  //! @throws plan_fault(bad_state) for a wrong size, magic, format version or
  //!         policy, N == 0, or cursor > N.
  [[nodiscard]] static sampler_state decode(std::span<const std::byte> bytes);

  //! Member-wise equality.
  friend bool operator==(const sampler_state&, const sampler_state&) = default;
};

//! The samples of `rank` in the next step under `plan`, computed from the
//! state alone (what every worker does; `epoch_sampler::slice` calls this).
//! @throws plan_error(bad_rank | batch_exceeds_epoch | stale_plan)
[[nodiscard]] EBBFLOW_DECL sample_range slice_of(const sampler_state& state, const batch_plan& plan, std::size_t rank);

//! Exactly-once sampler over one data set. Value type.
class epoch_sampler {
 public:
  //! @throws plan_error(bad_dataset) when dataset_size == 0.
  epoch_sampler(std::uint64_t dataset_size, std::uint64_t seed, last_batch policy = last_batch::short_batch);
  //! Resumes from a state (e.g. received by a joiner).
  //! @throws plan_fault(bad_state) for N == 0, cursor >= N or an unknown policy.
  explicit epoch_sampler(const sampler_state& state);

  //! The committed state (what a joiner needs; see `sampler_state::encode`).
  [[nodiscard]] const sampler_state& state() const noexcept { return s_; }
  [[nodiscard]] std::uint64_t epoch() const noexcept { return s_.epoch; }  //!< current epoch
  //! Positions of the current epoch consumed by committed steps.
  [[nodiscard]] std::uint64_t cursor() const noexcept { return s_.cursor; }
  [[nodiscard]] std::uint64_t dataset_size() const noexcept { return s_.dataset_size; }  //!< N
  //! Positions of the current epoch not yet consumed.
  [[nodiscard]] std::uint64_t remaining() const noexcept { return s_.dataset_size - s_.cursor; }

  //! The global batch the next step will have when the nominal batch is B:
  //! min(B, remaining()) under short_batch, min(B, N) under drop.
  [[nodiscard]] std::size_t step_size(std::size_t nominal_batch) const noexcept;

  //! Rank `rank`'s samples of the next step under `plan`. Pure (does not advance).
  [[nodiscard]] sample_range slice(const batch_plan& plan, std::size_t rank) const { return slice_of(s_, plan, rank); }
  //! All samples of the next step under `plan` (every rank's slice, in rank order).
  [[nodiscard]] sample_range step(const batch_plan& plan) const;

  //! Commits the step made under `plan`: the cursor advances by its global
  //! batch, and the epoch ends when it is used up (see last_batch).
  //! @throws plan_error(batch_exceeds_epoch | stale_plan); the state is unchanged then.
  void commit(const batch_plan& plan);

 private:
  sampler_state s_;
};

}  // namespace plan
EBBFLOW_END_NAMESPACE

#include <ebbflow/plan/impl/sampler.hpp>
