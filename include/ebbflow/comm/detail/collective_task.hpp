// SPDX-License-Identifier: Apache-2.0
//! @file comm/detail/collective_task.hpp
//! What every collective of comm/communicator.hpp runs on: the coroutine
//! task a collective is (`promise`, `task`, `awaiting` one transport
//! request), the set in flight on one communicator, the scratch pool, and
//! the context an error reports.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/comm/transport.hpp>
#include <ebbflow/core/error.hpp>

#include <algorithm>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace comm::detail {

//! Where a request runs; seq/bytes become the error detail only on failure.
struct op_context {
  error_context ctx;
  std::uint64_t seq = 0;
  std::size_t bytes = 0;
  bool describe = false;
  op_context(error_context c) : ctx(std::move(c)) {}  // NOLINT: implicit on purpose
  op_context(error_context c, std::uint64_t s, std::size_t b, bool d)
      : ctx(std::move(c)), seq(s), bytes(b), describe(d) {}
};

//! The elements [first, second) of a `count`-element buffer that rank `r` of
//! `n` reduces (`comm::allreduce_segment`).
[[nodiscard]] constexpr std::pair<std::size_t, std::size_t> segment_of(std::size_t count, int n, int r) noexcept {
  const auto un = static_cast<std::size_t>(n), ur = static_cast<std::size_t>(r);
  return {count * ur / un, count * (ur + 1) / un};
}

//! Reusable scratch buffers (uninitialised), so a collective does not pay
//! page faults for fresh allocations on every call. Single-threaded, like the
//! communicator that owns it.
class scratch_pool {
 public:
  struct lease {
    std::shared_ptr<scratch_pool> pool;
    std::unique_ptr<std::byte[]> buf;
    std::size_t cap = 0;
    lease() = default;
    lease(std::shared_ptr<scratch_pool> p, std::unique_ptr<std::byte[]> b, std::size_t c) noexcept
        : pool(std::move(p)), buf(std::move(b)), cap(c) {}
    lease(lease&&) noexcept = default;
    lease& operator=(lease&&) noexcept = default;
    ~lease() {
      if (pool && buf) pool->give_back(std::move(buf), cap);
    }
    [[nodiscard]] std::byte* data() const noexcept { return buf.get(); }
  };

  static lease take(const std::shared_ptr<scratch_pool>& self, std::size_t bytes) {
    auto& f = self->free_;
    for (std::size_t i = 0; i < f.size(); ++i) {
      if (f[i].cap >= bytes) {
        lease l(self, std::move(f[i].buf), f[i].cap);
        f.erase(f.begin() + static_cast<std::ptrdiff_t>(i));
        return l;
      }
    }
    const std::size_t cap = std::max<std::size_t>(bytes, 64);
    return lease(self, std::unique_ptr<std::byte[]>(new std::byte[cap]), cap);
  }

 private:
  static constexpr std::size_t max_cached = 4;
  struct entry {
    std::size_t cap;
    std::unique_ptr<std::byte[]> buf;
  };
  void give_back(std::unique_ptr<std::byte[]> b, std::size_t cap) noexcept {
    try {
      if (free_.size() >= max_cached) {
        // Keep the largest buffers: they are the expensive ones to fault in.
        auto smallest =
            std::min_element(free_.begin(), free_.end(), [](const entry& x, const entry& y) { return x.cap < y.cap; });
        if (smallest->cap >= cap) return;
        free_.erase(smallest);
      }
      free_.push_back({cap, std::move(b)});
    } catch (...) {
    }
  }
  std::vector<entry> free_;
};

template <transport T>
struct task;

template <transport T>
struct promise {
  typename T::request* awaited = nullptr;  // the transfer the coroutine waits for
  int peer = -1;                           // its peer, for error messages
  std::error_code failed{};                // set by the coroutine before co_return on error
  int failed_peer = -1;
  std::string failed_detail;  // what the failed transfer said (sizes), if anything
  std::exception_ptr exc;
  task<T> get_return_object() noexcept;
  std::suspend_always initial_suspend() const noexcept { return {}; }
  std::suspend_always final_suspend() const noexcept { return {}; }
  void return_void() const noexcept {}
  void unhandled_exception() noexcept { exc = std::current_exception(); }
};

template <transport T>
struct task {
  using promise_type = promise<T>;
  std::coroutine_handle<promise<T>> h;
};

//! The collectives in flight on one communicator.
template <transport T>
struct active_set {
  std::vector<std::coroutine_handle<promise<T>>> hs;
};

template <transport T>
task<T> promise<T>::get_return_object() noexcept {
  return task<T>{std::coroutine_handle<promise<T>>::from_promise(*this)};
}

//! `co_await awaiting(t, req, peer)`: continues at once when `req` already
//! completed successfully, otherwise suspends until the driver saw it complete.
template <transport T>
struct awaiting {
  T& t;
  typename T::request& req;
  int peer;
  bool await_ready() const {
    std::error_code ec;
    return t.test(req, ec) && !ec;
  }
  void await_suspend(std::coroutine_handle<promise<T>> h) const noexcept {
    h.promise().awaited = &req;
    h.promise().peer = peer;
  }
  void await_resume() const noexcept {}
};

inline std::span<const std::byte> cbytes(const std::byte* p, std::size_t n) noexcept { return {p, n}; }
inline std::span<std::byte> mbytes(std::byte* p, std::size_t n) noexcept { return {p, n}; }
inline int mod(long long a, int n) noexcept { return static_cast<int>(((a % n) + n) % n); }

}  // namespace comm::detail
EBBFLOW_END_NAMESPACE
