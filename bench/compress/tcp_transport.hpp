// SPDX-License-Identifier: Apache-2.0
// A minimal `comm::transport` over plain POSIX TCP sockets, for the network
// namespace benchmark only (the library's real transport is UCX). Full mesh:
// rank i connects to every j < i and accepts every j > i. One sender and one
// receiver thread per peer; sends are zero-copy (the caller's buffer is
// written by the sender thread), receives match by (peer, tag) in FIFO order,
// unexpected messages are buffered. Errors complete pending requests with
// errc::peer_lost; waits honour their deadline.
#pragma once

#include <ebbflow/comm/transport.hpp>
#include <ebbflow/core/error.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace bench {
namespace ef = ebbflow;

class tcp_transport {
 public:
  struct op {
    std::span<std::byte> in;
    std::span<const std::byte> out;
    bool done = false;
    std::error_code ec;
  };
  struct request {
    std::shared_ptr<op> p;
  };

  //! `addrs[i]` = "ip:port" of rank i. Blocks until the mesh is connected.
  tcp_transport(int rank, std::vector<std::string> addrs) : rank_(rank), size_(static_cast<int>(addrs.size())) {
    peers_.resize(addrs.size());
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in me = parse(addrs[static_cast<std::size_t>(rank)]);
    if (bind(ls, reinterpret_cast<sockaddr*>(&me), sizeof me) != 0 || listen(ls, 64) != 0)
      throw std::runtime_error("bind/listen " + addrs[static_cast<std::size_t>(rank)] + ": " + std::strerror(errno));
    for (int j = 0; j < rank; ++j) {
      sockaddr_in a = parse(addrs[static_cast<std::size_t>(j)]);
      int fd = -1;
      for (int attempt = 0; attempt < 600; ++attempt) {  // up to 60 s for the peer to listen
        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) break;
        close(fd);
        fd = -1;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      if (fd < 0) throw std::runtime_error("connect to " + addrs[static_cast<std::size_t>(j)] + " failed");
      write_all(fd, &rank_, sizeof rank_);
      setup(j, fd);
    }
    for (int k = rank + 1; k < size_; ++k) {
      int fd = accept(ls, nullptr, nullptr);
      int who = -1;
      if (fd < 0 || !read_all(fd, &who, sizeof who) || who <= rank || who >= size_)
        throw std::runtime_error("bad accept");
      setup(who, fd);
    }
    close(ls);
    for (int j = 0; j < size_; ++j)
      if (j != rank_) {
        auto& p = *peers_[static_cast<std::size_t>(j)];
        p.rx = std::thread([this, j] { rx_loop(j); });
        p.tx = std::thread([this, j] { tx_loop(j); });
      }
  }
  ~tcp_transport() {
    for (auto& pp : peers_)
      if (pp) {
        {
          std::lock_guard lk(m_);
          pp->stop = true;
        }
        cv_.notify_all();
        shutdown(pp->fd, SHUT_RDWR);
      }
    for (auto& pp : peers_)
      if (pp) {
        if (pp->rx.joinable()) pp->rx.join();
        if (pp->tx.joinable()) pp->tx.join();
        close(pp->fd);
      }
  }
  tcp_transport(const tcp_transport&) = delete;
  tcp_transport& operator=(const tcp_transport&) = delete;

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] std::int64_t generation() const noexcept { return 0; }

  request isend(int peer, ef::comm::tag_t tag, std::span<const std::byte> out) {
    auto o = std::make_shared<op>();
    o->out = out;
    std::lock_guard lk(m_);
    auto& p = *peers_.at(static_cast<std::size_t>(peer));
    if (p.failed) {
      o->done = true;
      o->ec = make_error_code(ef::error::peer_lost);
    } else {
      p.sendq.push_back({tag, o});
      cv_.notify_all();
    }
    return {o};
  }
  request irecv(int peer, ef::comm::tag_t tag, std::span<std::byte> in) {
    auto o = std::make_shared<op>();
    o->in = in;
    std::lock_guard lk(m_);
    auto& p = *peers_.at(static_cast<std::size_t>(peer));
    auto& uq = p.unexpected[tag];
    if (!uq.empty()) {
      auto msg = std::move(uq.front());
      uq.pop_front();
      complete_with(*o, msg);
    } else if (p.failed) {
      o->done = true;
      o->ec = make_error_code(ef::error::peer_lost);
    } else {
      p.posted[tag].push_back(o);
    }
    return {o};
  }
  bool test(request& r, std::error_code& ec) {
    std::lock_guard lk(m_);
    if (r.p->done) ec = r.p->ec;
    return r.p->done;
  }
  void wait(request& r, ef::deadline d, std::error_code& ec) {
    std::unique_lock lk(m_);
    if (!cv_.wait_until(lk, d.at(), [&] { return r.p->done; })) {
      ec = make_error_code(ef::error::timeout);
      return;
    }
    ec = r.p->ec;
  }

 private:
  struct peer {
    int fd = -1;
    bool stop = false, failed = false;
    std::deque<std::pair<ef::comm::tag_t, std::shared_ptr<op>>> sendq;
    std::map<ef::comm::tag_t, std::deque<std::shared_ptr<op>>> posted;
    std::map<ef::comm::tag_t, std::deque<std::vector<std::byte>>> unexpected;
    std::thread rx, tx;
  };
  struct header {
    std::uint64_t tag, bytes;
  };

  static sockaddr_in parse(const std::string& s) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    const auto colon = s.rfind(':');
    a.sin_port = htons(static_cast<std::uint16_t>(std::stoi(s.substr(colon + 1))));
    inet_pton(AF_INET, s.substr(0, colon).c_str(), &a.sin_addr);
    return a;
  }
  static bool write_all(int fd, const void* p, std::size_t n) {
    auto* c = static_cast<const char*>(p);
    while (n > 0) {
      const ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
      if (w <= 0) {
        if (w < 0 && errno == EINTR) continue;
        return false;
      }
      c += w, n -= static_cast<std::size_t>(w);
    }
    return true;
  }
  static bool read_all(int fd, void* p, std::size_t n) {
    auto* c = static_cast<char*>(p);
    while (n > 0) {
      const ssize_t r = ::recv(fd, c, n, 0);
      if (r <= 0) {
        if (r < 0 && errno == EINTR) continue;
        return false;
      }
      c += r, n -= static_cast<std::size_t>(r);
    }
    return true;
  }
  void setup(int j, int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int buf = 8 << 20;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    peers_[static_cast<std::size_t>(j)] = std::make_unique<peer>();
    peers_[static_cast<std::size_t>(j)]->fd = fd;
  }
  static void complete_with(op& o, const std::vector<std::byte>& msg) {
    if (msg.size() != o.in.size())
      o.ec = make_error_code(ef::error::bad_message);
    else if (!msg.empty())
      std::memcpy(o.in.data(), msg.data(), msg.size());
    o.done = true;
  }
  void fail(int j) {  // with m_ held
    auto& p = *peers_[static_cast<std::size_t>(j)];
    p.failed = true;
    for (auto& [tag, q] : p.posted)
      for (auto& o : q) o->done = true, o->ec = make_error_code(ef::error::peer_lost);
    p.posted.clear();
    for (auto& [tag, o] : p.sendq) o->done = true, o->ec = make_error_code(ef::error::peer_lost);
    p.sendq.clear();
    cv_.notify_all();
  }
  void tx_loop(int j) {
    auto& p = *peers_[static_cast<std::size_t>(j)];
    for (;;) {
      std::pair<ef::comm::tag_t, std::shared_ptr<op>> item;
      {
        std::unique_lock lk(m_);
        cv_.wait(lk, [&] { return p.stop || p.failed || !p.sendq.empty(); });
        if (p.stop || p.failed) return;
        item = p.sendq.front();
      }
      const header h{item.first, item.second->out.size()};
      const bool ok =
          write_all(p.fd, &h, sizeof h) && write_all(p.fd, item.second->out.data(), item.second->out.size());
      std::lock_guard lk(m_);
      if (!ok) {
        fail(j);
        return;
      }
      if (!p.sendq.empty()) p.sendq.pop_front();
      item.second->done = true;
      cv_.notify_all();
    }
  }
  void rx_loop(int j) {
    auto& p = *peers_[static_cast<std::size_t>(j)];
    for (;;) {
      header h{};
      if (!read_all(p.fd, &h, sizeof h)) break;
      std::shared_ptr<op> target;
      {
        std::lock_guard lk(m_);
        auto it = p.posted.find(h.tag);
        if (it != p.posted.end() && !it->second.empty()) {
          target = it->second.front();
          it->second.pop_front();
        }
      }
      if (target && target->in.size() == h.bytes) {
        if (!read_all(p.fd, target->in.data(), h.bytes)) break;
        std::lock_guard lk(m_);
        target->done = true;
        cv_.notify_all();
      } else {
        std::vector<std::byte> msg(h.bytes);
        if (!read_all(p.fd, msg.data(), h.bytes)) break;
        std::lock_guard lk(m_);
        if (!target) {  // a receive may have been posted while the payload was read
          auto it = p.posted.find(h.tag);
          if (it != p.posted.end() && !it->second.empty()) {
            target = it->second.front();
            it->second.pop_front();
          }
        }
        if (target)
          complete_with(*target, msg);
        else
          p.unexpected[h.tag].push_back(std::move(msg));
        cv_.notify_all();
      }
    }
    std::lock_guard lk(m_);
    fail(j);
  }

  int rank_, size_;
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<peer>> peers_;
};
static_assert(ebbflow::comm::transport<tcp_transport>);

}  // namespace bench
