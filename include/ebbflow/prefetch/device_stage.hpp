// SPDX-License-Identifier: Apache-2.0
//! @file device_stage.hpp
//! The `device_stage` concept: how the prefetcher moves a loaded sub-batch
//! from its page-locked staging bytes to a device, and `cpu_stage`, the model
//! used on the CPU executor (a copy thread into "device" host buffers, so the
//! whole pipeline runs in tests without a GPU). `cuda_stage`
//! (prefetch/cuda_stage.hpp) is the CUDA model: asynchronous copies on one
//! dedicated stream per device, completion signalled by events.
//!
//! Contract (the prefetcher calls these; users rarely do):
//! * `prepare(slots, capacity)` once, before anything else: allocate, for
//!   each of `slots` ring slots and each device, a buffer of `capacity` bytes
//!   in `S::space` memory. Never called again: stage memory never grows.
//! * `devices()` the number of local devices; `buffer(slot, d)` the buffer.
//! * `copy(slot, d, src)`: start copying host bytes `src` (page-locked) into
//!   `buffer(slot, d)`; may return before the copy ended. Called on the
//!   prefetcher's copy thread only. Before overwriting the buffer the stage
//!   must respect `consumed(slot)` (work the consumer queued on the previous
//!   contents must have finished reading them).
//! * `finish(slot)`: block the copy thread until every copy of `slot` has
//!   finished reading its `src` (the staging bytes are then reused).
//! * `event(slot, d)`: a readiness event of type `S::event_type` that the
//!   consumer waits on (on its stream for CUDA) before using the buffer.
//! * `consumed(slot)`: the consumer released the batch in `slot`; called on
//!   the consumer's thread.
//! Errors: members may throw; the prefetcher reports a throwing `copy` or
//! `finish` at the step it belongs to.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/core/memory.hpp>

#include <concepts>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace prefetch {

template <class S>
concept device_stage = requires(S& s, std::size_t slot, std::size_t dev, std::span<const std::byte> src) {
  { S::space } -> std::convertible_to<memory_space>;
  typename S::event_type;
  s.prepare(slot, dev);
  { s.devices() } -> std::convertible_to<std::size_t>;
  { s.buffer(slot, dev) } -> std::same_as<std::byte*>;
  s.copy(slot, dev, src);
  s.finish(slot);
  { s.event(slot, dev) } -> std::same_as<typename S::event_type>;
  s.consumed(slot);
};

//! Readiness of a CPU-stage buffer: the copy thread finished the copy before
//! the batch was handed out, so it is always ready.
struct host_event {
  [[nodiscard]] constexpr bool ready() const noexcept { return true; }  //!< always true
  constexpr void wait() const noexcept {}                               //!< returns at once
};

//! The CPU executor's device stage: `devices` host buffers per slot, filled by
//! `memcpy` on the prefetcher's copy thread. Memory space: host.
//! Not thread-safe on its own; the prefetcher serialises access per slot.
class cpu_stage {
 public:
  static constexpr memory_space space = memory_space::host;  //!< stage buffers are ordinary host memory
  using event_type = host_event;                             //!< always-ready event

  //! @throws std::invalid_argument when devices is 0.
  explicit cpu_stage(std::size_t devices = 1) : devices_(devices) {
    EBBFLOW_ENFORCE(devices > 0, "cpu_stage: need at least one device");
  }

  //! Allocates and zero-fills `slots` × `devices()` host buffers of `capacity`
  //! bytes (at least 1). @throws std::invalid_argument when called twice,
  //! std::bad_alloc.
  void prepare(std::size_t slots, std::size_t capacity) {
    EBBFLOW_ENFORCE(buffers_.empty(), "cpu_stage: prepare() called twice");
    capacity_ = capacity;
    buffers_.reserve(slots * devices_);
    for (std::size_t i = 0; i < slots * devices_; ++i) {
      // Allocated once and touched, so they are resident from the start.
      auto p = std::unique_ptr<std::byte[]>(new std::byte[capacity > 0 ? capacity : 1]);
      std::memset(p.get(), 0, capacity > 0 ? capacity : 1);
      buffers_.push_back(std::move(p));
    }
  }
  [[nodiscard]] std::size_t devices() const noexcept { return devices_; }  //!< as constructed
  //! Host buffer of (`slot`, `d`), `capacity` bytes; valid after `prepare`
  //! for the stage's lifetime. Indices are not checked.
  [[nodiscard]] std::byte* buffer(std::size_t slot, std::size_t d) const noexcept {
    return buffers_[slot * devices_ + d].get();
  }
  //! Copies host bytes `src` (at most `capacity`) into `buffer(slot, d)`;
  //! synchronous, so the buffer is ready when it returns.
  void copy(std::size_t slot, std::size_t d, std::span<const std::byte> src) {
    EBBFLOW_EXPECTS(src.size() <= capacity_);
    if (!src.empty()) std::memcpy(buffer(slot, d), src.data(), src.size());
  }
  void finish(std::size_t) noexcept {}  //!< no-op: `copy` already finished
  //! An always-ready event (the copy finished inside `copy`).
  [[nodiscard]] event_type event(std::size_t, std::size_t) const noexcept { return {}; }
  void consumed(std::size_t) noexcept {}  //!< no-op: nothing reads the buffer asynchronously
  //! Bytes of stage memory allocated by `prepare`.
  [[nodiscard]] std::size_t bytes() const noexcept { return buffers_.size() * capacity_; }

 private:
  std::size_t devices_;
  std::size_t capacity_ = 0;
  std::vector<std::unique_ptr<std::byte[]>> buffers_;
};
static_assert(device_stage<cpu_stage>);

}  // namespace prefetch
EBBFLOW_END_NAMESPACE
