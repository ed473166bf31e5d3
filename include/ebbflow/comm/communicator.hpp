// SPDX-License-Identifier: Apache-2.0
//! @file communicator.hpp
//! The `communicator` concept, and `transport_communicator`, its model for
//! host memory: collectives written once over any `comm::transport`
//! (allreduce, broadcast, allgather, reduce_scatter, barrier and
//! point-to-point send/recv), each in a blocking form (throwing, and a
//! `noexcept` twin taking `std::error_code&`) and a non-blocking form
//! returning a `comm::request` (so computation can overlap communication).
//! `nccl_communicator` (comm/nccl_communicator.hpp) models the same concept
//! for device memory: a training loop moves from host to device buffers by
//! changing the communicator's type, not its calls.
//!
//! Algorithms:
//! * allreduce: recursive doubling (with the MPICH fold for rank counts that
//!   are not powers of two) at or below `small_bytes`; above it, when every
//!   peer runs on this host and the transport allows single-copy reads
//!   (`local_peer`, UCX transport on Linux), each rank reduces its segment
//!   reading peers' buffers directly and then copies peers' segments
//!   (`single_copy`); otherwise ring reduce-scatter + ring allgather,
//!   pipelined in `chunk_bytes` chunks with `window` receives in flight,
//!   reducing from cache-resident scratch slots. All give bitwise-identical
//!   results on every rank.
//! * broadcast: binomial tree (small) or chunk-pipelined chain (large).
//! * allgather / reduce_scatter: ring. barrier: dissemination.
//!
//! Every collective takes a deadline (default: `collective_options::timeout`
//! from now) and reports failures as `ebbflow::system_error` (or, in the
//! `std::error_code&` forms, its code) whose message
//! names the operation, this rank, the generation, the peer whose operation
//! failed and the collective's sequence number. Conditions: `errc::peer_lost`
//! (a peer died), `errc::timeout` (deadline passed), `errc::bad_message`
//! (ranks disagree on sizes, when a message of the wrong size arrives; the
//! text names both sizes).
//!
//! Ranks that disagree on sizes get `bad_message` only when they run the
//! same algorithm, and then only the ranks that receive a message of the
//! wrong size (single_copy: every rank, which compares sizes first; the
//! ring: those whose chunks differ); its text names both sizes and the
//! cause. The others, waiting for a peer that gave up, get `errc::timeout`
//! at their deadline, as do all ranks when sizes on both sides of the
//! algorithm choice (`small_bytes`, the element count against the rank
//! count) make them run different algorithms whose messages never match;
//! the timeout's text names this rank's byte count and this possible cause.
//! Detecting it sooner would need the size on the wire or an extra round
//! trip per collective; ebbflow does neither.
//!
//! All ranks must call the same collectives in the same order with matching
//! sizes, dtypes and roots (MPI semantics). Buffers are host memory
//! (`memory_space::host` or `pinned`; a device view is refused with
//! `std::invalid_argument` naming its space). In-place: pass the same view as
//! input and output (for allgather: input at `output.slice(rank * n, n)`).
//!
//! Errors: a call that fails at run time throws
//! `ebbflow::system_error` (conditions `errc::peer_lost`, `timeout`,
//! `bad_message`, ...); its `std::error_code&` twin is `noexcept` and sets
//! the same code. Arguments the caller could have checked (counts, dtypes,
//! memory space, root, peer) raise `std::invalid_argument`; the twin reports
//! them as `std::errc::invalid_argument`.
//!
//! A transport that also offers `int lost_peer() const` (the UCX transport
//! does) lets errors name the peer that died rather than the neighbour whose
//! transfer reported it (in a ring, often a live rank stuck behind the dead
//! one). One that offers `bool probe_peers()` (UCX: is the process of a peer
//! on this host gone?) is asked before a timeout is reported, so a peer that
//! died unnoticed is reported lost, not the live peer this rank waited for.
//! The single-copy allreduce reports a peer's memory that vanished the same
//! way: the peer lost is the one whose process is gone (the peer read from
//! may only have left the collective after its own error).
//!
//! Thread safety: a communicator and its requests are driven by one thread at
//! a time (the thread that drives its transport).
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/comm/detail/collective_task.hpp>
#include <ebbflow/comm/reduce.hpp>
#include <ebbflow/comm/transport.hpp>
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/core/dtype.hpp>
#include <ebbflow/core/env.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/core/memory.hpp>

#include <chrono>
#include <concepts>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace comm {

//! The elements [first, second) of a `count`-element buffer that rank `r` of
//! `n` reduces in the ring and single_copy allreduce (and holds after the
//! ring's reduce-scatter phase): count·r/n up to count·(r+1)/n. E.g. to shard
//! an optimizer update the way the reduction is sharded, or to check each
//! rank's partial sums.
[[nodiscard]] constexpr std::pair<std::size_t, std::size_t> allreduce_segment(std::size_t count, int n,
                                                                              int r) noexcept {
  return detail::segment_of(count, n, r);
}

//! Allreduce algorithm selection.
enum class allreduce_algorithm : std::uint8_t {
  automatic,           //!< recursive doubling up to `small_bytes`, ring above
  ring,                //!< bandwidth-optimal: 2(n-1)/n of the buffer per rank
  recursive_doubling,  //!< latency-optimal: ceil(log2 n) (+2) steps, full buffer each
  single_copy,         //!< all ranks on one host: direct reads of peers' buffers (Linux CMA)
};

//! Tuning knobs and the default deadline; the defaults suit shared-memory
//! and TCP transports on one host. Every rank must use the same values for
//! the algorithm choice (`allreduce`, `small_bytes`, `chunk_bytes`).
struct collective_options {
  allreduce_algorithm allreduce = allreduce_algorithm::automatic;  //!< allreduce algorithm (see `allreduce_algorithm`)
  std::size_t small_bytes = std::size_t{16} << 10;                 //!< at or below: latency-optimal algorithms
  std::size_t chunk_bytes = std::size_t{128} << 10;                //!< pipelining granularity of ring / chain
  int window = 4;                                                  //!< chunk receives in flight (scratch slots)
  std::size_t copy_chunk_bytes = std::size_t{512} << 10;           //!< single_copy: peer data read per reduction step
  std::chrono::milliseconds timeout{60'000};                       //!< deadline of calls that take none

  //! Defaults overridden by `EBBFLOW_ALLREDUCE_ALGO` (automatic, ring,
  //! recursive_doubling, single_copy), `EBBFLOW_SMALL_BYTES`,
  //! `EBBFLOW_CHUNK_BYTES`, `EBBFLOW_COMM_WINDOW`, `EBBFLOW_COPY_CHUNK_BYTES`,
  //! `EBBFLOW_COMM_TIMEOUT_MS`.
  //! @throws std::invalid_argument for malformed values.
  static collective_options from_environment() {
    collective_options o;
    o.allreduce = env::get_choice("EBBFLOW_ALLREDUCE_ALGO", o.allreduce,
                                  {{"automatic", allreduce_algorithm::automatic},
                                   {"ring", allreduce_algorithm::ring},
                                   {"recursive_doubling", allreduce_algorithm::recursive_doubling},
                                   {"single_copy", allreduce_algorithm::single_copy}});
    o.small_bytes =
        static_cast<std::size_t>(env::get_int("EBBFLOW_SMALL_BYTES", static_cast<std::int64_t>(o.small_bytes), 0));
    o.chunk_bytes =
        static_cast<std::size_t>(env::get_int("EBBFLOW_CHUNK_BYTES", static_cast<std::int64_t>(o.chunk_bytes), 1));
    o.window = static_cast<int>(env::get_int("EBBFLOW_COMM_WINDOW", o.window, 1, 1024));
    o.copy_chunk_bytes = static_cast<std::size_t>(
        env::get_int("EBBFLOW_COPY_CHUNK_BYTES", static_cast<std::int64_t>(o.copy_chunk_bytes), 1));
    o.timeout = env::get_ms("EBBFLOW_COMM_TIMEOUT_MS", o.timeout, 1);
    return o;
  }
};

//! A non-blocking collective in flight. Move-only. Progresses when `test`
//! or `wait` is called on it or on any other request of the same
//! communicator (each call moves every collective in flight), so ranks may
//! complete their requests in different orders. Destroying a pending
//! request abandons it: its posted transfers are cancelled by the
//! transport, and the communicator's group must be considered broken (the
//! elastic layer moves to a new generation).
template <transport T>
class request {
 public:
  request() noexcept = default;
  //! Takes over `o`'s collective; `o` becomes empty (done).
  request(request&& o) noexcept;
  //! Abandons this request's pending collective (as destruction does), then takes over `o`'s.
  request& operator=(request&& o) noexcept;
  request(const request&) = delete;
  request& operator=(const request&) = delete;
  ~request();

  //! Progresses without blocking; true once the collective finished
  //! (successfully or not: then `ec` holds the error). Never throws
  //! except `std::bad_alloc`.
  bool test(std::error_code& ec);
  //! Blocks until finished or `d` passed (`errc::timeout`; the request
  //! stays pending and may be waited on again).
  void wait(deadline d, std::error_code& ec);
  //! Blocks until finished. @throws system_error naming rank, generation,
  //! peer, operation and sequence number.
  void wait(deadline d);
  //! True when finished (successfully or not) or empty.
  [[nodiscard]] bool done() const noexcept;
  //! Where the last error happened (peer = the rank whose transfer failed).
  [[nodiscard]] const error_context& context() const;

 private:
  template <transport>
  friend class transport_communicator;
  request(T& t, detail::task<T> task, detail::op_context ctx, std::shared_ptr<detail::active_set<T>> active);
  void finish(std::error_code ec, int peer, std::string_view why = {});
  void progress();
  void release() noexcept;

  T* t_ = nullptr;
  std::coroutine_handle<detail::promise<T>> h_{};
  std::error_code ec_{};
  bool finished_ = true;
  mutable error_context ctx_{};
  std::uint64_t seq_ = 0;
  std::size_t bytes_ = 0;
  bool describe_ = false;
  std::string why_;  // "; " + what the failed transfer said (sizes), or empty
  std::shared_ptr<detail::active_set<T>> active_;
};

//! Collectives over a transport: the host-memory `communicator`. Holds a
//! reference to the transport (which must outlive it) and the collective
//! sequence number that, together with the step of an algorithm, forms
//! every message tag. It is the only source of sequence numbers on its
//! transport: collectives written outside this class take theirs from
//! `next_sequence`.
template <transport T>
class transport_communicator {
 public:
  //! Communicates over `transport` (not owned; must outlive this). Sends nothing.
  //! @throws std::invalid_argument when `opts.chunk_bytes` or `opts.window` is not positive.
  explicit transport_communicator(T& transport, collective_options opts = {});

  //! This rank (0-based), as the transport reports it.
  [[nodiscard]] int rank() const { return static_cast<int>(t_->rank()); }
  //! Number of ranks in the group.
  [[nodiscard]] int size() const { return static_cast<int>(t_->size()); }
  //! Membership generation of the transport (named in error messages).
  [[nodiscard]] std::int64_t generation() const { return static_cast<std::int64_t>(t_->generation()); }
  //! The options given at construction.
  [[nodiscard]] const collective_options& options() const noexcept { return opts_; }
  //! The underlying transport.
  [[nodiscard]] T& transport() noexcept { return *t_; }
  //! A deadline `options().timeout` from now.
  [[nodiscard]] deadline default_deadline() const noexcept { return deadline::after(opts_.timeout); }

  //! The algorithm `allreduce` runs for `count` elements of `type` on this
  //! group (never `automatic`): recursive doubling at or below `small_bytes`,
  //! else single_copy when every peer is on this host, else ring (or what
  //! `options().allreduce` forces). The same on every rank. Does not communicate.
  //! @throws std::invalid_argument when single_copy is forced but not possible.
  [[nodiscard]] allreduce_algorithm allreduce_algorithm_for(std::size_t count, dtype type) const;
  //! Payload bytes this rank hands to the transport in an allreduce of
  //! `count` elements of `type` (single_copy: none, peers' buffers are read
  //! in place). Does not communicate.
  [[nodiscard]] std::size_t allreduce_bytes_sent(std::size_t count, dtype type) const;

  //! `out = op(in of every rank)`; `in` and `out` have the same count and
  //! dtype; `in.data == out.data` is in-place. @throws system_error, std::invalid_argument.
  void allreduce(buffer_view in, buffer_view out, reduce_op op, deadline d) { iallreduce(in, out, op).wait(d); }
  //! As above; errors in `ec` (a refused argument: `std::errc::invalid_argument`).
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
  //! Non-blocking allreduce; buffers stay in use until the request finished.
  [[nodiscard]] request<T> iallreduce(buffer_view in, buffer_view out, reduce_op op);

  //! Copies `root`'s `buf` into every rank's `buf`.
  void broadcast(buffer_view buf, int root, deadline d) { ibroadcast(buf, root).wait(d); }
  //! As above; errors in `ec`.
  void broadcast(buffer_view buf, int root, deadline d, std::error_code& ec) noexcept;
  //! As above with `default_deadline()`.
  void broadcast(buffer_view buf, int root) { broadcast(buf, root, default_deadline()); }
  //! Non-blocking broadcast; `buf` stays in use until the request finished.
  [[nodiscard]] request<T> ibroadcast(buffer_view buf, int root);

  //! `out` (count `in.count * size()`) receives every rank's `in` in rank order.
  void allgather(buffer_view in, buffer_view out, deadline d) { iallgather(in, out).wait(d); }
  //! As above; errors in `ec`.
  void allgather(buffer_view in, buffer_view out, deadline d, std::error_code& ec) noexcept;
  //! As above with `default_deadline()`.
  void allgather(buffer_view in, buffer_view out) { allgather(in, out, default_deadline()); }
  //! Non-blocking allgather; buffers stay in use until the request finished.
  [[nodiscard]] request<T> iallgather(buffer_view in, buffer_view out);

  //! `out` (count `in.count / size()`) receives block `rank()` of the reduction of every rank's `in`.
  void reduce_scatter(buffer_view in, buffer_view out, reduce_op op, deadline d) {
    ireduce_scatter(in, out, op).wait(d);
  }
  //! As above; errors in `ec`.
  void reduce_scatter(buffer_view in, buffer_view out, reduce_op op, deadline d, std::error_code& ec) noexcept;
  //! As above with `default_deadline()`.
  void reduce_scatter(buffer_view in, buffer_view out, reduce_op op) {
    reduce_scatter(in, out, op, default_deadline());
  }
  //! Non-blocking reduce_scatter; buffers stay in use until the request finished.
  [[nodiscard]] request<T> ireduce_scatter(buffer_view in, buffer_view out, reduce_op op);

  //! Returns once every rank entered the barrier.
  void barrier(deadline d) { ibarrier().wait(d); }
  //! As above; errors in `ec`.
  void barrier(deadline d, std::error_code& ec) noexcept;
  //! As above with `default_deadline()`.
  void barrier() { barrier(default_deadline()); }
  //! Non-blocking barrier: finished once every rank entered it.
  [[nodiscard]] request<T> ibarrier();

  //! Point-to-point: matched by (peer, `tag` < 2^24) in posting order; sizes must agree.
  //! Blocking send of `buf` to `peer`. @throws system_error, std::invalid_argument.
  void send(buffer_view buf, int peer, std::uint32_t tag, deadline d) { isend(buf, peer, tag).wait(d); }
  //! As above; errors in `ec`.
  void send(buffer_view buf, int peer, std::uint32_t tag, deadline d, std::error_code& ec) noexcept;
  //! Blocking receive into `buf` from `peer`. @throws system_error, std::invalid_argument.
  void recv(buffer_view buf, int peer, std::uint32_t tag, deadline d) { irecv(buf, peer, tag).wait(d); }
  //! As above; errors in `ec`.
  void recv(buffer_view buf, int peer, std::uint32_t tag, deadline d, std::error_code& ec) noexcept;
  //! Non-blocking send; `buf` stays in use until the request finished.
  [[nodiscard]] request<T> isend(buffer_view buf, int peer, std::uint32_t tag);
  //! Non-blocking receive; `buf` stays in use until the request finished.
  [[nodiscard]] request<T> irecv(buffer_view buf, int peer, std::uint32_t tag);

  //! The sequence number of one collective written outside this class over
  //! `transport()` (e.g. compress's codec-specific algorithms): its step s
  //! uses the tag `make_tag(seq, s)`, s at most `max_collective_step`. Taken
  //! from the counter of this communicator's own collectives, so every rank
  //! that calls collectives in the same order gets the same number, and no
  //! collective in flight shares it.
  [[nodiscard]] std::uint64_t next_sequence() noexcept { return seq_++ & seq_mask; }

 private:
  detail::op_context ctx(const char* op, std::uint64_t seq, std::size_t bytes) const;
  bool all_peers_local() const;
  request<T> make_request(detail::task<T> tk, detail::op_context c);
  request<T> point_to_point(bool is_send, buffer_view buf, int peer, std::uint32_t tag);
  T* t_;
  collective_options opts_;
  std::uint64_t seq_ = 0;
  std::shared_ptr<detail::scratch_pool> pool_;
  std::shared_ptr<detail::active_set<T>> active_;
};

//! The former name of `transport_communicator`, kept for one release.
//! @deprecated Use `transport_communicator`.
template <transport T>
using basic_communicator = transport_communicator<T>;

//! What a communicator offers, for host memory (`transport_communicator`)
//! and device memory (`nccl_communicator`) alike: the same calls on
//! `buffer_view`s, each blocking form also as a `noexcept` twin reporting in
//! an `std::error_code`. Syntactic; semantics as documented above.
template <class C>
concept communicator = requires(C& c, buffer_view v, reduce_op op, int root, deadline d, std::error_code& ec) {
  { c.rank() } -> std::convertible_to<int>;
  { c.size() } -> std::convertible_to<int>;
  { c.generation() } -> std::convertible_to<std::int64_t>;
  c.allreduce(v, v, op, d);
  c.allreduce(v, v, op, d, ec);
  c.broadcast(v, root, d);
  c.broadcast(v, root, d, ec);
  c.allgather(v, v, d);
  c.allgather(v, v, d, ec);
  c.reduce_scatter(v, v, op, d);
  c.reduce_scatter(v, v, op, d, ec);
  c.barrier(d);
  c.barrier(d, ec);
};

}  // namespace comm
EBBFLOW_END_NAMESPACE

#include <ebbflow/comm/impl/communicator.hpp>
