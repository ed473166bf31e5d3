// SPDX-License-Identifier: Apache-2.0
//! @file network.hpp
//! The `network` concept: what builds the transport of each generation of an
//! elastic group. The UCX network (elastic/ucx_network.hpp) and the loopback
//! network (elastic/loopback_network.hpp) model it.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/comm/transport.hpp>
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/elastic/kv_store.hpp>  // bytes

#include <concepts>
#include <cstdint>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

//! A network builds the transport of each generation. `prepare(g)` creates
//! this process's endpoint for generation g and returns its address (the
//! group publishes it in the store); `connect(g, rank, addresses, d)` returns
//! the transport of generation g given every member's address in rank order.
//!
//! Optional members, found by the group when present:
//! * `static bool stable_address()`: true when `prepare` returns the same
//!   address for every generation; the group publishes it once.
//! * `start_connect(g, rank, addresses)` returning a transport whose wire-up
//!   completes in the background (its `poll_connect()`): the group then
//!   connects to joiners while it keeps training and switches once every
//!   member is wired up (docs/elastic.md, "Join without suspension").
//! * `bool concurrent_connect()`: true when `start_connect` may run on the
//!   group's admission helper thread while the training thread uses the
//!   current generation's transport on the same network.
//! * `discard_endpoints()`: for a network whose consecutive generations
//!   share connections; called when a generation failed, so the recovered
//!   one opens its own.
template <class N>
concept network = requires(N& n, std::int64_t g, int rank, const std::vector<bytes>& addrs, deadline d) {
  typename N::transport_type;
  requires comm::transport<typename N::transport_type>;
  { n.prepare(g) } -> std::convertible_to<bytes>;
  { n.connect(g, rank, addrs, d) } -> std::same_as<typename N::transport_type>;
};

namespace detail {
//! Whether `N` publishes one address for every generation.
template <class N>
constexpr bool stable_address() {
  if constexpr (requires {
                  { N::stable_address() } -> std::convertible_to<bool>;
                })
    return N::stable_address();
  else
    return false;
}

//! Whether `N` can wire up a generation's transport in the background.
template <class N>
constexpr bool can_preconnect() {
  return requires(N & n, std::int64_t g, int rank, const std::vector<bytes>& addrs, typename N::transport_type& t) {
    { n.start_connect(g, rank, addrs) } -> std::same_as<typename N::transport_type>;
    { t.poll_connect() } -> std::convertible_to<bool>;
  };
}

//! Whether `n`'s start_connect may run on a helper thread while the current
//! generation trains on the same network (ucx_network on a UCX with threads).
template <class N>
bool concurrent_connect(const N& n) {
  if constexpr (requires {
                  { n.concurrent_connect() } -> std::convertible_to<bool>;
                })
    return n.concurrent_connect();
  else
    return false;
}
}  // namespace detail

}  // namespace elastic
EBBFLOW_END_NAMESPACE
