// SPDX-License-Identifier: Apache-2.0
// The range of the fp16 and bf16 compressed allreduce between real processes
// over real UCX (one process per rank, started by tests/comm/run_ranks.sh:
// EBBFLOW_RANK / EBBFLOW_WORLD_SIZE, addresses through EBBFLOW_ADDR_DIR).
// 65,536 floats per rank, the compressed path, default options:
// * every rank 60000 (30000): the sum leaves fp16's range, the mean does not;
//   the result is finite and within the codec's error (it was inf);
// * ranks holding +60000 and -60000: the running sums of the ring leave
//   fp16's range, the sum does not;
// * bf16: a value (2 ranks) or a running sum of the ring (more) between
//   bf16's largest value and FLT_MAX (it rounded to inf);
// * every rank 2e38: the sum leaves float's range; the result is +inf and
//   every element is counted in `stats().saturated` on every rank;
// * 16 elements (dense): exact, as before.
// Every rank regenerates every input, so each checks its own result; an
// allreduce of max and of min shows every rank holds the same bits.
#include <ebbflow/comm/communicator.hpp>
#include <ebbflow/comm/ucx/address_exchange.hpp>
#include <ebbflow/comm/ucx/transport.hpp>
#include <ebbflow/compress.hpp>
#include <ebbflow/core/env.hpp>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

namespace ef = ebbflow;
namespace cx = ebbflow::compress;
namespace ucx = ebbflow::comm::ucx;
using namespace std::chrono_literals;
using comm_t = ef::comm::transport_communicator<ucx::transport>;

namespace {

int rank_ = -1;

int fail(const std::string& what) {
  std::fprintf(stderr, "[rank %d] FAIL %s\n", rank_, what.c_str());
  return 1;
}

// Runs `Codec`'s allreduce on make(rank, i) and checks every element against
// the exact sum: within (p + 1) unit roundoffs of the sum of magnitudes (the
// bound of docs/compress.md) and finite, or, with `saturate`, +inf and
// counted; the same bits on every rank.
template <class Codec, class Make>
int check(comm_t& c, const char* what, std::size_t n, Make make, bool saturate = false) {
  const int p = c.size();
  cx::compressed_allreduce<Codec, ucx::transport> ar(c, Codec{});
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = make(c.rank(), i);
  ar.run(g);
  int bad = 0;
  std::size_t wrong = 0, first = n;
  for (std::size_t i = 0; i < n; ++i) {
    double sum = 0, mag = 0;
    for (int r = 0; r < p; ++r) sum += make(r, i), mag += std::fabs(make(r, i));
    const bool ok = saturate ? std::isinf(g[i]) && g[i] > 0
                             : std::isfinite(g[i]) && std::fabs(g[i] - sum) <= (p + 1) * Codec::unit_roundoff * mag;
    if (!ok && wrong++ == 0) first = i;
  }
  if (wrong)
    bad += fail(std::string(what) + ": " + std::to_string(wrong) + " of " + std::to_string(n) +
                " elements wrong, first " + std::to_string(first) + " = " + std::to_string(g[first]));
  const std::size_t want = saturate ? n : 0;
  if (ar.stats().saturated != want)
    bad += fail(std::string(what) + ": " + std::to_string(ar.stats().saturated) + " saturated, expected " +
                std::to_string(want));
  std::vector<float> hi = g, lo = g;
  c.allreduce(ef::view(std::span(hi)), ef::reduce_op::max, ef::deadline::after(30s));
  c.allreduce(ef::view(std::span(lo)), ef::reduce_op::min, ef::deadline::after(30s));
  if (hi != g || lo != g) bad += fail(std::string(what) + ": ranks hold different results");
  return bad;
}

}  // namespace

int main() try {
  const auto li = ef::launch_info::from_environment();
  rank_ = li.rank;
  const auto dir = ef::env::get("EBBFLOW_ADDR_DIR");
  if (!dir) return fail("no EBBFLOW_ADDR_DIR (run me through tests/comm/run_ranks.sh)");
  auto ctx = ucx::context::create();
  ucx::file_address_exchange ex(*dir);
  auto t = ucx::connect(ctx, ex, 0, li.rank, li.world_size, ef::deadline::after(30s));
  comm_t c(t);
  const int p = c.size();
  const std::size_t n = 65536;  // 256 KiB: the compressed path
  // A small spread, so that not every element rounds alike.
  const auto spread = [](std::size_t i) { return 1.0f - static_cast<float>(i % 5) / 8192.0f; };
  int bad = 0;
  bad += check<cx::fp16_codec>(c, "fp16, every rank 60000", n, [&](int, std::size_t) { return 60000.0f; });
  bad += check<cx::fp16_codec>(c, "fp16, every rank 30000", n, [&](int, std::size_t) { return 30000.0f; });
  bad += check<cx::fp16_codec>(c, "fp16, every rank about 60000", n,
                               [&](int, std::size_t i) { return 60000.0f * spread(i); });
  bad += check<cx::fp16_codec>(c, "fp16, +-60000 (running sums beyond 65504)", n, [&](int r, std::size_t i) {
    return (r < (p + 1) / 2 ? 60000.0f : -60000.0f) * spread(i);
  });
  bad += check<cx::bf16_codec>(c, "bf16, every rank 60000", n, [&](int, std::size_t) { return 60000.0f; });
  // bf16 rounds to inf above bf16_max + 2^119, 2^-8 below FLT_MAX. Two
  // ranks: +-w, each alone in that window. More: rank 0's b (bf16-exact)
  // plus rank 1's w - b is a running sum in the window; rank 2 takes b away.
  const float w = (0x1.FEp127f + 0x1p119f) / 2 + std::numeric_limits<float>::max() / 2, b = 0x1.1p127f;
  bad +=
      check<cx::bf16_codec>(c, "bf16, a running sum between bf16's and float's largest", n, [&](int r, std::size_t i) {
        if (p == 2) return (r == 0 ? w : -w) * spread(i);
        return r == 0 ? b : r == 1 ? (w - b) * spread(i) : r == 2 ? -b : 1.0f;
      });
  bad += check<cx::fp16_codec>(
      c, "fp16, every rank 2e38 (the sum beyond float)", n, [&](int, std::size_t) { return 2e38f; }, true);
  bad += check<cx::bf16_codec>(
      c, "bf16, every rank 2e38 (the sum beyond float)", n, [&](int, std::size_t) { return 2e38f; }, true);
  {  // below the dense threshold: the communicator's allreduce, exact
    cx::compressed_allreduce<cx::fp16_codec, ucx::transport> ar(c, {});
    std::vector<float> g(16, 60000.0f);
    ar.run(g);
    for (float x : g)
      if (x != 60000.0f * static_cast<float>(p)) bad += fail("fp16 dense 16 elements: " + std::to_string(x));
  }
  c.barrier(ef::deadline::after(30s));
  std::fprintf(stderr, "[rank %d] %d of %d: %s\n", li.rank, li.rank, p, bad ? "FAILED" : "ok");
  return bad ? 1 : 0;
} catch (const std::exception& e) {
  return fail(std::string("exception: ") + e.what());
}
