// SPDX-License-Identifier: Apache-2.0
//! @file loopback_network.hpp
//! An in-process `network` for unit tests of the elastic group: every
//! generation gets its own `loopback_hub`; `kill(address)` marks that worker
//! dead in every hub it belongs to, as a crashed process would be.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/comm/loopback_transport.hpp>
#include <ebbflow/elastic/kv_store.hpp>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

//! Shared by all workers of one test. Thread-safe.
class loopback_fabric {
 public:
  //! The hub of generation `g` (created for `size` ranks by its first caller)
  //! and records that `addr` is `rank` there; if `addr` was already killed,
  //! that rank is dead in the hub at once.
  std::shared_ptr<comm::loopback_hub> hub(std::int64_t g, int size, const bytes& addr, int rank) {
    std::lock_guard lk(m_);
    auto& h = hubs_[g];
    if (!h) h = std::make_shared<comm::loopback_hub>(size);
    const std::string k = str(addr);
    where_[k].push_back({h, rank});
    if (dead_.count(k)) h->kill(rank);
    return h;
  }
  //! The worker with this address crashed.
  void kill(const bytes& addr) {
    std::lock_guard lk(m_);
    const std::string k = str(addr);
    dead_[k] = true;
    for (auto& [h, r] : where_[k]) h->kill(r);
  }
  //! A fresh unique address ("loopback-<n>").
  bytes new_address() { return to_bytes("loopback-" + std::to_string(next_++)); }

 private:
  static std::string str(const bytes& b) { return std::string(reinterpret_cast<const char*>(b.data()), b.size()); }
  std::mutex m_;
  std::map<std::int64_t, std::shared_ptr<comm::loopback_hub>> hubs_;
  std::map<std::string, std::vector<std::pair<std::shared_ptr<comm::loopback_hub>, int>>> where_;
  std::map<std::string, bool> dead_;
  std::atomic<int> next_{0};
};

//! One worker's view of the fabric; models `network`.
class loopback_network {
 public:
  using transport_type = comm::loopback_transport;  //!< transport of each generation
  //! A worker with a fresh address on `f` (must not be null).
  explicit loopback_network(std::shared_ptr<loopback_fabric> f)
      : fabric_(std::move(f)), addr_(fabric_->new_address()) {}
  //! This worker's address.
  //! The address never changes (see `network`).
  [[nodiscard]] static constexpr bool stable_address() noexcept { return true; }
  //! The same address for every generation (the fabric routes by generation).
  [[nodiscard]] bytes prepare(std::int64_t) const { return addr_; }
  //! The loopback transport of generation `g` as `rank` of `addrs.size()`.
  //! Never blocks (the deadline is unused): loopback peers need no handshake.
  transport_type connect(std::int64_t g, int rank, const std::vector<bytes>& addrs, deadline) {
    return transport_type(fabric_->hub(g, static_cast<int>(addrs.size()), addr_, rank), rank, g);
  }
  //! As `connect` (loopback peers need no wire-up: `poll_connect` is true at
  //! once). The group calls it from its admission helper thread, which the
  //! fabric (locked) allows: `concurrent_connect()`.
  transport_type start_connect(std::int64_t g, int rank, const std::vector<bytes>& addrs) {
    return connect(g, rank, addrs, deadline::never());
  }
  //! `start_connect` may run on another thread than the training one.
  [[nodiscard]] static constexpr bool concurrent_connect() noexcept { return true; }
  //! Crashes this worker as seen by its peers.
  void kill() { fabric_->kill(addr_); }

 private:
  std::shared_ptr<loopback_fabric> fabric_;
  bytes addr_;
};

}  // namespace elastic
EBBFLOW_END_NAMESPACE
