// SPDX-License-Identifier: Apache-2.0
//! @file shared_memory.hpp
//! Host buffers that processes on the same host can map: allocate the
//! buffers you pass to collectives here and an intra-host allreduce reads
//! and writes peers' memory directly, with no copy through the kernel.
//!
//! Why: without it, ranks on one host read each other's buffers with Linux
//! CMA (`process_vm_readv`), as Open MPI's vader does. CMA copies through
//! the kernel and pins pages on every call, so the allreduce of a buffer
//! costs one extra pass over memory and the pinning. A `shared_buffer` is a
//! `memfd` mapped `MAP_SHARED`; a peer maps it once (through
//! `/proc/<pid>/fd/<fd>`, the same permission check as CMA) and then reduces
//! straight out of it. This is the host-memory counterpart of NCCL's user
//! buffer registration (`ncclMemAlloc` + `ncclCommRegister`) and of
//! `MPI_Win_allocate_shared`.
//!
//! Use:
//! @code
//! auto grads = ebbflow::comm::shared_buffer::allocate(n * sizeof(float));
//! std::span<float> g = grads.as<float>();  // fill it, then
//! comm.allreduce(ebbflow::buffer_view{g.data(), g.size(), ebbflow::dtype::f32}, ebbflow::reduce_op::sum);
//! @endcode
//!
//! Collectives find out by themselves: every `shared_buffer` is entered in a
//! process-wide registry, and the single-copy allreduce looks its input and
//! output up there (any sub-range of a buffer counts). Peers whose buffers
//! are registered and mappable are read directly; any other peer, as before,
//! through CMA. Nothing else changes: the same phases, deadlines and
//! peer-failure detection, and the same bitwise result. A peer that dies
//! cannot fault a reader: the reader's mapping keeps the memory alive.
//!
//! Cost: mapping a peer's buffer is a syscall pair on its first use; mappings
//! are cached per (peer process, buffer) and released when the cache holds
//! more than `peer_mapping_cache` of them (least recently used first) or the
//! process exits. Keep gradient buffers for the whole run, as with NCCL.
//!
//! Thread safety: allocation, destruction and lookups may run on any thread.
//! Errors: `allocate` throws `ebbflow::system_error` with the errno of the
//! failing call (memfd_create, ftruncate or mmap) and the size.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/error.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

EBBFLOW_BEGIN_NAMESPACE
namespace comm {

//! How many peer mappings a process keeps before unmapping the least
//! recently used one.
inline constexpr std::size_t peer_mapping_cache = 64;

//! Page-aligned host memory in a `memfd`, mappable by peers on this host.
//! Move-only RAII: the destructor unregisters and unmaps it. Zero-filled.
class shared_buffer {
 public:
  //! An empty buffer (no memory).
  shared_buffer() noexcept = default;
  //! Allocates `bytes` (rounded up to whole pages; 0 gives an empty buffer).
  //! @throws ebbflow::system_error (errno of memfd_create/ftruncate/mmap, naming the size).
  [[nodiscard]] static shared_buffer allocate(std::size_t bytes);
  //! Takes over the source, which becomes empty.
  shared_buffer(shared_buffer&& o) noexcept;
  //! Releases this buffer's memory and takes over the source's.
  shared_buffer& operator=(shared_buffer&& o) noexcept;
  shared_buffer(const shared_buffer&) = delete;
  shared_buffer& operator=(const shared_buffer&) = delete;
  ~shared_buffer();

  //! Start of the memory (null when empty).
  [[nodiscard]] void* data() const noexcept { return data_; }
  //! Bytes usable (as requested).
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  //! The memory as `size() / sizeof(T)` elements of T.
  template <class T>
  [[nodiscard]] std::span<T> as() const noexcept {
    return {static_cast<T*>(data_), size_ / sizeof(T)};
  }
  //! True when the buffer holds memory.
  explicit operator bool() const noexcept { return data_ != nullptr; }

 private:
  void reset() noexcept;
  void* data_ = nullptr;
  std::size_t size_ = 0, mapped_ = 0;
  int fd_ = -1;
};

namespace detail {
//! Where a registered range lives, as a peer needs it to map it.
struct shared_ref {
  std::int32_t fd = -1;        //!< the owner's memfd (-1: not registered)
  std::uint32_t reserved = 0;  //!< zero (no padding: the record travels as bytes)
  std::uint64_t id = 0;        //!< unique per buffer and process (fd numbers are reused)
  std::uint64_t offset = 0;    //!< of the range within the buffer
  std::uint64_t size = 0;      //!< of the whole buffer (mapped length)
};
//! The registration of [p, p + bytes), if one `shared_buffer` holds all of it.
[[nodiscard]] inline shared_ref find_shared(const void* p, std::size_t bytes) noexcept;
//! One peer buffer mapped into this process (defined in impl/).
struct peer_mapping;
//! A read-write pointer to `bytes` at `ref.offset` in process `pid`'s buffer
//! `ref`, mapped on first use and cached; null when it cannot be mapped (no
//! permission, the buffer is gone, a size mismatch). The mapping stays valid
//! while the returned handle lives.
class peer_view {
 public:
  peer_view() = default;
  //! The mapped range (null when not mapped).
  [[nodiscard]] std::byte* data() const noexcept { return data_; }
  //! True when mapped.
  explicit operator bool() const noexcept { return data_ != nullptr; }

 private:
  friend peer_view map_peer(long pid, const shared_ref& ref, std::size_t bytes) noexcept;
  std::shared_ptr<peer_mapping> keep_;
  std::byte* data_ = nullptr;
};
[[nodiscard]] inline peer_view map_peer(long pid, const shared_ref& ref, std::size_t bytes) noexcept;
}  // namespace detail

}  // namespace comm
EBBFLOW_END_NAMESPACE

#include <ebbflow/comm/impl/shared_memory.hpp>
