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
#include <string_view>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

//! TLS on the server side (`server_options::tls`): enabled when `cert_file`
//! is set. A TLS store refuses plaintext clients with an error that says so.
struct server_tls_options {
  std::string cert_file;  //!< PEM certificate chain the store presents; empty: plaintext
  std::string key_file;   //!< PEM private key of `cert_file`
  //! PEM CA that signs client certificates: with it, a client certificate
  //! that is presented must verify; empty: client certificates are not asked for.
  std::string ca_file;
  bool require_client_cert = false;  //!< mutual TLS: refuse clients without a certificate (needs `ca_file`)
  //! True when TLS is configured.
  [[nodiscard]] bool enabled() const noexcept { return !cert_file.empty(); }
};

//! TLS on the client side (`client_options::tls`, and the etcd backend's).
//! The job token's HMAC challenge still runs on top of it.
struct tls_options {
  bool enabled = false;     //!< talk TLS (tcp+tls:// and etcds:// addresses set it)
  std::string ca_file;      //!< EBBFLOW_TLS_CA: PEM CA that signs the server's certificate; empty: the system's
  std::string cert_file;    //!< EBBFLOW_TLS_CERT: client certificate for mutual TLS (with `key_file`)
  std::string key_file;     //!< EBBFLOW_TLS_KEY: its private key
  std::string server_name;  //!< EBBFLOW_TLS_SERVER_NAME: the name the server's certificate must carry; empty: the host
  //! `enabled` as given, the files and name from the variables above.
  static tls_options from_environment(bool enabled);
};

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
  //! TLS (off unless `tls.cert_file` is set).
  server_tls_options tls;
  //! With TLS: a client that sends nothing for this long after connecting is
  //! taken for a plaintext client (which waits for the server to speak
  //! first) and gets a plaintext error frame saying that the store needs TLS.
  std::chrono::milliseconds tls_hello_timeout{2000};

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
  //! TLS to the server (off by default; a tcp+tls:// address turns it on).
  tls_options tls;
  //! Defaults plus `timeout` from `EBBFLOW_STORE_TIMEOUT_MS`.
  //! @throws std::invalid_argument for a malformed value.
  static client_options from_environment();
};

//! A store address, as `EBBFLOW_STORE` gives it; the scheme picks the backend:
//! | address | backend |
//! |---|---|
//! | `host:port`, `tcp://host:port` | the embedded store (`store_client`), plaintext |
//! | `tcp+tls://host:port` | the embedded store over TLS |
//! | `etcd://h1:p1,h2:p2[/prefix]` | etcd (`etcd_store`), plaintext, any of the endpoints |
//! | `etcds://h1:p1,...[/prefix]` | etcd over TLS |
//! An IPv6 host is written in brackets (`[::1]:2379`). The etcd prefix, when
//! given, is put before every key (several jobs can share one etcd).
struct store_address {
  //! Which backend and whether TLS.
  enum class kind { tcp, tcp_tls, etcd, etcds };
  //! One host and port.
  struct endpoint {
    std::string host;        //!< name or address, without brackets
    std::uint16_t port = 0;  //!< TCP port
  };
  kind scheme = kind::tcp;           //!< the backend
  std::vector<endpoint> endpoints;   //!< one for tcp, one or more for etcd
  std::string prefix;                //!< etcd only: key prefix from the path ("" or "job/")
  //! True for tcp+tls:// and etcds://.
  [[nodiscard]] bool tls() const noexcept { return scheme == kind::tcp_tls || scheme == kind::etcds; }
  //! True for etcd:// and etcds://.
  [[nodiscard]] bool etcd() const noexcept { return scheme == kind::etcd || scheme == kind::etcds; }
  //! The address written back (tcp+tls://h:p, etcd://a:1,b:2/prefix).
  [[nodiscard]] std::string str() const;
  //! Parses `text`. @throws std::invalid_argument naming `what` and the text
  //! for an unknown scheme, a missing or bad port, or no endpoint.
  static store_address parse(std::string_view text, std::string_view what = "EBBFLOW_STORE");
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

#include <ebbflow/elastic/impl/store_options.hpp>
