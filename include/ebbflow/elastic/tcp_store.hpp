// SPDX-License-Identifier: Apache-2.0
//! @file tcp_store.hpp
//! The rendezvous store: a small key-value server over Boost.Asio that a job
//! embeds (or runs standalone with `ebbflow-store`), and its client. In the
//! spirit of PyTorch's c10d TCPStore. It holds membership, UCX worker
//! addresses and heartbeats of an elastic job.
//!
//! Keys and values are arbitrary byte strings (`std::string` is binary-safe).
//! Counters made by `add` are stored as decimal text.
//!
//! Security: every connection proves the job token (a shared secret, from
//! `EBBFLOW_TOKEN` or passed in) with an HMAC-SHA256 challenge-response; the
//! secret never crosses the wire and the server proves it too. A client with
//! a wrong or missing token gets `errc::unauthorized` and is disconnected.
//! Frames are length-prefixed with a maximum size; malformed, truncated or
//! oversized frames, unknown opcodes and clients that stall mid-frame are
//! answered with an error naming the problem, logged, and disconnected
//! without affecting other clients. Traffic is plaintext unless the server
//! has a certificate (`server_options::tls`): then it is TLS (Boost.Asio ssl
//! over OpenSSL), optionally with client certificates (mutual TLS), the HMAC
//! challenge still on top; such a store refuses plaintext clients with an
//! error that says it needs TLS.
//!
//! Requires the `ebbflow::asio` CMake component (Boost headers + OpenSSL).
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/elastic/detail/store_protocol.hpp>
#include <ebbflow/elastic/store_options.hpp>

// Only named here; the definitions include it.
namespace boost::asio {
class io_context;
}  // namespace boost::asio

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

namespace detail {
class server_impl;
class client_connection;
}  // namespace detail

//! The store's server. Owns the key-value map; all state lives on one
//! strand, so handlers never race. Server-side `wait`/`get` block no thread:
//! they complete when a `set`/`add`/`compare_set` provides the last key or
//! their timeout passes.
//!
//! Thread safety: the member functions may be called from any thread.
class store_server {
 public:
  //! Binds and starts serving on a thread of its own.
  //! @throws system_error when the address cannot be bound; std::invalid_argument for bad options.
  explicit store_server(server_options opts = {});
  //! Binds and serves on `ioc`, which the caller runs (any number of threads).
  //! `ioc` must outlive this object.
  store_server(boost::asio::io_context& ioc, server_options opts);
  //! Stops serving and closes every connection (clients see `errc::peer_lost`). Blocks until
  //! the own thread, if any, has exited.
  ~store_server();
  store_server(const store_server&) = delete;
  store_server& operator=(const store_server&) = delete;

  //! The bound port (the chosen one when `port` was 0).
  [[nodiscard]] std::uint16_t port() const noexcept { return port_; }
  //! The bound address as given in the options.
  [[nodiscard]] const std::string& host() const noexcept { return host_; }
  //! "host:port" ("tcp+tls://host:port" with TLS), suitable for `EBBFLOW_STORE`.
  [[nodiscard]] std::string address() const;
  //! A snapshot of the counters (relaxed reads; never blocks).
  [[nodiscard]] server_stats stats() const noexcept;
  //! Stops accepting and closes all connections; idempotent, non-blocking.
  void stop() noexcept;

 private:
  std::unique_ptr<boost::asio::io_context> own_ioc_;
  std::shared_ptr<detail::server_impl> impl_;
  std::thread thread_;
  std::string host_;
  std::uint16_t port_ = 0;
};

//! A stream of changes to keys under a prefix, on its own connection.
//! Not thread-safe: use one watcher from one thread at a time.
class store_watcher {
 public:
  //! Takes over the connection of the source, which must not be used afterwards.
  store_watcher(store_watcher&&) noexcept;
  //! Closes this watcher's connection and takes over the source's.
  store_watcher& operator=(store_watcher&&) noexcept;
  ~store_watcher();

  //! Blocks until the next change or `d`. A timeout leaves the watcher usable.
  //! @throws system_error: errc::timeout, errc::peer_lost (server gone), errc::bad_message.
  store_event next(deadline d);
  //! As above; on error returns an empty event and sets `ec`.
  store_event next(deadline d, std::error_code& ec) noexcept;

 private:
  friend class store_client;
  explicit store_watcher(std::unique_ptr<detail::client_connection> c);
  std::unique_ptr<detail::client_connection> conn_;
};

//! A connection to a `store_server`. Connects lazily (retrying a refused
//! connection until the call's deadline, so ranks may start before the
//! store), and reconnects on the next call after the connection broke.
//! A call whose deadline passes closes the connection, so a late reply can
//! never be taken for the reply of a later call.
//!
//! Every call has a deadline: the one given, or now + `client_options::timeout`.
//! Errors (`ec` forms; the throwing forms raise `ebbflow::system_error` with
//! operation "store.<call>"): `errc::timeout`, `errc::unauthorized` (wrong
//! token), `errc::peer_lost` (server gone or connection lost mid-call),
//! `errc::bad_message` (a malformed or oversized frame), `errc::invalid_state`
//! (`add` on a non-integer value).
//!
//! Thread safety: all calls may be made from any thread; they are serialised
//! on the one connection (use one client per thread for parallel calls).
class store_client {
 public:
  //! Does not connect yet. @throws std::invalid_argument for an empty host.
  store_client(std::string host, std::uint16_t port, std::string token, client_options opts = {});
  //! From `EBBFLOW_STORE` (or `MASTER_ADDR`/`MASTER_PORT`), `EBBFLOW_TOKEN` and
  //! `EBBFLOW_STORE_TIMEOUT_MS` (see `launch_info`); a `tcp+tls://` address
  //! turns TLS on with `EBBFLOW_TLS_CA`, `EBBFLOW_TLS_CERT`, `EBBFLOW_TLS_KEY`.
  //! @throws std::invalid_argument when no store address is set, it is an
  //! etcd address (see elastic/any_store.hpp), or values are malformed.
  static store_client from_environment();
  //! Takes over the connection of the source, which must not be used afterwards.
  store_client(store_client&&) noexcept;
  //! Closes this client's connection and takes over the source's.
  store_client& operator=(store_client&&) noexcept;
  ~store_client();

  //! Connects and authenticates now (otherwise the first call does).
  void connect(deadline d);
  //! As above; errors in `ec`.
  void connect(deadline d, std::error_code& ec) noexcept;

  //! Stores `value` under `key`, waking waiters and watchers.
  void set(std::string_view key, std::string_view value);
  //! As above, by deadline `d`.
  void set(std::string_view key, std::string_view value, deadline d);
  //! As above; errors in `ec`.
  void set(std::string_view key, std::string_view value, std::error_code& ec) noexcept;
  //! As above, by deadline `d`; errors in `ec`.
  void set(std::string_view key, std::string_view value, deadline d, std::error_code& ec) noexcept;

  //! The value of `key`, waiting (server-side) until it is set or `d` passes (errc::timeout).
  std::string get(std::string_view key);
  //! As above, by deadline `d`.
  std::string get(std::string_view key, deadline d);
  //! As above; on error sets `ec` and returns an empty string.
  std::string get(std::string_view key, std::error_code& ec) noexcept;
  //! As above, by deadline `d`; on error sets `ec` and returns an empty string.
  std::string get(std::string_view key, deadline d, std::error_code& ec) noexcept;

  //! The value of `key`, or nullopt when it is not set. Does not wait.
  std::optional<std::string> try_get(std::string_view key);
  //! As above, by deadline `d`.
  std::optional<std::string> try_get(std::string_view key, deadline d);
  //! As above; on error sets `ec` and returns nullopt.
  std::optional<std::string> try_get(std::string_view key, std::error_code& ec) noexcept;
  //! As above, by deadline `d`; on error sets `ec` and returns nullopt.
  std::optional<std::string> try_get(std::string_view key, deadline d, std::error_code& ec) noexcept;

  //! Atomically adds `delta` to the integer at `key` (missing: 0) and returns the result.
  std::int64_t add(std::string_view key, std::int64_t delta);
  //! As above, by deadline `d`.
  std::int64_t add(std::string_view key, std::int64_t delta, deadline d);
  //! As above; on error sets `ec` and returns 0.
  std::int64_t add(std::string_view key, std::int64_t delta, std::error_code& ec) noexcept;
  //! As above, by deadline `d`; on error sets `ec` and returns 0.
  std::int64_t add(std::string_view key, std::int64_t delta, deadline d, std::error_code& ec) noexcept;

  //! `add(keys[i], deltas[i])` for every i, pipelined: all requests leave in
  //! one write and the replies come back in order, so a batch costs about one
  //! round trip. Each add is atomic; the batch as a whole is not (other
  //! clients' calls may interleave). Returns the values after each add.
  //! @throws std::invalid_argument when the spans differ in length; a
  //! system_error as `add` (naming the first key that failed).
  std::vector<std::int64_t> add_many(std::span<const std::string> keys, std::span<const std::int64_t> deltas,
                                     deadline d);
  //! As above; on error sets `ec` and returns the values of the adds that
  //! completed before it (the rest may or may not have been applied).
  std::vector<std::int64_t> add_many(std::span<const std::string> keys, std::span<const std::int64_t> deltas,
                                     deadline d, std::error_code& ec);

  //! `try_get(keys[i])` for every i, pipelined as `add_many`: about one
  //! round trip for the batch. @throws system_error as `try_get` (naming the
  //! first key that failed).
  std::vector<std::optional<std::string>> try_get_many(std::span<const std::string> keys, deadline d);
  //! As above; on error sets `ec` and returns the values read before it.
  std::vector<std::optional<std::string>> try_get_many(std::span<const std::string> keys, deadline d,
                                                       std::error_code& ec);

  //! Atomically stores `desired` if the value is `expected` (a missing key
  //! matches an empty `expected`), and returns what is stored now.
  compare_set_result compare_set(std::string_view key, std::string_view expected, std::string_view desired);
  //! As above, by deadline `d`.
  compare_set_result compare_set(std::string_view key, std::string_view expected, std::string_view desired, deadline d);
  //! As above; on error sets `ec` and returns an empty result.
  compare_set_result compare_set(std::string_view key, std::string_view expected, std::string_view desired,
                                 std::error_code& ec) noexcept;
  //! As above, by deadline `d`; on error sets `ec` and returns an empty result.
  compare_set_result compare_set(std::string_view key, std::string_view expected, std::string_view desired, deadline d,
                                 std::error_code& ec) noexcept;

  //! Blocks until every key in `keys` is set, or `d` passes (errc::timeout).
  //! The server waits; the client does not poll.
  void wait(const std::vector<std::string>& keys, deadline d);
  //! As above; errors in `ec`.
  void wait(const std::vector<std::string>& keys, deadline d, std::error_code& ec) noexcept;

  //! Blocks until any key in `keys` is set, or `d` passes (errc::timeout);
  //! returns the index of the first one set, in the order of `keys`. The
  //! server waits; the client does not poll.
  //! @throws std::invalid_argument when `keys` is empty.
  std::size_t wait_any(const std::vector<std::string>& keys, deadline d);
  //! As above; errors in `ec` (an empty `keys` is the server's bad_message).
  std::size_t wait_any(const std::vector<std::string>& keys, deadline d, std::error_code& ec) noexcept;

  //! True when every key in `keys` is set. Does not wait.
  bool check(const std::vector<std::string>& keys);
  //! As above; on error sets `ec` and returns false.
  bool check(const std::vector<std::string>& keys, std::error_code& ec) noexcept;

  //! Removes `key`; returns whether it existed.
  bool erase(std::string_view key);
  //! As above; on error sets `ec` and returns false.
  bool erase(std::string_view key, std::error_code& ec) noexcept;

  //! Number of keys stored.
  std::int64_t num_keys();
  //! As above; on error sets `ec` and returns 0.
  std::int64_t num_keys(std::error_code& ec) noexcept;

  //! One round trip (liveness, latency).
  void ping(deadline d);
  //! As above; errors in `ec`.
  void ping(deadline d, std::error_code& ec) noexcept;

  //! Opens a new connection that streams every change to keys starting with
  //! `prefix`; with `include_existing` it first reports the keys already set
  //! (as `set` events, in unspecified order).
  store_watcher watch(std::string_view prefix, bool include_existing, deadline d);
  //! As above; on error sets `ec` and returns a watcher whose connection is
  //! closed (do not use it).
  store_watcher watch(std::string_view prefix, bool include_existing, deadline d, std::error_code& ec) noexcept;

  //! Drops the connection (the next call reconnects).
  void close() noexcept;

  //! The server's reason for the last failed call (e.g. "wait: 1 of 3 keys still
  //! missing after 100 ms: 'b'"), or the local one; empty after a success.
  [[nodiscard]] std::string last_error_detail() const;
  //! The server host given at construction.
  [[nodiscard]] const std::string& host() const noexcept { return host_; }
  //! The server port given at construction.
  [[nodiscard]] std::uint16_t port() const noexcept { return port_; }

 private:
  [[nodiscard]] deadline default_deadline() const noexcept { return deadline::after(opts_.timeout); }
  //! One request/reply exchange; `waits`: the server may hold the reply until `d`.
  detail::proto::decode_result call(std::string frame, deadline d, bool waits, std::error_code& ec) noexcept;
  template <class Frame, class Reply>
  void pipelined(const char* what, std::span<const std::string> keys, Frame&& frame, Reply&& reply, deadline d,
                 std::error_code& ec);
  [[noreturn]] void raise(const char* operation, std::string_view key, std::error_code ec) const;
  std::string host_;
  std::uint16_t port_ = 0;
  std::string token_;
  client_options opts_;
  std::unique_ptr<detail::client_connection> conn_;
};

//! A process's open-file limits (RLIMIT_NOFILE).
struct open_file_limit {
  std::uint64_t soft = 0;  //!< the limit in force
  std::uint64_t hard = 0;  //!< how far an unprivileged process may raise it
};
//! Raises this process's soft open-file limit to its hard limit and returns
//! the limits from before (zeros if they cannot be read). A store
//! serving N workers holds about 3 N sockets, and the usual soft limit (1024)
//! stops it near 340 workers. `ebbflow-run` and `ebbflow-store` call it at
//! start; `ebbflow-run` starts its workers with the old soft limit.
open_file_limit raise_open_file_limit() noexcept;

}  // namespace elastic
EBBFLOW_END_NAMESPACE

#include <ebbflow/elastic/impl/store_server.hpp>
#include <ebbflow/elastic/impl/store_client.hpp>

#if !EBBFLOW_HEADER_ONLY
// The library instantiates the work stealing the group does on this store.
#include <ebbflow/plan/work_stealing.hpp>
EBBFLOW_BEGIN_NAMESPACE
extern template class plan::work_stealer<elastic::store_client>;
EBBFLOW_END_NAMESPACE
// ...and the group over this store and UCX (elastic/group.hpp).
#if EBBFLOW_HAS_UCX
#include <ebbflow/elastic/group.hpp>
#include <ebbflow/elastic/ucx_network.hpp>
EBBFLOW_BEGIN_NAMESPACE
extern template class elastic::detail::group_impl<elastic::store_client, elastic::ucx_network>;
EBBFLOW_END_NAMESPACE
#endif
#endif
