// SPDX-License-Identifier: Apache-2.0
//! @file thread_name.hpp
//! Names for ebbflow's own threads, so that `top -H`, `ps -L`, `perf`,
//! `gdb` and `/proc/<pid>/task/<tid>/comm` show what each one is:
//!
//! | name | thread |
//! |---|---|
//! | `ebbflow-beat` | an elastic member's heartbeat (lease, failure watch) |
//! | `ebbflow-admit` | an elastic member's admission helper (a join or leave in the background) |
//! | `ebbflow-store` | the rendezvous store server's I/O thread |
//! | `ebbflow-loadN` | prefetcher loader N |
//! | `ebbflow-copy` | the prefetcher's host-to-device copy stage |
//!
//! Linux keeps 15 bytes of a thread's name; longer names are cut there.
//! Elsewhere naming does nothing.
#pragma once

#include <ebbflow/config.hpp>

#include <algorithm>
#include <string_view>

#if defined(__linux__)
#include <pthread.h>
#endif

EBBFLOW_BEGIN_NAMESPACE

namespace detail {

//! Names thread `t` (a `std::thread` or `std::jthread` that has not been
//! joined; at most 15 bytes are kept); never fails. ebbflow calls it right
//! after starting `t`, from the starting thread, so the name is set by the
//! time the call that started `t` returns.
template <class Thread>
void name_thread(Thread& t, std::string_view name) noexcept {
#if defined(__linux__)
  char buf[16] = {};
  const std::size_t n = std::min<std::size_t>(name.size(), sizeof buf - 1);
  std::copy_n(name.data(), n, buf);
  ::pthread_setname_np(t.native_handle(), buf);
#else
  (void)t;
  (void)name;
#endif
}

}  // namespace detail

EBBFLOW_END_NAMESPACE
