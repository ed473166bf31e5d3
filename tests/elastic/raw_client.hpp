// SPDX-License-Identifier: Apache-2.0
// A deliberately low-level store client over POSIX sockets, for tests that
// must send what a well-behaved client never would (test-only helper).
#pragma once

#include <ebbflow/elastic/detail/hmac.hpp>
#include <ebbflow/elastic/detail/store_protocol.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace ebbflow_test {
namespace proto = ebbflow::elastic::detail::proto;

class raw_conn {
 public:
  explicit raw_conn(std::uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd_ < 0 || ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
      throw std::runtime_error("raw_conn: connect failed");
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  ~raw_conn() {
    if (fd_ >= 0) ::close(fd_);
  }
  raw_conn(const raw_conn&) = delete;
  raw_conn& operator=(const raw_conn&) = delete;

  void send(std::string_view s) {
    while (!s.empty()) {
      const ssize_t n = ::send(fd_, s.data(), s.size(), MSG_NOSIGNAL);
      if (n <= 0) return;  // the server may have closed on us: the test reads the error reply
      s.remove_prefix(static_cast<std::size_t>(n));
    }
  }
  void shutdown_write() { ::shutdown(fd_, SHUT_WR); }

  //! One whole frame (length prefix included), or nullopt on EOF/timeout.
  std::optional<std::string> read_frame(std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (buf_.size() >= 4) {
        const std::uint32_t len = proto::load_u32(buf_.data());
        if (buf_.size() >= 4 + std::size_t{len}) {
          std::string f = buf_.substr(0, 4 + std::size_t{len});
          buf_.erase(0, 4 + std::size_t{len});
          return f;
        }
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char tmp[4096];
      const ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
      if (n <= 0) return std::nullopt;
      buf_.append(tmp, static_cast<std::size_t>(n));
    }
  }
  //! True when the peer has closed (EOF or reset) within `timeout`.
  bool closed_by_peer(std::chrono::milliseconds timeout) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return false;
    char tmp[256];
    return ::recv(fd_, tmp, sizeof tmp, 0) <= 0;
  }

  //! Runs the handshake; true when the server welcomed us.
  bool authenticate(const std::string& token) {
    auto ch = read_frame(std::chrono::seconds(5));
    if (!ch) return false;
    auto r = proto::decode(std::as_bytes(std::span(ch->data(), ch->size())));
    if (!r || r.msg.code != proto::op::challenge) return false;
    const std::string server_nonce(r.msg.nonce);
    const std::string client_nonce(proto::nonce_bytes, 'c');
    namespace d = ebbflow::elastic::detail;
    send(proto::frame_builder(proto::op::auth)
             .u8(proto::version)
             .raw(client_nonce)
             .raw(d::handshake_mac(token, d::client_label, server_nonce, client_nonce))
             .finish());
    auto w = read_frame(std::chrono::seconds(5));
    if (!w) return false;
    auto rw = proto::decode(std::as_bytes(std::span(w->data(), w->size())));
    return rw && rw.msg.code == proto::op::welcome;
  }

 private:
  int fd_ = -1;
  std::string buf_;
};
}  // namespace ebbflow_test
