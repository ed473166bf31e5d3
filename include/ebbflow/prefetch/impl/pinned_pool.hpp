// SPDX-License-Identifier: Apache-2.0
//! @file impl/pinned_pool.hpp
//! Definitions for prefetch/pinned_pool.hpp.
#pragma once

#include <ebbflow/prefetch/pinned_pool.hpp>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>
#include <sstream>

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

EBBFLOW_BEGIN_NAMESPACE
namespace prefetch {
namespace detail {

inline std::size_t page_size() noexcept {
  const long p = ::sysconf(_SC_PAGESIZE);
  return p > 0 ? static_cast<std::size_t>(p) : 4096;
}
inline std::size_t round_up(std::size_t n, std::size_t a) noexcept { return (n + a - 1) / a * a; }

inline void* page_alloc(std::size_t bytes) noexcept {
  const std::size_t pg = page_size();
  void* p = std::aligned_alloc(pg, round_up(bytes, pg));
  // Touch every page now, so the pool's whole footprint is resident from the
  // start and steady-state memory does not creep up as ranges get used.
  if (p) std::memset(p, 0, round_up(bytes, pg));
  return p;
}

inline void* mlock_allocate(std::size_t bytes, bool& locked, std::string& status) {
  void* p = page_alloc(bytes);
  if (!p) return nullptr;
  if (::mlock(p, round_up(bytes, page_size())) == 0) {
    locked = true;
    return p;
  }
  const int err = errno;
  std::ostringstream os;
  os << "mlock of " << bytes << " bytes failed: " << std::strerror(err);
  if (err == ENOMEM || err == EPERM) {
    rlimit rl{};
    if (::getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
      os << " (RLIMIT_MEMLOCK soft limit ";
      if (rl.rlim_cur == RLIM_INFINITY)
        os << "unlimited";
      else
        os << rl.rlim_cur << " bytes";
      os << "; raise it with `ulimit -l` or grant CAP_IPC_LOCK)";
    }
  }
  os << "; the buffers stay pageable";
  status = os.str();
  locked = false;
  return p;
}
inline void mlock_deallocate(void* p, std::size_t bytes) noexcept {
  ::munlock(p, round_up(bytes, page_size()));  // harmless when it was never locked
  std::free(p);
}
inline void* pageable_allocate(std::size_t bytes, bool& locked, std::string& status) {
  locked = false;
  status = "pageable allocator: not locked by request";
  return page_alloc(bytes);
}
inline void pageable_deallocate(void* p, std::size_t) noexcept { std::free(p); }

}  // namespace detail

inline host_allocator mlock_allocator() noexcept {
  return {&detail::mlock_allocate, &detail::mlock_deallocate, "mlock"};
}
inline host_allocator pageable_allocator() noexcept {
  return {&detail::pageable_allocate, &detail::pageable_deallocate, "pageable"};
}

inline void pinned_lease::reset() noexcept {
  if (pool_) std::exchange(pool_, nullptr)->release(offset_, bytes_);
  bytes_ = 0;
  data_ = nullptr;
}

inline pinned_pool::pinned_pool(std::size_t capacity, host_allocator alloc)
    : alloc_(alloc), capacity_(detail::round_up(capacity, alignment)) {
  EBBFLOW_ENFORCE(capacity > 0, "pinned_pool: capacity must be positive");
  EBBFLOW_ENFORCE(alloc_.allocate && alloc_.deallocate, "pinned_pool: allocator without functions");
  void* p = alloc_.allocate(capacity_, locked_, lock_status_);
  if (!p) EBBFLOW_THROW(std::bad_alloc());
  base_ = static_cast<std::byte*>(p);
  free_.emplace(0, capacity_);
  if (!locked_) EBBFLOW_LOG_WARN("prefetch::pinned_pool (" << alloc_.name << "): " << lock_status_);
}

inline pinned_pool::~pinned_pool() {
  {
    std::lock_guard lk(m_);
    if (leases_ != 0) EBBFLOW_LOG_ERROR("prefetch::pinned_pool destroyed with " << leases_ << " leases outstanding");
  }
  alloc_.deallocate(base_, capacity_);
}

inline std::optional<pinned_lease> pinned_pool::try_acquire_locked(std::size_t bytes) {
  if (bytes == 0) {
    ++leases_;
    return pinned_lease(this, 0, 0, base_);
  }
  const std::size_t need = detail::round_up(bytes, alignment);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const std::size_t off = it->first, len = it->second;
    free_.erase(it);
    if (len > need) free_.emplace(off + need, len - need);
    in_use_ += need;
    if (in_use_ > peak_) peak_ = in_use_;
    ++leases_;
    return pinned_lease(this, off, need, base_ + off);
  }
  return std::nullopt;
}

inline std::optional<pinned_lease> pinned_pool::try_acquire(std::size_t bytes) {
  EBBFLOW_ENFORCE(bytes <= capacity_, "pinned_pool: request of "
                                          << bytes << " bytes exceeds the pool's fixed capacity of " << capacity_
                                          << " bytes");
  std::lock_guard lk(m_);
  return try_acquire_locked(bytes);
}

inline pinned_lease pinned_pool::acquire(std::size_t bytes, deadline until) {
  EBBFLOW_ENFORCE(bytes <= capacity_, "pinned_pool: request of "
                                          << bytes << " bytes exceeds the pool's fixed capacity of " << capacity_
                                          << " bytes");
  std::unique_lock lk(m_);
  for (;;) {
    if (cancelled_)
      EBBFLOW_THROW((system_error(make_error_code(error::cancelled), {.operation = "pinned_pool::acquire"})));
    if (auto l = try_acquire_locked(bytes)) return std::move(*l);
    if (cv_.wait_until(lk, until.at()) == std::cv_status::timeout && until.expired()) {
      if (auto l = try_acquire_locked(bytes)) return std::move(*l);
      EBBFLOW_THROW((system_error(make_error_code(error::timeout),
                                  {.operation = "pinned_pool::acquire", .detail = std::to_string(bytes) + " bytes"})));
    }
  }
}

inline void pinned_pool::cancel() noexcept {
  {
    std::lock_guard lk(m_);
    cancelled_ = true;
  }
  cv_.notify_all();
}

inline void pinned_pool::release(std::size_t offset, std::size_t bytes) noexcept {
  {
    std::lock_guard lk(m_);
    --leases_;
    if (bytes != 0) {
      in_use_ -= bytes;
      auto it = free_.emplace(offset, bytes).first;
      // Coalesce with the following and the preceding free range.
      if (auto nx = std::next(it); nx != free_.end() && it->first + it->second == nx->first) {
        it->second += nx->second;
        free_.erase(nx);
      }
      if (it != free_.begin()) {
        auto pv = std::prev(it);
        if (pv->first + pv->second == it->first) {
          pv->second += it->second;
          free_.erase(it);
        }
      }
    }
  }
  cv_.notify_all();
  if (on_release_) on_release_(on_release_ctx_);
}

inline pool_stats pinned_pool::stats() const {
  std::lock_guard lk(m_);
  return {.capacity = capacity_,
          .in_use = in_use_,
          .peak = peak_,
          .leases = leases_,
          .allocations = 1,
          .locked = locked_,
          .allocator = alloc_.name,
          .lock_status = lock_status_};
}

}  // namespace prefetch
EBBFLOW_END_NAMESPACE
