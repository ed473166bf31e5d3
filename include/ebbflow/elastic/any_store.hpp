// SPDX-License-Identifier: Apache-2.0
//! @file any_store.hpp
//! `any_store`: a rendezvous store whose backend is chosen at run time from
//! the store address, so that one program runs on every backend unchanged:
//!
//! | `EBBFLOW_STORE` | backend |
//! |---|---|
//! | `host:port` | the embedded store (`store_client`, elastic/tcp_store.hpp) |
//! | `tcp+tls://host:port` | the embedded store over TLS (`EBBFLOW_TLS_CA`, `_CERT`, `_KEY`) |
//! | `etcd://h1:2379,h2:2379,h3:2379[/prefix]` | etcd (`etcd_store`, elastic/etcd_store.hpp) |
//! | `etcds://...` | etcd over TLS |
//!
//! @code
//!   el::group<el::any_store, el::ucx_network> g(
//!       [] { return std::make_unique<el::any_store>(el::any_store::from_environment()); }, net, opts,
//!       ef::launch_info::from_environment(), std::make_unique<el::planner_policy>());
//! @endcode
//!
//! It models `kv_store` and offers the optional operations the group uses
//! (`add_many`, `try_get_many`, `wait_any`, `erase`), with one virtual call
//! per operation (the store is the control path: a call costs a network
//! round trip, the virtual call nothing by comparison). Any other model of
//! `kv_store` can be wrapped too (`any_store(memory_store{})`); operations
//! it lacks are done one key at a time.
//! Errors: as the backend's (`ebbflow::system_error` with errc::timeout,
//! peer_lost, unauthorized, bad_message, invalid_state); each call has a
//! throwing form and an `std::error_code&` form.
//! Thread safety: as the backend's (one client per thread for parallel calls).
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/elastic/detail/store_ops.hpp>
#include <ebbflow/elastic/etcd_store.hpp>
#include <ebbflow/elastic/kv_store.hpp>
#include <ebbflow/elastic/store_options.hpp>
#include <ebbflow/elastic/tcp_store.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

namespace detail {
//! The operations `any_store` forwards (one virtual call each).
struct any_store_iface {
  virtual ~any_store_iface() = default;
  virtual void set(const std::string& k, std::string_view v, deadline d) = 0;
  virtual std::optional<std::string> try_get(const std::string& k, deadline d) = 0;
  virtual std::int64_t add(const std::string& k, std::int64_t delta, deadline d) = 0;
  virtual compare_set_result compare_set(const std::string& k, std::string_view expected, std::string_view desired,
                                         deadline d) = 0;
  virtual void wait(const std::vector<std::string>& keys, deadline d) = 0;
  virtual std::size_t wait_any(const std::vector<std::string>& keys, deadline d) = 0;
  virtual std::vector<std::int64_t> add_many(std::span<const std::string> keys, std::span<const std::int64_t> deltas,
                                             deadline d) = 0;
  virtual std::vector<std::optional<std::string>> try_get_many(std::span<const std::string> keys, deadline d) = 0;
  virtual bool erase(const std::string& k) = 0;
  virtual void ping(deadline d) = 0;
};
template <class S>
struct any_store_model;
}  // namespace detail

//! A store chosen at run time; see the file comment. Move-only.
class any_store {
 public:
  //! Wraps `s`, any model of `kv_store` (moved in). `name` is what `backend()` says.
  template <kv_store S>
  requires(!std::is_same_v<std::remove_cvref_t<S>, any_store>) explicit any_store(S s, std::string name = "custom");

  //! The store at `address` (any form in the file comment): the embedded
  //! store's client with `token` and `timeout` as its default deadline, or
  //! an etcd client (etcd's own access control is TLS; `token` is not used).
  //! TLS settings come from `EBBFLOW_TLS_*`. Does not connect yet.
  //! @throws std::invalid_argument for a malformed address or unreadable TLS files.
  static any_store connect(const std::string& address, const std::string& token,
                           std::chrono::milliseconds timeout = std::chrono::milliseconds(30000));
  //! From `EBBFLOW_STORE` (or `MASTER_ADDR`/`MASTER_PORT`), `EBBFLOW_TOKEN`,
  //! `EBBFLOW_STORE_TIMEOUT_MS` and `EBBFLOW_TLS_*`.
  //! @throws std::invalid_argument when no store address is set or it is malformed.
  static any_store from_environment();

  //! "tcp", "tcp+tls", "etcd", "etcds", or the name given to the wrapping constructor.
  [[nodiscard]] const std::string& backend() const noexcept { return name_; }

  //! Stores `v` under `k`.
  void set(const std::string& k, std::string_view v, deadline d) { impl_->set(k, v, d); }
  //! As above; errors in `ec`.
  void set(const std::string& k, std::string_view v, deadline d, std::error_code& ec) noexcept {
    guard(ec, [&] { impl_->set(k, v, d); });
  }
  //! The value of `k`, or nullopt.
  std::optional<std::string> try_get(const std::string& k, deadline d) { return impl_->try_get(k, d); }
  //! As above; errors in `ec`.
  std::optional<std::string> try_get(const std::string& k, deadline d, std::error_code& ec) noexcept {
    return guard(ec, [&] { return impl_->try_get(k, d); });
  }
  //! Atomically adds `delta` to the integer under `k`; the sum.
  std::int64_t add(const std::string& k, std::int64_t delta, deadline d) { return impl_->add(k, delta, d); }
  //! As above; errors in `ec`.
  std::int64_t add(const std::string& k, std::int64_t delta, deadline d, std::error_code& ec) noexcept {
    return guard(ec, [&] { return impl_->add(k, delta, d); });
  }
  //! Stores `desired` when the value is `expected` (empty: absent).
  compare_set_result compare_set(const std::string& k, std::string_view expected, std::string_view desired,
                                 deadline d) {
    return impl_->compare_set(k, expected, desired, d);
  }
  //! As above; errors in `ec`.
  compare_set_result compare_set(const std::string& k, std::string_view expected, std::string_view desired, deadline d,
                                 std::error_code& ec) noexcept {
    return guard(ec, [&] { return impl_->compare_set(k, expected, desired, d); });
  }
  //! Blocks until every key exists, or `d` passes (errc::timeout).
  void wait(const std::vector<std::string>& keys, deadline d) { impl_->wait(keys, d); }
  //! As above; errors in `ec`.
  void wait(const std::vector<std::string>& keys, deadline d, std::error_code& ec) noexcept {
    guard(ec, [&] { impl_->wait(keys, d); });
  }
  //! Blocks until any key exists; its index. @throws std::invalid_argument for no keys.
  std::size_t wait_any(const std::vector<std::string>& keys, deadline d) {
    EBBFLOW_ENFORCE(!keys.empty(), "store.wait_any: no keys to wait for");
    return impl_->wait_any(keys, d);
  }
  //! As above; errors in `ec`.
  std::size_t wait_any(const std::vector<std::string>& keys, deadline d, std::error_code& ec) noexcept {
    return guard(ec, [&] { return wait_any(keys, d); });
  }
  //! `add` for each key, batched where the backend can.
  std::vector<std::int64_t> add_many(std::span<const std::string> keys, std::span<const std::int64_t> deltas,
                                     deadline d) {
    EBBFLOW_ENFORCE(keys.size() == deltas.size(),
                    "store.add_many: " << keys.size() << " keys but " << deltas.size() << " deltas");
    return impl_->add_many(keys, deltas, d);
  }
  //! `try_get` for each key, batched where the backend can.
  std::vector<std::optional<std::string>> try_get_many(std::span<const std::string> keys, deadline d) {
    return impl_->try_get_many(keys, d);
  }
  //! Removes `k`; whether it existed.
  bool erase(const std::string& k) { return impl_->erase(k); }
  //! One round trip to the store (reachable, authenticated).
  void ping(deadline d) { impl_->ping(d); }

 private:
  template <class F>
  static auto guard(std::error_code& ec, F&& f) noexcept -> decltype(f()) {
    ec.clear();
    try {
      return f();
    } catch (const std::system_error& e) {
      ec = e.code();
    } catch (const std::invalid_argument&) {
      ec = make_error_code(error::bad_message);
    } catch (...) {
      ec = make_error_code(error::invalid_state);
    }
    if constexpr (!std::is_void_v<decltype(f())>) return {};
  }

  std::unique_ptr<detail::any_store_iface> impl_;
  std::string name_;
};

static_assert(kv_store<any_store>);

}  // namespace elastic
EBBFLOW_END_NAMESPACE

#include <ebbflow/elastic/impl/any_store.hpp>

#if !EBBFLOW_HEADER_ONLY
// The library instantiates the work stealing the group does on this store.
#include <ebbflow/plan/work_stealing.hpp>
EBBFLOW_BEGIN_NAMESPACE
extern template class plan::work_stealer<elastic::any_store>;
EBBFLOW_END_NAMESPACE
// ...and the group over this store and UCX (elastic/group.hpp).
#if EBBFLOW_HAS_UCX
#include <ebbflow/elastic/group.hpp>
#include <ebbflow/elastic/ucx_network.hpp>
EBBFLOW_BEGIN_NAMESPACE
extern template class elastic::detail::group_impl<elastic::any_store, elastic::ucx_network>;
EBBFLOW_END_NAMESPACE
#endif
#endif
