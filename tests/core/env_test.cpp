// SPDX-License-Identifier: Apache-2.0
#include <ebbflow/core/env.hpp>

#include <gtest/gtest.h>

#include <cstdlib>
#include <initializer_list>
#include <utility>

namespace ef = ebbflow;

namespace {
struct scoped_env {
  std::vector<std::string> names;
  void set(const char* n, const char* v) {
    ::setenv(n, v, 1);
    names.emplace_back(n);
  }
  ~scoped_env() {
    for (auto& n : names) ::unsetenv(n.c_str());
  }
};
void clear_launch_env() {
  for (const char* n :
       {"EBBFLOW_RANK", "EBBFLOW_WORLD_SIZE", "EBBFLOW_LOCAL_RANK", "EBBFLOW_STORE", "EBBFLOW_TOKEN", "RANK",
        "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"})
    ::unsetenv(n);
}
}  // namespace

TEST(Env, ValidatesAndNamesTheVariable) {
  scoped_env e;
  EXPECT_EQ(ef::env::get_int("EBBFLOW_TEST_X", 42), 42);
  e.set("EBBFLOW_TEST_X", "17");
  EXPECT_EQ(ef::env::get_int("EBBFLOW_TEST_X", 42, 0, 100), 17);
  e.set("EBBFLOW_TEST_X", "17abc");
  try {
    ef::env::get_int("EBBFLOW_TEST_X", 42, 0, 100);
    FAIL();
  } catch (const std::invalid_argument& ex) {
    EXPECT_NE(std::string(ex.what()).find("EBBFLOW_TEST_X='17abc': expected an integer in [0, 100]"), std::string::npos)
        << ex.what();
  }
  e.set("EBBFLOW_TEST_X", "1000");
  EXPECT_THROW(ef::env::get_int("EBBFLOW_TEST_X", 42, 0, 100), std::invalid_argument);
  e.set("EBBFLOW_TEST_B", "yes");
  EXPECT_TRUE(ef::env::get_bool("EBBFLOW_TEST_B", false));
  e.set("EBBFLOW_TEST_B", "maybe");
  EXPECT_THROW(ef::env::get_bool("EBBFLOW_TEST_B", false), std::invalid_argument);
  e.set("EBBFLOW_TEST_D", "0.5");
  EXPECT_DOUBLE_EQ(ef::env::get_double("EBBFLOW_TEST_D", 1.0, 0.0, 1.0), 0.5);
  e.set("EBBFLOW_TEST_D", "nan");
  EXPECT_THROW(ef::env::get_double("EBBFLOW_TEST_D", 1.0), std::invalid_argument);
}

TEST(Env, ChoicesAndOffOrInRangeNameWhatTheyExpect) {
  scoped_env e;
  enum class mode { a, b };
  EXPECT_EQ(ef::env::get_choice("EBBFLOW_TEST_C", mode::b, {{"a", mode::a}, {"b", mode::b}}), mode::b);
  e.set("EBBFLOW_TEST_C", "a");
  EXPECT_EQ(ef::env::get_choice("EBBFLOW_TEST_C", mode::b, {{"a", mode::a}, {"b", mode::b}}), mode::a);
  e.set("EBBFLOW_TEST_C", "A");
  try {
    ef::env::get_choice("EBBFLOW_TEST_C", mode::b, {{"a", mode::a}, {"b", mode::b}});
    FAIL() << "an unknown choice accepted";
  } catch (const std::invalid_argument& ex) {
    EXPECT_NE(std::string(ex.what()).find("EBBFLOW_TEST_C='A': expected one of a, b"), std::string::npos) << ex.what();
  }
  EXPECT_EQ(ef::env::get_int_or_zero("EBBFLOW_TEST_Z", 7, 100, 1000), 7);
  for (const char* ok : {"0", "100", "1000"}) {
    e.set("EBBFLOW_TEST_Z", ok);
    EXPECT_EQ(ef::env::get_int_or_zero("EBBFLOW_TEST_Z", 7, 100, 1000), std::atoll(ok));
  }
  for (const char* bad : {"1", "99", "1001", "-5", "x"}) {
    e.set("EBBFLOW_TEST_Z", bad);
    try {
      ef::env::get_int_or_zero("EBBFLOW_TEST_Z", 7, 100, 1000);
      ADD_FAILURE() << bad << " accepted";
    } catch (const std::invalid_argument& ex) {
      EXPECT_NE(std::string(ex.what()).find("expected 0 or an integer in [100, 1000]"), std::string::npos) << ex.what();
    }
  }
}

TEST(Env, HostPort) {
  auto hp = ef::env::parse_host_port("127.0.0.1:29500", "X");
  EXPECT_EQ(hp.host, "127.0.0.1");
  EXPECT_EQ(hp.port, 29500);
  EXPECT_EQ(ef::env::parse_host_port("[::1]:80", "X").host, "::1");
  EXPECT_THROW(ef::env::parse_host_port("localhost", "X"), std::invalid_argument);
  EXPECT_THROW(ef::env::parse_host_port("h:70000", "X"), std::invalid_argument);
}

TEST(LaunchInfo, ReadsEbbflowTorchrunOpenMpiAndSlurm) {
  clear_launch_env();
  scoped_env e;
  // Each launcher's variables on top of the previous ones: the later
  // launcher in this order wins.
  const auto with = [&](std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const auto& [k, v] : vars) e.set(k, v);
    return ef::launch_info::from_environment();
  };
  auto li = with({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "8"}});
  EXPECT_EQ(li.source, "slurm");
  EXPECT_EQ(li.rank, 3);
  EXPECT_EQ(li.world_size, 8);
  EXPECT_EQ(with({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}}).source, "openmpi");
  li = with({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "1234"}});
  EXPECT_EQ(li.source, "torchrun");
  EXPECT_EQ(li.store_host, "10.0.0.1");
  EXPECT_EQ(li.store_port, 1234);
  li = with({{"EBBFLOW_RANK", "2"},
             {"EBBFLOW_WORLD_SIZE", "3"},
             {"EBBFLOW_STORE", "127.0.0.1:5000"},
             {"EBBFLOW_TOKEN", "s3cret"}});
  EXPECT_EQ(li.source, "ebbflow");
  EXPECT_EQ(li.rank, 2);
  EXPECT_EQ(li.store_port, 5000);
  EXPECT_EQ(li.token, "s3cret");
  EXPECT_THROW(with({{"EBBFLOW_RANK", "3"}}), std::invalid_argument);  // rank must be < world size
  clear_launch_env();
}
