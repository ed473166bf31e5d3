// SPDX-License-Identifier: Apache-2.0
#include <ebbflow/compress/bucket.hpp>

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace cx = ebbflow::compress;

TEST(Bucket, FusesInOrderUnderTheCap) {
  const std::vector<std::size_t> sizes{10, 20, 30, 100, 5, 5, 0, 7};
  cx::bucket_manager bm(sizes, 40 * sizeof(float));
  // [10 20] [30] [100] [5 5 0 7]
  ASSERT_EQ(bm.bucket_count(), 4u);
  EXPECT_EQ(bm.slot_of(1).bucket, 0u);
  EXPECT_EQ(bm.slot_of(1).offset, 10u);
  EXPECT_EQ(bm.slot_of(2).bucket, 1u);
  EXPECT_EQ(bm.slot_of(3).bucket, 2u);  // oversize tensor: own bucket
  EXPECT_EQ(bm.bucket(2).size(), 100u);
  EXPECT_EQ(bm.tensors_of(3).size(), 4u);
}

TEST(Bucket, PackReduceUnpackRoundTrips) {
  const std::vector<std::size_t> sizes{3, 1, 4, 1, 5, 9, 2, 6};
  cx::bucket_manager bm(sizes, 8 * sizeof(float));
  std::vector<std::vector<float>> g;
  for (auto s : sizes) {
    g.emplace_back(s);
    std::iota(g.back().begin(), g.back().end(), float(g.size()));
  }
  auto orig = g;
  std::vector<std::span<float>> views(g.begin(), g.end());
  std::size_t calls = 0;
  bm.allreduce(std::span<const std::span<float>>(views), [&](std::span<float> b, std::size_t) {
    ++calls;
    for (auto& x : b) x *= 2;
  });
  EXPECT_EQ(calls, bm.bucket_count());
  for (std::size_t t = 0; t < g.size(); ++t)
    for (std::size_t i = 0; i < g[t].size(); ++i) EXPECT_EQ(g[t][i], 2 * orig[t][i]);
}

TEST(Bucket, MarkReadyReportsEachBucketOnceWhenComplete) {
  const std::vector<std::size_t> sizes{4, 4, 4, 4};
  cx::bucket_manager bm(sizes, 8 * sizeof(float));
  std::vector<float> x(4, 1.0f);
  EXPECT_FALSE(bm.mark_ready(0, x));
  EXPECT_EQ(bm.mark_ready(1, x), std::optional<std::size_t>(0));
  EXPECT_FALSE(bm.mark_ready(3, x));
  EXPECT_EQ(bm.mark_ready(2, x), std::optional<std::size_t>(1));
  EXPECT_THROW(bm.mark_ready(2, x), std::invalid_argument);
  bm.reset_ready();
  EXPECT_FALSE(bm.mark_ready(2, x));
  std::vector<float> wrong(3);
  EXPECT_THROW(bm.pack(0, wrong), std::invalid_argument);
}
