// SPDX-License-Identifier: Apache-2.0
//! @file impl/etcd_store.hpp
//! Definitions of `etcd_store` (included by elastic/etcd_store.hpp).
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/core/env.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/elastic/detail/etcd_client.hpp>
#include <ebbflow/elastic/etcd_store.hpp>

#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

// Compiled into ebbflow::compiled in separate compilation (config.hpp).
#if EBBFLOW_HEADER_ONLY
EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

EBBFLOW_DECL etcd_options etcd_options::from_address(const store_address& a) {
  EBBFLOW_ENFORCE(a.etcd(), "etcd_options: '" << a.str() << "' is not an etcd:// or etcds:// address");
  etcd_options o;
  o.endpoints = a.endpoints;
  o.prefix = a.prefix;
  o.tls = tls_options::from_environment(a.tls());
  return o;
}

EBBFLOW_DECL etcd_store::etcd_store(etcd_options o)
    : c_(std::make_unique<detail::etcd_client>(o.endpoints, o.prefix, o.tls, o.timeout, o.connect_timeout,
                                               o.attempt_timeout)),
      opts_(std::move(o)) {}

EBBFLOW_DECL etcd_store etcd_store::from_environment() {
  const auto s = env::get("EBBFLOW_STORE");
  EBBFLOW_ENFORCE(s.has_value(), "etcd_store::from_environment: EBBFLOW_STORE is not set");
  etcd_options o = etcd_options::from_address(store_address::parse(*s));
  o.timeout = env::get_ms("EBBFLOW_STORE_TIMEOUT_MS", o.timeout, 1);
  return etcd_store(std::move(o));
}

EBBFLOW_DECL etcd_store::etcd_store(etcd_store&&) noexcept = default;
EBBFLOW_DECL etcd_store& etcd_store::operator=(etcd_store&&) noexcept = default;
EBBFLOW_DECL etcd_store::~etcd_store() = default;

EBBFLOW_DECL void etcd_store::raise(const char* operation, std::string_view key, std::error_code ec) const {
  std::string detail;
  if (!key.empty()) detail = "key " + detail::quote_key(key) + ", ";
  detail += "etcd " + c_->all_endpoints();
  if (const auto why = last_error_detail(); !why.empty()) detail += ": " + why;
  EBBFLOW_THROW((system_error(ec, {-1, -1, -1, operation, std::move(detail)})));
}

EBBFLOW_DECL std::string etcd_store::last_error_detail() const {
  std::lock_guard lk(c_->mu);
  return c_->last_detail;
}
EBBFLOW_DECL std::string etcd_store::current_endpoint() const {
  std::lock_guard lk(c_->mu);
  return c_->current();
}
EBBFLOW_DECL const etcd_options& etcd_store::options() const noexcept { return opts_; }
EBBFLOW_DECL void etcd_store::close() noexcept {
  std::lock_guard lk(c_->mu);
  c_->close();
}

// Each call: the ec form holds the lock and never throws (bad_alloc aside,
// which the noexcept forms turn into terminate, as the embedded store's).
#define EBBFLOW_DETAIL_ETCD_CALL(expr) \
  std::lock_guard lk(c_->mu);          \
  return c_->expr

EBBFLOW_DECL void etcd_store::set(std::string_view key, std::string_view value, deadline d,
                                  std::error_code& ec) noexcept {
  EBBFLOW_DETAIL_ETCD_CALL(set(key, value, d, ec));
}
EBBFLOW_DECL void etcd_store::set(std::string_view key, std::string_view value, deadline d) {
  std::error_code ec;
  set(key, value, d, ec);
  if (ec) raise("store.set", key, ec);
}

EBBFLOW_DECL std::optional<std::string> etcd_store::try_get(std::string_view key, deadline d,
                                                           std::error_code& ec) noexcept {
  EBBFLOW_DETAIL_ETCD_CALL(try_get(key, d, ec));
}
EBBFLOW_DECL std::optional<std::string> etcd_store::try_get(std::string_view key, deadline d) {
  std::error_code ec;
  auto v = try_get(key, d, ec);
  if (ec) raise("store.try_get", key, ec);
  return v;
}

EBBFLOW_DECL std::string etcd_store::get(std::string_view key, deadline d, std::error_code& ec) noexcept {
  std::lock_guard lk(c_->mu);
  const std::vector<std::string> keys{std::string(key)};
  for (;;) {
    c_->wait(keys, true, d, ec);
    if (ec) return {};
    auto v = c_->try_get(key, d, ec);
    if (ec) return {};
    if (v) return std::move(*v);  // else erased again in between: wait on
  }
}
EBBFLOW_DECL std::string etcd_store::get(std::string_view key, deadline d) {
  std::error_code ec;
  auto v = get(key, d, ec);
  if (ec) raise("store.get", key, ec);
  return v;
}

EBBFLOW_DECL std::int64_t etcd_store::add(std::string_view key, std::int64_t delta, deadline d,
                                          std::error_code& ec) noexcept {
  EBBFLOW_DETAIL_ETCD_CALL(add(key, delta, d, ec));
}
EBBFLOW_DECL std::int64_t etcd_store::add(std::string_view key, std::int64_t delta, deadline d) {
  std::error_code ec;
  auto v = add(key, delta, d, ec);
  if (ec) raise("store.add", key, ec);
  return v;
}

EBBFLOW_DECL std::vector<std::int64_t> etcd_store::add_many(std::span<const std::string> keys,
                                                           std::span<const std::int64_t> deltas, deadline d,
                                                           std::error_code& ec) {
  if (keys.size() != deltas.size())
    throw std::invalid_argument("store.add_many: " + std::to_string(keys.size()) + " keys but " +
                                std::to_string(deltas.size()) + " deltas");
  EBBFLOW_DETAIL_ETCD_CALL(add_many(keys, deltas, d, ec));
}
EBBFLOW_DECL std::vector<std::int64_t> etcd_store::add_many(std::span<const std::string> keys,
                                                           std::span<const std::int64_t> deltas, deadline d) {
  std::error_code ec;
  auto v = add_many(keys, deltas, d, ec);
  if (ec) raise("store.add_many", {}, ec);
  return v;
}

EBBFLOW_DECL std::vector<std::optional<std::string>> etcd_store::try_get_many(std::span<const std::string> keys,
                                                                             deadline d, std::error_code& ec) {
  EBBFLOW_DETAIL_ETCD_CALL(try_get_many(keys, d, ec));
}
EBBFLOW_DECL std::vector<std::optional<std::string>> etcd_store::try_get_many(std::span<const std::string> keys,
                                                                             deadline d) {
  std::error_code ec;
  auto v = try_get_many(keys, d, ec);
  if (ec) raise("store.try_get_many", {}, ec);
  return v;
}

EBBFLOW_DECL compare_set_result etcd_store::compare_set(std::string_view key, std::string_view expected,
                                                       std::string_view desired, deadline d,
                                                       std::error_code& ec) noexcept {
  EBBFLOW_DETAIL_ETCD_CALL(compare_set(key, expected, desired, d, ec));
}
EBBFLOW_DECL compare_set_result etcd_store::compare_set(std::string_view key, std::string_view expected,
                                                       std::string_view desired, deadline d) {
  std::error_code ec;
  auto v = compare_set(key, expected, desired, d, ec);
  if (ec) raise("store.compare_set", key, ec);
  return v;
}

EBBFLOW_DECL void etcd_store::wait(const std::vector<std::string>& keys, deadline d, std::error_code& ec) noexcept {
  std::lock_guard lk(c_->mu);
  ec.clear();
  if (keys.empty()) return;
  c_->wait(keys, false, d, ec);
}
EBBFLOW_DECL void etcd_store::wait(const std::vector<std::string>& keys, deadline d) {
  std::error_code ec;
  wait(keys, d, ec);
  if (ec) raise("store.wait", keys.size() == 1 ? std::string_view(keys[0]) : std::string_view{}, ec);
}

EBBFLOW_DECL std::size_t etcd_store::wait_any(const std::vector<std::string>& keys, deadline d,
                                              std::error_code& ec) noexcept {
  std::lock_guard lk(c_->mu);
  if (keys.empty()) {
    ec = make_error_code(error::bad_message);
    c_->last_detail = "wait_any: no keys to wait for";
    return 0;
  }
  return c_->wait(keys, true, d, ec);
}
EBBFLOW_DECL std::size_t etcd_store::wait_any(const std::vector<std::string>& keys, deadline d) {
  if (keys.empty()) throw std::invalid_argument("store.wait_any: no keys to wait for");
  std::error_code ec;
  auto i = wait_any(keys, d, ec);
  if (ec) raise("store.wait_any", keys.size() == 1 ? std::string_view(keys[0]) : std::string_view{}, ec);
  return i;
}

EBBFLOW_DECL bool etcd_store::check(const std::vector<std::string>& keys, deadline d) {
  std::error_code ec;
  std::vector<std::optional<std::string>> v;
  {
    std::lock_guard lk(c_->mu);
    v = c_->try_get_many(keys, d, ec);
  }
  if (ec) raise("store.check", {}, ec);
  for (const auto& x : v)
    if (!x) return false;
  return true;
}

EBBFLOW_DECL bool etcd_store::erase(std::string_view key, deadline d, std::error_code& ec) noexcept {
  EBBFLOW_DETAIL_ETCD_CALL(erase(key, d, ec));
}
EBBFLOW_DECL bool etcd_store::erase(std::string_view key) {
  std::error_code ec;
  auto v = erase(key, deadline::after(c_->timeout()), ec);
  if (ec) raise("store.erase", key, ec);
  return v;
}

EBBFLOW_DECL std::int64_t etcd_store::num_keys(deadline d) {
  std::error_code ec;
  std::int64_t n = 0;
  {
    std::lock_guard lk(c_->mu);
    n = c_->num_keys(d, ec);
  }
  if (ec) raise("store.num_keys", {}, ec);
  return n;
}

EBBFLOW_DECL void etcd_store::ping(deadline d, std::error_code& ec) noexcept { EBBFLOW_DETAIL_ETCD_CALL(ping(d, ec)); }
EBBFLOW_DECL void etcd_store::ping(deadline d) {
  std::error_code ec;
  ping(d, ec);
  if (ec) raise("store.ping", {}, ec);
}

#undef EBBFLOW_DETAIL_ETCD_CALL

}  // namespace elastic
EBBFLOW_END_NAMESPACE
#endif  // EBBFLOW_HEADER_ONLY
