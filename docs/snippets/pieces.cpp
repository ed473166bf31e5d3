// SPDX-License-Identifier: Apache-2.0
// One screen of use of each piece on its own, as docs/api.md and each
// piece's page (docs/comm.md, planner.md, compress.md, prefetch.md,
// store.md) show it: they quote the regions between the `// [name]` lines
// verbatim. The tests compile this file, run the planner, compression and
// prefetcher examples (`docs_pieces`), and check the quotes (tests/docs).
// The host collectives and the store need more than one process; they are
// compiled where UCX and Boost.Asio are present.
#include <ebbflow/comm/loopback_transport.hpp>
#include <ebbflow/compress.hpp>
#include <ebbflow/config.hpp>
#include <ebbflow/plan.hpp>
#include <ebbflow/prefetch/prefetcher.hpp>
#if EBBFLOW_HAS_UCX
#include <ebbflow/comm/communicator.hpp>
#include <ebbflow/comm/ucx/address_exchange.hpp>
#include <ebbflow/core/env.hpp>
#endif
#if EBBFLOW_HAS_ASIO
#include <ebbflow/elastic/tcp_store.hpp>
#endif

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

using namespace std::chrono_literals;

namespace {

// What a training loop does around the snippets (here: nothing much).
std::size_t loaded = 0;
void load(std::uint64_t) { ++loaded; }
// Every worker's compute seconds of the step, in rank order, as an allgather
// would give them (here: workers 1x, 2x and 3x slower).
std::vector<double> allgather_compute_seconds(const ebbflow::plan::batch_plan& plan) {
  std::vector<double> s;
  for (std::size_t i = 0; i < plan.size(); ++i)
    s.push_back(0.001 + 1e-4 * static_cast<double>((i + 1) * plan.batch[i]));
  return s;
}
std::size_t trained_on = 0;
template <class Bytes>
void train_on(std::size_t, Bytes, std::span<const std::size_t> samples) {
  trained_on += samples.size();
}
std::atomic<float> updated{0};
void apply_update(std::span<const float> grad) { updated = grad[0]; }
void read_and_decode(std::size_t sample, std::span<std::byte> dst) {
  std::memset(dst.data(), static_cast<int>(sample % 251), dst.size());
}

// The planner on its own, on rank r of a fixed group: returns the number of
// samples rank r loaded in `steps` steps.
std::size_t planner(std::size_t r, int steps) {
  const std::size_t dataset_size = 1000, B = 64, max_batch = 64;
  const std::vector<std::uint64_t> ids = {10, 11, 12};  // the workers' ids, rank order
  loaded = 0;
  // [planner]
  // #include <ebbflow/plan.hpp>
  namespace pl = ebbflow::plan;
  pl::worker_models models;                              // one cost model per worker id, the same on every rank
  pl::replanner planner;                                 // re-plans on drift: threshold 1 %, persist 3
  pl::epoch_sampler sampler(dataset_size, /*seed=*/42);  // every sample once per epoch
  for (int step = 0; step < steps; ++step) {
    // Workers without a fitted model get the others' mean; with none fitted, the plan is the uniform split.
    const pl::batch_plan& plan = planner.update(models.specs(ids, max_batch), sampler.step_size(B));
    for (std::uint64_t sample : sampler.slice(plan, r).indices()) load(sample);  // my samples, no communication
    // ... mean loss over my samples, backward, gradients *= plan.weight(r) (= b_r / B), allreduce, optimizer ...
    sampler.commit(plan);  // only once the step committed: a rolled-back step is redone
    const std::vector<double> seconds = allgather_compute_seconds(plan);  // every worker's, rank order
    for (std::size_t i = 0; i < ids.size(); ++i) models.observe(ids[i], plan.batch[i], seconds[i]);
  }
  // [planner]
  return loaded;
}

// Four ranks as threads over the in-process loopback transport.
float compress() {
  // [compress]
  // #include <ebbflow/compress.hpp>, <ebbflow/comm/loopback_transport.hpp>
  namespace cx = ebbflow::compress;
  // one thread per rank here; any comm::transport model works (UCX, ...)
  ebbflow::comm::spawn_loopback(4, [](ebbflow::comm::loopback_transport& t) {
    ebbflow::comm::transport_communicator comm(t);
    cx::compressed_allreduce<cx::int8_codec, ebbflow::comm::loopback_transport> ar(comm, cx::int8_codec{});
    std::vector<float> grad(1 << 16, 1.0f);
    for (int step = 0; step < 3; ++step) {
      ar.run(grad, /*tensor key*/ 0);  // grad = the sum over ranks, int8 on the wire
      apply_update(grad);
      std::fill(grad.begin(), grad.end(), 1.0f);  // the next step's gradient
    }
  });
  // [compress]
  return updated;
}

// The prefetcher: 10 steps of 32 samples over 2 devices (CPU stage).
std::size_t prefetch() {
  const std::size_t n_samples = 320;
  const auto planner_batch = [](std::uint64_t step) -> std::size_t { return step < 10 ? 32 : 0; };
  trained_on = 0;
  // [prefetch]
  // #include <ebbflow/prefetch/prefetcher.hpp>
  namespace pf = ebbflow::prefetch;
  pf::prefetch_options opt{.sample_bytes = 3 * 32 * 32,
                           .max_batch_samples = 256,
                           .depth = 3,
                           .loaders = 2,
                           .on_error = pf::error_policy::skip_step};
  auto load = [&](std::size_t sample, std::span<std::byte> dst, std::stop_token) {
    read_and_decode(sample, dst);  // user code, runs on loader threads
  };
  pf::prefetcher p(pf::sequence_source(n_samples, planner_batch, /*devices=*/2), load, pf::cpu_stage(2), opt);
  for (;;) {
    try {
      auto b = p.next(std::chrono::seconds(30));  // deadline: throws errc::timeout
      if (!b) break;                              // end of data or shutdown
      for (std::size_t d = 0; d < b.devices(); ++d)
        train_on(d, b.data(d), b.indices(d));  // data(d): sizes()[d] * sample_bytes bytes
    } catch (const pf::load_error& e) {        // "prefetch: data load failed (step 3, sample 17: ...)"
      std::fprintf(stderr, "%s\n", e.what());  // skip_step: the next call goes on
    }
  }  // each batch goes back to the pool when it goes out of scope (RAII)
  // [prefetch]
  return trained_on;
}

#if EBBFLOW_HAS_UCX
// Host collectives over UCX, without the elastic group: one process per rank
// (ebbflow-run -n N), addresses exchanged through a shared folder.
[[maybe_unused]] void host_collectives(const std::filesystem::path& dir, std::vector<float>& grad) {
  // [comm]
  // #include <ebbflow/comm/communicator.hpp>, <ebbflow/comm/ucx/address_exchange.hpp>
  const auto li = ebbflow::launch_info::from_environment();  // EBBFLOW_RANK, EBBFLOW_WORLD_SIZE, ...
  ebbflow::comm::ucx::file_address_exchange exchange(dir);   // or the rendezvous store
  auto ctx = ebbflow::comm::ucx::context::create();
  auto t = ebbflow::comm::ucx::connect(ctx, exchange, /*generation=*/0, li.rank, li.world_size,
                                       ebbflow::deadline::after(30s));
  ebbflow::comm::transport_communicator comm(t);
  comm.allreduce(ebbflow::view(std::span(grad)), ebbflow::reduce_op::sum, ebbflow::deadline::after(10s));
  // [comm]
}
#endif

#if EBBFLOW_HAS_ASIO
// The rendezvous store: a client under ebbflow-run, and a server embedded.
[[maybe_unused]] std::string store(const std::string& my_ucx_address) {
  // [store]
  // #include <ebbflow/elastic/tcp_store.hpp>
  namespace el = ebbflow::elastic;
  // Under ebbflow-run (EBBFLOW_STORE, EBBFLOW_TOKEN, EBBFLOW_RANK... are set):
  auto store = el::store_client::from_environment();
  auto me = ebbflow::launch_info::from_environment();
  store.set("addr/" + std::to_string(me.rank), my_ucx_address);  // binary-safe
  std::vector<std::string> keys;
  for (int r = 0; r < me.world_size; ++r) keys.push_back("addr/" + std::to_string(r));
  store.wait(keys, ebbflow::deadline::after(30s));  // server-side wait
  std::string peer = store.get("addr/0");

  // Embedding a server yourself:
  el::server_options o;
  o.token = "secret";
  o.port = 0;                  // 0: pick a free port
  el::store_server server(o);  // own thread
  ::setenv("EBBFLOW_STORE", server.address().c_str(), 1);
  // [store]
  return peer;
}
#endif

}  // namespace

// Runs the examples that need one process: the planner, the compressed
// allreduce and the prefetcher; exits 1 when one gives a wrong result.
int main() try {
  const std::size_t trained = planner(1, 40);
  const float sum = compress();  // of the last step
  const std::size_t prefetched = prefetch();
  std::printf("planner: rank 1 trained %zu samples in 40 steps; compressed sum %.3f; prefetched %zu samples\n", trained,
              static_cast<double>(sum), prefetched);
  // Rank 1 (2x slower than rank 0, faster than rank 2) gets less than rank 0 once the models fit.
  const bool ok = trained > 0 && trained < 40 * 64 / 2 && sum > 3.9f && sum < 4.1f && prefetched == 320;
  return ok ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "pieces: %s\n", e.what());
  return 1;
}
