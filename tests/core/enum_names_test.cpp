// SPDX-License-Identifier: Apache-2.0
#include <ebbflow/core/dtype.hpp>
#include <ebbflow/core/enum_names.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/core/log.hpp>
#include <ebbflow/core/memory.hpp>

#include <gtest/gtest.h>

#include <string_view>
#include <system_error>

namespace ef = ebbflow;

namespace {
enum class tier : unsigned char { low = 3, mid, high };
constexpr auto tier_names = ef::make_enum_names(tier::low, "low", "mid", "high");
static_assert(tier_names.last() == tier::high && tier_names.size() == 3);
static_assert(tier_names(tier::mid) == "mid");  // usable in constant expressions
}  // namespace

TEST(EnumNames, NamesAndParsesFromAnyFirstEnumerator) {
  EXPECT_EQ(tier_names(tier::low), "low");
  EXPECT_EQ(tier_names(tier::high), "high");
  EXPECT_EQ(tier_names.parse("mid"), tier::mid);
  EXPECT_EQ(tier_names.at(0), tier::low);
  EXPECT_FALSE(tier_names.parse("Mid"));  // exact match only
  EXPECT_FALSE(tier_names.parse(""));
  // Values outside the table, below and above it, get the fallback.
  EXPECT_EQ(tier_names(static_cast<tier>(2)), "?");
  EXPECT_EQ(tier_names(static_cast<tier>(6), "unknown tier"), "unknown tier");
}

TEST(EnumNames, EveryCoreEnumRoundTrips) {
  for (auto t : ef::all_dtypes) EXPECT_EQ(ef::parse_dtype(ef::name(t)), t);
  for (auto op : ef::all_reduce_ops) EXPECT_EQ(ef::parse_reduce_op(ef::name(op)), op);
  for (auto s : {ef::memory_space::host, ef::memory_space::pinned, ef::memory_space::device})
    EXPECT_NE(ef::name(s), "?");
  EXPECT_EQ(ef::name(ef::memory_space::pinned), "pinned");
  for (int l = 0; l <= 5; ++l)
    EXPECT_EQ(ef::log::parse_level(ef::log::name(static_cast<ef::log::level>(l))), static_cast<ef::log::level>(l));
  EXPECT_EQ(ef::name(static_cast<ef::dtype>(200)), "?");
}

TEST(EnumNames, ErrorMessagesComeFromTheTables) {
  EXPECT_EQ(ef::make_error_code(ef::error::peer_lost).message(), "peer lost");
  EXPECT_EQ(ef::make_error_code(ef::error::load_failed).message(), "data load failed");
  EXPECT_EQ(ef::make_error_code(ef::error::load_failed), ef::errc::load_failed);
  EXPECT_EQ(std::error_code(99, ef::ebbflow_category()).message(), "unknown ebbflow error");
  EXPECT_EQ(std::error_code(-80, ef::ucs_category()).message(), "endpoint timeout");  // known inside a range
  EXPECT_EQ(std::error_code(-45, ef::ucs_category()).message(), "link failure");
  EXPECT_EQ(std::error_code(-61, ef::ucs_category()).message(), "endpoint failure");
  EXPECT_EQ(std::error_code(-99, ef::ucs_category()).message(), "UCX status -99");
  EXPECT_EQ(std::error_code(100, ef::cuda_category()).message(), "no CUDA-capable device is detected");
  EXPECT_EQ(std::error_code(3, ef::cuda_category()).message(), "CUDA error 3");
  EXPECT_EQ(std::error_code(7, ef::nccl_category()).message(), "NCCL operation in progress");
  EXPECT_EQ(std::error_code(8, ef::nccl_category()).message(), "NCCL result 8");
}
