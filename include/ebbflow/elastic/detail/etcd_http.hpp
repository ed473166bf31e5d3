// SPDX-License-Identifier: Apache-2.0
//! @file detail/etcd_http.hpp
//! One HTTP/1.1 connection to one etcd endpoint (Boost.Beast over a plain or
//! TLS socket), blocking with a deadline on every operation: the private
//! io_context runs until the operation completes or the deadline passes,
//! then the operation is cancelled and the connection closed. Serves unary
//! calls of etcd's v3 JSON gateway (`POST /v3/kv/range` ...) and the one
//! streaming call the store uses (`POST /v3/watch`, newline-separated JSON).
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/elastic/detail/io_deadline.hpp>
#include <ebbflow/elastic/detail/tls.hpp>
#include <ebbflow/elastic/store_options.hpp>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

namespace http = boost::beast::http;

//! How an HTTP exchange ended.
enum class http_outcome {
  ok,            //!< a response arrived (any status)
  not_sent,      //!< nothing reached the server (connect failed): safe to retry elsewhere
  lost,          //!< the request may have reached the server, the response did not come back
  timeout,       //!< the deadline passed (the request may have reached the server)
  unauthorized,  //!< TLS refused (`why` says how)
};

//! A connection to one endpoint; see the file comment. Not thread-safe.
class http_connection {
 public:
  http_connection(std::string host, std::uint16_t port, const tls_options& tls, asio::ssl::context* tls_ctx)
      : host_(std::move(host)), port_(port), tls_(tls), tls_ctx_(tls_ctx) {}

  [[nodiscard]] std::string address() const {
    return (host_.find(':') != std::string::npos ? "[" + host_ + "]" : host_) + ":" + std::to_string(port_);
  }
  [[nodiscard]] bool connected() const noexcept { return connected_; }

  void close() noexcept {
    boost::system::error_code ec;
    sock_.close(ec);
    connected_ = false;
    buf_.clear();
    stream_.reset();
  }

  //! POSTs `body` to `target`; the response's status and body in `status`/`out`.
  http_outcome post(const std::string& target, std::string body, deadline d, unsigned& status, std::string& out,
                    std::string& why) {
    if (const auto c = ensure_connected(d, why); c != http_outcome::ok) return c;
    if (const auto w = write_request(target, std::move(body), d, why); w != http_outcome::ok) return w;
    http::response<http::string_body> res;
    std::optional<boost::system::error_code> done;
    http::async_read(sock_, buf_, res, [&](const boost::system::error_code& e, std::size_t) { done = e; });
    if (!run_until(d, done)) return fail(http_outcome::timeout, "no response from " + address() + " in time", why);
    if (*done) return read_failed(*done, why);
    fresh_ = false;
    status = res.result_int();
    out = std::move(res.body());
    if (!res.keep_alive()) close();
    return http_outcome::ok;
  }

  //! Starts a streaming POST (a watch): sends the request and reads the
  //! response header. Then `next_line` returns the messages. The connection
  //! serves nothing else until closed.
  http_outcome open_stream(const std::string& target, std::string body, deadline d, unsigned& status,
                           std::string& why) {
    if (const auto c = ensure_connected(d, why); c != http_outcome::ok) return c;
    if (const auto w = write_request(target, std::move(body), d, why); w != http_outcome::ok) return w;
    stream_ = std::make_unique<http::response_parser<http::string_body>>();
    stream_->body_limit(boost::none);
    std::optional<boost::system::error_code> done;
    http::async_read_header(sock_, buf_, *stream_, [&](const boost::system::error_code& e, std::size_t) { done = e; });
    if (!run_until(d, done)) return fail(http_outcome::timeout, "no watch response from " + address(), why);
    if (*done) return read_failed(*done, why);
    status = stream_->get().result_int();
    return http_outcome::ok;
  }

  //! The next newline-terminated message of the stream, by `d`. A timeout
  //! leaves the stream usable (`timeout`, nothing read); `lost` when it ended.
  http_outcome next_line(deadline d, std::string& line, std::string& why) {
    for (;;) {
      auto& body = stream_->get().body();
      if (const auto nl = body.find('\n'); nl != std::string::npos) {
        line.assign(body, 0, nl);
        body.erase(0, nl + 1);
        return http_outcome::ok;
      }
      if (stream_->is_done()) return fail(http_outcome::lost, "the watch stream from " + address() + " ended", why);
      std::optional<boost::system::error_code> done;
      http::async_read_some(sock_, buf_, *stream_, [&](const boost::system::error_code& e, std::size_t) { done = e; });
      if (!run_until(d, done)) {
        // Cancelling a read leaves a TLS stream in an unknown state: start afresh next time.
        if (sock_.is_tls()) return fail(http_outcome::timeout, "no watch event from " + address() + " in time", why);
        why = "no watch event from " + address() + " in time";
        return http_outcome::timeout;
      }
      if (*done && *done != http::error::need_buffer)
        return fail(http_outcome::lost, "watch on " + address() + " lost: " + done->message(), why);
    }
  }

 private:
  http_outcome fail(http_outcome o, std::string what, std::string& why) {
    why = std::move(what);
    close();
    return o;
  }

  // TLS 1.3: a server that refuses the client's certificate says so after
  // the client's side of the handshake, on the first read.
  http_outcome read_failed(const boost::system::error_code& e, std::string& why) {
    if (sock_.is_tls() && e.category() == asio::error::get_ssl_category()) {
      bool broken = false;
      std::string reason = client_tls_failure(e, sock_, tls_, address(), broken);
      return fail(broken ? http_outcome::lost : http_outcome::unauthorized, "etcd: " + reason, why);
    }
    if (e == http::error::end_of_stream && !sock_.is_tls() && fresh_)
      return fail(http_outcome::unauthorized,
                  "etcd at " + address() +
                      " closed a new connection without answering: it serves TLS? give its address as etcds://",
                  why);
    return fail(http_outcome::lost, "connection to " + address() + " lost: " + e.message(), why);
  }

  http_outcome ensure_connected(deadline d, std::string& why) {
    if (connected_) return http_outcome::ok;
    close();
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
      if (!run_io_until(ioc_, d, done, [&] { res.cancel(); }))
        return fail(http_outcome::not_sent, "resolving " + host_ + " took too long", why);
      if (*done || eps.empty())
        return fail(http_outcome::not_sent, "cannot resolve " + host_ + ": " + done->message(), why);
    }
    sock_ = tls_socket(ioc_.get_executor());
    std::optional<boost::system::error_code> done;
    asio::async_connect(sock_.lowest_layer(), eps,
                        [&](const boost::system::error_code& e, const tcp::endpoint&) { done = e; });
    if (!run_until(d, done)) return fail(http_outcome::not_sent, "connecting to " + address() + " took too long", why);
    if (*done) return fail(http_outcome::not_sent, "cannot connect to " + address() + ": " + done->message(), why);
    sock_.lowest_layer().set_option(tcp::no_delay(true), bec);
    if (tls_ctx_) {
      start_client_tls(sock_, *tls_ctx_, tls_, host_);
      std::optional<boost::system::error_code> hs;
      sock_.tls().async_handshake(asio::ssl::stream_base::client, [&](const boost::system::error_code& e) { hs = e; });
      if (!run_until(d, hs)) return fail(http_outcome::not_sent, "TLS handshake with " + address() + " too slow", why);
      if (*hs) {
        bool broken = false;
        std::string reason = client_tls_failure(*hs, sock_, tls_, address(), broken);
        // client_tls_failure speaks of "the store": here the store is etcd.
        return fail(broken ? http_outcome::not_sent : http_outcome::unauthorized, "etcd: " + reason, why);
      }
    }
    connected_ = true;
    fresh_ = true;
    return http_outcome::ok;
  }

  http_outcome write_request(const std::string& target, std::string body, deadline d, std::string& why) {
    http::request<http::string_body> req{http::verb::post, target, 11};
    req.set(http::field::host, address());
    req.set(http::field::content_type, "application/json");
    req.keep_alive(true);
    req.body() = std::move(body);
    req.prepare_payload();
    std::optional<boost::system::error_code> done;
    http::async_write(sock_, req, [&](const boost::system::error_code& e, std::size_t) { done = e; });
    if (!run_until(d, done)) return fail(http_outcome::timeout, "sending to " + address() + " took too long", why);
    if (*done) {
      // A kept-alive connection the server closed meanwhile: nothing was taken.
      return fail(http_outcome::not_sent, "connection to " + address() + " lost: " + done->message(), why);
    }
    return http_outcome::ok;
  }

  bool run_until(deadline d, std::optional<boost::system::error_code>& done) {
    return run_io_until(ioc_, d, done, [this] {
      boost::system::error_code e;
      sock_.lowest_layer().cancel(e);
    });
  }

  using tcp = asio::ip::tcp;
  std::string host_;
  std::uint16_t port_;
  tls_options tls_;
  asio::ssl::context* tls_ctx_;
  asio::io_context ioc_{1};
  tls_socket sock_{ioc_.get_executor()};
  boost::beast::flat_buffer buf_;
  std::unique_ptr<http::response_parser<http::string_body>> stream_;
  bool connected_ = false;
  bool fresh_ = false;  // connected, nothing answered yet
};

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
