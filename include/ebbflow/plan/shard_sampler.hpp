// SPDX-License-Identifier: Apache-2.0
//! @file shard_sampler.hpp
//! Exactly-once sampling of a data set partitioned into shards across nodes.
//!
//! The data set is shards 0..S-1 of the given sizes; shard j holds the global
//! indices [start_j, start_j + size_j). Each shard is owned by one member and
//! only its owner reads it. Within an epoch each shard is visited in its own
//! keyed pseudo-random order (`epoch_permutation` of (seed, epoch, j)), and a
//! per-shard cursor counts what committed steps consumed.
//!
//! Ownership (`rebalance`, deterministic): at the start of an epoch every
//! shard is assigned, largest first, to the member whose share of the samples
//! so far is furthest below its plan weight b_r / B, so that fast workers get
//! more data and pools run dry at about the same time. On a membership change
//! mid-epoch, survivors keep their shards (locality) and only shards whose
//! owner left, or whose owner's plan gives it b_r = 0, go with their cursors
//! to members with b_r > 0 the same way. A joiner gets shards from the next
//! epoch on (it trains on b_r = 0 samples until then, or re-plan it with
//! min/max 0).
//!
//! A step: rank r takes up to b_r samples from its own unfinished shards in
//! shard order. Near the end of an epoch a pool can hold fewer than b_r, so the
//! step's real sizes are `actual(plan)` (use its weights for the gradients).
//! `commit` advances the cursors; a rolled-back step does not. Every sample is
//! read exactly once per epoch, by the owner of its shard at that time.
//!
//! Thread safety: a value type; const members may run concurrently.
//! Errors: plan_error (bad_dataset, bad_rank, stale_plan, membership_mismatch).
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/plan/batch_planner.hpp>
#include <ebbflow/plan/plan_error.hpp>
#include <ebbflow/plan/sampler.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace plan {

//! Positions [first, last) of shard `shard`'s order in one epoch.
struct shard_range {
  std::uint64_t shard = 0;  //!< shard index j
  std::uint64_t first = 0;  //!< first position in the shard's order (inclusive)
  std::uint64_t last = 0;   //!< last position (exclusive)
};

//! Exactly-once sampler over a sharded data set. Value type.
class shard_sampler {
 public:
  //! @throws plan_error(bad_dataset) when there are no shards or one is empty.
  shard_sampler(std::vector<std::uint64_t> shard_sizes, std::uint64_t seed)
      : sizes_(std::move(shard_sizes)), seed_(seed) {
    EBBFLOW_PLAN_ENFORCE(!sizes_.empty(), plan_errc::bad_dataset, "no shards");
    starts_.resize(sizes_.size());
    std::uint64_t at = 0;
    for (std::size_t j = 0; j < sizes_.size(); ++j) {
      EBBFLOW_PLAN_ENFORCE(sizes_[j] > 0, plan_errc::bad_dataset, "shard " << j << " is empty");
      EBBFLOW_PLAN_ENFORCE(sizes_[j] <= std::numeric_limits<std::uint64_t>::max() - at, plan_errc::bad_dataset,
                           "shard sizes sum past 2^64 at shard " << j);
      starts_[j] = at;
      at += sizes_[j];
    }
    cursor_.assign(sizes_.size(), 0);
    owner_.assign(sizes_.size(), unowned);
  }

  //! Owner id of a shard that no member owns yet (so not a valid worker id:
  //! a plan that uses it is a plan_error(membership_mismatch)).
  static constexpr std::uint64_t unowned = std::numeric_limits<std::uint64_t>::max();

  //! The current epoch (starts at 0).
  [[nodiscard]] std::uint64_t epoch() const noexcept { return epoch_; }
  //! Owner id of each shard (`unowned` before the first rebalance of an epoch).
  [[nodiscard]] const std::vector<std::uint64_t>& owners() const noexcept { return owner_; }
  //! Consumed positions of each shard in this epoch.
  [[nodiscard]] const std::vector<std::uint64_t>& cursors() const noexcept { return cursor_; }

  //! Assigns shards to the plan's members (see the file comment). Call it
  //! whenever the membership changes; `slice` and `commit` call it themselves
  //! when they find shards without a live owner. O(S·n).
  void rebalance(const batch_plan& plan) {
    EBBFLOW_PLAN_ENFORCE(plan.size() > 0 && plan.global_batch > 0, plan_errc::empty_membership, "empty plan");
    const std::size_t n = plan.size();
    for (std::uint64_t id : plan.worker_ids)  // the id that marks a shard without an owner
      EBBFLOW_PLAN_ENFORCE(id != unowned, plan_errc::membership_mismatch,
                           "worker id " << id << " is reserved (shard_sampler::unowned)");
    std::vector<double> held(n, 0);  // samples left in shards each member keeps
    std::vector<std::size_t> orphan;
    for (std::size_t j = 0; j < sizes_.size(); ++j) {
      if (cursor_[j] == sizes_[j]) continue;
      const std::size_t r = keeper(plan, j);
      if (r < n)
        held[r] += static_cast<double>(sizes_[j] - cursor_[j]);
      else
        orphan.push_back(j);
    }
    std::stable_sort(orphan.begin(), orphan.end(),
                     [&](std::size_t x, std::size_t y) { return sizes_[x] - cursor_[x] > sizes_[y] - cursor_[y]; });
    double total = 0;
    for (double h : held) total += h;
    for (std::size_t j : orphan) total += static_cast<double>(sizes_[j] - cursor_[j]);
    for (std::size_t j : orphan) {
      std::size_t best = 0;
      double best_gap = -std::numeric_limits<double>::infinity();
      for (std::size_t r = 0; r < n; ++r) {
        if (plan.batch[r] == 0) continue;  // global_batch > 0: some member takes samples
        const double gap = plan.weight(r) * total - held[r];
        if (gap > best_gap) {
          best_gap = gap;
          best = r;
        }
      }
      owner_[j] = plan.worker_ids[best];
      held[best] += static_cast<double>(sizes_[j] - cursor_[j]);
    }
  }

  //! The shard ranges rank `rank` reads in the next step under `plan`.
  //! @throws plan_error(bad_rank | stale_plan)
  [[nodiscard]] std::vector<shard_range> slice(const batch_plan& plan, std::size_t rank) const {
    shard_sampler s = *this;  // keep const: ownership repair happens on a copy
    s.prepare(plan);
    EBBFLOW_PLAN_ENFORCE(rank < plan.size(), plan_errc::bad_rank,
                         "rank " << rank << " outside plan v" << plan.version << " of " << plan.size() << " workers");
    return s.take(plan.worker_ids[rank], plan.batch[rank]);
  }

  //! The data-set index at position `pos` of shard `shard` in this epoch.
  //! @throws plan_error(bad_rank) when `shard` or `pos` is out of range.
  [[nodiscard]] std::uint64_t index(std::uint64_t shard, std::uint64_t pos) const {
    EBBFLOW_PLAN_ENFORCE(
        shard < sizes_.size() && pos < sizes_[shard], plan_errc::bad_rank,
        "position " << pos << " of shard " << shard << " outside the data set (" << sizes_.size() << " shards"
                    << (shard < sizes_.size() ? ", this one of " + std::to_string(sizes_[shard]) : std::string())
                    << ")");
    return starts_[shard] + epoch_permutation(sizes_[shard], seed_ ^ (shard * 0x9e3779b97f4a7c15ULL), epoch_)(pos);
  }

  //! The sizes each rank really gets in the next step (b_r, or less where its
  //! pool runs dry), as a plan with the same version: use its weights.
  [[nodiscard]] batch_plan actual(const batch_plan& plan) const {
    shard_sampler s = *this;
    s.prepare(plan);
    batch_plan out = plan;
    out.offsets.assign(plan.size() + 1, 0);
    for (std::size_t r = 0; r < plan.size(); ++r) {
      std::uint64_t got = 0;
      for (const shard_range& x : s.take(plan.worker_ids[r], plan.batch[r])) got += x.last - x.first;
      out.batch[r] = static_cast<std::size_t>(got);
      out.offsets[r + 1] = out.offsets[r] + out.batch[r];
    }
    out.global_batch = out.offsets.back();
    return out;
  }

  //! Commits the step made under `plan`. @throws plan_error(stale_plan)
  void commit(const batch_plan& plan) {
    prepare(plan);
    for (std::size_t r = 0; r < plan.size(); ++r)
      for (const shard_range& x : take(plan.worker_ids[r], plan.batch[r])) cursor_[x.shard] = x.last;
    plan_version_ = plan.version;
    if (std::equal(cursor_.begin(), cursor_.end(), sizes_.begin())) {  // epoch done
      ++epoch_;
      std::fill(cursor_.begin(), cursor_.end(), 0);
      std::fill(owner_.begin(), owner_.end(), unowned);
    }
  }

 private:
  // The rank under `plan` that keeps shard j, or plan.size() when the shard
  // is an orphan: its owner left, or takes no samples in this plan (b_r = 0:
  // its pool would never be read and the epoch never end).
  std::size_t keeper(const batch_plan& plan, std::size_t j) const {
    const std::size_t r = owner_[j] == unowned ? plan.size() : plan.rank_of(owner_[j]);
    return r < plan.size() && plan.batch[r] > 0 ? r : plan.size();
  }

  void prepare(const batch_plan& plan) {
    EBBFLOW_PLAN_ENFORCE(plan.version >= plan_version_, plan_errc::stale_plan,
                         "plan v" << plan.version << " is older than the committed plan v" << plan_version_);
    for (std::size_t j = 0; j < sizes_.size(); ++j) {
      if (cursor_[j] == sizes_[j]) continue;
      if (keeper(plan, j) == plan.size()) {
        rebalance(plan);
        return;
      }
    }
  }

  std::vector<shard_range> take(std::uint64_t id, std::size_t want) const {
    std::vector<shard_range> out;
    for (std::size_t j = 0; j < sizes_.size() && want > 0; ++j) {
      if (owner_[j] != id || cursor_[j] == sizes_[j]) continue;
      const std::uint64_t n = std::min<std::uint64_t>(want, sizes_[j] - cursor_[j]);
      out.push_back({j, cursor_[j], cursor_[j] + n});
      want -= static_cast<std::size_t>(n);
    }
    return out;
  }

  std::vector<std::uint64_t> sizes_, starts_, cursor_, owner_;
  std::uint64_t seed_;
  std::uint64_t epoch_ = 0;
  std::uint64_t plan_version_ = 0;
};

}  // namespace plan
EBBFLOW_END_NAMESPACE
