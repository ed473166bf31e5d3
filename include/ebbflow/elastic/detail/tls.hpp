// SPDX-License-Identifier: Apache-2.0
//! @file detail/tls.hpp
//! TLS for the store's connections (Boost.Asio ssl over OpenSSL): a socket
//! that is plain TCP or TLS over TCP behind one stream interface, the
//! contexts made from `tls_options` / `server_tls_options`, and the reason,
//! in words, why a handshake failed (wrong CA, expired certificate, missing
//! client certificate, a peer that does not speak TLS).
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/elastic/store_options.hpp>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <fstream>
#include <memory>
#include <string>
#include <utility>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

namespace asio = boost::asio;

//! A TCP socket, or TLS over one: the same async stream interface either
//! way (AsyncReadStream, AsyncWriteStream), so the store's framing code and
//! Beast's HTTP code run over both. Not thread-safe (as Asio's sockets).
class tls_socket {
 public:
  using tcp = asio::ip::tcp;
  using executor_type = tcp::socket::executor_type;
  using lowest_layer_type = tcp::socket;

  //! A plain socket on `ex`.
  template <class Executor>
  explicit tls_socket(const Executor& ex) : plain_(ex) {}
  //! Takes over a connected socket (the server's accepted ones).
  explicit tls_socket(tcp::socket s) : plain_(std::move(s)) {}
  tls_socket(tls_socket&&) = default;
  tls_socket& operator=(tls_socket&&) = default;

  //! From now on traffic goes through TLS with `ctx` (call before the
  //! handshake, on a connected socket). `ctx` must outlive the socket.
  void enable_tls(asio::ssl::context& ctx) {
    tls_ = std::make_unique<asio::ssl::stream<tcp::socket>>(std::move(plain_), ctx);
    plain_ = tcp::socket(tls_->get_executor());
  }
  [[nodiscard]] bool is_tls() const noexcept { return tls_ != nullptr; }
  [[nodiscard]] asio::ssl::stream<tcp::socket>& tls() noexcept { return *tls_; }

  executor_type get_executor() noexcept { return tls_ ? tls_->get_executor() : plain_.get_executor(); }
  tcp::socket& lowest_layer() noexcept { return tls_ ? tls_->next_layer() : plain_; }
  tcp::socket& next_layer() noexcept { return lowest_layer(); }

  template <class MutableBuffers, class Handler>
  void async_read_some(const MutableBuffers& b, Handler&& h) {
    if (tls_)
      tls_->async_read_some(b, std::forward<Handler>(h));
    else
      plain_.async_read_some(b, std::forward<Handler>(h));
  }
  template <class ConstBuffers, class Handler>
  void async_write_some(const ConstBuffers& b, Handler&& h) {
    if (tls_)
      tls_->async_write_some(b, std::forward<Handler>(h));
    else
      plain_.async_write_some(b, std::forward<Handler>(h));
  }

  //! Closes the TCP socket (no TLS close_notify: the store's peers take a
  //! closed connection as the end of it either way).
  void close(boost::system::error_code& ec) noexcept { lowest_layer().close(ec); }

 private:
  tcp::socket plain_;
  std::unique_ptr<asio::ssl::stream<tcp::socket>> tls_;
};

//! Throws std::invalid_argument naming `what` when `path` cannot be read.
inline void require_readable(const std::string& path, const char* what) {
  EBBFLOW_ENFORCE(std::ifstream(path).good(), what << " '" << path << "' cannot be read");
}

//! The client's TLS context: verifies the server against `o.ca_file` (the
//! system's CAs when empty) and presents `o.cert_file`/`o.key_file` when set.
//! @throws std::invalid_argument naming a file that cannot be read or loaded.
inline std::unique_ptr<asio::ssl::context> client_tls_context(const tls_options& o) {
  auto ctx = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_client);
  ctx->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                   asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 | asio::ssl::context::no_tlsv1_1);
  boost::system::error_code ec;
  if (o.ca_file.empty()) {
    ctx->set_default_verify_paths(ec);
  } else {
    require_readable(o.ca_file, "TLS CA file (EBBFLOW_TLS_CA)");
    ctx->load_verify_file(o.ca_file, ec);
    EBBFLOW_ENFORCE(!ec, "TLS CA file '" << o.ca_file << "': " << ec.message());
  }
  ctx->set_verify_mode(asio::ssl::verify_peer);
  EBBFLOW_ENFORCE(o.cert_file.empty() == o.key_file.empty(),
                  "TLS client certificate and key go together (EBBFLOW_TLS_CERT='"
                      << o.cert_file << "', EBBFLOW_TLS_KEY='" << o.key_file << "')");
  if (!o.cert_file.empty()) {
    require_readable(o.cert_file, "TLS client certificate (EBBFLOW_TLS_CERT)");
    require_readable(o.key_file, "TLS client key (EBBFLOW_TLS_KEY)");
    ctx->use_certificate_chain_file(o.cert_file, ec);
    EBBFLOW_ENFORCE(!ec, "TLS client certificate '" << o.cert_file << "': " << ec.message());
    ctx->use_private_key_file(o.key_file, asio::ssl::context::pem, ec);
    EBBFLOW_ENFORCE(!ec, "TLS client key '" << o.key_file << "': " << ec.message());
  }
  return ctx;
}

//! The server's TLS context: presents `o.cert_file`/`o.key_file`; with
//! `o.ca_file`, verifies client certificates (required with
//! `o.require_client_cert`). @throws std::invalid_argument as above.
inline std::unique_ptr<asio::ssl::context> server_tls_context(const server_tls_options& o) {
  auto ctx = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_server);
  ctx->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                   asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 | asio::ssl::context::no_tlsv1_1 |
                   asio::ssl::context::single_dh_use);
  boost::system::error_code ec;
  require_readable(o.cert_file, "store TLS certificate (--tls-cert)");
  require_readable(o.key_file, "store TLS key (--tls-key)");
  ctx->use_certificate_chain_file(o.cert_file, ec);
  EBBFLOW_ENFORCE(!ec, "store TLS certificate '" << o.cert_file << "': " << ec.message());
  ctx->use_private_key_file(o.key_file, asio::ssl::context::pem, ec);
  EBBFLOW_ENFORCE(!ec, "store TLS key '" << o.key_file << "': " << ec.message());
  EBBFLOW_ENFORCE(!o.require_client_cert || !o.ca_file.empty(),
                  "store: require_client_cert needs ca_file, the CA that signs the client certificates");
  if (!o.ca_file.empty()) {
    require_readable(o.ca_file, "store TLS client CA (--tls-client-ca)");
    ctx->load_verify_file(o.ca_file, ec);
    EBBFLOW_ENFORCE(!ec, "store TLS client CA '" << o.ca_file << "': " << ec.message());
    ctx->set_verify_mode(o.require_client_cert ? asio::ssl::verify_peer | asio::ssl::verify_fail_if_no_peer_cert
                                               : asio::ssl::verify_peer);
  }
  return ctx;
}

//! Prepares a connected client socket for TLS to `host` (SNI, and the name
//! the server's certificate must carry: `o.server_name`, else `host`).
inline void start_client_tls(tls_socket& s, asio::ssl::context& ctx, const tls_options& o, const std::string& host) {
  s.enable_tls(ctx);
  const std::string& name = o.server_name.empty() ? host : o.server_name;
  boost::system::error_code ec;
  if (asio::ip::make_address(name, ec); ec)  // SNI carries names, not addresses
    SSL_set_tlsext_host_name(s.tls().native_handle(), name.c_str());
  s.tls().set_verify_callback(asio::ssl::host_name_verification(name));
}

//! Why a TLS handshake or the first read after it failed, in words, from the
//! client's side; `ca_file` is named when the server's certificate did not
//! verify. The code to report with it is errc::unauthorized, except for a
//! connection that merely broke (peer_lost: `broken` set).
inline std::string client_tls_failure(const boost::system::error_code& e, tls_socket& s, const tls_options& o,
                                      const std::string& where, bool& broken) {
  broken = false;
  if (s.is_tls()) {
    const long v = SSL_get_verify_result(s.tls().native_handle());
    const std::string ca = o.ca_file.empty() ? std::string("the system's CAs") : "'" + o.ca_file + "'";
    switch (v) {
      case X509_V_OK:
        break;
      case X509_V_ERR_CERT_HAS_EXPIRED:
        return "the certificate of the store at " + where + " has expired (X509: " +
               X509_verify_cert_error_string(v) + ")";
      case X509_V_ERR_CERT_NOT_YET_VALID:
        return "the certificate of the store at " + where + " is not valid yet";
      case X509_V_ERR_HOSTNAME_MISMATCH:
      case X509_V_ERR_IP_ADDRESS_MISMATCH:
        return "the certificate of the store at " + where + " is for another host name (set tls server_name, "
               "EBBFLOW_TLS_SERVER_NAME, to the name it carries)";
      default:
        return "the certificate of the store at " + where + " is not signed by the CA in " + ca +
               " (wrong CA? X509: " + X509_verify_cert_error_string(v) + ")";
    }
  }
  if (e.category() == asio::error::get_ssl_category()) {
    const int reason = ERR_GET_REASON(static_cast<unsigned long>(e.value()));
    switch (reason) {
      case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
        return "the store at " + where + " refused this client's certificate: it has expired";
      case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
      case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
      case SSL_R_SSLV3_ALERT_HANDSHAKE_FAILURE:
#ifdef SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED
      case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
#endif
        // Servers answer a missing certificate with one of several alerts
        // (OpenSSL: certificate required; Go, i.e. etcd: bad certificate).
        if (o.cert_file.empty())
          return "the store at " + where +
                 " requires a client certificate (mutual TLS): set EBBFLOW_TLS_CERT and EBBFLOW_TLS_KEY";
        return "the store at " + where +
               " refused this client's certificate: it is not signed by a CA the store trusts";
      case SSL_R_WRONG_VERSION_NUMBER:
      case SSL_R_PACKET_LENGTH_TOO_LONG:
        return "the store at " + where +
               " does not speak TLS: it is a plaintext store (give its address as host:port, not tcp+tls://)";
      default:
        return "TLS with the store at " + where + " failed: " + e.message();
    }
  }
  if (e == asio::error::eof || e == asio::ssl::error::stream_truncated) {
    // TLS 1.3: a server that rejects the client's certificate closes after
    // the client finished its side of the handshake.
    broken = false;
    return "the store at " + where +
           " closed the TLS connection during the handshake (a client certificate it requires is missing or "
           "not trusted, or it is not a TLS store)";
  }
  broken = true;
  return "connection to " + where + " lost during the TLS handshake: " + e.message();
}

//! The server's words for a failed TLS handshake with a client.
inline std::string server_tls_failure(const boost::system::error_code& e, tls_socket& s) {
  const long v = s.is_tls() ? SSL_get_verify_result(s.tls().native_handle()) : X509_V_OK;
  if (v == X509_V_ERR_CERT_HAS_EXPIRED) return "the client's certificate has expired";
  if (v != X509_V_OK)
    return std::string("the client's certificate did not verify (") + X509_verify_cert_error_string(v) + ")";
  if (e.category() == asio::error::get_ssl_category()) {
    const int reason = ERR_GET_REASON(static_cast<unsigned long>(e.value()));
    if (reason == SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE)
      return "the client presented no certificate, and this store requires one (mutual TLS)";
    if (reason == SSL_R_TLSV1_ALERT_UNKNOWN_CA || reason == SSL_R_SSLV3_ALERT_BAD_CERTIFICATE)
      return "the client does not trust this store's certificate (it has another CA)";
    if (reason == SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED)
      return "the client refused this store's certificate: it has expired";
    if (reason == SSL_R_WRONG_VERSION_NUMBER || reason == SSL_R_HTTP_REQUEST || reason == SSL_R_HTTPS_PROXY_REQUEST)
      return "the client does not speak TLS";
  }
  return "TLS handshake failed: " + e.message();
}

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
