// SPDX-License-Identifier: Apache-2.0
//! @file cooldown.hpp
//! The back-off shared by the elastic group's join cool-down
//! (`EBBFLOW_JOIN_COOLDOWN`) and `ebbflow-run --restart-cooldown`: nothing
//! after a first failure, then SEC, doubling with every further failure in
//! a row, at most MAX. Written "SEC[:MAX]" in seconds; SEC 0 turns it off.
#pragma once

#include <ebbflow/config.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

//! SEC and MAX of a cool-down. Value type.
struct cooldown {
  std::chrono::milliseconds sec{1'000};   //!< the wait after the second failure in a row (0: never wait)
  std::chrono::milliseconds max{60'000};  //!< the longest wait

  //! The wait after `failures` failures in a row: 0 for fewer than 2 (or
  //! when SEC is 0), else SEC·2^(failures−2), at most MAX.
  [[nodiscard]] std::chrono::milliseconds after(std::int64_t failures) const noexcept {
    if (failures < 2 || sec.count() <= 0) return std::chrono::milliseconds(0);
    return std::min(max, sec * (std::int64_t{1} << std::min<std::int64_t>(failures - 2, 20)));
  }

  //! Parses "SEC[:MAX]" (seconds in [0, 86400]; MAX defaults to `defaults.max`).
  //! @throws std::invalid_argument "<what>='<text>': ..." on a malformed value.
  static cooldown parse(std::string_view text, std::string_view what, cooldown defaults) {
    const std::string t(text);
    // No source location in the message: a command line shows it to its user.
    const auto bad = [&](const char* why) { throw std::invalid_argument(std::string(what) + "='" + t + "': " + why); };
    const auto seconds = [&](const std::string& s) {
      char* end = nullptr;
      const double x = std::strtod(s.c_str(), &end);
      if (s.empty() || end != s.c_str() + s.size() || !(x >= 0 && x <= 86'400))
        bad("expected SEC[:MAX], seconds in [0, 86400]");
      return std::chrono::milliseconds(static_cast<std::int64_t>(x * 1000 + 0.5));
    };
    cooldown c = defaults;
    const auto colon = t.find(':');
    c.sec = seconds(t.substr(0, colon));
    if (colon != std::string::npos) c.max = seconds(t.substr(colon + 1));
    if (c.max < c.sec) bad("MAX is below SEC");
    return c;
  }
  //! As above, MAX defaulting to 60 s.
  static cooldown parse(std::string_view text, std::string_view what) { return parse(text, what, cooldown{}); }
};

}  // namespace elastic
EBBFLOW_END_NAMESPACE
