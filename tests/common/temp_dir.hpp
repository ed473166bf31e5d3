// SPDX-License-Identifier: Apache-2.0
// A fresh folder for one test, removed with everything in it when the test
// ends, whether it passed or failed (RAII).
#pragma once

#include <stdlib.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <system_error>

namespace ebbflow_test {

class temp_dir {
 public:
  //! Makes <temporary folder>/<prefix>-XXXXXX (mkdtemp: a new name, mode 0700).
  //! @throws std::system_error when it cannot be made.
  explicit temp_dir(const std::string& prefix = "ebbflow-test") {
    std::string t = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (!::mkdtemp(t.data())) throw std::system_error(errno, std::generic_category(), "mkdtemp " + t);
    path_ = t;
  }
  ~temp_dir() {
    std::error_code ec;  // never throws: a file that cannot go stays
    std::filesystem::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;

  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  [[nodiscard]] std::string string() const { return path_.string(); }
  [[nodiscard]] std::filesystem::path operator/(const std::filesystem::path& p) const { return path_ / p; }

 private:
  std::filesystem::path path_;
};

}  // namespace ebbflow_test
