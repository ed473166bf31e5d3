// SPDX-License-Identifier: Apache-2.0
// Latency of the compressed allreduce on small tensors, between real
// processes over UCX: an fp16 compressed_allreduce of a few KiB (below the
// dense threshold, so it is reduced dense). Rank and size come from the
// environment (EBBFLOW_RANK / EBBFLOW_WORLD_SIZE), addresses through the
// directory EBBFLOW_BENCH_DIR; small_allreduce.py launches the ranks and
// runs two builds of this file side by side. Rank 0 prints one JSON line per
// size: the per-call time of every sample (a sample batches calls until
// about 4 ms), after checking the result.
//
// This file also compiles against the headers of commits from before the
// compressed allreduce ran over the communicator (e.g. 4955b18), so that the
// two can be measured in one run.
//
//   small_allreduce [--sizes 4096,16384] [--samples 15] [--label NAME]
#include <ebbflow/comm/communicator.hpp>
#include <ebbflow/comm/ucx/address_exchange.hpp>
#include <ebbflow/comm/ucx/transport.hpp>
#include <ebbflow/compress.hpp>
#include <ebbflow/core/env.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace ef = ebbflow;
namespace cx = ebbflow::compress;
namespace ucx = ebbflow::comm::ucx;
using namespace std::chrono_literals;
using allreduce_t = cx::compressed_allreduce<cx::fp16_codec, ucx::transport>;

#if __has_include(<ebbflow/comm/nccl_communicator.hpp>)
// Over the communicator: small tensors are its allreduce.
using comm_t = ef::comm::transport_communicator<ucx::transport>;
std::unique_ptr<allreduce_t> make_allreduce(comm_t& c, ucx::transport&) {
  return std::make_unique<allreduce_t>(c, cx::fp16_codec{});
}
#else
// Before: over the transport, in a tag space of its own (the communicator's is another).
using comm_t = ef::comm::basic_communicator<ucx::transport>;
std::unique_ptr<allreduce_t> make_allreduce(comm_t&, ucx::transport& t) {
  return std::make_unique<allreduce_t>(t, cx::fp16_codec{});
}
#endif

int main(int argc, char** argv) try {
  std::vector<std::size_t> sizes;
  int samples = 15;
  std::string label = "ebbflow";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--sizes") {
      for (std::size_t p = 0; p < v.size();) {
        const auto q = v.find(',', p);
        sizes.push_back(std::stoull(v.substr(p, q - p)));
        p = q == std::string::npos ? v.size() : q + 1;
      }
    } else if (a == "--samples") {
      samples = std::stoi(v);
    } else if (a == "--label") {
      label = v;
    }
  }
  if (sizes.empty()) sizes = {4096};
  const auto li = ef::launch_info::from_environment();
  auto ctx = ucx::context::create();
  ucx::file_address_exchange ex(ef::env::get("EBBFLOW_BENCH_DIR").value_or("/tmp"));
  auto t = ucx::connect(ctx, ex, 0, li.rank, li.world_size, ef::deadline::after(60s));
  comm_t c(t);
  auto ar = make_allreduce(c, t);
  using clock = std::chrono::steady_clock;
  for (const std::size_t bytes : sizes) {
    const std::size_t n = bytes / 4;
    std::vector<float> g(n);
    // Check first: small integers, exact in any summation order and in fp16.
    for (std::size_t i = 0; i < n; ++i) g[i] = static_cast<float>(i % 7 + static_cast<std::size_t>(li.rank));
    ar->run(g);
    long wrong = 0;
    for (std::size_t i = 0; i < n; ++i)
      wrong += g[i] != static_cast<float>((i % 7) * static_cast<std::size_t>(li.world_size) +
                                          static_cast<std::size_t>(li.world_size * (li.world_size - 1) / 2));
    // Time on zeros (sums stay finite): the same traffic.
    std::fill(g.begin(), g.end(), 0.0f);
    c.barrier();
    const std::size_t wire0 = ar->stats().wire_bytes_sent;
    auto t0 = clock::now();
    ar->run(g);  // warm-up and estimate
    ar->run(g);
    const std::size_t wire = (ar->stats().wire_bytes_sent - wire0) / 2;
    const double est = std::chrono::duration<double>(clock::now() - t0).count() / 2;
    long k = std::max(1L, std::min(1000L, static_cast<long>(0.004 / std::max(est, 1e-7))));
    c.broadcast(ef::buffer_view{&k, sizeof k, ef::dtype::u8}, 0);  // every rank runs the same batch
    std::vector<double> us;
    for (int s = 0; s < samples; ++s) {
      c.barrier();
      const auto a = clock::now();
      for (long i = 0; i < k; ++i) ar->run(g);
      us.push_back(std::chrono::duration<double, std::micro>(clock::now() - a).count() / static_cast<double>(k));
    }
    if (li.rank == 0) {
      std::printf("{\"lib\":\"%s\",\"ranks\":%d,\"bytes\":%zu,\"batch\":%ld,\"wrong\":%ld,\"wire_bytes\":%zu,\"us\":[",
                  label.c_str(), li.world_size, bytes, k, wrong, wire);
      for (std::size_t i = 0; i < us.size(); ++i) std::printf("%s%.3f", i ? "," : "", us[i]);
      std::printf("]}\n");
      std::fflush(stdout);
    }
    if (wrong) std::fprintf(stderr, "rank %d: %ld wrong elements at %zu bytes\n", li.rank, wrong, bytes);
  }
  c.barrier();
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "small_allreduce: %s\n", e.what());
  return 1;
}
