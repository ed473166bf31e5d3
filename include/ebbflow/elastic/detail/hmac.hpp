// SPDX-License-Identifier: Apache-2.0
//! @file hmac.hpp
//! HMAC-SHA256 challenge-response helpers for the store handshake (no API
//! promise). Uses OpenSSL's libcrypto (link `ebbflow::asio`).
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/elastic/detail/store_protocol.hpp>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/random.h>

#include <array>
#include <cerrno>
#include <random>
#include <string>
#include <string_view>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

//! `n` cryptographically random bytes: the kernel's CSPRNG (`getrandom`),
//! else OpenSSL's RAND_bytes, else std::random_device (/dev/urandom on
//! Linux). `getrandom` first: RAND_bytes instantiates OpenSSL's DRBG on its
//! first call, 1.3-1.6 ms of CPU in every process that joins a job.
inline std::string random_bytes(std::size_t n) {
  std::string out(n, '\0');
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::getrandom(out.data() + got, n - got, 0);
    if (r > 0) {
      got += static_cast<std::size_t>(r);
    } else if (r < 0 && errno != EINTR) {
      break;  // ENOSYS (an old kernel or a seccomp filter): try OpenSSL
    }
  }
  if (got == n) return out;
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1) {
    std::random_device rd;
    for (auto& c : out) c = static_cast<char>(rd() & 0xff);
  }
  return out;
}

//! Lower-case hex of `n` random bytes (for generated job tokens).
inline std::string random_hex(std::size_t n) {
  static constexpr char hex[] = "0123456789abcdef";
  const std::string b = random_bytes(n);
  std::string out;
  out.reserve(2 * n);
  for (unsigned char c : b) {
    out.push_back(hex[c >> 4]);
    out.push_back(hex[c & 15]);
  }
  return out;
}

//! HMAC-SHA256(key, label | a | b).
inline std::string handshake_mac(std::string_view key, std::string_view label, std::string_view a, std::string_view b) {
  std::string msg;
  msg.reserve(label.size() + a.size() + b.size());
  msg.append(label).append(a).append(b);
  std::array<unsigned char, EVP_MAX_MD_SIZE> out{};
  unsigned int out_len = 0;
  static const unsigned char empty_key = 0;  // HMAC wants a non-null key pointer even for length 0
  const void* k = key.empty() ? static_cast<const void*>(&empty_key) : static_cast<const void*>(key.data());
  if (!HMAC(EVP_sha256(), k, static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(msg.data()),
            msg.size(), out.data(), &out_len) ||
      out_len != proto::mac_bytes) {
    return {};  // empty: mac_equal() never accepts it
  }
  return std::string(reinterpret_cast<const char*>(out.data()), out_len);
}

inline constexpr std::string_view client_label = "ebbflow-store client";
inline constexpr std::string_view server_label = "ebbflow-store server";

//! Constant-time comparison of two MACs.
inline bool mac_equal(std::string_view a, std::string_view b) noexcept {
  return a.size() == b.size() && a.size() == proto::mac_bytes && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
