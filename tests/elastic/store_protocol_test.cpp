// SPDX-License-Identifier: Apache-2.0
// The store's wire decoder: round trips of every message and a table of bad frames.
#include <ebbflow/elastic/detail/store_protocol.hpp>

#include <gtest/gtest.h>

#include <span>
#include <memory>
#include <string>
#include <vector>

namespace ef = ebbflow;
namespace proto = ebbflow::elastic::detail::proto;

namespace {
// Decoded views point into the frame: keep every frame alive for the test's duration.
proto::decode_result dec(std::string f, std::size_t max = proto::default_max_message_bytes) {
  static std::vector<std::unique_ptr<std::string>> keep;
  keep.push_back(std::make_unique<std::string>(std::move(f)));
  return proto::decode(std::as_bytes(std::span(keep.back()->data(), keep.back()->size())), max);
}
std::string le32(std::uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[static_cast<std::size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}
}  // namespace

TEST(StoreProtocol, RoundTrips) {
  using proto::frame_builder;
  using proto::op;
  auto r = dec(frame_builder(op::set).str("key").str(std::string("\0v\xff", 3)).finish());
  ASSERT_TRUE(r) << r.reason;
  EXPECT_EQ(r.msg.code, op::set);
  EXPECT_EQ(r.msg.key, "key");
  EXPECT_EQ(r.msg.value, std::string_view("\0v\xff", 3));
  r = dec(frame_builder(op::add).str("n").i64(-5).finish());
  ASSERT_TRUE(r);
  EXPECT_EQ(r.msg.integer, -5);
  r = dec(frame_builder(op::wait).u32(250).u32(3).str("a").str("").str("ccc").finish());
  ASSERT_TRUE(r);
  EXPECT_EQ(r.msg.timeout_ms, 250u);
  ASSERT_EQ(r.msg.keys.size(), 3u);
  EXPECT_EQ(r.msg.keys[2], "ccc");
  r = dec(frame_builder(op::wait_any).u32(40).u32(2).str("join/3").str("abort/1").finish());
  ASSERT_TRUE(r) << r.reason;
  EXPECT_EQ(r.msg.code, op::wait_any);
  EXPECT_EQ(r.msg.timeout_ms, 40u);
  ASSERT_EQ(r.msg.keys.size(), 2u);
  EXPECT_EQ(r.msg.keys[1], "abort/1");
  r = dec(frame_builder(op::compare_set).str("k").str("old").str("new").finish());
  ASSERT_TRUE(r);
  EXPECT_EQ(r.msg.expected, "old");
  EXPECT_EQ(r.msg.value, "new");
  r = dec(proto::error_frame(ef::errc::timeout, "late"));
  ASSERT_TRUE(r);
  EXPECT_EQ(proto::error_from_wire(r.msg.flag), ef::errc::timeout);
  EXPECT_EQ(r.msg.value, "late");
  r = dec(frame_builder(op::event).u8(2).str("m/1").str("").finish());
  ASSERT_TRUE(r);
  EXPECT_EQ(r.msg.flag, 2);
}

struct bad_case {
  const char* name;
  std::string frame;
  std::size_t max;
  const char* reason;
};

class StoreProtocolBad : public ::testing::TestWithParam<bad_case> {};

TEST_P(StoreProtocolBad, RejectedWithAReason) {
  const auto& c = GetParam();
  auto r = dec(c.frame, c.max);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.ec, ef::errc::bad_message);
  EXPECT_EQ(r.reason, c.reason);
}

INSTANTIATE_TEST_SUITE_P(
    Table, StoreProtocolBad,
    ::testing::Values(
        bad_case{"empty", "", 1024, "truncated header: 0 of 4 length bytes"},
        bad_case{"short_header", std::string("\x01\x00", 2), 1024, "truncated header: 2 of 4 length bytes"},
        bad_case{"zero_length", le32(0), 1024, "empty frame (length 0, no opcode)"},
        bad_case{"over_limit", le32(2000) + "x", 1024, "frame length 2000 exceeds the limit of 1024 bytes"},
        bad_case{"length_mismatch", le32(5) + "\x0b", 1024, "frame length 5 does not match the 1 bytes that follow"},
        bad_case{"unknown_opcode", le32(1) + "\x7f", 1024, "unknown opcode 0x7f"},
        bad_case{"truncated_field", le32(3) + std::string("\x02\x01\x00", 3), 1024,
                 "set: truncated: key needs 4 bytes, 2 left"},
        bad_case{"string_past_end", le32(9) + "\x02" + le32(100) + "abcd", 1024,
                 "set: key length 100 exceeds the 4 bytes left in the frame"},
        bad_case{"key_count_lies", le32(9) + "\x09" + le32(0x10000000) + "abcd", 1024,
                 "check: key count 268435456 cannot fit in the 4 bytes left in the frame"},
        bad_case{"trailing", le32(2) + "\x0b!", 1024, "ping: 1 trailing bytes after the last field"},
        bad_case{"bad_event_kind", le32(10) + "\x88\x07" + le32(0) + le32(0), 1024, "event: unknown event kind 7"}),
    [](const auto& info) { return std::string(info.param.name); });
