// SPDX-License-Identifier: Apache-2.0
// Gloo contestant: AllreduceRing or AllreduceHalvingDoubling over Gloo's TCP
// transport on 127.0.0.1, rendezvous through a FileStore. Rank and size from
// EBBFLOW_RANK / EBBFLOW_WORLD_SIZE; algorithm from argv ("ring" | "hd").
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/broadcast_one_to_all.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include "bench_common.hpp"

#include <memory>

int main(int argc, char** argv) {
  auto o = allreduce_bench::parse(argc, argv);
  const int rank = std::atoi(std::getenv("EBBFLOW_RANK"));
  const int size = std::atoi(std::getenv("EBBFLOW_WORLD_SIZE"));
  const std::string algo = argc > 1 && std::string(argv[argc - 1]) == "hd" ? "hd" : "ring";
  gloo::transport::tcp::attr attr;
  const char* host = std::getenv("GLOO_HOSTNAME");  // the veth address in the namespace runs
  attr.hostname = host ? host : "127.0.0.1";
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(std::getenv("EBBFLOW_BENCH_DIR"));
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  ctx->connectFullMesh(store, dev);
  // Gloo algorithms bind to one buffer: cache one instance per (ptr, count).
  std::unique_ptr<gloo::Algorithm> op;
  float* op_ptr = nullptr;
  std::size_t op_count = 0;
  long bval = 0;
  gloo::BroadcastOneToAll<long> bc(ctx, {&bval}, 1, 0);
  gloo::BarrierAllToAll barrier(ctx);
  allreduce_bench::contestant k{"gloo_" + algo,
                                rank,
                                size,
                                [&](float* p, std::size_t n) {
                                  if (p != op_ptr || n != op_count) {
                                    if (algo == "hd")
                                      op = std::make_unique<gloo::AllreduceHalvingDoubling<float>>(
                                          ctx, std::vector<float*>{p}, static_cast<int>(n));
                                    else
                                      op = std::make_unique<gloo::AllreduceRing<float>>(ctx, std::vector<float*>{p},
                                                                                        static_cast<int>(n));
                                    op_ptr = p;
                                    op_count = n;
                                  }
                                  op->run();
                                },
                                [&] { barrier.run(); },
                                [&](long v) {
                                  bval = v;
                                  bc.run();
                                  return bval;
                                }};
  allreduce_bench::run(k, o);
  barrier.run();
}
