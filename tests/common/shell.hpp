// SPDX-License-Identifier: Apache-2.0
// For the end-to-end tests that run real jobs: a shell command's exit status
// and output, and a binary file of floats (the parameters a job wrote).
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace ebbflow_test {

struct shell_result {
  int status = -1;     //!< exit status; 128 + signal when killed; -1 when it could not start
  std::string output;  //!< standard output and standard error, interleaved
};

//! Runs `cmd` with `sh -c`, standard error joined to the output.
inline shell_result run_shell(const std::string& cmd) {
  shell_result r;
  std::FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), static_cast<int>(buf.size()), p)) r.output += buf.data();
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

//! Every whole float in the file, in order (empty when it cannot be read).
inline std::vector<float> read_floats(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<float> v;
  float x;
  while (f.read(reinterpret_cast<char*>(&x), sizeof x)) v.push_back(x);
  return v;
}

}  // namespace ebbflow_test
