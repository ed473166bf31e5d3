// SPDX-License-Identifier: Apache-2.0
//! @file impl/store_options.hpp
//! Definitions of elastic/store_options.hpp: the store address's parser and
//! the TLS settings from the environment.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/env.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/elastic/store_options.hpp>

#include <string>
#include <string_view>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

inline tls_options tls_options::from_environment(bool enabled) {
  tls_options o;
  o.enabled = enabled;
  if (auto v = env::get("EBBFLOW_TLS_CA")) o.ca_file = *v;
  if (auto v = env::get("EBBFLOW_TLS_CERT")) o.cert_file = *v;
  if (auto v = env::get("EBBFLOW_TLS_KEY")) o.key_file = *v;
  if (auto v = env::get("EBBFLOW_TLS_SERVER_NAME")) o.server_name = *v;
  return o;
}

inline store_address store_address::parse(std::string_view text, std::string_view what) {
  store_address a;
  std::string_view rest = text;
  const auto sep = rest.find("://");
  if (sep != std::string_view::npos) {
    const std::string_view scheme = rest.substr(0, sep);
    if (scheme == "tcp")
      a.scheme = kind::tcp;
    else if (scheme == "tcp+tls")
      a.scheme = kind::tcp_tls;
    else if (scheme == "etcd")
      a.scheme = kind::etcd;
    else if (scheme == "etcds")
      a.scheme = kind::etcds;
    else
      EBBFLOW_ENFORCE(false, what << "='" << text << "': unknown scheme '" << scheme
                                  << "://' (host:port, tcp+tls://, etcd:// or etcds://)");
    rest.remove_prefix(sep + 3);
  }
  if (a.etcd()) {
    if (const auto slash = rest.find('/'); slash != std::string_view::npos) {
      a.prefix = std::string(rest.substr(slash + 1));
      rest = rest.substr(0, slash);
      if (!a.prefix.empty() && a.prefix.back() != '/') a.prefix += '/';
    }
  }
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    const std::string_view one = rest.substr(0, comma);
    EBBFLOW_ENFORCE(!one.empty(), what << "='" << text << "': empty endpoint");
    auto hp = env::parse_host_port(one, what);
    EBBFLOW_ENFORCE(hp.port != 0, what << "='" << text << "': port 0 in '" << one << "'");
    a.endpoints.push_back({std::move(hp.host), hp.port});
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  EBBFLOW_ENFORCE(!a.endpoints.empty(), what << "='" << text << "': no host:port");
  EBBFLOW_ENFORCE(a.etcd() || a.endpoints.size() == 1,
                  what << "='" << text << "': the embedded store has one address (several are for etcd://)");
  return a;
}

inline std::string store_address::str() const {
  static constexpr const char* schemes[] = {"", "tcp+tls://", "etcd://", "etcds://"};
  std::string s = schemes[static_cast<int>(scheme)];
  for (std::size_t i = 0; i < endpoints.size(); ++i) {
    if (i) s += ',';
    const bool v6 = endpoints[i].host.find(':') != std::string::npos;
    s += (v6 ? "[" + endpoints[i].host + "]" : endpoints[i].host) + ":" + std::to_string(endpoints[i].port);
  }
  if (!prefix.empty()) s += "/" + prefix;
  return s;
}

}  // namespace elastic
EBBFLOW_END_NAMESPACE
