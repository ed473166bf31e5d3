// SPDX-License-Identifier: Apache-2.0
//! @file detail/client_connection.hpp
//! The store client's side of one TCP connection to a store server: a
//! blocking connection whose every operation has a deadline (started
//! asynchronously; the private io_context runs until it completes or the
//! deadline passes, then it is cancelled), the HMAC handshake, and the
//! request frames the client builds.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/core/env.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/core/log.hpp>
#include <ebbflow/elastic/detail/hmac.hpp>
#include <ebbflow/elastic/detail/io_deadline.hpp>
#include <ebbflow/elastic/detail/store_protocol.hpp>
#include <ebbflow/elastic/detail/tls.hpp>
#include <ebbflow/elastic/store_options.hpp>
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

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {
namespace detail {

namespace asio = boost::asio;

//! A blocking connection with deadlines: each operation is started
//! asynchronously and the private io_context is run until it completes or
//! the deadline passes (then the operation is cancelled).
class client_connection {
 public:
  client_connection(std::string host, std::uint16_t port, std::string token, std::size_t max_bytes,
                    tls_options tls = {})
      : host_(std::move(host)), port_(port), token_(std::move(token)), max_bytes_(max_bytes), tls_(std::move(tls)) {
    if (tls_.enabled) tls_ctx_ = client_tls_context(tls_);
  }

  std::mutex mu;            //!< serialises calls of a store_client
  std::string last_detail;  //!< reason of the last failure

  [[nodiscard]] bool connected() const noexcept { return connected_; }
  [[nodiscard]] std::string address() const { return host_ + ":" + std::to_string(port_); }

  void close() noexcept {
    boost::system::error_code ec;
    sock_.close(ec);
    in_.clear();
    connected_ = false;
    authenticated_ = false;
  }

  //! Connects (retrying refused connections until `d`) and runs the handshake.
  void connect(deadline d, std::error_code& ec) {
    close();
    ec.clear();
    boost::system::error_code bec;
    std::vector<tcp::endpoint> eps;
    if (auto a = asio::ip::make_address(host_, bec); !bec) {
      eps.emplace_back(a, port_);
    } else {
      tcp::resolver res(ioc_);
      std::optional<boost::system::error_code> done;
      res.async_resolve(host_, std::to_string(port_),
                        [&](const boost::system::error_code& e, const tcp::resolver::results_type& r) {
                          done = e;
                          for (const auto& x : r) eps.push_back(x.endpoint());
                        });
      if (!run_io_until(ioc_, d, done, [&] { res.cancel(); })) return fail(ec, error::timeout, "resolving " + host_);
      if (*done || eps.empty()) return fail(ec, error::peer_lost, "cannot resolve " + host_ + ": " + done->message());
    }
    auto backoff = std::chrono::milliseconds(5);
    for (;;) {
      std::optional<boost::system::error_code> done;
      sock_ = tls_socket(ioc_.get_executor());
      asio::async_connect(sock_.lowest_layer(), eps,
                          [&](const boost::system::error_code& e, const tcp::endpoint&) { done = e; });
      if (!run_io_until(ioc_, d, done, [&] { sock_.close(bec); }))
        return fail(ec, error::timeout, "connecting to " + address());
      if (!*done) break;
      const bool retry = *done == asio::error::connection_refused || *done == asio::error::timed_out ||
                         *done == asio::error::network_unreachable || *done == asio::error::host_unreachable;
      // The store may not be up yet (ranks can start before it): retry until the deadline.
      if (!retry || d.remaining() <= backoff)
        return fail(ec, error::peer_lost, "cannot connect to " + address() + ": " + done->message());
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
    }
    sock_.lowest_layer().set_option(tcp::no_delay(true), bec);
    connected_ = true;
    if (tls_ctx_) {
      start_client_tls(sock_, *tls_ctx_, tls_, host_);
      std::optional<boost::system::error_code> done;
      sock_.tls().async_handshake(asio::ssl::stream_base::client,
                                  [&](const boost::system::error_code& e) { done = e; });
      if (!run_io_until(ioc_, d, done, [&] { sock_.close(bec); }))
        return fail(ec, error::timeout, "TLS handshake with " + address() + " not done before the deadline");
      if (*done) return tls_fail(ec, *done);
    }
    // Handshake.
    // A refusal during the handshake ends the connection whatever its code:
    // the next call connects anew.
    auto r = read_frame(d, ec, false);
    if (ec) return;
    if (r.msg.code == proto::op::error) return server_error(ec, r.msg, true);
    if (r.msg.code != proto::op::challenge || r.msg.flag != proto::version)
      return fail(ec, error::bad_message,
                  std::string("handshake: expected challenge v") + std::to_string(proto::version) + ", got " +
                      proto::op_name(r.msg.code) + " v" + std::to_string(r.msg.flag));
    const std::string server_nonce(r.msg.nonce);
    const std::string client_nonce = random_bytes(proto::nonce_bytes);
    write_frame(proto::frame_builder(proto::op::auth, 80)
                    .u8(proto::version)
                    .raw(client_nonce)
                    .raw(handshake_mac(token_, client_label, server_nonce, client_nonce))
                    .finish(),
                d, ec);
    if (ec) return;
    r = read_frame(d, ec, false);
    if (ec) return;
    if (r.msg.code == proto::op::error) return server_error(ec, r.msg, true);
    if (r.msg.code != proto::op::welcome)
      return fail(ec, error::bad_message,
                  std::string("handshake: expected welcome, got ") + proto::op_name(r.msg.code));
    if (!mac_equal(r.msg.mac, handshake_mac(token_, server_label, server_nonce, client_nonce)))
      return fail(ec, error::unauthorized, "the server at " + address() + " could not prove the job token");
    authenticated_ = true;
  }

  //! False, with `ec` and `last_detail` set, when a request frame is over
  //! the message limit: the server would reject it and drop the connection.
  //! The reason reads "of N bytes exceeds ..."; callers name the request before it.
  bool fits(std::size_t frame_bytes, std::error_code& ec) {
    if (frame_bytes - proto::header_bytes <= max_bytes_) return true;
    ec = make_error_code(error::bad_message);
    last_detail =
        "of " + std::to_string(frame_bytes) + " bytes exceeds max_message_bytes " + std::to_string(max_bytes_);
    return false;
  }

  //! Connects when not connected, then writes `frames` (one request or several).
  void send(const std::string& frames, deadline d, std::error_code& ec) {
    if (!connected_) {
      connect(d, ec);
      if (ec) return;
    }
    write_frame(frames, d, ec);
  }

  //! Reads one reply; an `error` reply from the server becomes `ec`.
  proto::decode_result receive(deadline d, std::error_code& ec) {
    auto r = read_frame(d, ec, false);
    if (!ec && r.msg.code == proto::op::error) server_error(ec, r.msg);
    return r;
  }

  void write_frame(const std::string& frame, deadline d, std::error_code& ec) {
    std::optional<boost::system::error_code> done;
    asio::async_write(sock_, asio::buffer(frame), [&](const boost::system::error_code& e, std::size_t) { done = e; });
    if (!run_io_until(ioc_, d, done, [&] { cancel_io(); })) return fail(ec, error::timeout, "sending to " + address());
    if (*done) return fail(ec, error::peer_lost, "connection to " + address() + " lost: " + done->message());
  }

  //! Reads one frame. Views in the result point into this object until the
  //! next read. On timeout the connection is closed unless `keep_on_timeout`.
  proto::decode_result read_frame(deadline d, std::error_code& ec, bool keep_on_timeout) {
    for (;;) {
      if (in_.size() >= proto::header_bytes) {
        const std::uint32_t len = proto::load_u32(in_.data());
        if (auto why = proto::check_length(len, max_bytes_); !why.empty()) {
          fail(ec, error::bad_message, "reply from " + address() + ": " + why);
          return {};
        }
        if (in_.size() >= proto::header_bytes + len) {
          body_.assign(in_, proto::header_bytes, len);
          in_.erase(0, proto::header_bytes + len);
          auto r = proto::decode_body(body_);
          if (!r) fail(ec, error::bad_message, "reply from " + address() + ": " + r.reason);
          return r;
        }
      }
      std::optional<boost::system::error_code> done;
      std::size_t got = 0;
      sock_.async_read_some(asio::buffer(chunk_), [&](const boost::system::error_code& e, std::size_t n) {
        done = e;
        got = n;
      });
      if (!run_io_until(ioc_, d, done, [&] { cancel_io(); })) {
        if (keep_on_timeout) {
          ec = make_error_code(error::timeout);
          last_detail = "no message from " + address() + " before the deadline";
        } else {
          fail(ec, error::timeout, "no reply from " + address() + " before the deadline");
        }
        return {};
      }
      if (*done) {
        // TLS 1.3 sends the server's verdict on the client's certificate
        // after the client's handshake completed: it arrives on this read.
        if (sock_.is_tls() && !authenticated_ &&
            (done->category() == asio::error::get_ssl_category() || *done == asio::error::eof ||
             *done == asio::ssl::error::stream_truncated)) {
          tls_fail(ec, *done);
          return {};
        }
        fail(ec, error::peer_lost, "connection to " + address() + " lost: " + done->message());
        return {};
      }
      in_.append(chunk_.data(), got);
    }
  }

  //! Sets `ec` from an `error` frame. The server closes the connection after
  //! framing and authentication errors, and after any refusal of the
  //! handshake (`in_handshake`: too many connections, a bad token): so do we.
  void server_error(std::error_code& ec, const proto::message& m, bool in_handshake = false) {
    ec = proto::error_from_wire(m.flag);
    last_detail = std::string(m.value);
    if (in_handshake || (ec != errc::timeout && ec != errc::invalid_state)) close();
  }

  //! A TLS failure: its reason in words (errc::unauthorized), or a broken connection (peer_lost).
  void tls_fail(std::error_code& ec, const boost::system::error_code& e) {
    bool broken = false;
    std::string why = client_tls_failure(e, sock_, tls_, address(), broken);
    fail(ec, broken ? error::peer_lost : error::unauthorized, std::move(why));
  }

  void fail(std::error_code& ec, error e, std::string why) {
    ec = make_error_code(e);
    last_detail = std::move(why);
    close();
  }

 private:
  // Cancels what is pending on the socket. Without throwing: the socket may
  // be closed already (a broken connection, then a call whose deadline had
  // passed before it ran).
  void cancel_io() noexcept {
    boost::system::error_code ignored;
    sock_.lowest_layer().cancel(ignored);
  }

  using tcp = asio::ip::tcp;
  std::string host_;
  std::uint16_t port_;
  std::string token_;
  std::size_t max_bytes_;
  tls_options tls_;
  std::unique_ptr<asio::ssl::context> tls_ctx_;  // before sock_, which may refer to it
  asio::io_context ioc_{1};
  tls_socket sock_{ioc_.get_executor()};
  bool connected_ = false;
  bool authenticated_ = false;
  std::string in_, body_;
  std::array<char, 16384> chunk_{};
};

// The server's wait for `d`, in whole milliseconds rounded up: rounded
// down, less than one left would be 0 (answer at once), and a caller that
// waits in slices would spin through that rest in round trips. The reply
// may come up to a millisecond after `d`, well within call()'s allowance.
inline std::uint32_t timeout_ms_until(deadline d) noexcept {
  if (d.at() == steady_clock::time_point::max()) return proto::no_timeout;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(d.remaining()).count();
  return static_cast<std::uint32_t>(std::min<std::int64_t>(ms, proto::no_timeout - 1));
}

inline std::string keys_frame(proto::op o, const std::vector<std::string>& keys, std::uint32_t timeout_ms,
                              bool with_timeout) {
  std::size_t n = 16;
  for (const auto& k : keys) n += k.size() + 4;
  proto::frame_builder b(o, n);
  if (with_timeout) b.u32(timeout_ms);
  b.u32(static_cast<std::uint32_t>(keys.size()));
  for (const auto& k : keys) b.str(k);
  return b.finish();
}

}  // namespace detail
}  // namespace elastic
EBBFLOW_END_NAMESPACE
