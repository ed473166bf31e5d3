// SPDX-License-Identifier: Apache-2.0
// Real etcd servers for the tests: one member, or a cluster of several on
// this host (loopback ports), each in its own data folder under /dev/shm (or
// TMPDIR), started with Debian's etcd and SIGKILLed or stopped by the test.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace ebbflow_test {

//! The etcd binary, or "" when it is not installed (tests then skip).
inline std::string etcd_binary() {
  for (const char* p : {"/usr/bin/etcd", "/usr/local/bin/etcd"})
    if (::access(p, X_OK) == 0) return p;
  return {};
}

//! A free TCP port on loopback (bound and released; good enough for a test).
inline int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t n = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &n);
  ::close(s);
  return ntohs(a.sin_port);
}

//! TLS files for etcd's client side (etcd serves https on its client URLs).
struct etcd_tls {
  std::string cert, key, ca;  // server certificate and key, the CA that signed it (and the clients')
  bool mutual = false;        // --client-cert-auth: clients need a certificate signed by `ca`
};

//! A cluster of `n` etcd members on loopback. Stops every member it started in the destructor.
class etcd_cluster {
 public:
  etcd_cluster(int n, std::optional<etcd_tls> tls = std::nullopt) : tls_(std::move(tls)) {
    const char* base = std::filesystem::exists("/dev/shm") ? "/dev/shm" : "/tmp";
    dir_ = std::filesystem::path(base) / ("ebbflow-etcd-" + std::to_string(::getpid()) + "-" + std::to_string(seq()++));
    std::filesystem::create_directories(dir_);
    std::string initial;
    for (int i = 0; i < n; ++i) {
      member m;
      m.name = "m" + std::to_string(i);
      m.client_port = free_port();
      m.peer_port = free_port();
      initial += (i ? "," : "") + m.name + "=http://127.0.0.1:" + std::to_string(m.peer_port);
      members_.push_back(m);
    }
    initial_ = initial;
    for (int i = 0; i < n; ++i) start(i);
  }
  ~etcd_cluster() {
    for (std::size_t i = 0; i < members_.size(); ++i) kill(static_cast<int>(i));
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  //! "etcd://127.0.0.1:P1,127.0.0.1:P2,..." (etcds:// with TLS).
  std::string address(const std::string& prefix = "") const {
    std::string s = tls_ ? "etcds://" : "etcd://";
    for (std::size_t i = 0; i < members_.size(); ++i)
      s += (i ? "," : "") + std::string("127.0.0.1:") + std::to_string(members_[i].client_port);
    return s + (prefix.empty() ? "" : "/" + prefix);
  }
  int client_port(int i) const { return members_[static_cast<std::size_t>(i)].client_port; }
  int size() const { return static_cast<int>(members_.size()); }

  //! Starts member i (again, keeping its data after a kill).
  void start(int i) {
    auto& m = members_[static_cast<std::size_t>(i)];
    const std::string scheme = tls_ ? "https" : "http";
    const std::string curl = scheme + "://127.0.0.1:" + std::to_string(m.client_port);
    std::vector<std::string> args = {etcd_binary(),
                                     "--name", m.name,
                                     "--data-dir", (dir_ / m.name).string(),
                                     "--listen-client-urls", curl,
                                     "--advertise-client-urls", curl,
                                     "--listen-peer-urls", "http://127.0.0.1:" + std::to_string(m.peer_port),
                                     "--initial-advertise-peer-urls", "http://127.0.0.1:" + std::to_string(m.peer_port),
                                     "--initial-cluster", initial_,
                                     "--initial-cluster-state", "new",
                                     "--heartbeat-interval", "100",
                                     "--election-timeout", "1000",
                                     "--log-level", "warn"};
    if (tls_) {
      args.insert(args.end(), {"--cert-file", tls_->cert, "--key-file", tls_->key});
      if (tls_->mutual) args.insert(args.end(), {"--trusted-ca-file", tls_->ca, "--client-cert-auth"});
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    const std::string log = (dir_ / (m.name + ".log")).string();
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid = -1;
    if (posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ) != 0) pid = -1;
    posix_spawn_file_actions_destroy(&fa);
    m.pid = pid;
  }

  //! SIGKILLs member i (no-op when it is not running) and reaps it.
  void kill(int i) {
    auto& m = members_[static_cast<std::size_t>(i)];
    if (m.pid <= 0) return;
    ::kill(m.pid, SIGKILL);
    ::waitpid(m.pid, nullptr, 0);
    m.pid = -1;
  }

  //! Waits until `etcdctl endpoint health` says every running member is healthy (a leader exists).
  bool wait_healthy(std::chrono::seconds within = std::chrono::seconds(20)) const {
    const auto until = std::chrono::steady_clock::now() + within;
    while (std::chrono::steady_clock::now() < until) {
      if (run("endpoint health", running_endpoints()).second == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  //! The index of the leader, or -1.
  int leader() const {
    for (std::size_t i = 0; i < members_.size(); ++i) {
      if (members_[i].pid <= 0) continue;
      const auto [out, rc] = run("endpoint status -w fields", endpoint(static_cast<int>(i)));
      if (rc != 0) continue;
      // "MemberID" : 123 ... "Leader" : 123
      auto field = [&](const char* name) {
        const auto at = out.find(std::string("\"") + name + "\" : ");
        if (at == std::string::npos) return std::string();
        const auto b = at + std::string(name).size() + 5;
        return out.substr(b, out.find('\n', b) - b);
      };
      if (!field("MemberID").empty() && field("MemberID") == field("Leader")) return static_cast<int>(i);
    }
    return -1;
  }

  std::string log(int i) const {
    std::ifstream f(dir_ / (members_[static_cast<std::size_t>(i)].name + ".log"));
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }

 private:
  struct member {
    std::string name;
    int client_port = 0, peer_port = 0;
    pid_t pid = -1;
  };
  static int& seq() {
    static int s = 0;
    return s;
  }
  std::string endpoint(int i) const {
    return std::string(tls_ ? "https" : "http") + "://127.0.0.1:" + std::to_string(client_port(i));
  }
  std::string running_endpoints() const {
    std::string s;
    for (std::size_t i = 0; i < members_.size(); ++i)
      if (members_[i].pid > 0) s += (s.empty() ? "" : ",") + endpoint(static_cast<int>(i));
    return s;
  }
  std::pair<std::string, int> run(const std::string& what, const std::string& eps) const {
    std::string cmd = "ETCDCTL_API=3 etcdctl --dial-timeout=1s --command-timeout=2s --endpoints=" + eps;
    if (tls_) {
      cmd += " --cacert=" + tls_->ca;
      if (tls_->mutual) cmd += " --cert=" + tls_->cert + " --key=" + tls_->key;
    }
    cmd += " " + what + " 2>&1";
    std::string out;
    if (FILE* p = ::popen(cmd.c_str(), "r")) {
      char buf[4096];
      std::size_t n = 0;
      while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
      const int st = ::pclose(p);
      return {out, WIFEXITED(st) ? WEXITSTATUS(st) : 1};
    }
    return {out, 1};
  }

  std::optional<etcd_tls> tls_;
  std::filesystem::path dir_;
  std::string initial_;
  std::vector<member> members_;
};

}  // namespace ebbflow_test
