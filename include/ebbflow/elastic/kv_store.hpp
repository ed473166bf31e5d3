// SPDX-License-Identifier: Apache-2.0
//! @file kv_store.hpp
//! The `kv_store` concept the elastic group coordinates through, and
//! `memory_store`, an in-process model of it for unit tests.
//!
//! Semantics: keys are strings, values bytes. Every call takes a deadline and
//! throws `ebbflow::system_error` (`errc::timeout`, `errc::peer_lost` when the
//! store is unreachable, `errc::unauthorized`) on failure.
//! * `set(k, v, d)` stores v under k.
//! * `get(k, d)` returns the value, or nullopt when k is absent (never blocks on absence).
//! * `add(k, delta, d)` atomically adds to the 64-bit integer under k (absent = 0), returns the new value.
//! * `compare_set(k, expected, desired, d)` stores desired when the current value
//!   equals expected (an empty expected matches an absent key); returns the value now stored.
//! * `wait(keys, d)` blocks until every key exists, or throws `errc::timeout`.
//! The Boost.Asio store client (elastic/store.hpp) models this concept.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/core/error.hpp>

#include <condition_variable>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

using bytes = std::vector<std::byte>;

template <class S>
concept kv_store = requires(S& s, const std::string& k, std::span<const std::byte> v, std::int64_t delta,
                            deadline d, const std::vector<std::string>& keys) {
  s.set(k, v, d);
  { s.get(k, d) } -> std::same_as<std::optional<bytes>>;
  { s.add(k, delta, d) } -> std::same_as<std::int64_t>;
  { s.compare_set(k, v, v, d) } -> std::same_as<bytes>;
  s.wait(keys, d);
};

//! Bytes of a string (for values that are text).
inline bytes to_bytes(std::string_view s) {
  bytes b(s.size());
  if (!s.empty()) std::memcpy(b.data(), s.data(), s.size());
  return b;
}

//! A thread-safe in-process store. Can be made unreachable (`fail()`) to test
//! how clients react to a lost store.
class memory_store {
 public:
  void set(const std::string& k, std::span<const std::byte> v, deadline d) {
    std::lock_guard lk(m_);
    check(d, "store.set");
    kv_[k].assign(v.begin(), v.end());
    cv_.notify_all();
  }
  std::optional<bytes> get(const std::string& k, deadline d) {
    std::lock_guard lk(m_);
    check(d, "store.get");
    auto it = kv_.find(k);
    if (it == kv_.end()) return std::nullopt;
    return it->second;
  }
  std::int64_t add(const std::string& k, std::int64_t delta, deadline d) {
    std::lock_guard lk(m_);
    check(d, "store.add");
    auto& v = kv_[k];
    std::int64_t x = 0;
    if (v.size() == sizeof x) std::memcpy(&x, v.data(), sizeof x);
    x += delta;
    v.resize(sizeof x);
    std::memcpy(v.data(), &x, sizeof x);
    cv_.notify_all();
    return x;
  }
  bytes compare_set(const std::string& k, std::span<const std::byte> expected, std::span<const std::byte> desired,
                    deadline d) {
    std::lock_guard lk(m_);
    check(d, "store.compare_set");
    auto it = kv_.find(k);
    const bool match = it == kv_.end() ? expected.empty()
                                       : (it->second.size() == expected.size() &&
                                          (expected.empty() ||
                                           std::memcmp(it->second.data(), expected.data(), expected.size()) == 0));
    if (match) {
      kv_[k].assign(desired.begin(), desired.end());
      cv_.notify_all();
      return kv_[k];
    }
    return it == kv_.end() ? bytes{} : it->second;
  }
  void wait(const std::vector<std::string>& keys, deadline d) {
    std::unique_lock lk(m_);
    for (;;) {
      check(deadline::never(), "store.wait");
      bool all = true;
      for (auto& k : keys) all = all && kv_.count(k) > 0;
      if (all) return;
      if (d.expired()) throw_if(make_error_code(error::timeout), {.operation = "store.wait", .detail = keys.empty() ? "" : keys.front()});
      cv_.wait_until(lk, std::min(d.at(), steady_clock::now() + std::chrono::milliseconds(50)));
    }
  }
  //! Makes every later call fail with `peer_lost` (the store went away).
  void fail() {
    std::lock_guard lk(m_);
    failed_ = true;
    cv_.notify_all();
  }

 private:
  void check(deadline d, const char* op) const {
    if (failed_) throw_if(make_error_code(error::peer_lost), {.operation = op});
    if (d.expired()) throw_if(make_error_code(error::timeout), {.operation = op});
  }
  std::mutex m_;
  std::condition_variable cv_;
  std::map<std::string, bytes> kv_;
  bool failed_ = false;
};
static_assert(kv_store<memory_store>);

}  // namespace elastic
EBBFLOW_END_NAMESPACE
