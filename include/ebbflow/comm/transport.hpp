// SPDX-License-Identifier: Apache-2.0
//! @file transport.hpp
//! The point-to-point `transport` concept every collective algorithm is
//! written over: tagged, non-blocking byte messages between the ranks of one
//! generation, completed by `test` or by `wait` with a deadline.
//!
//! Semantics every model guarantees:
//! * Messages between one (source, destination, tag) triple are matched in
//!   the order they were posted (MPI-style non-overtaking).
//! * A receive matches only a message of the same generation: the transport
//!   folds `generation()` into the wire tag, so late traffic of an older
//!   generation can never be consumed by a newer one.
//! * The received message must have exactly the posted size; otherwise the
//!   request fails with `errc::bad_message`. A model's request may offer
//!   `std::string error_detail() const`, naming both sizes after such a
//!   failure (both models here do); `send`/`recv` below and the communicator
//!   add it to the error's text.
//! * A peer that died makes its pending and future requests fail with
//!   `errc::peer_lost` (never a hang); `wait` returns `errc::timeout` when
//!   its deadline passes, and the request stays pending (it may be waited on
//!   again, or cancelled by destroying the transport).
//! * Buffers must stay valid until the request completed.
//! * Thread safety: one thread drives a transport at a time.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/core/error.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <system_error>

EBBFLOW_BEGIN_NAMESPACE
namespace comm {

//! A user tag: 48 bits are available to collectives (the transport reserves
//! the rest for the generation). Collectives compose it from an operation
//! sequence number and a step (see `make_tag`).
using tag_t = std::uint64_t;
//! Bits of a tag available to collectives.
inline constexpr int tag_bits = 48;
//! Mask of the bits available to collectives.
inline constexpr tag_t tag_mask = (tag_t{1} << tag_bits) - 1;

//! Sequence numbers of collectives wrap at 2^24: the UCX wire keeps 24 bits
//! of one (only collectives in flight at the same time must differ). Every
//! collective on a transport takes its number from the one communicator that
//! drives it (`transport_communicator`), which also hands numbers to
//! collectives written outside it (`next_sequence`), so no two ever share one.
inline constexpr std::uint64_t seq_mask = (std::uint64_t{1} << 24) - 1;

//! Tag for step `step` (< 2^16) of collective number `seq` (wraps at 2^32).
constexpr tag_t make_tag(std::uint64_t seq, std::uint32_t step) noexcept {
  return ((seq & 0xffffffffu) << 16 | (step & 0xffffu)) & tag_mask;
}

//! The highest step a collective may give `make_tag`: steps 0xfffe and
//! 0xffff are reserved (a transport's wire-up handshake, point-to-point
//! messages).
inline constexpr std::uint32_t max_collective_step = 0xfffd;
//! Most ranks the collectives support: a ring allreduce numbers its
//! 2 (n − 1) reduce-scatter and allgather steps apart, all at most
//! `max_collective_step`, so that no two steps of one collective, and no
//! reserved step, share a tag.
inline constexpr int max_collective_ranks = 0x7fff;
static_assert(2 * (max_collective_ranks - 1) <= static_cast<int>(max_collective_step));

//! Refuses a transport of more ranks than the collectives support (or
//! none), naming `who` (the collective's owner) in the error.
//! @throws std::invalid_argument when `size` is outside [1, max_collective_ranks].
inline void check_rank_count(int size, std::string_view who) {
  EBBFLOW_ENFORCE(size >= 1 && size <= max_collective_ranks,
                  who << ": " << size << " ranks; the collectives support 1 to " << max_collective_ranks);
}

template <class T>
concept transport = requires(T& t, const T& ct, int peer, tag_t tag, std::span<const std::byte> out,
                             std::span<std::byte> in, typename T::request& req, deadline d, std::error_code& ec) {
  typename T::request;
  { ct.rank() } -> std::convertible_to<int>;
  { ct.size() } -> std::convertible_to<int>;
  { ct.generation() } -> std::convertible_to<std::int64_t>;
  //! Posts a send / receive; never blocks.
  { t.isend(peer, tag, out) } -> std::same_as<typename T::request>;
  { t.irecv(peer, tag, in) } -> std::same_as<typename T::request>;
  //! Progresses; true once `req` completed (then `ec` holds its outcome).
  { t.test(req, ec) } -> std::same_as<bool>;
  //! Blocks until `req` completed or `d` passed (`errc::timeout`).
  t.wait(req, d, ec);
};

namespace detail {
//! `base`, followed by what failed request `r` says about its failure (see
//! `error_detail` above), when its transport tells.
template <class Request>
std::string describe(const Request& r, std::string base) {
  if constexpr (requires {
                  { r.error_detail() } -> std::convertible_to<std::string>;
                }) {
    if (std::string why = r.error_detail(); !why.empty()) base += "; " + why;
  }
  return base;
}

//! Waits for `r` until `d`. @throws system_error naming rank, peer,
//! generation, `operation` and the size of the transfer.
template <transport T>
void finish(T& t, typename T::request& r, int peer, const char* operation, std::size_t bytes, deadline d) {
  std::error_code ec;
  t.wait(r, d, ec);
  if (ec)
    throw_if(ec, {.rank = t.rank(),
                  .generation = t.generation(),
                  .peer = peer,
                  .operation = operation,
                  .detail = describe(r, std::to_string(bytes) + " bytes")});
}
}  // namespace detail

//! Blocking send with a deadline. @throws system_error naming rank, peer, generation.
template <transport T>
void send(T& t, int peer, tag_t tag, std::span<const std::byte> data, deadline d) {
  auto r = t.isend(peer, tag, data);
  detail::finish(t, r, peer, "send", data.size(), d);
}

//! Blocking receive with a deadline. @throws system_error naming rank, peer, generation.
template <transport T>
void recv(T& t, int peer, tag_t tag, std::span<std::byte> data, deadline d) {
  auto r = t.irecv(peer, tag, data);
  detail::finish(t, r, peer, "recv", data.size(), d);
}

}  // namespace comm
EBBFLOW_END_NAMESPACE
