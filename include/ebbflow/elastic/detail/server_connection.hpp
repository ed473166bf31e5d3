// SPDX-License-Identifier: Apache-2.0
//! @file detail/server_connection.hpp
//! The store server's state (`server_impl`: keys, waiters, watchers,
//! connections; touched only on its strand) and one client connection
//! (`server_conn`): the HMAC handshake, frames in, replies and events out,
//! with a bound on what it buffers for a slow reader.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/env.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/core/log.hpp>
#include <ebbflow/core/thread_name.hpp>
#include <ebbflow/elastic/detail/hmac.hpp>
#include <ebbflow/elastic/detail/store_protocol.hpp>
#include <ebbflow/elastic/detail/tls.hpp>
#include <ebbflow/elastic/store_options.hpp>
#include <ebbflow/elastic/kv_store.hpp>
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
    if (opts_.tls.enabled()) tls_ctx_ = server_tls_context(opts_.tls);
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
  //! The TLS context, or nullptr for a plaintext store.
  asio::ssl::context* tls() const noexcept { return tls_ctx_.get(); }
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
  std::unique_ptr<asio::ssl::context> tls_ctx_;
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
    auto ep = sock_.lowest_layer().remote_endpoint(ec);
    peer_ = ec ? std::string("?") : ep.address().to_string() + ":" + std::to_string(ep.port());
    sock_.lowest_layer().set_option(tcp::no_delay(true), ec);
  }

  void start() {
    if (srv_->tls() && !sock_.is_tls()) {
      start_tls();
      return;
    }
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
  // A TLS store: a TLS client speaks first (its ClientHello); a plaintext
  // client of this protocol waits for the server's challenge. So the first
  // bytes, or their absence for tls_hello_timeout, tell which it is; a
  // plaintext client is told in plaintext that the store needs TLS.
  void start_tls() {
    timer_.expires_after(srv_->opts().tls_hello_timeout);
    timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (ec || self->closed_ || self->hello_seen_) return;
      self->refuse_plaintext("sent nothing for " + std::to_string(self->srv_->opts().tls_hello_timeout.count()) +
                             " ms (a plaintext client waiting for the server)");
    });
    sock_.lowest_layer().async_wait(tcp::socket::wait_read, [self = shared_from_this()](
                                                                 const boost::system::error_code& ec) {
      if (self->closed_ || self->failing_) return;
      if (ec) {
        self->close();
        return;
      }
      self->hello_seen_ = true;
      std::array<unsigned char, 1> first{};
      boost::system::error_code pe;
      const auto n = self->sock_.lowest_layer().receive(asio::buffer(first), tcp::socket::message_peek, pe);
      if (pe || n == 0) {
        self->close();
        return;
      }
      if (first[0] != 0x16) {  // not a TLS handshake record
        self->timer_.cancel();
        self->refuse_plaintext("sent a plaintext frame");
        return;
      }
      self->sock_.enable_tls(*self->srv_->tls());
      self->sock_.tls().async_handshake(asio::ssl::stream_base::server,
                                        [self](const boost::system::error_code& e) {
                                          if (self->closed_) return;
                                          self->timer_.cancel();
                                          if (e) {
                                            self->srv_->count_unauthorized();
                                            EBBFLOW_LOG_WARN("store: refused client " << self->peer_ << ": "
                                                                                      << server_tls_failure(e, self->sock_));
                                            self->close();
                                            return;
                                          }
                                          EBBFLOW_LOG_DEBUG("store: TLS with " << self->peer_);
                                          self->start();
                                        });
    });
  }
  void refuse_plaintext(const std::string& what) {
    srv_->count_unauthorized();
    // Plaintext on purpose: this client does not speak TLS.
    fail(errc::unauthorized,
         "this store requires TLS: connect with a tcp+tls:// address and the job's CA (EBBFLOW_TLS_CA); the "
         "client " + what,
         false);
  }

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
        if (!authed_ && pos == 0 && static_cast<unsigned char>(in_[0]) == 0x16 && !sock_.is_tls())
          why += " (it looks like a TLS ClientHello: this store is plaintext; a TLS client needs a store started "
                 "with a certificate)";
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
    sock_.lowest_layer().shutdown(tcp::socket::shutdown_send, ec);
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
  tls_socket sock_;
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
  bool hello_seen_ = false;
};

}  // namespace detail
}  // namespace elastic
EBBFLOW_END_NAMESPACE
