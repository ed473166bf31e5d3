// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the store's wire decoder (no sockets). Properties:
//  * decode() never crashes, never reads out of bounds, and reports every
//    rejection as errc::bad_message with a non-empty reason;
//  * a frame it accepts re-encodes to exactly the same bytes;
//  * splitting the input as a byte stream (what the server does) agrees.
// Built by .ci/steps/20-fuzz.sh with clang++ -fsanitize=fuzzer,address,undefined;
// tests/fuzz/CMakeLists.txt also replays the seed corpus with the normal compiler.
#include <ebbflow/elastic/detail/store_protocol.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <span>
#include <string>

namespace proto = ebbflow::elastic::detail::proto;

namespace {
[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "store_decoder_fuzz: property violated: %s\n", what);
  std::abort();
}

// Writes `m` back by its opcode's layout, the one the decoder read it by.
std::string reencode(const proto::message& m) {
  using proto::slot;
  proto::frame_builder b(m.code);
  for (const auto& f : proto::find_layout(static_cast<std::uint8_t>(m.code))->list()) {
    switch (f.where) {
      case slot::flag:
        b.u8(m.flag);
        break;
      case slot::timeout_ms:
        b.u32(m.timeout_ms);
        break;
      case slot::integer:
        b.i64(m.integer);
        break;
      case slot::key:
        b.str(m.key);
        break;
      case slot::value:
        b.str(m.value);
        break;
      case slot::expected:
        b.str(m.expected);
        break;
      case slot::keys:
        b.u32(static_cast<std::uint32_t>(m.keys.size()));
        for (auto k : m.keys) b.str(k);
        break;
      case slot::nonce:
        b.raw(m.nonce);
        break;
      case slot::mac:
        b.raw(m.mac);
        break;
    }
  }
  return b.finish();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto bytes = std::as_bytes(std::span(data, size));
  // 1. The whole input as one frame, under a small and the default limit.
  for (std::size_t limit : {std::size_t{64}, proto::default_max_message_bytes}) {
    auto r = proto::decode(bytes, limit);
    if (!r) {
      if (r.ec != ebbflow::errc::bad_message || r.reason.empty()) die("rejection without bad_message and a reason");
      continue;
    }
    const std::string again = reencode(r.msg);
    if (again.size() != size || std::memcmp(again.data(), data, size) != 0) die("accepted frame does not re-encode");
  }
  // 2. The input as a stream of frames, split the way the server splits it.
  const std::string_view s(reinterpret_cast<const char*>(data), size);
  std::size_t pos = 0;
  while (s.size() - pos >= proto::header_bytes) {
    const std::uint32_t len = proto::load_u32(s.data() + pos);
    if (!proto::check_length(len, 4096).empty()) break;
    if (s.size() - pos - proto::header_bytes < len) break;
    auto body = proto::decode_body(s.substr(pos + proto::header_bytes, len));
    auto whole = proto::decode(bytes.subspan(pos, proto::header_bytes + len), 4096);
    if (bool(body) != bool(whole) || body.reason != whole.reason) die("stream split disagrees with decode()");
    pos += proto::header_bytes + len;
  }
  return 0;
}
