// SPDX-License-Identifier: Apache-2.0
// examples/allreduce.cpp compiled by nvcc with its device half: the same
// `sum_ranks` over a host communicator (UCX) and an NCCL communicator.
#define EBBFLOW_EXAMPLE_DEVICE 1
#include "../allreduce.cpp"
