// SPDX-License-Identifier: Apache-2.0
// Open MPI contestant: MPI_Allreduce in place (run under mpirun).
#include <mpi.h>

#include "bench_common.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  auto o = allreduce_bench::parse(argc, argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const char* label = std::getenv("BENCH_LABEL");
  allreduce_bench::contestant k{label ? label : "openmpi",
                                rank,
                                size,
                                [](float* p, std::size_t n) {
                                  MPI_Allreduce(MPI_IN_PLACE, p, static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                                                MPI_COMM_WORLD);
                                },
                                [] { MPI_Barrier(MPI_COMM_WORLD); },
                                [](long v) {
                                  MPI_Bcast(&v, 1, MPI_LONG, 0, MPI_COMM_WORLD);
                                  return v;
                                }};
  allreduce_bench::run(k, o);
  MPI_Finalize();
}
