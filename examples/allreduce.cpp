// SPDX-License-Identifier: Apache-2.0
// The smallest useful ebbflow program: every rank contributes its rank + 1,
// all ranks get the sum. Rank and world size come from the launcher's
// environment (EBBFLOW_RANK / EBBFLOW_WORLD_SIZE, or torchrun / Open MPI /
// Slurm variables). UCX worker addresses go through the rendezvous store
// when there is one (EBBFLOW_STORE, set by ebbflow-run):
//
//   ebbflow-run -n 3 -- ./example_allreduce
//
// or else through a fresh directory shared by all ranks (EBBFLOW_ADDR_DIR):
//
//   d=$(mktemp -d); for r in 0 1 2; do
//     EBBFLOW_RANK=$r EBBFLOW_WORLD_SIZE=3 EBBFLOW_ADDR_DIR=$d ./example_allreduce & done; wait
#include <ebbflow/comm/communicator.hpp>
#include <ebbflow/comm/ucx/address_exchange.hpp>
#include <ebbflow/core/env.hpp>
#if EBBFLOW_EXAMPLE_STORE
#include <ebbflow/elastic/store.hpp>
#include <ebbflow/elastic/store_address_exchange.hpp>
#endif

#include <cstdio>
#include <optional>
#include <vector>

int main() try {
  namespace ef = ebbflow;
  using namespace std::chrono_literals;
  const auto li = ef::launch_info::from_environment();
  auto ctx = ef::comm::ucx::context::create();
  const auto connect = [&](auto& exchange) {
    return ef::comm::ucx::connect(ctx, exchange, /*generation=*/0, li.rank, li.world_size, ef::deadline::after(30s));
  };
  std::optional<ef::comm::ucx::transport> transport;
#if EBBFLOW_EXAMPLE_STORE
  if (ef::env::get("EBBFLOW_STORE")) {
    auto store = ef::elastic::store_client::from_environment();
    // The job's own key prefix: a store may serve several jobs.
    ef::elastic::store_address_exchange exchange(store, ef::env::get("EBBFLOW_JOB").value_or("ebbflow") + "/example");
    transport.emplace(connect(exchange));
  }
#endif
  if (!transport) {
    // A directory that held an earlier run's addresses would connect to
    // processes that are gone: it must be fresh, so there is no default.
    const auto dir = ef::env::get("EBBFLOW_ADDR_DIR");
    if (!dir) {
      std::fprintf(stderr,
                   "allreduce example: rank %d: no EBBFLOW_STORE (run under ebbflow-run) and no EBBFLOW_ADDR_DIR "
                   "(a fresh directory shared by all ranks, e.g. from mktemp -d)\n",
                   li.rank);
      return 2;
    }
    ef::comm::ucx::file_address_exchange exchange(*dir);
    transport.emplace(connect(exchange));
  }
  ef::comm::basic_communicator comm(*transport);

  std::vector<float> grad(1 << 20, static_cast<float>(li.rank + 1));
  comm.allreduce(ef::view(std::span(grad)), ef::reduce_op::sum, ef::deadline::after(10s));
  std::printf("rank %d of %d: grad[0] = %g (expected %d)\n", li.rank, li.world_size, grad[0],
              li.world_size * (li.world_size + 1) / 2);
  comm.barrier();
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "allreduce example: %s\n", e.what());
  return 1;
}
