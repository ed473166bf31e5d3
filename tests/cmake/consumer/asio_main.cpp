// SPDX-License-Identifier: Apache-2.0
// A consumer program of the `asio` component: proves that ebbflow::asio brings
// Boost.Asio and OpenSSL's libcrypto (which the rendezvous store's HMAC
// handshake needs) to a consumer, by an echo over TCP loopback, an RFC 4231
// HMAC-SHA256 test vector and a round trip through an embedded rendezvous
// store; and runs the documented training loop (keep_training) of one member
// over that store. Bounded: the io_context runs for at most five seconds,
// every store call has a deadline.
#include <ebbflow/ebbflow.hpp>

#include <boost/asio.hpp>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <vector>

// Built twice: as consumer_asio (header-only) and, against ebbflow::compiled,
// as consumer_compiled, which must see separate compilation switched on.
#ifndef CONSUMER_NAME
#define CONSUMER_NAME "consumer_asio"
#endif
#ifdef CONSUMER_COMPILED
#ifndef EBBFLOW_SEPARATE_COMPILATION
#error "ebbflow::compiled must define EBBFLOW_SEPARATE_COMPILATION for its consumers"
#endif
#endif

static_assert(EBBFLOW_HAS_ASIO == 1, "ebbflow::asio must put Boost.Asio and OpenSSL on the include path");

int main() {
  namespace asio = boost::asio;
  using asio::ip::tcp;
  int failures = 0;
  auto check = [&](bool ok, const char* what) {
    if (!ok) {
      std::fprintf(stderr, CONSUMER_NAME ": FAILED: %s\n", what);
      ++failures;
    }
  };

  // RFC 4231, test case 2.
  const std::string key = "Jefe", data = "what do ya want for nothing?";
  std::array<unsigned char, EVP_MAX_MD_SIZE> mac{};
  unsigned len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
       data.size(), mac.data(), &len);
  std::string hex;
  for (unsigned i = 0; i < len; ++i) {
    char b[3];
    std::snprintf(b, sizeof b, "%02x", mac[i]);
    hex += b;
  }
  check(hex == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843", "HMAC-SHA256 (libcrypto)");

  // Echo over 127.0.0.1 with an ephemeral port.
  asio::io_context io;
  tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  tcp::socket server(io), client(io);
  std::array<char, 7> sbuf{}, cbuf{};
  acceptor.async_accept(server, [&](boost::system::error_code ec) {
    if (ec) return;
    asio::async_read(server, asio::buffer(sbuf), [&](boost::system::error_code ec2, std::size_t) {
      if (!ec2) asio::async_write(server, asio::buffer(sbuf), [](boost::system::error_code, std::size_t) {});
    });
  });
  client.async_connect(acceptor.local_endpoint(), [&](boost::system::error_code ec) {
    if (ec) return;
    asio::async_write(client, asio::buffer(std::string_view("ebbflow")),
                      [&](boost::system::error_code ec2, std::size_t) {
                        if (!ec2)
                          asio::async_read(client, asio::buffer(cbuf), [](boost::system::error_code, std::size_t) {});
                      });
  });
  io.run_for(std::chrono::seconds(5));
  check(std::string(cbuf.data(), cbuf.size()) == "ebbflow", "echo over TCP loopback (Boost.Asio)");

  // A rendezvous-store round trip: the installed headers bring the store, and
  // its HMAC handshake works with the consumer's libcrypto.
  try {
    namespace el = ebbflow::elastic;
    el::server_options so;
    so.token = "consumer-token";
    el::store_server srv(so);
    el::store_client cl("127.0.0.1", srv.port(), "consumer-token");
    const auto d = ebbflow::deadline::after(std::chrono::seconds(5));
    cl.set("consumer/key", "value", d);
    check(cl.get("consumer/key", d) == "value", "store set/get round trip");
    check(cl.add("consumer/counter", 2, d) == 2, "store add");
  } catch (const std::exception& e) {
    std::fprintf(stderr, CONSUMER_NAME ": store: %s\n", e.what());
    ++failures;
  }

  // The documented loop (docs/snippets/training_loop.cpp), built the way
  // this route builds: one member over an embedded store; keep_training ends
  // the loop after the steps and marks the job finished, so a worker started
  // afterwards is refused at once (job_finished).
  try {
    namespace el = ebbflow::elastic;
    el::server_options so;
    so.token = "loop-token";
    el::store_server srv(so);
    const auto connect = [&] { return std::make_unique<el::store_client>("127.0.0.1", srv.port(), "loop-token"); };
    el::group_options opts;
    opts.global_batch = 8;
    opts.dataset_size = 32;
    el::loopback_network net(std::make_shared<el::loopback_fabric>());
    std::vector<float> params(4, 0.f), grads(4, 1.f);
    {
      el::group g(connect, net, opts, ebbflow::launch_info{});
      g.register_state("params", std::as_writable_bytes(std::span(params)));
      const std::int64_t steps = 3;
      while (g.keep_training(steps)) {
        (void)g.begin_step();
        if (!g.allreduce(grads)) continue;
        g.end_step(0.001);
      }
      check(g.step() == 3, "keep_training ran the steps asked for");
    }
    el::loopback_network late_net(std::make_shared<el::loopback_fabric>());
    try {
      el::group late(connect, late_net, opts, ebbflow::launch_info{});
      check(false, "a worker started after the end was admitted");
    } catch (const ebbflow::system_error& e) {
      check(e.code() == ebbflow::errc::job_finished, "a worker started after the end is refused with job_finished");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, CONSUMER_NAME ": training loop: %s\n", e.what());
    ++failures;
  }

  if (failures) return EXIT_FAILURE;
  std::printf(CONSUMER_NAME " OK\n");
  return EXIT_SUCCESS;
}
