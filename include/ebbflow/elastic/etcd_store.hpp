// SPDX-License-Identifier: Apache-2.0
//! @file etcd_store.hpp
//! `etcd_store`: the rendezvous store on etcd v3 (a replicated store for jobs
//! across machines), through etcd's v3 JSON gateway over HTTP (Boost.Beast;
//! docs/store.md says why this route). Models `kv_store` with the optional
//! batched operations and `wait_any`, like `store_client`.
//!
//! Every operation maps to etcd's own primitives; there is no consensus of
//! ebbflow's own:
//! * `set`, `try_get`, `erase`: put, range, delete-range (linearizable).
//! * `add`: a transaction that compares the key's mod_revision with the one
//!   last seen and puts the sum (retried on a lost race); `compare_set`: a
//!   transaction comparing the value (an empty `expected` compares the
//!   key's absence).
//! * `add_many`, `try_get_many`: one transaction per 128 keys (etcd's
//!   default `--max-txn-ops`).
//! * `wait`, `wait_any`, `get`: a watch of the keys from now, then a read
//!   at revision R; events up to R are skipped (no event can slip in
//!   between or count twice). The watch stays open while the same keys are
//!   waited for again, so a caller that waits in slices costs no round trip
//!   per slice.
//! * Endpoints: any number (`etcd://h1:2379,h2:2379,h3:2379`); a call goes to
//!   the current one and moves to the next when it cannot connect, the
//!   connection breaks, etcd has no leader or an attempt takes longer than
//!   `attempt_timeout`. Reads, `set`, `erase` and waits are retried there
//!   until the call's deadline. An `add` whose answer was
//!   lost is not retried (it may have been applied): `errc::peer_lost`, as
//!   the embedded store. A `compare_set` whose answer was lost is retried and
//!   reports `swapped` when the key then holds `desired`.
//! * TLS (`etcds://`): the server is verified against `tls.ca_file`; a client
//!   certificate is presented when set (etcd's `--client-cert-auth`).
//! Errors: `errc::timeout` (the deadline passed, e.g. while etcd has lost its
//! quorum), `errc::peer_lost` (no endpoint answered), `errc::unauthorized`
//! (TLS refused, in words), `errc::bad_message` (an answer that is not
//! etcd's), `errc::invalid_state` (`add` on a non-integer value).
//! Thread safety: as `store_client`: calls are serialised on one client.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/elastic/store_options.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

namespace detail {
class etcd_client;
}  // namespace detail

//! Configuration of an `etcd_store`.
struct etcd_options {
  std::vector<store_address::endpoint> endpoints;  //!< etcd client URLs' hosts and ports (one or more)
  std::string prefix;                              //!< put before every key ("job7/"); several jobs can share etcd
  tls_options tls;                                 //!< etcds://: TLS to etcd
  std::chrono::milliseconds timeout{30000};        //!< deadline of calls that are not given one
  //! A connection attempt to one endpoint gives up after this (then the next
  //! endpoint is tried), so an endpoint that does not answer cannot eat a
  //! whole deadline.
  std::chrono::milliseconds connect_timeout{1000};
  //! One request to one endpoint waits at most this long before it is sent
  //! to the next (reads, `set`, waits) or reported as a timeout whose
  //! outcome is unknown (`add`): an election after the leader's death takes
  //! about etcd's election timeout (default 1 s), while a proposal held by a
  //! follower during it waits for etcd's request timeout (7 s).
  std::chrono::milliseconds attempt_timeout{1500};
  //! From an etcd:// or etcds:// address; `tls` from EBBFLOW_TLS_* for etcds://.
  //! @throws std::invalid_argument for an address of another backend.
  static etcd_options from_address(const store_address& a);
};

//! The etcd backend; see the file comment.
class etcd_store {
 public:
  //! Outcome of `compare_set`.
  using cas_result = compare_set_result;

  //! Does not connect yet. @throws std::invalid_argument for no endpoints or bad TLS files.
  explicit etcd_store(etcd_options opts);
  //! From `EBBFLOW_STORE` (etcd://... or etcds://...), `EBBFLOW_STORE_TIMEOUT_MS`, `EBBFLOW_TLS_*`.
  //! @throws std::invalid_argument when the address is not an etcd one.
  static etcd_store from_environment();
  //! Takes over the source's connections; the source must not be used afterwards.
  etcd_store(etcd_store&&) noexcept;
  //! Closes this store's connections and takes over the source's.
  etcd_store& operator=(etcd_store&&) noexcept;
  ~etcd_store();

  //! Stores `value` under `key`.
  void set(std::string_view key, std::string_view value, deadline d);
  //! As above; errors in `ec`.
  void set(std::string_view key, std::string_view value, deadline d, std::error_code& ec) noexcept;
  //! The value of `key`, waiting (by a watch) until it is set or `d` passes.
  std::string get(std::string_view key, deadline d);
  //! As above; on error sets `ec` and returns "".
  std::string get(std::string_view key, deadline d, std::error_code& ec) noexcept;
  //! The value of `key`, or nullopt. Does not wait for it.
  std::optional<std::string> try_get(std::string_view key, deadline d);
  //! As above; on error sets `ec` and returns nullopt.
  std::optional<std::string> try_get(std::string_view key, deadline d, std::error_code& ec) noexcept;
  //! Atomically adds `delta` to the decimal integer under `key` (absent: 0); returns the sum.
  std::int64_t add(std::string_view key, std::int64_t delta, deadline d);
  //! As above; on error sets `ec` and returns 0.
  std::int64_t add(std::string_view key, std::int64_t delta, deadline d, std::error_code& ec) noexcept;
  //! `add` for each key, one transaction per 128 keys (each transaction is atomic).
  //! @throws std::invalid_argument when the spans differ in length.
  std::vector<std::int64_t> add_many(std::span<const std::string> keys, std::span<const std::int64_t> deltas,
                                     deadline d);
  //! As above; errors in `ec` (the values of the transactions that completed).
  std::vector<std::int64_t> add_many(std::span<const std::string> keys, std::span<const std::int64_t> deltas,
                                     deadline d, std::error_code& ec);
  //! `try_get` for each key, one transaction per 128 keys.
  std::vector<std::optional<std::string>> try_get_many(std::span<const std::string> keys, deadline d);
  //! As above; errors in `ec`.
  std::vector<std::optional<std::string>> try_get_many(std::span<const std::string> keys, deadline d,
                                                       std::error_code& ec);
  //! Stores `desired` if the value is `expected` (an empty `expected` matches an absent key).
  compare_set_result compare_set(std::string_view key, std::string_view expected, std::string_view desired,
                                 deadline d);
  //! As above; errors in `ec`.
  compare_set_result compare_set(std::string_view key, std::string_view expected, std::string_view desired,
                                 deadline d, std::error_code& ec) noexcept;
  //! Blocks until every key in `keys` is set, or `d` passes (errc::timeout).
  void wait(const std::vector<std::string>& keys, deadline d);
  //! As above; errors in `ec`.
  void wait(const std::vector<std::string>& keys, deadline d, std::error_code& ec) noexcept;
  //! Blocks until any key is set; the index of the first set, in the order of `keys`.
  //! @throws std::invalid_argument when `keys` is empty.
  std::size_t wait_any(const std::vector<std::string>& keys, deadline d);
  //! As above; errors in `ec`.
  std::size_t wait_any(const std::vector<std::string>& keys, deadline d, std::error_code& ec) noexcept;
  //! True when every key is set. Does not wait.
  bool check(const std::vector<std::string>& keys, deadline d);
  //! Removes `key`; whether it existed.
  bool erase(std::string_view key);
  //! As above, by `d`; errors in `ec`.
  bool erase(std::string_view key, deadline d, std::error_code& ec) noexcept;
  //! Number of keys under the prefix.
  std::int64_t num_keys(deadline d);
  //! One round trip to the current endpoint (its status).
  void ping(deadline d);
  //! As above; errors in `ec`.
  void ping(deadline d, std::error_code& ec) noexcept;
  //! Drops the connections (the next call connects anew).
  void close() noexcept;

  //! Why the last call failed, in words; empty after a success.
  [[nodiscard]] std::string last_error_detail() const;
  //! The endpoint calls go to now ("host:port").
  [[nodiscard]] std::string current_endpoint() const;
  //! The options given.
  [[nodiscard]] const etcd_options& options() const noexcept;

 private:
  [[noreturn]] void raise(const char* operation, std::string_view key, std::error_code ec) const;
  std::unique_ptr<detail::etcd_client> c_;
  etcd_options opts_;
};

}  // namespace elastic
EBBFLOW_END_NAMESPACE

#include <ebbflow/elastic/impl/etcd_store.hpp>
