// SPDX-License-Identifier: Apache-2.0
// ebbflow-store: the rendezvous store as a standalone process. Prints
// "ebbflow-store: listening on HOST:PORT" once it accepts connections and
// serves until SIGINT/SIGTERM. See docs/store.md.
#include <ebbflow/core/env.hpp>
#include <ebbflow/elastic/tcp_store.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>

#include "../../examples/common/args.hpp"  // the command line

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace el = ebbflow::elastic;

int main(int argc, char** argv) {
  el::server_options o = el::server_options::from_environment();
  std::uint64_t frame_timeout_ms = static_cast<std::uint64_t>(o.frame_timeout.count());
  cli::parser p("ebbflow-store",
                "usage: ebbflow-store [options]\n"
                "Serves the ebbflow rendezvous store until SIGINT or SIGTERM.\n",
                "Several jobs may share one store: each under its own key prefix (EBBFLOW_JOB).\n");
  p.text("--host", "ADDR", o.host, "address to bind (default 127.0.0.1: this host only; 0.0.0.0 or :: for all)")
      .number("--port", "P", o.port, std::uint16_t{0}, std::uint16_t{65535},
              "port (default 0: a free one, printed as \"listening on HOST:PORT\")")
      .text("--token", "T", o.token,
            "the job token clients must prove (default EBBFLOW_TOKEN, else the empty\n"
            "token); workers and ebbflow-run --attach need the same one")
      .number("--max-message-bytes", "N", o.max_message_bytes, decltype(o.max_message_bytes){64},
              decltype(o.max_message_bytes){0xffffffffu}, "largest frame accepted")
      .number("--frame-timeout-ms", "MS", frame_timeout_ms, std::uint64_t{1}, std::uint64_t{3600000},
              "a started frame must be complete within MS (default 10000)")
      .text("--tls-cert", "PEM", o.tls.cert_file,
            "serve TLS with this certificate chain (default EBBFLOW_STORE_TLS_CERT);\n"
            "clients then use tcp+tls://HOST:PORT and EBBFLOW_TLS_CA")
      .text("--tls-key", "PEM", o.tls.key_file, "private key of --tls-cert (default EBBFLOW_STORE_TLS_KEY)")
      .text("--tls-client-ca", "PEM", o.tls.ca_file,
            "verify client certificates against this CA (default EBBFLOW_STORE_TLS_CLIENT_CA)")
      .flag("--require-client-cert", o.tls.require_client_cert,
            "mutual TLS: refuse clients without a certificate signed by --tls-client-ca");
  p.parse(argc, argv);
  if (!o.tls.cert_file.empty() && o.tls.key_file.empty()) p.error("--tls-cert needs --tls-key");
  o.frame_timeout = std::chrono::milliseconds(frame_timeout_ms);
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
