// SPDX-License-Identifier: Apache-2.0
// The names of this process's threads, as /proc shows them (Linux).
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace ebbflow_test {

inline std::vector<std::string> thread_names() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& t : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream f(t.path() / "comm");
    std::string name;
    if (std::getline(f, name)) out.push_back(name);
  }
  return out;
}

inline bool has_thread(const std::string& name) {
  for (const auto& n : thread_names())
    if (n == name) return true;
  return false;
}

}  // namespace ebbflow_test
