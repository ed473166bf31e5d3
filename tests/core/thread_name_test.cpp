// SPDX-License-Identifier: Apache-2.0
#include <ebbflow/core/thread_name.hpp>

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "../thread_names.hpp"

namespace {

#if defined(__linux__)
// A thread that waits until told to end, so its name can be read meanwhile.
struct parked {
  std::mutex m;
  std::condition_variable cv;
  bool go = false;
  std::thread t{[this] {
    std::unique_lock lk(m);
    cv.wait(lk, [this] { return go; });
  }};
  ~parked() {
    {
      std::lock_guard lk(m);
      go = true;
    }
    cv.notify_all();
    t.join();
  }
};

TEST(ThreadName, NamesThatThreadOnlyAndAtOnce) {
  {
    parked p;
    ebbflow::detail::name_thread(p.t, "ebbflow-test");
    EXPECT_TRUE(ebbflow_test::has_thread("ebbflow-test"));  // already there when name_thread returns
  }
  EXPECT_FALSE(ebbflow_test::has_thread("ebbflow-test"));  // that thread ended; this one kept its name
}

TEST(ThreadName, KeepsTheFirst15Bytes) {
  parked p;
  ebbflow::detail::name_thread(p.t, "ebbflow-0123456789abcdef");
  EXPECT_TRUE(ebbflow_test::has_thread("ebbflow-0123456"));
}
#endif

}  // namespace
