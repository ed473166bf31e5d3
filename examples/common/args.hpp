// SPDX-License-Identifier: Apache-2.0
// One command-line parser for the examples and the tools. Each flag is
// declared once, with the variable it sets and its help line; a value is
// checked whole (and numbers in range), and a malformed one is a usage error:
// one line that names the flag and the value, exit status 2. `-h`/`--help`
// prints every declared flag, in the order declared. Shared by the examples,
// the tools and the benchmarks; not part of the library.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace cli {

//! The whole of `text` as a `T` in [lo, hi]; nullopt when it is anything
//! else (empty, trailing characters, out of range, not a number).
template <class T>
std::optional<T> parse_number(std::string_view text, T lo, T hi) {
  static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>);
  T x{};
  const char* end = text.data() + text.size();
  const auto [p, ec] = std::from_chars(text.data(), end, x);
  if (text.empty() || ec != std::errc{} || p != end || !(x >= lo && x <= hi)) return std::nullopt;
  return x;
}

//! The comma-separated numbers of `text`, each a `T` in [lo, hi]; nullopt
//! when there is none or any field is not one ("1,,2", "1,").
template <class T>
std::optional<std::vector<T>> parse_numbers(std::string_view text, T lo, T hi) {
  std::vector<T> out;
  for (std::size_t p = 0; p <= text.size();) {
    const auto q = std::min(text.find(',', p), text.size());
    const auto x = parse_number<T>(text.substr(p, q - p), lo, hi);
    if (!x) return std::nullopt;
    out.push_back(*x);
    p = q + 1;
  }
  return out;
}

//! `x` as help and errors show it: the shortest form (0.05, 1e+06, 200).
template <class T>
std::string show(const T& x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

//! What a number flag takes: "an integer in [lo, hi]" or "a number in [lo, hi]".
template <class T>
std::string expected_number(T lo, T hi) {
  return std::string(std::is_integral_v<T> ? "an integer" : "a number") + " in [" + show(lo) + ", " + show(hi) + "]";
}

//! Prints "<program>: <msg> (<program> --help lists the options)" and exits 2.
[[noreturn]] inline void usage_error(const std::string& program, const std::string& msg) {
  std::cerr << program << ": " << msg << " (" << program << " --help lists the options)\n";
  std::exit(2);
}

//! The flags of one program. Declare them (flag, number, text, value, note),
//! then parse. Not thread-safe; the variables must outlive parse().
class parser {
 public:
  //! `program` starts every error line; `synopsis` starts the help (whole
  //! lines); `epilogue` ends it.
  explicit parser(std::string program, std::string synopsis = "", std::string epilogue = "")
      : program_(std::move(program)), synopsis_(std::move(synopsis)), epilogue_(std::move(epilogue)) {}

  //! A flag without a value: sets `out` to true. `names`: "--x" or "-x, --long".
  parser& flag(std::string names, bool& out, std::string help) {
    return add(std::move(names), "", std::move(help), false, [&out](const std::string&) {
      out = true;
      return true;
    });
  }
  //! A number in [lo, hi].
  template <class T>
  parser& number(std::string names, std::string metavar, T& out, T lo, T hi, std::string help) {
    return add(std::move(names), std::move(metavar), std::move(help), true, [&out, lo, hi](const std::string& v) {
      const auto x = parse_number<T>(v, lo, hi);
      if (x) out = *x;
      return x.has_value();
    }, expected_number(lo, hi));
  }
  //! Any text.
  parser& text(std::string names, std::string metavar, std::string& out, std::string help) {
    return add(std::move(names), std::move(metavar), std::move(help), true, [&out](const std::string& v) {
      out = v;
      return true;
    });
  }
  //! A value of the caller's syntax: `set` takes it and returns false when it
  //! is malformed; the error then says "expected " + `expected`.
  parser& value(std::string names, std::string metavar, std::string expected,
                std::function<bool(const std::string&)> set, std::string help) {
    return add(std::move(names), std::move(metavar), std::move(help), true, std::move(set), std::move(expected));
  }
  //! A line of the help between the flags (a heading, a note), as it is.
  parser& note(std::string line) {
    entries_.push_back({{}, "", std::move(line), false, {}, ""});
    return *this;
  }

  //! Parses argv[1..]: prints the help and exits 0 on -h/--help; a usage
  //! error (see error) for an unknown flag, a missing or malformed value. With
  //! `rest`, the first argument that is not a flag (or those after `--`) and
  //! all after it go there; without, such an argument is an error.
  void parse(int argc, char** argv, std::vector<std::string>* rest = nullptr) const {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "-h" || a == "--help") {
        std::cout << help();
        std::exit(0);
      }
      const bool positional = a == "--" || a.empty() || a[0] != '-' || a == "-";
      if (positional) {
        if (!rest) error("unexpected argument '" + a + "'");
        for (int k = a == "--" ? i + 1 : i; k < argc; ++k) rest->emplace_back(argv[k]);
        return;
      }
      const entry* e = find(a);
      if (!e) error("unknown option " + a);
      std::string v;
      if (e->takes_value) {
        if (i + 1 >= argc) error(a + " needs a value");
        v = argv[++i];
      }
      if (!e->set(v)) error(a + " '" + v + "': expected " + e->expected);
    }
  }

  //! A usage error of this program (see usage_error).
  [[noreturn]] void error(const std::string& msg) const { usage_error(program_, msg); }

  //! The synopsis, a line per flag (its help from column 23, on a line of its
  //! own after a longer flag; a help's further lines indented as far), the
  //! notes, then the epilogue.
  [[nodiscard]] std::string help() const {
    constexpr std::size_t column = 23;
    std::string out = synopsis_;
    auto add_help = [&](std::string left, const std::string& text) {
      left = "  " + left;
      left += left.size() < column ? std::string(column - left.size(), ' ') : "\n" + std::string(column, ' ');
      std::size_t start = 0;
      for (bool first = true; start <= text.size(); first = false) {
        const auto nl = std::min(text.find('\n', start), text.size());
        out += (first ? left : std::string(column, ' ')) + text.substr(start, nl - start) + "\n";
        start = nl + 1;
      }
    };
    for (const auto& e : entries_) {
      if (e.names.empty()) {
        out += e.help + "\n";
        continue;
      }
      std::string left;
      for (const auto& n : e.names) left += (left.empty() ? "" : ", ") + n;
      if (!e.metavar.empty()) left += " " + e.metavar;
      add_help(left, e.help);
    }
    add_help("-h, --help", "this text");
    return out + epilogue_;
  }

 private:
  struct entry {
    std::vector<std::string> names;
    std::string metavar, help;
    bool takes_value = false;
    std::function<bool(const std::string&)> set;
    std::string expected;
  };

  parser& add(std::string names, std::string metavar, std::string help, bool takes_value,
              std::function<bool(const std::string&)> set, std::string expected = "") {
    entry e{{}, std::move(metavar), std::move(help), takes_value, std::move(set), std::move(expected)};
    for (std::size_t p = 0; p < names.size();) {
      const auto q = std::min(names.find(", ", p), names.size());
      e.names.push_back(names.substr(p, q - p));
      p = q + 2;
    }
    for (const auto& n : e.names)
      if (n.empty() || n[0] != '-' || n == "-h" || n == "--help" || find(n))
        throw std::logic_error(program_ + ": flag '" + n + "' declared twice or malformed");
    entries_.push_back(std::move(e));
    return *this;
  }
  [[nodiscard]] const entry* find(const std::string& name) const {
    for (const auto& e : entries_)
      if (std::find(e.names.begin(), e.names.end(), name) != e.names.end()) return &e;
    return nullptr;
  }

  std::string program_, synopsis_, epilogue_;
  std::vector<entry> entries_;
};

}  // namespace cli
