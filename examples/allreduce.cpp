// SPDX-License-Identifier: Apache-2.0
// The smallest useful ebbflow program: every rank contributes its rank + 1,
// all ranks get the sum. Rank and world size come from the launcher's
// environment (EBBFLOW_RANK / EBBFLOW_WORLD_SIZE, or torchrun / Open MPI /
// Slurm variables); UCX worker addresses are exchanged through a fresh
// directory shared by all ranks (EBBFLOW_ADDR_DIR).
//
//   d=$(mktemp -d); for r in 0 1 2; do
//     EBBFLOW_RANK=$r EBBFLOW_WORLD_SIZE=3 EBBFLOW_ADDR_DIR=$d ./example_allreduce & done; wait
#include <ebbflow/comm/communicator.hpp>
#include <ebbflow/comm/ucx/address_exchange.hpp>
#include <ebbflow/core/env.hpp>

#include <cstdio>
#include <vector>

int main() try {
  namespace ef = ebbflow;
  using namespace std::chrono_literals;
  const auto li = ef::launch_info::from_environment();
  ef::comm::ucx::file_address_exchange exchange(ef::env::get("EBBFLOW_ADDR_DIR").value_or("/tmp"));
  auto ctx = ef::comm::ucx::context::create();
  auto transport =
      ef::comm::ucx::connect(ctx, exchange, /*generation=*/0, li.rank, li.world_size, ef::deadline::after(30s));
  ef::comm::basic_communicator comm(transport);

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
