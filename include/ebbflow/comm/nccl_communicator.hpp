// SPDX-License-Identifier: Apache-2.0
//! @file nccl_communicator.hpp
//! `nccl_communicator`: the `comm::communicator` concept for device memory,
//! over NCCL. It takes the same calls as the host communicator
//! (`transport_communicator`): `buffer_view`s that carry their memory space,
//! a reduce op and a deadline, each blocking form with a `noexcept`
//! `std::error_code&` twin. The CUDA stream the collectives run on belongs
//! to the object (`nccl_options::stream`, `set_stream`), so a training loop
//! moves from host to device memory by changing the communicator's type.
//!
//! * Non-blocking initialisation (`ncclConfig_t::blocking = 0`) from a fresh
//!   unique id per generation (the elastic layer publishes it in the store),
//!   polled until ready or the deadline passes.
//! * Every collective is enqueued on the stream and then polled through
//!   `cudaStreamQuery` and `ncclCommGetAsyncError` until its deadline: a peer
//!   that died yields `errc::peer_lost` (ncclRemoteError) and a stuck one
//!   `errc::timeout`, never a hang. Blocking: on return the result is in
//!   device memory (the stream has drained). After an error the communicator
//!   is revoked (`ncclCommRevoke`) so in-flight work stops, and it is aborted
//!   on destruction.
//! * `shrink()` builds the next generation without the lost or leaving ranks
//!   (`ncclCommShrink`, NCCL 2.27+), with `NCCL_SHRINK_ABORT` after an error.
//!
//! Buffers: device memory (`memory_space::device`); a host or pinned view is
//! refused with `std::invalid_argument` naming its space, before anything
//! is enqueued. Counts and dtypes follow the host communicator's rules.
//! Errors: run-time failures throw `ebbflow::system_error` naming rank,
//! generation and operation (the twins set its code); refused arguments
//! raise `std::invalid_argument` (the twins: `std::errc::invalid_argument`).
//!
//! Requires the CUDA runtime and NCCL headers and linking `ebbflow::nccl`.
//! The current CUDA device must be the communicator's when it is used.
//! Thread safety: one thread drives a communicator at a time.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/comm/communicator.hpp>
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/core/dtype.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/core/memory.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <system_error>

#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < NCCL_VERSION(2, 27, 0)
#error "ebbflow's NCCL communicator needs NCCL 2.27 or newer (ncclCommShrink, ncclCommRevoke)"
#endif

EBBFLOW_BEGIN_NAMESPACE
namespace comm {

//! The 128-byte NCCL unique id, as bytes for the rendezvous store.
using nccl_unique_id = std::array<std::byte, sizeof(ncclUniqueId)>;

//! A fresh unique id (call on one rank per generation, then publish).
//! @throws system_error (nccl category) when NCCL cannot create one (e.g. no network interface).
inline nccl_unique_id make_nccl_unique_id();

//! NCCL's element type for an ebbflow dtype.
constexpr ncclDataType_t to_nccl(dtype t) noexcept;
//! NCCL's reduction for an ebbflow reduce_op.
constexpr ncclRedOp_t to_nccl(reduce_op op) noexcept;

//! Options of an NCCL communicator.
struct nccl_options {
  std::chrono::milliseconds init_timeout{60'000};  //!< deadline for non-blocking init / shrink
  std::chrono::milliseconds timeout{60'000};       //!< deadline of calls that take none
  std::chrono::microseconds poll_interval{50};     //!< sleep between progress polls
  cudaStream_t stream = nullptr;                   //!< where collectives run (nullptr: the legacy default stream)
};

//! An NCCL communicator of one generation, for device buffers. Move-only;
//! destroys its NCCL communicator when healthy and aborts it after a failure.
class nccl_communicator {
 public:
  //! An empty communicator (`valid()` false); its collectives fail with `errc::revoked`.
  nccl_communicator() = default;

  //! Joins generation `generation` as `rank` of `size`, from the id that rank 0
  //! published; collectives run on `opts.stream`. The current CUDA device must
  //! be set by the caller. Blocks until ready or `opts.init_timeout` passed.
  //! @throws system_error (timeout, or the NCCL error) naming rank and generation;
  //! std::invalid_argument when `rank` is outside [0, size).
  static nccl_communicator init(int rank, int size, std::int64_t generation, const nccl_unique_id& id,
                                nccl_options opts = {});

  //! Takes over `o`'s NCCL communicator; `o` is left empty (`valid()` false).
  nccl_communicator(nccl_communicator&& o) noexcept;
  //! Closes the held communicator (destroy, or abort after a failure), then takes over `o`'s.
  nccl_communicator& operator=(nccl_communicator&& o) noexcept;
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;
  ~nccl_communicator();

  [[nodiscard]] int rank() const noexcept { return st_.rank; }  //!< this rank in the generation; -1 when empty
  [[nodiscard]] int size() const noexcept { return st_.size; }  //!< number of ranks; 0 when empty
  //! The generation this communicator belongs to; -1 when empty.
  [[nodiscard]] std::int64_t generation() const noexcept { return st_.generation; }
  //! True when an NCCL communicator is held (false when default-constructed or moved from).
  [[nodiscard]] bool valid() const noexcept { return st_.comm != nullptr; }
  //! True after an operation failed; the communicator must then be shrunk or replaced.
  [[nodiscard]] bool failed() const noexcept { return st_.failed; }
  //! The underlying `ncclComm_t` (still owned by this object; nullptr when empty).
  [[nodiscard]] ncclComm_t native_handle() const noexcept { return st_.comm; }
  //! The options given at construction (with the current stream).
  [[nodiscard]] const nccl_options& options() const noexcept { return st_.opts; }
  //! The CUDA stream collectives are enqueued on.
  [[nodiscard]] cudaStream_t stream() const noexcept { return st_.opts.stream; }
  //! Runs later collectives on `s` (the caller keeps it alive meanwhile).
  void set_stream(cudaStream_t s) noexcept { st_.opts.stream = s; }
  //! A deadline `options().timeout` from now.
  [[nodiscard]] deadline default_deadline() const noexcept { return deadline::after(st_.opts.timeout); }

  //! `out = op(in of every rank)`, device memory; same count and dtype;
  //! `in.data == out.data` is in place. @throws system_error, std::invalid_argument.
  void allreduce(buffer_view in, buffer_view out, reduce_op op, deadline d);
  //! As above; errors in `ec`.
  void allreduce(buffer_view in, buffer_view out, reduce_op op, deadline d, std::error_code& ec) noexcept;
  //! As above with `default_deadline()`.
  void allreduce(buffer_view in, buffer_view out, reduce_op op) { allreduce(in, out, op, default_deadline()); }
  //! In-place allreduce of `inout` by deadline `d`.
  void allreduce(buffer_view inout, reduce_op op, deadline d) { allreduce(inout, inout, op, d); }
  //! In-place allreduce of `inout` by deadline `d`; errors in `ec`.
  void allreduce(buffer_view inout, reduce_op op, deadline d, std::error_code& ec) noexcept {
    allreduce(inout, inout, op, d, ec);
  }
  //! In-place allreduce of `inout` with `default_deadline()`.
  void allreduce(buffer_view inout, reduce_op op) { allreduce(inout, inout, op, default_deadline()); }

  //! Copies `root`'s `buf` into every rank's `buf`.
  void broadcast(buffer_view buf, int root, deadline d);
  //! As above; errors in `ec`.
  void broadcast(buffer_view buf, int root, deadline d, std::error_code& ec) noexcept;
  //! As above with `default_deadline()`.
  void broadcast(buffer_view buf, int root) { broadcast(buf, root, default_deadline()); }

  //! `out` (count `in.count * size()`) receives every rank's `in` in rank order.
  void allgather(buffer_view in, buffer_view out, deadline d);
  //! As above; errors in `ec`.
  void allgather(buffer_view in, buffer_view out, deadline d, std::error_code& ec) noexcept;
  //! As above with `default_deadline()`.
  void allgather(buffer_view in, buffer_view out) { allgather(in, out, default_deadline()); }

  //! `out` (count `in.count / size()`) receives block `rank()` of the reduction of every rank's `in`.
  void reduce_scatter(buffer_view in, buffer_view out, reduce_op op, deadline d);
  //! As above; errors in `ec`.
  void reduce_scatter(buffer_view in, buffer_view out, reduce_op op, deadline d, std::error_code& ec) noexcept;
  //! As above with `default_deadline()`.
  void reduce_scatter(buffer_view in, buffer_view out, reduce_op op) {
    reduce_scatter(in, out, op, default_deadline());
  }

  //! Returns once every rank entered the barrier (an allreduce of one
  //! element in a small device buffer allocated on first use).
  void barrier(deadline d);
  //! As above; errors in `ec`.
  void barrier(deadline d, std::error_code& ec) noexcept;
  //! As above with `default_deadline()`.
  void barrier() { barrier(default_deadline()); }

  //! Stops all in-flight operations (`ncclCommRevoke`); later operations fail
  //! with `errc::revoked` until the communicator is shrunk. Safe to call after a failure.
  void revoke() noexcept;

  //! The communicator of generation `next_generation` without the ranks in
  //! `exclude` (old ranks; the survivors keep their relative order), on the
  //! same stream. After a failure or revoke NCCL_SHRINK_ABORT is used. Every
  //! survivor must call it. @throws system_error on failure or timeout.
  nccl_communicator shrink(std::span<const int> exclude, std::int64_t next_generation);

 private:
  // Everything a move hands over; a moved-from communicator holds `state{}`.
  struct state {
    ncclComm_t comm = nullptr;
    int rank = -1;
    int size = 0;
    std::int64_t generation = -1;
    bool failed = false;
    bool revoked = false;
    nccl_options opts{};
    void* d_barrier = nullptr;  // one device int for `barrier`, allocated on first use
  };
  void close() noexcept;
  void wait_ready(deadline d, std::error_code& ec) noexcept;
  template <class Enqueue>
  void run(const char* what, const buffer_view& v, deadline d, Enqueue&& enqueue);
  void check(const std::error_code& ec, const char* what, std::string detail = {});

  state st_;
};

static_assert(communicator<nccl_communicator>);

}  // namespace comm
EBBFLOW_END_NAMESPACE

#include <ebbflow/comm/impl/nccl_communicator.hpp>
