// SPDX-License-Identifier: Apache-2.0
#include <ebbflow/core/error.hpp>
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/core/handle.hpp>
#include <ebbflow/core/log.hpp>

#include <gtest/gtest.h>

#include <thread>

namespace ef = ebbflow;

TEST(Error, VendorCodesMapToPortableConditions) {
  EXPECT_EQ(std::error_code(-25, ef::ucs_category()), ef::errc::peer_lost);  // connection reset
  EXPECT_EQ(std::error_code(-80, ef::ucs_category()), ef::errc::peer_lost);  // endpoint timeout
  EXPECT_EQ(std::error_code(-3, ef::ucs_category()), ef::errc::peer_lost);   // i/o error
  EXPECT_EQ(std::error_code(-20, ef::ucs_category()), ef::errc::timeout);
  EXPECT_EQ(std::error_code(-16, ef::ucs_category()), ef::errc::cancelled);
  EXPECT_NE(std::error_code(-5, ef::ucs_category()), ef::errc::peer_lost);  // invalid param
  EXPECT_EQ(std::error_code(6, ef::nccl_category()), ef::errc::peer_lost);  // ncclRemoteError
  EXPECT_EQ(ef::make_error_code(ef::error::timeout), ef::errc::timeout);
  EXPECT_NE(ef::make_error_code(ef::error::timeout), ef::errc::peer_lost);
  EXPECT_EQ(std::error_code(ef::error::unauthorized), ef::errc::unauthorized);
  EXPECT_EQ(std::error_code(-25, ef::ucs_category()).message(), "connection reset by remote peer");
  EXPECT_EQ(std::error_code(4, ef::nccl_category()).message(), "invalid argument");
}

TEST(Error, SystemErrorNamesWhereItHappened) {
  ef::system_error e(ef::error::peer_lost,
                     {.rank = 2, .generation = 3, .peer = 1, .operation = "allreduce", .detail = "4096 bytes"});
  EXPECT_STREQ(e.what(), "allreduce: peer lost (4096 bytes) [rank 2, generation 3, peer 1]");
  EXPECT_EQ(e.code(), ef::errc::peer_lost);
  EXPECT_EQ(e.rank(), 2);
  EXPECT_EQ(e.generation(), 3);
  EXPECT_EQ(e.peer(), 1);
  EXPECT_EQ(e.operation(), "allreduce");
  ef::system_error copy = e;  // copies keep their operation name
  EXPECT_EQ(copy.operation(), "allreduce");
  EXPECT_STREQ(ef::system_error(ef::error::timeout).what(), "timed out");
  EXPECT_THROW(ef::throw_if(ef::error::revoked), ef::system_error);
  EXPECT_NO_THROW(ef::throw_if(std::error_code{}));
}

TEST(Error, EnforceNamesFileAndLine) {
  try {
    EBBFLOW_ENFORCE(1 + 1 == 3, "size " << 7 << " is odd");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("size 7 is odd (" __FILE__ ":"), std::string::npos) << e.what();
  }
}

struct counting_traits {
  using value_type = int;
  static inline int closed = 0;
  static int null() noexcept { return 0; }
  static void close(int) noexcept { ++closed; }
};

TEST(Handle, ClosesExactlyOnceAndMoves) {
  counting_traits::closed = 0;
  {
    ef::unique_handle<counting_traits> a(5);
    ef::unique_handle<counting_traits> b(std::move(a));
    EXPECT_FALSE(a);
    EXPECT_EQ(b.get(), 5);
    b.reset(6);
    EXPECT_EQ(counting_traits::closed, 1);
    int raw = b.release();
    EXPECT_EQ(raw, 6);
  }
  EXPECT_EQ(counting_traits::closed, 1);
}

TEST(Deadline, ExpiresAndReportsRemaining) {
  auto d = ef::deadline::after(std::chrono::milliseconds(20));
  EXPECT_FALSE(d.expired());
  EXPECT_GT(d.remaining().count(), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_TRUE(d.expired());
  EXPECT_EQ(d.remaining().count(), 0);
  EXPECT_FALSE(ef::deadline::never().expired());
  EXPECT_EQ(min(d, ef::deadline::never()).at(), d.at());
}

// Timeouts beyond the clock's range saturate instead of overflowing (a
// wrapped sum passed at once: `next(seconds::max())` timed out at once).
TEST(Deadline, HugeTimeoutsSaturate) {
  for (const auto d : {ef::deadline::after(std::chrono::seconds::max()), ef::deadline::after(std::chrono::hours::max()),
                       ef::deadline::after(std::chrono::duration<double>(1e300)),
                       ef::deadline::after(std::chrono::nanoseconds::max())}) {
    EXPECT_FALSE(d.expired());
    EXPECT_EQ(d.at(), ef::deadline::never().at());
  }
  for (const auto d : {ef::deadline::after(std::chrono::seconds::min()), ef::deadline::after(std::chrono::hours::min()),
                       ef::deadline::after(std::chrono::nanoseconds::min())})
    EXPECT_TRUE(d.expired());
  const auto year = ef::deadline::after(std::chrono::hours(24 * 365));
  EXPECT_FALSE(year.expired());
  EXPECT_GT(year.remaining(), std::chrono::hours(24 * 364));
}

TEST(Log, LevelsParseAndFilter) {
  EXPECT_EQ(ef::log::parse_level("debug"), ef::log::level::debug);
  EXPECT_FALSE(ef::log::parse_level("loud"));
  const auto old = ef::log::get_level();
  ef::log::set_level(ef::log::level::error);
  EXPECT_TRUE(ef::log::enabled(ef::log::level::error));
  EXPECT_FALSE(ef::log::enabled(ef::log::level::info));
  ef::log::set_level(ef::log::level::off);
  EXPECT_FALSE(ef::log::enabled(ef::log::level::error));
  ef::log::set_level(old);
}
