// SPDX-License-Identifier: Apache-2.0
//! @file impl/sampler.hpp
//! Definitions for plan/sampler.hpp.
#pragma once

#include <ebbflow/core/error.hpp>  // EBBFLOW_EXPECTS
#include <ebbflow/plan/sampler.hpp>

#include <algorithm>
#include <bit>
#include <cstring>

// Compiled into ebbflow::compiled in separate compilation (config.hpp).
#if EBBFLOW_HEADER_ONLY
EBBFLOW_BEGIN_NAMESPACE
namespace plan {
namespace detail {
//! splitmix64's finaliser: a bijective 64-bit mixer with full avalanche.
constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

struct position {
  std::uint64_t epoch;
  std::uint64_t cursor;
};

//! Where a step of `batch` samples starts, under the state's policy.
EBBFLOW_DECL position step_position(const sampler_state& s, std::size_t batch) {
  const std::uint64_t left = s.dataset_size - s.cursor;
  if (s.policy == last_batch::short_batch) {
    EBBFLOW_PLAN_ENFORCE(
        batch <= left, plan_errc::batch_exceeds_epoch,
        "a step of " << batch << " samples does not fit in the " << left << " samples left of epoch " << s.epoch);
    return {s.epoch, s.cursor};
  }
  EBBFLOW_PLAN_ENFORCE(batch <= s.dataset_size, plan_errc::batch_exceeds_epoch,
                       "a step of " << batch << " samples is larger than the data set (" << s.dataset_size << ")");
  if (batch > left) return {s.epoch + 1, 0};  // drop the tail
  return {s.epoch, s.cursor};
}

EBBFLOW_DECL void check_plan(const sampler_state& s, const batch_plan& plan) {
  EBBFLOW_PLAN_ENFORCE(plan.version >= s.plan_version, plan_errc::stale_plan,
                       "plan v" << plan.version << " is older than the committed plan v" << s.plan_version);
  EBBFLOW_PLAN_ENFORCE(plan.offsets.size() == plan.batch.size() + 1 && plan.offsets.back() == plan.global_batch,
                       plan_errc::membership_mismatch,
                       "plan v" << plan.version << " has inconsistent offsets (build plans with solve or make_plan)");
}

EBBFLOW_DECL void put_u64(std::byte* p, std::uint64_t v) noexcept {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}
EBBFLOW_DECL void put_u32(std::byte* p, std::uint32_t v) noexcept {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}
EBBFLOW_DECL std::uint64_t get_u64(const std::byte* p) noexcept {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::uint64_t(std::to_integer<std::uint8_t>(p[i])) << (8 * i);
  return v;
}
EBBFLOW_DECL std::uint32_t get_u32(const std::byte* p) noexcept {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::uint32_t(std::to_integer<std::uint8_t>(p[i])) << (8 * i);
  return v;
}
inline constexpr std::uint32_t sampler_magic = 0x53464245;  // "EBFS" little endian
inline constexpr std::uint32_t sampler_format = 1;
}  // namespace detail

EBBFLOW_DECL epoch_permutation::epoch_permutation(std::uint64_t n, std::uint64_t seed, std::uint64_t epoch) : n_(n) {
  EBBFLOW_PLAN_ENFORCE(n > 0, plan_errc::bad_dataset, "the data set is empty");
  // Smallest h >= 1 with 2^(2h) >= n: the Feistel domain is < 4n, so cycle
  // walking needs fewer than 4 encryptions on average.
  const unsigned bits = n <= 1 ? 1u : static_cast<unsigned>(std::bit_width(n - 1));
  half_bits_ = std::max(1u, (bits + 1) / 2);
  mask_ = half_bits_ >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << half_bits_) - 1;
  const std::uint64_t base = detail::mix64(seed ^ detail::mix64(epoch ^ 0x9e3779b97f4a7c15ULL));
  for (int r = 0; r < rounds; ++r) keys_[r] = detail::mix64(base + 0x9e3779b97f4a7c15ULL * std::uint64_t(r + 1));
}

EBBFLOW_DECL std::uint64_t epoch_permutation::encrypt(std::uint64_t x) const noexcept {
  std::uint64_t left = x >> half_bits_, right = x & mask_;
  for (int r = 0; r < rounds; ++r) {
    const std::uint64_t f = detail::mix64(right ^ keys_[r]) & mask_;
    const std::uint64_t next = left ^ f;
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

EBBFLOW_DECL std::uint64_t epoch_permutation::operator()(std::uint64_t pos) const noexcept {
  // Beyond [0, n) the walk below may never come back (it would spin): a
  // precondition violation ends the program with a message instead.
  EBBFLOW_EXPECTS(pos < n_);
  std::uint64_t y = encrypt(pos);
  while (y >= n_) y = encrypt(y);  // cycle walking: stays a bijection of [0, n)
  return y;
}

EBBFLOW_DECL std::array<std::byte, sampler_state::encoded_size> sampler_state::encode() const noexcept {
  std::array<std::byte, encoded_size> out{};
  std::byte* p = out.data();
  detail::put_u32(p, detail::sampler_magic);
  detail::put_u32(p + 4, detail::sampler_format);
  detail::put_u64(p + 8, dataset_size);
  detail::put_u64(p + 16, seed);
  detail::put_u64(p + 24, epoch);
  detail::put_u64(p + 32, cursor);
  detail::put_u64(p + 40, plan_version);
  detail::put_u32(p + 48, static_cast<std::uint32_t>(policy));
  return out;
}

EBBFLOW_DECL sampler_state sampler_state::decode(std::span<const std::byte> bytes) {
  EBBFLOW_PLAN_VERIFY(bytes.size() == encoded_size, plan_errc::bad_state,
                       "sampler state of " << bytes.size() << " bytes, expected " << encoded_size);
  const std::byte* p = bytes.data();
  EBBFLOW_PLAN_VERIFY(detail::get_u32(p) == detail::sampler_magic, plan_errc::bad_state, "bad magic");
  EBBFLOW_PLAN_VERIFY(detail::get_u32(p + 4) == detail::sampler_format, plan_errc::bad_state,
                       "format version " << detail::get_u32(p + 4) << ", expected " << detail::sampler_format);
  sampler_state s;
  s.dataset_size = detail::get_u64(p + 8);
  s.seed = detail::get_u64(p + 16);
  s.epoch = detail::get_u64(p + 24);
  s.cursor = detail::get_u64(p + 32);
  s.plan_version = detail::get_u64(p + 40);
  const std::uint32_t pol = detail::get_u32(p + 48);
  EBBFLOW_PLAN_VERIFY(pol <= 1, plan_errc::bad_state, "unknown last_batch policy " << pol);
  s.policy = static_cast<last_batch>(pol);
  EBBFLOW_PLAN_VERIFY(s.dataset_size > 0, plan_errc::bad_state, "data-set size 0");
  EBBFLOW_PLAN_VERIFY(s.cursor < s.dataset_size, plan_errc::bad_state,
                       "cursor " << s.cursor << " not below the data-set size " << s.dataset_size);
  return s;
}

EBBFLOW_DECL sample_range slice_of(const sampler_state& state, const batch_plan& plan, std::size_t rank) {
  detail::check_plan(state, plan);
  EBBFLOW_PLAN_ENFORCE(rank < plan.size(), plan_errc::bad_rank,
                       "rank " << rank << " outside plan v" << plan.version << " of " << plan.size() << " workers");
  const detail::position at = detail::step_position(state, plan.global_batch);
  return sample_range{epoch_permutation(state.dataset_size, state.seed, at.epoch), at.epoch,
                      at.cursor + plan.offsets[rank], at.cursor + plan.offsets[rank + 1]};
}

EBBFLOW_DECL epoch_sampler::epoch_sampler(std::uint64_t dataset_size, std::uint64_t seed, last_batch policy) {
  EBBFLOW_PLAN_ENFORCE(dataset_size > 0, plan_errc::bad_dataset, "the data set is empty");
  s_.dataset_size = dataset_size;
  s_.seed = seed;
  s_.policy = policy;
}

EBBFLOW_DECL epoch_sampler::epoch_sampler(const sampler_state& state) : s_(state) {
  EBBFLOW_PLAN_VERIFY(s_.dataset_size > 0, plan_errc::bad_state, "data-set size 0");
  EBBFLOW_PLAN_VERIFY(s_.cursor < s_.dataset_size, plan_errc::bad_state,
                       "cursor " << s_.cursor << " not below the data-set size " << s_.dataset_size);
  EBBFLOW_PLAN_VERIFY(s_.policy == last_batch::short_batch || s_.policy == last_batch::drop, plan_errc::bad_state,
                       "unknown last_batch policy");
}

EBBFLOW_DECL std::size_t epoch_sampler::step_size(std::size_t nominal_batch) const noexcept {
  const std::uint64_t cap = s_.policy == last_batch::short_batch ? remaining() : s_.dataset_size;
  return static_cast<std::size_t>(std::min<std::uint64_t>(nominal_batch, cap));
}

EBBFLOW_DECL sample_range epoch_sampler::step(const batch_plan& plan) const {
  detail::check_plan(s_, plan);
  const detail::position at = detail::step_position(s_, plan.global_batch);
  return sample_range{epoch_permutation(s_.dataset_size, s_.seed, at.epoch), at.epoch, at.cursor,
                      at.cursor + plan.global_batch};
}

EBBFLOW_DECL void epoch_sampler::commit(const batch_plan& plan) {
  detail::check_plan(s_, plan);
  const detail::position at = detail::step_position(s_, plan.global_batch);
  s_.epoch = at.epoch;
  s_.cursor = at.cursor + plan.global_batch;
  s_.plan_version = plan.version;
  if (s_.cursor == s_.dataset_size) {
    ++s_.epoch;
    s_.cursor = 0;
  }
}

}  // namespace plan
EBBFLOW_END_NAMESPACE
#endif  // EBBFLOW_HEADER_ONLY
