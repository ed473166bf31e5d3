// SPDX-License-Identifier: Apache-2.0
// Small helpers shared by the compress benchmarks: timing statistics, JSON
// lines output, argument parsing.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace bench {

//! A contestant of a throughput benchmark: one timed run and its times (seconds).
struct contestant {
  std::string name;
  std::function<void()> run;
  std::vector<double> times;
};

struct stats {
  double min = 0, median = 0, p99 = 0;
};
inline stats summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return {};
  const auto at = [&](double q) {
    return v[std::min(v.size() - 1, static_cast<std::size_t>(q * double(v.size() - 1) + 0.5))];
  };
  return {v.front(), at(0.5), at(0.99)};
}
inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
//! Value of `--name X` or `def`.
inline std::string arg(int argc, char** argv, const char* name, std::string def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return def;
}
inline bool flag(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return true;
  return false;
}

class json_lines {
 public:
  explicit json_lines(const std::string& path) : f_(path.empty() ? nullptr : std::fopen(path.c_str(), "w")) {}
  ~json_lines() {
    if (f_) std::fclose(f_);
  }
  json_lines(const json_lines&) = delete;
  json_lines& operator=(const json_lines&) = delete;
  //! Writes one object from a preformatted "k": v list.
  void write(const std::string& body) {
    if (f_) std::fprintf(f_, "{%s}\n", body.c_str()), std::fflush(f_);
  }

 private:
  std::FILE* f_;
};

}  // namespace bench
