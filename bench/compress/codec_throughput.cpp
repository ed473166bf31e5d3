// SPDX-License-Identifier: Apache-2.0
// Codec encode/decode throughput on the CPU executor, one core, in GB/s of
// uncompressed input (float bytes / time), against memcpy of the same buffer.
// Contestants run interleaved (round robin), after a warm-up, and each
// codec's round trip is checked before timing. The linear codecs' "ring hop"
// (decode a running sum, add this rank's values, encode) is the ring's inner
// step. Compiles against older headers too, for before/after runs of two
// builds (docs/benchmarks/compress.md).
//
//   codec_throughput [--mib 64] [--rounds 9] [--json FILE]
#include <ebbflow/compress.hpp>

#include "bench_util.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace ef = ebbflow;
namespace cx = ebbflow::compress;

namespace {
using bench::contestant;

template <class C>
void add_codec(std::vector<contestant>& cs, const C& c, const std::vector<float>& in, std::vector<float>& res,
               std::vector<float>& out, std::vector<std::byte>& enc, std::vector<std::byte>& ws, double tol) {
  ef::exec::cpu_executor ex;
  const std::size_t n = in.size();
  // Check before timing: decode(encode(x)) within the codec's tolerance (relative l2).
  c.encode(ex, in.data(), nullptr, enc.data(), n, {1, 2, ws.data()});
  c.decode(ex, enc.data(), out.data(), n);
  double e = 0, d = 0;
  for (std::size_t i = 0; i < n; ++i) e += double(out[i] - in[i]) * (out[i] - in[i]), d += double(in[i]) * in[i];
  const double rel = std::sqrt(e / d);
  std::printf("# check %-6s rel_l2 %.3e (limit %.1e) %s\n", std::string(c.name()).c_str(), rel, tol,
              rel <= tol ? "ok" : "WRONG");
  if (!(rel <= tol)) std::exit(1);
  const std::string nm(c.name());
  cs.push_back({nm + " encode",
                [&, c, ex]() mutable {
                  c.encode(ex, in.data(), nullptr, enc.data(), in.size(), {1, 2, ws.data()});
                },
                {}});
  cs.push_back({nm + " encode+EF",
                [&, c, ex]() mutable {
                  c.encode(ex, in.data(), res.data(), enc.data(), in.size(), {1, 2, ws.data()});
                },
                {}});
  cs.push_back({nm + " decode", [&, c, ex]() mutable { c.decode(ex, enc.data(), out.data(), in.size()); }, {}});
  if constexpr (C::kind == cx::codec_kind::linear) {
    // The ring's hop: a running sum's code decoded, this rank's values added,
    // the sum encoded. In one pass where the codec has one (the casts'
    // decode_add_encode, which reads this rank's values only), else as the
    // ring does it: decode_add into this rank's values, then encode them.
    auto code = std::make_shared<std::vector<std::byte>>(c.max_encoded_bytes(n));
    c.encode(ex, in.data(), nullptr, code->data(), n, {1, 2, ws.data()});
    cs.push_back({nm + " ring hop",
                  [&, c, ex, code]() mutable {
                    if constexpr (requires(ef::exec::cpu_executor & e) {
                                    c.decode_add_encode(e, code->data(), in.data(), nullptr, enc.data(), n);
                                  }) {
                      c.decode_add_encode(ex, code->data(), in.data(), nullptr, enc.data(), in.size());
                    } else {
                      c.decode_add(ex, code->data(), out.data(), in.size());
                      c.encode(ex, out.data(), nullptr, enc.data(), in.size(), {1, 2, ws.data()});
                    }
                  },
                  {}});
  }
}
}  // namespace

int main(int argc, char** argv) {
  const std::size_t mib = std::stoul(bench::arg(argc, argv, "--mib", "64"));
  const int rounds = std::stoi(bench::arg(argc, argv, "--rounds", "9"));
  bench::json_lines json(bench::arg(argc, argv, "--json", ""));
  const std::size_t n = mib * (1u << 20) / 4;
  std::vector<float> in(n), res(n, 0.0f), out(n), copy(n);
  std::mt19937 g(1);
  std::normal_distribution<float> dist;
  for (auto& x : in) x = dist(g);
  const cx::topk_codec topk(0.01);
  std::size_t max_enc = 4 * n + 64;
  std::vector<std::byte> enc(max_enc), ws(topk.workspace_bytes(n) + 8);

  std::vector<contestant> cs;
  cs.push_back({"memcpy", [&] { std::memcpy(copy.data(), in.data(), n * 4); }, {}});
  add_codec(cs, cx::fp16_codec{}, in, res, out, enc, ws, 1.0 / 2048);
  add_codec(cs, cx::bf16_codec{}, in, res, out, enc, ws, 1.0 / 256);
  add_codec(cs, cx::int8_codec{}, in, res, out, enc, ws, 0.03);
  add_codec(cs, cx::int4_codec{}, in, res, out, enc, ws, 0.5);
  add_codec(cs, cx::sign_codec{}, in, res, out, enc, ws, 0.7);
  add_codec(cs, topk, in, res, out, enc, ws, 1.0);
  for (int r = -1; r < rounds; ++r)  // round -1: warm-up (page faults, caches)
    for (auto& c : cs) {
      const double t0 = bench::now_s();
      c.run();
      const double dt = bench::now_s() - t0;
      if (r >= 0) c.times.push_back(dt);
    }
  const double bytes = double(n) * 4;
  const auto mc = bench::summarize(cs[0].times);
  std::printf("# %zu MiB of float input, 1 thread, %d rounds interleaved; GB/s = input bytes / time\n", mib, rounds);
  std::printf("%-18s %10s %10s %10s %12s\n", "contestant", "max_GBps", "med_GBps", "p99_GBps", "med/memcpy");
  for (auto& c : cs) {
    const auto s = bench::summarize(c.times);
    const double ratio = mc.median / s.median;
    std::printf("%-18s %10.2f %10.2f %10.2f %11.0f%%\n", c.name.c_str(), bytes / s.min / 1e9, bytes / s.median / 1e9,
                bytes / s.p99 / 1e9, 100 * ratio);
    json.write("\"bench\":\"codec_throughput\",\"contestant\":\"" + c.name + "\",\"bytes\":" + std::to_string(n * 4) +
               ",\"min_s\":" + std::to_string(s.min) + ",\"median_s\":" + std::to_string(s.median) +
               ",\"p99_s\":" + std::to_string(s.p99) + ",\"ratio_vs_memcpy\":" + std::to_string(ratio));
  }
}
