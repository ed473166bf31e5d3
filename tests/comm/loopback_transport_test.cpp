// SPDX-License-Identifier: Apache-2.0
#include <ebbflow/comm/loopback_transport.hpp>

#include <gtest/gtest.h>

namespace ef = ebbflow;
using namespace std::chrono_literals;

TEST(LoopbackTransport, RingExchangeInOrder) {
  ef::comm::spawn_loopback(4, [](ef::comm::loopback_transport& t) {
    const int next = (t.rank() + 1) % t.size(), prev = (t.rank() + t.size() - 1) % t.size();
    for (int i = 0; i < 3; ++i) {
      int out = t.rank() * 10 + i, in = -1;
      auto s = t.isend(next, 7, std::as_bytes(std::span(&out, 1)));
      ef::comm::recv(t, prev, 7, std::as_writable_bytes(std::span(&in, 1)), ef::deadline::after(1s));
      std::error_code ec;
      t.wait(s, ef::deadline::after(1s), ec);
      ASSERT_FALSE(ec);
      ASSERT_EQ(in, prev * 10 + i);
    }
  });
}

TEST(LoopbackTransport, GenerationsNeverMix) {
  ef::comm::spawn_loopback(2, [](ef::comm::loopback_transport& t) {
    int v = 1;
    if (t.rank() == 0) {
      ef::comm::send(t, 1, 3, std::as_bytes(std::span(&v, 1)), ef::deadline::after(1s));  // generation 0
      t.set_generation(1);
      v = 2;
      ef::comm::send(t, 1, 3, std::as_bytes(std::span(&v, 1)), ef::deadline::after(1s));
    } else {
      t.set_generation(1);
      int in = 0;
      ef::comm::recv(t, 0, 3, std::as_writable_bytes(std::span(&in, 1)), ef::deadline::after(1s));
      EXPECT_EQ(in, 2);  // the generation-0 message is never consumed
    }
  });
}

TEST(LoopbackTransport, TimeoutSizeMismatchAndPeerLoss) {
  auto hub = std::make_shared<ef::comm::loopback_hub>(2);
  ef::comm::loopback_transport a(hub, 0), b(hub, 1);
  int x = 0;
  auto r = a.irecv(1, 1, std::as_writable_bytes(std::span(&x, 1)));
  std::error_code ec;
  const auto t0 = ef::steady_clock::now();
  a.wait(r, ef::deadline::after(20ms), ec);
  EXPECT_EQ(ec, ef::errc::timeout);
  EXPECT_GE(ef::steady_clock::now() - t0, 20ms);
  double big = 0;
  b.isend(0, 1, std::as_bytes(std::span(&big, 1)));
  a.wait(r, ef::deadline::after(1s), ec);
  EXPECT_EQ(ec, ef::errc::bad_message);
  auto r2 = a.irecv(1, 2, std::as_writable_bytes(std::span(&x, 1)));
  hub->kill(1);
  a.wait(r2, ef::deadline::after(1s), ec);
  EXPECT_EQ(ec, ef::errc::peer_lost);
  try {
    ef::comm::recv(a, 1, 5, std::as_writable_bytes(std::span(&x, 1)), ef::deadline::after(1s));
    FAIL();
  } catch (const ef::system_error& e) {
    EXPECT_EQ(e.peer(), 1);
    EXPECT_EQ(e.rank(), 0);
    EXPECT_EQ(e.code(), ef::errc::peer_lost);
  }
}

TEST(LoopbackTransport, SizeMismatchNamesBothSizes) {
  // transport.hpp: a message of the wrong size fails the receive with
  // bad_message naming the sender's and the receiver's sizes.
  for (const std::size_t sent : {std::size_t{12}, std::size_t{28}}) {
    auto hub = std::make_shared<ef::comm::loopback_hub>(2);
    ef::comm::loopback_transport a(hub, 0), b(hub, 1);
    std::vector<std::byte> out(sent), in(20);
    b.isend(0, 1, out);
    try {
      ef::comm::recv(a, 1, 1, in, ef::deadline::after(1s));
      ADD_FAILURE() << "a " << sent << "-byte message filled a 20-byte receive";
    } catch (const ef::system_error& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.code(), ef::errc::bad_message) << what;
      EXPECT_NE(what.find("message of " + std::to_string(sent) + " bytes"), std::string::npos) << what;
      EXPECT_NE(what.find("20-byte receive buffer"), std::string::npos) << what;
    }
  }
}
