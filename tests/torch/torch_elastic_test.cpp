// SPDX-License-Identifier: Apache-2.0
// examples/torch_elastic end to end (a shorter scenario than scripts/demo.sh):
// 3 workers of different emulated speeds under ebbflow-run, one more joins,
// one SIGKILLs itself in the middle of a step. Checks
//  * test accuracy within 1 percentage point of the single-process run over
//    the same global batches (and the parameters equal up to float
//    reassociation);
//  * the world-size history: a join and a failure, each change starting from
//    the size the previous one left;
//  * every sample of every completed epoch was trained on exactly once, in
//    committed steps only (from the workers' sample logs: a step counts in the
//    newest generation in which a worker committed it, and there every
//    worker's attempt went into the update).
#include <gtest/gtest.h>

#include "../common/job_test.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

double json_number(const fs::path& p, const std::string& key) {
  std::ifstream f(p);
  const std::string s((std::istreambuf_iterator<char>(f)), {});
  const auto k = s.find("\"" + key + "\":");
  if (k == std::string::npos) return NAN;
  return std::stod(s.substr(k + key.size() + 3));
}

constexpr std::size_t train_size = 1797 - 360;  // digits::split holds out every 5th sample
constexpr int steps = 150;

using TorchElastic = ebbflow_test::job_test;

}  // namespace

TEST_F(TorchElastic, JoinAndFailureKeepAccuracyHistoryAndExactlyOnceSamples) {
  const std::string common =
      " --steps " + std::to_string(steps) + " --batch 128 --sample-us 400 --step-us 2000 --slowdowns 1,2,3,1 --report report";
  // Worker 1 dies in step 100, after it computed its gradient and logged its attempt.
  auto job = launch("-n 3 --elastic --add 1",
                    TORCH_ELASTIC + common + " --die-at 1:100 --log-every 50 --params-out elastic.bin", "", 90);
  ASSERT_EQ(job.status, 0) << job.output;
  auto ref = run_here(TORCH_ELASTIC + common + " --reference --params-out ref.bin");
  ASSERT_EQ(ref.status, 0) << ref.output;

  // Accuracy bound, and the parameters themselves.
  const double acc = json_number(dir_ / "report" / "result.json", "test_acc");
  const double ref_acc = json_number(dir_ / "report" / "reference.json", "test_acc");
  EXPECT_EQ(json_number(dir_ / "report" / "result.json", "steps"), steps);
  EXPECT_GT(ref_acc, 0.85);
  EXPECT_LE(std::abs(acc - ref_acc), 0.01) << "elastic " << acc << " vs single process " << ref_acc << "\n"
                                           << job.output;
  expect_same_parameters(dir_ / "elastic.bin", dir_ / "ref.bin", job.output);

  // World-size history: initial 3, a join to 4, a failure back to 3 (in whichever order timing gives).
  std::ifstream ev(dir_ / "report" / "events.csv");
  std::string line;
  std::getline(ev, line);  // header
  int size = 0, joins = 0, failures = 0;
  while (std::getline(ev, line)) {
    std::stringstream ss(line);
    std::string t, step, what, olds, news;
    std::getline(ss, t, ','), std::getline(ss, step, ','), std::getline(ss, what, ',');
    std::getline(ss, olds, ','), std::getline(ss, news, ',');
    EXPECT_EQ(std::stoi(olds), size) << line;
    size = std::stoi(news);
    joins += what == "join";
    failures += what == "failure";
    if (what == "initial") {
      EXPECT_EQ(size, 3);
    }
  }
  EXPECT_EQ(joins, 1);
  EXPECT_EQ(failures, 1);
  EXPECT_EQ(size, 3);

  // Exactly once: read every worker's attempts and commits.
  struct attempt {
    long long step, generation, epoch;
    std::vector<std::size_t> indices;
  };
  std::vector<attempt> attempts;
  std::map<long long, long long> committed_in;  // step -> newest generation in which it was committed
  int logs = 0;
  for (const auto& e : fs::directory_iterator(dir_ / "report")) {
    if (e.path().filename().string().rfind("samples-", 0) != 0) continue;
    ++logs;
    std::ifstream f(e.path());
    while (std::getline(f, line)) {
      std::stringstream ss(line);
      std::string kind;
      long long s = -1, g = -1;
      ss >> kind >> s >> g;
      if (kind == "C") {
        committed_in[s] = std::max(committed_in.count(s) ? committed_in[s] : g, g);
      } else if (kind == "A") {
        attempt at{s, g, -1, {}};
        ss >> at.epoch;
        for (std::size_t i; ss >> i;) at.indices.push_back(i);
        attempts.push_back(std::move(at));
      }
    }
  }
  EXPECT_EQ(logs, 4);  // 3 initial workers + the joiner
  ASSERT_EQ(committed_in.size(), static_cast<std::size_t>(steps));
  EXPECT_EQ(committed_in.begin()->first, 0);
  EXPECT_EQ(committed_in.rbegin()->first, steps - 1);
  std::map<long long, std::vector<int>> seen;  // epoch -> uses of each sample
  std::map<long long, std::set<long long>> epoch_of_step;
  bool redone = false;
  for (const auto& at : attempts) {
    if (at.generation != committed_in.at(at.step)) {
      redone = true;  // an attempt of a rolled-back step: its update never happened
      continue;
    }
    epoch_of_step[at.step].insert(at.epoch);
    auto& uses = seen[at.epoch];
    uses.resize(train_size);
    for (auto i : at.indices) {
      ASSERT_LT(i, train_size);
      ++uses[i];
    }
  }
  EXPECT_TRUE(redone) << "the failure should have rolled back the step the dead worker was in";
  for (const auto& [s, e] : epoch_of_step) EXPECT_EQ(e.size(), 1u) << "step " << s << " spans epochs";
  ASSERT_FALSE(seen.empty());
  const long long last = seen.rbegin()->first;
  EXPECT_GE(last, 10);
  for (const auto& [epoch, uses] : seen) {
    const auto twice = std::count_if(uses.begin(), uses.end(), [](int u) { return u > 1; });
    const auto never = std::count(uses.begin(), uses.end(), 0);
    EXPECT_EQ(twice, 0) << "epoch " << epoch << ": samples used more than once";
    if (epoch < last) {
      EXPECT_EQ(never, 0) << "epoch " << epoch << ": samples never used";
    }
  }
}
