// SPDX-License-Identifier: Apache-2.0
//! @file impl/shared_memory.hpp
//! Definitions for comm/shared_memory.hpp: the memfd allocation, the
//! process-wide registry of shared buffers and the cache of peers' mappings.
#pragma once

#include <ebbflow/comm/shared_memory.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <list>
#include <map>
#include <mutex>
#include <random>
#include <limits>
#include <string>
#include <utility>

EBBFLOW_BEGIN_NAMESPACE
namespace comm {
namespace detail {

//! Registered buffers of this process, by start address.
class shared_registry {
 public:
  static shared_registry& instance() {
    static shared_registry r;
    return r;
  }
  void add(const void* p, std::size_t bytes, std::size_t mapped, int fd, std::uint64_t id) {
    std::lock_guard lk(mu_);
    by_addr_[reinterpret_cast<std::uintptr_t>(p)] = entry{bytes, mapped, fd, id};
  }
  void remove(const void* p) noexcept {
    std::lock_guard lk(mu_);
    by_addr_.erase(reinterpret_cast<std::uintptr_t>(p));
  }
  shared_ref find(const void* p, std::size_t bytes) const noexcept {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard lk(mu_);
    auto it = by_addr_.upper_bound(a);
    if (it == by_addr_.begin()) return {};
    --it;
    const std::uintptr_t off = a - it->first;
    if (off > it->second.bytes || bytes > it->second.bytes - off) return {};
    return shared_ref{it->second.fd, 0, it->second.id, off, it->second.mapped};
  }
  //! A process-unique, never reused buffer id (random start: ids of two
  //! processes never need to differ, but a restarted process's should).
  std::uint64_t next_id() noexcept { return base_ + counter_.fetch_add(1, std::memory_order_relaxed); }

 private:
  shared_registry() : base_(std::random_device{}() | (std::uint64_t{std::random_device{}()} << 32)) {}
  struct entry {
    std::size_t bytes, mapped;
    int fd;
    std::uint64_t id;
  };
  mutable std::mutex mu_;
  std::map<std::uintptr_t, entry> by_addr_;
  std::uint64_t base_;
  std::atomic<std::uint64_t> counter_{1};
};

inline shared_ref find_shared(const void* p, std::size_t bytes) noexcept {
  if (p == nullptr) return {};
  return shared_registry::instance().find(p, bytes);
}

//! One peer buffer mapped here; unmapped when the last holder lets go.
struct peer_mapping {
  void* base = MAP_FAILED;
  std::size_t len = 0;
  ~peer_mapping() {
    if (base != MAP_FAILED) ::munmap(base, len);
  }
};

//! Peers' mappings by (pid, buffer id), least recently used last.
class peer_mappings {
 public:
  static peer_mappings& instance() {
    static peer_mappings m;
    return m;
  }
  std::shared_ptr<peer_mapping> get(long pid, const shared_ref& ref) noexcept {
    const key k{pid, ref.id};
    std::lock_guard lk(mu_);
    if (auto it = index_.find(k); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
    auto m = open(pid, ref);
    if (!m) return nullptr;
    lru_.emplace_front(k, m);
    index_[k] = lru_.begin();
    while (lru_.size() > peer_mapping_cache) {  // holders keep evicted mappings alive
      index_.erase(lru_.back().first);
      lru_.pop_back();
    }
    return m;
  }

 private:
  using key = std::pair<long, std::uint64_t>;
  static std::shared_ptr<peer_mapping> open(long pid, const shared_ref& ref) noexcept {
    const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(ref.fd);
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return nullptr;
    struct stat st {};
    // The fd number may have been reused for another file since the peer
    // sent it: insist on a memfd-sized regular file of the advertised size.
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<std::uint64_t>(st.st_size) != ref.size) {
      ::close(fd);
      return nullptr;
    }
    auto m = std::make_shared<peer_mapping>();
    m->len = static_cast<std::size_t>(ref.size);
    m->base = ::mmap(nullptr, m->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (m->base == MAP_FAILED) return nullptr;
    return m;
  }
  std::mutex mu_;
  std::list<std::pair<key, std::shared_ptr<peer_mapping>>> lru_;
  std::map<key, decltype(lru_)::iterator> index_;
};

inline peer_view map_peer(long pid, const shared_ref& ref, std::size_t bytes) noexcept {
  peer_view v;
  if (ref.fd < 0 || ref.offset > ref.size || bytes > ref.size - ref.offset) return v;
  auto m = peer_mappings::instance().get(pid, ref);
  if (!m) return v;
  v.data_ = static_cast<std::byte*>(m->base) + ref.offset;
  v.keep_ = std::move(m);
  return v;
}
}  // namespace detail

inline shared_buffer shared_buffer::allocate(std::size_t bytes) {
  shared_buffer b;
  if (bytes == 0) return b;
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  if (bytes > static_cast<std::size_t>(std::numeric_limits<off_t>::max()) - page)
    EBBFLOW_THROW((system_error(
        std::make_error_code(std::errc::value_too_large),
        {-1, -1, -1, "shared_buffer::allocate", std::to_string(bytes) + " bytes: larger than a file can be"})));
  const std::size_t mapped = (bytes + page - 1) / page * page;
  auto fail = [&](const char* call) {
    const int err = errno;
    b.reset();
    EBBFLOW_THROW((system_error(std::error_code(err, std::system_category()),
                                {-1, -1, -1, "shared_buffer::allocate",
                                 std::string(call) + " failed for " + std::to_string(bytes) + " bytes"})));
  };
  b.fd_ = ::memfd_create("ebbflow-shared", MFD_CLOEXEC);
  if (b.fd_ < 0) fail("memfd_create");
  if (::ftruncate(b.fd_, static_cast<off_t>(mapped)) != 0) fail("ftruncate");
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, b.fd_, 0);
  if (p == MAP_FAILED) fail("mmap");
  b.data_ = p;
  b.size_ = bytes;
  b.mapped_ = mapped;
  detail::shared_registry::instance().add(p, bytes, mapped, b.fd_, detail::shared_registry::instance().next_id());
  return b;
}

inline shared_buffer::shared_buffer(shared_buffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      mapped_(std::exchange(o.mapped_, 0)),
      fd_(std::exchange(o.fd_, -1)) {}

inline shared_buffer& shared_buffer::operator=(shared_buffer&& o) noexcept {
  if (this != &o) {
    reset();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    mapped_ = std::exchange(o.mapped_, 0);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

inline shared_buffer::~shared_buffer() { reset(); }

inline void shared_buffer::reset() noexcept {
  if (data_) {
    detail::shared_registry::instance().remove(data_);
    ::munmap(data_, mapped_);
  }
  if (fd_ >= 0) ::close(fd_);
  data_ = nullptr;
  size_ = mapped_ = 0;
  fd_ = -1;
}

}  // namespace comm
EBBFLOW_END_NAMESPACE
