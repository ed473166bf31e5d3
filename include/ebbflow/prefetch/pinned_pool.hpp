// SPDX-License-Identifier: Apache-2.0
//! @file pinned_pool.hpp
//! `pinned_pool`: one page-locked host region of a fixed size, allocated once
//! at construction and carved into leases of any size. The pool never grows:
//! a request that does not fit waits until earlier leases come back (or its
//! deadline passes); a request larger than the whole pool is rejected at once.
//! This is the bound DALI's growing pools lack.
//!
//! How the region is page-locked is chosen by a `host_allocator`:
//! * `mlock_allocator()` (default, this header, no CUDA needed): page-aligned
//!   host memory locked with `mlock(2)`. When locking is not permitted (e.g.
//!   `RLIMIT_MEMLOCK` too low without `CAP_IPC_LOCK`) the memory stays
//!   pageable, the pool still works, `stats().locked` is false and
//!   `stats().lock_status` says why; a warning is logged once.
//! * `prefetch::cuda_host_allocator()` (prefetch/cuda_stage.hpp, CUDA
//!   runtime): `cudaHostAlloc`, which CUDA can DMA from asynchronously.
//!
//! Thread safety: every member function may be called from any thread.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/core/log.hpp>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>

EBBFLOW_BEGIN_NAMESPACE
namespace prefetch {

//! How a pool obtains and frees its one region. Plain function pointers: the
//! choice is made at run time (CUDA present or not) and happens once per pool.
struct host_allocator {
  //! Returns `bytes` of host memory (or nullptr). Sets `locked` when the
  //! memory is page-locked and otherwise writes the reason to `status`.
  void* (*allocate)(std::size_t bytes, bool& locked, std::string& status) = nullptr;
  //! Frees what `allocate` returned. Must not throw.
  void (*deallocate)(void* p, std::size_t bytes) noexcept = nullptr;
  //! Short name for logs and statistics ("mlock", "cudaHostAlloc", ...).
  const char* name = "";
};

//! Page-aligned host memory, locked with `mlock` when permitted (see file doc).
[[nodiscard]] host_allocator mlock_allocator() noexcept;
//! Plain pageable host memory, never locked (for comparisons and tests).
[[nodiscard]] host_allocator pageable_allocator() noexcept;

//! A snapshot of a pool's counters.
struct pool_stats {
  std::size_t capacity = 0;      //!< bytes of the region (fixed for the pool's life)
  std::size_t in_use = 0;        //!< bytes currently leased
  std::size_t peak = 0;          //!< largest `in_use` ever observed
  std::size_t leases = 0;        //!< leases currently outstanding
  std::size_t allocations = 0;   //!< regions allocated (1 for the pool's life: it never grows)
  bool locked = false;           //!< the region is page-locked
  std::string allocator = {};    //!< allocator name
  std::string lock_status = {};  //!< why the region is not locked (empty when it is)
};

class pinned_pool;

//! A leased range of a pool's region (host memory, page-locked when the pool
//! is). Move-only; gives its bytes back on destruction or `reset()`.
//! Not thread-safe itself; the pool it returns to is.
class pinned_lease {
 public:
  pinned_lease() noexcept = default;
  //! Takes over `o`'s bytes; `o` becomes empty.
  pinned_lease(pinned_lease&& o) noexcept
      : pool_(std::exchange(o.pool_, nullptr)), offset_(o.offset_), bytes_(o.bytes_), data_(o.data_) {}
  //! Gives this lease's bytes back, then takes over `o`'s; `o` becomes empty.
  pinned_lease& operator=(pinned_lease&& o) noexcept {
    if (this != &o) {
      reset();
      pool_ = std::exchange(o.pool_, nullptr);
      offset_ = o.offset_;
      bytes_ = o.bytes_;
      data_ = o.data_;
    }
    return *this;
  }
  pinned_lease(const pinned_lease&) = delete;
  pinned_lease& operator=(const pinned_lease&) = delete;
  ~pinned_lease() { reset(); }

  //! The leased bytes (host memory).
  [[nodiscard]] std::span<std::byte> bytes() const noexcept { return {data_, bytes_}; }
  //! Leased bytes: the request rounded up to `pinned_pool::alignment`.
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }
  //! True while the lease holds bytes of a pool (also for a 0-byte lease);
  //! false when default-constructed, moved from or reset.
  explicit operator bool() const noexcept { return pool_ != nullptr; }
  //! Gives the bytes back to the pool now.
  void reset() noexcept;

 private:
  friend class pinned_pool;
  pinned_lease(pinned_pool* p, std::size_t off, std::size_t n, std::byte* d) noexcept
      : pool_(p), offset_(off), bytes_(n), data_(d) {}
  pinned_pool* pool_ = nullptr;
  std::size_t offset_ = 0;
  std::size_t bytes_ = 0;
  std::byte* data_ = nullptr;
};

//! A fixed-size page-locked region carved into leases (first fit, coalescing).
//! Leases are aligned to `alignment` (256 bytes, enough for any CUDA copy).
//! The pool must outlive its leases.
class pinned_pool {
 public:
  static constexpr std::size_t alignment = 256;  //!< lease alignment and size granule, bytes

  //! Allocates the whole region (`capacity` bytes, rounded up to `alignment`)
  //! once. @throws std::invalid_argument when capacity is 0;
  //! std::bad_alloc when the allocator returns nothing.
  explicit pinned_pool(std::size_t capacity, host_allocator alloc = mlock_allocator());
  pinned_pool(const pinned_pool&) = delete;
  pinned_pool& operator=(const pinned_pool&) = delete;
  ~pinned_pool();

  //! A lease of `bytes` (rounded up to `alignment`), or nothing when no free
  //! range is large enough now. Non-blocking. A request of 0 bytes gives an
  //! empty but valid lease. @throws std::invalid_argument when `bytes`
  //! exceeds the capacity (it could never be satisfied).
  [[nodiscard]] std::optional<pinned_lease> try_acquire(std::size_t bytes);
  //! Blocks until `bytes` fit or `until` passes.
  //! @throws system_error(errc::timeout) at the deadline, system_error(errc::cancelled)
  //! after `cancel()`, std::invalid_argument as `try_acquire`.
  [[nodiscard]] pinned_lease acquire(std::size_t bytes, deadline until);
  //! Wakes every blocked `acquire` with `errc::cancelled`; later calls fail the same way.
  void cancel() noexcept;

  //! Bytes of the region (the requested capacity rounded up to `alignment`).
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  //! Region start (host memory) — for registering the region with other APIs.
  [[nodiscard]] std::byte* data() const noexcept { return base_; }
  //! A consistent snapshot of the counters (takes the pool's lock briefly).
  [[nodiscard]] pool_stats stats() const;
  //! Called after every release (outside the pool's lock), e.g. to wake a
  //! scheduler that waits for space. Set before leases are taken.
  void on_release(void (*fn)(void*) noexcept, void* ctx) noexcept {
    on_release_ = fn;
    on_release_ctx_ = ctx;
  }

 private:
  friend class pinned_lease;
  void release(std::size_t offset, std::size_t bytes) noexcept;
  std::optional<pinned_lease> try_acquire_locked(std::size_t bytes);

  host_allocator alloc_;
  std::size_t capacity_ = 0;
  std::byte* base_ = nullptr;
  bool locked_ = false;
  std::string lock_status_;
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::map<std::size_t, std::size_t> free_;  // offset -> length, disjoint, coalesced
  std::size_t in_use_ = 0, peak_ = 0, leases_ = 0;
  bool cancelled_ = false;
  void (*on_release_)(void*) noexcept = nullptr;
  void* on_release_ctx_ = nullptr;
};

}  // namespace prefetch
EBBFLOW_END_NAMESPACE

#include <ebbflow/prefetch/impl/pinned_pool.hpp>
