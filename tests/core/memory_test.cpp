// SPDX-License-Identifier: Apache-2.0
#include <ebbflow/core/memory.hpp>
#include <ebbflow/exec/executor.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <vector>

namespace ef = ebbflow;

TEST(Memory, SpansCarryTheirSpace) {
  std::vector<float> v(10);
  ef::host_span<float> h(v.data(), v.size());
  ef::host_span<const float> hc = h;
  static_assert(decltype(h)::space == ef::memory_space::host);
  static_assert(!std::is_convertible_v<ef::host_span<float>, ef::device_span<float>>);
  EXPECT_EQ(hc.size(), 10u);
  auto bv = ef::view(h.subspan(2, 4));
  EXPECT_EQ(bv.count, 4u);
  EXPECT_EQ(bv.bytes(), 16u);
  EXPECT_EQ(bv.type, ef::dtype::f32);
  EXPECT_EQ(bv.data, v.data() + 2);
  EXPECT_EQ(bv.slice(1, 2).data, v.data() + 3);
  EXPECT_TRUE(ef::host_accessible(ef::memory_space::pinned));
  EXPECT_FALSE(ef::host_accessible(ef::memory_space::device));
}

TEST(CpuExecutor, VisitsEveryIndexOnceSingleAndMultiThreaded) {
  for (unsigned threads : {1u, 2u, 3u}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{200'003}}) {
      std::vector<std::atomic<int>> hits(n);
      ef::exec::cpu_executor ex(threads);
      ex.bulk(n, [&](std::size_t i) { hits[i].fetch_add(1, std::memory_order_relaxed); });
      ex.wait();
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
    }
  }
}
