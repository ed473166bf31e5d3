// SPDX-License-Identifier: Apache-2.0
// plan/work_stealing.hpp over the wire: every worker thread has its own
// elastic::store_client of a real Boost.Asio store server on loopback, so
// each claim is a real TCP round trip, serialised only by the server.
#include "work_stealing_check.hpp"

#include <ebbflow/elastic/tcp_store.hpp>
#include <ebbflow/plan.hpp>

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

namespace el = ebbflow::elastic;
namespace pl = ebbflow::plan;
using namespace std::chrono_literals;

namespace {

static_assert(pl::counter_store<el::store_client>);

const std::string token = "work-stealing-test-token";

el::server_options options() {
  el::server_options o;
  o.token = token;
  return o;
}

TEST(WorkStealingStore, ExactlyOnceOverTcp) {
  el::store_server srv(options());
  std::mt19937_64 rng(7);
  std::uint64_t stolen = 0;
  for (int t = 0; t < 12; ++t) {
    const std::size_t workers = 2 + rng() % 6;
    std::vector<std::size_t> sizes(workers);
    for (auto& s : sizes) s = rng() % 5 == 0 ? 0 : rng() % 400;
    std::vector<std::unique_ptr<el::store_client>> clients;
    for (std::size_t r = 0; r < workers; ++r)
      clients.push_back(std::make_unique<el::store_client>("127.0.0.1", srv.port(), token));
    pl::steal_options o;
    o.min_chunk = 1 + rng() % 4;
    o.timeout = 10s;
    const auto res = ws_test::run_step_with([&](std::size_t r) -> el::store_client& { return *clients[r]; }, "tcp",
                                            {3, static_cast<std::uint64_t>(t)}, sizes, o, rng(), 1 + rng() % 50);
    ASSERT_EQ(ws_test::check_exactly_once(sizes, res.chunks), "") << "trial " << t;
    std::uint64_t total = 0;
    for (auto s : sizes) total += s;
    EXPECT_EQ(res.processed, total);
    stolen += res.stolen;
  }
  EXPECT_GT(stolen, 0u);
}

TEST(WorkStealingStore, ReleaseErasesTheOwnCounter) {
  el::store_server srv(options());
  el::store_client c("127.0.0.1", srv.port(), token);
  const std::vector<std::size_t> sizes = {5, 0};
  pl::work_stealer<el::store_client> w(c, "rel", {1, 1}, sizes, 0);
  while (!w.next().empty()) {
  }
  EXPECT_EQ(w.processed(), 5u);
  ASSERT_TRUE(c.try_get(w.key(0)).has_value());
  w.release();
  EXPECT_FALSE(c.try_get(w.key(0)).has_value());
}

TEST(WorkStealingStore, StoreErrorsPropagate) {
  std::uint16_t port = 0;
  {
    el::store_server srv(options());
    port = srv.port();
  }  // gone
  el::store_client c("127.0.0.1", port, token);
  pl::steal_options o;
  o.timeout = 200ms;
  const std::vector<std::size_t> sizes = {5};
  pl::work_stealer<el::store_client> w(c, "err", {1, 1}, sizes, 0, o);
  EXPECT_THROW((void)w.claim_own(), ebbflow::system_error);
}

}  // namespace
