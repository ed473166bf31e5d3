// SPDX-License-Identifier: Apache-2.0
//! @file compressed_allreduce.hpp
//! Error-feedback compressed allreduce (sum) over a host communicator
//! (`comm::transport_communicator`, over any `comm::transport`).
//!
//! The algorithm follows the codec's `kind`:
//! * `linear` (fp16, bf16, int8, int4): pipelined ring reduce-scatter with
//!   decode-add-encode per hop, then a ring allgather of the encoded chunks
//!   (the casts scale each block of 256 by its own power of two, at every
//!   hop, so no running sum leaves their range);
//! * `sparse` (top-k): ring allgather of every rank's encoded tensor, decoded
//!   by everybody in rank order;
//! * `sign` (1-bit): compressed reduce-scatter, sum, re-encode with a second
//!   residual, compressed allgather (DeepSpeed 1-bit);
//! * `low_rank` (PowerSGD): two dense allreduces of the factors P and Q.
//! Dense traffic (tensors smaller than `dense_threshold_bytes`, PowerSGD's
//! factors and the tail its matrix leaves out) is the communicator's own
//! allreduce, with its choice of algorithm: recursive doubling for small
//! tensors, single copy on one host, the ring for large ones. Every rank
//! ends with the same bits. Error-feedback state (residuals, PowerSGD's Q)
//! is kept per tensor key and survives between calls.
//!
//! Tags: the codec-specific algorithms take their sequence numbers from the
//! communicator (`next_sequence`), the counter of its own collectives, so any
//! number of allreduce objects and the communicator's collectives share one
//! transport with nothing for the caller to keep apart.
//!
//! Requirements: every rank calls `run` with the same keys, sizes and codec,
//! in the same order relative to every other collective on the communicator
//! (collectives are matched by their sequence numbers).
//! Memory: `grad` must be host-accessible (the executor computes in place;
//! a device path needs staging buffers and is a follow-up). Blocking.
//! Thread safety: one thread drives the object and its communicator.
//! Errors: the throwing `run` raises `ebbflow::system_error` (timeout,
//! peer_lost, bad_message, with rank/peer/generation); the `ec` form reports
//! the same code. After an error the result and the residuals of that tensor
//! are unspecified; call `reset()` before reuse.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/comm/communicator.hpp>
#include <ebbflow/comm/transport.hpp>
#include <ebbflow/compress/codec.hpp>
#include <ebbflow/compress/codecs/powersgd.hpp>
#include <ebbflow/compress/detail/collectives.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/core/memory.hpp>
#include <ebbflow/exec/executor.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <system_error>
#include <unordered_map>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace compress {

//! Tuning of a `compressed_allreduce`. Every rank must use the same values.
struct allreduce_options {
  //! Encoded (wire) bytes per pipelined segment, about: a segment holds as
  //! many elements as encode to this size (whole codec blocks, at most
  //! `segment_bytes` elements, or 4 `segment_bytes` for sparse codes, whose
  //! encode has a fixed cost per call), so strongly compressing codecs are
  //! not cut into tiny messages yet still overlap encoding with the transfer.
  std::size_t segment_bytes = std::size_t{1} << 20;
  //! Tensors smaller than this are reduced dense (exact, by the
  //! communicator's allreduce): compressing them costs more in latency than
  //! it saves in bytes.
  std::size_t dense_threshold_bytes = std::size_t{32} << 10;
  //! Keep the compression error and add it to the next call of the same tensor.
  bool error_feedback = true;
  //! Seed of the stochastic codecs and of PowerSGD's initial Q (same on all ranks).
  std::uint64_t seed = 0x5EEDC0DEull;
  //! Deadline of one `run`, from its start.
  std::chrono::milliseconds timeout{60000};
};

//! Counters of one allreduce object (this rank).
struct allreduce_stats {
  std::size_t calls = 0;            //!< `run` calls
  std::size_t wire_bytes_sent = 0;  //!< bytes handed to the transport (dense: as the communicator's algorithm sends)
  std::size_t dense_calls = 0;      //!< calls that took the dense path
  //! Elements that came out +-inf or NaN from finite codes: the sum left
  //! float's range (above about 3.4e38). Counted by the cast codecs (fp16,
  //! bf16) on the compressed path; the same on every rank.
  std::size_t saturated = 0;
};

//! An error-feedback compressed allreduce bound to one communicator over a
//! `Transport`. `Codec` is a `codec` or `powersgd_codec`.
template <class Codec, comm::transport Transport, exec::executor Executor = exec::cpu_executor>
class compressed_allreduce {
  static_assert(host_accessible(Executor::space), "compressed_allreduce needs host-accessible gradients for now");
  static_assert(codec<Codec> || Codec::kind == codec_kind::low_rank);

 public:
  //! The communicator it runs over.
  using communicator_type = comm::transport_communicator<Transport>;

  //! Keeps a reference to `comm`, which must outlive this object.
  //! @throws std::invalid_argument for `segment_bytes` below one codec block.
  compressed_allreduce(communicator_type& comm, Codec c, Executor ex = {}, allreduce_options opts = {});

  //! Sums `grad` (host-accessible, in place) over all ranks. `key` names the
  //! tensor whose residual is used. Low-rank codecs view the tensor as
  //! `powersgd_codec::shape_for(n)`. @throws system_error
  void run(std::span<float> grad, std::size_t key = 0);
  //! As above; errors in `ec`.
  void run(std::span<float> grad, std::size_t key, std::error_code& ec) noexcept;
  //! Low-rank codecs: the tensor is the row-major rows x cols matrix `shape`
  //! (shape.size() == grad.size()). Other codecs ignore the shape.
  void run(std::span<float> grad, std::size_t key, matrix_shape shape);

  //! Bytes this rank sends for one call on n elements (no dense threshold;
  //! PowerSGD's factors as the communicator's allreduce sends them).
  //! @throws std::invalid_argument where the communicator's allreduce would (a forced algorithm it cannot run).
  [[nodiscard]] std::size_t wire_bytes(std::size_t n) const;
  //! Counters since construction.
  [[nodiscard]] const allreduce_stats& stats() const noexcept { return stats_; }
  //! The codec given at construction.
  [[nodiscard]] const Codec& get_codec() const noexcept { return codec_; }
  //! Drops all residuals and PowerSGD state (e.g. after a membership change).
  void reset() noexcept { state_.clear(); }

 private:
  struct tensor_state {
    std::size_t n = 0;
    int ranks = 0;
    matrix_shape shape{};  // PowerSGD: Q is cols x r of this shape
    std::vector<float> res, res2, q, p, q_local;
  };
  tensor_state& state_for(std::size_t key, std::size_t n, matrix_shape shape);
  [[nodiscard]] std::size_t segment_elems(std::size_t n) const noexcept;
  void run_impl(std::span<float> grad, std::size_t key, matrix_shape shape);
  void run_low_rank(std::span<float> grad, tensor_state& st, matrix_shape shape, deadline d);
  void dense(std::span<float> x, deadline d);

  communicator_type* comm_;
  Codec codec_;
  Executor exec_;
  allreduce_options opts_;
  std::unordered_map<std::size_t, tensor_state> state_;
  detail::arenas arenas_;
  std::uint64_t call_ = 0;  // calls so far: selects the stochastic codecs' random streams
  allreduce_stats stats_;
};

}  // namespace compress
EBBFLOW_END_NAMESPACE

#include <ebbflow/compress/impl/compressed_allreduce.hpp>
