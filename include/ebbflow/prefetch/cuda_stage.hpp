// SPDX-License-Identifier: Apache-2.0
//! @file cuda_stage.hpp
//! The CUDA device stage and pinned allocator for the prefetcher. Uses the
//! CUDA runtime API only (no kernels), so it compiles with a host compiler as
//! well as nvcc.
//!
//! Opt-in: this header is not included by prefetcher.hpp. Including it means
//! the program must link the CUDA runtime (CMake: `ebbflow::cuda`). Without
//! the CUDA headers on the include path, or with `EBBFLOW_NO_CUDA` defined
//! (`EBBFLOW_HAS_CUDA` is 0), it declares nothing, and a use of `cuda_stage`
//! fails to compile as an unknown name. It is not an `#error`, because the
//! umbrella `<ebbflow/ebbflow.hpp>`, the single-include header and the
//! header self-containment tests include it in builds without CUDA.
//!
//! * `cuda_host_allocator()`: staging memory from `cudaHostAlloc` (portable,
//!   page-locked), so host-to-device copies are truly asynchronous.
//! * `cuda_stage`: per local device, one dedicated non-blocking copy stream;
//!   per ring slot and device, one device buffer and two events. `copy` enqueues
//!   `cudaMemcpyAsync` on the copy stream and records the slot's *ready*
//!   event; the consumer makes its compute stream wait on that event
//!   (`batch.event(d).wait(stream)`, no host synchronisation). When the batch
//!   is released, a *consumed* event is recorded on the stream the consumer
//!   waited with (the legacy default stream if it never did), and the next
//!   copy into that buffer waits for it on the copy stream, so the prefetcher
//!   never overwrites a buffer that queued kernels still read. Only the
//!   prefetcher's copy thread ever blocks on an event (`finish`), to know when
//!   the staging bytes may be reused.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/core/log.hpp>
#include <ebbflow/core/memory.hpp>
#include <ebbflow/prefetch/device_stage.hpp>
#include <ebbflow/prefetch/pinned_pool.hpp>

#if EBBFLOW_HAS_CUDA
#include <cuda_runtime_api.h>

#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace prefetch {
namespace detail {
inline void cuda_check(cudaError_t e, const char* op) {
  if (e != cudaSuccess)
    EBBFLOW_THROW((system_error(std::error_code(static_cast<int>(e), cuda_category()),
                                {.operation = op, .detail = cudaGetErrorString(e)})));
}
inline void* cuda_host_allocate(std::size_t bytes, bool& locked, std::string& status) {
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (e == cudaSuccess) {
    locked = true;
    return p;
  }
  (void)cudaGetLastError();
  status = std::string("cudaHostAlloc failed: ") + cudaGetErrorString(e);
  locked = false;
  return nullptr;
}
inline void cuda_host_deallocate(void* p, std::size_t) noexcept {
  if (cudaFreeHost(p) != cudaSuccess) EBBFLOW_LOG_ERROR("prefetch: cudaFreeHost failed");
}
//! Restores the current device on scope exit.
class device_guard {
 public:
  explicit device_guard(int dev) {
    cuda_check(cudaGetDevice(&old_), "cudaGetDevice");
    cuda_check(cudaSetDevice(dev), "cudaSetDevice");
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;
  ~device_guard() { (void)cudaSetDevice(old_); }

 private:
  int old_ = 0;
};
}  // namespace detail

//! True when the CUDA runtime sees at least one device. Never throws.
[[nodiscard]] inline bool cuda_device_present() noexcept {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  if (!ok) (void)cudaGetLastError();
  return ok;
}

//! Staging memory from `cudaHostAlloc(cudaHostAllocPortable)`.
[[nodiscard]] inline host_allocator cuda_host_allocator() noexcept {
  return {&detail::cuda_host_allocate, &detail::cuda_host_deallocate, "cudaHostAlloc"};
}

class cuda_stage;

//! Readiness of one device sub-batch. Cheap to copy; valid while the batch is held.
class cuda_ready_event {
 public:
  //! Makes `stream` (on this device) wait for the copy, without blocking the
  //! host, and remembers `stream` as the one that consumes the buffer.
  //! @throws system_error (cuda category).
  void wait(cudaStream_t stream) const;
  //! Non-blocking: true when the copy has finished.
  [[nodiscard]] bool ready() const { return cudaEventQuery(event_) == cudaSuccess; }
  //! Blocks the host until the copy has finished. @throws system_error.
  void synchronize() const { detail::cuda_check(cudaEventSynchronize(event_), "cudaEventSynchronize"); }
  //! The underlying CUDA event (owned by the stage; do not destroy or re-record it).
  [[nodiscard]] cudaEvent_t get() const noexcept { return event_; }

 private:
  friend class cuda_stage;
  cuda_ready_event(cuda_stage* s, std::size_t slot, std::size_t d, cudaEvent_t e) noexcept
      : stage_(s), slot_(slot), dev_(d), event_(e) {}
  cuda_stage* stage_;
  std::size_t slot_, dev_;
  cudaEvent_t event_;
};

//! CUDA device stage over the local devices `device_ids` (device d of a plan's
//! split is `device_ids[d]`). Memory space: device. Move-only.
class cuda_stage {
 public:
  static constexpr memory_space space = memory_space::device;  //!< buffers are `cudaMalloc` device memory
  using event_type = cuda_ready_event;                         //!< per-buffer copy completion

  //! @throws std::invalid_argument for an empty list.
  explicit cuda_stage(std::vector<int> device_ids) : ids_(std::move(device_ids)) {
    EBBFLOW_ENFORCE(!ids_.empty(), "cuda_stage: need at least one device");
  }
  //! Takes over `o`'s streams, buffers and events; `o` is left with no devices.
  cuda_stage(cuda_stage&& o) noexcept { swap(o); }
  //! Frees this stage's CUDA resources (after synchronising its copy streams), then takes over `o`'s.
  cuda_stage& operator=(cuda_stage&& o) noexcept {
    cuda_stage t(std::move(o));
    swap(t);
    return *this;
  }
  cuda_stage(const cuda_stage&) = delete;
  cuda_stage& operator=(const cuda_stage&) = delete;
  ~cuda_stage() { destroy(); }

  //! cudaHostAlloc when a device is present, else mlock'ed host memory.
  static host_allocator preferred_allocator() noexcept {
    return cuda_device_present() ? cuda_host_allocator() : mlock_allocator();
  }

  //! @throws system_error when allocation fails (e.g. no device).
  void prepare(std::size_t slots, std::size_t capacity) {
    EBBFLOW_ENFORCE(streams_.empty(), "cuda_stage: prepare() called twice");
    slots_ = slots;
    capacity_ = capacity;
    streams_.assign(ids_.size(), nullptr);
    per_.assign(slots * ids_.size(), {});
    for (std::size_t d = 0; d < ids_.size(); ++d) {
      detail::device_guard g(ids_[d]);
      detail::cuda_check(cudaStreamCreateWithFlags(&streams_[d], cudaStreamNonBlocking), "cudaStreamCreate");
      for (std::size_t s = 0; s < slots; ++s) {
        auto& p = at(s, d);
        detail::cuda_check(cudaMalloc(&p.d_buf, capacity > 0 ? capacity : 1), "cudaMalloc");
        detail::cuda_check(cudaEventCreateWithFlags(&p.ready, cudaEventDisableTiming), "cudaEventCreate");
        detail::cuda_check(cudaEventCreateWithFlags(&p.consumed, cudaEventDisableTiming), "cudaEventCreate");
      }
    }
  }
  [[nodiscard]] std::size_t devices() const noexcept { return ids_.size(); }  //!< number of local devices
  //! Device memory of (`slot`, `d`) on device `device_id(d)`, `capacity`
  //! bytes; valid after `prepare` for the stage's lifetime. Indices are not checked.
  [[nodiscard]] std::byte* buffer(std::size_t slot, std::size_t d) const noexcept {
    return static_cast<std::byte*>(per_[slot * ids_.size() + d].d_buf);
  }
  //! Copy thread: enqueue the H2D copy after the previous consumer finished.
  void copy(std::size_t slot, std::size_t d, std::span<const std::byte> src) {
    auto& p = at(slot, d);
    detail::device_guard g(ids_[d]);
    if (p.consumed_pending) {
      detail::cuda_check(cudaStreamWaitEvent(streams_[d], p.consumed, 0), "cudaStreamWaitEvent");
      p.consumed_pending = false;
    }
    if (!src.empty())
      detail::cuda_check(cudaMemcpyAsync(p.d_buf, src.data(), src.size(), cudaMemcpyHostToDevice, streams_[d]),
                         "cudaMemcpyAsync");
    detail::cuda_check(cudaEventRecord(p.ready, streams_[d]), "cudaEventRecord");
  }
  //! Copy thread: wait until the slot's copies have read their staging bytes.
  void finish(std::size_t slot) {
    for (std::size_t d = 0; d < ids_.size(); ++d)
      detail::cuda_check(cudaEventSynchronize(at(slot, d).ready), "cudaEventSynchronize");
  }
  //! The ready event of (`slot`, `d`), recorded by the last `copy`. Never blocks.
  [[nodiscard]] event_type event(std::size_t slot, std::size_t d) noexcept {
    return cuda_ready_event(this, slot, d, at(slot, d).ready);
  }
  //! Consumer thread: mark the end of the consumer's use of the slot's buffers.
  void consumed(std::size_t slot) {
    for (std::size_t d = 0; d < ids_.size(); ++d) {
      auto& p = at(slot, d);
      detail::device_guard g(ids_[d]);
      detail::cuda_check(cudaEventRecord(p.consumed, p.consumer), "cudaEventRecord");
      p.consumed_pending = true;
      p.consumer = nullptr;
    }
  }
  //! Device bytes allocated by `prepare`.
  [[nodiscard]] std::size_t bytes() const noexcept { return per_.size() * capacity_; }
  //! The copy stream of device `d`.
  [[nodiscard]] cudaStream_t copy_stream(std::size_t d) const noexcept { return streams_[d]; }
  //! The CUDA device ordinal of local device `d`.
  [[nodiscard]] int device_id(std::size_t d) const noexcept { return ids_[d]; }

 private:
  friend class cuda_ready_event;
  struct per_buffer {
    void* d_buf = nullptr;
    cudaEvent_t ready = nullptr, consumed = nullptr;
    cudaStream_t consumer = nullptr;  // stream given to wait(); nullptr: legacy default stream
    bool consumed_pending = false;
  };
  per_buffer& at(std::size_t slot, std::size_t d) noexcept { return per_[slot * ids_.size() + d]; }
  void swap(cuda_stage& o) noexcept {
    std::swap(ids_, o.ids_);
    std::swap(slots_, o.slots_);
    std::swap(capacity_, o.capacity_);
    std::swap(streams_, o.streams_);
    std::swap(per_, o.per_);
  }
  void destroy() noexcept {
    for (std::size_t d = 0; d < streams_.size(); ++d) {
      if (cudaSetDevice(ids_[d]) != cudaSuccess) continue;
      if (streams_[d]) (void)cudaStreamSynchronize(streams_[d]);
      for (std::size_t s = 0; s < slots_; ++s) {
        auto& p = at(s, d);
        if (p.d_buf) (void)cudaFree(p.d_buf);
        if (p.ready) (void)cudaEventDestroy(p.ready);
        if (p.consumed) (void)cudaEventDestroy(p.consumed);
      }
      if (streams_[d]) (void)cudaStreamDestroy(streams_[d]);
    }
    streams_.clear();
    per_.clear();
  }

  std::vector<int> ids_;
  std::size_t slots_ = 0, capacity_ = 0;
  std::vector<cudaStream_t> streams_;
  std::vector<per_buffer> per_;
};
static_assert(device_stage<cuda_stage>);

inline void cuda_ready_event::wait(cudaStream_t stream) const {
  detail::device_guard g(stage_->ids_[dev_]);
  detail::cuda_check(cudaStreamWaitEvent(stream, event_, 0), "cudaStreamWaitEvent");
  stage_->at(slot_, dev_).consumer = stream;
}

}  // namespace prefetch
EBBFLOW_END_NAMESPACE

#endif  // EBBFLOW_HAS_CUDA
