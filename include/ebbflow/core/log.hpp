// SPDX-License-Identifier: Apache-2.0
//! @file log.hpp
//! A small leveled logger writing whole lines to stderr. The level comes from
//! `EBBFLOW_LOG` (off, error, warn, info, debug, trace; default warn) and can be
//! changed at run time. Thread-safe: each record is written as one line.
//!
//! Use the macros, which skip formatting when the level is off:
//! `EBBFLOW_LOG_INFO("joined generation " << g);`
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/enum_names.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

EBBFLOW_BEGIN_NAMESPACE
namespace log {

//! Severity of a record; `EBBFLOW_LOG` selects the highest one printed.
enum class level : int { off = 0, error = 1, warn = 2, info = 3, debug = 4, trace = 5 };

namespace detail {
inline constexpr auto level_names = make_enum_names(level::off, "off", "error", "warn", "info", "debug", "trace");
static_assert(level_names.last() == level::trace);
}  // namespace detail

//! Lower-case name ("error", "info", ...), as accepted by `EBBFLOW_LOG`.
constexpr std::string_view name(level l) noexcept { return detail::level_names(l); }

//! Parses a name produced by `name(level)`.
constexpr std::optional<level> parse_level(std::string_view s) noexcept { return detail::level_names.parse(s); }

namespace detail {
inline level level_from_env() noexcept {
  const char* v = std::getenv("EBBFLOW_LOG");
  if (!v || !*v) return level::warn;
  if (auto l = parse_level(v)) return *l;
  std::fprintf(stderr, "[ebbflow] warn: EBBFLOW_LOG='%s' is not one of off,error,warn,info,debug,trace; using warn\n",
               v);
  return level::warn;
}
inline std::atomic<int>& current() noexcept {
  static std::atomic<int> l{static_cast<int>(level_from_env())};
  return l;
}
inline std::atomic<int>& rank_tag() noexcept {
  static std::atomic<int> r{-1};
  return r;
}
inline std::mutex& out_mutex() noexcept {
  static std::mutex m;
  return m;
}
}  // namespace detail

//! The active level.
inline level get_level() noexcept { return static_cast<level>(detail::current().load(std::memory_order_relaxed)); }
//! Changes the level for the whole process.
inline void set_level(level l) noexcept { detail::current().store(static_cast<int>(l), std::memory_order_relaxed); }
//! Tags every following record with this process's rank (-1: none).
inline void set_rank(int rank) noexcept { detail::rank_tag().store(rank, std::memory_order_relaxed); }
//! True when records of level `l` are printed. Thread-safe.
inline bool enabled(level l) noexcept {
  return l != level::off && static_cast<int>(l) <= detail::current().load(std::memory_order_relaxed);
}

//! Writes one record (no level check; use the macros).
inline void write(level l, std::string_view msg) noexcept {
  try {
    std::ostringstream os;
    os << "[ebbflow";
    if (int r = detail::rank_tag().load(std::memory_order_relaxed); r >= 0) os << " rank " << r;
    os << "] " << name(l) << ": " << msg << '\n';
    const std::string line = os.str();
    std::lock_guard lk(detail::out_mutex());
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fflush(stderr);
  } catch (...) {
  }
}

}  // namespace log
EBBFLOW_END_NAMESPACE

#define EBBFLOW_DETAIL_LOG(lvl, expr)                    \
  do {                                                   \
    if (::ebbflow::log::enabled(lvl)) {                  \
      std::ostringstream ebbflow_log_os_;                \
      ebbflow_log_os_ << expr;                           \
      ::ebbflow::log::write(lvl, ebbflow_log_os_.str()); \
    }                                                    \
  } while (0)
//! Logs `expr` (an ostream expression: `"x=" << x`) at level error.
#define EBBFLOW_LOG_ERROR(expr) EBBFLOW_DETAIL_LOG(::ebbflow::log::level::error, expr)
//! Logs `expr` at level warn.
#define EBBFLOW_LOG_WARN(expr) EBBFLOW_DETAIL_LOG(::ebbflow::log::level::warn, expr)
//! Logs `expr` at level info.
#define EBBFLOW_LOG_INFO(expr) EBBFLOW_DETAIL_LOG(::ebbflow::log::level::info, expr)
//! Logs `expr` at level debug.
#define EBBFLOW_LOG_DEBUG(expr) EBBFLOW_DETAIL_LOG(::ebbflow::log::level::debug, expr)
//! Logs `expr` at level trace.
#define EBBFLOW_LOG_TRACE(expr) EBBFLOW_DETAIL_LOG(::ebbflow::log::level::trace, expr)
