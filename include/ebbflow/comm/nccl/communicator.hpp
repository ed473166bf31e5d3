// SPDX-License-Identifier: Apache-2.0
//! @file communicator.hpp
//! Elastic NCCL communicator for device buffers.
//!
//! * Non-blocking initialisation (`ncclConfig_t::blocking = 0`) from a fresh
//!   unique id per generation (the elastic layer publishes it in the store),
//!   polled until ready or the deadline passes.
//! * Every collective is enqueued on a user stream and then polled through
//!   `cudaStreamQuery` and `ncclCommGetAsyncError` with a deadline: a peer that
//!   died yields `errc::peer_lost` (ncclRemoteError) and a stuck one
//!   `errc::timeout`, never a hang. After an error the communicator is revoked
//!   (`ncclCommRevoke`) so in-flight work stops, and is aborted on destruction.
//! * `shrink()` builds the next generation without the lost or leaving ranks
//!   (`ncclCommShrink`, NCCL 2.27+), with `NCCL_SHRINK_ABORT` after an error.
//!
//! Requires the CUDA runtime and NCCL headers and linking `ebbflow::nccl`.
//! Thread safety: one thread drives a communicator at a time.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/core/dtype.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/core/log.hpp>
#include <ebbflow/core/memory.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < NCCL_VERSION(2, 27, 0)
#error "ebbflow's NCCL communicator needs NCCL 2.27 or newer (ncclCommShrink, ncclCommRevoke)"
#endif

EBBFLOW_BEGIN_NAMESPACE
namespace comm::nccl {

//! The 128-byte NCCL unique id, as bytes for the rendezvous store.
using unique_id_bytes = std::array<std::byte, sizeof(ncclUniqueId)>;

//! A fresh unique id (call on one rank per generation, then publish).
//! @throws system_error (nccl category) when NCCL cannot create one (e.g. no network interface).
inline unique_id_bytes make_unique_id() {
  ncclUniqueId id;
  if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
    throw_if(std::error_code(r, nccl_category()), {.operation = "ncclGetUniqueId"});
  unique_id_bytes out;
  std::memcpy(out.data(), &id, sizeof id);
  return out;
}

//! NCCL's element type for an ebbflow dtype.
constexpr ncclDataType_t to_nccl(dtype t) noexcept {
  switch (t) {
    case dtype::f32:
      return ncclFloat32;
    case dtype::f64:
      return ncclFloat64;
    case dtype::f16:
      return ncclFloat16;
    case dtype::bf16:
      return ncclBfloat16;
    case dtype::i32:
      return ncclInt32;
    case dtype::i64:
      return ncclInt64;
    case dtype::u8:
      return ncclUint8;
  }
  return ncclFloat32;
}
//! NCCL's reduction for an ebbflow reduce_op.
constexpr ncclRedOp_t to_nccl(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum:
      return ncclSum;
    case reduce_op::avg:
      return ncclAvg;
    case reduce_op::min:
      return ncclMin;
    case reduce_op::max:
      return ncclMax;
    case reduce_op::prod:
      return ncclProd;
  }
  return ncclSum;
}

//! Options of an NCCL communicator.
struct options {
  std::chrono::milliseconds init_timeout{60'000};  //!< deadline for non-blocking init / shrink
  std::chrono::microseconds poll_interval{50};     //!< sleep between progress polls
};

//! An NCCL communicator of one generation. Move-only; destroys itself when
//! healthy and aborts after a failure.
class communicator {
 public:
  communicator() = default;

  //! Joins generation `generation` as `rank` of `size`, from the id that rank 0
  //! published. The current CUDA device must be set by the caller.
  //! @throws system_error (timeout, or the NCCL error) naming rank and generation.
  static communicator init(int rank, int size, std::int64_t generation, const unique_id_bytes& id, options opts = {}) {
    EBBFLOW_ENFORCE(size > 0 && rank >= 0 && rank < size,
                    "nccl::communicator::init: rank " << rank << " outside [0, " << size << ")");
    communicator c;
    c.rank_ = rank;
    c.size_ = size;
    c.generation_ = generation;
    c.opts_ = opts;
    ncclUniqueId uid;
    std::memcpy(&uid, id.data(), sizeof uid);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&c.comm_, size, uid, rank, &cfg);
    std::error_code ec;
    if (r != ncclSuccess && r != ncclInProgress) ec = std::error_code(r, nccl_category());
    if (!ec) c.wait_ready(deadline::after(opts.init_timeout), ec);
    c.check(ec, "nccl init");
    return c;
  }

  //! Takes over `o`'s NCCL communicator; `o` is left empty (`valid()` false).
  communicator(communicator&& o) noexcept { swap(o); }
  //! Closes the held communicator (destroy, or abort after a failure), then takes over `o`'s.
  communicator& operator=(communicator&& o) noexcept {
    communicator tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;
  ~communicator() { close(); }

  [[nodiscard]] int rank() const noexcept { return rank_; }  //!< this rank in the generation; -1 when empty
  [[nodiscard]] int size() const noexcept { return size_; }  //!< number of ranks; 0 when empty
  //! The generation this communicator belongs to; -1 when empty.
  [[nodiscard]] std::int64_t generation() const noexcept { return generation_; }
  //! True when an NCCL communicator is held (false when default-constructed or moved from).
  [[nodiscard]] bool valid() const noexcept { return comm_ != nullptr; }
  //! True after an operation failed; the communicator must then be shrunk or replaced.
  [[nodiscard]] bool failed() const noexcept { return failed_; }
  //! The underlying `ncclComm_t` (still owned by this object; nullptr when empty).
  [[nodiscard]] ncclComm_t native_handle() const noexcept { return comm_; }

  //! Sums (or `op`) `count` elements of `type` from device memory `d_send` into
  //! `d_recv` (may alias) over all ranks; enqueued on `stream`, then waited for
  //! until `d`. @throws system_error: peer_lost, timeout or the NCCL error.
  void allreduce(const void* d_send, void* d_recv, std::size_t count, dtype type, reduce_op op, cudaStream_t stream,
                 deadline d) {
    run("allreduce", count, type, stream, d,
        [&] { return ncclAllReduce(d_send, d_recv, count, to_nccl(type), to_nccl(op), comm_, stream); });
  }
  //! Broadcasts `count` elements from `root`'s `d_buf` to every rank's `d_buf`.
  void broadcast(void* d_buf, std::size_t count, dtype type, int root, cudaStream_t stream, deadline d) {
    EBBFLOW_ENFORCE(root >= 0 && root < size_, "nccl broadcast: root " << root << " outside [0, " << size_ << ")");
    run("broadcast", count, type, stream, d,
        [&] { return ncclBroadcast(d_buf, d_buf, count, to_nccl(type), root, comm_, stream); });
  }
  //! Gathers `count` elements from every rank into `d_recv` (size × count), rank order.
  void allgather(const void* d_send, void* d_recv, std::size_t count, dtype type, cudaStream_t stream, deadline d) {
    run("allgather", count, type, stream, d,
        [&] { return ncclAllGather(d_send, d_recv, count, to_nccl(type), comm_, stream); });
  }
  //! Reduces size × `count` elements and leaves block `rank` (count elements) in `d_recv`.
  void reduce_scatter(const void* d_send, void* d_recv, std::size_t count, dtype type, reduce_op op,
                      cudaStream_t stream, deadline d) {
    run("reduce_scatter", count, type, stream, d,
        [&] { return ncclReduceScatter(d_send, d_recv, count, to_nccl(type), to_nccl(op), comm_, stream); });
  }

  //! Stops all in-flight operations (`ncclCommRevoke`); later operations fail
  //! with `errc::revoked` until the communicator is shrunk. Safe to call after a failure.
  void revoke() noexcept {
    if (!comm_ || revoked_) return;
    revoked_ = true;
    failed_ = true;
    if (ncclResult_t r = ncclCommRevoke(comm_, NCCL_REVOKE_DEFAULT); r != ncclSuccess && r != ncclInProgress)
      EBBFLOW_LOG_WARN("ncclCommRevoke failed: " << ncclGetErrorString(r) << " [rank " << rank_ << ", generation "
                                                 << generation_ << "]");
  }

  //! The communicator of generation `next_generation` without the ranks in
  //! `exclude` (old ranks; the survivors keep their relative order). After a
  //! failure or revoke NCCL_SHRINK_ABORT is used. Every survivor must call it.
  //! @throws system_error on failure or timeout.
  communicator shrink(std::span<const int> exclude, std::int64_t next_generation) {
    for (int r : exclude)
      EBBFLOW_ENFORCE(r >= 0 && r < size_ && r != rank_,
                      "nccl shrink: cannot exclude rank " << r << " of " << size_ << " from rank " << rank_);
    communicator c;
    c.opts_ = opts_;
    c.generation_ = next_generation;
    std::vector<int> ex(exclude.begin(), exclude.end());
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    const int flags = failed_ ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT;
    ncclResult_t r = ncclCommShrink(comm_, ex.data(), static_cast<int>(ex.size()), &c.comm_, &cfg, flags);
    std::error_code ec;
    if (r != ncclSuccess && r != ncclInProgress) ec = std::error_code(r, nccl_category());
    if (!ec) c.wait_ready(deadline::after(opts_.init_timeout), ec);
    if (!ec) {
      ncclCommUserRank(c.comm_, &c.rank_);
      ncclCommCount(c.comm_, &c.size_);
    }
    c.check(ec, "nccl shrink");
    return c;
  }

 private:
  void swap(communicator& o) noexcept {
    std::swap(comm_, o.comm_);
    std::swap(rank_, o.rank_);
    std::swap(size_, o.size_);
    std::swap(generation_, o.generation_);
    std::swap(failed_, o.failed_);
    std::swap(revoked_, o.revoked_);
    std::swap(opts_, o.opts_);
  }

  void close() noexcept {
    if (!comm_) return;
    // A healthy communicator is finalised and destroyed; a failed one aborted
    // (destroy could wait forever for a dead peer).
    ncclResult_t r = failed_ ? ncclCommAbort(comm_) : ncclCommDestroy(comm_);
    if (r != ncclSuccess) EBBFLOW_LOG_WARN("closing NCCL communicator: " << ncclGetErrorString(r));
    comm_ = nullptr;
  }

  void wait_ready(deadline d, std::error_code& ec) noexcept {
    for (;;) {
      ncclResult_t st = ncclSuccess;
      if (ncclResult_t r = ncclCommGetAsyncError(comm_, &st); r != ncclSuccess) st = r;
      if (st == ncclSuccess) return;
      if (st != ncclInProgress) {
        ec = std::error_code(st, nccl_category());
        return;
      }
      if (d.expired()) {
        ec = make_error_code(error::timeout);
        return;
      }
      std::this_thread::sleep_for(opts_.poll_interval);
    }
  }

  // Runs one collective of `count` elements of `type`, naming them on error.
  template <class Enqueue>
  void run(const char* what, std::size_t count, dtype type, cudaStream_t stream, deadline d, Enqueue&& enqueue) {
    std::error_code ec;
    if (!comm_ || revoked_) {
      ec = make_error_code(error::revoked);
    } else if (ncclResult_t r = enqueue(); r != ncclSuccess && r != ncclInProgress) {
      ec = std::error_code(r, nccl_category());
    } else {
      for (;;) {
        ncclResult_t st = ncclSuccess;
        ncclCommGetAsyncError(comm_, &st);
        if (st != ncclSuccess && st != ncclInProgress) {
          ec = std::error_code(st, nccl_category());
          break;
        }
        const cudaError_t q = cudaStreamQuery(stream);
        if (q == cudaSuccess && st == ncclSuccess) break;
        if (q != cudaSuccess && q != cudaErrorNotReady) {
          ec = std::error_code(static_cast<int>(q), cuda_category());
          break;
        }
        if (d.expired()) {
          ec = make_error_code(error::timeout);
          break;
        }
        std::this_thread::sleep_for(opts_.poll_interval);
      }
    }
    if (ec) revoke();
    check(ec, what,
          std::to_string(count) + " " + std::string(name(type)) + ", " + std::to_string(count * size_of(type)) +
              " bytes");
  }

  void check(const std::error_code& ec, const char* what, std::string detail = {}) {
    if (!ec) return;
    failed_ = true;
    throw_if(ec, {.rank = rank_, .generation = generation_, .operation = what, .detail = std::move(detail)});
  }

  ncclComm_t comm_ = nullptr;
  int rank_ = -1;
  int size_ = 0;
  std::int64_t generation_ = -1;
  bool failed_ = false;
  bool revoked_ = false;
  options opts_{};
};

}  // namespace comm::nccl
EBBFLOW_END_NAMESPACE
