// SPDX-License-Identifier: Apache-2.0
// The launcher's child processes: ebbflow-run's, and those of the tests that
// drive processes the same way (POSIX/Linux; not part of the library, not
// installed). Spawns workers with their own environment, captures their
// output line by line, reaps them as soon as they exit (a pidfd per child, so
// no SIGCHLD handler is needed and an exited worker never lingers as a zombie
// that peers could mistake for a live process), signals them, and tells how
// each ended.
//
// Built to grow elastic controls: children are identified by an integer id
// (the rank) chosen by the caller, can be spawned at any time, and exits are
// reported one by one, so a controller can replace or add workers at run time.
#pragma once

#include <ebbflow/core/deadline.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

extern char** environ;

namespace ebbflow_run {

//! What to start.
struct child_spec {
  int id = 0;                                            //!< caller's name for it (the rank)
  std::vector<std::string> argv;                         //!< program (searched in PATH) and arguments
  std::vector<std::pair<std::string, std::string>> env;  //!< set on top of this process's environment
  bool capture_output = true;     //!< deliver stdout/stderr lines to the handler; else inherit ours
  int nice = 0;                   //!< niceness increment the child starts with (0: as ours)
  std::vector<int> cpus;          //!< CPUs the child may run on (empty: as ours)
  std::uint64_t nofile_soft = 0;  //!< soft open-file limit the child starts with (0: as ours)
};

//! How a child ended.
struct child_exit {
  int id = 0;
  pid_t pid = -1;
  int code = -1;   //!< exit status, -1 when killed by a signal
  int signal = 0;  //!< terminating signal, 0 when it exited
  [[nodiscard]] bool ok() const noexcept { return signal == 0 && code == 0; }
  //! "exited with status 3" / "killed by signal 9 (SIGKILL)".
  [[nodiscard]] std::string describe() const {
    if (signal != 0) {
      const char* name = sigabbrev_np(signal);
      return "killed by signal " + std::to_string(signal) + (name ? std::string(" (SIG") + name + ")" : std::string());
    }
    return "exited with status " + std::to_string(code);
  }
  //! Shell-style status: the code, or 128 + signal.
  [[nodiscard]] int shell_status() const noexcept { return signal != 0 ? 128 + signal : code; }
};

//! A set of children. Not thread-safe: drive it from one thread.
class child_processes {
 public:
  //! Receives each complete line of a child's output (stream 1: stdout, 2: stderr), without the newline.
  using line_handler = std::function<void(int id, int stream, std::string_view line)>;

  explicit child_processes(line_handler on_line = {}) : on_line_(std::move(on_line)) {}
  //! Kills every child and what is left in the process groups of those that
  //! exited (see signal_leftovers), then reaps the children.
  ~child_processes() {
    signal_all(SIGKILL);
    signal_leftovers(SIGKILL);
    for (auto& [pid, c] : children_) {
      int st = 0;
      while (!c.exited && ::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
      }
      c.close_fds();
    }
  }
  child_processes(const child_processes&) = delete;
  child_processes& operator=(const child_processes&) = delete;

  //! Starts a child in its own process group (so signals reach its own
  //! children too); it is killed if this thread exits. Blocks until exec.
  //! @throws std::system_error when fork/pipe fails or the program cannot be executed.
  pid_t spawn(const child_spec& spec) {
    if (spec.argv.empty())
      throw std::system_error(std::make_error_code(std::errc::invalid_argument), "spawn: empty argv");
    // Everything the child needs is prepared before fork: after fork only
    // async-signal-safe calls are allowed.
    std::vector<std::string> envs;
    for (char** e = environ; e && *e; ++e) {
      std::string_view kv(*e);
      auto eq = kv.find('=');
      std::string_view k = kv.substr(0, eq);
      bool overridden = std::any_of(spec.env.begin(), spec.env.end(), [&](const auto& p) { return p.first == k; });
      if (!overridden) envs.emplace_back(kv);
    }
    for (const auto& [k, v] : spec.env) envs.push_back(k + "=" + v);
    std::vector<char*> envp, argv;
    for (auto& s : envs) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> args = spec.argv;
    for (auto& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);

    int out[2] = {-1, -1}, err[2] = {-1, -1}, ex[2] = {-1, -1};
    auto fail = [&](const char* what) {
      const int e = errno;
      for (int fd : {out[0], out[1], err[0], err[1], ex[0], ex[1]})
        if (fd >= 0) ::close(fd);
      throw std::system_error(e, std::generic_category(), what);
    };
    if (spec.capture_output && (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0)) fail("spawn: pipe");
    if (::pipe2(ex, O_CLOEXEC) != 0) fail("spawn: pipe");
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    for (int c : spec.cpus) {
      if (c < 0 || c >= CPU_SETSIZE)
        throw std::system_error(std::make_error_code(std::errc::invalid_argument),
                                "spawn: CPU " + std::to_string(c) + " out of range");
      CPU_SET(c, &cpus);
    }
    // Fork from the child's CPUs: the parent's half of fork (copying the page
    // tables) then runs there as well, not on a CPU it may share with
    // running workers.
    cpu_set_t ours;
    const bool rebound = !spec.cpus.empty() && ::sched_getaffinity(0, sizeof ours, &ours) == 0 &&
                         ::sched_setaffinity(0, sizeof cpus, &cpus) == 0;
    rlimit nofile{};
    const bool set_nofile = spec.nofile_soft != 0 && ::getrlimit(RLIMIT_NOFILE, &nofile) == 0;
    if (set_nofile) nofile.rlim_cur = std::min<rlim_t>(spec.nofile_soft, nofile.rlim_max);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (rebound && pid != 0) ::sched_setaffinity(0, sizeof ours, &ours);
    if (pid < 0) fail("spawn: fork");
    if (pid == 0) {
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);  // the parent died before prctl
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      for (int s : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD}) ::signal(s, SIG_DFL);
      if (spec.nice != 0) {
        errno = 0;
        const int cur = ::getpriority(PRIO_PROCESS, 0);
        if (errno == 0) ::setpriority(PRIO_PROCESS, 0, cur + spec.nice);
      }
      if (set_nofile) ::setrlimit(RLIMIT_NOFILE, &nofile);
      // Bound before exec, so not even the program's start-up runs elsewhere.
      if (!spec.cpus.empty() && ::sched_setaffinity(0, sizeof cpus, &cpus) != 0) {
        const int e = -errno;  // negative: the binding failed, not the exec
        [[maybe_unused]] auto n = ::write(ex[1], &e, sizeof e);
        ::_exit(127);
      }
      if (spec.capture_output) {
        ::dup2(out[1], 1);
        ::dup2(err[1], 2);
      }
      ::execvpe(argv[0], argv.data(), envp.data());
      const int e = errno;
      [[maybe_unused]] auto n = ::write(ex[1], &e, sizeof e);
      ::_exit(127);
    }
    ::setpgid(pid, pid);  // also from the parent: no race with signal_all()
    ::close(ex[1]);
    if (spec.capture_output) {
      ::close(out[1]);
      ::close(err[1]);
    }
    int exec_errno = 0;
    ssize_t n;
    while ((n = ::read(ex[0], &exec_errno, sizeof exec_errno)) < 0 && errno == EINTR) {
    }
    ::close(ex[0]);
    if (n > 0) {
      int st = 0;
      ::waitpid(pid, &st, 0);
      if (spec.capture_output) {
        ::close(out[0]);
        ::close(err[0]);
      }
      if (exec_errno < 0) {
        std::string list;
        for (int c : spec.cpus) list += (list.empty() ? "" : ",") + std::to_string(c);
        throw std::system_error(-exec_errno, std::generic_category(),
                                "cannot bind '" + spec.argv[0] + "' to CPUs " + list);
      }
      throw std::system_error(exec_errno, std::generic_category(), "cannot execute '" + spec.argv[0] + "'");
    }
    child c;
    c.id = spec.id;
    c.out = spec.capture_output ? out[0] : -1;
    c.err = spec.capture_output ? err[0] : -1;
    for (int fd : {c.out, c.err})
      if (fd >= 0) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    c.pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));  // -1 on old kernels: we poll instead
    children_.emplace(pid, std::move(c));
    return pid;
  }

  //! Pumps output and reaps children until at least one has exited, `d`
  //! passes, or `extra_fd` (e.g. a signalfd; -1: none) is readable (then
  //! `*extra_ready` is set). Returns the children that exited, in order.
  std::vector<child_exit> poll(ebbflow::deadline d, int extra_fd = -1, bool* extra_ready = nullptr) {
    std::vector<child_exit> exits;
    if (extra_ready) *extra_ready = false;
    for (;;) {
      reap(exits);
      if (!exits.empty()) return exits;
      std::vector<pollfd> fds;
      std::vector<std::pair<pid_t, int>> who;  // (pid, 0 pidfd / 1 out / 2 err)
      bool tick = false;
      for (auto& [pid, c] : children_) {
        if (c.pidfd >= 0) {
          fds.push_back({c.pidfd, POLLIN, 0});
          who.emplace_back(pid, 0);
        } else if (!c.exited) {
          tick = true;
        }
        if (c.out >= 0) {
          fds.push_back({c.out, POLLIN, 0});
          who.emplace_back(pid, 1);
        }
        if (c.err >= 0) {
          fds.push_back({c.err, POLLIN, 0});
          who.emplace_back(pid, 2);
        }
      }
      if (extra_fd >= 0) fds.push_back({extra_fd, POLLIN, 0});
      // To the nanosecond: poll(2)'s milliseconds would round the last
      // fraction of one down to 0 and spin through it.
      auto wait = std::min<std::chrono::nanoseconds>(d.remaining(), std::chrono::seconds(1));  // re-check now and then
      if (tick) wait = std::min<std::chrono::nanoseconds>(wait, std::chrono::milliseconds(20));
      if (d.expired() && fds.empty()) return exits;
      const timespec ts{static_cast<std::time_t>(wait.count() / 1'000'000'000),
                        static_cast<long>(wait.count() % 1'000'000'000)};
      const int r = ::ppoll(fds.data(), fds.size(), &ts, nullptr);
      if (r < 0 && errno != EINTR) return exits;
      if (r > 0) {
        for (std::size_t i = 0; i < who.size(); ++i) {
          if (!fds[i].revents) continue;
          auto it = children_.find(who[i].first);
          if (it == children_.end()) continue;
          if (who[i].second != 0) pump(it->second, who[i].second);  // pidfd readiness: reap() below
        }
        if (extra_fd >= 0 && fds.back().revents && extra_ready) {
          *extra_ready = true;
          reap(exits);
          return exits;
        }
      }
      reap(exits);
      if (!exits.empty() || d.expired()) return exits;
    }
  }

  //! Sends `sig` to every running child's process group.
  void signal_all(int sig) noexcept {
    for (auto& [pid, c] : children_)
      if (!c.exited && ::kill(-pid, sig) != 0) ::kill(pid, sig);
  }
  //! Sends `sig` to what is left in the process group of each child that
  //! has exited: processes it started and left behind (a background job, a
  //! grandchild that ignored the SIGTERM its parent died of). Returns how many
  //! groups still had members. (A child's own exit does not end its group.)
  std::size_t signal_leftovers(int sig) noexcept {
    prune_left_groups();
    std::size_t n = 0;
    for (pid_t pgid : left_groups_) n += ::kill(-pgid, sig) == 0;
    return n;
  }
  //! Sends `sig` to what the exited child `pid` left running in its process
  //! group; false when nothing is left there.
  bool signal_left_group(pid_t pid, int sig) noexcept {
    prune_left_groups();
    return std::find(left_groups_.begin(), left_groups_.end(), pid) != left_groups_.end() && ::kill(-pid, sig) == 0;
  }
  //! Sends `sig` to one child (by id); false when it is not running.
  bool signal(int id, int sig) noexcept {
    for (auto& [pid, c] : children_)
      if (c.id == id && !c.exited) return ::kill(-pid, sig) == 0 || ::kill(pid, sig) == 0;
    return false;
  }
  //! Children still running.
  [[nodiscard]] std::size_t running() const noexcept {
    return static_cast<std::size_t>(
        std::count_if(children_.begin(), children_.end(), [](const auto& p) { return !p.second.exited; }));
  }
  //! pid of a running child (by id), or -1.
  [[nodiscard]] pid_t pid_of(int id) const noexcept {
    for (const auto& [pid, c] : children_)
      if (c.id == id && !c.exited) return pid;
    return -1;
  }

 private:
  struct child {
    int id = 0;
    int out = -1, err = -1, pidfd = -1;
    std::string part[3];  // partial lines of stdout (1) and stderr (2)
    bool exited = false;
    void close_fds() noexcept {
      for (int* fd : {&out, &err, &pidfd})
        if (*fd >= 0) {
          ::close(*fd);
          *fd = -1;
        }
    }
  };

  void pump(child& c, int stream) {
    int& fd = stream == 1 ? c.out : c.err;
    char buf[65536];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n > 0) {
        std::string& p = c.part[stream];
        p.append(buf, static_cast<std::size_t>(n));
        std::size_t start = 0, nl;
        while ((nl = p.find('\n', start)) != std::string::npos) {
          if (on_line_) on_line_(c.id, stream, std::string_view(p).substr(start, nl - start));
          start = nl + 1;
        }
        p.erase(0, start);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      // EOF or error: flush a last line without newline.
      if (!c.part[stream].empty() && on_line_) on_line_(c.id, stream, c.part[stream]);
      c.part[stream].clear();
      ::close(fd);
      fd = -1;
      return;
    }
  }

  // A group whose leader has exited is kept while it has members: the
  // kernel does not hand out its number as a new pid or group meanwhile. Once
  // it is empty it is dropped at the next reap, so a later kill(-pgid) cannot
  // reach an unrelated group that took the number (the window is one poll).
  void prune_left_groups() noexcept {
    std::erase_if(left_groups_, [](pid_t pgid) { return ::kill(-pgid, 0) != 0 && errno == ESRCH; });
  }

  void reap(std::vector<child_exit>& exits) {
    prune_left_groups();
    for (auto it = children_.begin(); it != children_.end();) {
      child& c = it->second;
      int st = 0;
      const pid_t r = c.exited ? 0 : ::waitpid(it->first, &st, WNOHANG);
      if (r == it->first) {
        c.exited = true;
        // Deliver what it wrote before dying before anyone reports its exit.
        if (c.out >= 0) pump(c, 1);
        if (c.err >= 0) pump(c, 2);
        child_exit e;
        e.id = c.id;
        e.pid = it->first;
        if (WIFSIGNALED(st))
          e.signal = WTERMSIG(st);
        else
          e.code = WEXITSTATUS(st);
        exits.push_back(e);
        if (::kill(-it->first, 0) == 0 || errno == EPERM) left_groups_.push_back(it->first);
        if (c.pidfd >= 0) {
          ::close(c.pidfd);
          c.pidfd = -1;
        }
      }
      // Keep an exited child's pipes open while a grandchild may still write; drop when closed.
      if (c.exited && c.out < 0 && c.err < 0) {
        it = children_.erase(it);
      } else {
        ++it;
      }
    }
  }

  line_handler on_line_;
  std::map<pid_t, child> children_;
  std::vector<pid_t> left_groups_;  // process groups of exited children that still have members
};

}  // namespace ebbflow_run
