// SPDX-License-Identifier: Apache-2.0
//! @file impl/store_server.hpp
//! Definitions of `store_server` (included by elastic/store.hpp).
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/env.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/core/log.hpp>
#include <ebbflow/core/thread_name.hpp>
#include <ebbflow/elastic/detail/hmac.hpp>
#include <ebbflow/elastic/detail/store_protocol.hpp>
#include <ebbflow/elastic/kv_store.hpp>
#include <ebbflow/elastic/store.hpp>

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

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {
namespace detail {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

class server_conn;

//! A server-side `wait`, `wait_any` or waiting `get`.
struct store_waiter {
  enum class kind { all, any, get };
  explicit store_waiter(const asio::any_io_executor& ex) : timer(ex) {}
  std::weak_ptr<server_conn> conn;
  std::set<std::string> missing;  // keys not yet set
  std::size_t total = 0;
  kind what = kind::all;
  std::string get_key;
  std::vector<std::string> any_keys;  // wait_any: the keys in request order (the reply is an index)
  std::uint32_t timeout_ms = 0;
  bool done = false;
  asio::steady_timer timer;
};

//! All store state. Every member is touched only on `strand_`.
class server_impl : public std::enable_shared_from_this<server_impl> {
 public:
  using strand_t = asio::strand<asio::io_context::executor_type>;

  server_impl(asio::io_context& ioc, server_options opts)
      : strand_(asio::make_strand(ioc)), acceptor_(strand_), retry_(strand_), opts_(std::move(opts)) {
    EBBFLOW_ENFORCE(!opts_.host.empty(), "store_server: empty host");
    EBBFLOW_ENFORCE(opts_.max_message_bytes >= 64 && opts_.max_message_bytes <= 0xffffffffu,
                    "store_server: max_message_bytes " << opts_.max_message_bytes << " not in [64, 2^32)");
    EBBFLOW_ENFORCE(opts_.frame_timeout.count() > 0 && opts_.auth_timeout.count() > 0,
                    "store_server: timeouts must be positive");
    EBBFLOW_ENFORCE(opts_.max_connections > 0, "store_server: max_connections must be positive");
    error_context ctx{-1, -1, -1, "store.listen", opts_.host + ":" + std::to_string(opts_.port)};
    boost::system::error_code ec;
    tcp::resolver res(ioc);
    auto eps = res.resolve(opts_.host, std::to_string(opts_.port), tcp::resolver::passive, ec);
    if (ec || eps.empty()) throw_if(ec ? std::error_code(ec) : make_error_code(std::errc::address_not_available), ctx);
    const tcp::endpoint ep = eps.begin()->endpoint();
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    throw_if(ec, ctx);
    port_ = acceptor_.local_endpoint().port();
    if (opts_.token.empty())
      EBBFLOW_LOG_WARN("store: serving on " << opts_.host << ":" << port_
                                            << " without a job token (EBBFLOW_TOKEN unset): any local client can join");
    EBBFLOW_LOG_INFO("store: listening on " << opts_.host << ":" << port_);
  }

  void start() {
    asio::post(strand_, [self = shared_from_this()] { self->accept(); });
  }
  void stop() noexcept;

  std::uint16_t port() const noexcept { return port_; }
  server_stats stats() const noexcept {
    return {accepted_.load(std::memory_order_relaxed), unauthorized_.load(std::memory_order_relaxed),
            protocol_errors_.load(std::memory_order_relaxed), open_.load(std::memory_order_relaxed)};
  }

  // ---- used by server_conn (on the strand)
  const server_options& opts() const noexcept { return opts_; }
  strand_t& strand() noexcept { return strand_; }
  void count_unauthorized() noexcept { unauthorized_.fetch_add(1, std::memory_order_relaxed); }
  void count_protocol_error() noexcept { protocol_errors_.fetch_add(1, std::memory_order_relaxed); }
  void forget(std::uint64_t id) noexcept {
    if (conns_.erase(id)) open_.fetch_sub(1, std::memory_order_relaxed);
  }

  //! Executes one authenticated request; returns the reply frame, or an
  //! empty string when the reply comes later (a registered waiter).
  std::string execute(const std::shared_ptr<server_conn>& conn, const proto::message& m);
  void cancel_waiter(const std::shared_ptr<store_waiter>& w) noexcept;
  void remove_watcher(const server_conn* c) noexcept {
    std::erase_if(watchers_, [c](const auto& w) { return w.first.expired() || w.first.lock().get() == c; });
  }

 private:
  void accept();
  void notify(const std::string& key, proto::event_kind kind, std::string_view value);
  void finish_waiter(const std::shared_ptr<store_waiter>& w, std::string frame);
  std::string register_waiter(const std::shared_ptr<server_conn>& conn, const proto::message& m,
                              store_waiter::kind what);

  strand_t strand_;
  tcp::acceptor acceptor_;
  asio::steady_timer retry_;
  server_options opts_;
  std::uint16_t port_ = 0;
  bool stopped_ = false;
  bool accept_failing_ = false;  // an accept error was logged; cleared by the next accepted connection
  std::uint64_t next_id_ = 0;
  std::unordered_map<std::string, std::string> data_;
  std::unordered_multimap<std::string, std::shared_ptr<store_waiter>> waiters_;
  std::vector<std::pair<std::weak_ptr<server_conn>, std::string>> watchers_;  // (conn, prefix)
  std::unordered_map<std::uint64_t, std::weak_ptr<server_conn>> conns_;
  std::atomic<std::uint64_t> accepted_{0}, unauthorized_{0}, protocol_errors_{0}, open_{0};
};

//! One client connection: frames in, replies and events out.
class server_conn : public std::enable_shared_from_this<server_conn> {
 public:
  server_conn(std::shared_ptr<server_impl> srv, tcp::socket s, std::uint64_t id)
      : srv_(std::move(srv)), sock_(std::move(s)), timer_(srv_->strand()), id_(id) {
    boost::system::error_code ec;
    auto ep = sock_.remote_endpoint(ec);
    peer_ = ec ? std::string("?") : ep.address().to_string() + ":" + std::to_string(ep.port());
    sock_.set_option(tcp::no_delay(true), ec);
  }

  void start() {
    server_nonce_ = random_bytes(proto::nonce_bytes);
    send(proto::frame_builder(proto::op::challenge).u8(proto::version).raw(server_nonce_).finish());
    arm_timer(srv_->opts().auth_timeout);
    read();
  }

  //! Rejects the connection (e.g. too many connections) with an error frame.
  void reject(errc code, std::string reason) { fail(code, std::move(reason), false); }

  void send(std::string frame) {
    if (closed_) return;
    out_bytes_ += frame.size();
    outq_.push_back(std::move(frame));
    if (out_bytes_ > srv_->opts().max_pending_output_bytes) {
      EBBFLOW_LOG_WARN("store: closing connection from " << peer_ << ": " << out_bytes_
                                                         << " bytes of replies/events unsent (client not reading)");
      srv_->count_protocol_error();
      close();
      return;
    }
    if (!writing_) write();
  }

  //! The reply of a request that waited.
  void complete(std::string frame) {
    busy_ = false;
    waiter_.reset();
    send(std::move(frame));
    while (!busy_ && !closed_ && !pending_.empty()) {
      std::string body = std::move(pending_.front());
      pending_.pop_front();
      handle(body);
    }
  }

  void set_watching() noexcept { watching_ = true; }
  bool watching() const noexcept { return watching_; }
  const std::string& peer() const noexcept { return peer_; }

  //! Closes at once (server stop, slow watcher).
  void close() noexcept {
    if (closed_) return;
    closed_ = true;
    boost::system::error_code ec;
    timer_.cancel();
    if (waiter_) srv_->cancel_waiter(waiter_);
    waiter_.reset();
    if (watching_) srv_->remove_watcher(this);
    sock_.close(ec);
    srv_->forget(id_);
  }

 private:
  void arm_timer(std::chrono::milliseconds after) {
    timer_.expires_after(after);
    const std::uint64_t seq = frame_seq_;
    armed_seq_ = seq;
    timer_armed_ = true;
    timer_.async_wait([self = shared_from_this(), seq](const boost::system::error_code& ec) {
      if (ec || self->closed_ || self->draining_) return;
      if (!self->authed_) {
        self->fail(errc::timeout,
                   "no authentication within " + std::to_string(self->srv_->opts().auth_timeout.count()) + " ms");
      } else if (seq == self->frame_seq_ && !self->in_.empty()) {
        std::string why = "read deadline: frame incomplete after " +
                          std::to_string(self->srv_->opts().frame_timeout.count()) + " ms (" +
                          std::to_string(self->in_.size()) + " bytes received";
        if (self->in_.size() >= proto::header_bytes)
          why += " of " + std::to_string(proto::load_u32(self->in_.data()) + proto::header_bytes);
        self->fail(errc::timeout, why + ")");
      }
    });
  }

  void read() {
    if (closed_ || failing_) return;
    sock_.async_read_some(asio::buffer(rbuf_), [self = shared_from_this()](const boost::system::error_code& ec,
                                                                           std::size_t n) { self->on_read(ec, n); });
  }

  void on_read(const boost::system::error_code& ec, std::size_t n) {
    if (closed_ || failing_) return;
    if (ec) {
      if (!in_.empty()) {
        std::string why = "truncated frame: connection closed after " + std::to_string(in_.size()) + " of ";
        why += in_.size() >= proto::header_bytes ? std::to_string(proto::load_u32(in_.data()) + proto::header_bytes)
                                                 : std::string("4 header");
        fail(errc::bad_message, why + " bytes");
      } else {
        EBBFLOW_LOG_DEBUG("store: " << peer_ << " disconnected (" << ec.message() << ")");
        close();
      }
      return;
    }
    in_.append(rbuf_.data(), n);
    // Extract every complete frame.
    std::size_t pos = 0;
    while (!closed_ && !failing_ && in_.size() - pos >= proto::header_bytes) {
      const std::uint32_t len = proto::load_u32(in_.data() + pos);
      const std::size_t limit = authed_ ? srv_->opts().max_message_bytes : proto::preauth_max_message_bytes;
      if (auto why = proto::check_length(len, limit); !why.empty()) {
        if (!authed_) why += " before authentication";
        fail(errc::bad_message, why);
        return;
      }
      if (in_.size() - pos < proto::header_bytes + len) break;
      std::string body = in_.substr(pos + proto::header_bytes, len);
      pos += proto::header_bytes + len;
      ++frame_seq_;
      on_frame(std::move(body));
    }
    if (closed_ || failing_) return;
    in_.erase(0, pos);
    if (authed_) {
      if (in_.empty()) {
        if (timer_armed_) timer_.cancel();
        timer_armed_ = false;
      } else if (!timer_armed_ || armed_seq_ != frame_seq_) {
        arm_timer(srv_->opts().frame_timeout);  // the first bytes of a frame: start its deadline
      }
    }
    read();
  }

  void on_frame(std::string body) {
    if (!authed_) {
      authenticate(body);
      return;
    }
    if (busy_) {
      if (pending_.size() >= 16) {
        fail(errc::bad_message, "more than 16 requests pipelined behind a waiting request");
        return;
      }
      pending_.push_back(std::move(body));
      return;
    }
    handle(body);
  }

  void authenticate(const std::string& body) {
    auto r = proto::decode_body(body);
    if (!r) {
      fail(errc::bad_message, "handshake: " + r.reason);
      return;
    }
    if (r.msg.code != proto::op::auth) {
      fail(errc::unauthorized, std::string("expected auth, got ") + proto::op_name(r.msg.code));
      srv_->count_unauthorized();
      return;
    }
    if (r.msg.flag != proto::version) {
      fail(errc::bad_message, "protocol version " + std::to_string(r.msg.flag) + " not supported (server speaks " +
                                  std::to_string(proto::version) + ")");
      return;
    }
    const std::string& token = srv_->opts().token;
    if (!mac_equal(r.msg.mac, handshake_mac(token, client_label, server_nonce_, r.msg.nonce))) {
      srv_->count_unauthorized();
      fail(errc::unauthorized, "job token does not match", false);
      return;
    }
    authed_ = true;
    timer_.cancel();
    timer_armed_ = false;
    send(proto::frame_builder(proto::op::welcome)
             .raw(handshake_mac(token, server_label, server_nonce_, r.msg.nonce))
             .finish());
    EBBFLOW_LOG_DEBUG("store: " << peer_ << " authenticated");
  }

  void handle(const std::string& body) {
    auto r = proto::decode_body(body);
    if (!r) {
      fail(errc::bad_message, r.reason);
      return;
    }
    if (watching_) {
      fail(errc::bad_message,
           std::string("a watch connection takes no requests (got ") + proto::op_name(r.msg.code) + ")");
      return;
    }
    if (static_cast<std::uint8_t>(r.msg.code) >= 0x80 || r.msg.code == proto::op::auth) {
      fail(errc::bad_message, std::string("unexpected opcode ") + proto::op_name(r.msg.code) + " from a client");
      return;
    }
    std::string reply = srv_->execute(shared_from_this(), r.msg);
    if (reply.empty()) return;  // waiting; `complete` sends the reply
    send(std::move(reply));
  }

 public:
  void set_waiter(std::shared_ptr<store_waiter> w) {
    waiter_ = std::move(w);
    busy_ = true;
  }

 private:
  //! Logs, replies with an error frame and closes once it is sent.
  void fail(errc code, std::string reason, bool count = true) {
    if (closed_ || failing_) return;
    failing_ = true;
    if (count && code != errc::unauthorized) srv_->count_protocol_error();
    if (code == errc::unauthorized)
      EBBFLOW_LOG_WARN("store: refused client " << peer_ << ": " << reason);
    else
      EBBFLOW_LOG_WARN("store: closing connection from " << peer_ << ": " << reason);
    if (waiter_) srv_->cancel_waiter(waiter_);
    waiter_.reset();
    if (watching_) srv_->remove_watcher(this);
    watching_ = false;
    pending_.clear();
    outq_.push_back(proto::error_frame(code, reason));
    out_bytes_ += outq_.back().size();  // the write's completion subtracts it again
    // A client that does not read cannot hold the error reply (and us) forever.
    timer_armed_ = false;
    timer_.expires_after(srv_->opts().frame_timeout);
    timer_.async_wait([self = shared_from_this()](const boost::system::error_code& e) {
      if (!e && !self->draining_) self->close();
    });
    if (!writing_) write();
  }

  void write() {
    if (closed_) return;
    if (outq_.empty()) {
      if (failing_) linger();
      return;
    }
    writing_ = true;
    asio::async_write(sock_, asio::buffer(outq_.front()),
                      [self = shared_from_this()](const boost::system::error_code& ec, std::size_t) {
                        self->writing_ = false;
                        if (self->closed_) return;
                        if (ec) {
                          EBBFLOW_LOG_DEBUG("store: write to " << self->peer_ << " failed: " << ec.message());
                          self->close();
                          return;
                        }
                        self->out_bytes_ -= self->outq_.front().size();
                        self->outq_.pop_front();
                        self->write();
                      });
  }

  //! After an error reply: send FIN, then discard input until the peer closes
  //! (or a short deadline), so that unread input does not turn our close into
  //! a reset that destroys the error reply before the client reads it.
  void linger() {
    if (draining_ || closed_) return;
    draining_ = true;
    boost::system::error_code ec;
    sock_.shutdown(tcp::socket::shutdown_send, ec);
    timer_.expires_after(std::min<std::chrono::milliseconds>(srv_->opts().frame_timeout, std::chrono::seconds(1)));
    timer_.async_wait([self = shared_from_this()](const boost::system::error_code& e) {
      if (!e) self->close();
    });
    drain();
  }
  void drain() {
    sock_.async_read_some(asio::buffer(rbuf_),
                          [self = shared_from_this()](const boost::system::error_code& ec, std::size_t) {
                            if (self->closed_) return;
                            if (ec) {
                              self->close();
                              return;
                            }
                            self->drain();
                          });
  }

  std::shared_ptr<server_impl> srv_;
  tcp::socket sock_;
  asio::steady_timer timer_;
  std::uint64_t id_;
  std::string peer_;
  std::string server_nonce_;
  std::array<char, 65536> rbuf_{};
  std::string in_;
  std::deque<std::string> outq_;
  std::deque<std::string> pending_;
  std::size_t out_bytes_ = 0;
  std::uint64_t frame_seq_ = 0, armed_seq_ = 0;
  std::shared_ptr<store_waiter> waiter_;
  bool authed_ = false, busy_ = false, watching_ = false, writing_ = false;
  bool failing_ = false, draining_ = false, closed_ = false, timer_armed_ = false;
};

inline void server_impl::accept() {
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

inline void server_impl::stop() noexcept {
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

inline void server_impl::notify(const std::string& key, proto::event_kind kind, std::string_view value) {
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

inline void server_impl::finish_waiter(const std::shared_ptr<store_waiter>& w, std::string frame) {
  w->done = true;
  w->timer.cancel();
  for (const auto& k : w->missing) {
    auto [b, e] = waiters_.equal_range(k);
    for (auto it = b; it != e;) it = it->second == w ? waiters_.erase(it) : std::next(it);
  }
  if (auto c = w->conn.lock()) c->complete(std::move(frame));
}

inline void server_impl::cancel_waiter(const std::shared_ptr<store_waiter>& w) noexcept {
  if (w->done) return;
  w->done = true;
  w->timer.cancel();
  for (const auto& k : w->missing) {
    auto [b, e] = waiters_.equal_range(k);
    for (auto it = b; it != e;) it = it->second == w ? waiters_.erase(it) : std::next(it);
  }
}

inline std::string server_impl::register_waiter(const std::shared_ptr<server_conn>& conn, const proto::message& m,
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

inline std::string server_impl::execute(const std::shared_ptr<server_conn>& conn, const proto::message& m) {
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

inline server_options server_options::from_environment() {
  server_options o;
  if (auto t = env::get("EBBFLOW_TOKEN")) o.token = *t;
  return o;
}

inline store_server::store_server(server_options opts) : own_ioc_(std::make_unique<boost::asio::io_context>(1)) {
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

inline store_server::store_server(boost::asio::io_context& ioc, server_options opts) {
  impl_ = std::make_shared<detail::server_impl>(ioc, std::move(opts));
  host_ = impl_->opts().host;
  port_ = impl_->port();
  impl_->start();
}

inline store_server::~store_server() {
  stop();
  if (own_ioc_) {
    // Let the stop handler run, then end the loop (pending handlers die with the io_context).
    boost::asio::post(impl_->strand(), [ioc = own_ioc_.get()] { ioc->stop(); });
    if (thread_.joinable()) thread_.join();
    impl_.reset();
    own_ioc_.reset();
  }
}

inline std::string store_server::address() const {
  return (host_.find(':') != std::string::npos ? "[" + host_ + "]" : host_) + ":" + std::to_string(port_);
}

inline server_stats store_server::stats() const noexcept { return impl_->stats(); }

inline void store_server::stop() noexcept {
  if (impl_) impl_->stop();
}

inline open_file_limit raise_open_file_limit() noexcept {
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
