// SPDX-License-Identifier: Apache-2.0
// The rendezvous store against real processes and raw sockets on loopback.
#include "raw_client.hpp"
#include "../../tools/ebbflow-run/child_processes.hpp"
#include "../thread_names.hpp"

#include <ebbflow/elastic/kv_store.hpp>
#include <ebbflow/elastic/tcp_store.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace ef = ebbflow;
namespace el = ebbflow::elastic;
namespace proto = ebbflow::elastic::detail::proto;
using namespace std::chrono_literals;
using namespace std::string_literals;
using ms = std::chrono::milliseconds;

namespace {
const std::string token = "test-token-0123456789";

el::server_options test_options() {
  el::server_options o;
  o.token = token;
  o.frame_timeout = 300ms;
  o.auth_timeout = 2s;
  o.max_message_bytes = std::size_t{1} << 20;
  return o;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

//! Runs worker processes against `srv` and collects their output.
struct workers {
  std::mutex mu;
  std::map<int, std::string> out;
  ebbflow_run::child_processes group{[this](int id, int, std::string_view line) {
    std::lock_guard lk(mu);
    out[id].append(line).push_back('\n');
  }};
  pid_t spawn(int id, const el::store_server& srv, std::vector<std::string> args, const std::string& tok = token) {
    ebbflow_run::child_spec s;
    s.id = id;
    s.argv = {EBBFLOW_STORE_WORKER};
    s.argv.insert(s.argv.end(), args.begin(), args.end());
    s.env = {{"EBBFLOW_STORE", srv.address()},
             {"EBBFLOW_TOKEN", tok},
             {"EBBFLOW_RANK", std::to_string(id)},
             {"EBBFLOW_WORLD_SIZE", "1000"}};
    return group.spawn(s);
  }
  //! Waits until every worker has exited; returns their exits.
  std::vector<ebbflow_run::child_exit> join(ef::deadline d) {
    std::vector<ebbflow_run::child_exit> all;
    while (group.running() > 0 && !d.expired()) {
      auto e = group.poll(d);
      all.insert(all.end(), e.begin(), e.end());
    }
    return all;
  }
  //! Waits until worker `id` printed `what`.
  bool wait_for_line(int id, const std::string& what, ef::deadline d) {
    for (;;) {
      {
        std::lock_guard lk(mu);
        if (out[id].find(what) != std::string::npos) return true;
      }
      if (d.expired()) return false;
      group.poll(min(d, ef::deadline::after(20ms)));
    }
  }
};
}  // namespace

// The server and memory_store agree on counters: text with trailing
// garbage is not an integer, and a sum past int64 is refused, the value
// left as it was (memory_store parsed "12abc" as 12 and overflowed into
// undefined behaviour).
// wait_any: the index of the first key set, in the order asked, at once
// when one is; woken by the first set otherwise; a deadline like wait's. The
// server and the in-process store answer alike.
TEST(Store, WaitAnyAnswersWithTheFirstKeySet) {
  el::store_server srv(test_options());
  el::store_client c("127.0.0.1", srv.port(), token);
  el::memory_store m;
  const auto d = [] { return ef::deadline::after(5s); };
  for (auto* s : {static_cast<void*>(&c), static_cast<void*>(&m)}) {
    auto any = [&](const std::vector<std::string>& keys, ef::deadline dl) {
      return s == &c ? c.wait_any(keys, dl) : m.wait_any(keys, dl);
    };
    auto set = [&](const std::string& k) { s == &c ? c.set(k, "v", d()) : m.set(k, "v", d()); };
    set("b");
    EXPECT_EQ(any({"a", "b", "c"}, d()), 1u);
    set("c");
    EXPECT_EQ(any({"a", "c", "b"}, d()), 1u) << "not the first key set in the order asked";
    EXPECT_THROW(any({}, d()), std::invalid_argument);
    try {
      (void)any({"x", "y"}, ef::deadline::after(50ms));
      FAIL() << "wait_any of missing keys returned";
    } catch (const ef::system_error& e) {
      EXPECT_EQ(e.code(), ef::errc::timeout);
      EXPECT_EQ(e.operation(), "store.wait_any");
    }
  }
  EXPECT_NE(c.last_error_detail().find("none of 2 keys set within"), std::string::npos) << c.last_error_detail();
  EXPECT_NE(c.last_error_detail().find("'y'"), std::string::npos) << c.last_error_detail();
  // Woken by another client's set of any one key, without polling; the other
  // keys' waits end with it (a later set of one wakes nothing, and the
  // connection goes on in order).
  el::store_client other("127.0.0.1", srv.port(), token);
  std::thread setter([&] {
    std::this_thread::sleep_for(100ms);
    other.set("y", "now");
  });
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(c.wait_any({"x", "y", "z"}, ef::deadline::after(5s)), 1u);
  const double took = ms_since(t0);
  setter.join();
  EXPECT_GE(took, 90.0);
  EXPECT_LT(took, 400.0);
  other.set("x", "later");
  other.set("z", "later");
  EXPECT_EQ(c.add("n", 2, d()), 2);
  EXPECT_EQ(c.get("x", d()), "later");
  // The error-code form: a server that is asked for no key says so.
  std::error_code ec;
  (void)c.wait_any({}, d(), ec);
  EXPECT_EQ(ec, ef::errc::bad_message);
  EXPECT_NE(c.last_error_detail().find("no keys"), std::string::npos) << c.last_error_detail();
  EXPECT_EQ(c.add("n", 1, d()), 3) << "the connection did not go on after the refused request";
}

TEST(Store, ServerAndMemoryStoreAgreeOnCounters) {
  el::store_server srv(test_options());
  el::store_client c("127.0.0.1", srv.port(), token);
  el::memory_store m;
  const auto d = [] { return ef::deadline::after(5s); };
  const auto code = [&](auto&& f) {
    try {
      f();
    } catch (const ef::system_error& e) {
      return e.code();
    }
    return std::error_code();
  };
  for (const std::string v : {"12abc", " 5", "1e3", "0x10"}) {
    c.set("k", v, d());
    m.set("k", v, d());
    EXPECT_EQ(code([&] { c.add("k", 1, d()); }), ef::errc::invalid_state) << v;
    EXPECT_EQ(code([&] { m.add("k", 1, d()); }), ef::errc::invalid_state) << v;
    EXPECT_EQ(m.try_get("k", d()), v);
  }
  const std::string top = std::to_string(std::numeric_limits<std::int64_t>::max());
  c.set("n", top, d());
  m.set("n", top, d());
  EXPECT_EQ(code([&] { c.add("n", 1, d()); }), ef::errc::invalid_state);
  EXPECT_EQ(code([&] { m.add("n", 1, d()); }), ef::errc::invalid_state);
  EXPECT_EQ(m.try_get("n", d()), top);
  EXPECT_EQ(c.add("n", -1, d()), m.add("n", -1, d()));
}

// The handshake's nonces: the right length, never repeated, and every byte
// value drawn (a source that returned zeros or a fixed pattern would fail).
TEST(Store, HandshakeNoncesAreRandom) {
  namespace d = ebbflow::elastic::detail;
  EXPECT_TRUE(d::random_bytes(0).empty());
  const std::string a = d::random_bytes(16), b = d::random_bytes(16);
  EXPECT_EQ(a.size(), 16u);
  EXPECT_NE(a, b);
  const std::string many = d::random_bytes(1 << 16);
  std::array<int, 256> seen{};
  for (unsigned char c : many) ++seen[c];
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 0), 0);
  EXPECT_EQ(d::random_hex(8).size(), 16u);
}

// A client refused at the handshake (here: no free connection slot) closes
// its side, so its next call connects again once a slot is free (it wrote
// into the closed socket and reported peer_lost, as if the store were gone).
TEST(Store, AClientRefusedAtTheHandshakeConnectsAgain) {
  auto o = test_options();
  o.max_connections = 1;
  el::store_server srv(o);
  std::optional<el::store_client> first;
  first.emplace("127.0.0.1", srv.port(), token);
  first->ping(ef::deadline::after(2s));
  el::store_client c("127.0.0.1", srv.port(), token);
  std::error_code ec;
  c.ping(ef::deadline::after(2s), ec);
  ASSERT_EQ(ec, ef::errc::invalid_state) << c.last_error_detail();
  first.reset();  // frees the only slot
  for (int i = 0; i < 200 && srv.stats().open != 0; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(srv.stats().open, 0u);
  c.ping(ef::deadline::after(2s), ec);
  EXPECT_FALSE(ec) << ec.message() << ": " << c.last_error_detail();
}

TEST(Store, BasicOperations) {
  el::store_server srv(test_options());
#if defined(__linux__)
  EXPECT_TRUE(ebbflow_test::has_thread("ebbflow-store"));  // named before the constructor returned
#endif
  el::store_client c("127.0.0.1", srv.port(), token);
  c.set("a", "1");
  EXPECT_EQ(c.get("a"), "1");
  EXPECT_EQ(c.try_get("missing"), std::nullopt);
  // Binary values survive (UCX worker addresses are binary).
  std::string bin(3000, '\0');
  for (std::size_t i = 0; i < bin.size(); ++i) bin[i] = static_cast<char>(i * 7);
  c.set("bin", bin);
  EXPECT_EQ(c.get("bin"), bin);
  EXPECT_EQ(c.add("n", 5), 5);
  EXPECT_EQ(c.add("n", -7), -2);
  EXPECT_EQ(c.get("n"), "-2");
  auto r = c.compare_set("cas", "", "x");  // missing key matches ""
  EXPECT_TRUE(r.swapped);
  r = c.compare_set("cas", "y", "z");
  EXPECT_FALSE(r.swapped);
  EXPECT_EQ(r.current, "x");
  EXPECT_TRUE(c.check({"a", "n"}));
  EXPECT_FALSE(c.check({"a", "nope"}));
  EXPECT_EQ(c.num_keys(), 4);
  EXPECT_TRUE(c.erase("a"));
  EXPECT_FALSE(c.erase("a"));
  EXPECT_EQ(c.num_keys(), 3);
  std::error_code ec;
  c.add("bin", 1, ec);  // not an integer
  EXPECT_EQ(ec, ef::errc::invalid_state);
  EXPECT_NE(c.last_error_detail().find("not an integer"), std::string::npos) << c.last_error_detail();
  c.ping(ef::deadline::after(1s));  // the connection survived the in-band error
  // A value over the server's limit (1 MiB here) is refused with the reason; the client reconnects.
  c.set("big", std::string(std::size_t{2} << 20, 'x'), ef::deadline::after(5s), ec);
  EXPECT_EQ(ec, ef::errc::bad_message);
  EXPECT_NE(c.last_error_detail().find("exceeds the limit of 1048576 bytes"), std::string::npos)
      << c.last_error_detail();
  c.ping(ef::deadline::after(1s));
  // The client's own limit stops a request before it is sent.
  el::client_options small;
  small.max_message_bytes = 1000;
  el::store_client s("127.0.0.1", srv.port(), token, small);
  s.set("v", std::string(2000, 'x'), ec);
  EXPECT_EQ(ec, ef::errc::bad_message);
  EXPECT_NE(s.last_error_detail().find("exceeds max_message_bytes 1000"), std::string::npos);
}

// Pipelined adds: replies in order, batches beyond the client's 64-frame
// window, other clients interleaving, an in-band error mid-batch named, and
// a connection still usable afterwards.
TEST(Store, AddManyIsPipelinedAndInOrder) {
  el::store_server srv(test_options());
  el::store_client c("127.0.0.1", srv.port(), token);
  el::store_client other("127.0.0.1", srv.port(), token);
  std::vector<std::string> keys;
  std::vector<std::int64_t> deltas;
  for (int i = 0; i < 150; ++i) keys.push_back("m/" + std::to_string(i % 100)), deltas.push_back(i + 1);
  EXPECT_EQ(other.add("m/7", 1000), 1000);
  const auto d = ef::deadline::after(5s);
  const std::vector<std::int64_t> got = c.add_many(keys, deltas, d);
  ASSERT_EQ(got.size(), keys.size());
  std::map<std::string, std::int64_t> want = {{"m/7", 1000}};
  for (std::size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(got[i], want[keys[i]] += deltas[i]) << "reply " << i;
  EXPECT_EQ(other.add("m/7", 0), want["m/7"]);
  EXPECT_TRUE(c.add_many({}, {}, d).empty());
  const std::vector<std::int64_t> one = {1};
  EXPECT_THROW((void)c.add_many(keys, one, d), std::invalid_argument);
  // An in-band error (not an integer) in the middle: the adds before it are returned, the error says which.
  c.set("text", "abc");
  const std::vector<std::string> mixed = {"m/1", "text", "m/2"};
  const std::vector<std::int64_t> ones = {1, 1, 1};
  std::error_code ec;
  const auto part = c.add_many(mixed, ones, d, ec);
  EXPECT_EQ(ec, ef::errc::invalid_state);
  EXPECT_EQ(part.size(), 1u);
  EXPECT_NE(c.last_error_detail().find("reply 2 of 3 (key 'text')"), std::string::npos) << c.last_error_detail();
  EXPECT_EQ(c.add("m/1", 0), part[0]);  // usable again (it reconnects)
  // A batch costs about one round trip, not one per key.
  std::vector<std::string> k16(16, "hb");
  std::vector<std::int64_t> z16(16, 0);
  std::vector<double> single, batch;
  for (int i = 0; i < 200; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < 16; ++k) (void)c.add("hb", 0);
    single.push_back(ms_since(t0));
    t0 = std::chrono::steady_clock::now();
    (void)c.add_many(k16, z16, d);
    batch.push_back(ms_since(t0));
  }
  std::sort(single.begin(), single.end());
  std::sort(batch.begin(), batch.end());
  std::printf("16 adds: one by one %.1f us, add_many %.1f us (medians)\n", 1000 * single[100], 1000 * batch[100]);
}

TEST(Store, TryGetManyIsPipelinedAndInOrder) {
  el::store_server srv(test_options());
  el::store_client c("127.0.0.1", srv.port(), token);
  // 150 keys cross the 64-request batches; every third is missing.
  std::vector<std::string> keys;
  for (int i = 0; i < 150; ++i) {
    keys.push_back("g/" + std::to_string(i));
    if (i % 3) c.set(keys.back(), "v" + std::to_string(i));
  }
  const auto d = ef::deadline::after(5s);
  const auto got = c.try_get_many(keys, d);
  ASSERT_EQ(got.size(), keys.size());
  for (int i = 0; i < 150; ++i) {
    if (i % 3)
      EXPECT_EQ(got[static_cast<std::size_t>(i)], "v" + std::to_string(i)) << "reply " << i;
    else
      EXPECT_FALSE(got[static_cast<std::size_t>(i)].has_value()) << "reply " << i;
  }
  EXPECT_TRUE(c.try_get_many({}, d).empty());
  // The same through the in-process store.
  el::memory_store m;
  m.set("a", "1", d);
  const std::vector<std::string> ab = {"a", "b"};
  const auto mg = m.try_get_many(ab, d);
  ASSERT_EQ(mg.size(), 2u);
  EXPECT_EQ(mg[0], "1");
  EXPECT_FALSE(mg[1].has_value());
  // A key over the message limit fails before anything is sent, naming it.
  el::client_options small;
  small.max_message_bytes = 256;
  el::store_client s2("127.0.0.1", srv.port(), token, small);
  const std::vector<std::string> big = {"g/1", std::string(300, 'k')};
  std::error_code ec;
  const auto part = s2.try_get_many(big, d, ec);
  EXPECT_EQ(ec, ef::errc::bad_message);
  EXPECT_TRUE(part.empty());
  EXPECT_NE(s2.last_error_detail().find("try_get_many: request for key"), std::string::npos) << s2.last_error_detail();
  EXPECT_EQ(s2.try_get_many(std::span(big).first(1), d)[0], "v1");  // usable again
}

TEST(Store, RoundTripIsSubMillisecond) {
  el::store_server srv(test_options());
  el::store_client c("127.0.0.1", srv.port(), token);
  c.connect(ef::deadline::after(2s));
  std::vector<double> t;
  for (int i = 0; i < 2000; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    c.add("hb", 1);
    t.push_back(ms_since(t0) * 1000);
  }
  std::sort(t.begin(), t.end());
  const double p50 = t[t.size() / 2], p99 = t[t.size() * 99 / 100];
  std::printf("store add round trip: min %.1f us, p50 %.1f us, p99 %.1f us\n", t.front(), p50, p99);
  EXPECT_LT(p50, 1000.0);
}

TEST(Store, SixtyFourProcessesCountExactly) {
  el::store_server srv(test_options());
  el::store_client c("127.0.0.1", srv.port(), token);
  c.set("cas", "0");
  constexpr int procs = 64, adds = 100, cas = 10;
  workers w;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < procs; ++i) w.spawn(i, srv, {"count", std::to_string(adds), std::to_string(cas)});
  auto exits = w.join(ef::deadline::after(30s));
  ASSERT_EQ(exits.size(), std::size_t{procs});
  for (const auto& e : exits) EXPECT_TRUE(e.ok()) << "worker " << e.id << " " << e.describe() << ": " << w.out[e.id];
  EXPECT_EQ(c.get("counter"), std::to_string(procs * adds));
  EXPECT_EQ(c.get("cas"), std::to_string(procs * cas));
  std::printf("%d processes x (%d add + %d compare_set increments): %.0f ms\n", procs, adds, cas, ms_since(t0));
}

TEST(Store, WaitHonoursItsDeadline) {
  el::store_server srv(test_options());
  el::store_client c("127.0.0.1", srv.port(), token);
  c.set("present", "1");
  for (auto timeout : {ms(50), ms(200)}) {
    std::error_code ec;
    const auto t0 = std::chrono::steady_clock::now();
    c.wait({"present", "absent"}, ef::deadline::after(timeout), ec);
    const double took = ms_since(t0);
    EXPECT_EQ(ec, ef::errc::timeout);
    EXPECT_GE(took, double(timeout.count()) - 1.0);
    EXPECT_LE(took, double(timeout.count()) + 100.0) << "wait overran its deadline";
    EXPECT_NE(c.last_error_detail().find("1 of 2 keys still missing"), std::string::npos) << c.last_error_detail();
    EXPECT_NE(c.last_error_detail().find("'absent'"), std::string::npos);
  }
  // A fraction of a millisecond is waited for too: the server counts whole
  // milliseconds, rounded up. Rounded down, a caller that waits in slices
  // (the coordinator's heartbeat, every 50 ms) spun through its last
  // fraction of one in round trips that came back at once.
  for (auto timeout : {std::chrono::microseconds(600), std::chrono::microseconds(1500)}) {
    std::error_code ec;
    const auto t0 = std::chrono::steady_clock::now();
    c.wait({"absent"}, ef::deadline::after(timeout), ec);
    const auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_EQ(ec, ef::errc::timeout);
    EXPECT_GE(took, timeout) << "a wait of " << timeout.count() << " us came back early";
  }
  // get waits too, and the throwing form names the operation and key.
  try {
    (void)c.get("absent", ef::deadline::after(30ms));
    FAIL() << "get of a missing key returned";
  } catch (const ef::system_error& e) {
    EXPECT_EQ(e.code(), ef::errc::timeout);
    EXPECT_EQ(e.operation(), "store.get");
    EXPECT_NE(std::string(e.what()).find("'absent'"), std::string::npos) << e.what();
  }
  // A wait completes as soon as another client provides the key (no polling).
  el::store_client other("127.0.0.1", srv.port(), token);
  std::thread setter([&] {
    std::this_thread::sleep_for(100ms);
    other.set("absent", "now");
  });
  const auto t0 = std::chrono::steady_clock::now();
  c.wait({"present", "absent"}, ef::deadline::after(5s));
  const double took = ms_since(t0);
  setter.join();
  EXPECT_GE(took, 90.0);
  EXPECT_LT(took, 400.0);
  EXPECT_EQ(c.get("absent", ef::deadline::after(1s)), "now");
}

TEST(Store, WrongOrMissingTokenIsRefused) {
  el::store_server srv(test_options());
  for (const std::string bad : {"wrong-token", ""}) {
    el::store_client c("127.0.0.1", srv.port(), bad);
    std::error_code ec;
    c.set("k", "v", ef::deadline::after(2s), ec);
    EXPECT_EQ(ec, ef::errc::unauthorized) << "token '" << bad << "': " << ec.message();
    EXPECT_NE(c.last_error_detail().find("job token does not match"), std::string::npos);
    EXPECT_THROW(c.ping(ef::deadline::after(2s)), ef::system_error);
  }
  // A worker process with a wrong token fails with a clear message.
  workers w;
  w.spawn(0, srv, {"count", "1", "0"}, "not-the-token");
  auto exits = w.join(ef::deadline::after(10s));
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].code, 1);
  EXPECT_NE(w.out[0].find("unauthorized"), std::string::npos) << w.out[0];
  EXPECT_EQ(srv.stats().unauthorized, 5u);  // 2 clients x 2 attempts + the worker
  el::store_client good("127.0.0.1", srv.port(), token);
  good.set("k", "v");
  EXPECT_EQ(good.num_keys(), 1);  // nothing the refused clients sent was applied
}

TEST(Store, BadInputsGetClearErrorsWhileOthersAreServed) {
  el::store_server srv(test_options());
  struct row {
    const char* name;
    bool authenticate;
    std::string bytes;
    bool shutdown_after;
    ef::errc expect;
    const char* reason;
  };
  auto le32 = [](std::uint32_t v) {
    std::string s(4, '\0');
    for (int i = 0; i < 4; ++i) s[static_cast<std::size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
    return s;
  };
  const std::string half = le32(100) + std::string(10, 'x');
  const std::vector<row> rows = {
      {"truncated header", true, "\x05\x00"s, true, ef::errc::bad_message,
       "truncated frame: connection closed after 2 of 4 header bytes"},
      {"length over the limit", true, le32((1u << 20) + 1) + "\x02", false, ef::errc::bad_message,
       "exceeds the limit of 1048576 bytes"},
      {"zero length", true, le32(0), false, ef::errc::bad_message, "empty frame"},
      {"unknown opcode", true, le32(1) + "\x7f", false, ef::errc::bad_message, "unknown opcode 0x7f"},
      {"garbage bytes (HTTP)", true, "GET / HTTP/1.1\r\nHost: store\r\n\r\n", false, ef::errc::bad_message,
       "exceeds the limit"},
      {"garbage fields", true, le32(9) + "\x02\xff\xff\xff\xff" + "abcd", false, ef::errc::bad_message,
       "set: key length 4294967295 exceeds the 4 bytes left"},
      {"trailing bytes", true, le32(2) + "\x0b" + "!", false, ef::errc::bad_message, "ping: 1 trailing bytes"},
      {"server opcode from a client", true, le32(1) + "\x80", false, ef::errc::bad_message, "unexpected opcode ok"},
      {"half a message then silence", true, half, false, ef::errc::timeout,
       "read deadline: frame incomplete after 300 ms (14 bytes received of 104)"},
      {"garbage before authentication", false, "\x10\x00\x00\x00hello, store?!!!"s, false, ef::errc::bad_message,
       "handshake: unknown opcode 0x68"},
      {"request before authentication", false, le32(11) + "\x02" + le32(1) + "k" + le32(1) + "v", false,
       ef::errc::unauthorized, "expected auth, got set"},
      {"huge frame before authentication", false, le32(5000) + "x", false, ef::errc::bad_message,
       "before authentication"},
  };
  std::vector<std::unique_ptr<ebbflow_test::raw_conn>> conns;
  for (const auto& r : rows) {
    auto c = std::make_unique<ebbflow_test::raw_conn>(srv.port());
    if (r.authenticate) {
      ASSERT_TRUE(c->authenticate(token)) << r.name;
    } else {
      ASSERT_TRUE(c->read_frame(2s).has_value()) << r.name << ": no challenge";
    }
    c->send(r.bytes);
    if (r.shutdown_after) c->shutdown_write();
    conns.push_back(std::move(c));
  }
  // While those are pending (the stalled one for 300 ms), a good client is served promptly.
  el::store_client good("127.0.0.1", srv.port(), token);
  double worst = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; ms_since(t0) < 400; ++i) {
    const auto t1 = std::chrono::steady_clock::now();
    good.set("k" + std::to_string(i % 10), "v");
    worst = std::max(worst, ms_since(t1));
  }
  EXPECT_LT(worst, 100.0) << "a good client waited behind bad ones";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    SCOPED_TRACE(rows[i].name);
    auto f = conns[i]->read_frame(3s);
    ASSERT_TRUE(f.has_value()) << "no error reply";
    auto d = proto::decode(std::as_bytes(std::span(f->data(), f->size())));
    ASSERT_TRUE(d) << d.reason;
    ASSERT_EQ(d.msg.code, proto::op::error);
    EXPECT_EQ(proto::error_from_wire(d.msg.flag), rows[i].expect);
    EXPECT_NE(d.msg.value.find(rows[i].reason), std::string_view::npos) << "reason: " << d.msg.value;
    EXPECT_TRUE(conns[i]->closed_by_peer(2s)) << "connection left open";
  }
  const auto st = srv.stats();
  EXPECT_EQ(st.protocol_errors + st.unauthorized, rows.size());
  good.ping(ef::deadline::after(1s));
}

TEST(Store, SurvivesClientsKilledMidRequest) {
  el::store_server srv(test_options());
  workers w;
  const pid_t half = w.spawn(0, srv, {"half-frame"});
  const pid_t waiting = w.spawn(1, srv, {"wait-forever"});
  ASSERT_TRUE(w.wait_for_line(0, "ready", ef::deadline::after(10s))) << w.out[0];
  ASSERT_TRUE(w.wait_for_line(1, "ready", ef::deadline::after(10s))) << w.out[1];
  std::this_thread::sleep_for(50ms);  // the waiter's request is at the server
  ::kill(half, SIGKILL);
  ::kill(waiting, SIGKILL);
  auto exits = w.join(ef::deadline::after(5s));
  ASSERT_EQ(exits.size(), 2u);
  el::store_client c("127.0.0.1", srv.port(), token);
  c.set("never", "now set");  // wakes nobody: the dead waiter was dropped
  EXPECT_EQ(c.get("never"), "now set");
  // Both dead connections are gone (only ours is open).
  const auto t0 = std::chrono::steady_clock::now();
  while (srv.stats().open != 1 && ms_since(t0) < 2000) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(srv.stats().open, 1u);
}

TEST(Store, ServerGoneIsPeerLost) {
  auto srv = std::make_unique<el::store_server>(test_options());
  const auto port = srv->port();
  el::store_client c("127.0.0.1", port, token);
  c.set("k", "v");
  std::error_code ec;
  std::thread stopper([&] {
    std::this_thread::sleep_for(50ms);
    srv.reset();
  });
  c.wait({"never"}, ef::deadline::after(5s), ec);
  stopper.join();
  EXPECT_EQ(ec, ef::errc::peer_lost) << ec.message();
  c.set("k", "v", ef::deadline::after(100ms), ec);  // nobody listens any more
  EXPECT_TRUE(ec == ef::errc::peer_lost || ec == ef::errc::timeout) << ec.message();
}

TEST(Store, WatchStreamsChangesUnderAPrefix) {
  el::store_server srv(test_options());
  el::store_client c("127.0.0.1", srv.port(), token);
  c.set("members/0", "alive");
  c.set("other", "x");
  auto w = c.watch("members/", true, ef::deadline::after(2s));
  auto e = w.next(ef::deadline::after(2s));
  EXPECT_EQ(e.type, el::store_event::kind::set);
  EXPECT_EQ(e.key, "members/0");
  EXPECT_EQ(e.value, "alive");
  std::error_code ec;
  (void)w.next(ef::deadline::after(20ms), ec);  // nothing yet; the watcher stays usable
  EXPECT_EQ(ec, ef::errc::timeout);
  c.set("other", "y");
  c.add("members/1", 3);
  c.compare_set("members/0", "alive", "leaving");
  c.erase("members/0");
  e = w.next(ef::deadline::after(2s));
  EXPECT_EQ(e.key, "members/1");
  EXPECT_EQ(e.value, "3");
  e = w.next(ef::deadline::after(2s));
  EXPECT_EQ(e.key, "members/0");
  EXPECT_EQ(e.value, "leaving");
  e = w.next(ef::deadline::after(2s));
  EXPECT_EQ(e.type, el::store_event::kind::erase);
  EXPECT_EQ(e.key, "members/0");
}

// A set that completes a waiting request releases the requests its client
// pipelined behind the wait; their events must still follow the set's own.
TEST(Store, WatchEventsFollowTheOrderOfMutationsWhenASetReleasesPipelinedRequests) {
  el::store_server srv(test_options());
  el::store_client c("127.0.0.1", srv.port(), token);
  auto w = c.watch("", false, ef::deadline::after(2s));
  ebbflow_test::raw_conn a(srv.port());
  ASSERT_TRUE(a.authenticate(token));
  // wait{k1}, and pipelined behind it set{k2}: the set is queued until k1 is set.
  std::string frames = el::detail::keys_frame(proto::op::wait, {"k1"}, 5000, true);
  frames += proto::frame_builder(proto::op::set).str("k2").str("v2").finish();
  a.send(frames);
  std::this_thread::sleep_for(200ms);  // both frames are on the server: the set waits behind the wait
  c.set("k1", "v1", ef::deadline::after(2s));
  const auto e1 = w.next(ef::deadline::after(2s));
  const auto e2 = w.next(ef::deadline::after(2s));
  EXPECT_EQ(e1.key, "k1") << "events came as " << e1.key << ", " << e2.key;
  EXPECT_EQ(e2.key, "k2");
}

TEST(Store, TooManyConnectionsAreRefusedNotCrashed) {
  auto o = test_options();
  o.max_connections = 2;
  el::store_server srv(o);
  el::store_client a("127.0.0.1", srv.port(), token), b("127.0.0.1", srv.port(), token),
      c("127.0.0.1", srv.port(), token);
  a.ping(ef::deadline::after(1s));
  b.ping(ef::deadline::after(1s));
  std::error_code ec;
  c.ping(ef::deadline::after(1s), ec);
  EXPECT_EQ(ec, ef::errc::invalid_state);
  EXPECT_NE(c.last_error_detail().find("too many connections"), std::string::npos);
  a.ping(ef::deadline::after(1s));
}

TEST(Store, EmbeddedOnAUserIoContext) {
  boost::asio::io_context ioc;
  el::store_server srv(ioc, test_options());
  std::thread t([&] { ioc.run(); });
  el::store_client c("127.0.0.1", srv.port(), token);
  EXPECT_EQ(c.add("x", 2), 2);
  srv.stop();
  t.join();  // run() returns: stop() left the io_context without work
}
