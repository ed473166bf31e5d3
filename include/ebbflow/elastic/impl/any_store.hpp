// SPDX-License-Identifier: Apache-2.0
//! @file impl/any_store.hpp
//! Definitions of `any_store` (included by elastic/any_store.hpp).
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/env.hpp>
#include <ebbflow/elastic/any_store.hpp>
#include <ebbflow/elastic/detail/store_ops.hpp>

#include <memory>
#include <string>
#include <utility>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {
namespace detail {

//! `any_store_iface` over a model `S`: the optional operations S lacks are
//! done key by key (store_ops.hpp).
template <class S>
struct any_store_model final : any_store_iface {
  explicit any_store_model(S s) : s_(std::move(s)) {}
  void set(const std::string& k, std::string_view v, deadline d) override { s_.set(k, v, d); }
  std::optional<std::string> try_get(const std::string& k, deadline d) override { return s_.try_get(k, d); }
  std::int64_t add(const std::string& k, std::int64_t delta, deadline d) override { return s_.add(k, delta, d); }
  compare_set_result compare_set(const std::string& k, std::string_view expected, std::string_view desired,
                                 deadline d) override {
    auto r = s_.compare_set(k, expected, desired, d);
    return {static_cast<bool>(r.swapped), std::string(r.current)};
  }
  void wait(const std::vector<std::string>& keys, deadline d) override { s_.wait(keys, d); }
  std::size_t wait_any(const std::vector<std::string>& keys, deadline d) override {
    if constexpr (requires { s_.wait_any(keys, d); }) {
      return s_.wait_any(keys, d);
    } else {
      const auto i = wait_any_key(s_, keys, d, std::stop_token{});
      if (!i) throw_if(make_error_code(error::timeout), {.operation = "store.wait_any"});
      return *i;
    }
  }
  std::vector<std::int64_t> add_many(std::span<const std::string> keys, std::span<const std::int64_t> deltas,
                                     deadline d) override {
    return add_all(s_, std::vector<std::string>(keys.begin(), keys.end()),
                   std::vector<std::int64_t>(deltas.begin(), deltas.end()), d);
  }
  std::vector<std::optional<std::string>> try_get_many(std::span<const std::string> keys, deadline d) override {
    return try_get_all(s_, std::vector<std::string>(keys.begin(), keys.end()), d);
  }
  bool erase(const std::string& k) override {
    if constexpr (requires { s_.erase(k); })
      return static_cast<bool>(s_.erase(k));
    else
      throw_if(make_error_code(error::invalid_state), {.operation = "store.erase", .detail = "this store cannot erase"});
    return false;
  }
  void ping(deadline d) override {
    if constexpr (requires { s_.ping(d); })
      s_.ping(d);
    else
      s_.try_get(std::string("ebbflow/ping"), d);
  }
  S s_;
};

}  // namespace detail

template <kv_store S>
  requires(!std::is_same_v<std::remove_cvref_t<S>, any_store>)
any_store::any_store(S s, std::string name)
    : impl_(std::make_unique<detail::any_store_model<S>>(std::move(s))), name_(std::move(name)) {}

// Compiled into ebbflow::compiled in separate compilation (config.hpp).
#if EBBFLOW_HEADER_ONLY
EBBFLOW_DECL any_store any_store::connect(const std::string& address, const std::string& token,
                                          std::chrono::milliseconds timeout) {
  const store_address a = store_address::parse(address);
  if (a.etcd()) {
    etcd_options o = etcd_options::from_address(a);
    o.timeout = timeout;
    return any_store(etcd_store(std::move(o)), a.tls() ? "etcds" : "etcd");
  }
  client_options o;
  o.timeout = timeout;
  o.tls = tls_options::from_environment(a.tls());
  return any_store(store_client(a.endpoints[0].host, a.endpoints[0].port, token, o), a.tls() ? "tcp+tls" : "tcp");
}

EBBFLOW_DECL any_store any_store::from_environment() {
  const launch_info li = launch_info::from_environment();
  const std::string address = !li.store_address.empty() ? li.store_address
                              : li.store_port != 0
                                  ? (li.store_host.find(':') != std::string::npos ? "[" + li.store_host + "]"
                                                                                  : li.store_host) +
                                        ":" + std::to_string(li.store_port)
                                  : std::string();
  EBBFLOW_ENFORCE(!address.empty(),
                  "any_store::from_environment: EBBFLOW_STORE (host:port, tcp+tls://, etcd://, etcds://) or "
                  "MASTER_ADDR/MASTER_PORT is not set");
  return connect(address, li.token, client_options::from_environment().timeout);
}
#endif  // EBBFLOW_HEADER_ONLY

}  // namespace elastic
EBBFLOW_END_NAMESPACE
