// SPDX-License-Identifier: Apache-2.0
// The smallest useful ebbflow program: every rank contributes its rank + 1,
// all ranks get the sum; once in host memory (over UCX) and, in the device
// build, once in device memory (over NCCL), with the same calls:
// `sum_ranks` is written once against the `comm::communicator` concept.
//
// Rank and world size come from the launcher's environment (EBBFLOW_RANK /
// EBBFLOW_WORLD_SIZE, or torchrun / Open MPI / Slurm variables). UCX worker
// addresses go through the rendezvous store when there is one (EBBFLOW_STORE,
// set by ebbflow-run):
//
//   ebbflow-run -n 3 -- ./example_allreduce
//
// or else through a fresh directory shared by all ranks (EBBFLOW_ADDR_DIR;
// a single rank makes its own):
//
//   d=$(mktemp -d); for r in 0 1 2; do
//     EBBFLOW_RANK=$r EBBFLOW_WORLD_SIZE=3 EBBFLOW_ADDR_DIR=$d ./example_allreduce & done; wait
//
// example_allreduce_device is this file compiled by nvcc with NCCL
// (allreduce/allreduce_device.cu): after the host allreduce it runs the
// device one, one GPU per rank (local rank modulo the devices), the NCCL id
// broadcast by the host communicator. Without a CUDA device it says so and
// skips it. It takes addresses through EBBFLOW_ADDR_DIR only (nvcc cannot
// compile the store's Boost.Asio headers).
#include <ebbflow/comm/communicator.hpp>
#include <ebbflow/comm/ucx/address_exchange.hpp>
#include <ebbflow/core/env.hpp>
#if EBBFLOW_EXAMPLE_STORE
#include <ebbflow/elastic/store.hpp>
#include <ebbflow/elastic/store_address_exchange.hpp>
#endif
#if EBBFLOW_EXAMPLE_DEVICE
#include <ebbflow/comm/nccl_communicator.hpp>
#endif

#include <stdlib.h>  // mkdtemp

#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace ef = ebbflow;
using namespace std::chrono_literals;

// Sums `grad` over the ranks of `comm`, in place, then waits for every rank:
// the same calls whether `grad` is host memory and `comm` a host
// communicator, or device memory and `comm` an NCCL communicator.
template <ef::comm::communicator Comm>
void sum_ranks(Comm& comm, ef::buffer_view grad) {
  comm.allreduce(grad, grad, ef::reduce_op::sum, ef::deadline::after(10s));
  comm.barrier(ef::deadline::after(10s));
}

#if EBBFLOW_EXAMPLE_DEVICE
// The device half: the same `sum_ranks` on device memory over NCCL.
template <class HostComm>
int device_allreduce(HostComm& host, const ef::launch_info& li, std::size_t n) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("rank %d: no CUDA device: the device allreduce is skipped\n", li.rank);
    return 0;
  }
  if (cudaSetDevice(li.local_rank % devices) != cudaSuccess) return 1;
  ef::comm::nccl_unique_id id{};
  if (li.rank == 0) id = ef::comm::make_nccl_unique_id();
  host.broadcast(ef::buffer_view{id.data(), id.size(), ef::dtype::u8}, 0, ef::deadline::after(10s));
  cudaStream_t stream = nullptr;
  if (cudaStreamCreate(&stream) != cudaSuccess) return 1;
  auto comm = ef::comm::nccl_communicator::init(li.rank, li.world_size, 0, id, {.stream = stream});
  std::vector<float> h(n, static_cast<float>(li.rank + 1));
  float* d = nullptr;
  if (cudaMalloc(&d, n * sizeof(float)) != cudaSuccess) return 1;
  cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  sum_ranks(comm, ef::view(ef::device_span<float>(d, n)));
  cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost);
  std::printf("rank %d of %d: device grad[0] = %g (expected %d)\n", li.rank, li.world_size, h[0],
              li.world_size * (li.world_size + 1) / 2);
  cudaFree(d);
  cudaStreamDestroy(stream);
  return h[0] == static_cast<float>(li.world_size * (li.world_size + 1) / 2) ? 0 : 1;
}
#endif

int main() try {
  const auto li = ef::launch_info::from_environment();
  auto ctx = ef::comm::ucx::context::create();
  // How long to wait for every rank's address: EBBFLOW_STORE_TIMEOUT_MS, as
  // for the store's own calls (30 s when unset).
  const auto wait_for_peers = ef::env::get_ms("EBBFLOW_STORE_TIMEOUT_MS", std::chrono::milliseconds(30s), 1);
  const auto connect = [&](auto& exchange) {
    return ef::comm::ucx::connect(ctx, exchange, /*generation=*/0, li.rank, li.world_size,
                                  ef::deadline::after(wait_for_peers));
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
    // processes that are gone: it must be fresh, so there is no default
    // (but one rank alone can make its own).
    auto dir = ef::env::get("EBBFLOW_ADDR_DIR");
    std::string own = "/tmp/ebbflow-example-XXXXXX";
    if (!dir && li.world_size == 1 && ::mkdtemp(own.data())) dir = own;
    if (!dir) {
      std::fprintf(stderr,
                   "allreduce example: rank %d: no EBBFLOW_STORE (run under ebbflow-run) and no EBBFLOW_ADDR_DIR "
                   "(a fresh directory shared by all ranks, e.g. from mktemp -d)\n",
                   li.rank);
      return 2;
    }
    ef::comm::ucx::file_address_exchange exchange(*dir);
    transport.emplace(connect(exchange));
    if (*dir == own) std::filesystem::remove_all(own);
  }
  ef::comm::transport_communicator comm(*transport);

  std::vector<float> grad(1 << 20, static_cast<float>(li.rank + 1));
  sum_ranks(comm, ef::view(std::span(grad)));
  std::printf("rank %d of %d: grad[0] = %g (expected %d)\n", li.rank, li.world_size, grad[0],
              li.world_size * (li.world_size + 1) / 2);
#if EBBFLOW_EXAMPLE_DEVICE
  return device_allreduce(comm, li, grad.size());
#else
  return 0;
#endif
} catch (const std::exception& e) {
  std::fprintf(stderr, "allreduce example: %s\n", e.what());
  return 1;
}
