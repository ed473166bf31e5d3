// SPDX-License-Identifier: Apache-2.0
//! @file kv_store.hpp
//! The `kv_store` concept the elastic group coordinates through, and
//! `memory_store`, an in-process model of it for unit tests.
//!
//! Semantics: keys and values are strings (values binary-safe). Every call takes a deadline and
//! throws `ebbflow::system_error` (`errc::timeout`, `errc::peer_lost` when the
//! store is unreachable, `errc::unauthorized`) on failure.
//! * `set(k, v, d)` stores v under k.
//! * `try_get(k, d)` returns the value, or nullopt when k is absent (never blocks on absence).
//! * `add(k, delta, d)` atomically adds to the 64-bit integer under k (absent = 0), returns the new value.
//! * `compare_set(k, expected, desired, d)` stores desired when the current value
//!   equals expected (an empty expected matches an absent key); the result's `swapped` tells whether it did,
//!   `current` is the value now stored.
//! * `wait(keys, d)` blocks until every key exists, or throws `errc::timeout`.
//! Optional, used when present: `add_many(keys, deltas, d)` and
//! `try_get_many(keys, d)`, the same operations for several keys in about one
//! round trip (the group batches its reads of join tickets and addresses);
//! `wait_any(keys, d)`, which blocks until any key exists and returns the
//! index of the first one that does (the coordinator waits for the next join
//! ticket and for an abort at once; without it, an abort reaches it at its
//! next heartbeat).
//! The Boost.Asio store client (elastic/tcp_store.hpp) models this concept.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/core/error.hpp>

#include <charconv>
#include <condition_variable>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {
//! `stored + delta` for a counter kept as decimal text (empty: 0), or the
//! reason it cannot be: the text is not a whole int64, or the sum
//! overflows. The store server and `memory_store` share it, so the two
//! agree on every value.
inline std::optional<std::int64_t> add_to_counter(std::string_view stored, std::int64_t delta, std::string& why) {
  std::int64_t cur = 0;
  if (!stored.empty()) {
    const auto [p, ec] = std::from_chars(stored.data(), stored.data() + stored.size(), cur);
    if (ec != std::errc{} || p != stored.data() + stored.size()) {
      why = "is not an integer";
      return std::nullopt;
    }
  }
  std::int64_t next = 0;
  if (__builtin_add_overflow(cur, delta, &next)) {
    why = "would overflow int64";
    return std::nullopt;
  }
  return next;
}
}  // namespace elastic::detail

namespace elastic {

//! Owned binary data (transport addresses, encoded records); host memory.
using bytes = std::vector<std::byte>;

template <class S>
concept kv_store = requires(S& s, const std::string& k, std::string_view v, std::int64_t delta, deadline d,
                            const std::vector<std::string>& keys) {
  s.set(k, v, d);
  { s.try_get(k, d) } -> std::same_as<std::optional<std::string>>;
  { s.add(k, delta, d) } -> std::same_as<std::int64_t>;
  { s.compare_set(k, v, v, d).current } -> std::convertible_to<std::string>;
  { s.compare_set(k, v, v, d).swapped } -> std::convertible_to<bool>;
  s.wait(keys, d);
};

//! Bytes as a string value (values are binary-safe).
inline std::string to_value(std::span<const std::byte> b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}
//! A string value as bytes.
inline bytes to_bytes(std::string_view s) {
  bytes b(s.size());
  if (!s.empty()) std::memcpy(b.data(), s.data(), s.size());
  return b;
}

//! A thread-safe in-process store. Can be made unreachable (`fail()`) to test
//! how clients react to a lost store.
class memory_store {
 public:
  //! Outcome of `compare_set`.
  struct cas_result {
    bool swapped = false;  //!< true when `desired` was stored
    std::string current;   //!< the value now stored under the key ("" when absent)
  };
  //! Stores `v` under `k` and wakes waiters. Never blocks beyond the lock.
  //! @throws system_error: peer_lost after `fail()`, timeout when `d` already expired.
  void set(const std::string& k, std::string_view v, deadline d) {
    std::lock_guard lk(m_);
    check(d, "store.set");
    kv_[k] = std::string(v);
    cv_.notify_all();
  }
  //! The value under `k`, or nullopt when absent. Errors as for `set`.
  std::optional<std::string> try_get(const std::string& k, deadline d) {
    std::lock_guard lk(m_);
    check(d, "store.get");
    auto it = kv_.find(k);
    if (it == kv_.end()) return std::nullopt;
    return it->second;
  }
  //! Removes `k`; returns whether it existed. @throws system_error: peer_lost after `fail()`.
  bool erase(std::string_view k) {
    std::lock_guard lk(m_);
    check(deadline::never(), "store.erase");
    auto it = kv_.find(std::string(k));
    if (it == kv_.end()) return false;
    kv_.erase(it);
    return true;
  }
  //! The keys that start with `prefix`, in order (for tests and diagnostics).
  std::vector<std::string> keys(std::string_view prefix = {}) const {
    std::lock_guard lk(m_);
    std::vector<std::string> out;
    for (auto it = kv_.lower_bound(std::string(prefix)); it != kv_.end() && it->first.starts_with(prefix); ++it)
      out.push_back(it->first);
    return out;
  }
  //! `try_get(keys[i])` for every i, under one lock. Errors as `try_get`.
  std::vector<std::optional<std::string>> try_get_many(std::span<const std::string> keys, deadline d) {
    std::vector<std::optional<std::string>> out;
    out.reserve(keys.size());
    std::lock_guard lk(m_);
    check(d, "store.try_get_many");
    for (const auto& k : keys) {
      auto it = kv_.find(k);
      out.push_back(it == kv_.end() ? std::nullopt : std::optional<std::string>(it->second));
    }
    return out;
  }
  //! Adds `delta` to the decimal integer under `k` (absent = 0) and returns
  //! the new value. Errors as for `set`; `errc::invalid_state` when the
  //! stored value is not a whole int64 or the sum would overflow (as the
  //! server: the value is left as it was).
  std::int64_t add(const std::string& k, std::int64_t delta, deadline d) {
    std::lock_guard lk(m_);
    check(d, "store.add");
    return add_locked(k, delta);
  }
  //! `add(keys[i], deltas[i])` for every i, under one lock. Errors as `add`;
  //! std::invalid_argument when the spans differ in length.
  std::vector<std::int64_t> add_many(std::span<const std::string> keys, std::span<const std::int64_t> deltas,
                                     deadline d) {
    if (keys.size() != deltas.size())
      throw std::invalid_argument("store.add_many: " + std::to_string(keys.size()) + " keys but " +
                                  std::to_string(deltas.size()) + " deltas");
    std::vector<std::int64_t> out;
    out.reserve(keys.size());
    std::lock_guard lk(m_);
    check(d, "store.add_many");
    for (std::size_t i = 0; i < keys.size(); ++i) out.push_back(add_locked(keys[i], deltas[i]));
    return out;
  }
  //! Stores `desired` when the value under `k` equals `expected` (an empty
  //! `expected` matches an absent key). Errors as for `set`.
  cas_result compare_set(const std::string& k, std::string_view expected, std::string_view desired, deadline d) {
    std::lock_guard lk(m_);
    check(d, "store.compare_set");
    auto it = kv_.find(k);
    const bool match = it == kv_.end() ? expected.empty() : it->second == expected;
    if (match) {
      kv_[k] = std::string(desired);
      cv_.notify_all();
      return {true, std::string(desired)};
    }
    return {false, it == kv_.end() ? std::string() : it->second};
  }
  //! Blocks until every key in `keys` exists.
  //! @throws system_error: timeout when `d` passes first (naming the first key),
  //! peer_lost after `fail()`.
  void wait(const std::vector<std::string>& keys, deadline d) {
    wait_until_found("store.wait", keys, d, [&]() -> std::optional<std::size_t> {
      for (auto& k : keys)
        if (kv_.count(k) == 0) return std::nullopt;
      return 0;
    });
  }
  //! Blocks until any key in `keys` exists; returns the index of the first
  //! one that does. Errors as for `wait`.
  std::size_t wait_any(const std::vector<std::string>& keys, deadline d) {
    if (keys.empty()) throw std::invalid_argument("store.wait_any: no keys to wait for");
    return wait_until_found("store.wait_any", keys, d, [&]() -> std::optional<std::size_t> {
      for (std::size_t i = 0; i < keys.size(); ++i)
        if (kv_.count(keys[i]) > 0) return i;
      return std::nullopt;
    });
  }
  //! Makes every later call fail with `peer_lost` (the store went away).
  void fail() {
    std::lock_guard lk(m_);
    failed_ = true;
    cv_.notify_all();
  }

 private:
  std::int64_t add_locked(const std::string& k, std::int64_t delta) {
    auto it = kv_.find(k);
    std::string why;
    const auto x =
        detail::add_to_counter(it == kv_.end() ? std::string_view() : std::string_view(it->second), delta, why);
    if (!x) throw_if(make_error_code(error::invalid_state), {.operation = "store.add", .detail = "'" + k + "' " + why});
    if (it == kv_.end()) it = kv_.emplace(k, std::string()).first;
    it->second = std::to_string(*x);
    cv_.notify_all();
    return *x;
  }
  // Waits under the lock until `found()` gives an index, or `d` passes.
  template <class Found>
  std::size_t wait_until_found(const char* op, const std::vector<std::string>& keys, deadline d, Found found) {
    std::unique_lock lk(m_);
    for (;;) {
      check(deadline::never(), op);
      if (const auto i = found()) return *i;
      if (d.expired())
        throw_if(make_error_code(error::timeout), {.operation = op, .detail = keys.empty() ? "" : keys.front()});
      cv_.wait_until(lk, std::min(d.at(), steady_clock::now() + std::chrono::milliseconds(50)));
    }
  }
  void check(deadline d, const char* op) const {
    if (failed_) throw_if(make_error_code(error::peer_lost), {.operation = op});
    if (d.expired()) throw_if(make_error_code(error::timeout), {.operation = op});
  }
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::map<std::string, std::string> kv_;
  bool failed_ = false;
};
static_assert(kv_store<memory_store>);

}  // namespace elastic
EBBFLOW_END_NAMESPACE
