// SPDX-License-Identifier: Apache-2.0
//! @file impl/nccl_communicator.hpp
//! Definitions for comm/nccl_communicator.hpp.
#pragma once

#include <ebbflow/comm/nccl_communicator.hpp>
#include <ebbflow/core/log.hpp>

#include <cstring>
#include <iterator>
#include <thread>
#include <utility>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace comm {

inline nccl_unique_id make_nccl_unique_id() {
  ncclUniqueId id;
  if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
    throw_if(std::error_code(r, nccl_category()), {.operation = "ncclGetUniqueId"});
  nccl_unique_id out;
  std::memcpy(out.data(), &id, sizeof id);
  return out;
}

namespace detail {
// Indexed by the enumerators' values (dtype: f32 f64 f16 bf16 i32 i64 u8;
// reduce_op: sum avg min max prod).
inline constexpr ncclDataType_t nccl_types[] = {ncclFloat32, ncclFloat64, ncclFloat16, ncclBfloat16,
                                                ncclInt32,   ncclInt64,   ncclUint8};
inline constexpr ncclRedOp_t nccl_ops[] = {ncclSum, ncclAvg, ncclMin, ncclMax, ncclProd};
static_assert(std::size(nccl_types) == std::size(all_dtypes) && std::size(nccl_ops) == std::size(all_reduce_ops));
}  // namespace detail

constexpr ncclDataType_t to_nccl(dtype t) noexcept { return detail::nccl_types[static_cast<std::size_t>(t)]; }
constexpr ncclRedOp_t to_nccl(reduce_op op) noexcept { return detail::nccl_ops[static_cast<std::size_t>(op)]; }
static_assert(to_nccl(dtype::bf16) == ncclBfloat16 && to_nccl(dtype::u8) == ncclUint8 &&
              to_nccl(reduce_op::avg) == ncclAvg && to_nccl(reduce_op::prod) == ncclProd);

inline nccl_communicator nccl_communicator::init(int rank, int size, std::int64_t generation, const nccl_unique_id& id,
                                                 nccl_options opts) {
  EBBFLOW_ENFORCE(size > 0 && rank >= 0 && rank < size,
                  "nccl_communicator::init: rank " << rank << " outside [0, " << size << ")");
  nccl_communicator c;
  c.st_.rank = rank;
  c.st_.size = size;
  c.st_.generation = generation;
  c.st_.opts = opts;
  ncclUniqueId uid;
  std::memcpy(&uid, id.data(), sizeof uid);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&c.st_.comm, size, uid, rank, &cfg);
  std::error_code ec;
  if (r != ncclSuccess && r != ncclInProgress) ec = std::error_code(r, nccl_category());
  if (!ec) c.wait_ready(deadline::after(opts.init_timeout), ec);
  c.check(ec, "nccl init");
  return c;
}

inline nccl_communicator::nccl_communicator(nccl_communicator&& o) noexcept : st_(std::exchange(o.st_, {})) {}

inline nccl_communicator& nccl_communicator::operator=(nccl_communicator&& o) noexcept {
  if (this != &o) {
    close();
    st_ = std::exchange(o.st_, {});
  }
  return *this;
}

inline nccl_communicator::~nccl_communicator() { close(); }

inline void nccl_communicator::allreduce(buffer_view in, buffer_view out, reduce_op op, deadline d) {
  detail::check_allreduce(in, out, true);
  run("allreduce", in, d, [&] {
    return ncclAllReduce(in.data, out.data, in.count, to_nccl(in.type), to_nccl(op), st_.comm, st_.opts.stream);
  });
}

inline void nccl_communicator::broadcast(buffer_view buf, int root, deadline d) {
  detail::check_broadcast(buf, root, st_.size, true);
  run("broadcast", buf, d,
      [&] { return ncclBroadcast(buf.data, buf.data, buf.count, to_nccl(buf.type), root, st_.comm, st_.opts.stream); });
}

inline void nccl_communicator::allgather(buffer_view in, buffer_view out, deadline d) {
  detail::check_allgather(in, out, st_.size, st_.rank, true);
  run("allgather", out, d,
      [&] { return ncclAllGather(in.data, out.data, in.count, to_nccl(in.type), st_.comm, st_.opts.stream); });
}

inline void nccl_communicator::reduce_scatter(buffer_view in, buffer_view out, reduce_op op, deadline d) {
  detail::check_reduce_scatter(in, out, st_.size, true);
  run("reduce_scatter", in, d, [&] {
    return ncclReduceScatter(in.data, out.data, out.count, to_nccl(in.type), to_nccl(op), st_.comm, st_.opts.stream);
  });
}

inline void nccl_communicator::barrier(deadline d) {
  if (st_.comm && !st_.d_barrier) {
    if (cudaError_t e = cudaMalloc(&st_.d_barrier, sizeof(std::int32_t)); e != cudaSuccess)
      check(std::error_code(static_cast<int>(e), cuda_category()), "barrier", "cudaMalloc of 4 bytes");
  }
  const buffer_view one{st_.d_barrier, 1, dtype::i32, memory_space::device};
  run("barrier", one, d,
      [&] { return ncclAllReduce(one.data, one.data, 1, ncclInt32, ncclSum, st_.comm, st_.opts.stream); });
}

inline void nccl_communicator::allreduce(buffer_view in, buffer_view out, reduce_op op, deadline d,
                                         std::error_code& ec) noexcept {
  detail::into_error_code(ec, [&] { allreduce(in, out, op, d); });
}
inline void nccl_communicator::broadcast(buffer_view buf, int root, deadline d, std::error_code& ec) noexcept {
  detail::into_error_code(ec, [&] { broadcast(buf, root, d); });
}
inline void nccl_communicator::allgather(buffer_view in, buffer_view out, deadline d, std::error_code& ec) noexcept {
  detail::into_error_code(ec, [&] { allgather(in, out, d); });
}
inline void nccl_communicator::reduce_scatter(buffer_view in, buffer_view out, reduce_op op, deadline d,
                                              std::error_code& ec) noexcept {
  detail::into_error_code(ec, [&] { reduce_scatter(in, out, op, d); });
}
inline void nccl_communicator::barrier(deadline d, std::error_code& ec) noexcept {
  detail::into_error_code(ec, [&] { barrier(d); });
}

inline void nccl_communicator::revoke() noexcept {
  if (!st_.comm || st_.revoked) return;
  st_.revoked = true;
  st_.failed = true;
  if (ncclResult_t r = ncclCommRevoke(st_.comm, NCCL_REVOKE_DEFAULT); r != ncclSuccess && r != ncclInProgress)
    EBBFLOW_LOG_WARN("ncclCommRevoke failed: " << ncclGetErrorString(r) << " [rank " << st_.rank << ", generation "
                                               << st_.generation << "]");
}

inline nccl_communicator nccl_communicator::shrink(std::span<const int> exclude, std::int64_t next_generation) {
  for (int r : exclude)
    EBBFLOW_ENFORCE(r >= 0 && r < st_.size && r != st_.rank,
                    "nccl shrink: cannot exclude rank " << r << " of " << st_.size << " from rank " << st_.rank);
  nccl_communicator c;
  c.st_.opts = st_.opts;
  c.st_.generation = next_generation;
  std::vector<int> ex(exclude.begin(), exclude.end());
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  const int flags = st_.failed ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT;
  ncclResult_t r = ncclCommShrink(st_.comm, ex.data(), static_cast<int>(ex.size()), &c.st_.comm, &cfg, flags);
  std::error_code ec;
  if (r != ncclSuccess && r != ncclInProgress) ec = std::error_code(r, nccl_category());
  if (!ec) c.wait_ready(deadline::after(st_.opts.init_timeout), ec);
  if (!ec) {
    ncclCommUserRank(c.st_.comm, &c.st_.rank);
    ncclCommCount(c.st_.comm, &c.st_.size);
  }
  c.check(ec, "nccl shrink");
  return c;
}

inline void nccl_communicator::close() noexcept {
  if (st_.d_barrier) {
    if (cudaError_t e = cudaFree(st_.d_barrier); e != cudaSuccess)
      EBBFLOW_LOG_WARN("freeing the NCCL barrier's device word: " << cudaGetErrorString(e));
    st_.d_barrier = nullptr;
  }
  if (!st_.comm) return;
  // A healthy communicator is finalised and destroyed; a failed one aborted
  // (destroy could wait forever for a dead peer).
  ncclResult_t r = st_.failed ? ncclCommAbort(st_.comm) : ncclCommDestroy(st_.comm);
  if (r != ncclSuccess) EBBFLOW_LOG_WARN("closing NCCL communicator: " << ncclGetErrorString(r));
  st_.comm = nullptr;
}

inline void nccl_communicator::wait_ready(deadline d, std::error_code& ec) noexcept {
  for (;;) {
    ncclResult_t st = ncclSuccess;
    if (ncclResult_t r = ncclCommGetAsyncError(st_.comm, &st); r != ncclSuccess) st = r;
    if (st == ncclSuccess) return;
    if (st != ncclInProgress) {
      ec = std::error_code(st, nccl_category());
      return;
    }
    if (d.expired()) {
      ec = make_error_code(error::timeout);
      return;
    }
    std::this_thread::sleep_for(st_.opts.poll_interval);
  }
}

// Runs one collective on the buffer `v` (named on error): enqueue, then poll
// the stream and NCCL's async error until done or `d` passed.
template <class Enqueue>
void nccl_communicator::run(const char* what, const buffer_view& v, deadline d, Enqueue&& enqueue) {
  std::error_code ec;
  if (!st_.comm || st_.revoked) {
    ec = make_error_code(error::revoked);
  } else if (ncclResult_t r = enqueue(); r != ncclSuccess && r != ncclInProgress) {
    ec = std::error_code(r, nccl_category());
  } else {
    for (;;) {
      ncclResult_t st = ncclSuccess;
      ncclCommGetAsyncError(st_.comm, &st);
      if (st != ncclSuccess && st != ncclInProgress) {
        ec = std::error_code(st, nccl_category());
        break;
      }
      const cudaError_t q = cudaStreamQuery(st_.opts.stream);
      if (q == cudaSuccess && st == ncclSuccess) break;
      if (q != cudaSuccess && q != cudaErrorNotReady) {
        ec = std::error_code(static_cast<int>(q), cuda_category());
        break;
      }
      if (d.expired()) {
        ec = make_error_code(error::timeout);
        break;
      }
      std::this_thread::sleep_for(st_.opts.poll_interval);
    }
  }
  if (ec) revoke();
  check(ec, what,
        std::to_string(v.count) + " " + std::string(name(v.type)) + ", " + std::to_string(v.bytes()) + " bytes");
}

inline void nccl_communicator::check(const std::error_code& ec, const char* what, std::string detail) {
  if (!ec) return;
  st_.failed = true;
  throw_if(ec, {.rank = st_.rank, .generation = st_.generation, .operation = what, .detail = std::move(detail)});
}

}  // namespace comm
EBBFLOW_END_NAMESPACE
