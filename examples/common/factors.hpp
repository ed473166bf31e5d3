// SPDX-License-Identifier: Apache-2.0
// The examples' `--slowdowns F0,F1,...` list: worker k runs F[k mod n] times
// slower than the fastest (an emulated slower GPU). Shared by the examples;
// not part of the library.
#pragma once

#include <cstddef>
#include <vector>

namespace factors {

//! Worker `id`'s factor: 1 without a list.
inline double of(const std::vector<double>& list, long long id) {
  return list.empty() ? 1.0 : list[static_cast<std::size_t>(id < 0 ? 0 : id) % list.size()];
}

}  // namespace factors
