// SPDX-License-Identifier: Apache-2.0
// ebbflow contestant: UCX transport + host communicator (transport_communicator).
// Rank and size from the environment (ebbflow-run / the driver), addresses
// through a directory.
#include <ebbflow/comm/communicator.hpp>
#include <ebbflow/comm/shared_memory.hpp>
#include <ebbflow/comm/ucx/address_exchange.hpp>
#include <ebbflow/core/env.hpp>

#include "bench_common.hpp"

namespace ef = ebbflow;
namespace ucx = ebbflow::comm::ucx;
using namespace std::chrono_literals;

int main(int argc, char** argv) {
  auto o = allreduce_bench::parse(argc, argv);
  const auto li = ef::launch_info::from_environment();
  auto ctx = ucx::context::create();
  ucx::file_address_exchange ex(ef::env::get("EBBFLOW_BENCH_DIR").value_or("/tmp"));
  auto t = ucx::connect(ctx, ex, 0, li.rank, li.world_size, ef::deadline::after(60s));
  ef::comm::transport_communicator<ucx::transport> c(t, ef::comm::collective_options::from_environment());
  // EBBFLOW_BENCH_SHARED=1: the buffer is a registered comm::shared_buffer
  // (peers on this host map it: zero-copy allreduce).
  const bool shared = ef::env::get("EBBFLOW_BENCH_SHARED").value_or("0") == "1";
  ef::comm::shared_buffer shm;
  allreduce_bench::contestant k{shared ? "ebbflow_shm" : "ebbflow",
                                li.rank,
                                li.world_size,
                                [&](float* p, std::size_t n) {
                                  c.allreduce(ef::buffer_view{p, n, ef::dtype::f32}, ef::reduce_op::sum);
                                },
                                [&] { c.barrier(); },
                                [&](long v) {
                                  c.broadcast(ef::buffer_view{&v, sizeof v, ef::dtype::u8}, 0);
                                  return v;
                                }};
  if (shared)
    k.alloc = [&](std::size_t n) {
      shm = ef::comm::shared_buffer::allocate(n * sizeof(float));
      return shm.as<float>().data();
    };
  allreduce_bench::run(k, o);
  c.barrier();
}
