// SPDX-License-Identifier: Apache-2.0
// The embedded store over TLS, with certificates made by the openssl CLI
// (tls/make_certs.sh): plain and mutual TLS work, and each way of getting it
// wrong (wrong CA, plaintext client, TLS client of a plaintext store, expired
// certificates, a missing client certificate) is refused with its own error
// while the server goes on serving others.
#include <ebbflow/elastic/tcp_store.hpp>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <unistd.h>

namespace ef = ebbflow;
namespace el = ebbflow::elastic;
using namespace std::chrono_literals;

namespace {
const std::string token = "tls-test-token";

class StoreTls : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::filesystem::temp_directory_path() / ("ebbflow-tls-" + std::to_string(::getpid()));
    const std::string cmd = std::string(EBBFLOW_MAKE_CERTS) + " " + dir_.string() + " >/dev/null";
    ok_ = std::system(cmd.c_str()) == 0;
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  void SetUp() override {
    if (!ok_) GTEST_SKIP() << "openssl could not make the test certificates";
  }
  static std::string f(const char* name) { return (dir_ / name).string(); }

  static el::server_options server(bool mutual, const char* cert = "server.pem") {
    el::server_options o;
    o.token = token;
    o.tls.cert_file = f(cert);
    o.tls.key_file = f("server.key");
    if (mutual) {
      o.tls.ca_file = f("ca.pem");
      o.tls.require_client_cert = true;
    }
    o.tls_hello_timeout = 500ms;
    return o;
  }
  static el::client_options client(const char* ca = "ca.pem", const char* cert = nullptr, const char* key = nullptr) {
    el::client_options o;
    o.timeout = 5s;
    o.tls.enabled = true;
    o.tls.ca_file = f(ca);
    if (cert) o.tls.cert_file = f(cert);
    if (key) o.tls.key_file = f(key);
    return o;
  }
  // The error of a first call through `c`, which must be refused.
  struct refusal {
    std::error_code code_;
    std::string what_;
    std::error_code code() const { return code_; }
    const char* what() const { return what_.c_str(); }
  };
  static refusal refused(el::store_client& c) {
    try {
      c.set("k", "v", ef::deadline::after(5s));
    } catch (const ef::system_error& e) {
      std::printf("refused: %s\n", e.what());  // the words a user sees, for the record
      return {e.code(), e.what()};
    }
    ADD_FAILURE() << "the call was not refused";
    return {};
  }
  // A good client still works against `srv` (the refusal hurt nobody else).
  static void still_serves(const el::store_server& srv, const el::client_options& o) {
    el::store_client good("127.0.0.1", srv.port(), token, o);
    good.set("still", "here");
    EXPECT_EQ(good.get("still"), "here");
  }

  static inline std::filesystem::path dir_;
  static inline bool ok_ = false;
};

TEST_F(StoreTls, ServesOverTlsAndMutualTls) {
  for (bool mutual : {false, true}) {
    el::store_server srv(server(mutual));
    EXPECT_EQ(srv.address().rfind("tcp+tls://127.0.0.1:", 0), 0u) << srv.address();
    auto o = mutual ? client("ca.pem", "client.pem", "client.key") : client();
    el::store_client c("127.0.0.1", srv.port(), token, o);
    c.set("a", std::string("\0bin\xff", 5));
    EXPECT_EQ(c.get("a"), std::string("\0bin\xff", 5));
    EXPECT_EQ(c.add("n", 3), 3);
    EXPECT_TRUE(c.compare_set("cas", "", "x").swapped);
    el::store_client waker("127.0.0.1", srv.port(), token, o);
    std::thread t([&] {
      std::this_thread::sleep_for(50ms);
      waker.set("late", "1");
    });
    c.wait({"late"}, ef::deadline::after(5s));
    t.join();
    // The server verifies by name too: "localhost" is in the certificate.
    el::store_client by_name("localhost", srv.port(), token, o);
    EXPECT_EQ(by_name.get("a").size(), 5u);
  }
}

TEST_F(StoreTls, WrongCaIsRefusedByName) {
  el::store_server srv(server(false));
  el::store_client c("127.0.0.1", srv.port(), token, client("other-ca.pem"));
  const auto e = refused(c);
  EXPECT_EQ(e.code(), ef::errc::unauthorized) << e.what();
  EXPECT_NE(std::string(e.what()).find("not signed by the CA in"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("other-ca.pem"), std::string::npos) << e.what();
  still_serves(srv, client());
}

TEST_F(StoreTls, PlaintextClientIsToldTheStoreNeedsTls) {
  el::store_server srv(server(false));
  el::client_options plain;
  plain.timeout = 5s;
  el::store_client c("127.0.0.1", srv.port(), token, plain);
  const auto t0 = std::chrono::steady_clock::now();
  const auto e = refused(c);
  EXPECT_EQ(e.code(), ef::errc::unauthorized) << e.what();
  EXPECT_NE(std::string(e.what()).find("this store requires TLS"), std::string::npos) << e.what();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);  // tls_hello_timeout (0.5 s), not the call's deadline
  EXPECT_GE(srv.stats().unauthorized, 1u);
  still_serves(srv, client());
}

TEST_F(StoreTls, TlsClientOfAPlaintextStoreIsToldSo) {
  el::server_options o;
  o.token = token;
  el::store_server srv(o);
  el::store_client c("127.0.0.1", srv.port(), token, client());
  const auto e = refused(c);
  EXPECT_EQ(e.code(), ef::errc::unauthorized) << e.what();
  EXPECT_NE(std::string(e.what()).find("does not speak TLS"), std::string::npos) << e.what();
  el::client_options plain;
  still_serves(srv, plain);
}

TEST_F(StoreTls, ExpiredServerCertificateIsRefused) {
  el::store_server srv(server(false, "server-expired.pem"));
  el::store_client c("127.0.0.1", srv.port(), token, client());
  const auto e = refused(c);
  EXPECT_EQ(e.code(), ef::errc::unauthorized) << e.what();
  EXPECT_NE(std::string(e.what()).find("has expired"), std::string::npos) << e.what();
}

TEST_F(StoreTls, MutualTlsRefusesMissingExpiredAndForeignClientCertificates) {
  el::store_server srv(server(true));
  {
    el::store_client c("127.0.0.1", srv.port(), token, client());  // no certificate
    const auto e = refused(c);
    EXPECT_EQ(e.code(), ef::errc::unauthorized) << e.what();
    EXPECT_NE(std::string(e.what()).find("requires a client certificate"), std::string::npos) << e.what();
  }
  {
    el::store_client c("127.0.0.1", srv.port(), token, client("ca.pem", "client-expired.pem", "client.key"));
    const auto e = refused(c);
    EXPECT_EQ(e.code(), ef::errc::unauthorized) << e.what();
    EXPECT_NE(std::string(e.what()).find("client's certificate: it has expired"), std::string::npos) << e.what();
  }
  {
    el::store_client c("127.0.0.1", srv.port(), token, client("ca.pem", "client-other.pem", "client-other.key"));
    const auto e = refused(c);
    EXPECT_EQ(e.code(), ef::errc::unauthorized) << e.what();
    EXPECT_NE(std::string(e.what()).find("not signed by a CA the store trusts"), std::string::npos) << e.what();
  }
  EXPECT_GE(srv.stats().unauthorized, 3u);
  still_serves(srv, client("ca.pem", "client.pem", "client.key"));
}

TEST_F(StoreTls, TheTokenIsStillCheckedOverTls) {
  el::store_server srv(server(false));
  el::store_client c("127.0.0.1", srv.port(), "wrong-token", client());
  const auto e = refused(c);
  EXPECT_EQ(e.code(), ef::errc::unauthorized) << e.what();
  EXPECT_NE(std::string(e.what()).find("token"), std::string::npos) << e.what();
}

TEST_F(StoreTls, FromEnvironmentTakesTheTlsAddress) {
  el::store_server srv(server(false));
  ::setenv("EBBFLOW_STORE", srv.address().c_str(), 1);
  ::setenv("EBBFLOW_TOKEN", token.c_str(), 1);
  ::setenv("EBBFLOW_TLS_CA", f("ca.pem").c_str(), 1);
  auto c = el::store_client::from_environment();
  c.set("env", "ok");
  EXPECT_EQ(c.get("env"), "ok");
  ::unsetenv("EBBFLOW_TLS_CA");
  ::unsetenv("EBBFLOW_STORE");
}

TEST(StoreAddress, ParsesEachScheme) {
  auto a = el::store_address::parse("10.0.0.1:29500");
  EXPECT_EQ(a.scheme, el::store_address::kind::tcp);
  EXPECT_EQ(a.endpoints.at(0).port, 29500);
  a = el::store_address::parse("tcp+tls://h:1");
  EXPECT_TRUE(a.tls());
  EXPECT_FALSE(a.etcd());
  a = el::store_address::parse("etcd://a:2379,[::1]:2380,c:3/job7");
  ASSERT_EQ(a.endpoints.size(), 3u);
  EXPECT_EQ(a.endpoints[1].host, "::1");
  EXPECT_EQ(a.prefix, "job7/");
  EXPECT_EQ(a.str(), "etcd://a:2379,[::1]:2380,c:3/job7/");
  EXPECT_TRUE(el::store_address::parse("etcds://a:1").tls());
  EXPECT_THROW(el::store_address::parse("redis://a:1"), std::invalid_argument);
  EXPECT_THROW(el::store_address::parse("etcd://a"), std::invalid_argument);
  EXPECT_THROW(el::store_address::parse("a:1,b:2"), std::invalid_argument);
  EXPECT_THROW(el::store_address::parse("etcd://"), std::invalid_argument);
}
}  // namespace
