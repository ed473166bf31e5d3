// SPDX-License-Identifier: Apache-2.0
//! @file detail/json.hpp
//! The little JSON the etcd backend reads: etcd's v3 gateway answers in
//! proto3 JSON (objects, arrays, strings, booleans; 64-bit integers as
//! strings; fields at their default value left out). A small parser into a
//! tree, and base64 for keys and values (the gateway's `bytes` fields).
#pragma once

#include <ebbflow/config.hpp>

#include <cstddef>
#include <cstdint>
#include <charconv>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail::json {

//! A parsed value. Numbers keep their text; proto3 JSON writes int64 as strings anyway.
struct value {
  enum class kind { null, boolean, number, string, array, object };
  kind type = kind::null;
  bool b = false;
  std::string text;  // string contents, or a number's text
  std::vector<value> items;
  std::vector<std::pair<std::string, value>> fields;

  //! The field `name` of an object, or nullptr (also when this is not an object).
  [[nodiscard]] const value* find(std::string_view name) const noexcept {
    if (type != kind::object) return nullptr;
    for (const auto& [k, v] : fields)
      if (k == name) return &v;
    return nullptr;
  }
  //! An int64 field (written as a string or a number); `fallback` when absent (proto3 leaves out zeros).
  [[nodiscard]] std::int64_t i64(std::string_view name, std::int64_t fallback = 0) const noexcept {
    const value* v = find(name);
    if (!v || (v->type != kind::string && v->type != kind::number)) return fallback;
    std::int64_t x = fallback;
    std::from_chars(v->text.data(), v->text.data() + v->text.size(), x);
    return x;
  }
  //! A boolean field; false when absent.
  [[nodiscard]] bool flag(std::string_view name) const noexcept {
    const value* v = find(name);
    return v && v->type == kind::boolean && v->b;
  }
  //! A string field; empty when absent.
  [[nodiscard]] std::string str(std::string_view name) const {
    const value* v = find(name);
    return v && v->type == kind::string ? v->text : std::string();
  }
  //! The items of an array field; empty when absent.
  [[nodiscard]] const std::vector<value>& array(std::string_view name) const noexcept {
    static const std::vector<value> none;
    const value* v = find(name);
    return v && v->type == kind::array ? v->items : none;
  }
};

namespace impl {
struct parser {
  std::string_view s;
  std::size_t i = 0;
  int depth = 0;
  void ws() noexcept {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) ++i;
  }
  bool lit(std::string_view w) noexcept {
    if (s.substr(i, w.size()) != w) return false;
    i += w.size();
    return true;
  }
  static void put_utf8(std::string& out, std::uint32_t c) {
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (c < 0x800) {
      out += static_cast<char>(0xc0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3f));
    } else if (c < 0x10000) {
      out += static_cast<char>(0xe0 | (c >> 12));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (c & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (c >> 18));
      out += static_cast<char>(0x80 | ((c >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (c & 0x3f));
    }
  }
  bool hex4(std::uint32_t& c) noexcept {
    if (i + 4 > s.size()) return false;
    c = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = s[i++];
      c <<= 4;
      if (h >= '0' && h <= '9') c |= static_cast<std::uint32_t>(h - '0');
      else if (h >= 'a' && h <= 'f') c |= static_cast<std::uint32_t>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') c |= static_cast<std::uint32_t>(h - 'A' + 10);
      else return false;
    }
    return true;
  }
  bool string(std::string& out) {
    if (i >= s.size() || s[i] != '"') return false;
    ++i;
    while (i < s.size()) {
      const char c = s[i++];
      if (c == '"') return true;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i >= s.size()) return false;
      const char e = s[i++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          std::uint32_t c1 = 0;
          if (!hex4(c1)) return false;
          if (c1 >= 0xd800 && c1 < 0xdc00 && lit("\\u")) {
            std::uint32_t c2 = 0;
            if (!hex4(c2)) return false;
            c1 = 0x10000 + ((c1 - 0xd800) << 10) + (c2 - 0xdc00);
          }
          put_utf8(out, c1);
          break;
        }
        default: return false;
      }
    }
    return false;
  }
  bool parse(value& v) {
    if (++depth > 64) return false;  // etcd's answers are shallow; anything deeper is not etcd
    ws();
    if (i >= s.size()) return false;
    const char c = s[i];
    bool ok = true;
    if (c == '{') {
      v.type = value::kind::object;
      ++i;
      ws();
      if (i < s.size() && s[i] == '}') {
        ++i;
      } else {
        for (;;) {
          ws();
          std::string k;
          if (!string(k)) return false;
          ws();
          if (!lit(":")) return false;
          value x;
          if (!parse(x)) return false;
          v.fields.emplace_back(std::move(k), std::move(x));
          ws();
          if (lit(",")) continue;
          if (lit("}")) break;
          return false;
        }
      }
    } else if (c == '[') {
      v.type = value::kind::array;
      ++i;
      ws();
      if (i < s.size() && s[i] == ']') {
        ++i;
      } else {
        for (;;) {
          value x;
          if (!parse(x)) return false;
          v.items.push_back(std::move(x));
          ws();
          if (lit(",")) continue;
          if (lit("]")) break;
          return false;
        }
      }
    } else if (c == '"') {
      v.type = value::kind::string;
      ok = string(v.text);
    } else if (lit("true")) {
      v.type = value::kind::boolean;
      v.b = true;
    } else if (lit("false")) {
      v.type = value::kind::boolean;
    } else if (lit("null")) {
      v.type = value::kind::null;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.type = value::kind::number;
      const std::size_t b = i;
      while (i < s.size() && (s[i] == '-' || s[i] == '+' || s[i] == '.' || s[i] == 'e' || s[i] == 'E' ||
                              (s[i] >= '0' && s[i] <= '9')))
        ++i;
      v.text = std::string(s.substr(b, i - b));
    } else {
      ok = false;
    }
    --depth;
    return ok;
  }
};
}  // namespace impl

//! Parses one JSON text (surrounding white space allowed); nullopt when it is not valid JSON.
inline std::optional<value> parse(std::string_view text) {
  impl::parser p{text};
  value v;
  if (!p.parse(v)) return std::nullopt;
  p.ws();
  if (p.i != text.size()) return std::nullopt;
  return v;
}

//! Standard base64 (with padding), as proto3 JSON writes `bytes`.
inline std::string base64(std::string_view in) {
  static constexpr char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    const auto n = (std::uint32_t(std::uint8_t(in[i])) << 16) | (std::uint32_t(std::uint8_t(in[i + 1])) << 8) |
                   std::uint8_t(in[i + 2]);
    out += t[n >> 18];
    out += t[(n >> 12) & 63];
    out += t[(n >> 6) & 63];
    out += t[n & 63];
  }
  if (const auto rest = in.size() - i; rest != 0) {
    std::uint32_t n = std::uint32_t(std::uint8_t(in[i])) << 16;
    if (rest == 2) n |= std::uint32_t(std::uint8_t(in[i + 1])) << 8;
    out += t[n >> 18];
    out += t[(n >> 12) & 63];
    out += rest == 2 ? t[(n >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

//! Decodes base64 (standard or URL alphabet, padding optional); nullopt when malformed.
inline std::optional<std::string> unbase64(std::string_view in) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  while (!in.empty() && in.back() == '=') in.remove_suffix(1);
  std::string out;
  out.reserve(in.size() * 3 / 4);
  std::uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    const int v = val(c);
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | static_cast<std::uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  return out;
}

}  // namespace elastic::detail::json
EBBFLOW_END_NAMESPACE
