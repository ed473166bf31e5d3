// SPDX-License-Identifier: Apache-2.0
// GPU test of the elastic NCCL communicator. Skips without a CUDA device.
// With one GPU, NCCL allows one rank per device, so multi-rank behaviour
// (shrink after a failure) is exercised by the elastic GPU run in tests/gpu.
#include <ebbflow/comm/nccl/communicator.hpp>

#include <gtest/gtest.h>

#include <vector>

namespace ef = ebbflow;
namespace nccl = ef::comm::nccl;
using namespace std::chrono_literals;

namespace {
bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
}  // namespace

TEST(NcclCommunicator, MapsTypesAndOps) {
  EXPECT_EQ(nccl::to_nccl(ef::dtype::bf16), ncclBfloat16);
  EXPECT_EQ(nccl::to_nccl(ef::reduce_op::avg), ncclAvg);
  EXPECT_EQ(std::error_code(ncclRemoteError, ef::nccl_category()), ef::errc::peer_lost);
}

TEST(NcclCommunicator, SingleRankCollectivesRevokeAndBadInput) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  auto id = nccl::make_unique_id();
  auto comm = nccl::communicator::init(0, 1, 7, id);
  EXPECT_EQ(comm.size(), 1);
  EXPECT_EQ(comm.generation(), 7);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  const std::size_t n = (1 << 20) + 3;
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, n * sizeof(float)), cudaSuccess);
  std::vector<float> h(n, 1.5f);
  cudaMemcpy(d, h.data(), n * 4, cudaMemcpyHostToDevice);
  comm.allreduce(d, d, n, ef::dtype::f32, ef::reduce_op::sum, s, ef::deadline::after(10s));
  comm.broadcast(d, n, ef::dtype::f32, 0, s, ef::deadline::after(10s));
  cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost);
  EXPECT_EQ(h[n - 1], 1.5f);
  EXPECT_THROW(comm.broadcast(d, n, ef::dtype::f32, 3, s, ef::deadline::after(1s)), std::invalid_argument);
  comm.revoke();
  try {
    comm.allreduce(d, d, n, ef::dtype::f32, ef::reduce_op::sum, s, ef::deadline::after(1s));
    FAIL();
  } catch (const ef::system_error& e) {
    EXPECT_EQ(e.code(), ef::errc::revoked);
    EXPECT_EQ(e.generation(), 7);
  }
  cudaFree(d);
  cudaStreamDestroy(s);
}
