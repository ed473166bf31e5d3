// SPDX-License-Identifier: Apache-2.0
//! @file store_protocol.hpp
//! Wire protocol of the rendezvous store (no API promise).
//!
//! Every message is a frame: `u32 length` (little endian, bytes that follow),
//! then `u8 opcode`, then the opcode's fields. Field types: `u8`, `u32`,
//! `i64` (little endian) and `str` (`u32 length` + bytes, binary-safe).
//! Frames longer than a configurable limit are rejected before any allocation.
//!
//! Handshake (the secret never crosses the wire):
//!   server -> challenge{u8 version, nonce[32] server_nonce}
//!   client -> auth{u8 version, nonce[32] client_nonce, mac[32]}
//!             mac = HMAC-SHA256(token, "ebbflow-store client" | server_nonce | client_nonce)
//!   server -> welcome{mac[32]}  (HMAC over "ebbflow-store server" | ...: the server proves it too)
//!          or error{unauthorized} and closes.
//! Requests and their replies (one reply per request, in order):
//!   set{str key, str value}                    -> ok
//!   get{str key, u32 timeout_ms, u8 wait}      -> value{str} | missing | error{timeout}
//!   add{str key, i64 delta}                    -> integer{i64}
//!   compare_set{str key, str expected, str desired} -> cas_result{u8 swapped, str current}
//!   wait{u32 timeout_ms, u32 n, str key * n}   -> ok | error{timeout}
//!   wait_any{u32 timeout_ms, u32 n, str key * n} -> integer{index of the first key set} | error{timeout}
//!   erase{str key}                             -> boolean{u8 existed}
//!   num_keys{}                                 -> integer{i64}
//!   check{u32 n, str key * n}                  -> boolean{u8 all present}
//!   watch{str prefix, u8 include_existing}     -> ok, then event{u8 kind, str key, str value} forever
//!   ping{}                                     -> ok
//!   any                                        -> error{u8 errc, str reason}
//! A malformed frame gets an error reply (when the socket still allows one)
//! and the connection is closed, since the byte stream cannot be resynchronised.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/error.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail::proto {

inline constexpr std::uint8_t version = 1;
inline constexpr std::size_t header_bytes = 4;
inline constexpr std::size_t nonce_bytes = 32;
inline constexpr std::size_t mac_bytes = 32;
//! Default limit on a frame's length (bytes after the length prefix).
inline constexpr std::size_t default_max_message_bytes = std::size_t{16} << 20;
//! Limit before authentication: an unauthenticated peer cannot make the
//! server allocate more than this.
inline constexpr std::size_t preauth_max_message_bytes = 1024;
//! `timeout_ms` value meaning "no limit".
inline constexpr std::uint32_t no_timeout = 0xffffffffu;

enum class op : std::uint8_t {
  // client -> server
  auth = 0x01,
  set = 0x02,
  get = 0x03,
  add = 0x04,
  compare_set = 0x05,
  wait = 0x06,
  erase = 0x07,
  num_keys = 0x08,
  check = 0x09,
  watch = 0x0a,
  ping = 0x0b,
  wait_any = 0x0c,
  // server -> client
  ok = 0x80,
  challenge = 0x81,
  welcome = 0x82,
  value = 0x83,
  missing = 0x84,
  integer = 0x85,
  cas_result = 0x86,
  boolean = 0x87,
  event = 0x88,
  error = 0x89,
};

//! Kinds of `event` frames.
enum class event_kind : std::uint8_t { set = 1, erase = 2 };

//! A decoded frame. Views point into the decoded buffer and live as long as it.
struct message {
  op code{};
  std::string_view key;                //!< set/get/add/compare_set/erase/event; watch: prefix
  std::string_view value;              //!< set/value/event; compare_set: desired; cas_result: current; error: reason
  std::string_view expected;           //!< compare_set
  std::vector<std::string_view> keys;  //!< wait/check
  std::int64_t integer = 0;            //!< add: delta; integer reply
  std::uint32_t timeout_ms = 0;        //!< get/wait
  std::uint8_t flag = 0;               //!< get: wait; watch: include existing; cas_result: swapped; boolean;
                                       //!< event: kind; error: errc value; challenge/auth: version
  std::string_view nonce;              //!< challenge/auth (nonce_bytes)
  std::string_view mac;                //!< auth/welcome (mac_bytes)
};

//! The members of `message` that frames carry, each with its wire type:
//! flag u8, timeout_ms u32, integer i64, key/value/expected str, keys
//! `u32 n, str * n`, nonce nonce_bytes and mac mac_bytes raw bytes.
enum class slot : std::uint8_t { flag, timeout_ms, integer, key, value, expected, keys, nonce, mac };

//! One field of a frame: the member it fills, and its name in errors.
struct field {
  slot where{};
  const char* name = nullptr;
};

//! An opcode's name and the fields after it, in wire order: the one
//! description of the frames that decoding (and anything that re-encodes a
//! message) follows.
struct layout {
  op code{};
  const char* name = "?";
  std::array<field, 3> fields{};
  std::uint8_t count = 0;
  [[nodiscard]] constexpr std::span<const field> list() const noexcept { return {fields.data(), count}; }
};

namespace detail {
constexpr layout frame(op o, const char* name) noexcept { return {o, name, {}, 0}; }
constexpr layout frame(op o, const char* name, field a) noexcept { return {o, name, {a}, 1}; }
constexpr layout frame(op o, const char* name, field a, field b) noexcept { return {o, name, {a, b}, 2}; }
constexpr layout frame(op o, const char* name, field a, field b, field c) noexcept { return {o, name, {a, b, c}, 3}; }
}  // namespace detail

inline constexpr layout layouts[] = {
    detail::frame(op::auth, "auth", {slot::flag, "version"}, {slot::nonce, "client nonce"}, {slot::mac, "mac"}),
    detail::frame(op::set, "set", {slot::key, "key"}, {slot::value, "value"}),
    detail::frame(op::get, "get", {slot::key, "key"}, {slot::timeout_ms, "timeout"}, {slot::flag, "wait flag"}),
    detail::frame(op::add, "add", {slot::key, "key"}, {slot::integer, "delta"}),
    detail::frame(op::compare_set, "compare_set", {slot::key, "key"}, {slot::expected, "expected value"},
                  {slot::value, "desired value"}),
    detail::frame(op::wait, "wait", {slot::timeout_ms, "timeout"}, {slot::keys, "key"}),
    detail::frame(op::erase, "erase", {slot::key, "key"}),
    detail::frame(op::num_keys, "num_keys"),
    detail::frame(op::check, "check", {slot::keys, "key"}),
    detail::frame(op::watch, "watch", {slot::key, "prefix"}, {slot::flag, "include-existing flag"}),
    detail::frame(op::ping, "ping"),
    detail::frame(op::wait_any, "wait_any", {slot::timeout_ms, "timeout"}, {slot::keys, "key"}),
    detail::frame(op::ok, "ok"),
    detail::frame(op::challenge, "challenge", {slot::flag, "version"}, {slot::nonce, "server nonce"}),
    detail::frame(op::welcome, "welcome", {slot::mac, "mac"}),
    detail::frame(op::value, "value", {slot::value, "value"}),
    detail::frame(op::missing, "missing"),
    detail::frame(op::integer, "integer", {slot::integer, "integer"}),
    detail::frame(op::cas_result, "cas_result", {slot::flag, "swapped flag"}, {slot::value, "current value"}),
    detail::frame(op::boolean, "boolean", {slot::flag, "boolean"}),
    detail::frame(op::event, "event", {slot::flag, "event kind"}, {slot::key, "key"}, {slot::value, "value"}),
    detail::frame(op::error, "error", {slot::flag, "error code"}, {slot::value, "reason"}),
};

//! The layout of opcode `raw`; nullptr when no opcode has that value.
constexpr const layout* find_layout(std::uint8_t raw) noexcept {
  for (const auto& l : layouts)
    if (static_cast<std::uint8_t>(l.code) == raw) return &l;
  return nullptr;
}

inline constexpr const char* op_name(op o) noexcept {
  const layout* l = find_layout(static_cast<std::uint8_t>(o));
  return l ? l->name : "?";
}

//! Result of `decode`: a message, or `errc::bad_message` with a reason.
struct decode_result {
  message msg;
  std::error_code ec;
  std::string reason;  //!< empty on success
  explicit operator bool() const noexcept { return !ec; }
};

//! Checks a frame's announced length; returns an empty string when acceptable.
inline std::string check_length(std::uint32_t length, std::size_t max_bytes) {
  if (length == 0) return "empty frame (length 0, no opcode)";
  if (length > max_bytes)
    return "frame length " + std::to_string(length) + " exceeds the limit of " + std::to_string(max_bytes) + " bytes";
  return {};
}

inline std::uint32_t load_u32(const char* p) noexcept {
  unsigned char b[4];
  std::memcpy(b, p, 4);
  return std::uint32_t(b[0]) | std::uint32_t(b[1]) << 8 | std::uint32_t(b[2]) << 16 | std::uint32_t(b[3]) << 24;
}

namespace detail {
//! Bounds-checked reader over a body; the first failure sticks.
class reader {
 public:
  explicit reader(std::string_view s) noexcept : s_(s) {}
  bool failed() const noexcept { return !why_.empty(); }
  const std::string& why() const noexcept { return why_; }
  std::size_t left() const noexcept { return s_.size() - pos_; }

  std::uint8_t u8(const char* field) {
    if (!need(1, field)) return 0;
    return static_cast<std::uint8_t>(s_[pos_++]);
  }
  std::uint32_t u32(const char* field) {
    if (!need(4, field)) return 0;
    auto v = load_u32(s_.data() + pos_);
    pos_ += 4;
    return v;
  }
  std::int64_t i64(const char* field) {
    if (!need(8, field)) return 0;
    std::uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s_[pos_ + static_cast<std::size_t>(i)]);
    pos_ += 8;
    return static_cast<std::int64_t>(v);
  }
  std::string_view fixed(std::size_t n, const char* field) {
    if (!need(n, field)) return {};
    auto v = s_.substr(pos_, n);
    pos_ += n;
    return v;
  }
  std::string_view str(const char* field) {
    const std::uint32_t n = u32(field);
    if (failed()) return {};
    if (n > left()) {
      fail(std::string(field) + " length " + std::to_string(n) + " exceeds the " + std::to_string(left()) +
           " bytes left in the frame");
      return {};
    }
    auto v = s_.substr(pos_, n);
    pos_ += n;
    return v;
  }
  void fail(std::string why) {
    if (why_.empty()) why_ = std::move(why);
  }

 private:
  bool need(std::size_t n, const char* field) {
    if (failed()) return false;
    if (left() < n) {
      fail(std::string("truncated: ") + field + " needs " + std::to_string(n) + " bytes, " + std::to_string(left()) +
           " left");
      return false;
    }
    return true;
  }
  std::string_view s_;
  std::size_t pos_ = 0;
  std::string why_;
};

inline void read_keys(reader& r, std::vector<std::string_view>& out) {
  const std::uint32_t n = r.u32("key count");
  if (r.failed()) return;
  // Every key takes at least its 4-byte length: never trust `n` for the reservation.
  if (n > r.left() / 4) {
    r.fail("key count " + std::to_string(n) + " cannot fit in the " + std::to_string(r.left()) +
           " bytes left in the frame");
    return;
  }
  out.reserve(n);
  for (std::uint32_t i = 0; i < n && !r.failed(); ++i) out.push_back(r.str("key"));
}

//! Reads field `f` into its member of `m`.
inline void read_field(reader& r, const field& f, message& m) {
  switch (f.where) {
    case slot::flag:
      m.flag = r.u8(f.name);
      break;
    case slot::timeout_ms:
      m.timeout_ms = r.u32(f.name);
      break;
    case slot::integer:
      m.integer = r.i64(f.name);
      break;
    case slot::key:
      m.key = r.str(f.name);
      break;
    case slot::value:
      m.value = r.str(f.name);
      break;
    case slot::expected:
      m.expected = r.str(f.name);
      break;
    case slot::keys:
      read_keys(r, m.keys);
      break;
    case slot::nonce:
      m.nonce = r.fixed(nonce_bytes, f.name);
      break;
    case slot::mac:
      m.mac = r.fixed(mac_bytes, f.name);
      break;
  }
}
}  // namespace detail

//! Decodes a frame body (opcode and fields, without the length prefix).
//! Never throws for bad input (only std::bad_alloc); never reads out of bounds.
inline decode_result decode_body(std::string_view body) {
  decode_result res;
  auto bad = [&](std::string why) {
    res.ec = make_error_code(ebbflow::error::bad_message);
    res.reason = std::move(why);
    return std::move(res);
  };
  if (body.empty()) return bad("empty frame (no opcode)");
  detail::reader r(body.substr(1));
  message& m = res.msg;
  const auto raw = static_cast<std::uint8_t>(body[0]);
  m.code = static_cast<op>(raw);
  const layout* l = find_layout(raw);
  if (!l) {
    static constexpr char hex[] = "0123456789abcdef";
    std::string h = "0x";
    h += hex[raw >> 4];
    h += hex[raw & 15];
    return bad("unknown opcode " + h);
  }
  for (const field& f : l->list()) detail::read_field(r, f, m);
  if (m.code == op::event && !r.failed() && m.flag != 1 && m.flag != 2)
    r.fail("unknown event kind " + std::to_string(m.flag));
  if (r.failed()) return bad(std::string(op_name(m.code)) + ": " + r.why());
  if (r.left() != 0)
    return bad(std::string(op_name(m.code)) + ": " + std::to_string(r.left()) + " trailing bytes after the last field");
  return res;
}

//! Decodes one whole frame (length prefix included). The length must match
//! the bytes given exactly and not exceed `max_bytes`. This is the fuzzed entry point.
inline decode_result decode(std::span<const std::byte> frame, std::size_t max_bytes = default_max_message_bytes) {
  const std::string_view s(reinterpret_cast<const char*>(frame.data()), frame.size());
  if (s.size() < header_bytes) {
    decode_result res;
    res.ec = make_error_code(ebbflow::error::bad_message);
    res.reason = "truncated header: " + std::to_string(s.size()) + " of 4 length bytes";
    return res;
  }
  const std::uint32_t len = load_u32(s.data());
  std::string why = check_length(len, max_bytes);
  if (why.empty() && len != s.size() - header_bytes)
    why = "frame length " + std::to_string(len) + " does not match the " + std::to_string(s.size() - header_bytes) +
          " bytes that follow";
  if (!why.empty()) {
    decode_result res;
    res.ec = make_error_code(ebbflow::error::bad_message);
    res.reason = std::move(why);
    return res;
  }
  return decode_body(s.substr(header_bytes));
}

//! Builds one frame in a std::string (the length is patched by `finish`).
class frame_builder {
 public:
  explicit frame_builder(op o, std::size_t reserve = 64) {
    buf_.reserve(reserve + header_bytes + 1);
    buf_.append(header_bytes, '\0');
    buf_.push_back(static_cast<char>(o));
  }
  frame_builder& u8(std::uint8_t v) {
    buf_.push_back(static_cast<char>(v));
    return *this;
  }
  frame_builder& u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) buf_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    return *this;
  }
  frame_builder& i64(std::int64_t s) {
    auto v = static_cast<std::uint64_t>(s);
    for (int i = 0; i < 8; ++i) buf_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    return *this;
  }
  frame_builder& raw(std::string_view s) {
    buf_.append(s);
    return *this;
  }
  frame_builder& str(std::string_view s) {
    u32(static_cast<std::uint32_t>(s.size()));
    buf_.append(s);
    return *this;
  }
  //! The finished frame (moves the buffer out); `size() - 4` must fit in u32.
  std::string finish() {
    const auto len = static_cast<std::uint32_t>(buf_.size() - header_bytes);
    for (int i = 0; i < 4; ++i) buf_[static_cast<std::size_t>(i)] = static_cast<char>((len >> (8 * i)) & 0xff);
    return std::move(buf_);
  }

 private:
  std::string buf_;
};

//! An `error` frame.
inline std::string error_frame(errc code, std::string_view reason) {
  return frame_builder(op::error, reason.size() + 8).u8(static_cast<std::uint8_t>(code)).str(reason).finish();
}

//! Maps an `error` frame's code to ebbflow's error code (unknown codes: bad_message).
inline std::error_code error_from_wire(std::uint8_t v) noexcept {
  if (v >= 1 && v <= static_cast<std::uint8_t>(ebbflow::error::job_finished))
    return make_error_code(static_cast<ebbflow::error>(v));
  return make_error_code(ebbflow::error::bad_message);
}

}  // namespace elastic::detail::proto

namespace elastic::detail {
//! A key for messages: quoted, non-printable bytes as \xNN, cut after 64 bytes.
inline std::string quote_key(std::string_view k) {
  std::string out = "'";
  const std::size_t n = std::min<std::size_t>(k.size(), 64);
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(k[i]);
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      static constexpr char hex[] = "0123456789abcdef";
      out += "\\x";
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  if (k.size() > n) out += "...";
  return out + "'";
}
}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
