// SPDX-License-Identifier: Apache-2.0
//! @file impl/store_client.hpp
//! Definitions of `store_client` and `store_watcher` (included by elastic/tcp_store.hpp).
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/core/env.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/core/log.hpp>
#include <ebbflow/elastic/detail/hmac.hpp>
#include <ebbflow/elastic/detail/client_connection.hpp>
#include <ebbflow/elastic/detail/store_protocol.hpp>
#include <ebbflow/elastic/tcp_store.hpp>

#include <boost/asio/buffer.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

// Compiled into ebbflow::compiled in separate compilation (config.hpp).
#if EBBFLOW_HEADER_ONLY
EBBFLOW_BEGIN_NAMESPACE
namespace elastic {
// ------------------------------------------------------------------ options

EBBFLOW_DECL client_options client_options::from_environment() {
  client_options o;
  o.timeout = env::get_ms("EBBFLOW_STORE_TIMEOUT_MS", o.timeout, 1);
  return o;
}

// ------------------------------------------------------------------ store_watcher

EBBFLOW_DECL store_watcher::store_watcher(std::unique_ptr<detail::client_connection> c) : conn_(std::move(c)) {}
EBBFLOW_DECL store_watcher::store_watcher(store_watcher&&) noexcept = default;
EBBFLOW_DECL store_watcher& store_watcher::operator=(store_watcher&&) noexcept = default;
EBBFLOW_DECL store_watcher::~store_watcher() = default;

EBBFLOW_DECL store_event store_watcher::next(deadline d, std::error_code& ec) noexcept {
  ec.clear();
  if (!conn_ || !conn_->connected()) {
    ec = make_error_code(error::peer_lost);
    return {};
  }
  auto r = conn_->read_frame(d, ec, true);
  if (ec) return {};
  if (r.msg.code == detail::proto::op::error) {
    conn_->server_error(ec, r.msg);
    conn_->close();
    return {};
  }
  if (r.msg.code != detail::proto::op::event) {
    conn_->fail(ec, error::bad_message,
                std::string("watch: expected event, got ") + detail::proto::op_name(r.msg.code));
    return {};
  }
  store_event e;
  e.type = r.msg.flag == static_cast<std::uint8_t>(detail::proto::event_kind::erase) ? store_event::kind::erase
                                                                                     : store_event::kind::set;
  e.key = std::string(r.msg.key);
  e.value = std::string(r.msg.value);
  return e;
}

EBBFLOW_DECL store_event store_watcher::next(deadline d) {
  std::error_code ec;
  auto e = next(d, ec);
  if (ec) throw_if(ec, {-1, -1, -1, "store.watch", conn_ ? conn_->last_detail : std::string("moved-from watcher")});
  return e;
}

// ------------------------------------------------------------------ store_client

EBBFLOW_DECL store_client::store_client(std::string host, std::uint16_t port, std::string token, client_options opts)
    : host_(std::move(host)), port_(port), token_(std::move(token)), opts_(opts) {
  EBBFLOW_ENFORCE(!host_.empty(), "store_client: empty host");
  EBBFLOW_ENFORCE(port_ != 0, "store_client: port 0 (no store address given)");
  conn_ = std::make_unique<detail::client_connection>(host_, port_, token_, opts_.max_message_bytes, opts_.tls);
}

EBBFLOW_DECL store_client store_client::from_environment() {
  const launch_info li = launch_info::from_environment();
  client_options o = client_options::from_environment();
  if (!li.store_address.empty()) {
    const store_address a = store_address::parse(li.store_address);
    EBBFLOW_ENFORCE(!a.etcd(), "store_client::from_environment: EBBFLOW_STORE='"
                                   << li.store_address
                                   << "' is an etcd address: make the store with any_store::from_environment() "
                                      "(elastic/any_store.hpp) or etcd_store");
    o.tls = tls_options::from_environment(a.tls());
  }
  EBBFLOW_ENFORCE(li.store_port != 0,
                  "store_client::from_environment: EBBFLOW_STORE (HOST:PORT) or "
                  "MASTER_ADDR/MASTER_PORT is not set");
  return store_client(li.store_host, li.store_port, li.token, o);
}

EBBFLOW_DECL store_client::store_client(store_client&&) noexcept = default;
EBBFLOW_DECL store_client& store_client::operator=(store_client&&) noexcept = default;
EBBFLOW_DECL store_client::~store_client() = default;

EBBFLOW_DECL detail::proto::decode_result store_client::call(std::string frame, deadline d, bool waits,
                                                       std::error_code& ec) noexcept {
  ec.clear();
  std::lock_guard lk(conn_->mu);
  conn_->last_detail.clear();
  if (!conn_->fits(frame.size(), ec)) {
    conn_->last_detail = "request " + conn_->last_detail;
    return {};
  }
  conn_->send(frame, d, ec);
  if (ec) return {};
  // A waiting request times out on the server, which names the missing keys;
  // allow its reply a little time to arrive before giving up locally.
  const deadline local =
      waits && d.at() != steady_clock::time_point::max() ? deadline(d.at() + std::chrono::milliseconds(250)) : d;
  auto r = conn_->receive(local, ec);
  if (ec) return {};
  return r;
}

EBBFLOW_DECL void store_client::raise(const char* operation, std::string_view key, std::error_code ec) const {
  std::string detail;
  if (!key.empty()) detail = "key " + detail::quote_key(key) + ", ";
  detail += "store " + host_ + ":" + std::to_string(port_);
  std::string why = last_error_detail();
  if (!why.empty()) detail += ": " + why;
  EBBFLOW_THROW((system_error(ec, {-1, -1, -1, operation, std::move(detail)})));
}

EBBFLOW_DECL std::string store_client::last_error_detail() const {
  std::lock_guard lk(conn_->mu);
  return conn_->last_detail;
}

EBBFLOW_DECL void store_client::close() noexcept {
  std::lock_guard lk(conn_->mu);
  conn_->close();
}

EBBFLOW_DECL void store_client::connect(deadline d, std::error_code& ec) noexcept {
  ec.clear();
  std::lock_guard lk(conn_->mu);
  conn_->last_detail.clear();
  conn_->connect(d, ec);
}
EBBFLOW_DECL void store_client::connect(deadline d) {
  std::error_code ec;
  connect(d, ec);
  if (ec) raise("store.connect", {}, ec);
}

namespace detail {
//! Checks the reply opcode; a mismatch is a protocol error.
EBBFLOW_DECL bool expect_reply(const proto::decode_result& r, proto::op want, std::error_code& ec, client_connection& c) {
  if (ec) return false;
  if (r.msg.code == want) return true;
  c.fail(ec, error::bad_message,
         std::string("expected reply ") + proto::op_name(want) + ", got " + proto::op_name(r.msg.code));
  return false;
}
//! The request frames of a non-waiting get and of an add, alone or pipelined.
EBBFLOW_DECL std::string try_get_frame(std::string_view key) {
  return proto::frame_builder(proto::op::get, key.size() + 16).str(key).u32(0).u8(0).finish();
}
EBBFLOW_DECL std::string add_frame(std::string_view key, std::int64_t delta) {
  return proto::frame_builder(proto::op::add, key.size() + 16).str(key).i64(delta).finish();
}
//! A get's reply into `out`: the value, or nullopt when the key is missing;
//! false (with `ec` set) on an error or any other reply.
EBBFLOW_DECL bool take_value(const proto::decode_result& r, std::optional<std::string>& out, std::error_code& ec,
                       client_connection& c) {
  out.reset();
  if (!ec && r.msg.code == proto::op::missing) return true;
  if (!expect_reply(r, proto::op::value, ec, c)) return false;
  out.emplace(r.msg.value);
  return true;
}
}  // namespace detail

// set
EBBFLOW_DECL void store_client::set(std::string_view key, std::string_view value, deadline d, std::error_code& ec) noexcept {
  auto r = call(
      detail::proto::frame_builder(detail::proto::op::set, key.size() + value.size() + 8).str(key).str(value).finish(),
      d, false, ec);
  detail::expect_reply(r, detail::proto::op::ok, ec, *conn_);
}
EBBFLOW_DECL void store_client::set(std::string_view key, std::string_view value, std::error_code& ec) noexcept {
  set(key, value, default_deadline(), ec);
}
EBBFLOW_DECL void store_client::set(std::string_view key, std::string_view value, deadline d) {
  std::error_code ec;
  set(key, value, d, ec);
  if (ec) raise("store.set", key, ec);
}
EBBFLOW_DECL void store_client::set(std::string_view key, std::string_view value) { set(key, value, default_deadline()); }

// get
EBBFLOW_DECL std::string store_client::get(std::string_view key, deadline d, std::error_code& ec) noexcept {
  auto r = call(detail::proto::frame_builder(detail::proto::op::get, key.size() + 16)
                    .str(key)
                    .u32(detail::timeout_ms_until(d))
                    .u8(1)
                    .finish(),
                d, true, ec);
  if (!detail::expect_reply(r, detail::proto::op::value, ec, *conn_)) return {};
  return std::string(r.msg.value);
}
EBBFLOW_DECL std::string store_client::get(std::string_view key, std::error_code& ec) noexcept {
  return get(key, default_deadline(), ec);
}
EBBFLOW_DECL std::string store_client::get(std::string_view key, deadline d) {
  std::error_code ec;
  auto v = get(key, d, ec);
  if (ec) raise("store.get", key, ec);
  return v;
}
EBBFLOW_DECL std::string store_client::get(std::string_view key) { return get(key, default_deadline()); }

// try_get
EBBFLOW_DECL std::optional<std::string> store_client::try_get(std::string_view key, deadline d,
                                                        std::error_code& ec) noexcept {
  auto r = call(detail::try_get_frame(key), d, false, ec);
  std::optional<std::string> v;
  detail::take_value(r, v, ec, *conn_);
  return v;
}
EBBFLOW_DECL std::optional<std::string> store_client::try_get(std::string_view key, std::error_code& ec) noexcept {
  return try_get(key, default_deadline(), ec);
}
EBBFLOW_DECL std::optional<std::string> store_client::try_get(std::string_view key, deadline d) {
  std::error_code ec;
  auto v = try_get(key, d, ec);
  if (ec) raise("store.try_get", key, ec);
  return v;
}
EBBFLOW_DECL std::optional<std::string> store_client::try_get(std::string_view key) {
  return try_get(key, default_deadline());
}

// add
EBBFLOW_DECL std::int64_t store_client::add(std::string_view key, std::int64_t delta, deadline d,
                                      std::error_code& ec) noexcept {
  auto r = call(detail::add_frame(key, delta), d, false, ec);
  if (!detail::expect_reply(r, detail::proto::op::integer, ec, *conn_)) return 0;
  return r.msg.integer;
}
EBBFLOW_DECL std::int64_t store_client::add(std::string_view key, std::int64_t delta, std::error_code& ec) noexcept {
  return add(key, delta, default_deadline(), ec);
}
EBBFLOW_DECL std::int64_t store_client::add(std::string_view key, std::int64_t delta, deadline d) {
  std::error_code ec;
  auto v = add(key, delta, d, ec);
  if (ec) raise("store.add", key, ec);
  return v;
}
EBBFLOW_DECL std::int64_t store_client::add(std::string_view key, std::int64_t delta) {
  return add(key, delta, default_deadline());
}

// pipelined: requests for `keys` leave in batches and the replies come back
// in order (the server answers the frames of one connection in turn).
// `frame(i)` builds request i; `reply(i, r)` takes its reply and returns
// false (with `ec` set) when it is not what was asked for.
template <class Frame, class Reply>
void store_client::pipelined(const char* what, std::span<const std::string> keys, Frame&& frame, Reply&& reply,
                             deadline d, std::error_code& ec) {
  ec.clear();
  // Batches small enough for the server's output budget and the socket buffers.
  constexpr std::size_t batch = 64;
  std::lock_guard lk(conn_->mu);
  conn_->last_detail.clear();
  for (std::size_t first = 0; first < keys.size(); first += batch) {
    const std::size_t last = std::min(keys.size(), first + batch);
    std::string frames;
    for (std::size_t i = first; i < last; ++i) {
      std::string f = frame(i);
      if (!conn_->fits(f.size(), ec)) {
        conn_->last_detail =
            std::string(what) + ": request for key " + detail::quote_key(keys[i]) + " " + conn_->last_detail;
        return;
      }
      frames += f;
    }
    conn_->send(frames, d, ec);
    if (ec) return;
    for (std::size_t i = first; i < last; ++i) {
      auto r = conn_->receive(d, ec);
      if (ec || !reply(i, r)) {
        conn_->last_detail = std::string(what) + ": reply " + std::to_string(i + 1) + " of " +
                             std::to_string(keys.size()) + " (key " + detail::quote_key(keys[i]) +
                             "): " + conn_->last_detail;
        // Replies to the rest of this batch may still be in flight: the
        // connection cannot be reused in step with its requests.
        conn_->close();
        return;
      }
    }
  }
}

// add_many: pipelined adds
EBBFLOW_DECL std::vector<std::int64_t> store_client::add_many(std::span<const std::string> keys,
                                                        std::span<const std::int64_t> deltas, deadline d,
                                                        std::error_code& ec) {
  if (keys.size() != deltas.size())
    throw std::invalid_argument("store.add_many: " + std::to_string(keys.size()) + " keys but " +
                                std::to_string(deltas.size()) + " deltas");
  std::vector<std::int64_t> out;
  out.reserve(keys.size());
  pipelined(
      "add_many", keys, [&](std::size_t i) { return detail::add_frame(keys[i], deltas[i]); },
      [&](std::size_t, const detail::proto::decode_result& r) {
        if (!detail::expect_reply(r, detail::proto::op::integer, ec, *conn_)) return false;
        out.push_back(r.msg.integer);
        return true;
      },
      d, ec);
  return out;
}
EBBFLOW_DECL std::vector<std::int64_t> store_client::add_many(std::span<const std::string> keys,
                                                        std::span<const std::int64_t> deltas, deadline d) {
  std::error_code ec;
  auto v = add_many(keys, deltas, d, ec);
  if (ec) raise("store.add_many", {}, ec);
  return v;
}

// try_get_many: pipelined try_get
EBBFLOW_DECL std::vector<std::optional<std::string>> store_client::try_get_many(std::span<const std::string> keys, deadline d,
                                                                          std::error_code& ec) {
  std::vector<std::optional<std::string>> out;
  out.reserve(keys.size());
  pipelined(
      "try_get_many", keys, [&](std::size_t i) { return detail::try_get_frame(keys[i]); },
      [&](std::size_t, const detail::proto::decode_result& r) {
        std::optional<std::string> v;
        if (!detail::take_value(r, v, ec, *conn_)) return false;
        out.push_back(std::move(v));
        return true;
      },
      d, ec);
  return out;
}
EBBFLOW_DECL std::vector<std::optional<std::string>> store_client::try_get_many(std::span<const std::string> keys,
                                                                          deadline d) {
  std::error_code ec;
  auto v = try_get_many(keys, d, ec);
  if (ec) raise("store.try_get_many", {}, ec);
  return v;
}

// compare_set
EBBFLOW_DECL compare_set_result store_client::compare_set(std::string_view key, std::string_view expected,
                                                    std::string_view desired, deadline d,
                                                    std::error_code& ec) noexcept {
  auto r = call(
      detail::proto::frame_builder(detail::proto::op::compare_set, key.size() + expected.size() + desired.size() + 16)
          .str(key)
          .str(expected)
          .str(desired)
          .finish(),
      d, false, ec);
  if (!detail::expect_reply(r, detail::proto::op::cas_result, ec, *conn_)) return {};
  return {r.msg.flag != 0, std::string(r.msg.value)};
}
EBBFLOW_DECL compare_set_result store_client::compare_set(std::string_view key, std::string_view expected,
                                                    std::string_view desired, std::error_code& ec) noexcept {
  return compare_set(key, expected, desired, default_deadline(), ec);
}
EBBFLOW_DECL compare_set_result store_client::compare_set(std::string_view key, std::string_view expected,
                                                    std::string_view desired, deadline d) {
  std::error_code ec;
  auto v = compare_set(key, expected, desired, d, ec);
  if (ec) raise("store.compare_set", key, ec);
  return v;
}
EBBFLOW_DECL compare_set_result store_client::compare_set(std::string_view key, std::string_view expected,
                                                    std::string_view desired) {
  return compare_set(key, expected, desired, default_deadline());
}

// wait
EBBFLOW_DECL void store_client::wait(const std::vector<std::string>& keys, deadline d, std::error_code& ec) noexcept {
  auto r = call(detail::keys_frame(detail::proto::op::wait, keys, detail::timeout_ms_until(d), true), d, true, ec);
  detail::expect_reply(r, detail::proto::op::ok, ec, *conn_);
}
EBBFLOW_DECL void store_client::wait(const std::vector<std::string>& keys, deadline d) {
  std::error_code ec;
  wait(keys, d, ec);
  if (ec) raise("store.wait", keys.size() == 1 ? std::string_view(keys[0]) : std::string_view{}, ec);
}

// wait_any
EBBFLOW_DECL std::size_t store_client::wait_any(const std::vector<std::string>& keys, deadline d,
                                          std::error_code& ec) noexcept {
  auto r = call(detail::keys_frame(detail::proto::op::wait_any, keys, detail::timeout_ms_until(d), true), d, true, ec);
  if (!detail::expect_reply(r, detail::proto::op::integer, ec, *conn_)) return 0;
  if (r.msg.integer < 0 || static_cast<std::uint64_t>(r.msg.integer) >= keys.size()) {
    ec = make_error_code(error::bad_message);
    return 0;
  }
  return static_cast<std::size_t>(r.msg.integer);
}
EBBFLOW_DECL std::size_t store_client::wait_any(const std::vector<std::string>& keys, deadline d) {
  if (keys.empty()) throw std::invalid_argument("store.wait_any: no keys to wait for");
  std::error_code ec;
  auto i = wait_any(keys, d, ec);
  if (ec) raise("store.wait_any", keys.size() == 1 ? std::string_view(keys[0]) : std::string_view{}, ec);
  return i;
}

// check
EBBFLOW_DECL bool store_client::check(const std::vector<std::string>& keys, std::error_code& ec) noexcept {
  auto r = call(detail::keys_frame(detail::proto::op::check, keys, 0, false), default_deadline(), false, ec);
  if (!detail::expect_reply(r, detail::proto::op::boolean, ec, *conn_)) return false;
  return r.msg.flag != 0;
}
EBBFLOW_DECL bool store_client::check(const std::vector<std::string>& keys) {
  std::error_code ec;
  auto v = check(keys, ec);
  if (ec) raise("store.check", {}, ec);
  return v;
}

// erase
EBBFLOW_DECL bool store_client::erase(std::string_view key, std::error_code& ec) noexcept {
  auto r = call(detail::proto::frame_builder(detail::proto::op::erase, key.size() + 8).str(key).finish(),
                default_deadline(), false, ec);
  if (!detail::expect_reply(r, detail::proto::op::boolean, ec, *conn_)) return false;
  return r.msg.flag != 0;
}
EBBFLOW_DECL bool store_client::erase(std::string_view key) {
  std::error_code ec;
  auto v = erase(key, ec);
  if (ec) raise("store.erase", key, ec);
  return v;
}

// num_keys
EBBFLOW_DECL std::int64_t store_client::num_keys(std::error_code& ec) noexcept {
  auto r = call(detail::proto::frame_builder(detail::proto::op::num_keys).finish(), default_deadline(), false, ec);
  if (!detail::expect_reply(r, detail::proto::op::integer, ec, *conn_)) return 0;
  return r.msg.integer;
}
EBBFLOW_DECL std::int64_t store_client::num_keys() {
  std::error_code ec;
  auto v = num_keys(ec);
  if (ec) raise("store.num_keys", {}, ec);
  return v;
}

// ping
EBBFLOW_DECL void store_client::ping(deadline d, std::error_code& ec) noexcept {
  auto r = call(detail::proto::frame_builder(detail::proto::op::ping).finish(), d, false, ec);
  detail::expect_reply(r, detail::proto::op::ok, ec, *conn_);
}
EBBFLOW_DECL void store_client::ping(deadline d) {
  std::error_code ec;
  ping(d, ec);
  if (ec) raise("store.ping", {}, ec);
}

// watch
EBBFLOW_DECL store_watcher store_client::watch(std::string_view prefix, bool include_existing, deadline d,
                                         std::error_code& ec) noexcept {
  ec.clear();
  auto c = std::make_unique<detail::client_connection>(host_, port_, token_, opts_.max_message_bytes, opts_.tls);
  c->send(detail::proto::frame_builder(detail::proto::op::watch, prefix.size() + 8)
              .str(prefix)
              .u8(include_existing ? 1 : 0)
              .finish(),
          d, ec);
  if (!ec) detail::expect_reply(c->receive(d, ec), detail::proto::op::ok, ec, *c);
  if (ec) {
    std::lock_guard lk(conn_->mu);
    conn_->last_detail = c->last_detail;
    c->close();
  }
  return store_watcher(std::move(c));
}
EBBFLOW_DECL store_watcher store_client::watch(std::string_view prefix, bool include_existing, deadline d) {
  std::error_code ec;
  auto w = watch(prefix, include_existing, d, ec);
  if (ec) raise("store.watch", prefix, ec);
  return w;
}

}  // namespace elastic
EBBFLOW_END_NAMESPACE
#endif  // EBBFLOW_HEADER_ONLY
