// SPDX-License-Identifier: Apache-2.0
// Collectives over real UCX between real processes. The test binary is its
// own launcher (ucx_processes.hpp): each TEST runs N copies of itself in
// worker mode (`--worker SCENARIO`).
//
// Sizes are element counts. The full matrix (every collective x dtype x op)
// runs at {0, 1, 7, 4099} and 1 MiB + 3 elements for 2, 3, 4 and 5 ranks, and
// with 64 MiB buffers (64 MiB / element size elements) for 2 ranks (UcxLargeAll)
// and, labelled slow, 3, 4 and 5 ranks (UcxLargeAllSlow); UcxLarge repeats 16 Mi
// f32 allreduce sum/avg and broadcast. Automatic selection picks single_copy for allreduces
// above 16 KiB on one host, so ring and recursive doubling are also forced
// for f32 sum/avg at {1, 7, 4099, 1 MiB + 3 (ring) / 256 Ki + 3 (rd)}.
#include <ebbflow/comm/communicator.hpp>
#include <ebbflow/comm/shared_memory.hpp>
#include <ebbflow/comm/ucx/address_exchange.hpp>
#include <ebbflow/comm/ucx/transport.hpp>
#include <ebbflow/compress.hpp>
#include <ebbflow/core/env.hpp>

#include "collective_check.hpp"
#include "ucx_processes.hpp"
#include "../thread_cpu.hpp"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace ef = ebbflow;
namespace et = ebbflow_test;
namespace ucx = ebbflow::comm::ucx;
using namespace std::chrono_literals;
using comm_t = et::ucx_communicator;

namespace {

// ------------------------------------------------------------------ workers
using et::exited_ok;
using et::fail;
using et::launch;
using et::worker_env;

std::vector<std::byte> buf(ef::dtype t, std::size_t count) { return std::vector<std::byte>(count * ef::size_of(t)); }

// `sizes` are element counts, or with `in_bytes` byte sizes (each dtype gets
// size / size_of(dtype) elements, so every buffer is that many bytes).
int run_matrix(const std::vector<std::size_t>& sizes, bool all_ops,
               ef::comm::allreduce_algorithm algo = ef::comm::allreduce_algorithm::automatic, bool in_bytes = false) {
  worker_env w;
  auto t = w.connect();
  ef::comm::collective_options o;
  o.allreduce = algo;
  o.chunk_bytes = 100000;  // odd chunk boundaries
  comm_t c(t, o);
  const int n = t.size(), r = t.rank();
  const auto d = [] { return ef::deadline::after(60s); };
  int bad = 0;
  for (std::size_t size : sizes)
    for (ef::dtype ty : ef::all_dtypes) {
      if (!all_ops && ty != ef::dtype::f32) continue;
      const std::size_t count = in_bytes ? size / ef::size_of(ty) : size;
      for (ef::reduce_op op : ef::all_reduce_ops) {
        if (!all_ops && op != ef::reduce_op::sum && op != ef::reduce_op::avg) continue;
        const bool in_place = (count + static_cast<std::size_t>(op)) % 2 == 0;
        auto in = buf(ty, count), out = buf(ty, count);
        et::fill(ty, op, r, in.data(), count);
        if (in_place) {
          c.allreduce({in.data(), count, ty}, op, d());
          out = in;
        } else {
          c.allreduce({in.data(), count, ty}, {out.data(), count, ty}, op, d());
        }
        if (auto k = et::wrong_reduced(ty, op, n, out.data(), count))
          bad += fail("allreduce " + std::string(ef::name(ty)) + " " + std::string(ef::name(op)) + " count " +
                      std::to_string(count) + ": " + std::to_string(k) + " wrong");
        if (!all_ops) continue;
        const std::size_t m = count / static_cast<std::size_t>(n), total = m * static_cast<std::size_t>(n);
        auto rin = buf(ty, total), rout = buf(ty, m);
        et::fill(ty, op, r, rin.data(), total);
        c.reduce_scatter({rin.data(), total, ty}, {rout.data(), m, ty}, op, d());
        if (auto k = et::wrong_reduced(ty, op, n, rout.data(), m, static_cast<std::size_t>(r) * m))
          bad += fail("reduce_scatter " + std::string(ef::name(ty)) + " " + std::string(ef::name(op)) + " count " +
                      std::to_string(total) + ": " + std::to_string(k) + " wrong");
      }
      // broadcast from the last rank, allgather of count/n elements per rank
      const int root = n - 1;
      auto b = buf(ty, count);
      if (r == root) et::fill(ty, ef::reduce_op::sum, root, b.data(), count);
      c.broadcast({b.data(), count, ty}, root, d());
      if (auto k = et::wrong_input(ty, ef::reduce_op::sum, root, b.data(), count))
        bad += fail("broadcast " + std::string(ef::name(ty)) + " count " + std::to_string(count) + ": " +
                    std::to_string(k));
      if (!all_ops) continue;
      const std::size_t m = count / static_cast<std::size_t>(n);
      auto gin = buf(ty, m), gout = buf(ty, m * static_cast<std::size_t>(n));
      et::fill(ty, ef::reduce_op::sum, r, gin.data(), m);
      c.allgather({gin.data(), m, ty}, {gout.data(), m * static_cast<std::size_t>(n), ty}, d());
      for (int q = 0; q < n; ++q)
        if (auto k = et::wrong_input(ty, ef::reduce_op::sum, q,
                                     gout.data() + static_cast<std::size_t>(q) * m * ef::size_of(ty), m))
          bad += fail("allgather block " + std::to_string(q) + ": " + std::to_string(k));
    }
  // point-to-point ring and a barrier to finish together
  std::vector<std::int64_t> p2p(5, r);
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  std::vector<std::int64_t> got(5, -1);
  auto s = c.isend(ef::view(std::span(p2p)), right, 77);
  c.recv(ef::view(std::span(got)), left, 77, d());
  s.wait(d());
  if (got[4] != left) bad += fail("p2p");
  c.barrier(d());
  return bad ? 1 : 0;
}

int run_kill(std::chrono::milliseconds timeout) {
  worker_env w;
  auto t = w.connect();
  ef::comm::collective_options o;
  o.timeout = timeout;
  comm_t c(t, o);
  const int n = t.size(), r = t.rank(), victim = n - 1;
  std::vector<float> v(std::size_t{8} << 20, 1.0f);         // 32 MiB
  c.allreduce(ef::view(std::span(v)), ef::reduce_op::sum);  // everyone is up and connected
  if (r == victim) {
    auto req = c.iallreduce(ef::view(std::span(v)), ef::view(std::span(v)), ef::reduce_op::sum);
    std::error_code ec;
    for (int i = 0; i < 50; ++i) req.test(ec);
    ::raise(SIGKILL);  // mid-allreduce: transfers posted, nothing finished
  }
  const auto start = ef::steady_clock::now();
  try {
    for (int i = 0; i < 1000; ++i) c.allreduce(ef::view(std::span(v)), ef::reduce_op::sum);
    return fail("no error after the victim died");
  } catch (const ef::system_error& e) {
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(ef::steady_clock::now() - start);
    std::cerr << "[worker " << r << "] got after " << took.count() << " ms: " << e.what() << std::endl;
    if (e.code() != ef::errc::peer_lost && e.code() != ef::errc::timeout) return fail("wrong condition");
    if (took > timeout + 1s) return fail("too late");
    if (e.code() == ef::errc::peer_lost && e.peer() != victim) return fail("error does not name the victim");
    if (std::string(e.what()).find("rank " + std::to_string(r)) == std::string::npos) return fail("no rank in message");
  }
  // The victim's process is gone and the others' are there, wherever this
  // host lets ranks read each other's memory (as single-copy reads need).
  for (int q = 0; q < n; ++q)
    if (q != r && t.local_peer(q) != 0 && t.peer_gone(q) != (q == victim))
      return fail(q == victim ? "the victim's process is not seen gone" : "a live peer's process is seen gone");
  // Survivors stay up (as they would to form the next generation), so the
  // victim is the only peer that dies while the others detect it.
  std::this_thread::sleep_for(1500ms);
  return 0;
}

int run_generation() {
  worker_env w;
  auto t = w.connect();
  const int r = t.rank();
  const ef::comm::tag_t tag = ef::comm::make_tag(5, 1);
  auto d = [] { return ef::deadline::after(10s); };
  std::int32_t v = 0;
  auto bytes = std::as_writable_bytes(std::span(&v, 1));
  if (r == 0) {
    // Two rounds: the late generation-g message reaches rank 1 after it moved
    // to g+1 (round 1: before its receive is posted; round 2: after).
    for (int g = 0; g < 4; g += 2) {
      t.set_generation(g);
      v = 1000 + g;  // stale
      ef::comm::send(t, 1, tag, bytes, d());
      std::this_thread::sleep_for(150ms);
      t.set_generation(g + 1);
      v = 2000 + g;  // current
      ef::comm::send(t, 1, tag, bytes, d());
      // wait for rank 1's acknowledgement in generation g+1
      ef::comm::recv(t, 1, tag + 1, bytes, d());
    }
    return 0;
  }
  for (int g = 0; g < 4; g += 2) {
    t.set_generation(g + 1);
    if (g == 0) std::this_thread::sleep_for(100ms);  // stale message arrives first (unexpected queue)
    v = -1;
    auto q = t.irecv(0, tag, bytes);
    std::error_code ec;
    t.wait(q, d(), ec);
    if (ec) return fail("recv: " + ec.message());
    if (v != 2000 + g) return fail("generation " + std::to_string(g + 1) + " consumed " + std::to_string(v));
    ef::comm::send(t, 0, tag + 1, bytes, d());
  }
  return 0;
}

// The wire tag keeps 8 bits of the generation, so generation g+256 uses the
// tag bits of g. A message of generation g that nobody received (a failed
// step's) must not be consumed there: the worker discards it when it moves
// to generation g+128. And no unmatched message is left for UCX to complain
// about when the worker is destroyed (the test checks rank 1's stderr).
int run_wrap() {
  worker_env w;
  auto t = w.connect();
  const int r = t.rank();
  const ef::comm::tag_t tag = ef::comm::make_tag(9, 3), ack = ef::comm::make_tag(9, 4);
  auto d = [] { return ef::deadline::after(10s); };
  std::int32_t v = 0;
  auto bytes = std::as_writable_bytes(std::span(&v, 1));
  std::vector<std::byte> big(std::size_t{1} << 20);  // rendezvous-sized, also never received
  if (r == 0) {
    v = 1000;  // stale: generation 0, never received
    ef::comm::send(t, 1, tag, bytes, d());
    auto rq = t.isend(1, ef::comm::make_tag(9, 5), big);
    ef::comm::send(t, 1, ack, bytes, d());  // after the stale ones on the same endpoint
    ef::comm::recv(t, 1, ack, bytes, d());  // rank 1 reached generation 256
    t.set_generation(256);
    v = 2000;  // current
    ef::comm::send(t, 1, tag, bytes, d());
    ef::comm::recv(t, 1, ack, bytes, d());
    return 0;  // `rq` is released (abandoned if rank 1 never took it)
  }
  ef::comm::recv(t, 0, ack, bytes, d());  // the stale messages are queued now
  for (std::int64_t g = 1; g <= 256; ++g) t.set_generation(g);
  ef::comm::send(t, 0, ack, bytes, d());
  v = -1;
  ef::comm::recv(t, 0, tag, bytes, d());
  if (v != 2000) return fail("generation 256 consumed " + std::to_string(v) + " (a message of generation 0)");
  ef::comm::send(t, 0, ack, bytes, d());
  return 0;
}

// Transports of consecutive generations on one worker, as the elastic group
// builds them: the second reuses the first's endpoints (no wire-up) and keeps
// them when the first closes; a shrunk one reuses those to the peers left;
// after `retire` (a failure) a new one opens its own; and a peer's death
// reaches every transport that shares its endpoint. Three ranks; rank 2
// leaves after generation 1, rank 1 kills itself at the end.
int run_reuse() {
  const auto li = ef::launch_info::from_environment();
  auto w = std::make_shared<ucx::worker>(ucx::context::create(), UCS_THREAD_MODE_MULTI);
  ucx::file_address_exchange ex{std::filesystem::path(ef::env::get("EBBFLOW_TEST_DIR").value())};
  const int r = li.rank;
  const auto all = ex(0, r, 3, w->address(), ef::deadline::after(20s));
  const auto d = [] { return ef::deadline::after(10s); };
  auto make = [&](std::int64_t g, int n) {
    std::vector<std::vector<std::byte>> a(all.begin(), all.begin() + n);
    auto t = ucx::transport::start(w, g, r, n, a);
    t.finish_connect(d());
    return t;
  };
  auto check_sum = [&](ucx::transport& t, const char* what) {
    comm_t c(t);
    std::vector<std::int64_t> v{r + 1};
    c.allreduce(ef::view(std::span(v)), ef::reduce_op::sum, d());
    const std::int64_t want = t.size() * (t.size() + 1) / 2;
    return v[0] == want ? 0 : fail(std::string(what) + ": sum " + std::to_string(v[0]));
  };
  auto close = [](ucx::transport& t) {
    t.start_close();
    while (!t.poll_close()) {
    }
  };
  int bad = 0;
  auto t0 = make(0, 3);
  if (t0.reused_endpoints() != 0) bad += fail("generation 0 reused " + std::to_string(t0.reused_endpoints()));
  bad += check_sum(t0, "generation 0");
  auto t1 = make(1, 3);  // while generation 0 is open
  if (t1.reused_endpoints() != 2) bad += fail("generation 1 reused " + std::to_string(t1.reused_endpoints()));
  bad += check_sum(t1, "generation 1");
  close(t0);
  bad += check_sum(t1, "generation 1 after generation 0 closed");
  if (r == 2) {
    close(t1);
    std::this_thread::sleep_for(300ms);
    return bad;
  }
  auto t2 = make(2, 2);  // rank 2 left: the endpoint to it is not reused
  if (t2.reused_endpoints() != 1) bad += fail("generation 2 reused " + std::to_string(t2.reused_endpoints()));
  close(t1);
  bad += check_sum(t2, "generation 2");
  w->endpoints().retire();  // as after a failure
  if (w->endpoints().shareable() != 0) bad += fail("retire left shareable endpoints");
  auto t3 = make(3, 2);
  if (t3.reused_endpoints() != 0) bad += fail("generation 3 reused " + std::to_string(t3.reused_endpoints()));
  close(t2);
  bad += check_sum(t3, "generation 3");
  auto t4 = make(4, 2);
  if (t4.reused_endpoints() != 1) bad += fail("generation 4 reused " + std::to_string(t4.reused_endpoints()));
  bad += check_sum(t4, "generation 4");
  if (r == 1) {
    if (bad) return bad;
    std::cerr << "[worker 1] killing itself" << std::endl;
    ::raise(SIGKILL);
  }
  // Rank 1's death reaches both transports on the shared endpoint.
  const auto until = ef::deadline::after(5s);
  while ((t3.lost_peer() != 1 || t4.lost_peer() != 1) && !until.expired()) {
    t4.progress();
    std::this_thread::sleep_for(1ms);
  }
  if (t3.lost_peer() != 1 || t4.lost_peer() != 1)
    bad += fail("lost peer: generation 3 " + std::to_string(t3.lost_peer()) + ", generation 4 " +
                std::to_string(t4.lost_peer()));
  return bad;
}

// Allreduce on registered `shared_buffer`s (peers map them: no CMA), every
// dtype x op, in place and out of place, at an odd offset inside a larger
// buffer; with `mixed`, even ranks use plain vectors (those peers are read
// through CMA, the others mapped). Many buffers are created and dropped so
// peers' mapping caches evict and re-map. Results are checked every time.
int run_shared(bool mixed) {
  worker_env w;
  auto t = w.connect();
  ef::comm::collective_options o;
  o.allreduce = ef::comm::allreduce_algorithm::single_copy;
  o.copy_chunk_bytes = 100000;  // odd chunk boundaries
  comm_t c(t, o);
  const int n = t.size(), r = t.rank();
  const bool plain = mixed && r % 2 == 0;
  const auto d = [] { return ef::deadline::after(60s); };
  int bad = 0;
  std::size_t cases = 0;
  auto area = [&](std::size_t bytes) {
    struct area_t {
      ef::comm::shared_buffer shm;
      std::vector<std::byte> vec;
      std::byte* p;
    } a;
    if (plain) {
      a.vec.resize(bytes + 64);
      a.p = a.vec.data() + 8;
    } else {
      a.shm = ef::comm::shared_buffer::allocate(bytes + 64);
      a.p = static_cast<std::byte*>(a.shm.data()) + 8;  // a sub-range, not the buffer's start
    }
    return a;
  };
  for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{4099}, (std::size_t{1} << 20) + 3})
    for (ef::dtype ty : ef::all_dtypes)
      for (ef::reduce_op op : ef::all_reduce_ops) {
        const bool in_place = (count + static_cast<std::size_t>(op) + static_cast<std::size_t>(ty)) % 2 == 0;
        const std::size_t bytes = count * ef::size_of(ty);
        auto in = area(bytes), out = area(bytes);
        et::fill(ty, op, r, in.p, count);
        if (in_place)
          c.allreduce({in.p, count, ty}, op, d());
        else
          c.allreduce({in.p, count, ty}, {out.p, count, ty}, op, d());
        const std::byte* res = in_place ? in.p : out.p;
        ++cases;
        if (auto k = et::wrong_reduced(ty, op, n, res, count))
          bad += fail("shared allreduce " + std::string(ef::name(ty)) + " " + std::string(ef::name(op)) + " count " +
                      std::to_string(count) + (in_place ? " in place" : "") + ": " + std::to_string(k) + " wrong");
      }
  // One long-lived buffer reused many times (the common case), 16 Mi f32.
  const std::size_t big = std::size_t{16} << 20;
  auto g = area(big * 4);
  for (int rep = 0; rep < 3; ++rep) {
    et::fill(ef::dtype::f32, ef::reduce_op::sum, r, g.p, big);
    c.allreduce({g.p, big, ef::dtype::f32}, ef::reduce_op::sum, d());
    ++cases;
    if (auto k = et::wrong_reduced(ef::dtype::f32, ef::reduce_op::sum, n, g.p, big))
      bad += fail("shared allreduce 16 Mi f32 repeat " + std::to_string(rep) + ": " + std::to_string(k) + " wrong");
  }
  // Proof that peers' buffers were mapped rather than read through CMA: this
  // process's address space holds more ebbflow memfds than it owns (one: g).
  std::size_t mapped = 0;
  {
    std::ifstream maps("/proc/self/maps");
    for (std::string line; std::getline(maps, line);) mapped += line.find("memfd:ebbflow-shared") != std::string::npos;
  }
  bool shared_peer = false;
  for (int q = 0; q < n; ++q) shared_peer |= q != r && !(mixed && q % 2 == 0);
  const std::size_t own = plain ? 0 : 1;
  if (shared_peer && mapped <= own)
    bad += fail("no peer buffer mapped (" + std::to_string(mapped) + " memfd mappings, " + std::to_string(own) +
                " own): the allreduce fell back to CMA");
  c.barrier(d());
  std::cerr << "[worker " << r << "] " << cases << " shared-buffer allreduces checked, " << mapped - own
            << " peer mappings live (" << (plain ? "plain vectors" : "shared buffers") << ")" << std::endl;
  return bad ? 1 : 0;
}

// mismatch [ALGO COUNT]: the last rank passes one element fewer than COUNT
// (default: one more than 100000, on the default algorithm). Every rank
// must get an error, never a wrong result; with the default algorithm
// (single_copy here) bad_message, which names both sizes. Prints
//   MISMATCH rank=R cond=C ms=M: <the error's text>
int run_mismatch(char** argv) {
  worker_env w;
  auto t = w.connect();
  ef::comm::collective_options o;
  std::size_t count = 100000;
  int extra = 1;
  if (argv[0] != nullptr) {
    o.allreduce = std::string(argv[0]) == "ring" ? ef::comm::allreduce_algorithm::ring
                                                 : ef::comm::allreduce_algorithm::recursive_doubling;
    count = std::stoull(argv[1]);
    extra = -1;
  }
  comm_t c(t, o);
  const bool odd = t.rank() == t.size() - 1;
  std::vector<float> v(count + static_cast<std::size_t>(odd ? extra : 0), 1.0f);
  const auto start = ef::steady_clock::now();
  try {
    c.allreduce(ef::view(std::span(v)), ef::reduce_op::sum, ef::deadline::after(argv[0] ? 2s : 5s));
    return fail("mismatched sizes accepted");
  } catch (const ef::system_error& e) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(ef::steady_clock::now() - start).count();
    std::cerr << "MISMATCH rank=" << t.rank() << " cond="
              << (e.code() == ef::errc::bad_message ? "bad_message"
                  : e.code() == ef::errc::timeout   ? "timeout"
                                                    : e.code().message())
              << " ms=" << ms << ": " << e.what() << std::endl;
    if (argv[0] == nullptr && e.code() != ef::errc::bad_message) return fail("expected bad_message");
  }
  et::reach("reported", t.size());  // no rank exits (a lost peer to the others) before all have their error
  return 0;
}

// Compressed allreduce over real UCX: every codec, and its dense paths (a
// 4 KiB tensor, PowerSGD's factors), interleaved on one communicator with
// its own collectives and no tag bookkeeping. Every rank regenerates every
// input, so each checks its result against the exact sum; an allreduce of
// max and of min shows every rank holds the same bits.
int run_compressed() {
  namespace cx = ef::compress;
  worker_env w;
  auto t = w.connect();
  comm_t c(t);
  const int n = t.size(), r = t.rank();
  const auto d = [] { return ef::deadline::after(60s); };
  // Input of `rank` for collective k; `sparse` keeps one element in 40 (so top-k is exact).
  const auto input = [](int rank, unsigned k, std::size_t count, bool sparse = false) {
    std::mt19937 g(1000 * k + static_cast<unsigned>(rank));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> v(count);
    for (std::size_t i = 0; i < count; ++i) {
      v[i] = nd(g);
      if (sparse && (i * 7 + static_cast<std::size_t>(rank)) % 40 != 0) v[i] = 0.0f;
    }
    return v;
  };
  int bad = 0;
  const auto check = [&](const std::string& what, std::vector<float>& got, const std::vector<double>& exact,
                         double tolerance) {
    double e = 0, m = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
      e += (got[i] - exact[i]) * (got[i] - exact[i]), m += exact[i] * exact[i];
    if (!(std::sqrt(e / m) <= tolerance))
      bad += fail(what + ": relative l2 error " + std::to_string(std::sqrt(e / m)) + " above " +
                  std::to_string(tolerance));
    std::vector<float> hi = got, lo = got;
    c.allreduce(ef::view(std::span(hi)), ef::reduce_op::max, d());
    c.allreduce(ef::view(std::span(lo)), ef::reduce_op::min, d());
    if (hi != got || lo != got) bad += fail(what + ": ranks hold different results");
  };
  const auto sum_of = [&](unsigned k, std::size_t count, bool sparse = false) {
    std::vector<double> s(count, 0.0);
    for (int q = 0; q < n; ++q) {
      const auto v = input(q, k, count, sparse);
      for (std::size_t i = 0; i < count; ++i) s[i] += v[i];
    }
    return s;
  };
  cx::compressed_allreduce<cx::fp16_codec, ucx::transport> fp16(c, {});
  cx::compressed_allreduce<cx::int8_codec, ucx::transport> int8(c, {});
  cx::compressed_allreduce<cx::topk_codec, ucx::transport> topk(c, cx::topk_codec(0.05));
  cx::compressed_allreduce<cx::sign_codec, ucx::transport> sign(c, {});
  cx::compressed_allreduce<cx::powersgd_codec, ucx::transport> low(c, cx::powersgd_codec(2));
  const std::size_t big = 100003, small = 1024;  // small: 4 KiB, below the dense threshold
  for (unsigned k = 0; k < 20; k += 10) {
    auto g = input(r, k, small);
    fp16.run(g);
    check("fp16 dense 4 KiB", g, sum_of(k, small), 1e-6);
    g = input(r, k + 1, big);
    fp16.run(g, 1);
    check("fp16", g, sum_of(k + 1, big), 1e-3);
    std::vector<float> dense = input(r, k + 2, std::size_t{1} << 18);  // 1 MiB: the communicator's own
    c.allreduce(ef::view(std::span(dense)), ef::reduce_op::sum, d());
    check("communicator 1 MiB", dense, sum_of(k + 2, std::size_t{1} << 18), 1e-6);
    g = input(r, k + 3, big);
    int8.run(g, 2);
    check("int8", g, sum_of(k + 3, big), 0.05);
    g = input(r, k + 4, big, true);
    topk.run(g, 3);
    check("top-k", g, sum_of(k + 4, big, true), 1e-6);
    g = input(r, k + 5, big);
    sign.run(g, 4);
    check("sign", g, sum_of(k + 5, big), 1.0);
    // PowerSGD on rank-1 matrices u_r v^T with a shared v: the sum has rank 1, so rank 2 is exact.
    const cx::matrix_shape shape{300, 200};
    const auto low_rank = [&](int q) {
      const auto u = input(q, k + 6, shape.rows), v = input(0, k + 7, shape.cols);
      std::vector<float> m(shape.size());
      for (std::size_t i = 0; i < shape.rows; ++i)
        for (std::size_t j = 0; j < shape.cols; ++j) m[i * shape.cols + j] = u[i] * v[j];
      return m;
    };
    g = low_rank(r);
    std::vector<double> exact(shape.size(), 0.0);
    for (int q = 0; q < n; ++q) {
      const auto m = low_rank(q);
      for (std::size_t i = 0; i < m.size(); ++i) exact[i] += m[i];
    }
    low.run(g, 5, shape);
    check("powersgd", g, exact, 1e-4);
  }
  std::cerr << "[worker " << r << "] compressed: " << fp16.stats().dense_calls << " dense calls, "
            << fp16.stats().wire_bytes_sent + int8.stats().wire_bytes_sent + topk.stats().wire_bytes_sent +
                   sign.stats().wire_bytes_sent + low.stats().wire_bytes_sent
            << " bytes sent" << std::endl;
  c.barrier(d());
  return bad ? 1 : 0;
}

// Rank 0 waits 400 ms for a message rank 1 sends late: in the default
// wait mode (auto: yield for 2 ms, then block) the waiting thread sleeps on
// the worker's events, so it uses a small share of that time on the CPU
// (with EBBFLOW_UCX_WAIT=yield it spins and yields: about all of it on an
// idle core), and it returns with the message. It waits in 2 ms slices, as
// the elastic group's revocable transport does.
int run_idle() {
  worker_env w;
  auto t = w.connect();
  std::int64_t v = 41 + t.rank(), got = -1;
  std::error_code ec;
  const auto bytes = [](std::int64_t& x) { return std::as_writable_bytes(std::span(&x, 1)); };
  if (t.rank() == 1) {
    std::this_thread::sleep_for(400ms);
    auto s = t.isend(0, 5, bytes(v));
    auto ack = t.irecv(0, 6, bytes(got));
    t.wait(s, ef::deadline::after(10s), ec);
    if (!ec) t.wait(ack, ef::deadline::after(10s), ec);
    return ec ? fail("rank 1: " + ec.message()) : 0;
  }
  auto r = t.irecv(1, 5, bytes(got));
  const auto cpu = ebbflow_test::thread_cpu_seconds;
  const double c0 = cpu();
  const auto w0 = std::chrono::steady_clock::now();
  // In 2 ms slices, as a revocable transport (the elastic group's) waits:
  // the time toward sleeping counts across them.
  const auto until = ef::deadline::after(10s);
  do {
    ec.clear();
    t.wait(r, min(until, ef::deadline::after(2ms)), ec);
  } while (ec == ef::errc::timeout && !until.expired());
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
  const double used = cpu() - c0;
  if (ec) return fail("rank 0: " + ec.message());
  if (got != 42) return fail("rank 0 received " + std::to_string(got));
  auto ack = t.isend(1, 6, bytes(v));
  t.wait(ack, ef::deadline::after(10s), ec);
  std::cerr << "[worker 0] waited " << wall * 1e3 << " ms, " << used * 1e3 << " ms of it on the CPU ("
            << ef::env::get("EBBFLOW_UCX_WAIT").value_or("auto") << ")" << std::endl;
  if (wall < 0.2) return fail("the wait returned after " + std::to_string(wall) + " s, before the message was sent");
  if (used > 0.25 * wall)
    return fail("the waiting thread used " + std::to_string(used) + " s of CPU in a " + std::to_string(wall) +
                " s wait");
  return 0;
}

int worker_main(char** argv) {
  const std::string scenario = argv[2];
  try {
    if (scenario == "matrix") return run_matrix({0, 1, 7, 4099, (std::size_t{1} << 20) + 3}, true);
    if (scenario == "large") return run_matrix({std::size_t{16} << 20}, false);
    // 64 MiB buffers: every collective x dtype x op.
    if (scenario == "large-all")
      return run_matrix({std::size_t{64} << 20}, true, ef::comm::allreduce_algorithm::automatic, true);
    // The other allreduce algorithms (automatic picks single_copy above 16 KiB on one host).
    if (scenario == "ring")
      return run_matrix({1, 7, 4099, (std::size_t{1} << 20) + 3}, false, ef::comm::allreduce_algorithm::ring);
    if (scenario == "rd")
      return run_matrix({1, 7, 4099, (std::size_t{1} << 18) + 3}, false,
                        ef::comm::allreduce_algorithm::recursive_doubling);
    if (scenario == "shared") return run_shared(false);
    if (scenario == "shared-mixed") return run_shared(true);
    if (scenario == "kill") return run_kill(std::chrono::milliseconds(std::stoi(argv[3])));
    if (scenario == "generation") return run_generation();
    if (scenario == "reuse") return run_reuse();
    if (scenario == "wrap") return run_wrap();
    if (scenario == "mismatch") return run_mismatch(argv + 3);
    if (scenario == "idle") return run_idle();
    if (scenario == "compressed") return run_compressed();
  } catch (const std::exception& e) {
    return fail(std::string("exception: ") + e.what());
  }
  return fail("unknown scenario " + scenario);
}

// ------------------------------------------------------------------ launcher
// Launches `n` workers of `scenario` and expects every one to exit 0 in time.
void expect_group_ok(int n, const std::vector<std::string>& args, std::chrono::seconds limit) {
  auto res = launch(n, args, limit);
  ASSERT_FALSE(res.timed_out) << args.front();
  for (int r = 0; r < n; ++r)
    EXPECT_TRUE(exited_ok(res.status[static_cast<std::size_t>(r)])) << args.front() << " rank " << r;
}

class UcxMatrix : public ::testing::TestWithParam<int> {};
TEST_P(UcxMatrix, EveryCollectiveDtypeOpSizeMatchesReference) {
  const int n = GetParam();
  expect_group_ok(n, {"matrix"}, 150s);
}
INSTANTIATE_TEST_SUITE_P(Ranks, UcxMatrix, ::testing::Values(2, 3, 4, 5));

class UcxShared : public ::testing::TestWithParam<int> {};
TEST_P(UcxShared, RegisteredBuffersAreReadInPlaceAndMatchReference) {
  const int n = GetParam();
  for (const char* scenario : {"shared", "shared-mixed"}) expect_group_ok(n, {scenario}, 150s);
}
INSTANTIATE_TEST_SUITE_P(Ranks, UcxShared, ::testing::Values(2, 3));

class UcxLarge : public ::testing::TestWithParam<int> {};
TEST_P(UcxLarge, SixtyFourMiBAllreduceAndBroadcast) {
  const int n = GetParam();
  expect_group_ok(n, {"large"}, 150s);
}
INSTANTIATE_TEST_SUITE_P(Ranks, UcxLarge, ::testing::Values(2, 3));

// 64 MiB buffers, every collective x dtype x op. UcxLargeAll (2 ranks, about
// 40 s) runs in release builds; UcxLargeAllSlow (3, 4, 5 ranks, about 250 s;
// under the sanitizers 2-5 ranks, about 14 min) is the separate ctest entry
// ucx_collectives_slow, labelled `slow` (ctest --preset slow; not in CI).
// The 1 MiB + 3 matrix above already runs every collective on 2-5 ranks.
class UcxLargeAll : public ::testing::TestWithParam<int> {};
TEST_P(UcxLargeAll, SixtyFourMiBEveryCollectiveDtypeOp) {
  const int n = GetParam();
  expect_group_ok(n, {"large-all"}, 300s);
}
class UcxLargeAllSlow : public UcxLargeAll {};
TEST_P(UcxLargeAllSlow, SixtyFourMiBEveryCollectiveDtypeOp) {
  const int n = GetParam();
  expect_group_ok(n, {"large-all"}, 600s);
}
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(UcxLargeAll);
INSTANTIATE_TEST_SUITE_P(Ranks, UcxLargeAllSlow, ::testing::Values(2, 3, 4, 5));
#else
INSTANTIATE_TEST_SUITE_P(Ranks, UcxLargeAll, ::testing::Values(2));
INSTANTIATE_TEST_SUITE_P(Ranks, UcxLargeAllSlow, ::testing::Values(3, 4, 5));
#endif

class UcxAlgorithms : public ::testing::TestWithParam<std::tuple<int, const char*>> {};
TEST_P(UcxAlgorithms, RingAndRecursiveDoublingMatchReference) {
  const auto [n, algo] = GetParam();
  auto res = launch(n, {algo}, 120s);
  ASSERT_FALSE(res.timed_out);
  for (int r = 0; r < n; ++r) EXPECT_TRUE(exited_ok(res.status[static_cast<std::size_t>(r)])) << "rank " << r;
}
INSTANTIATE_TEST_SUITE_P(Ranks, UcxAlgorithms,
                         ::testing::Combine(::testing::Values(2, 3, 5), ::testing::Values("ring", "rd")));

class UcxCompressed : public ::testing::TestWithParam<int> {};
TEST_P(UcxCompressed, EveryCodecAndItsDensePathsShareTheCommunicator) {
  expect_group_ok(GetParam(), {"compressed"}, 120s);
}
INSTANTIATE_TEST_SUITE_P(Ranks, UcxCompressed, ::testing::Values(2, 3, 4));

class UcxKill : public ::testing::TestWithParam<int> {};
TEST_P(UcxKill, SurvivorsGetPeerLostWithinDeadlinePlusOneSecond) {
  const int n = GetParam();
  const auto t0 = ef::steady_clock::now();
  auto res = launch(n, {"kill", "3000"}, 60s);
  ASSERT_FALSE(res.timed_out) << "a survivor hung";
  const int victim = n - 1;
  EXPECT_TRUE(WIFSIGNALED(res.status[static_cast<std::size_t>(victim)]));
  for (int r = 0; r < victim; ++r) EXPECT_TRUE(exited_ok(res.status[static_cast<std::size_t>(r)])) << "rank " << r;
  std::cerr << "kill scenario with " << n << " ranks took "
            << std::chrono::duration_cast<std::chrono::milliseconds>(ef::steady_clock::now() - t0).count() << " ms\n";
}
INSTANTIATE_TEST_SUITE_P(Ranks, UcxKill, ::testing::Values(2, 3, 4, 5));

// What a survivor asks of a member on its host in a recovery: is the process
// that said hello still there? A forked child holds the parent's probe word
// at the same address until it dies; dead (a zombie or reaped) it is gone,
// as is a pid that holds another value there or has no memory there.
TEST(UcxProbe, AProcessIsThereUntilItDiesAndNeverAfter) {
  namespace d = ef::comm::ucx::detail;
  const auto address = reinterpret_cast<std::uint64_t>(&d::process_probe());
  const std::uint64_t nonce = d::process_probe();
  EXPECT_EQ(d::probe_process(::getpid(), address, nonce), d::probe_result::there);
  EXPECT_EQ(d::probe_process(::getpid(), address, nonce + 1), d::probe_result::gone);  // the pid, reused
  EXPECT_EQ(d::probe_process(::getpid(), 0, nonce), d::probe_result::gone);            // no memory there
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  EXPECT_EQ(d::probe_process(child, address, nonce), d::probe_result::there);
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  // A zombie until reaped: gone already (its memory went first).
  for (int i = 0; i < 200; ++i) {
    siginfo_t si{};
    if (::waitid(P_PID, static_cast<id_t>(child), &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == child) break;
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(d::probe_process(child, address, nonce), d::probe_result::gone);
  int st = 0;
  ASSERT_EQ(::waitpid(child, &st, 0), child);
  EXPECT_EQ(d::probe_process(child, address, nonce), d::probe_result::gone);
}

TEST(UcxErrors, MismatchedSizesGiveBadMessage) {
  auto res = launch(2, {"mismatch"}, 60s);
  ASSERT_FALSE(res.timed_out);
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(exited_ok(res.status[static_cast<std::size_t>(r)])) << "rank " << r;
}

// The ring with 10^6 and 10^6 - 1 elements: only a rank whose chunks differ
// sees a message of the wrong size (bad_message, both sizes and the cause
// named); a rank whose chunks match waits for a peer that gave up, and its
// timeout names the cause too.
TEST(UcxErrors, RingSizeMismatchNamesTheCauseOnEveryRank) {
  const auto err = std::filesystem::temp_directory_path() / ("ebbflow-ucx-mismatch-" + std::to_string(::getpid()) + "-");
  auto res = launch(2, {"mismatch", "ring", "1000000"}, 60s, err.string());
  ASSERT_FALSE(res.timed_out);
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(exited_ok(res.status[static_cast<std::size_t>(r)])) << "rank " << r;
    std::ifstream f(err.string() + std::to_string(r));
    const std::string text{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
    std::filesystem::remove(err.string() + std::to_string(r));
    EXPECT_NE(text.find("the ranks disagree on the size"), std::string::npos) << "rank " << r << ":\n" << text;
    if (r == 0) {
      EXPECT_NE(text.find("cond=bad_message"), std::string::npos) << text;
      EXPECT_NE(text.find("message of 124996 bytes for a 125000-byte receive buffer"), std::string::npos) << text;
    } else {
      EXPECT_NE(text.find("cond=timeout"), std::string::npos) << text;
      EXPECT_NE(text.find("3999996 bytes"), std::string::npos) << text;
    }
  }
}

TEST(UcxErrors, AddressExchangeTimesOutNamingTheMissingRank) {
  const auto dir = std::filesystem::temp_directory_path() / ("ebbflow-ax-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  ucx::file_address_exchange ex(dir);
  const std::byte addr[3]{};
  try {
    (void)ex(7, 0, 2, addr, ef::deadline::after(50ms));
    ADD_FAILURE() << "no timeout";
  } catch (const ef::system_error& e) {
    EXPECT_EQ(e.code(), ef::errc::timeout);
    EXPECT_EQ(e.peer(), 1);
    EXPECT_EQ(e.generation(), 7);
  }
  std::filesystem::remove_all(dir);
}

// An address from the exchange is checked before UCX sees it: UCX asserts
// (and aborts the process) on a malformed one. Each bad address is refused
// with peer_lost naming the peer and the address's size.
TEST(UcxErrors, MalformedPeerAddressIsRefusedNamingThePeer) {
  auto w = std::make_shared<ucx::worker>(ucx::context::create());
  const std::vector<std::byte> own(w->address().begin(), w->address().end());
  std::vector<std::byte> flipped = own;
  flipped.back() ^= std::byte{1};
  const std::vector<std::vector<std::byte>> bad{{},
                                                std::vector<std::byte>(16, std::byte{0xff}),
                                                {own.begin(), own.begin() + 6},
                                                {own.begin(), own.end() - 1},
                                                flipped};
  for (const auto& b : bad) {
    try {
      ucx::transport t(w, 0, 0, 2, {own, b}, ef::deadline::after(2s));
      ADD_FAILURE() << "connected to a malformed address of " << b.size() << " bytes";
    } catch (const ef::system_error& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.code(), ef::errc::peer_lost) << what;
      EXPECT_EQ(e.peer(), 1) << what;
      EXPECT_NE(what.find(std::to_string(b.size()) + " bytes"), std::string::npos) << what;
    }
  }
}

// Two transports on two workers of this process, connected by polling both.
std::pair<ucx::transport, ucx::transport> connected_pair() {
  auto ctx = ucx::context::create();
  auto w0 = std::make_shared<ucx::worker>(ctx), w1 = std::make_shared<ucx::worker>(ctx);
  const std::vector<std::vector<std::byte>> a{{w0->address().begin(), w0->address().end()},
                                              {w1->address().begin(), w1->address().end()}};
  auto t0 = ucx::transport::start(w0, 0, 0, 2, a);
  auto t1 = ucx::transport::start(w1, 0, 1, 2, a);
  const auto d = ef::deadline::after(10s);
  for (bool c0 = false, c1 = false; !(c0 && c1) && !d.expired();) {
    c0 = t0.poll_connect();
    c1 = t1.poll_connect();
  }
  return {std::move(t0), std::move(t1)};
}

// A connect that failed leaves its transport unusable, and says so: polling
// it again throws the same error, and a send or receive on it fails at once
// naming the connect's error. (The elastic group may hold such a transport,
// started by a helper thread whose connect failed, while it switches the
// blocking way: it must fail over, never send on a closed endpoint.)
TEST(UcxErrors, ATransportWhoseConnectFailedStaysFailed) {
  auto ctx = ucx::context::create();
  auto w0 = std::make_shared<ucx::worker>(ctx), w1 = std::make_shared<ucx::worker>(ctx),
       w2 = std::make_shared<ucx::worker>(ctx);
  const std::vector<std::vector<std::byte>> a{{w0->address().begin(), w0->address().end()},
                                              {w1->address().begin(), w1->address().end()},
                                              {w2->address().begin(), w2->address().end()}};
  auto t0 = ucx::transport::start(w0, 5, 0, 3, a);
  t0.mark_lost(2);  // as UCX reports a peer that died while wiring up
  auto poll = [&] {
    try {
      (void)t0.poll_connect();
      return std::error_code{};
    } catch (const ef::system_error& e) {
      EXPECT_EQ(e.peer(), 2) << e.what();
      EXPECT_EQ(e.generation(), 5) << e.what();
      return e.code();
    }
  };
  EXPECT_EQ(poll(), ef::errc::peer_lost);
  EXPECT_EQ(poll(), ef::errc::peer_lost) << "a failed connect polled again must fail again";
  EXPECT_THROW(t0.finish_connect(ef::deadline::after(1s)), ef::system_error);
  std::vector<std::byte> out(8), in(8);
  for (int peer : {1, 2}) {
    auto s = t0.isend(peer, 9, out);
    auto r = t0.irecv(peer, 9, in);
    std::error_code es, er;
    EXPECT_TRUE(t0.test(s, es)) << "peer " << peer;
    EXPECT_TRUE(t0.test(r, er)) << "peer " << peer;
    EXPECT_EQ(es, ef::errc::peer_lost) << "peer " << peer << ": " << es.message();
    EXPECT_EQ(er, ef::errc::peer_lost) << "peer " << peer << ": " << er.message();
  }
}

TEST(UcxErrors, PointToPointSizeMismatchNamesBothSizes) {
  auto [t0, t1] = connected_pair();
  for (const std::size_t sent : {std::size_t{12}, std::size_t{28}}) {
    std::vector<std::byte> out(sent), in(20);
    auto s = t0.isend(1, 9, out);
    auto r = t1.irecv(0, 9, in);
    std::error_code es, er;
    const auto d = ef::deadline::after(5s);
    for (bool ds = false, dr = false; !(ds && dr) && !d.expired();) {
      ds = ds || t0.test(s, es);
      dr = dr || t1.test(r, er);
    }
    EXPECT_EQ(er, ef::errc::bad_message) << sent << " bytes sent: " << er.message();
    // UCX (1.13 checked) reports the sender's length of a truncated message too.
    const std::string why = r.error_detail();
    EXPECT_NE(why.find("message of " + std::to_string(sent) + " bytes for a 20-byte receive buffer"), std::string::npos)
        << why;
  }
}

TEST(UcxWait, AWaitingRankSleepsUntilItsMessageArrives) {
  if (const char* m = std::getenv("EBBFLOW_UCX_WAIT"); m && std::string_view(m) == "yield")
    GTEST_SKIP() << "EBBFLOW_UCX_WAIT=yield";
  expect_group_ok(2, {"idle"}, 60s);
}

TEST(UcxWait, TheWaitModeComesFromTheEnvironmentAndAnUnknownOneIsRefused) {
  const char* before = std::getenv("EBBFLOW_UCX_WAIT");
  const std::string saved = before ? before : "";
  ::setenv("EBBFLOW_UCX_WAIT", "spin", 1);
  try {
    (void)ucx::context::create();
    ADD_FAILURE() << "EBBFLOW_UCX_WAIT=spin accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("EBBFLOW_UCX_WAIT='spin'"), std::string::npos) << e.what();
  }
  for (auto [v, m] : {std::pair{"", ucx::wait_mode::automatic}, std::pair{"auto", ucx::wait_mode::automatic},
                      std::pair{"block", ucx::wait_mode::block}, std::pair{"yield", ucx::wait_mode::yield}}) {
    ::setenv("EBBFLOW_UCX_WAIT", v, 1);
    EXPECT_EQ(ucx::wait_mode_from_environment(), m) << "EBBFLOW_UCX_WAIT='" << v << "'";
  }
  if (before)
    ::setenv("EBBFLOW_UCX_WAIT", saved.c_str(), 1);
  else
    ::unsetenv("EBBFLOW_UCX_WAIT");
  EXPECT_EQ(ucx::context::create(ucx::wait_mode::yield)->waits(), ucx::wait_mode::yield);
}

TEST(UcxEnvironment, SharedMemoryDefaultsOnlyForTransportsUcxTlsMaySelect) {
  using ucx::detail::tls_may_select;
  for (const char* tls : {static_cast<const char*>(nullptr), "", "all", "^tcp", "sm,self", "shm", "posix,tcp"})
    EXPECT_TRUE(tls_may_select(tls, "posix")) << (tls ? tls : "(unset)");
  EXPECT_TRUE(tls_may_select("mm,self", "sysv"));
  EXPECT_TRUE(tls_may_select("tcp,cma", "cma"));
  for (const char* tls : {"tcp,self", "tcp", "rc,ud", "sysv", "cma,tcp"})
    EXPECT_FALSE(tls_may_select(tls, "posix")) << tls;
  EXPECT_FALSE(tls_may_select("mm,self", "cma"));
  EXPECT_FALSE(tls_may_select("posixx", "posix"));
}

// The receive-pool default (a newcomer's start-up) is set like the others:
// only when unset, so a user's value always wins.
TEST(UcxEnvironment, ReceivePoolDefaultsNeverOverrideTheUsersValues) {
  const char* tls = std::getenv("UCX_TLS");
  if (!ucx::detail::tls_may_select(tls, "posix") || !ucx::detail::tls_may_select(tls, "sysv"))
    GTEST_SKIP() << "UCX_TLS=" << tls;
  struct saved_variable {
    const char* name;
    std::optional<std::string> value;
    explicit saved_variable(const char* n) : name(n) {
      if (const char* v = std::getenv(n)) value = v;
    }
    ~saved_variable() {
      if (value)
        ::setenv(name, value->c_str(), 1);
      else
        ::unsetenv(name);
    }
  } posix("UCX_POSIX_RX_BUFS_GROW"), sysv("UCX_SYSV_RX_BUFS_GROW");
  ::unsetenv(posix.name);
  ::setenv(sysv.name, "256", 1);  // the user's
  ucx::set_environment_defaults();
  ASSERT_NE(std::getenv(posix.name), nullptr);
  EXPECT_STREQ(std::getenv(posix.name), "128");
  EXPECT_STREQ(std::getenv(sysv.name), "256");
}

TEST(UcxGeneration, LateMessagesOfAnOlderGenerationAreNeverConsumed) {
  auto res = launch(2, {"generation"}, 60s);
  ASSERT_FALSE(res.timed_out);
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(exited_ok(res.status[static_cast<std::size_t>(r)])) << "rank " << r;
}

TEST(UcxGeneration, AnUnreceivedMessageIsDiscardedBeforeItsTagBitsComeBack) {
  const auto err = std::filesystem::temp_directory_path() / ("ebbflow-ucx-wrap-" + std::to_string(::getpid()) + "-");
  auto res = launch(2, {"wrap"}, 60s, err.string());
  ASSERT_FALSE(res.timed_out);
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(exited_ok(res.status[static_cast<std::size_t>(r)])) << "rank " << r;
    std::ifstream f(err.string() + std::to_string(r));
    const std::string text{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
    EXPECT_EQ(text.find("not matched"), std::string::npos) << "rank " << r << " stderr:\n" << text;
    if (r == 1) {
      EXPECT_EQ(text.find("consumed"), std::string::npos) << text;
    }
    std::filesystem::remove(err.string() + std::to_string(r));
  }
}

TEST(UcxGeneration, ConsecutiveTransportsOnOneWorkerShareEndpoints) {
  auto res = launch(3, {"reuse"}, 60s);
  ASSERT_FALSE(res.timed_out);
  for (int r : {0, 2}) EXPECT_TRUE(exited_ok(res.status[static_cast<std::size_t>(r)])) << "rank " << r;
  const int st1 = res.status[1];
  EXPECT_TRUE(WIFSIGNALED(st1) && WTERMSIG(st1) == SIGKILL) << "rank 1 should have killed itself, status " << st1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::strcmp(argv[1], "--worker") == 0) return worker_main(argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

// A receive abandoned after UCX matched it (a collective that failed or
// timed out mid-transfer) cannot be cancelled: release drives it to its end,
// so nothing writes into its buffer afterwards, when the owner reuses it
// (most of the 64 MiB were overwritten later). One thread drives both
// workers: over shared memory the receiver pulls the data, so its release
// can finish the transfer alone (over tcp the sender pushes, which the
// release waits for when the sender is another process).
TEST(UcxErrors, AnAbandonedReceiveWritesNothingAfterItsRelease) {
  if (const char* tls = std::getenv("UCX_TLS"); tls && *tls) GTEST_SKIP() << "UCX_TLS=" << tls;
  for (int k : {2, 8, 64}) {
    auto [t0, t1] = connected_pair();
    const std::size_t n = std::size_t{64} << 20;
    std::vector<std::byte> out(n, std::byte{0x11}), in(n, std::byte{0});
    auto s = t0.isend(1, 9, out);
    std::error_code es, er;
    {
      auto r = t1.irecv(0, 9, in);
      for (int i = 0; i < k; ++i) (void)t0.test(s, es), (void)t1.test(r, er);
    }                                                  // abandoned mid-transfer
    std::fill(in.begin(), in.end(), std::byte{0xAB});  // the owner reuses the buffer
    std::vector<std::byte> other(8);
    auto r2 = t1.irecv(0, 10, other);  // the receiver's worker goes on being progressed
    const auto d = ef::deadline::after(5s);
    for (bool sent = false; !sent && !d.expired();) {
      sent = t0.test(s, es);
      (void)t1.test(r2, er);
    }
    for (int i = 0; i < 1000; ++i) (void)t1.test(r2, er);
    const auto written = std::count_if(in.begin(), in.end(), [](std::byte b) { return b != std::byte{0xAB}; });
    EXPECT_EQ(written, 0) << "bytes written after the release, " << k << " progress calls before it";
  }
}
