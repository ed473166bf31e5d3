// SPDX-License-Identifier: Apache-2.0
// Collectives over the in-process loopback transport: every collective x
// dtype x op x size x rank count, both allreduce algorithms, in-place and
// out-of-place, non-blocking overlap, failures and deadlines. The same
// algorithms run over real UCX processes in ucx_collectives_test.
#include <ebbflow/comm/communicator.hpp>
#include <ebbflow/comm/loopback_transport.hpp>

#include "collective_check.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <type_traits>

namespace ef = ebbflow;
namespace et = ebbflow_test;
using namespace std::chrono_literals;
using comm_t = ef::comm::transport_communicator<ef::comm::loopback_transport>;
static_assert(ef::comm::communicator<comm_t>);
// The former name stays for one release.
static_assert(std::is_same_v<ef::comm::basic_communicator<ef::comm::loopback_transport>, comm_t>);

namespace {
std::vector<std::byte> buffer(ef::dtype t, std::size_t count) {
  return std::vector<std::byte>(count * ef::size_of(t) + 1);
}
ef::buffer_view view_of(std::vector<std::byte>& v, ef::dtype t, std::size_t count) { return {v.data(), count, t}; }

struct case_t {
  int n;
  ef::comm::allreduce_algorithm algo;
};
class Allreduce : public ::testing::TestWithParam<case_t> {};

TEST_P(Allreduce, EveryDtypeOpSizeMatchesReference) {
  const auto [n, algo] = GetParam();
  ef::comm::collective_options o;
  o.allreduce = algo;
  o.chunk_bytes = 1000;  // many chunks, odd boundaries
  o.window = 3;
  ef::comm::spawn_loopback(n, [&](ef::comm::loopback_transport& t) {
    comm_t c(t, o);
    int iter = 0;
    for (ef::dtype ty : ef::all_dtypes)
      for (ef::reduce_op op : ef::all_reduce_ops)
        for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{4099}}) {
          const bool in_place = (iter++ % 2) == 0;
          auto in = buffer(ty, count), out = buffer(ty, count);
          et::fill(ty, op, t.rank(), in.data(), count);
          if (in_place) {
            c.allreduce(view_of(in, ty, count), op, ef::deadline::after(10s));
          } else {
            c.allreduce(view_of(in, ty, count), view_of(out, ty, count), op, ef::deadline::after(10s));
          }
          const void* res = in_place ? in.data() : out.data();
          ASSERT_EQ(et::wrong_reduced(ty, op, n, res, count), 0u)
              << "rank " << t.rank() << " " << ef::name(ty) << " " << ef::name(op) << " count " << count;
          if (!in_place) {
            ASSERT_EQ(et::wrong_input(ty, op, t.rank(), in.data(), count), 0u) << "input modified";
          }
        }
  });
}
INSTANTIATE_TEST_SUITE_P(Loopback, Allreduce,
                         ::testing::Values(case_t{1, ef::comm::allreduce_algorithm::automatic},
                                           case_t{2, ef::comm::allreduce_algorithm::ring},
                                           case_t{2, ef::comm::allreduce_algorithm::recursive_doubling},
                                           case_t{3, ef::comm::allreduce_algorithm::ring},
                                           case_t{3, ef::comm::allreduce_algorithm::recursive_doubling},
                                           case_t{4, ef::comm::allreduce_algorithm::automatic},
                                           case_t{5, ef::comm::allreduce_algorithm::ring},
                                           case_t{5, ef::comm::allreduce_algorithm::recursive_doubling},
                                           case_t{6, ef::comm::allreduce_algorithm::recursive_doubling},
                                           case_t{7, ef::comm::allreduce_algorithm::ring}));

class Others : public ::testing::TestWithParam<int> {};

TEST_P(Others, BroadcastAllgatherReduceScatterBarrier) {
  const int n = GetParam();
  ef::comm::collective_options o;
  o.chunk_bytes = 512;
  o.small_bytes = 2048;
  ef::comm::spawn_loopback(n, [&](ef::comm::loopback_transport& t) {
    comm_t c(t, o);
    const int r = t.rank();
    const auto d = [] { return ef::deadline::after(10s); };
    for (ef::dtype ty : ef::all_dtypes)
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{4099}}) {
        for (int root = 0; root < n; root += 2) {  // small (tree) and large (chain) broadcasts
          auto b = buffer(ty, count);
          if (r == root) et::fill(ty, ef::reduce_op::sum, root, b.data(), count);
          c.broadcast(view_of(b, ty, count), root, d());
          ASSERT_EQ(et::wrong_input(ty, ef::reduce_op::sum, root, b.data(), count), 0u) << "broadcast root " << root;
        }
        auto in = buffer(ty, count), out = buffer(ty, count * static_cast<std::size_t>(n));
        et::fill(ty, ef::reduce_op::sum, r, in.data(), count);
        c.allgather(view_of(in, ty, count), view_of(out, ty, count * static_cast<std::size_t>(n)), d());
        for (int q = 0; q < n; ++q)
          ASSERT_EQ(et::wrong_input(ty, ef::reduce_op::sum, q,
                                    out.data() + static_cast<std::size_t>(q) * count * ef::size_of(ty), count),
                    0u)
              << "allgather block " << q;
        // In-place allgather: my block already sits in the output.
        auto ip = buffer(ty, count * static_cast<std::size_t>(n));
        et::fill(ty, ef::reduce_op::sum, r, ip.data() + static_cast<std::size_t>(r) * count * ef::size_of(ty), count);
        c.allgather(ef::buffer_view{ip.data() + static_cast<std::size_t>(r) * count * ef::size_of(ty), count, ty},
                    view_of(ip, ty, count * static_cast<std::size_t>(n)), d());
        ASSERT_EQ(ip, out) << "in-place allgather";
        for (ef::reduce_op op : ef::all_reduce_ops) {
          const std::size_t total = count * static_cast<std::size_t>(n);
          auto rin = buffer(ty, total), rout = buffer(ty, count);
          et::fill(ty, op, r, rin.data(), total);
          c.reduce_scatter(view_of(rin, ty, total), view_of(rout, ty, count), op, d());
          ASSERT_EQ(et::wrong_reduced(ty, op, n, rout.data(), count, static_cast<std::size_t>(r) * count), 0u)
              << "reduce_scatter " << ef::name(ty) << " " << ef::name(op);
        }
      }
    c.barrier(d());
  });
}
INSTANTIATE_TEST_SUITE_P(Loopback, Others, ::testing::Values(1, 2, 3, 4, 5));

// The segments the ring and single-copy allreduce give the ranks tile the
// buffer in rank order, each within one element of count / n.
TEST(Communicator, AllreduceSegmentsTileTheBuffer) {
  for (std::size_t count : {0UL, 1UL, 7UL, 64UL, 1000003UL})
    for (int n : {1, 2, 3, 5, 8, 16}) {
      std::size_t next = 0;
      for (int r = 0; r < n; ++r) {
        const auto [b, e] = ef::comm::allreduce_segment(count, n, r);
        EXPECT_EQ(b, next) << "count " << count << ", n " << n << ", rank " << r;
        EXPECT_LE(e - b, count / static_cast<std::size_t>(n) + 1);
        EXPECT_GE(e - b, count / static_cast<std::size_t>(n));
        next = e;
      }
      EXPECT_EQ(next, count) << "count " << count << ", n " << n;
    }
}

TEST(Communicator, RandomFloatsWithinTolerance) {
  // Non-integer data: summation order differs from the reference, so compare
  // with |err| <= n * eps * sum|x| (eps of the element type; f32 here).
  constexpr int n = 4;
  constexpr std::size_t count = 10007;
  std::vector<std::vector<float>> data(n, std::vector<float>(count));
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& v : data)
    for (auto& x : v) x = u(gen);
  ef::comm::spawn_loopback(n, [&](ef::comm::loopback_transport& t) {
    ef::comm::collective_options o;
    o.chunk_bytes = 4096;
    comm_t c(t, o);
    std::vector<float> v = data[static_cast<std::size_t>(t.rank())];
    c.allreduce(ef::view(std::span(v)), ef::reduce_op::sum, ef::deadline::after(10s));
    for (std::size_t i = 0; i < count; ++i) {
      double ref = 0, mag = 0;
      for (int r = 0; r < n; ++r)
        ref += data[static_cast<std::size_t>(r)][i], mag += std::fabs(data[static_cast<std::size_t>(r)][i]);
      ASSERT_LE(std::fabs(v[i] - ref), n * 1.2e-7 * mag) << i;
    }
  });
}

TEST(Communicator, RanksWaitForTheirRequestsInDifferentOrders) {
  // Even ranks wait for the first collective first, odd ranks for the second:
  // every wait must move all collectives in flight, or this deadlocks.
  ef::comm::spawn_loopback(4, [&](ef::comm::loopback_transport& t) {
    ef::comm::collective_options o;
    o.allreduce = ef::comm::allreduce_algorithm::ring;
    o.chunk_bytes = 256;
    comm_t c(t, o);
    std::vector<std::int32_t> a(20000, 1), b(30000, 2);
    auto ra = c.iallreduce(ef::view(std::span(a)), ef::view(std::span(a)), ef::reduce_op::sum);
    auto rb = c.iallreduce(ef::view(std::span(b)), ef::view(std::span(b)), ef::reduce_op::sum);
    if (t.rank() % 2) {
      rb.wait(ef::deadline::after(10s));
      ra.wait(ef::deadline::after(10s));
    } else {
      ra.wait(ef::deadline::after(10s));
      rb.wait(ef::deadline::after(10s));
    }
    EXPECT_EQ(a[19999], 4);
    EXPECT_EQ(b[29999], 8);
  });
}

TEST(Communicator, NonBlockingRequestsOverlapAndCompleteInAnyOrder) {
  ef::comm::spawn_loopback(3, [&](ef::comm::loopback_transport& t) {
    comm_t c(t);
    std::vector<std::int32_t> a(5000, t.rank() + 1), b(3, t.rank());
    auto ra = c.iallreduce(ef::view(std::span(a)), ef::view(std::span(a)), ef::reduce_op::sum);
    auto rb = c.iallreduce(ef::view(std::span(b)), ef::view(std::span(b)), ef::reduce_op::max);
    std::error_code ec;
    int polls = 0;
    while (!rb.test(ec)) ++polls;  // "compute" while the collectives progress
    ASSERT_FALSE(ec);
    ra.wait(ef::deadline::after(10s));
    EXPECT_EQ(a[0], 6);
    EXPECT_EQ(a[4999], 6);
    EXPECT_EQ(b[2], 2);
  });
}

TEST(Communicator, PointToPoint) {
  ef::comm::spawn_loopback(2, [&](ef::comm::loopback_transport& t) {
    comm_t c(t);
    std::vector<double> v(33, t.rank() == 0 ? 2.5 : 0.0);
    if (t.rank() == 0) {
      c.send(ef::view(std::span(v)), 1, 42, ef::deadline::after(10s));
    } else {
      c.recv(ef::view(std::span(v)), 0, 42, ef::deadline::after(10s));
    }
    EXPECT_EQ(v[32], 2.5);
  });
}

TEST(Communicator, PointToPointSizeMismatchNamesBothSizes) {
  std::string what;
  ef::comm::spawn_loopback(2, [&](ef::comm::loopback_transport& t) {
    comm_t c(t);
    std::vector<float> v(t.rank() == 0 ? 3 : 5, 1.0f);  // 12 bytes sent, 20 expected
    if (t.rank() == 0) {
      c.send(ef::view(std::span(v)), 1, 7, ef::deadline::after(10s));
      return;
    }
    try {
      c.recv(ef::view(std::span(v)), 0, 7, ef::deadline::after(10s));
      ADD_FAILURE() << "a 12-byte message filled a 20-byte receive";
    } catch (const ef::system_error& e) {
      EXPECT_EQ(e.code(), ef::errc::bad_message) << e.what();
      what = e.what();
    }
  });
  EXPECT_NE(what.find("message of 12 bytes"), std::string::npos) << what;
  EXPECT_NE(what.find("20-byte receive buffer"), std::string::npos) << what;
}

// Sizes on both sides of small_bytes make the ranks pick different
// algorithms (recursive doubling vs ring) whose messages never match: no
// rank sees a message of the wrong size, so no bad_message is possible
// without sending the size. Each rank times out, naming its own byte count
// and the likely cause.
TEST(Communicator, SizesOnBothSidesOfSmallBytesTimeOutWithAHint) {
  std::array<std::string, 2> what;
  std::array<std::error_code, 2> code;
  ef::comm::spawn_loopback(2, [&](ef::comm::loopback_transport& t) {
    comm_t c(t);
    std::vector<float> v(t.rank() == 0 ? 4 : 8192, 1.0f);  // 16 B vs 32 KiB (small_bytes: 16 KiB)
    try {
      c.allreduce(ef::view(std::span(v)), ef::reduce_op::sum, ef::deadline::after(200ms));
      ADD_FAILURE() << "rank " << t.rank() << ": mismatched sizes accepted";
    } catch (const ef::system_error& e) {
      what[static_cast<std::size_t>(t.rank())] = e.what();
      code[static_cast<std::size_t>(t.rank())] = e.code();
    }
  });
  for (std::size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(code[r], ef::errc::timeout) << what[r];
    EXPECT_NE(what[r].find(r == 0 ? "16 bytes" : "32768 bytes"), std::string::npos) << what[r];
    EXPECT_NE(what[r].find("the ranks disagree on the size"), std::string::npos) << what[r];
  }
}

TEST(Communicator, DeadPeerYieldsPeerLostNamingPeer) {
  auto hub = std::make_shared<ef::comm::loopback_hub>(3);
  std::vector<std::jthread> th;
  std::array<std::string, 3> what;
  std::array<int, 3> peer{-2, -2, -2};
  for (int r = 0; r < 2; ++r)
    th.emplace_back([&, r] {
      ef::comm::loopback_transport t(hub, r);
      comm_t c(t);
      std::vector<float> v(100000, 1.f);
      try {
        c.allreduce(ef::view(std::span(v)), ef::reduce_op::sum, ef::deadline::after(1s));
      } catch (const ef::system_error& e) {
        // Rank 0 receives from the dead rank 2; rank 1 waits on rank 0, which
        // gave up: loopback propagates nothing, so rank 1 sees its deadline.
        if (r == 0)
          EXPECT_EQ(e.code(), ef::errc::peer_lost) << e.what();
        else
          EXPECT_EQ(e.code(), ef::errc::timeout) << e.what();
        what[static_cast<std::size_t>(r)] = e.what();
        peer[static_cast<std::size_t>(r)] = e.peer();
      }
    });
  std::this_thread::sleep_for(50ms);
  hub->kill(2);
  th.clear();
  EXPECT_NE(what[0].find("allreduce"), std::string::npos) << what[0];
  EXPECT_NE(what[0].find("rank 0"), std::string::npos) << what[0];
  EXPECT_EQ(peer[0], 2) << what[0];
  EXPECT_EQ(peer[1], 0) << what[1];
}

TEST(Communicator, DeadlineGivesTimeoutAndRequestStaysPending) {
  auto hub = std::make_shared<ef::comm::loopback_hub>(2);
  ef::comm::loopback_transport t0(hub, 0), t1(hub, 1);
  comm_t c0(t0), c1(t1);
  std::vector<float> a(10, 1.f), b(10, 2.f);
  auto r0 = c0.iallreduce(ef::view(std::span(a)), ef::view(std::span(a)), ef::reduce_op::sum);
  std::error_code ec;
  const auto t_start = ef::steady_clock::now();
  r0.wait(ef::deadline::after(30ms), ec);
  EXPECT_EQ(ec, ef::errc::timeout);
  EXPECT_GE(ef::steady_clock::now() - t_start, 30ms);
  EXPECT_EQ(r0.context().peer, 1);
  EXPECT_FALSE(r0.done());
  auto r1 = c1.iallreduce(ef::view(std::span(b)), ef::view(std::span(b)), ef::reduce_op::sum);
  // Single thread drives both ranks alternately.
  while (!(r0.done() && r1.done())) {
    r0.test(ec);
    ASSERT_FALSE(ec);
    r1.test(ec);
    ASSERT_FALSE(ec);
  }
  EXPECT_EQ(a[9], 3.f);
  EXPECT_EQ(b[0], 3.f);
  try {
    std::vector<float> z(4);
    c0.allreduce(ef::view(std::span(z)), ef::reduce_op::sum, ef::deadline::after(10ms));
    ADD_FAILURE() << "no timeout";
  } catch (const ef::system_error& e) {
    EXPECT_EQ(e.code(), ef::errc::timeout);
    EXPECT_EQ(e.peer(), 1);
    EXPECT_NE(std::string(e.what()).find("seq 1"), std::string::npos) << e.what();
  }
}

// Each blocking collective has a noexcept twin that reports in an
// std::error_code what the throwing form throws: a run-time failure with its
// condition, a refused argument as std::errc::invalid_argument.
TEST(Communicator, ErrorCodeTwinsReportWhatTheThrowingFormsThrow) {
  static_assert(noexcept(std::declval<comm_t&>().allreduce(ef::buffer_view{}, ef::buffer_view{}, ef::reduce_op::sum,
                                                           ef::deadline::never(), std::declval<std::error_code&>())));
  // Success: every collective and point-to-point through its twin, ec cleared.
  ef::comm::spawn_loopback(3, [&](ef::comm::loopback_transport& t) {
    comm_t c(t);
    const auto d = [] { return ef::deadline::after(10s); };
    const int r = t.rank();
    std::error_code ec = make_error_code(ef::error::invalid_state);  // cleared by every successful call
    std::vector<float> v(100, static_cast<float>(r + 1)), w(300), s(100);
    c.allreduce(ef::view(std::span(v)), ef::reduce_op::sum, d(), ec);
    ASSERT_FALSE(ec) << ec.message();
    EXPECT_EQ(v[99], 6.0f);
    c.broadcast(ef::view(std::span(v).first(10)), 2, d(), ec);
    ASSERT_FALSE(ec) << ec.message();
    c.allgather(ef::view(std::span(v)), ef::view(std::span(w)), d(), ec);
    ASSERT_FALSE(ec) << ec.message();
    EXPECT_EQ(w[299], 6.0f);
    c.reduce_scatter(ef::view(std::span(w)), ef::view(std::span(s)), ef::reduce_op::sum, d(), ec);
    ASSERT_FALSE(ec) << ec.message();
    EXPECT_EQ(s[0], 18.0f);
    if (r == 0) c.send(ef::view(std::span(s)), 1, 5, d(), ec);
    if (r == 1) c.recv(ef::view(std::span(v)), 0, 5, d(), ec);
    ASSERT_FALSE(ec) << ec.message();
    c.barrier(d(), ec);
    ASSERT_FALSE(ec) << ec.message();
  });
  // Failures: a refused argument and a deadline, nothing thrown.
  auto hub = std::make_shared<ef::comm::loopback_hub>(2);
  ef::comm::loopback_transport t(hub, 0);
  comm_t c(t);
  std::vector<float> a(4), b(5);
  std::error_code ec;
  c.allreduce(ef::view(std::span(a)), ef::view(std::span(b)), ef::reduce_op::sum, ef::deadline::after(1s), ec);
  EXPECT_EQ(ec, std::errc::invalid_argument);
  c.broadcast(ef::view(std::span(a)), 2, ef::deadline::after(1s), ec);
  EXPECT_EQ(ec, std::errc::invalid_argument);
  c.send(ef::view(std::span(a)), 0, 1, ef::deadline::after(1s), ec);  // to itself
  EXPECT_EQ(ec, std::errc::invalid_argument);
  c.allreduce(ef::view(std::span(a)), ef::reduce_op::sum, ef::deadline::after(20ms), ec);
  EXPECT_EQ(ec, ef::errc::timeout);
  c.barrier(ef::deadline::after(20ms), ec);
  EXPECT_EQ(ec, ef::errc::timeout);
  hub->kill(1);
  c.recv(ef::view(std::span(a)), 1, 3, ef::deadline::after(1s), ec);
  EXPECT_EQ(ec, ef::errc::peer_lost);
}

// A device view given to the host communicator is refused, naming the space
// (nccl_communicator_test checks the converse).
TEST(Communicator, RefusesDeviceMemoryNamingTheSpace) {
  auto hub = std::make_shared<ef::comm::loopback_hub>(2);
  ef::comm::loopback_transport t(hub, 0);
  comm_t c(t);
  float x[4] = {};
  const ef::buffer_view dev{x, 4, ef::dtype::f32, ef::memory_space::device};
  try {
    c.allreduce(dev, ef::reduce_op::sum, ef::deadline::after(1s));
    ADD_FAILURE() << "a device buffer was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("must be host memory, got device"), std::string::npos) << e.what();
  }
  EXPECT_THROW(c.broadcast(dev, 0, ef::deadline::after(1s)), std::invalid_argument);
  EXPECT_THROW(c.barrier(ef::deadline::after(1ms)), ef::system_error);  // the refusals sent nothing
}

// A transport that counts the bytes it is given to send.
template <class T>
struct counting_transport {
  using request = typename T::request;
  T* inner;
  std::size_t sent = 0;
  [[nodiscard]] int rank() const { return inner->rank(); }
  [[nodiscard]] int size() const { return inner->size(); }
  [[nodiscard]] std::int64_t generation() const { return inner->generation(); }
  request isend(int peer, ef::comm::tag_t tag, std::span<const std::byte> b) {
    sent += b.size();
    return inner->isend(peer, tag, b);
  }
  request irecv(int peer, ef::comm::tag_t tag, std::span<std::byte> b) { return inner->irecv(peer, tag, b); }
  bool test(request& r, std::error_code& ec) { return inner->test(r, ec); }
  void wait(request& r, ef::deadline d, std::error_code& ec) { inner->wait(r, d, ec); }
};

// The algorithm the communicator picks is the one it reports: latency-optimal
// recursive doubling up to small_bytes (or below one element per rank), the
// ring above (the loopback transport has no single-copy path), or what the
// options force; and the bytes it reports sending are the ones it sends.
TEST(Communicator, ReportsTheAllreduceAlgorithmAndTheBytesItSends) {
  using algo = ef::comm::allreduce_algorithm;
  for (int n : {1, 2, 3, 4, 5, 8}) {
    std::vector<std::size_t> rd_sent(static_cast<std::size_t>(n));
    ef::comm::spawn_loopback(n, [&](ef::comm::loopback_transport& lt) {
      counting_transport<ef::comm::loopback_transport> t{&lt};
      ef::comm::transport_communicator c(t);
      EXPECT_EQ(c.allreduce_algorithm_for(1024, ef::dtype::f32), algo::recursive_doubling);  // 4 KiB
      EXPECT_EQ(c.allreduce_algorithm_for(2048, ef::dtype::f16), algo::recursive_doubling);
      EXPECT_EQ(c.allreduce_algorithm_for(4096, ef::dtype::f32), algo::recursive_doubling);  // 16 KiB: still small
      EXPECT_EQ(c.allreduce_algorithm_for(4097, ef::dtype::f32), algo::ring);
      ef::comm::collective_options o;
      o.small_bytes = 0;
      EXPECT_EQ(ef::comm::transport_communicator(t, o).allreduce_algorithm_for(static_cast<std::size_t>(n) - 1,
                                                                               ef::dtype::f32),
                algo::recursive_doubling);
      o.allreduce = algo::ring;
      EXPECT_EQ(ef::comm::transport_communicator(t, o).allreduce_algorithm_for(1, ef::dtype::f32), algo::ring);
      o.allreduce = algo::single_copy;
      if (n > 1) {
        EXPECT_THROW((void)ef::comm::transport_communicator(t, o).allreduce_algorithm_for(1, ef::dtype::f32),
                     std::invalid_argument);
      }
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{10007}})
        for (ef::dtype ty : {ef::dtype::f32, ef::dtype::f16}) {
          std::vector<std::byte> v(count * ef::size_of(ty));
          const std::size_t before = t.sent;
          c.allreduce({v.data(), count, ty}, ef::reduce_op::max, ef::deadline::after(10s));
          EXPECT_EQ(t.sent - before, c.allreduce_bytes_sent(count, ty))
              << "rank " << t.rank() << " of " << n << ", " << count << " " << ef::name(ty);
          if (c.allreduce_algorithm_for(count, ty) == algo::recursive_doubling)
            rd_sent[static_cast<std::size_t>(t.rank())] += t.sent - before;
        }
    });
    // Recursive doubling on p = 2^k <= n ranks moves k full buffers per rank,
    // plus one to and one from each of the n - p folded ranks.
    int p = 1, k = 0;
    for (; p * 2 <= n; p *= 2) ++k;
    std::size_t all = 0;
    for (auto b : rd_sent) all += b;
    EXPECT_EQ(all, (static_cast<std::size_t>(p * k) + 2 * static_cast<std::size_t>(n - p)) * (1 + 1000) * 6)
        << n << " ranks";
  }
}

TEST(Communicator, RejectsMismatchedBuffers) {
  auto hub = std::make_shared<ef::comm::loopback_hub>(2);
  ef::comm::loopback_transport t(hub, 0);
  comm_t c(t);
  std::vector<float> a(4), b(5);
  EXPECT_THROW(c.allreduce(ef::view(std::span(a)), ef::view(std::span(b)), ef::reduce_op::sum), std::invalid_argument);
  EXPECT_THROW(c.allgather(ef::view(std::span(a)), ef::view(std::span(b))), std::invalid_argument);
  EXPECT_THROW(c.broadcast(ef::view(std::span(a)), 2), std::invalid_argument);
}
}  // namespace

namespace {
// Bits of x as dtype t (f32, f64, f16, bf16).
std::vector<std::byte> as_dtype(ef::dtype t, const std::vector<double>& x) {
  std::vector<std::byte> out(x.size() * ef::size_of(t));
  for (std::size_t i = 0; i < x.size(); ++i) {
    auto* p = out.data() + i * ef::size_of(t);
    const auto f = static_cast<float>(x[i]);
    if (t == ef::dtype::f32) std::memcpy(p, &f, 4);
    if (t == ef::dtype::f64) std::memcpy(p, &x[i], 8);
    if (t == ef::dtype::f16) {
      const std::uint16_t h = ef::half::from_float(f);
      std::memcpy(p, &h, 2);
    }
    if (t == ef::dtype::bf16) {
      const std::uint16_t h = ef::bfloat16::from_float(f);
      std::memcpy(p, &h, 2);
    }
  }
  return out;
}
}  // namespace

// Every rank combines its own value first, so min and max must give the
// same bits whatever the order of their operands: NaNs of any payload and
// sign, +0 against -0, infinities, in the vector blocks and the tail.
TEST(Reduce, MinAndMaxDoNotDependOnTheOrderOfTheOperands) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  const std::vector<double> specials{nan, -nan, 0.0, -0.0, inf, -inf, 1.0, -1.0, 3.5e-5};
  std::vector<double> a, b;
  for (double x : specials)
    for (double y : specials) a.push_back(x), b.push_back(y);
  for (ef::dtype t : {ef::dtype::f32, ef::dtype::f64, ef::dtype::f16, ef::dtype::bf16})
    for (ef::reduce_op op : {ef::reduce_op::min, ef::reduce_op::max}) {
      const auto ba = as_dtype(t, a), bb = as_dtype(t, b);
      std::vector<std::byte> ab(ba.size()), ba_(ba.size());
      ef::comm::reduce(t, op, ab.data(), ba.data(), bb.data(), a.size());
      ef::comm::reduce(t, op, ba_.data(), bb.data(), ba.data(), a.size());
      ASSERT_EQ(ab, ba_) << ef::name(t) << " " << ef::name(op);
      for (std::size_t i = 0; i < a.size(); ++i) {
        double r = 0;
        if (t == ef::dtype::f64) std::memcpy(&r, ab.data() + 8 * i, 8);
        if (t == ef::dtype::f32) {
          float f;
          std::memcpy(&f, ab.data() + 4 * i, 4);
          r = f;
        }
        if (t != ef::dtype::f32 && t != ef::dtype::f64) continue;
        if (std::isnan(a[i]) || std::isnan(b[i])) {
          EXPECT_TRUE(std::isnan(r)) << ef::name(t) << " " << a[i] << ", " << b[i];
        } else if (a[i] == 0 && b[i] == 0 && std::signbit(a[i]) != std::signbit(b[i])) {
          EXPECT_EQ(std::signbit(r), op == ef::reduce_op::min) << ef::name(t) << " +0 vs -0";
        }
      }
    }
}

// Integer sums and products past the type's range wrap (two's complement)
// instead of being undefined, in the vector blocks and in the tail.
TEST(Reduce, IntegerSumAndProductWrap) {
  for (std::size_t n : {1u, 33u}) {
    std::vector<std::int32_t> a(n, std::numeric_limits<std::int32_t>::max()), b(n, 1), r(n);
    ef::comm::reduce(ef::dtype::i32, ef::reduce_op::sum, r.data(), a.data(), b.data(), n);
    EXPECT_EQ(r, std::vector<std::int32_t>(n, std::numeric_limits<std::int32_t>::min()));
    std::vector<std::int64_t> c(n, std::numeric_limits<std::int64_t>::max()), d(n, 2), s(n);
    ef::comm::reduce(ef::dtype::i64, ef::reduce_op::prod, s.data(), c.data(), d.data(), n);
    EXPECT_EQ(s, std::vector<std::int64_t>(n, -2));
  }
}

// A NaN on one rank: every rank ends with the same bits, whichever
// algorithm combines it.
TEST(Communicator, MinWithANaNOnOneRankGivesEveryRankTheSameBits) {
  for (auto algo : {ef::comm::allreduce_algorithm::recursive_doubling, ef::comm::allreduce_algorithm::ring}) {
    ef::comm::collective_options o;
    o.allreduce = algo;
    std::vector<std::uint32_t> bits(3);
    ef::comm::spawn_loopback(3, [&](ef::comm::loopback_transport& t) {
      comm_t c(t, o);
      std::vector<float> v(6, t.rank() == 1 ? std::numeric_limits<float>::quiet_NaN() : 1.0f);
      c.allreduce(ef::view(std::span(v)), ef::reduce_op::min, ef::deadline::after(10s));
      std::memcpy(&bits[static_cast<std::size_t>(t.rank())], v.data(), 4);
    });
    EXPECT_EQ(bits[0], bits[1]);
    EXPECT_EQ(bits[1], bits[2]);
    float r;
    std::memcpy(&r, bits.data(), 4);
    EXPECT_TRUE(std::isnan(r));
  }
}

// Input and output that overlap other than in place are refused before
// anything is sent (they were read after being overwritten).
TEST(Communicator, RejectsPartlyOverlappingInputAndOutput) {
  auto hub = std::make_shared<ef::comm::loopback_hub>(2);
  ef::comm::loopback_transport t(hub, 0);
  comm_t c(t);
  std::vector<float> buf(20);
  const auto sub = [&](std::size_t at, std::size_t n) { return ef::view(std::span(buf).subspan(at, n)); };
  EXPECT_THROW(c.allreduce(sub(0, 8), sub(1, 8), ef::reduce_op::sum), std::invalid_argument);
  EXPECT_THROW(c.allgather(sub(0, 4), sub(1, 8)), std::invalid_argument);
  EXPECT_THROW(c.reduce_scatter(sub(0, 8), sub(2, 4), ef::reduce_op::sum), std::invalid_argument);
}

// Collectives number their steps in 16 bits of the tag: a ring allreduce's
// 2 (n − 1) steps, and the steps reserved for wire-up and point-to-point,
// stay apart only up to max_collective_ranks. Beyond it the steps used to
// wrap onto each other (32,768 ranks and more) with nothing said; now a
// communicator over more ranks is refused, naming the count.
TEST(Communicator, MoreRanksThanTheCollectivesNumberAreRefused) {
  constexpr int most = ef::comm::max_collective_ranks;
  auto fits = std::make_shared<ef::comm::loopback_hub>(most);
  ef::comm::loopback_transport t_fits(fits, most - 1);
  EXPECT_NO_THROW((void)comm_t(t_fits, {}));
  auto over = std::make_shared<ef::comm::loopback_hub>(most + 1);
  ef::comm::loopback_transport t_over(over, 0);
  try {
    comm_t c(t_over, {});
    ADD_FAILURE() << "a communicator over " << most + 1 << " ranks was made";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(most + 1) + " ranks"), std::string::npos) << e.what();
  }
}
