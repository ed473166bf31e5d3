// SPDX-License-Identifier: Apache-2.0
// The NCCL communicator. What needs no device (the concept, the mapping of
// types and ops, the refusal of host memory and of bad arguments) runs
// everywhere; the collectives (NcclDevice.*) skip without a CUDA device. With one GPU, NCCL
// allows one rank per device, so multi-rank behaviour (shrink after a
// failure) is exercised by the elastic GPU run in tests/gpu.
#include <ebbflow/comm/nccl_communicator.hpp>
#include <ebbflow/comm/nccl/communicator.hpp>  // the former names

#include <gtest/gtest.h>

#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace ef = ebbflow;
using ef::comm::nccl_communicator;
using namespace std::chrono_literals;

static_assert(ef::comm::communicator<nccl_communicator>);
static_assert(std::is_same_v<ef::comm::nccl::communicator, nccl_communicator>);

namespace {
bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
}  // namespace

TEST(NcclCommunicator, MapsTypesAndOps) {
  const std::pair<ef::dtype, ncclDataType_t> types[] = {{ef::dtype::f32, ncclFloat32}, {ef::dtype::f64, ncclFloat64},
                                                        {ef::dtype::f16, ncclFloat16}, {ef::dtype::bf16, ncclBfloat16},
                                                        {ef::dtype::i32, ncclInt32},   {ef::dtype::i64, ncclInt64},
                                                        {ef::dtype::u8, ncclUint8}};
  for (auto [t, want] : types) EXPECT_EQ(ef::comm::to_nccl(t), want) << ef::name(t);
  const std::pair<ef::reduce_op, ncclRedOp_t> ops[] = {{ef::reduce_op::sum, ncclSum},
                                                       {ef::reduce_op::avg, ncclAvg},
                                                       {ef::reduce_op::min, ncclMin},
                                                       {ef::reduce_op::max, ncclMax},
                                                       {ef::reduce_op::prod, ncclProd}};
  for (auto [op, want] : ops) EXPECT_EQ(ef::comm::to_nccl(op), want) << ef::name(op);
  EXPECT_EQ(std::error_code(ncclRemoteError, ef::nccl_category()), ef::errc::peer_lost);
}

// Host memory given to NCCL is refused before anything is enqueued, naming
// its space, by the throwing forms (std::invalid_argument) and their twins
// (std::errc::invalid_argument). No device needed: the check comes first.
TEST(NcclCommunicator, RefusesHostMemoryNamingTheSpace) {
  nccl_communicator c;
  std::vector<float> h(8);
  const auto d = ef::deadline::after(1s);
  try {
    c.allreduce(ef::view(std::span(h)), ef::reduce_op::sum, d);
    ADD_FAILURE() << "a host buffer was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("allreduce input must be device memory, got host"), std::string::npos)
        << e.what();
  }
  const ef::buffer_view pinned{h.data(), 8, ef::dtype::f32, ef::memory_space::pinned};
  try {
    c.broadcast(pinned, 0, d);
    ADD_FAILURE() << "a pinned buffer was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("got pinned"), std::string::npos) << e.what();
  }
  const ef::buffer_view dev{h.data(), 8, ef::dtype::f32, ef::memory_space::device};  // never dereferenced
  std::error_code ec;
  c.allgather(dev, ef::view(std::span(h)), d, ec);
  EXPECT_EQ(ec, std::errc::invalid_argument);
  c.reduce_scatter(ef::view(std::span(h)), dev, ef::reduce_op::sum, d, ec);
  EXPECT_EQ(ec, std::errc::invalid_argument);
  // A device view reaches the communicator, which is empty: revoked.
  c.allreduce(dev, ef::reduce_op::sum, d, ec);
  EXPECT_EQ(ec, ef::errc::revoked);
  c.barrier(d, ec);
  EXPECT_EQ(ec, ef::errc::revoked);
  EXPECT_THROW(c.barrier(d), ef::system_error);
}

TEST(NcclCommunicator, AStreamSetAtInitOrLaterIsTheOneCollectivesUse) {
  nccl_communicator c;
  EXPECT_EQ(c.stream(), nullptr);
  const auto s = reinterpret_cast<cudaStream_t>(0x10);  // never used: the communicator is empty
  c.set_stream(s);
  EXPECT_EQ(c.stream(), s);
  nccl_communicator moved(std::move(c));
  EXPECT_EQ(moved.stream(), s);
  EXPECT_FALSE(c.valid());  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  EXPECT_EQ(c.size(), 0);   // NOLINT(bugprone-use-after-move)
}

TEST(NcclDevice, SingleRankCollectivesRevokeAndBadInput) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  auto id = ef::comm::make_nccl_unique_id();
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  auto comm = nccl_communicator::init(0, 1, 7, id, {.stream = s});
  EXPECT_EQ(comm.size(), 1);
  EXPECT_EQ(comm.generation(), 7);
  EXPECT_EQ(comm.stream(), s);
  const std::size_t n = (1 << 20) + 3;
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 2 * n * sizeof(float)), cudaSuccess);
  const ef::device_span<float> all(d, 2 * n), buf = all.subspan(0, n), other = all.subspan(n, n);
  std::vector<float> h(n, 1.5f);
  cudaMemcpy(d, h.data(), n * 4, cudaMemcpyHostToDevice);
  comm.allreduce(ef::view(buf), ef::reduce_op::sum, ef::deadline::after(10s));
  comm.allreduce(ef::view(buf), ef::view(other), ef::reduce_op::max, ef::deadline::after(10s));
  comm.broadcast(ef::view(buf), 0, ef::deadline::after(10s));
  comm.allgather(ef::view(buf), ef::view(other), ef::deadline::after(10s));
  comm.reduce_scatter(ef::view(other), ef::view(buf), ef::reduce_op::sum, ef::deadline::after(10s));
  comm.barrier(ef::deadline::after(10s));
  cudaMemcpy(h.data(), d + n, n * 4, cudaMemcpyDeviceToHost);
  EXPECT_EQ(h[n - 1], 1.5f);
  EXPECT_THROW(comm.broadcast(ef::view(buf), 3, ef::deadline::after(1s)), std::invalid_argument);
  comm.revoke();
  try {
    comm.allreduce(ef::view(buf), ef::reduce_op::sum, ef::deadline::after(1s));
    FAIL();
  } catch (const ef::system_error& e) {
    EXPECT_EQ(e.code(), ef::errc::revoked);
    EXPECT_EQ(e.generation(), 7);
  }
  cudaFree(d);
  cudaStreamDestroy(s);
}
