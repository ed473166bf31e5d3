// SPDX-License-Identifier: Apache-2.0
// The 8x8 digits data set (1797 images, 10 classes) shipped by Debian's
// python3-sklearn, read directly from its gzip'd CSV with zlib. Shared by the
// examples, the compression accuracy benchmark and the end-to-end tests; not
// part of the library.
#pragma once

#include <zlib.h>

#include <charconv>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

namespace digits {

inline constexpr int pixels = 64;
inline constexpr int classes = 10;

struct data_set {
  std::vector<float> x;  // n × 64, scaled to [0, 1]
  std::vector<int> y;    // n labels
  [[nodiscard]] std::size_t size() const noexcept { return y.size(); }
};

//! Where Debian's python3-sklearn puts the CSV (EBBFLOW_DIGITS overrides).
inline std::string default_path() {
  if (const char* p = std::getenv("EBBFLOW_DIGITS")) return p;
  return "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";
}

//! Parses one number at `p` (the file's pixels and labels are small integers,
//! so integers take the fast path; anything else goes through `from_chars`).
//! Returns the end of the number, or `p` when there is none.
inline const char* parse_number(const char* p, const char* e, float& out) {
  int i = 0;
  auto r = std::from_chars(p, e, i);
  if (r.ec == std::errc{} && (r.ptr == e || (*r.ptr != '.' && *r.ptr != 'e' && *r.ptr != 'E'))) {
    out = static_cast<float>(i);
    return r.ptr;
  }
  r = std::from_chars(p, e, out);
  return r.ec == std::errc{} ? r.ptr : p;
}

//! Loads all 1797 rows. @throws std::runtime_error naming the file and line.
inline data_set load(const std::string& path = default_path()) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("digits: cannot open " + path + " (install python3-sklearn)");
  std::string text;
  text.reserve(1 << 19);  // the CSV is 265 kB
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) text.append(buf, static_cast<std::size_t>(n));
  const bool read_error = n < 0;
  gzclose(f);
  if (read_error) throw std::runtime_error("digits: " + path + ": not a readable gzip file");
  data_set d;
  d.x.reserve(1797 * pixels);
  d.y.reserve(1797);
  float row[pixels + 1];
  std::size_t line = 0, pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    ++line;
    if (end > pos) {
      const char* p = text.data() + pos;
      const char* const e = text.data() + end;
      std::size_t columns = 0;
      while (p < e) {
        float v = 0;
        const char* q = parse_number(p, e, v);
        if (q == p) throw std::runtime_error("digits: " + path + ":" + std::to_string(line) + ": not a number");
        if (columns < pixels + 1) row[columns] = v;
        ++columns;
        p = q;
        while (p < e && (*p == ',' || *p == ' ' || *p == '\r')) ++p;
      }
      if (columns != pixels + 1)
        throw std::runtime_error("digits: " + path + ":" + std::to_string(line) + ": expected 65 columns, got " +
                                 std::to_string(columns));
      for (int i = 0; i < pixels; ++i) d.x.push_back(row[i] / 16.f);
      d.y.push_back(static_cast<int>(row[pixels]));
    }
    pos = end + 1;
  }
  if (d.size() != 1797)
    throw std::runtime_error("digits: expected 1797 rows in " + path + ", got " + std::to_string(d.size()));
  return d;
}

//! Deterministic split: every `k`-th sample (k = 5 → 20 %) goes to the test set.
inline void split(const data_set& all, data_set& train, data_set& test, int k = 5) {
  for (std::size_t i = 0; i < all.size(); ++i) {
    auto& dst = (i % static_cast<std::size_t>(k) == 0) ? test : train;
    dst.x.insert(dst.x.end(), all.x.begin() + static_cast<std::ptrdiff_t>(i * pixels),
                 all.x.begin() + static_cast<std::ptrdiff_t>((i + 1) * pixels));
    dst.y.push_back(all.y[i]);
  }
}

}  // namespace digits
