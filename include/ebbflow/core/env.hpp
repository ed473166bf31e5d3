// SPDX-License-Identifier: Apache-2.0
//! @file env.hpp
//! Configuration from environment variables, validated: a malformed or
//! out-of-range value raises `std::invalid_argument` naming the variable, the
//! value and what was expected; it is never silently replaced by a default.
//!
//! `launch_info::from_environment()` reads where this process sits in the job,
//! from ebbflow's own variables or, when those are absent, from torchrun,
//! Open MPI or Slurm.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/error.hpp>

#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

EBBFLOW_BEGIN_NAMESPACE
namespace env {

//! The raw value, or nullopt when unset or empty.
inline std::optional<std::string> get(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

namespace detail {
//! The whole of `v` as an integer, or nullopt when it is not one.
inline std::optional<std::int64_t> parse_int(const std::string& v) {
  std::int64_t out = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc{} || p != v.data() + v.size()) return std::nullopt;
  return out;
}
}  // namespace detail

//! An integer in [lo, hi], or `fallback` when unset.
//! @throws std::invalid_argument when set but not an integer in range.
inline std::int64_t get_int(const char* name, std::int64_t fallback,
                            std::int64_t lo = std::numeric_limits<std::int64_t>::min(),
                            std::int64_t hi = std::numeric_limits<std::int64_t>::max()) {
  auto v = get(name);
  if (!v) return fallback;
  const auto out = detail::parse_int(*v);
  EBBFLOW_ENFORCE(out && *out >= lo && *out <= hi,
                  name << "='" << *v << "': expected an integer in [" << lo << ", " << hi << "]");
  return *out;
}

//! 0 (off), or an integer in [lo, hi]; `fallback` when unset.
//! @throws std::invalid_argument when set to anything else.
inline std::int64_t get_int_or_zero(const char* name, std::int64_t fallback, std::int64_t lo, std::int64_t hi) {
  auto v = get(name);
  if (!v) return fallback;
  const auto out = detail::parse_int(*v);
  EBBFLOW_ENFORCE(out && (*out == 0 || (*out >= lo && *out <= hi)),
                  name << "='" << *v << "': expected 0 or an integer in [" << lo << ", " << hi << "]");
  return *out;
}

//! The value of the choice whose name the variable holds, or `fallback`
//! when unset: `get_choice("X", mode::a, {{"a", mode::a}, {"b", mode::b}})`.
//! @throws std::invalid_argument naming the variable, its value and every choice.
template <class T>
T get_choice(const char* name, T fallback, std::initializer_list<std::pair<std::string_view, T>> choices) {
  auto v = get(name);
  if (!v) return fallback;
  std::string names;
  for (const auto& [n, value] : choices) {
    if (*v == n) return value;
    names += (names.empty() ? "" : ", ") + std::string(n);
  }
  EBBFLOW_ENFORCE(false, name << "='" << *v << "': expected one of " << names);
  return fallback;
}

//! A number in [lo, hi], or `fallback` when unset.
inline double get_double(const char* name, double fallback, double lo = -std::numeric_limits<double>::max(),
                         double hi = std::numeric_limits<double>::max()) {
  auto v = get(name);
  if (!v) return fallback;
  char* end = nullptr;
  const double out = std::strtod(v->c_str(), &end);
  EBBFLOW_ENFORCE(end == v->c_str() + v->size() && out == out && out >= lo && out <= hi,
                  name << "='" << *v << "': expected a number in [" << lo << ", " << hi << "]");
  return out;
}

//! A boolean (1/0, true/false, yes/no, on/off), or `fallback` when unset.
inline bool get_bool(const char* name, bool fallback) {
  auto v = get(name);
  if (!v) return fallback;
  const std::string& s = *v;
  if (s == "1" || s == "true" || s == "yes" || s == "on" || s == "y") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off" || s == "n") return false;
  EBBFLOW_ENFORCE(false, name << "='" << s << "': expected a boolean (1/0, true/false, yes/no, on/off)");
  return fallback;
}

//! A duration in milliseconds in [lo_ms, hi_ms], or `fallback` when unset.
inline std::chrono::milliseconds get_ms(const char* name, std::chrono::milliseconds fallback, std::int64_t lo_ms = 0,
                                        std::int64_t hi_ms = 24LL * 3600 * 1000) {
  return std::chrono::milliseconds(get_int(name, fallback.count(), lo_ms, hi_ms));
}

//! This host's name (gethostname), or "localhost" when it has none.
inline std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || !buf[0]) return "localhost";
  return buf;
}

//! "host:port" split in two; port in [0, 65535].
struct host_port {
  std::string host;        //!< name or address, never empty
  std::uint16_t port = 0;  //!< port number
};

//! Parses "host:port" or "[v6addr]:port". @throws std::invalid_argument naming `what`.
inline host_port parse_host_port(std::string_view s, std::string_view what) {
  auto colon = s.rfind(':');
  EBBFLOW_ENFORCE(colon != std::string_view::npos && colon > 0 && colon + 1 < s.size(),
                  what << "='" << s << "': expected HOST:PORT");
  std::string host(s.substr(0, colon));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  std::string_view ps = s.substr(colon + 1);
  unsigned port = 0;
  auto [p, ec] = std::from_chars(ps.data(), ps.data() + ps.size(), port);
  EBBFLOW_ENFORCE(ec == std::errc{} && p == ps.data() + ps.size() && port <= 65535,
                  what << "='" << s << "': port must be an integer in [0, 65535]");
  return {std::move(host), static_cast<std::uint16_t>(port)};
}

}  // namespace env

//! Where this process sits in a job, as told by its launcher.
struct launch_info {
  int rank = 0;                          //!< this process's rank in the initial world
  int world_size = 1;                    //!< processes in the initial world
  int local_rank = 0;                    //!< rank among processes on this host
  std::string store_host = "127.0.0.1";  //!< rendezvous store address
  std::uint16_t store_port = 0;          //!< 0: no store given (or not a host:port store)
  //! `EBBFLOW_STORE` as given: host:port, tcp+tls://host:port,
  //! etcd://h1:p1,h2:p2[/prefix] or etcds://... (elastic/any_store.hpp picks
  //! the backend from it); empty when only MASTER_ADDR/MASTER_PORT are set.
  std::string store_address;
  std::string token;               //!< job secret (EBBFLOW_TOKEN); never logged
  std::string source = "default";  //!< which launcher's variables were used

  //! Reads, in order of precedence: ebbflow-run's `EBBFLOW_RANK`,
  //! `EBBFLOW_WORLD_SIZE`, `EBBFLOW_LOCAL_RANK`, `EBBFLOW_STORE`,
  //! `EBBFLOW_TOKEN`; torchrun's `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
  //! `MASTER_ADDR`, `MASTER_PORT`; Open MPI's `OMPI_COMM_WORLD_RANK`,
  //! `OMPI_COMM_WORLD_SIZE`, `OMPI_COMM_WORLD_LOCAL_RANK`; Slurm's
  //! `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`. With the last three the
  //! store still comes from `EBBFLOW_STORE` or `MASTER_ADDR`/`MASTER_PORT`.
  //! @throws std::invalid_argument for malformed or inconsistent values.
  static launch_info from_environment() {
    launch_info li;
    auto pick = [&](const char* r, const char* w, const char* l, const char* src) {
      if (!env::get(r)) return false;
      li.world_size = static_cast<int>(env::get_int(w, 1, 1, 1 << 24));
      li.rank = static_cast<int>(env::get_int(r, 0, 0, li.world_size - 1));
      li.local_rank = static_cast<int>(env::get_int(l, 0, 0, 1 << 24));
      li.source = src;
      return true;
    };
    pick("EBBFLOW_RANK", "EBBFLOW_WORLD_SIZE", "EBBFLOW_LOCAL_RANK", "ebbflow") ||
        pick("RANK", "WORLD_SIZE", "LOCAL_RANK", "torchrun") ||
        pick("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "openmpi") ||
        pick("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "slurm");
    if (auto s = env::get("EBBFLOW_STORE")) {
      li.store_address = *s;
      std::string_view hp_text = *s;
      if (hp_text.starts_with("tcp://")) hp_text.remove_prefix(6);
      if (hp_text.starts_with("tcp+tls://")) hp_text.remove_prefix(10);
      if (hp_text.find("://") == std::string_view::npos) {  // other schemes: elastic/any_store.hpp parses them
        auto hp = env::parse_host_port(hp_text, "EBBFLOW_STORE");
        li.store_host = hp.host;
        li.store_port = hp.port;
      }
    } else if (auto a = env::get("MASTER_ADDR")) {
      li.store_host = *a;
      li.store_port = static_cast<std::uint16_t>(env::get_int("MASTER_PORT", 29500, 1, 65535));
    }
    if (auto t = env::get("EBBFLOW_TOKEN")) li.token = *t;
    return li;
  }
};

EBBFLOW_END_NAMESPACE
