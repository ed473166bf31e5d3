// SPDX-License-Identifier: Apache-2.0
// ebbflow-store: the rendezvous store as a standalone process. Prints
// "ebbflow-store: listening on HOST:PORT" once it accepts connections and
// serves until SIGINT/SIGTERM. See docs/store.md.
#include <ebbflow/core/env.hpp>
#include <ebbflow/elastic/store.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>

#include <charconv>
#include <cstdio>
#include <iostream>
#include <string>

namespace el = ebbflow::elastic;

namespace {
constexpr const char* usage_text =
    "usage: ebbflow-store [--host ADDR] [--port P] [--token T] [--max-message-bytes N] [--frame-timeout-ms MS]\n"
    "Serves the ebbflow rendezvous store until SIGINT or SIGTERM.\n"
    "  --host ADDR             address to bind (default 127.0.0.1: this host only; 0.0.0.0 or :: for all)\n"
    "  --port P                port (default 0: a free one, printed as \"listening on HOST:PORT\")\n"
    "  --token T               the job token clients must prove (default EBBFLOW_TOKEN, else the empty\n"
    "                          token); workers and ebbflow-run --attach need the same one\n"
    "  --max-message-bytes N   largest frame accepted\n"
    "  --frame-timeout-ms MS   a started frame must be complete within MS (default 10000)\n"
    "Several jobs may share one store: each under its own key prefix (EBBFLOW_JOB).\n";

[[noreturn]] void usage_error(const std::string& msg) {
  std::cerr << "ebbflow-store: " << msg << " (ebbflow-store --help lists the options)\n";
  std::exit(2);
}

std::uint64_t parse_uint(const std::string& flag, const std::string& v, std::uint64_t lo, std::uint64_t hi) {
  std::uint64_t out = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc{} || p != v.data() + v.size() || out < lo || out > hi)
    usage_error(flag + " '" + v + "': expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return out;
}
}  // namespace

int main(int argc, char** argv) {
  el::server_options o = el::server_options::from_environment();
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "-h" || a == "--help") {
      std::cout << usage_text;
      return 0;
    } else if (a == "--host") {
      o.host = value();
    } else if (a == "--port") {
      o.port = static_cast<std::uint16_t>(parse_uint(a, value(), 0, 65535));
    } else if (a == "--token") {
      o.token = value();
    } else if (a == "--max-message-bytes") {
      o.max_message_bytes = parse_uint(a, value(), 64, 0xffffffffu);
    } else if (a == "--frame-timeout-ms") {
      o.frame_timeout = std::chrono::milliseconds(parse_uint(a, value(), 1, 3600000));
    } else {
      usage_error("unknown argument " + a);
    }
  }
  // Three connections per worker: lift the open-file limit (usually 1024 soft).
  el::raise_open_file_limit();
  try {
    boost::asio::io_context ioc(1);
    el::store_server server(ioc, o);
    boost::asio::signal_set signals(ioc, SIGINT, SIGTERM);
    signals.async_wait([&](const boost::system::error_code&, int sig) {
      std::fprintf(stderr, "ebbflow-store: signal %d, stopping\n", sig);
      server.stop();
      ioc.stop();
    });
    std::printf("ebbflow-store: listening on %s\n", server.address().c_str());
    std::fflush(stdout);
    ioc.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ebbflow-store: %s\n", e.what());
    return 1;
  }
  return 0;
}
