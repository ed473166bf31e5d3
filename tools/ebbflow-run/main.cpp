// SPDX-License-Identifier: Apache-2.0
// ebbflow-run: starts N ranks of a program on this machine around an embedded
// rendezvous store (like torchrun / mpirun for one host). See docs/launcher.md.
#include <ebbflow/core/env.hpp>
#include <ebbflow/core/log.hpp>
#include <ebbflow/elastic/cooldown.hpp>
#include <ebbflow/elastic/detail/hmac.hpp>
#include <ebbflow/elastic/group.hpp>
#include <ebbflow/elastic/any_store.hpp>
#include <ebbflow/elastic/tcp_store.hpp>

#include "../../examples/common/args.hpp"  // the command line
#include "child_processes.hpp"

#include <sched.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace ef = ebbflow;
namespace el = ebbflow::elastic;
using namespace std::chrono_literals;

namespace {

// Actions due at a time (seconds since the job started): SIGCONT for a
// worker stopped by --stop, a restart after its cool-down.
template <class T>
struct due_list {
  std::vector<std::pair<double, T>> items;
  void add(double at, T v) { items.emplace_back(at, std::move(v)); }
  // Calls f(v) for each item due by now, in the order added, and drops it.
  template <class F>
  void take_due(double now, F&& f) {
    std::vector<T> due;
    std::erase_if(items, [&](auto& it) {
      if (now < it.first) return false;
      due.push_back(std::move(it.second));
      return true;
    });
    for (auto& v : due) f(v);
  }
};

struct options {
  int n = 0;
  std::string store = "127.0.0.1:0";
  ef::env::host_port store_at{"127.0.0.1", 0};  // --store, parsed
  bool attach = false;
  bool store_remote = false;  // --store is a TLS or etcd address (implies --attach)
  std::optional<std::string> token;
  std::optional<double> timeout_s;
  double kill_after_s = 5;
  bool prefix = true;
  bool elastic = false;
  int min_size = 0, max_size = 0;
  int join_nice = 0;
  int sched_slice_us = 0;  // --sched-slice-us
  int rt_priority = 0;     // --rt-priority
  int cpu_bind = 0;        // workers per CPU; 0: no binding
  int store_cpu = -1;      // --store-cpu: the launcher's (and store's) CPU; -1: worker 0's
  struct event {
    double at;
    enum kind { add, kill, leave, stop } what;
    int arg;
    double for_s = 0;  // stop: how long
  };
  std::vector<event> events;
  bool events_from_training = false;  // --event-clock training
  int restarts = 0;
  el::cooldown restart_cooldown;  // --restart-cooldown (default 1:60)
  std::string discovery;
  double discovery_interval = 2;
  double discovery_timeout = 10;
  std::vector<std::string> argv;
};

constexpr int max_workers = 4096;

// What `ebbflow-run --help` says before and after the options.
constexpr const char* synopsis =
    "usage: ebbflow-run -n N [options] -- program [args...]\n"
    "Starts N processes of `program` with EBBFLOW_RANK, EBBFLOW_WORLD_SIZE, EBBFLOW_LOCAL_RANK,\n"
    "EBBFLOW_STORE and EBBFLOW_TOKEN set, around an embedded rendezvous store.\n"
    "options:\n";
constexpr const char* epilogue =
    "  SIGUSR1 / SIGUSR2    to ebbflow-run: add one worker / ask the newest to leave\n"
    "Joining workers get EBBFLOW_JOIN=1 and no EBBFLOW_RANK (the group assigns ranks).\n"
    "EBBFLOW_LOCAL_RANK is the lowest index no running worker of this launcher holds (0..N-1 for the\n"
    "initial workers; a joiner or restarted worker takes the index a worker that exited left free).\n"
    "Exit status: what stopped the job first decides: a failed rank, its status (128+signal when\n"
    "killed); --timeout, 124; an interrupt, 128+signal. Else 0 when every rank exits 0 (--elastic:\n"
    "when a worker finished with 0; else the first failure's status).\n";

// A positive number of seconds (at most 1e7) into `out`; false when `v` is not one.
template <class T>
bool seconds_into(const std::string& v, T& out) {
  const auto s = cli::parse_number<double>(v, 0, 1e7);
  if (!s || !(*s > 0)) return false;
  out = *s;
  return true;
}
constexpr const char* positive_seconds = "a positive number of seconds";

// A timed event: "SEC:ID" (with `for_s`: "SEC:ID:FOR"; `id_optional`: "SEC[:K]", K 1 when left out).
bool event_into(const std::string& v, options::event::kind what, options& o) {
  options::event ev{};
  ev.what = what;
  const auto c1 = v.find(':');
  const auto c2 = c1 == std::string::npos ? c1 : v.find(':', c1 + 1);
  const bool stop = what == options::event::stop;
  if (!seconds_into(v.substr(0, c1), ev.at)) return false;
  if (c1 == std::string::npos) {
    if (what != options::event::add) return false;
    ev.arg = 1;
  } else {
    const auto id = cli::parse_number<int>(std::string_view(v).substr(c1 + 1, stop ? c2 - c1 - 1 : std::string::npos),
                                           0, 1 << 20);
    if (!id || (stop && (c2 == std::string::npos || !seconds_into(v.substr(c2 + 1), ev.for_s)))) return false;
    ev.arg = *id;
  }
  o.events.push_back(ev);
  o.elastic = true;
  return true;
}

options parse(int argc, char** argv) {
  options o;
  bool no_prefix = false;
  namespace ge = ef::elastic;
  using ev = options::event;
  cli::parser p("ebbflow-run", synopsis, epilogue);
  p.number("-n, --nproc", "N", o.n, 1, max_workers, "number of ranks (1..4096)")
      .value("--store", "ADDR", "HOST:PORT, tcp+tls://HOST:PORT, etcd://H:P,... or etcds://H:P,...",
             [&](const std::string& v) {
               o.store = v;
               try {
                 if (v.find("://") == std::string::npos) {  // the embedded store's bind address: port 0 = free port
                   o.store_remote = false;
                   o.store_at = ef::env::parse_host_port(v, "--store");
                   return true;
                 }
                 const auto a = ge::store_address::parse(v, "--store");
                 o.store_remote = a.scheme != ge::store_address::kind::tcp;
                 o.store_at = {a.endpoints[0].host, a.endpoints[0].port};
               } catch (const std::invalid_argument&) {
                 return false;
               }
               return true;
             },
             "address the embedded store binds (default 127.0.0.1:0 = free port); with\n"
             "--attach, the store to use: an ebbflow-store (HOST:PORT, or tcp+tls://\n"
             "with EBBFLOW_TLS_CA...) or etcd (etcd://H1:P1,H2:P2[/prefix], etcds://),\n"
             "which imply --attach")
      .flag("--attach", o.attach,
            "use an existing store at --store instead of starting one; the job gets\n"
            "a fresh EBBFLOW_JOB (store key prefix) unless one is set")
      .value("--token", "T", "a token",
             [&](const std::string& v) {
               o.token = v;
               return true;
             },
             "job token (default: EBBFLOW_TOKEN, else a random one; with --attach,\n"
             "else the empty token, as ebbflow-store's default)")
      .value("--timeout", "SEC", positive_seconds, [&](const std::string& v) { return seconds_into(v, o.timeout_s); },
             "stop the job after SEC seconds (exit status 124)")
      .value("--kill-after", "SEC", positive_seconds,
             [&](const std::string& v) { return seconds_into(v, o.kill_after_s); },
             "after stopping ranks with SIGTERM, SIGKILL them after SEC s (default 5)")
      .flag("--no-prefix", no_prefix, "do not prefix output lines with \"[rank R] \" (\"[worker ID] \" with --elastic)")
      .note("elastic controls (workers use <ebbflow/elastic/group.hpp>; --add, --kill, --leave, --stop,\n"
            "--restart and --discovery imply --elastic):")
      .flag("--elastic", o.elastic,
            "a failed worker does not stop the job; exit 0 when a worker finished with 0;\n"
            "what a failed worker left in its process group is killed at once, and the\n"
            "job is told (each worker gets EBBFLOW_PROCESS_KEY=<launcher>/<worker id>)")
      .number("--min", "N", o.min_size, 1, 1 << 20, "membership lower bound passed to workers (EBBFLOW_MIN_SIZE)")
      .number("--max", "N", o.max_size, 1, 1 << 20, "membership upper bound passed to workers (EBBFLOW_MAX_SIZE)")
      .value("--add", "SEC[:K]", "SEC[:K]: positive seconds, K an integer in [0, 1048576]",
             [&](const std::string& v) { return event_into(v, ev::add, o); },
             "after SEC seconds start K (default 1) more workers that join the running job")
      .value("--kill", "SEC:ID", "SEC:ID: positive seconds, ID an integer in [0, 1048576]",
             [&](const std::string& v) { return event_into(v, ev::kill, o); },
             "after SEC seconds SIGKILL worker ID (fault injection)")
      .value("--leave", "SEC:ID", "SEC:ID: positive seconds, ID an integer in [0, 1048576]",
             [&](const std::string& v) { return event_into(v, ev::leave, o); },
             "after SEC seconds SIGTERM worker ID (graceful leave at the next step)")
      .value("--stop", "SEC:ID:FOR", "SEC:ID:FOR: positive seconds, ID an integer in [0, 1048576]",
             [&](const std::string& v) { return event_into(v, ev::stop, o); },
             "after SEC seconds SIGSTOP worker ID, and SIGCONT it FOR seconds later\n"
             "(fault injection: a hung worker, dropped when its lease expires)")
      .value("--event-clock", "C", "launch or training",
             [&](const std::string& v) {
               o.events_from_training = v == "training";
               return v == "launch" || v == "training";
             },
             "what the SEC of --add/--kill/--leave/--stop count from: launch (default),\n"
             "or training: the job's first generation, so that on a loaded host no\n"
             "event lands while the workers still start (read from the store's\n"
             "<EBBFLOW_JOB>/gen/0)")
      .number("--restart", "K", o.restarts, 0, 1 << 20, "restart a failed worker as a joiner, up to K times in all")
      .value("--restart-cooldown", "SEC[:MAX]", "SEC[:MAX], seconds in [0, 86400], MAX not below SEC",
             [&](const std::string& v) {
               try {
                 o.restart_cooldown = el::cooldown::parse(v, "--restart-cooldown");
               } catch (const std::invalid_argument&) {
                 return false;
               }
               return true;
             },
             "a worker that keeps failing (each incarnation within MAX s of\n"
             "its start, default 60) is restarted after a cool-down: none after its\n"
             "first failure, then SEC (default 1), doubling per failure, at most MAX")
      .number("--join-nice", "N", o.join_nice, 1, 19,
              "start joiners N nice levels lower (1..19) so their start-up does not take\n"
              "CPU from the running workers on a shared host; the group restores the\n"
              "priority once the worker is admitted (needs CAP_SYS_NICE, else it warns)")
      .number("--sched-slice-us", "N", o.sched_slice_us, static_cast<int>(ge::group_options::min_sched_slice.count()),
              static_cast<int>(ge::group_options::max_sched_slice.count()),
              "every worker asks for an N us scheduler slice (100..100000; Linux 6.12+)\n"
              "once it is a member (EBBFLOW_SCHED_SLICE_US): woken by its data it takes\n"
              "the core from a process computing beside it, e.g. a joiner starting up")
      .number("--rt-priority", "N", o.rt_priority, 1, ge::group_options::max_rt_priority,
              "every worker's training and heartbeat threads run SCHED_RR at priority N\n"
              "(1..99) once it is a member (EBBFLOW_RT_PRIORITY): joiners starting up on a\n"
              "shared host then run only on cores the members leave idle (needs\n"
              "CAP_SYS_NICE or RLIMIT_RTPRIO)")
      .value("--cpu-bind", "core[:K]", "none, core or core:K (K an integer in [1, 4096])",
             [&](const std::string& v) {
               const auto k = v.rfind("core:", 0) == 0 ? cli::parse_number<int>(std::string_view(v).substr(5), 1, 4096)
                                                       : std::nullopt;
               o.cpu_bind = v == "none" ? 0 : v == "core" ? 1 : k.value_or(0);
               return v == "none" || v == "core" || k;
             },
             "bind worker ID (initial or joiner) to one CPU of ours: CPU number ID/K\n"
             "(default K=1) of the CPUs this launcher may use, wrapping around; on a\n"
             "shared host it keeps the start-up of joiners off the running workers' cores;\n"
             "the launcher and its store run on worker 0's CPU")
      .number("--store-cpu", "N", o.store_cpu, 0, CPU_SETSIZE - 1,
              "with --cpu-bind: run the launcher and its store on CPU N instead (one of\n"
              "the CPUs this launcher may use), e.g. off the running workers' CPU")
      .text("--discovery", "CMD", o.discovery,
            "poll CMD (every --discovery-interval SEC): it prints the wanted number\n"
            "of workers; more are started, or the newest asked to leave. It runs\n"
            "beside the job; output that is not a whole number (0..4096), a failure, or\n"
            "no answer within --discovery-timeout SEC (then it is killed) keeps the\n"
            "workers there are, with a warning")
      .value("--discovery-interval", "SEC", positive_seconds,
             [&](const std::string& v) { return seconds_into(v, o.discovery_interval); },
             "how often --discovery runs (default 2)")
      .value("--discovery-timeout", "SEC", positive_seconds,
             [&](const std::string& v) { return seconds_into(v, o.discovery_timeout); },
             "how long --discovery may take (default 10)");
  p.parse(argc, argv, &o.argv);
  o.prefix = !no_prefix;
  if (o.n == 0) p.error("-n N is required");
  if (o.argv.empty()) p.error("no program given");
  if (!o.discovery.empty() || o.restarts > 0) o.elastic = true;
  if (o.min_size && o.max_size && o.min_size > o.max_size) p.error("--min is larger than --max");
  if (o.min_size > o.n)
    p.error("--min " + std::to_string(o.min_size) + " is larger than -n " + std::to_string(o.n) +
            ": the first generation is formed from the launched workers");
  if (o.store_remote) o.attach = true;  // a TLS or etcd address names a store that runs elsewhere
  if (o.attach && o.store_at.port == 0) p.error("--attach needs --store HOST:PORT with a port");
  if (o.store_cpu >= 0 && !o.cpu_bind) p.error("--store-cpu needs --cpu-bind (else the workers would inherit it)");
  return o;
}

void write_all(int fd, const std::string& s) {
  std::size_t off = 0;
  while (off < s.size()) {
    const ssize_t w = ::write(fd, s.data() + off, s.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    off += static_cast<std::size_t>(w);
  }
}

void say(const std::string& msg) { write_all(2, "ebbflow-run: " + msg + "\n"); }

std::string seconds_text(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", s);
  return b;
}

// A timed event as it was given: "--add 30:1", "--kill 5:2", "--stop 3:1:2".
std::string event_text(const options::event& ev) {
  constexpr const char* names[] = {"--add ", "--kill ", "--leave ", "--stop "};
  std::string t = names[ev.what] + seconds_text(ev.at) + ":" + std::to_string(ev.arg);
  if (ev.what == options::event::stop) t += ":" + seconds_text(ev.for_s);
  return t;
}


// Tells the store which failed worker's process exited (report_process_exit),
// on a thread and a connection of its own: a store that is slow or stopped
// answering holds up none of the launcher's loop (exits, signals, --timeout,
// restarts). Each report has `limit`. `close` ends it when the job is over.
class exit_reporter {
 public:
  exit_reporter(std::string at, std::string token, el::group_options job, std::chrono::milliseconds limit)
      : at_(std::move(at)), token_(std::move(token)), job_(std::move(job)), limit_(limit) {}
  exit_reporter(const exit_reporter&) = delete;
  exit_reporter& operator=(const exit_reporter&) = delete;
  ~exit_reporter() { close(false); }

  void report(int id, std::string process_key, std::string how) {
    {
      std::lock_guard lk(m_);
      if (closing_) return;
      queue_.push_back({id, std::move(process_key), std::move(how)});
    }
    if (!thread_.joinable()) {
      try {
        thread_ = std::jthread([this] { run(); });
      } catch (const std::system_error& e) {  // no thread to be had: the leases decide
        std::lock_guard lk(m_);
        queue_.clear();
        say(std::string("cannot start the thread that reports exits to the store (") + e.what() +
            "): the others find out from their transports or the worker's lease");
        return;
      }
    }
    cv_.notify_one();
  }

  // Ends the reports, before the store goes. With `drain` (other launchers'
  // workers may still be in the job), those still queued are sent first,
  // within one limit in all, and one line names those that could not be;
  // without, they are dropped with nothing said: the job is over and the
  // store goes with it, so nobody is left to tell.
  void close(bool drain) {
    {
      std::lock_guard lk(m_);
      if (closing_) return;
      closing_ = true;
      drain_by_ = ef::deadline::after(limit_);
      if (!drain) queue_.clear();
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
    if (!unsent_.empty())
      say("did not tell the store that worker(s) " + unsent_ + " exited: the job ended first" +
          (unsent_why_.empty() ? "" : " (" + unsent_why_ + ")"));
  }

 private:
  struct item {
    int id;
    std::string key, how;
  };
  void run() {
    std::unique_ptr<el::any_store> client;
    for (;;) {
      item r;
      bool closing = false;
      ef::deadline d = ef::deadline::after(limit_);
      {
        std::unique_lock lk(m_);
        cv_.wait(lk, [&] { return !queue_.empty() || closing_; });
        if (queue_.empty()) return;  // closing, nothing left
        if (closing_ && drain_by_.expired()) {
          for (const auto& left : queue_) unsent_ += (unsent_.empty() ? "" : ", ") + std::to_string(left.id);
          return;
        }
        r = std::move(queue_.front());
        queue_.pop_front();
        closing = closing_;
        if (closing) d = min(d, drain_by_);
      }
      try {
        if (!client) client = std::make_unique<el::any_store>(el::any_store::connect(at_, token_));
        el::report_process_exit(*client, job_, r.key, r.how, d);
      } catch (const std::exception& x) {
        client.reset();  // a reply that did not come would be taken for the next request's
        if (closing) {   // said once, by close()
          unsent_ += (unsent_.empty() ? "" : ", ") + std::to_string(r.id);
          if (unsent_why_.empty()) unsent_why_ = x.what();
        } else {
          say("could not tell the store that worker " + std::to_string(r.id) + " exited (" + x.what() +
              "): the others find out from their transports or its lease");
        }
      }
    }
  }
  std::string at_;  // the store's address (any backend)
  std::string token_;
  el::group_options job_;
  std::chrono::milliseconds limit_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<item> queue_;
  bool closing_ = false;             // under m_
  ef::deadline drain_by_ = ef::deadline::never();  // under m_: when close() stops sending
  std::string unsent_, unsent_why_;  // the reporter thread's, read after it joined
  std::jthread thread_;              // last: it stops and joins before the queue goes
};

// `s` without the white space around it.
std::string_view trimmed(std::string_view s) {
  constexpr std::string_view space = " \t\r\n\v\f";
  const auto first = s.find_first_not_of(space);
  return first == std::string_view::npos ? std::string_view() : s.substr(first, s.find_last_not_of(space) - first + 1);
}

// What --discovery printed, as the wanted number of workers: the whole output
// must be one decimal number in [0, max_workers], with nothing but white space
// around it. Anything else ("", "garbage", "3abc", "-1", two lines) is no
// answer, not 0 or a prefix: a broken command must not scale the job down.
std::optional<int> parse_worker_count(std::string_view out) { return cli::parse_number(trimmed(out), 0, max_workers); }

// `s` in double quotes, trimmed, with control characters escaped and at most
// about 200 characters shown, for a warning line.
std::string quote_output(std::string_view s) {
  s = trimmed(s);
  std::string q = "\"";
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i == 200) {
      q += "...";
      break;
    }
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\n') {
      q += "\\n";
    } else if (c == '"' || c == '\\') {
      q += '\\';
      q += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      q += b;
    } else {
      q += static_cast<char>(c);
    }
  }
  return q + "\"";
}

// Wall-clock stamp for event lines, so reports can align them with metrics.
std::string stamp() {
  char b[48];
  std::snprintf(b, sizeof b, " [t=%.3f]", ebbflow::wall_seconds());
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  const options opt = parse(argc, argv);

  // Signals arrive through a signalfd on this thread. Block them before the
  // store's thread starts so it inherits the mask; children get a clean mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2}) sigaddset(&sigs, s);
  ::pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  const int sigfd = ::signalfd(-1, &sigs, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sigfd < 0) {
    say(std::string("signalfd: ") + std::strerror(errno));
    return 1;
  }

  // --cpu-bind: the CPUs this launcher may use, in order. The launcher and
  // its store (started below: its thread inherits this) run on worker 0's.
  std::vector<int> cpus;
  if (opt.cpu_bind) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (::sched_getaffinity(0, sizeof set, &set) != 0) {
      say(std::string("--cpu-bind: sched_getaffinity: ") + std::strerror(errno));
      return 1;
    }
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    if (opt.store_cpu >= 0 && std::find(cpus.begin(), cpus.end(), opt.store_cpu) == cpus.end()) {
      std::string allowed;
      for (int c : cpus) allowed += (allowed.empty() ? "" : ",") + std::to_string(c);
      cli::usage_error("ebbflow-run", "--store-cpu " + std::to_string(opt.store_cpu) +
                                          ": not one of the CPUs this launcher may use (" + allowed + ")");
    }
    CPU_ZERO(&set);
    CPU_SET(opt.store_cpu >= 0 ? opt.store_cpu : cpus.front(), &set);
    if (::sched_setaffinity(0, sizeof set, &set) != 0)
      say(std::string("--cpu-bind: cannot bind the launcher: ") + std::strerror(errno));
  }

  std::string token;
  if (opt.token)
    token = *opt.token;
  else if (auto t = ef::env::get("EBBFLOW_TOKEN"))
    token = *t;
  else if (!opt.attach)
    token = el::detail::random_hex(16);  // a store of our own: a secret of our own
  // else the empty token, which an ebbflow-store started without one expects

  // The embedded store holds three connections per worker: lift this
  // process's open-file limit; the workers start with the limit we had.
  const el::open_file_limit nofile = opt.attach ? el::open_file_limit{} : el::raise_open_file_limit();

  std::unique_ptr<el::store_server> server;
  std::string store_addr;
  ef::env::host_port store_at = opt.store_at;  // where this launcher's own calls go
  try {
    const auto& hp = opt.store_at;
    if (opt.attach) {
      store_addr = opt.store;
    } else {
      el::server_options so;
      so.host = hp.host;
      so.port = hp.port;
      so.token = token;
      so.tls = el::server_options::from_environment().tls;  // EBBFLOW_STORE_TLS_CERT/_KEY: a TLS store
      server = std::make_unique<el::store_server>(so);
      // Ranks connect to loopback when the store listens on every address.
      std::string host = hp.host == "0.0.0.0" ? "127.0.0.1" : hp.host == "::" ? "::1" : hp.host;
      store_addr = std::string(so.tls.enabled() ? "tcp+tls://" : "") +
                   (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
                   std::to_string(server->port());
      store_at = {host, server->port()};
    }
  } catch (const std::exception& e) {
    say(std::string("cannot start the store: ") + e.what());
    return 1;
  }
  // A store that outlives its jobs (--attach) holds every earlier job's keys
  // under its EBBFLOW_JOB prefix: a job without a name of its own gets a
  // fresh one, and a named job that already finished there is refused (its
  // workers would take the old job's generations for theirs). A named job
  // still running there is joined: its workers become newcomers.
  // The launcher's own store client: this check, then --event-clock
  // training's probe for the first generation.
  std::unique_ptr<el::any_store> launcher_client;
  if (opt.attach) {
    try {
      launcher_client = std::make_unique<el::any_store>(el::any_store::connect(store_addr, token));
      auto& probe = *launcher_client;
      probe.ping(ef::deadline::after(std::chrono::seconds(10)));
      if (auto named = ef::env::get("EBBFLOW_JOB")) {
        const std::string done_key = el::group_options::from_environment().prefix + "/done";
        if (probe.try_get(done_key, ef::deadline::after(std::chrono::seconds(10)))) {
          say("the store at " + store_addr + " already holds a finished job EBBFLOW_JOB=" + *named +
              ": name this job otherwise, or leave EBBFLOW_JOB unset for a fresh name");
          return 2;
        }
      } else {
        const std::string job = "ebbflow-" + el::detail::random_hex(6);
        ::setenv("EBBFLOW_JOB", job.c_str(), 1);
        say("job " + job + " on the store at " + store_addr + " (EBBFLOW_JOB=" + job +
            " lets a worker started elsewhere join it)");
      }
    } catch (const ef::system_error& e) {
      if (e.code() == ef::errc::unauthorized)
        say("the store at " + store_addr + " refused the job token: pass the token it was started with (--token " +
            "or EBBFLOW_TOKEN; without either, the empty token)");
      else
        say("cannot use the store at " + store_addr + ": " + e.what());
      return 1;
    } catch (const std::exception& e) {
      say("cannot use the store at " + store_addr + ": " + e.what());
      return 1;
    }
  }

  ebbflow_run::child_processes group([&](int id, int stream, std::string_view line) {
    std::string out;
    // Elastic jobs renumber ranks as workers come and go: name the worker.
    // A line of the library's log carries a prefix of its own, "[ebbflow
    // rank R]": one prefix holds both, "[worker 2, ebbflow rank 1] warn: ...".
    if (opt.prefix) {
      out = (opt.elastic ? "[worker " : "[rank ") + std::to_string(id);
      if (line.starts_with("[ebbflow")) {
        out += ", ";
        line.remove_prefix(1);
      } else {
        out += "] ";
      }
    }
    out.append(line);
    out.push_back('\n');
    write_all(stream == 1 ? 1 : 2, out);
  });

  // Initial workers get ranks 0..n-1; workers started later join the running
  // job (EBBFLOW_JOIN=1) and are named by the next free id.
  int next_id = 0;
  const std::string host = ef::env::host_name();
  // This launcher's name in the job: its workers' EBBFLOW_PROCESS_KEY is
  // "<it>/<worker id>", under which the exit of one is reported.
  const std::string launcher_key = el::detail::random_hex(6);
  auto process_key = [&](int id) { return launcher_key + "/" + std::to_string(id); };
  std::vector<int> alive;  // ids of running workers, oldest first
  // A restarted worker stands in for the one that failed: its slot (the
  // first worker's id) carries the count of failures in a row.
  std::map<int, int> slot_of;                              // by worker id
  std::map<int, ef::steady_clock::time_point> started_at;  // by worker id
  std::map<int, int> failures_in_a_row;                    // by slot
  // EBBFLOW_LOCAL_RANK (a GPU index, say) of every running worker: the lowest
  // index none of them holds, so joiners reuse the indices of workers gone.
  std::map<int, int> local_of;  // by worker id, while it runs
  auto free_local_index = [&] {
    std::set<int> held;
    for (const auto& [id, l] : local_of) held.insert(l);
    int l = 0;
    while (held.count(l)) ++l;
    return l;
  };
  auto spawn = [&](bool joiner, int slot) {
    ebbflow_run::child_spec spec;
    spec.id = next_id++;
    slot_of[spec.id] = slot >= 0 ? slot : spec.id;
    started_at[spec.id] = ef::steady_clock::now();
    spec.argv = opt.argv;
    spec.nofile_soft = nofile.soft;
    if (joiner) {
      spec.env = {{"EBBFLOW_JOIN", "1"}, {"EBBFLOW_WORKER_ID", std::to_string(spec.id)}};
      if (opt.join_nice) {
        spec.nice = opt.join_nice;
        spec.env.push_back({"EBBFLOW_JOIN_NICE", std::to_string(opt.join_nice)});
      }
    } else {
      spec.env = {{"EBBFLOW_RANK", std::to_string(spec.id)},
                  {"EBBFLOW_WORLD_SIZE", std::to_string(opt.n)},
                  {"EBBFLOW_WORKER_ID", std::to_string(spec.id)}};
    }
    if (opt.sched_slice_us) spec.env.push_back({"EBBFLOW_SCHED_SLICE_US", std::to_string(opt.sched_slice_us)});
    if (opt.rt_priority) spec.env.push_back({"EBBFLOW_RT_PRIORITY", std::to_string(opt.rt_priority)});
    if (!cpus.empty()) spec.cpus = {cpus[static_cast<std::size_t>(spec.id / opt.cpu_bind) % cpus.size()]};
    local_of[spec.id] = free_local_index();
    spec.env.push_back({"EBBFLOW_LOCAL_RANK", std::to_string(local_of[spec.id])});
    // The group's join cool-down counts failures per worker key: a restarted
    // worker keeps the key of the slot it stands in for.
    spec.env.push_back({"EBBFLOW_WORKER_KEY", host + "/" + std::to_string(slot_of[spec.id])});
    if (opt.elastic) spec.env.push_back({"EBBFLOW_PROCESS_KEY", process_key(spec.id)});
    spec.env.push_back({"EBBFLOW_STORE", store_addr});
    // A replicated store that lost its quorum comes back: a failure meanwhile
    // waits for it (docs/store.md) rather than ending the job.
    if (store_addr.starts_with("etcd") && !ef::env::get("EBBFLOW_STORE_OUTAGE_MS"))
      spec.env.push_back({"EBBFLOW_STORE_OUTAGE_MS", "60000"});
    spec.env.push_back({"EBBFLOW_TOKEN", token});
    if (opt.min_size) spec.env.push_back({"EBBFLOW_MIN_SIZE", std::to_string(opt.min_size)});
    if (opt.max_size) spec.env.push_back({"EBBFLOW_MAX_SIZE", std::to_string(opt.max_size)});
    group.spawn(spec);
    alive.push_back(spec.id);
    if (joiner) say("started worker " + std::to_string(spec.id) + " (joins the running job)" + stamp());
  };
  for (int r = 0; r < opt.n; ++r) {
    try {
      spawn(false, -1);
    } catch (const std::exception& e) {
      say("rank " + std::to_string(r) + ": " + e.what());
      group.signal_all(SIGKILL);
      return 127;
    }
  }
  const auto started = ef::steady_clock::now();
  auto since_start = [&] { return std::chrono::duration<double>(ef::steady_clock::now() - started).count(); };
  std::vector<bool> event_done(opt.events.size(), false);
  // The clock of the timed events: the launch, or (--event-clock training)
  // the first generation, which the workers record in the store; until it
  // forms, no event is due.
  std::optional<ef::steady_clock::time_point> events_zero;
  std::string gen0_key;
  el::group_options job;  // the workers' settings (EBBFLOW_JOB names the keys)
  if (opt.elastic) {
    try {
      job = el::group_options::from_environment();
    } catch (const std::exception& e) {
      say(e.what());
      group.signal_all(SIGKILL);
      return 2;
    }
  }
  if (!opt.events_from_training) {
    events_zero = started;
  } else if (!opt.events.empty()) {
    gen0_key = job.generation_key(0);
    if (!launcher_client) launcher_client = std::make_unique<el::any_store>(el::any_store::connect(store_addr, token));
  }
  if (!opt.elastic) launcher_client.reset();  // no further use: the store need not hold it
  // A worker that failed: what it started goes with it (its process group),
  // then the members hear at once which member it was, instead of waiting
  // for its lease where no transport of theirs saw it die.
  exit_reporter reporter(store_addr, token, job, 1s);
  auto report_exit = [&](const ebbflow_run::child_exit& e) {
    group.signal_left_group(e.pid, SIGKILL);
    // With a store of our own, the job is ours alone: once no worker runs,
    // nobody is left to tell (the store goes when the launcher ends).
    if (group.running() == 0 && !opt.attach) return;
    reporter.report(e.id, process_key(e.id), e.describe());
  };
  due_list<int> stopped;           // workers stopped by --stop, by when to SIGCONT them
  due_list<int> pending_restarts;  // worker slots to restart after their cool-down
  int restarts_left = opt.restarts;
  int finished_ok = 0;
  double next_discovery = opt.discovery.empty() ? 1e300 : 0;
  auto add_workers = [&](int k, int slot = -1) {
    for (int i = 0; i < k; ++i) {
      try {
        spawn(true, slot);
      } catch (const std::exception& e) {
        say(std::string("cannot start a worker: ") + e.what());
      }
    }
  };
  // Workers the launcher asked to leave (--discovery, SIGUSR2, --leave): their
  // exit, however it comes, is a retirement, never a failure to restart.
  std::set<int> retiring;
  auto retire_newest = [&](int k) {
    for (int i = 0; i < k && !alive.empty(); ++i) {
      const int id = alive.back();
      alive.pop_back();
      retiring.insert(id);
      say("asking worker " + std::to_string(id) + " to leave" + stamp());
      group.signal(id, SIGTERM);
    }
  };

  const auto job_deadline =
      opt.timeout_s ? ef::deadline::after(std::chrono::duration<double>(*opt.timeout_s)) : ef::deadline::never();
  std::optional<ef::deadline> kill_deadline;  // set once we have asked the ranks to stop
  std::optional<ebbflow_run::child_exit> first_failure;
  int interrupted_by = 0;
  bool timed_out = false;
  // What stopped the job first decides the exit status (docs/launcher.md): a
  // failed rank (not with --elastic, where a failure does not stop the job),
  // the --timeout, or a signal; whatever comes while the ranks stop does not.
  enum class stop_cause { none, failure, timeout, signal } stopped_by = stop_cause::none;
  // --discovery runs as a child of its own that the loop polls: a command that
  // hangs holds up neither the job's exits, nor --timeout, nor signals, and
  // is killed (its whole process group) after --discovery-timeout.
  std::string discovery_out;
  ebbflow_run::child_processes discovery([&](int, int stream, std::string_view line) {
    if (stream == 2) {
      write_all(2, "[discovery] " + std::string(line) + "\n");
    } else if (discovery_out.size() < 4096) {
      discovery_out.append(line).push_back('\n');
    }
  });
  int discovery_run = -1;  // id of the run in progress, -1: none
  int discovery_runs = 0;
  std::optional<ef::deadline> discovery_deadline;
  auto stop_all = [&](int sig) {
    discovery.signal_all(SIGKILL);
    discovery_run = -1;
    group.signal_all(sig);
    // A stopped worker cannot act on sig: continue every one now.
    stopped.take_due(std::numeric_limits<double>::infinity(), [&](int id) { group.signal(id, SIGCONT); });
    if (!kill_deadline) kill_deadline = ef::deadline::after(std::chrono::duration<double>(opt.kill_after_s));
  };

  while (group.running() > 0) {
    ef::deadline d = job_deadline;
    if (kill_deadline) d = min(d, *kill_deadline);
    if (opt.elastic && !kill_deadline) d = min(d, ef::deadline::after(20ms));  // timed events
    bool sig_ready = false;
    auto exits = group.poll(d, sigfd, &sig_ready);
    for (const auto& e : exits) {
      std::erase(alive, e.id);
      local_of.erase(e.id);
      if (retiring.erase(e.id) != 0) {
        say("worker " + std::to_string(e.id) + " (pid " + std::to_string(e.pid) +
            ") retired as asked: " + e.describe() + stamp());
        if (e.ok()) ++finished_ok;
        continue;
      }
      if (e.ok()) {
        ++finished_ok;
        continue;
      }
      if (opt.elastic && !interrupted_by && !timed_out) {
        say("worker " + std::to_string(e.id) + " (pid " + std::to_string(e.pid) + ") " + e.describe() +
            "; the job goes on without it");
        report_exit(e);
        if (!first_failure) first_failure = e;
        if (restarts_left > 0 && !kill_deadline) {
          --restarts_left;
          // A worker that keeps failing soon after its start is held back,
          // so it does not make the others fail over again and again.
          const int slot = slot_of[e.id];
          const double lived = std::chrono::duration<double>(ef::steady_clock::now() - started_at[e.id]).count();
          int& n = failures_in_a_row[slot];
          n = lived < std::chrono::duration<double>(opt.restart_cooldown.max).count() ? n + 1 : 1;
          const double wait = std::chrono::duration<double>(opt.restart_cooldown.after(n)).count();
          if (wait > 0) {
            char w[32];
            std::snprintf(w, sizeof w, "%.3g", wait);
            say("worker slot " + std::to_string(slot) + " failed " + std::to_string(n) +
                " times in a row: restarting it as a joiner in " + w + " s (--restart-cooldown; " +
                std::to_string(restarts_left) + " restarts left)");
            pending_restarts.add(since_start() + wait, slot);
          } else {
            say("restarting it as a joiner (" + std::to_string(restarts_left) + " restarts left)");
            add_workers(1, slot);
          }
        }
        continue;
      }
      if (!first_failure && !interrupted_by && !timed_out) {
        first_failure = e;
        if (stopped_by == stop_cause::none) stopped_by = stop_cause::failure;
        say("rank " + std::to_string(e.id) + " (pid " + std::to_string(e.pid) + ") failed: " + e.describe() +
            "; stopping the other ranks");
        stop_all(SIGTERM);
      } else {
        say("rank " + std::to_string(e.id) + " (pid " + std::to_string(e.pid) + ") " + e.describe());
      }
    }
    if (sig_ready) {
      signalfd_siginfo si{};
      while (::read(sigfd, &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
        const int sig = static_cast<int>(si.ssi_signo);
        if (sig == SIGUSR1) {
          add_workers(1);
          continue;
        }
        if (sig == SIGUSR2) {
          retire_newest(1);
          continue;
        }
        if (!interrupted_by) interrupted_by = sig;
        if (stopped_by == stop_cause::none) stopped_by = stop_cause::signal;
        say(std::string("received SIG") + sigabbrev_np(sig) + "; forwarding it to the ranks");
        stop_all(sig);
      }
    }
    if (opt.elastic && !kill_deadline) {
      const double now = since_start();
      pending_restarts.take_due(now, [&](int slot) {
        say("cool-down over: restarting slot " + std::to_string(slot) + " as a joiner" + stamp());
        add_workers(1, slot);
      });
      stopped.take_due(now, [&](int id) {
        say("continuing worker " + std::to_string(id) + " (SIGCONT)" + stamp());
        group.signal(id, SIGCONT);
      });
      if (!events_zero && !gen0_key.empty()) {
        std::error_code ec;  // a store not reachable yet is asked again on the next round
        if (launcher_client->try_get(gen0_key, ef::deadline::after(20ms), ec)) {
          events_zero = ef::steady_clock::now();
          say("the first generation formed: event times count from here" + stamp());
        }
      }
      const double events_now =
          events_zero ? std::chrono::duration<double>(ef::steady_clock::now() - *events_zero).count() : -1;
      for (std::size_t k = 0; k < opt.events.size(); ++k) {
        if (event_done[k] || events_now < opt.events[k].at) continue;
        event_done[k] = true;
        const auto& ev = opt.events[k];
        if (ev.what == options::event::add) {
          add_workers(ev.arg);
        } else if (ev.what == options::event::stop) {
          char f[32];
          std::snprintf(f, sizeof f, "%.3g", ev.for_s);
          say("stopping worker " + std::to_string(ev.arg) + " (SIGSTOP) for " + f + " s" + stamp());
          if (group.signal(ev.arg, SIGSTOP))
            stopped.add(now + ev.for_s, ev.arg);
          else
            say("worker " + std::to_string(ev.arg) + " is not running");
        } else if (ev.what == options::event::kill) {
          say("killing worker " + std::to_string(ev.arg) + " (SIGKILL)" + stamp());
          if (!group.signal(ev.arg, SIGKILL)) say("worker " + std::to_string(ev.arg) + " is not running");
        } else {
          say("asking worker " + std::to_string(ev.arg) + " to leave (SIGTERM)" + stamp());
          if (group.signal(ev.arg, SIGTERM)) {
            retiring.insert(ev.arg);
            std::erase(alive, ev.arg);
          } else {
            say("worker " + std::to_string(ev.arg) + " is not running");
          }
        }
      }
      if (!opt.discovery.empty()) {
        const std::string named = "--discovery '" + opt.discovery + "'";
        const std::string keeping = "; keeping " + std::to_string(alive.size()) + " worker(s)";
        for (const auto& e : discovery.poll(ef::deadline::after(0s))) {
          if (e.id != discovery_run) continue;  // one killed at its deadline
          discovery_run = -1;
          if (!e.ok()) {
            say(named + " " + e.describe() + keeping);
          } else if (const auto want = parse_worker_count(discovery_out); !want) {
            say(named + " printed " + quote_output(discovery_out) + ", not a number of workers (0.." +
                std::to_string(max_workers) + ")" + keeping);
          } else if (*want > static_cast<int>(alive.size())) {
            add_workers(*want - static_cast<int>(alive.size()));
          } else if (*want < static_cast<int>(alive.size())) {
            retire_newest(static_cast<int>(alive.size()) - *want);
          }
        }
        if (discovery_run >= 0 && discovery_deadline->expired()) {
          discovery.signal(discovery_run, SIGKILL);  // its process group: what it started goes too
          discovery_run = -1;
          say(named + " did not finish within " + seconds_text(opt.discovery_timeout) + " s: killed it" + keeping);
        }
        if (discovery_run < 0 && now >= next_discovery) {
          next_discovery = now + opt.discovery_interval;
          ebbflow_run::child_spec spec;
          spec.id = discovery_runs++;
          spec.argv = {"/bin/sh", "-c", opt.discovery};
          discovery_out.clear();
          try {
            discovery.spawn(spec);
            discovery_run = spec.id;
            discovery_deadline = ef::deadline::after(std::chrono::duration<double>(opt.discovery_timeout));
          } catch (const std::exception& e) {
            say(named + ": " + e.what() + keeping);
          }
        }
      }
    }
    if (!timed_out && job_deadline.expired() && group.running() > 0) {
      timed_out = true;
      if (stopped_by == stop_cause::none) stopped_by = stop_cause::timeout;
      say("job timeout of " + std::to_string(*opt.timeout_s) + " s reached; stopping the ranks");
      stop_all(SIGTERM);
    }
    if (kill_deadline && kill_deadline->expired() && group.running() > 0) {
      say(std::to_string(group.running()) + " rank(s) still running " + std::to_string(opt.kill_after_s) +
          " s after SIGTERM; sending SIGKILL");
      group.signal_all(SIGKILL);
      kill_deadline = ef::deadline::after(1h);  // SIGKILL cannot be ignored: poll() reaps them
    }
  }
  if (!pending_restarts.items.empty())
    say(std::to_string(pending_restarts.items.size()) + " restart(s) in cool-down not done: no worker left to join");
  // A timed event whose time never came (the job ended, or was stopped,
  // first) is said, one line each, not dropped silently.
  const double ended_at =
      events_zero ? std::chrono::duration<double>(ef::steady_clock::now() - *events_zero).count() : -1;
  for (std::size_t k = 0; k < opt.events.size(); ++k) {
    if (event_done[k]) continue;
    const char* why = kill_deadline ? "the job was stopped first"
                      : events_zero ? "the job ended first"
                                    : "the job ended before its first generation formed (--event-clock training)";
    say(event_text(opt.events[k]) + " not done: " + why +
        (ended_at >= 0 ? " (at " + seconds_text(ended_at) + " s of its clock)" : std::string()));
  }
  // The store goes with the launcher: reports still queued are sent first
  // only where other launchers' workers may be in the job (--attach).
  reporter.close(opt.attach);
  // A worker's exit does not end its process group: kill what it left behind.
  if (const std::size_t left = group.signal_leftovers(SIGKILL))
    say("killed what " + std::to_string(left) + " exited worker(s) left running in their process group(s)");
  server.reset();

  switch (stopped_by) {
    case stop_cause::failure:
      say("job failed: rank " + std::to_string(first_failure->id) + " " + first_failure->describe());
      return first_failure->shell_status() != 0 ? first_failure->shell_status() : 1;
    case stop_cause::timeout:
      return 124;
    case stop_cause::signal:
      return 128 + interrupted_by;
    case stop_cause::none:
      break;
  }
  // With --elastic a failed worker does not stop the job: it succeeded when a
  // worker finished with 0.
  if (opt.elastic && finished_ok == 0 && first_failure) {
    say("job failed: no worker finished successfully (first failure: worker " + std::to_string(first_failure->id) +
        " " + first_failure->describe() + ")");
    return first_failure->shell_status() != 0 ? first_failure->shell_status() : 1;
  }
  return 0;
}
