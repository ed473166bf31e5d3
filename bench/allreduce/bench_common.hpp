// SPDX-License-Identifier: Apache-2.0
// Shared skeleton of the allreduce contestants (ebbflow, Open MPI, Gloo):
// the same sizes, data, correctness check and timing loop, so only the
// allreduce call differs. Each contestant prints one JSON line per size on
// rank 0; bench/allreduce/run_allreduce_bench.py interleaves and tabulates.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace allreduce_bench {

struct options {
  std::vector<std::size_t> sizes;  // bytes (multiples of 4: f32)
  int samples = 7;
  double sample_seconds = 0.004;  // a sample batches ops until roughly this long
};

inline options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--sizes" && i + 1 < argc) {
      std::string s = argv[++i];
      std::size_t p = 0;
      while (p < s.size()) {
        auto q = s.find(',', p);
        o.sizes.push_back(std::stoull(s.substr(p, q - p)));
        p = q == std::string::npos ? s.size() : q + 1;
      }
    } else if (a == "--samples" && i + 1 < argc) {
      o.samples = std::atoi(argv[++i]);
    }
  }
  if (o.sizes.empty())
    for (std::size_t b = 4096; b <= (std::size_t{256} << 20); b *= 4) o.sizes.push_back(b);
  return o;
}

//! `allreduce(ptr, count)` sums in place over all ranks; `barrier()`;
//! `bcast_int(v)` returns rank 0's value (to agree on the batch size).
struct contestant {
  std::string name;
  int rank, size;
  std::function<void(float*, std::size_t)> allreduce;
  std::function<void()> barrier;
  std::function<long(long)> bcast_long;
  //! Optional: memory for the buffer (e.g. registered shared memory); default a std::vector.
  std::function<float*(std::size_t)> alloc = {};
};

inline void run(const contestant& c, const options& o) {
  using clock = std::chrono::steady_clock;
  std::size_t max_bytes = *std::max_element(o.sizes.begin(), o.sizes.end());
  std::vector<float> vec;
  float* const buf = c.alloc ? c.alloc(max_bytes / 4) : (vec.resize(max_bytes / 4), vec.data());
  for (std::size_t bytes : o.sizes) {
    const std::size_t count = bytes / 4;
    // Check first: small integers, exact in any summation order.
    for (std::size_t i = 0; i < count; ++i) buf[i] = static_cast<float>((i % 7) + static_cast<std::size_t>(c.rank));
    c.allreduce(buf, count);
    long wrong = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const double want = static_cast<double>(i % 7) * c.size + c.size * (c.size - 1) / 2.0;
      wrong += buf[i] != static_cast<float>(want);
    }
    // Time on zeros (sums stay finite); same memory traffic.
    std::fill(buf, buf + count, 0.0f);
    c.barrier();
    auto t0 = clock::now();
    c.allreduce(buf, count);  // warm-up and estimate
    c.allreduce(buf, count);
    const double est = std::chrono::duration<double>(clock::now() - t0).count() / 2;
    long k = std::max(1L, std::min(1000L, static_cast<long>(o.sample_seconds / std::max(est, 1e-7))));
    k = c.bcast_long(k);
    std::vector<double> us;
    for (int s = 0; s < o.samples; ++s) {
      c.barrier();
      auto a = clock::now();
      for (long i = 0; i < k; ++i) c.allreduce(buf, count);
      us.push_back(std::chrono::duration<double, std::micro>(clock::now() - a).count() / static_cast<double>(k));
    }
    if (c.rank == 0) {
      std::printf("{\"lib\":\"%s\",\"ranks\":%d,\"bytes\":%zu,\"batch\":%ld,\"wrong\":%ld,\"us\":[", c.name.c_str(),
                  c.size, bytes, k, wrong);
      for (std::size_t i = 0; i < us.size(); ++i) std::printf("%s%.3f", i ? "," : "", us[i]);
      std::printf("]}\n");
      std::fflush(stdout);
    }
    if (wrong)
      std::fprintf(stderr, "%s rank %d: %ld wrong elements at %zu bytes\n", c.name.c_str(), c.rank, wrong, bytes);
  }
}

}  // namespace allreduce_bench
