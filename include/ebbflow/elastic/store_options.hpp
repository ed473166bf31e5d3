// SPDX-License-Identifier: Apache-2.0
//! @file store_options.hpp
//! The value types of the TCP rendezvous store (elastic/tcp_store.hpp): the
//! server's and the client's options, the server's counters, and the results
//! a client returns. Needs no Boost.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/elastic/detail/store_protocol.hpp>  // default_max_message_bytes

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

//! Configuration of a `store_server`.
struct server_options {
  std::string host = "127.0.0.1";  //!< address to bind ("0.0.0.0" / "::" for any)
  std::uint16_t port = 0;          //!< 0: pick a free port (see `store_server::port()`)
  std::string token;               //!< job secret clients must prove; empty: the empty token
  std::size_t max_message_bytes = detail::proto::default_max_message_bytes;  //!< frame limit
  //! A frame whose first byte arrived must be complete within this time
  //! (slow-loris defence); idle authenticated connections are kept.
  std::chrono::milliseconds frame_timeout{10000};
  //! A new connection must authenticate within this time.
  std::chrono::milliseconds auth_timeout{10000};
  std::size_t max_connections = 4096;  //!< further connections get an error and are closed
  //! Per connection: unsent replies/events beyond this close the connection
  //! (a watcher that does not read).
  std::size_t max_pending_output_bytes = std::size_t{64} << 20;

  //! Defaults plus `token` from `EBBFLOW_TOKEN`.
  static server_options from_environment();
};

//! Counters of a running server (read with relaxed atomics; for tests and logs).
struct server_stats {
  std::uint64_t accepted = 0;         //!< connections accepted
  std::uint64_t unauthorized = 0;     //!< connections refused for a bad token
  std::uint64_t protocol_errors = 0;  //!< connections closed for a malformed frame or a stall
  std::uint64_t open = 0;             //!< connections open now
};

//! Configuration of a `store_client`.
struct client_options {
  //! Deadline of calls that are not given one.
  std::chrono::milliseconds timeout{30000};
  //! Largest reply accepted.
  std::size_t max_message_bytes = detail::proto::default_max_message_bytes;
  //! Defaults plus `timeout` from `EBBFLOW_STORE_TIMEOUT_MS`.
  //! @throws std::invalid_argument for a malformed value.
  static client_options from_environment();
};

//! Result of `compare_set`.
struct compare_set_result {
  bool swapped = false;  //!< the desired value was stored
  std::string current;   //!< the value stored now
};

//! A change seen by a `store_watcher`.
struct store_event {
  //! What happened to the key.
  enum class kind { set, erase };
  kind type = kind::set;  //!< set (or initial report) or erase
  std::string key;        //!< the key that changed
  std::string value;      //!< the new value (empty for erase)
};

}  // namespace elastic
EBBFLOW_END_NAMESPACE
