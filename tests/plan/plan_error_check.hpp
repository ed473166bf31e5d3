// SPDX-License-Identifier: Apache-2.0
// Test helper for plan/plan_error.hpp: a call must raise the planner error
// of one cause, as the type of that cause's kind (docs/architecture.md,
// "Errors"): plan_error (a std::invalid_argument) for a precondition,
// plan_fault (an ebbflow::system_error equal to errc::bad_message) for a
// run-time cause.
#pragma once

#include <ebbflow/core/error.hpp>
#include <ebbflow/plan/plan_error.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace plan_test {

//! What a planner error said.
struct caught {
  std::optional<std::uint64_t> worker;  //!< its worker()
  std::string what;                     //!< its what()
};

//! Runs `f`, which must throw the error of `code` whose what() starts with
//! the cause's name, contains `says` and names file and line.
template <class F>
caught expect_plan_error(F&& f, ebbflow::plan::plan_errc code, std::string_view says) {
  namespace pl = ebbflow::plan;
  caught got;
  try {
    f();
    ADD_FAILURE() << "no error; expected " << pl::to_string(code);
    return got;
  } catch (const pl::plan_error& e) {
    EXPECT_FALSE(pl::is_fault(code)) << "a run-time cause raised as plan_error: " << e.what();
    EXPECT_EQ(e.code(), code) << e.what();
    got = {e.worker(), e.what()};
  } catch (const pl::plan_fault& e) {
    EXPECT_TRUE(pl::is_fault(code)) << "a precondition raised as plan_fault: " << e.what();
    EXPECT_EQ(e.cause(), code) << e.what();
    EXPECT_TRUE(e.code() == code) << e.what();
    EXPECT_TRUE(e.code() == ebbflow::errc::bad_message) << e.what();
    got = {e.worker(), e.what()};
  }
  EXPECT_EQ(got.what.rfind(std::string(pl::to_string(code)) + ": ", 0), 0u) << got.what;
  EXPECT_NE(got.what.find(says), std::string::npos) << got.what;
  EXPECT_NE(got.what.find(".hpp:"), std::string::npos) << "names file and line: " << got.what;
  return got;
}

}  // namespace plan_test
