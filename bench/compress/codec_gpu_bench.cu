// SPDX-License-Identifier: Apache-2.0
// Codec encode/decode throughput on the CUDA executor (CUDA events), in GB/s
// of float input, against a device-to-device cudaMemcpy of the same buffer;
// interleaved rounds after a warm-up; every codec's GPU encoding is checked
// bit for bit against the CPU executor before timing (on a 1 M-element
// prefix). Exits 0 with a message when no device is present.
//
//   compress_codec_gpu_bench [--mib 256] [--rounds 10] [--json FILE]
#include <ebbflow/compress.hpp>
#include <ebbflow/exec/cuda_executor.cuh>

#include "bench_util.hpp"

#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace ef = ebbflow;
namespace cx = ebbflow::compress;

namespace {
using bench::contestant;

template <class C>
bool check(const C& c, const std::vector<float>& h_in, const float* d_in, std::byte* d_enc, std::byte* d_ws) {
  const std::size_t n = std::min<std::size_t>(h_in.size(), 1 << 20);
  ef::exec::cpu_executor hx;
  std::vector<std::byte> h_enc(c.max_encoded_bytes(n)), h_ws(c.workspace_bytes(n) + 8), g_enc(h_enc.size());
  c.encode(hx, h_in.data(), nullptr, h_enc.data(), n, {1, 2, h_ws.data()});
  ef::exec::cuda_executor dx;
  c.encode(dx, d_in, nullptr, d_enc, n, {1, 2, d_ws});
  dx.wait();
  cudaMemcpy(g_enc.data(), d_enc, g_enc.size(), cudaMemcpyDeviceToHost);
  const bool ok = g_enc == h_enc;
  std::printf("# check %-6s GPU encoding %s the CPU executor's\n", std::string(c.name()).c_str(),
              ok ? "bit-identical to" : "DIFFERS from");
  return ok;
}

template <class C>
void add(std::vector<contestant>& cs, const C& c, std::size_t n, const float* d_in, float* d_res, float* d_out,
         std::byte* d_enc, std::byte* d_ws) {
  ef::exec::cuda_executor dx;
  const std::string nm(c.name());
  cs.push_back({nm + " encode", [=]() mutable { c.encode(dx, d_in, nullptr, d_enc, n, {1, 2, d_ws}); }, {}});
  cs.push_back({nm + " encode+EF", [=]() mutable { c.encode(dx, d_in, d_res, d_enc, n, {1, 2, d_ws}); }, {}});
  cs.push_back({nm + " decode", [=]() mutable { c.decode(dx, d_enc, d_out, n); }, {}});
}
}  // namespace

int main(int argc, char** argv) {
  int devs = 0;
  if (cudaGetDeviceCount(&devs) != cudaSuccess || devs == 0) {
    std::printf("# no CUDA device: skipped\n");
    return 0;
  }
  const std::size_t n = std::stoul(bench::arg(argc, argv, "--mib", "256")) * (1u << 20) / 4;
  const int rounds = std::stoi(bench::arg(argc, argv, "--rounds", "10"));
  bench::json_lines json(bench::arg(argc, argv, "--json", ""));
  std::vector<float> h(n);
  std::mt19937 g(1);
  std::normal_distribution<float> d;
  for (auto& x : h) x = d(g);
  float *d_in, *d_res, *d_out, *d_copy;
  std::byte *d_enc, *d_ws;
  const cx::topk_codec topk(0.01);
  cudaMalloc(&d_in, n * 4);
  cudaMalloc(&d_res, n * 4);
  cudaMalloc(&d_out, n * 4);
  cudaMalloc(&d_copy, n * 4);
  cudaMalloc(&d_enc, n * 4 + 64);
  cudaMalloc(&d_ws, topk.workspace_bytes(n) + 8);
  cudaMemcpy(d_in, h.data(), n * 4, cudaMemcpyHostToDevice);
  cudaMemset(d_res, 0, n * 4);
  bool ok = check(cx::fp16_codec{}, h, d_in, d_enc, d_ws) && check(cx::bf16_codec{}, h, d_in, d_enc, d_ws) &&
            check(cx::int8_codec{}, h, d_in, d_enc, d_ws) && check(cx::int4_codec{}, h, d_in, d_enc, d_ws) &&
            check(cx::sign_codec{}, h, d_in, d_enc, d_ws) && check(topk, h, d_in, d_enc, d_ws);
  if (!ok) return 1;
  std::vector<contestant> cs;
  cs.push_back({"cudaMemcpy D2D", [=] { cudaMemcpyAsync(d_copy, d_in, n * 4, cudaMemcpyDeviceToDevice); }, {}});
  add(cs, cx::fp16_codec{}, n, d_in, d_res, d_out, d_enc, d_ws);
  add(cs, cx::bf16_codec{}, n, d_in, d_res, d_out, d_enc, d_ws);
  add(cs, cx::int8_codec{}, n, d_in, d_res, d_out, d_enc, d_ws);
  add(cs, cx::int4_codec{}, n, d_in, d_res, d_out, d_enc, d_ws);
  add(cs, cx::sign_codec{}, n, d_in, d_res, d_out, d_enc, d_ws);
  add(cs, topk, n, d_in, d_res, d_out, d_enc, d_ws);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int r = -1; r < rounds; ++r)
    for (auto& c : cs) {
      cudaEventRecord(a);
      c.run();
      cudaEventRecord(b);
      cudaEventSynchronize(b);
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      if (r >= 0) c.times.push_back(ms / 1e3);
    }
  const double bytes = double(n) * 4;
  const auto base = bench::summarize(cs[0].times);
  std::printf("# %zu MiB float input on the GPU, %d rounds interleaved; GB/s = input bytes / time\n", n * 4 >> 20,
              rounds);
  std::printf("%-18s %10s %10s %10s %12s\n", "contestant", "max_GBps", "med_GBps", "p99_GBps", "med/memcpy");
  for (auto& c : cs) {
    const auto s = bench::summarize(c.times);
    std::printf("%-18s %10.1f %10.1f %10.1f %11.0f%%\n", c.name.c_str(), bytes / s.min / 1e9, bytes / s.median / 1e9,
                bytes / s.p99 / 1e9, 100 * base.median / s.median);
    json.write("\"bench\":\"codec_gpu\",\"contestant\":\"" + c.name + "\",\"bytes\":" + std::to_string(n * 4) +
               ",\"median_s\":" + std::to_string(s.median) +
               ",\"ratio_vs_memcpy\":" + std::to_string(base.median / s.median));
  }
  return 0;
}
