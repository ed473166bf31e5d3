// SPDX-License-Identifier: Apache-2.0
// The examples' one argument parser: values are checked whole and in range,
// and a malformed one is a usage error (exit status 2, one line naming the
// flag and the value). The built examples are run with malformed flags and
// with --help, which must list every flag they share.
#include "../../examples/common/args.hpp"
#include "../../examples/common/training_args.hpp"
#include "../common/shell.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace {

using ebbflow_test::run_shell;

// argv for parser::parse from its arguments (argv[0] is the program).
struct argv_of {
  std::vector<std::string> words;
  std::vector<char*> ptrs;
  explicit argv_of(std::vector<std::string> w) : words(std::move(w)) {
    words.insert(words.begin(), "prog");
    for (auto& s : words) ptrs.push_back(s.data());
    ptrs.push_back(nullptr);
  }
  int argc() const { return static_cast<int>(words.size()); }
  char** argv() { return ptrs.data(); }
};

training_args::values parse_shared(std::vector<std::string> words) {
  training_args::values v;
  cli::parser p("prog");
  training_args::add(p, v);
  argv_of a(std::move(words));
  p.parse(a.argc(), a.argv());
  return v;
}

// `text` as a regular expression that matches it (for EXPECT_EXIT).
std::string literally(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

const std::vector<std::string> shared_flags = {"--steps",     "--batch",   "--lr",        "--momentum",
                                               "--seed",      "--hidden",  "--sample-us", "--step-us",
                                               "--slowdowns", "--params-out", "--reference", "--die-at"};

}  // namespace

TEST(ExampleArgs, NumbersAreTakenWholeAndInRange) {
  EXPECT_EQ(cli::parse_number<int>("17", 0, 100), 17);
  EXPECT_EQ(cli::parse_number<double>("0.05", 0, 1), 0.05);
  for (const char* bad : {"", "17abc", " 17", "+17", "-1", "101", "0x10", "1e1"})
    EXPECT_FALSE(cli::parse_number<int>(bad, 0, 100)) << bad;
  for (const char* bad : {"nan", "inf", "-0.5", "1.5", "0.5x"}) EXPECT_FALSE(cli::parse_number<double>(bad, 0, 1)) << bad;
  EXPECT_FALSE(cli::parse_number<std::uint64_t>("-1", 0, ~std::uint64_t{0}));
  EXPECT_EQ(cli::parse_numbers(std::string_view("1,2.5"), 1.0, 3.0), (std::vector<double>{1, 2.5}));
  for (const char* bad : {"", "1,", ",1", "1,,2", "0.5", "1;2"})
    EXPECT_FALSE(cli::parse_numbers(std::string_view(bad), 1.0, 3.0)) << bad;
  EXPECT_EQ(cli::expected_number(1, 4096), "an integer in [1, 4096]");
  EXPECT_EQ(cli::expected_number(0.0, 1e6), "a number in [0, 1e+06]");
}

TEST(ExampleArgs, TheSharedFlagsSetTheirValues) {
  const auto v = parse_shared({"--steps", "7", "--batch", "32", "--lr", "0.5", "--momentum", "0", "--seed", "9",
                               "--hidden", "16", "--sample-us", "2.5", "--step-us", "10", "--slowdowns", "1,2.5",
                               "--params-out", "p.bin", "--reference", "--die-at", "2:40"});
  EXPECT_EQ(v.steps, 7);
  EXPECT_EQ(v.batch, 32u);
  EXPECT_EQ(v.lr, 0.5);
  EXPECT_EQ(v.momentum, 0.0);
  EXPECT_EQ(v.seed, 9u);
  EXPECT_EQ(v.hidden, 16);
  EXPECT_EQ(v.sample_us, 2.5);
  EXPECT_EQ(v.step_us, 10.0);
  EXPECT_EQ(v.slowdowns, (std::vector<double>{1, 2.5}));
  EXPECT_EQ(v.params_out, "p.bin");
  EXPECT_TRUE(v.reference);
  EXPECT_TRUE(v.die.now(2, 40));
  EXPECT_FALSE(v.die.now(2, 39));
  EXPECT_FALSE(v.die.now(40, 40));
  EXPECT_FALSE(training_args::die_at{}.now(-1, -1)) << "no --die-at: nobody dies";
}

// Each a usage error naming the flag and the value: --die-at takes
// WORKER:STEP only (a lone number used to become worker N, step N).
TEST(ExampleArgs, MalformedValuesAreUsageErrorsThatNameFlagAndValue) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases{
      {{"--steps", "abc"}, "prog: --steps 'abc': expected an integer in [1, "},
      {{"--steps", "0"}, "prog: --steps '0': expected an integer in [1, "},
      {{"--batch", "-1"}, "prog: --batch '-1': expected an integer in [1, "},
      {{"--lr", "0.1x"}, "prog: --lr '0.1x': expected a number in [0, 1e+06]"},
      {{"--momentum", "2"}, "prog: --momentum '2': expected a number in [0, 1]"},
      {{"--hidden", "99999999999"}, "prog: --hidden '99999999999': expected an integer in [1, 65536]"},
      {{"--slowdowns", "1,,2"}, "prog: --slowdowns '1,,2': expected factors in [1, 1000], comma-separated"},
      {{"--die-at", "5"}, "prog: --die-at '5': expected WORKER:STEP"},
      {{"--die-at", "1:"}, "prog: --die-at '1:': expected WORKER:STEP"},
      {{"--die-at", "-1:5"}, "prog: --die-at '-1:5': expected WORKER:STEP"},
      {{"--steps"}, "prog: --steps needs a value"},
      {{"--bogus"}, "prog: unknown option --bogus"},
      {{"stray"}, "prog: unexpected argument 'stray'"}};
  for (const auto& [words, says] : cases)
    EXPECT_EXIT(parse_shared(words), ::testing::ExitedWithCode(2), literally(says)) << words[0];
}

TEST(ExampleArgs, HelpListsEveryFlagAndExitsZero) {
  training_args::values v;
  bool own = false;
  cli::parser p("prog", "usage: prog [options]\n");
  training_args::add(p, v);
  p.flag("--own", own, "a flag of this program");
  const std::string help = p.help();
  for (const auto& f : shared_flags) EXPECT_NE(help.find("\n  " + f + " "), std::string::npos) << f << "\n" << help;
  EXPECT_NE(help.find("\n  --own "), std::string::npos) << help;
  EXPECT_NE(help.find("(default 200)"), std::string::npos) << "the default --steps\n" << help;
  argv_of a({"--help"});
  EXPECT_EXIT(p.parse(a.argc(), a.argv()), ::testing::ExitedWithCode(0), "");
}

TEST(ExampleArgs, AFlagDeclaredTwiceIsAProgrammingError) {
  bool x = false;
  cli::parser p("prog");
  p.flag("--x", x, "");
  EXPECT_THROW(p.flag("--x", x, ""), std::logic_error);
  EXPECT_THROW(p.flag("-h", x, ""), std::logic_error);
  EXPECT_THROW(p.flag("x", x, ""), std::logic_error);
}

// The built examples themselves: the same errors, exit status 2, one line,
// before any data is loaded or a store contacted; --help lists the flags.
TEST(ExampleArgs, TheExamplesRefuseMalformedFlags) {
  std::vector<std::string> programs;
#ifdef ELASTIC_TRAIN
  programs.emplace_back(ELASTIC_TRAIN);
#endif
#ifdef TORCH_ELASTIC
  programs.emplace_back(TORCH_ELASTIC);
#endif
  if (programs.empty()) GTEST_SKIP() << "no example was built (UCX or Boost missing)";
  for (const auto& prog : programs) {
    const std::string name = prog.substr(prog.rfind('/') + 1);
    for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
             {"--die-at 5", "--die-at '5': expected WORKER:STEP"},
             {"--steps 12x", "--steps '12x': expected an integer in [1, "},
             {"--slowdowns 0.5", "--slowdowns '0.5': expected factors in [1, 1000]"},
             {"--batch", "--batch needs a value"}}) {
      const auto r = run_shell(prog + " " + args);
      EXPECT_EQ(r.status, 2) << name << " " << args << "\n" << r.output;
      EXPECT_NE(r.output.find(name + ": " + says), std::string::npos) << name << " " << args << "\n" << r.output;
      EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    }
    const auto help = run_shell(prog + " --help");
    EXPECT_EQ(help.status, 0) << help.output;
    for (const auto& f : shared_flags)
      EXPECT_NE(help.output.find("\n  " + f + " "), std::string::npos) << name << " " << f << "\n" << help.output;
  }
}
