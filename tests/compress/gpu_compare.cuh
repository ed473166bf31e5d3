// SPDX-License-Identifier: Apache-2.0
// Helpers of the compress GPU tests: run one codec on the CPU executor and on
// the CUDA executor with the same inputs and compare the bytes.
#pragma once

#include <ebbflow/compress.hpp>
#include <ebbflow/exec/cuda_executor.cuh>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

namespace gpu_compare {
namespace ef = ebbflow;
namespace cx = ebbflow::compress;

inline bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

//! Device copy of a host vector (RAII).
template <class T>
struct dbuf {
  T* p = nullptr;
  std::size_t n = 0;
  explicit dbuf(std::size_t count) : n(count) {
    if (cudaMalloc(&p, std::max<std::size_t>(1, n) * sizeof(T)) != cudaSuccess) p = nullptr;
    cudaMemset(p, 0, std::max<std::size_t>(1, n) * sizeof(T));
  }
  explicit dbuf(const std::vector<T>& h) : dbuf(h.size()) {
    if (n) cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~dbuf() { cudaFree(p); }
  dbuf(const dbuf&) = delete;
  dbuf& operator=(const dbuf&) = delete;
  std::vector<T> host() const {
    std::vector<T> h(n);
    if (n) cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
};

inline std::vector<float> normal_vec(std::size_t n, unsigned seed, float mean = 0.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(mean, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

//! Encodes (with or without residual), decodes and decode-adds on both
//! executors; every output must be bit-identical.
template <class Codec>
void compare_codec(const Codec& c, std::size_t n, bool with_residual, unsigned seed) {
  const auto in = normal_vec(n, seed), res0 = normal_vec(n, seed + 1000), acc0 = normal_vec(n, seed + 2000);
  const std::size_t eb = c.max_encoded_bytes(n), wb = c.workspace_bytes(n) + 8;
  cx::encode_context ctx{1234, seed};
  // CPU
  ef::exec::cpu_executor hx;
  std::vector<float> h_res = res0, h_dec(n), h_acc = acc0;
  std::vector<std::byte> h_enc(eb), h_ws(wb);
  ctx.workspace = h_ws.data();
  c.encode(hx, in.data(), with_residual ? h_res.data() : nullptr, h_enc.data(), n, ctx);
  c.decode(hx, h_enc.data(), h_dec.data(), n);
  c.decode_add(hx, h_enc.data(), h_acc.data(), n);
  // GPU
  ef::exec::cuda_executor dx;
  dbuf<float> d_in(in), d_res(res0), d_dec(n), d_acc(acc0);
  dbuf<std::byte> d_enc(eb), d_ws(wb);
  ctx.workspace = d_ws.p;
  c.encode(dx, d_in.p, with_residual ? d_res.p : nullptr, d_enc.p, n, ctx);
  c.decode(dx, d_enc.p, d_dec.p, n);
  c.decode_add(dx, d_enc.p, d_acc.p, n);
  dx.wait();
  ASSERT_EQ(d_enc.host(), h_enc) << c.name() << " n=" << n;
  const auto bits_eq = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
  };
  EXPECT_TRUE(bits_eq(d_res.host(), h_res)) << c.name() << " residual, n=" << n;
  EXPECT_TRUE(bits_eq(d_dec.host(), h_dec)) << c.name() << " decode, n=" << n;
  EXPECT_TRUE(bits_eq(d_acc.host(), h_acc)) << c.name() << " decode_add, n=" << n;
}

inline const std::vector<std::size_t>& sizes() {
  static const std::vector<std::size_t> s{1, 7, 255, 256, 257, 4099, 100003};
  return s;
}

//! `compare_codec` of each of `codecs` (seeds `first_seed`, +1, ...) at every size, with and without residual.
template <class... Codecs>
void compare_codecs(unsigned first_seed, const Codecs&... codecs) {
  for (std::size_t n : sizes())
    for (bool ef : {false, true}) {
      unsigned seed = first_seed;
      (compare_codec(codecs, n, ef, seed++), ...);
    }
}
}  // namespace gpu_compare
