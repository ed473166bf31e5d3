// SPDX-License-Identifier: Apache-2.0
//! @file detail/store_ops.hpp
//! Store operations the elastic group builds on any `kv_store`: batched reads
//! and adds (one pipelined round trip where the store offers it), waits for
//! keys in slices that notice a stop request, and a stoppable sleep.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/core/error.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

// Sleeps until `until` or until `stop` is requested, whichever comes first
// (in slices of at most 10 ms, so a stop is seen soon).
inline void sleep_until(steady_clock::time_point until, const std::stop_token& stop) {
  while (!stop.stop_requested() && steady_clock::now() < until)
    std::this_thread::sleep_for(
        std::min<steady_clock::duration>(until - steady_clock::now(), std::chrono::milliseconds(10)));
}

// The values of `keys`: in one pipelined batch where the store offers
// try_get_many, else one by one.
template <class S>
std::vector<std::optional<std::string>> try_get_all(S& st, const std::vector<std::string>& keys, deadline d) {
  if (keys.empty()) return {};  // no round trip for nothing
  if constexpr (requires { st.try_get_many(std::span<const std::string>(keys), d); }) {
    return st.try_get_many(std::span<const std::string>(keys), d);
  } else {
    std::vector<std::optional<std::string>> out;
    for (const auto& k : keys) out.push_back(st.try_get(k, d));
    return out;
  }
}

// `add(keys[i], deltas[i])` for every i: in one pipelined batch where the
// store offers add_many, else one by one.
template <class S>
std::vector<std::int64_t> add_all(S& st, const std::vector<std::string>& keys, const std::vector<std::int64_t>& deltas,
                                  deadline d) {
  if constexpr (requires {
                  st.add_many(std::span<const std::string>(keys), std::span<const std::int64_t>(deltas), d);
                }) {
    return st.add_many(std::span<const std::string>(keys), std::span<const std::int64_t>(deltas), d);
  } else {
    std::vector<std::int64_t> out;
    for (std::size_t i = 0; i < keys.size(); ++i) out.push_back(st.add(keys[i], deltas[i], d));
    return out;
  }
}

// Waits on the server until any of `keys` exists, in 50 ms slices so that a
// stop request is noticed: the index of one that does, or nullopt when
// stopped or past `d`. A store without wait_any waits for the first key and
// looks for the others at the end of each slice.
template <class S>
std::optional<std::size_t> wait_any_key(S& st, const std::vector<std::string>& keys, deadline d,
                                        const std::stop_token& stop) {
  constexpr bool has_wait_any = requires { st.wait_any(keys, d); };
  while (!stop.stop_requested() && !d.expired()) {
    try {
      const auto slice = min(d, deadline::after(std::chrono::milliseconds(50)));
      if constexpr (has_wait_any) {
        return st.wait_any(keys, slice);
      } else {
        st.wait({keys.front()}, slice);
        return 0;
      }
    } catch (const system_error& e) {
      if (e.code() != errc::timeout) throw;
    }
    if constexpr (!has_wait_any)
      for (std::size_t i = 1; i < keys.size() && !d.expired(); ++i)
        if (st.try_get(keys[i], d)) return i;
  }
  return std::nullopt;
}

// The same for one key: true once it exists.
template <class S>
bool wait_key(S& st, const std::string& k, deadline d, const std::stop_token& stop) {
  return wait_any_key(st, {k}, d, stop).has_value();
}

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
