// SPDX-License-Identifier: Apache-2.0
// comm::shared_buffer: allocation, the registry that collectives consult, and
// peer mappings (mapped here from this very process, which takes the same
// /proc/<pid>/fd path a peer does). Multi-process use: ucx_collectives_test
// (UcxShared).
#include <ebbflow/comm/shared_memory.hpp>

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <vector>

namespace ef = ebbflow;
namespace ec = ebbflow::comm;

TEST(SharedBuffer, AllocatesZeroedPageRoundedMemoryAndRegistersIt) {
  auto b = ec::shared_buffer::allocate(10000);
  ASSERT_TRUE(b);
  EXPECT_EQ(b.size(), 10000u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data()) % static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE)), 0u);
  for (std::byte x : b.as<std::byte>()) ASSERT_EQ(x, std::byte{0});
  EXPECT_EQ(b.as<float>().size(), 2500u);
  // Any sub-range is found; a range running past the end, or other memory, is not.
  auto* p = static_cast<std::byte*>(b.data());
  const auto whole = ec::detail::find_shared(p, 10000);
  EXPECT_GE(whole.fd, 0);
  EXPECT_EQ(whole.offset, 0u);
  EXPECT_GE(whole.size, 10000u);
  const auto mid = ec::detail::find_shared(p + 100, 400);
  EXPECT_EQ(mid.fd, whole.fd);
  EXPECT_EQ(mid.id, whole.id);
  EXPECT_EQ(mid.offset, 100u);
  EXPECT_EQ(ec::detail::find_shared(p + 9000, 1001).fd, -1);
  std::vector<std::byte> plain(100);
  EXPECT_EQ(ec::detail::find_shared(plain.data(), 100).fd, -1);
  EXPECT_EQ(ec::detail::find_shared(nullptr, 0).fd, -1);
  // Empty buffers.
  EXPECT_FALSE(ec::shared_buffer::allocate(0));
  EXPECT_FALSE(ec::shared_buffer{});
}

TEST(SharedBuffer, MoveTransfersAndDestructionUnregisters) {
  auto a = ec::shared_buffer::allocate(4096);
  void* p = a.data();
  const auto id = ec::detail::find_shared(p, 1).id;
  ec::shared_buffer b = std::move(a);
  EXPECT_FALSE(a);  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(ec::detail::find_shared(p, 1).id, id);
  auto c = ec::shared_buffer::allocate(4096);
  EXPECT_NE(ec::detail::find_shared(c.data(), 1).id, id);  // ids are never reused
  b = std::move(c);                                        // releases the first buffer
  EXPECT_NE(ec::detail::find_shared(b.data(), 1).id, id);
  { ec::shared_buffer gone = std::move(b); }
  EXPECT_FALSE(b);
}

TEST(SharedBuffer, PeersMapTheSameMemoryAndBadReferencesAreRefused) {
  auto b = ec::shared_buffer::allocate(3 * 4096);
  auto* p = static_cast<std::byte*>(b.data());
  const auto ref = ec::detail::find_shared(p + 4096, 4096);
  auto v = ec::detail::map_peer(::getpid(), ref, 4096);
  ASSERT_TRUE(v);
  EXPECT_NE(v.data(), p + 4096);  // a second mapping of the same pages
  p[4096 + 5] = std::byte{42};
  EXPECT_EQ(v.data()[5], std::byte{42});
  v.data()[6] = std::byte{7};
  EXPECT_EQ(p[4096 + 6], std::byte{7});
  // A range beyond the buffer, an unregistered range, a wrong size, a dead fd: no mapping, no crash.
  EXPECT_FALSE(ec::detail::map_peer(::getpid(), ref, 3 * 4096));
  EXPECT_FALSE(ec::detail::map_peer(::getpid(), ec::detail::shared_ref{}, 1));
  auto wrong = ref;
  wrong.size += 4096;
  wrong.id ^= 1;  // not cached under this id
  EXPECT_FALSE(ec::detail::map_peer(::getpid(), wrong, 1));
  auto dead = ref;
  dead.fd = 100000;
  dead.id ^= 2;
  EXPECT_FALSE(ec::detail::map_peer(::getpid(), dead, 1));
}

TEST(SharedBuffer, EvictedMappingsStayValidWhileHeld) {
  std::vector<ec::shared_buffer> bufs;
  std::vector<ec::detail::peer_view> views;
  for (std::size_t i = 0; i < ec::peer_mapping_cache + 10; ++i) {
    bufs.push_back(ec::shared_buffer::allocate(4096));
    static_cast<std::byte*>(bufs.back().data())[0] = static_cast<std::byte>(i);
    views.push_back(ec::detail::map_peer(::getpid(), ec::detail::find_shared(bufs.back().data(), 1), 1));
    ASSERT_TRUE(views.back()) << i;
  }
  // The first ones were evicted from the cache, but their holders keep them mapped.
  for (std::size_t i = 0; i < views.size(); ++i) EXPECT_EQ(views[i].data()[0], static_cast<std::byte>(i)) << i;
  // Even after the owner frees its buffer, a reader's mapping stays readable (no SIGBUS).
  bufs.clear();
  for (std::size_t i = 0; i < views.size(); ++i) EXPECT_EQ(views[i].data()[0], static_cast<std::byte>(i)) << i;
}
