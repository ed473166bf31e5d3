// SPDX-License-Identifier: Apache-2.0
//! @file impl/store_server.hpp
//! Definitions of `store_server` (included by elastic/tcp_store.hpp).
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/env.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/core/log.hpp>
#include <ebbflow/core/thread_name.hpp>
#include <ebbflow/elastic/detail/hmac.hpp>
#include <ebbflow/elastic/detail/server_connection.hpp>
#include <ebbflow/elastic/detail/store_protocol.hpp>
#include <ebbflow/elastic/kv_store.hpp>
#include <ebbflow/elastic/tcp_store.hpp>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <deque>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

// Compiled into ebbflow::compiled in separate compilation (config.hpp).
#if EBBFLOW_HEADER_ONLY
EBBFLOW_BEGIN_NAMESPACE
namespace elastic {
namespace detail {

EBBFLOW_DECL void server_impl::accept() {
  if (stopped_) return;
  auto sock = std::make_shared<tcp::socket>(strand_);
  acceptor_.async_accept(*sock, [self = shared_from_this(), sock](const boost::system::error_code& ec) {
    if (self->stopped_) return;
    if (ec) {
      // EMFILE and friends: log once and retry shortly rather than spin.
      if (!self->accept_failing_) {
        std::string hint;
        if (ec == boost::system::errc::too_many_files_open) {
          rlimit l{};
          ::getrlimit(RLIMIT_NOFILE, &l);
          hint = " (open-file limit " + std::to_string(l.rlim_cur) + ", " + std::to_string(self->conns_.size()) +
                 " connections open; every worker holds 3: raise `ulimit -n`, or call "
                 "elastic::raise_open_file_limit() in the process that serves the store)";
        }
        EBBFLOW_LOG_WARN("store: accept failed: " << ec.message() << hint << "; retrying every 50 ms");
        self->accept_failing_ = true;
      }
      self->retry_.expires_after(std::chrono::milliseconds(50));
      self->retry_.async_wait([self](const boost::system::error_code& e) {
        if (!e) self->accept();
      });
      return;
    }
    self->accepted_.fetch_add(1, std::memory_order_relaxed);
    self->accept_failing_ = false;
    const std::uint64_t id = self->next_id_++;
    auto conn = std::make_shared<server_conn>(self, std::move(*sock), id);
    self->conns_.emplace(id, conn);
    self->open_.fetch_add(1, std::memory_order_relaxed);
    if (self->conns_.size() > self->opts_.max_connections) {
      conn->reject(errc::invalid_state,
                   "too many connections (limit " + std::to_string(self->opts_.max_connections) + ")");
    } else {
      conn->start();
    }
    self->accept();
  });
}

EBBFLOW_DECL void server_impl::stop() noexcept {
  asio::post(strand_, [self = shared_from_this()] {
    if (self->stopped_) return;
    self->stopped_ = true;
    boost::system::error_code ec;
    self->acceptor_.close(ec);
    self->retry_.cancel();
    std::vector<std::shared_ptr<server_conn>> live;
    for (auto& [id, w] : self->conns_)
      if (auto c = w.lock()) live.push_back(std::move(c));
    for (auto& c : live) c->close();
    self->conns_.clear();
    self->open_.store(0, std::memory_order_relaxed);
    EBBFLOW_LOG_INFO("store: stopped");
  });
}

EBBFLOW_DECL void server_impl::notify(const std::string& key, proto::event_kind kind, std::string_view value) {
  // The event goes out before any waiter completes: completing one runs the
  // requests its client pipelined behind the wait (`server_conn::complete`),
  // whose mutations send their own events, and a watcher must see those
  // after this one (events follow the order of the mutations).
  if (!watchers_.empty()) {
    std::string frame;
    std::vector<std::shared_ptr<server_conn>> targets;
    for (auto& [w, prefix] : watchers_)
      if (key.starts_with(prefix))
        if (auto c = w.lock()) targets.push_back(std::move(c));
    if (!targets.empty()) {
      frame = proto::frame_builder(proto::op::event, key.size() + value.size() + 16)
                  .u8(static_cast<std::uint8_t>(kind))
                  .str(key)
                  .str(value)
                  .finish();
      for (auto& c : targets) c->send(frame);
    }
  }
  if (kind == proto::event_kind::set) {
    auto [b, e] = waiters_.equal_range(key);
    if (b != e) {
      std::vector<std::shared_ptr<store_waiter>> hit;
      for (auto it = b; it != e; ++it) hit.push_back(it->second);
      waiters_.erase(b, e);
      // `value` stays valid: it is the setter's frame or a local of
      // `execute`, never the map entry a released request may reassign.
      for (auto& w : hit) {
        if (w->done) continue;
        w->missing.erase(key);
        if (w->what == store_waiter::kind::any) {
          const auto at = std::find(w->any_keys.begin(), w->any_keys.end(), key) - w->any_keys.begin();
          finish_waiter(w, proto::frame_builder(proto::op::integer).i64(at).finish());
          continue;
        }
        if (!w->missing.empty()) continue;
        if (w->what == store_waiter::kind::get)
          finish_waiter(w, proto::frame_builder(proto::op::value, value.size() + 8).str(value).finish());
        else
          finish_waiter(w, proto::frame_builder(proto::op::ok).finish());
      }
    }
  }
}

EBBFLOW_DECL void server_impl::finish_waiter(const std::shared_ptr<store_waiter>& w, std::string frame) {
  w->done = true;
  w->timer.cancel();
  for (const auto& k : w->missing) {
    auto [b, e] = waiters_.equal_range(k);
    for (auto it = b; it != e;) it = it->second == w ? waiters_.erase(it) : std::next(it);
  }
  if (auto c = w->conn.lock()) c->complete(std::move(frame));
}

EBBFLOW_DECL void server_impl::cancel_waiter(const std::shared_ptr<store_waiter>& w) noexcept {
  if (w->done) return;
  w->done = true;
  w->timer.cancel();
  for (const auto& k : w->missing) {
    auto [b, e] = waiters_.equal_range(k);
    for (auto it = b; it != e;) it = it->second == w ? waiters_.erase(it) : std::next(it);
  }
}

EBBFLOW_DECL std::string server_impl::register_waiter(const std::shared_ptr<server_conn>& conn, const proto::message& m,
                                                store_waiter::kind what) {
  auto w = std::make_shared<store_waiter>(strand_);
  w->conn = conn;
  w->what = what;
  w->timeout_ms = m.timeout_ms;
  if (what == store_waiter::kind::get) {
    w->get_key = std::string(m.key);
    w->missing.insert(w->get_key);
    w->total = 1;
  } else {
    w->total = m.keys.size();
    for (auto k : m.keys)
      if (!data_.contains(std::string(k))) w->missing.emplace(k);
    if (what == store_waiter::kind::any) w->any_keys.assign(m.keys.begin(), m.keys.end());
  }
  auto timeout_reply = [w] {
    std::ostringstream os;
    if (w->what == store_waiter::kind::get) {
      os << "get: key " << quote_key(w->get_key) << " not set within " << w->timeout_ms << " ms";
    } else {
      if (w->what == store_waiter::kind::any)
        os << "wait_any: none of " << w->total << " keys set within " << w->timeout_ms << " ms:";
      else
        os << "wait: " << w->missing.size() << " of " << w->total << " keys still missing after " << w->timeout_ms
           << " ms:";
      int n = 0;
      for (const auto& k : w->missing) {
        if (n++ == 5) {
          os << " ...";
          break;
        }
        os << ' ' << quote_key(k);
      }
    }
    return proto::error_frame(errc::timeout, os.str());
  };
  if (m.timeout_ms == 0) return timeout_reply();
  for (const auto& k : w->missing) waiters_.emplace(k, w);
  conn->set_waiter(w);
  if (m.timeout_ms != proto::no_timeout) {
    w->timer.expires_after(std::chrono::milliseconds(m.timeout_ms));
    w->timer.async_wait([self = shared_from_this(), w, timeout_reply](const boost::system::error_code& ec) {
      if (ec || w->done) return;
      self->finish_waiter(w, timeout_reply());
    });
  }
  return {};
}

EBBFLOW_DECL std::string server_impl::execute(const std::shared_ptr<server_conn>& conn, const proto::message& m) {
  using proto::frame_builder;
  using proto::op;
  switch (m.code) {
    case op::set: {
      std::string key(m.key);
      auto& slot = data_[key];
      slot.assign(m.value);
      notify(key, proto::event_kind::set, m.value);
      return frame_builder(op::ok).finish();
    }
    case op::get: {
      if (auto it = data_.find(std::string(m.key)); it != data_.end())
        return frame_builder(op::value, it->second.size() + 8).str(it->second).finish();
      if (!m.flag) return frame_builder(op::missing).finish();
      return register_waiter(conn, m, store_waiter::kind::get);
    }
    case op::add: {
      std::string key(m.key);
      auto it = data_.find(key);
      std::string why;
      const auto sum =
          add_to_counter(it == data_.end() ? std::string_view() : std::string_view(it->second), m.integer, why);
      if (!sum) return proto::error_frame(errc::invalid_state, "add: value of " + quote_key(key) + " " + why);
      const std::int64_t next = *sum;
      std::string text = std::to_string(next);
      data_[key] = text;
      notify(key, proto::event_kind::set, text);
      return frame_builder(op::integer).i64(next).finish();
    }
    case op::compare_set: {
      std::string key(m.key);
      auto it = data_.find(key);
      const bool match = it == data_.end() ? m.expected.empty() : it->second == m.expected;
      if (match) {
        data_[key].assign(m.value);
        notify(key, proto::event_kind::set, m.value);
        return frame_builder(op::cas_result, m.value.size() + 8).u8(1).str(m.value).finish();
      }
      std::string_view cur = it == data_.end() ? std::string_view{} : std::string_view(it->second);
      return frame_builder(op::cas_result, cur.size() + 8).u8(0).str(cur).finish();
    }
    case op::wait: {
      bool all = true;
      for (auto k : m.keys)
        if (!data_.contains(std::string(k))) {
          all = false;
          break;
        }
      if (all) return frame_builder(op::ok).finish();
      return register_waiter(conn, m, store_waiter::kind::all);
    }
    case op::wait_any: {
      if (m.keys.empty()) return proto::error_frame(errc::bad_message, "wait_any: no keys to wait for");
      for (std::size_t i = 0; i < m.keys.size(); ++i)
        if (data_.contains(std::string(m.keys[i]))) return frame_builder(op::integer).i64(std::int64_t(i)).finish();
      return register_waiter(conn, m, store_waiter::kind::any);
    }
    case op::erase: {
      const bool existed = data_.erase(std::string(m.key)) > 0;
      if (existed) notify(std::string(m.key), proto::event_kind::erase, {});
      return frame_builder(op::boolean).u8(existed ? 1 : 0).finish();
    }
    case op::num_keys:
      return frame_builder(op::integer).i64(static_cast<std::int64_t>(data_.size())).finish();
    case op::check: {
      bool all = true;
      for (auto k : m.keys) all = all && data_.contains(std::string(k));
      return frame_builder(op::boolean).u8(all ? 1 : 0).finish();
    }
    case op::watch: {
      std::string prefix(m.key);
      watchers_.emplace_back(conn, prefix);
      conn->set_watching();
      conn->send(frame_builder(op::ok).finish());
      if (m.flag)
        for (const auto& [k, v] : data_)
          if (k.starts_with(prefix))
            conn->send(frame_builder(op::event, k.size() + v.size() + 16)
                           .u8(static_cast<std::uint8_t>(proto::event_kind::set))
                           .str(k)
                           .str(v)
                           .finish());
      return {};
    }
    case op::ping:
      return frame_builder(op::ok).finish();
    default:
      return proto::error_frame(errc::bad_message,
                                std::string("unexpected opcode ") + proto::op_name(m.code) + " from a client");
  }
}

}  // namespace detail

// ------------------------------------------------------------------ store_server

EBBFLOW_DECL server_options server_options::from_environment() {
  server_options o;
  if (auto t = env::get("EBBFLOW_TOKEN")) o.token = *t;
  if (auto v = env::get("EBBFLOW_STORE_TLS_CERT")) o.tls.cert_file = *v;
  if (auto v = env::get("EBBFLOW_STORE_TLS_KEY")) o.tls.key_file = *v;
  if (auto v = env::get("EBBFLOW_STORE_TLS_CLIENT_CA")) o.tls.ca_file = *v;
  o.tls.require_client_cert = env::get_bool("EBBFLOW_STORE_TLS_REQUIRE_CLIENT_CERT", false);
  return o;
}

EBBFLOW_DECL store_server::store_server(server_options opts) : own_ioc_(std::make_unique<boost::asio::io_context>(1)) {
  impl_ = std::make_shared<detail::server_impl>(*own_ioc_, std::move(opts));
  host_ = impl_->opts().host;
  port_ = impl_->port();
  impl_->start();
  thread_ = std::thread([ioc = own_ioc_.get()] {
    for (;;) {
      try {
        ioc->run();
        return;
      } catch (const std::exception& e) {
        // A handler should never throw (only std::bad_alloc can); keep serving.
        EBBFLOW_LOG_ERROR("store: handler threw: " << e.what());
      }
    }
  });
  ::ebbflow::detail::name_thread(thread_, "ebbflow-store");
}

EBBFLOW_DECL store_server::store_server(boost::asio::io_context& ioc, server_options opts) {
  impl_ = std::make_shared<detail::server_impl>(ioc, std::move(opts));
  host_ = impl_->opts().host;
  port_ = impl_->port();
  impl_->start();
}

EBBFLOW_DECL store_server::~store_server() {
  stop();
  if (own_ioc_) {
    // Let the stop handler run, then end the loop (pending handlers die with the io_context).
    boost::asio::post(impl_->strand(), [ioc = own_ioc_.get()] { ioc->stop(); });
    if (thread_.joinable()) thread_.join();
    impl_.reset();
    own_ioc_.reset();
  }
}

EBBFLOW_DECL std::string store_server::address() const {
  return std::string(impl_ && impl_->opts().tls.enabled() ? "tcp+tls://" : "") +
         (host_.find(':') != std::string::npos ? "[" + host_ + "]" : host_) + ":" + std::to_string(port_);
}

EBBFLOW_DECL server_stats store_server::stats() const noexcept { return impl_->stats(); }

EBBFLOW_DECL void store_server::stop() noexcept {
  if (impl_) impl_->stop();
}

EBBFLOW_DECL open_file_limit raise_open_file_limit() noexcept {
  rlimit l{};
  if (::getrlimit(RLIMIT_NOFILE, &l) != 0) return {};
  const open_file_limit before{static_cast<std::uint64_t>(l.rlim_cur), static_cast<std::uint64_t>(l.rlim_max)};
  if (l.rlim_cur < l.rlim_max) {  // never infinite for open files (fs.nr_open bounds both)
    l.rlim_cur = l.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &l);
  }
  return before;
}

}  // namespace elastic
EBBFLOW_END_NAMESPACE
#endif  // EBBFLOW_HEADER_ONLY
