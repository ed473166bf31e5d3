// SPDX-License-Identifier: Apache-2.0
// The examples' `--slowdowns F0,F1,...` list: worker k runs F[k mod n] times
// slower than the fastest (an emulated slower GPU). Shared by the examples;
// not part of the library.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace factors {

//! The comma-separated factors of `text`, each in [lo, hi]; nullopt when the
//! list is empty, a field is not a number or a factor is out of range.
inline std::optional<std::vector<double>> parse(const std::string& text, double lo, double hi) {
  std::vector<double> out;
  for (std::size_t p = 0; p <= text.size();) {
    const auto q = std::min(text.find(',', p), text.size());
    const std::string f = text.substr(p, q - p);
    char* end = nullptr;
    const double x = std::strtod(f.c_str(), &end);
    if (f.empty() || *end != 0 || !(x >= lo && x <= hi)) return std::nullopt;
    out.push_back(x);
    p = q + 1;
  }
  return out;
}

//! Worker `id`'s factor: 1 without a list.
inline double of(const std::vector<double>& list, long long id) {
  return list.empty() ? 1.0 : list[static_cast<std::size_t>(id < 0 ? 0 : id) % list.size()];
}

}  // namespace factors
