// SPDX-License-Identifier: Apache-2.0
//! @file detail/etcd_client.hpp
//! The workings of `etcd_store` (elastic/etcd_store.hpp): requests to etcd's
//! v3 JSON gateway with failover between endpoints, the transactions behind
//! `add` and `compare_set`, and the watch behind the waits. Every function
//! sets `ec` and `last_detail` instead of throwing.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/core/log.hpp>
#include <ebbflow/elastic/detail/etcd_http.hpp>
#include <ebbflow/elastic/detail/json.hpp>
#include <ebbflow/elastic/detail/store_protocol.hpp>  // quote_key
#include <ebbflow/elastic/detail/tls.hpp>
#include <ebbflow/elastic/kv_store.hpp>  // add_to_counter
#include <ebbflow/elastic/store_options.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

struct etcd_options;

namespace detail {

//! Most operations in one etcd transaction (etcd's default --max-txn-ops).
inline constexpr std::size_t etcd_max_txn_ops = 128;

//! See the file comment. Not thread-safe: `etcd_store` holds `mu` around each call.
class etcd_client {
 public:
  etcd_client(std::vector<store_address::endpoint> eps, std::string prefix, tls_options tls,
              std::chrono::milliseconds timeout, std::chrono::milliseconds connect_timeout,
              std::chrono::milliseconds attempt_timeout)
      : endpoints_(std::move(eps)),
        prefix_(std::move(prefix)),
        tls_(std::move(tls)),
        timeout_(timeout),
        connect_timeout_(connect_timeout),
        attempt_timeout_(attempt_timeout) {
    EBBFLOW_ENFORCE(!endpoints_.empty(), "etcd_store: no endpoints");
    if (tls_.enabled) tls_ctx_ = client_tls_context(tls_);
    for (const auto& e : endpoints_)
      conns_.push_back(std::make_unique<http_connection>(e.host, e.port, tls_, tls_ctx_.get()));
  }

  std::mutex mu;            //!< serialises the calls of one etcd_store
  std::string last_detail;  //!< why the last call failed

  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  [[nodiscard]] std::string current() const { return conns_[cur_]->address(); }
  [[nodiscard]] std::string all_endpoints() const {
    std::string s;
    for (const auto& c : conns_) s += (s.empty() ? "" : ",") + c->address();
    return s;
  }

  void close() noexcept {
    for (auto& c : conns_) c->close();
    drop_watch();
  }

  // ---------------------------------------------------------------- operations

  void set(std::string_view key, std::string_view value, deadline d, std::error_code& ec) {
    const std::string k = full(key);
    json::value r;
    if (!call("/v3/kv/put", "{\"key\":\"" + json::base64(k) + "\",\"value\":\"" + json::base64(value) + "\"}", d,
              retry::always, r, ec))
      return;
    remember(k, std::string(value), revision(r));
  }

  std::optional<std::string> try_get(std::string_view key, deadline d, std::error_code& ec) {
    const std::string one[] = {std::string(key)};
    auto v = try_get_many(one, d, ec);
    if (ec || v.empty()) return std::nullopt;
    return std::move(v[0]);
  }

  std::vector<std::optional<std::string>> try_get_many(std::span<const std::string> keys, deadline d,
                                                       std::error_code& ec) {
    std::vector<std::optional<std::string>> out;
    out.reserve(keys.size());
    if (keys.size() == 1) {  // one range, no transaction
      const std::string k = full(keys[0]);
      json::value r;
      if (!call("/v3/kv/range", "{\"key\":\"" + json::base64(k) + "\"}", d, retry::always, r, ec)) return out;
      out.push_back(take_range(k, r, ec));
      return out;
    }
    for (std::size_t first = 0; first < keys.size(); first += etcd_max_txn_ops) {
      const std::size_t last = std::min(keys.size(), first + etcd_max_txn_ops);
      std::string body = "{\"success\":[";
      for (std::size_t i = first; i < last; ++i)
        body += std::string(i == first ? "" : ",") + "{\"request_range\":" + range_req(full(keys[i])) + "}";
      body += "]}";
      json::value r;
      if (!call("/v3/kv/txn", body, d, retry::always, r, ec)) return out;
      const auto& rs = r.array("responses");
      if (rs.size() != last - first) return bad_reply(ec, "txn", out);
      for (std::size_t i = first; i < last; ++i) {
        const json::value* rr = rs[i - first].find("response_range");
        if (!rr) return bad_reply(ec, "txn range", out);
        out.push_back(take_range(full(keys[i]), *rr, ec));
        if (ec) return out;
      }
    }
    return out;
  }

  std::int64_t add(std::string_view key, std::int64_t delta, deadline d, std::error_code& ec) {
    const std::vector<std::string> keys{std::string(key)};
    const std::vector<std::int64_t> deltas{delta};
    auto v = add_many(keys, deltas, d, ec);
    return ec || v.empty() ? 0 : v[0];
  }

  std::vector<std::int64_t> add_many(std::span<const std::string> keys, std::span<const std::int64_t> deltas,
                                     deadline d, std::error_code& ec) {
    std::vector<std::int64_t> out;
    out.reserve(keys.size());
    // etcd refuses a transaction that puts one key twice: a batch that
    // repeats a key goes key by key.
    std::set<std::string_view> seen;
    bool repeats = false;
    for (std::size_t i = 0; i < keys.size() && !repeats; ++i) repeats = !seen.insert(keys[i]).second;
    const std::size_t step = repeats ? 1 : etcd_max_txn_ops;
    for (std::size_t first = 0; first < keys.size(); first += step) {
      const std::size_t last = std::min(keys.size(), first + step);
      if (!add_chunk(keys.subspan(first, last - first), deltas.subspan(first, last - first), d, out, ec)) return out;
    }
    return out;
  }

  compare_set_result compare_set(std::string_view key, std::string_view expected, std::string_view desired, deadline d,
                                 std::error_code& ec) {
    const std::string k = full(key);
    // An empty `expected` matches an absent key, and a key holding "" (as
    // the embedded store): first the absence, then the empty value.
    for (int pass = 0; pass < (expected.empty() ? 2 : 1); ++pass) {
      const std::string cmp = pass == 0 && expected.empty()
                                  ? "{\"key\":\"" + json::base64(k) +
                                        "\",\"target\":\"CREATE\",\"result\":\"EQUAL\",\"create_revision\":\"0\"}"
                                  : "{\"key\":\"" + json::base64(k) +
                                        "\",\"target\":\"VALUE\",\"result\":\"EQUAL\",\"value\":\"" +
                                        json::base64(expected) + "\"}";
      const std::string body = "{\"compare\":[" + cmp + "],\"success\":[{\"request_put\":{\"key\":\"" +
                               json::base64(k) + "\",\"value\":\"" + json::base64(desired) +
                               "\"}}],\"failure\":[{\"request_range\":" + range_req(k) + "}]}";
      json::value r;
      bool retried = false;
      if (!call("/v3/kv/txn", body, d, retry::always, r, ec, &retried)) return {};
      if (r.flag("succeeded")) {
        remember(k, std::string(desired), revision(r));
        return {true, std::string(desired)};
      }
      const auto& rs = r.array("responses");
      const json::value* rr = rs.empty() ? nullptr : rs[0].find("response_range");
      if (!rr) return bad_reply(ec, "compare_set", compare_set_result{});
      auto cur = take_range(k, *rr, ec);
      if (ec) return {};
      // A retry after an answer was lost finds the first attempt's value:
      // the key holds `desired`, which is what this call was to achieve.
      if (retried && cur && *cur == desired) return {true, *cur};
      if (pass == 0 && expected.empty() && cur && cur->empty()) continue;
      return {false, cur.value_or(std::string())};
    }
    return {};
  }

  bool erase(std::string_view key, deadline d, std::error_code& ec) {
    const std::string k = full(key);
    json::value r;
    if (!call("/v3/kv/deleterange", "{\"key\":\"" + json::base64(k) + "\"}", d, retry::always, r, ec)) return false;
    cache_.erase(k);
    return r.i64("deleted") > 0;
  }

  std::int64_t num_keys(deadline d, std::error_code& ec) {
    std::string from = prefix_.empty() ? std::string(1, '\0') : prefix_;
    std::string to = prefix_.empty() ? std::string(1, '\0') : prefix_end(prefix_);
    json::value r;
    if (!call("/v3/kv/range",
              "{\"key\":\"" + json::base64(from) + "\",\"range_end\":\"" + json::base64(to) + "\",\"count_only\":true}",
              d, retry::always, r, ec))
      return 0;
    return r.i64("count");
  }

  void ping(deadline d, std::error_code& ec) {
    json::value r;
    call("/v3/maintenance/status", "{}", d, retry::always, r, ec);
  }

  //! Waits until all (`any` false) or any of `keys` exist; the index of the
  //! first that does (any), 0 (all).
  std::size_t wait(const std::vector<std::string>& keys, bool any, deadline d, std::error_code& ec) {
    ec.clear();
    std::vector<std::string> fk;
    fk.reserve(keys.size());
    for (const auto& k : keys) fk.push_back(full(k));
    std::vector<std::string> set = fk;
    std::sort(set.begin(), set.end());
    set.erase(std::unique(set.begin(), set.end()), set.end());
    const auto started = steady_clock::now();
    for (;;) {
      if (!watch_ || watch_->keys != set) {
        if (!open_watch(set, d, ec)) return 0;
      }
      // What the read and the events since say.
      std::size_t missing = 0;
      for (std::size_t i = 0; i < fk.size(); ++i) {
        if (watch_->present.contains(fk[i])) {
          if (any) return i;
        } else {
          ++missing;
        }
      }
      if (!any && missing == 0) return 0;
      std::string line, why;
      const auto o = watch_->conn->next_line(d, line, why);
      if (o == http_outcome::timeout || d.expired()) {
        if (!watch_->conn->connected()) drop_watch();
        ec = make_error_code(error::timeout);
        std::ostringstream os;
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(steady_clock::now() - started).count();
        if (any)
          os << "wait_any: none of " << keys.size() << " keys set within " << ms << " ms:";
        else
          os << "wait: " << missing << " of " << keys.size() << " keys still missing after " << ms << " ms:";
        int n = 0;
        for (std::size_t i = 0; i < fk.size(); ++i) {
          if (watch_ && watch_->present.contains(fk[i])) continue;
          if (n++ == 5) {
            os << " ...";
            break;
          }
          os << " " << quote_key(keys[i]);
        }
        last_detail = os.str();
        return 0;
      }
      if (o != http_outcome::ok) {  // the watch broke (its endpoint died): read again and watch elsewhere
        EBBFLOW_LOG_DEBUG("etcd: " << why << "; watching again");
        drop_watch();
        rotate();
        continue;
      }
      if (!take_events(line)) {
        drop_watch();
        continue;
      }
    }
  }

 private:
  enum class retry { always, unapplied };
  struct watch_state {
    std::unique_ptr<http_connection> conn;
    std::vector<std::string> keys;   // full keys, sorted, unique
    std::set<std::string> present;   // those that exist now (read at R, then events after R)
    std::int64_t read_revision = 0;  // R
  };

  std::string full(std::string_view key) const { return prefix_ + std::string(key); }

  static std::string prefix_end(std::string p) {
    while (!p.empty()) {
      if (static_cast<unsigned char>(p.back()) != 0xff) {
        p.back() = static_cast<char>(static_cast<unsigned char>(p.back()) + 1);
        return p;
      }
      p.pop_back();
    }
    return std::string(1, '\0');
  }

  static std::string range_req(const std::string& k) { return "{\"key\":\"" + json::base64(k) + "\"}"; }

  static std::int64_t revision(const json::value& r) {
    const json::value* h = r.find("header");
    return h ? h->i64("revision") : 0;
  }

  void remember(const std::string& k, std::string v, std::int64_t rev) {
    if (cache_.size() > 65536) cache_.clear();  // the group's keys are far fewer; this only bounds a misuse
    cache_[k] = {std::move(v), rev};
  }

  // The value in a range response (and the key's revision into the cache).
  std::optional<std::string> take_range(const std::string& k, const json::value& rr, std::error_code& ec) {
    const auto& kvs = rr.array("kvs");
    if (kvs.empty()) {
      cache_[k] = {std::string(), 0};
      return std::nullopt;
    }
    auto v = json::unbase64(kvs[0].str("value"));
    if (!v) {
      ec = make_error_code(error::bad_message);
      last_detail = "etcd: a value that is not base64";
      return std::nullopt;
    }
    remember(k, *v, kvs[0].i64("mod_revision"));
    return v;
  }

  template <class T>
  T bad_reply(std::error_code& ec, const char* what, T out) {
    ec = make_error_code(error::bad_message);
    last_detail = std::string("etcd: unexpected answer to ") + what;
    return out;
  }

  void rotate() noexcept { cur_ = (cur_ + 1) % conns_.size(); }

  // One gateway call with failover: true with `out` on success. `retried`,
  // when given, says whether the request was sent again after an attempt
  // whose outcome is unknown.
  bool call(const char* path, const std::string& body, deadline d, retry policy, json::value& out, std::error_code& ec,
            bool* retried = nullptr) {
    ec.clear();
    last_detail.clear();
    auto backoff = std::chrono::milliseconds(5);
    std::size_t failures_in_row = 0;
    std::string why;
    bool unknown = false;
    for (;;) {
      if (d.expired()) {
        ec = make_error_code(error::timeout);
        last_detail = std::string("etcd (") + all_endpoints() + ") did not answer " + path + " in time" +
                      (why.empty() ? std::string() : ": " + why);
        return false;
      }
      auto& c = *conns_[cur_];
      http_outcome o = http_outcome::ok;
      unsigned status = 0;
      std::string text;
      if (!c.connected()) {
        const deadline cd = min(d, deadline::after(connect_timeout_));
        std::string cwhy;
        unsigned st = 0;
        std::string tx;
        // Connecting alone: a dead endpoint costs connect_timeout, not the call's deadline.
        o = c.post("/v3/maintenance/status", "{}", cd, st, tx, cwhy);
        if (o == http_outcome::ok && tx.find("HTTPS server") != std::string::npos)
          return fail(ec, error::unauthorized,
                      "etcd at " + c.address() + " serves TLS: give its address as etcds://, with EBBFLOW_TLS_CA");
        if (o != http_outcome::ok) {
          why = cwhy;
          if (o == http_outcome::unauthorized) return fail(ec, error::unauthorized, why);
          o = http_outcome::not_sent;
        }
      }
      if (o == http_outcome::ok) {
        if (unknown && retried) *retried = true;
        // One attempt waits at most attempt_timeout: a follower whose leader
        // died holds a proposal until etcd's own request timeout (5 s + two
        // election timeouts), long after another member could have served it.
        o = c.post(path, body, min(d, deadline::after(attempt_timeout_)), status, text, why);
      }
      if (o == http_outcome::unauthorized) return fail(ec, error::unauthorized, why);
      if (o == http_outcome::ok) {
        auto j = json::parse(text);
        if (!j && text.find("HTTPS server") != std::string::npos)
          return fail(ec, error::unauthorized,
                      "etcd at " + c.address() + " serves TLS: give its address as etcds://, with EBBFLOW_TLS_CA");
        if (!j) return fail(ec, error::bad_message, "etcd " + c.address() + ": an answer that is not JSON");
        if (status == 200) {
          out = std::move(*j);
          return true;
        }
        const std::string msg = j->str("error").empty() ? j->str("message") : j->str("error");
        const std::int64_t code = j->i64("code");
        // etcd's gRPC codes: 14 unavailable (no leader, leader changed,
        // request timed out), 8 resource exhausted (too many requests).
        const bool unapplied = msg.find("no leader") != std::string::npos ||
                               msg.find("too many requests") != std::string::npos ||
                               msg.find("not capable") != std::string::npos;
        if (code == 14 || code == 8 || unapplied) {
          why = c.address() + ": " + msg;
          if (!unapplied) unknown = true;
          if (!unapplied && policy == retry::unapplied)
            return fail(ec, error::peer_lost, "etcd " + why + " (the request may or may not have been applied)");
          c.close();
          rotate();
        } else if (code == 16 || code == 7) {  // unauthenticated, permission denied
          return fail(ec, error::unauthorized, "etcd " + c.address() + ": " + msg);
        } else {
          return fail(ec, error::bad_message,
                      "etcd " + c.address() + " refused " + path + " (HTTP " + std::to_string(status) + "): " + msg);
        }
      } else if (o == http_outcome::not_sent) {
        rotate();
      } else {                                                    // lost or timed out after sending
        if (o == http_outcome::timeout && d.expired()) continue;  // reported above
        unknown = true;
        if (policy == retry::unapplied)
          return fail(ec, o == http_outcome::timeout ? error::timeout : error::peer_lost,
                      why + " (the request may or may not have been applied)");
        rotate();
      }
      // Every endpoint tried once: wait a little (an election takes about a second).
      if (++failures_in_row % conns_.size() == 0) {
        std::this_thread::sleep_for(std::min<steady_clock::duration>(backoff, d.remaining()));
        backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
      }
    }
  }

  bool fail(std::error_code& ec, error e, std::string why) {
    ec = make_error_code(e);
    last_detail = std::move(why);
    return false;
  }

  // One transaction of adds: compares the mod_revision of each changed key
  // with the one last seen, puts the sums and reads the unchanged ones; a
  // lost race reads them all and goes again.
  bool add_chunk(std::span<const std::string> keys, std::span<const std::int64_t> deltas, deadline d,
                 std::vector<std::int64_t>& out, std::error_code& ec) {
    std::vector<std::string> fk;
    for (const auto& k : keys) fk.push_back(full(k));
    bool writes = false;
    for (auto x : deltas) writes = writes || x != 0;
    for (;;) {
      std::string compare, success, failure;
      std::vector<std::int64_t> sums(keys.size(), 0);
      for (std::size_t i = 0; i < keys.size(); ++i) {
        const auto b64 = json::base64(fk[i]);
        if (!failure.empty()) failure += ",";
        failure += "{\"request_range\":{\"key\":\"" + b64 + "\"}}";
        if (!success.empty()) success += ",";
        if (deltas[i] == 0) {
          success += "{\"request_range\":{\"key\":\"" + b64 + "\"}}";
          continue;
        }
        auto it = cache_.find(fk[i]);
        std::string why;
        auto next = add_to_counter(it == cache_.end() ? std::string() : it->second.first, deltas[i], why);
        if (!next && it != cache_.end()) {  // the cached value may be stale: read it before refusing
          const std::string one[] = {keys[i]};
          try_get_many(one, d, ec);
          if (ec) return false;
          it = cache_.find(fk[i]);
          next = add_to_counter(it == cache_.end() ? std::string() : it->second.first, deltas[i], why);
        }
        if (!next) return fail(ec, error::invalid_state, "add: " + quote_key(keys[i]) + " " + why);
        const std::int64_t rev = it == cache_.end() ? 0 : it->second.second;
        sums[i] = *next;
        if (!compare.empty()) compare += ",";
        compare += "{\"key\":\"" + b64 + "\",\"target\":\"MOD\",\"result\":\"EQUAL\",\"mod_revision\":\"" +
                   std::to_string(rev) + "\"}";
        success +=
            "{\"request_put\":{\"key\":\"" + b64 + "\",\"value\":\"" + json::base64(std::to_string(*next)) + "\"}}";
      }
      json::value r;
      const std::string body =
          "{\"compare\":[" + compare + "],\"success\":[" + success + "],\"failure\":[" + failure + "]}";
      // Reads alone may be retried anywhere; a transaction that writes, only
      // where it surely was not applied.
      if (!call("/v3/kv/txn", body, d, writes ? retry::unapplied : retry::always, r, ec)) return false;
      const auto& rs = r.array("responses");
      if (rs.size() != keys.size()) return bad_reply(ec, "add", false);
      if (r.flag("succeeded") || !writes) {
        const std::int64_t rev = revision(r);
        for (std::size_t i = 0; i < keys.size(); ++i) {
          if (deltas[i] != 0) {
            remember(fk[i], std::to_string(sums[i]), rev);
            out.push_back(sums[i]);
            continue;
          }
          const json::value* rr = rs[i].find("response_range");
          if (!rr) return bad_reply(ec, "add", false);
          auto v = take_range(fk[i], *rr, ec);
          if (ec) return false;
          std::string why;
          const auto x = add_to_counter(v.value_or(std::string()), 0, why);
          if (!x) return fail(ec, error::invalid_state, "add: " + quote_key(keys[i]) + " " + why);
          out.push_back(*x);
        }
        return true;
      }
      // Lost a race (or the cache was cold): take the current values, again.
      for (std::size_t i = 0; i < keys.size(); ++i) {
        const json::value* rr = rs[i].find("response_range");
        if (!rr) return bad_reply(ec, "add", false);
        take_range(fk[i], *rr, ec);
        if (ec) return false;
      }
      if (d.expired()) return fail(ec, error::timeout, "add: still contended at the deadline");
    }
  }

  void drop_watch() noexcept {
    if (watch_ && watch_->conn) watch_->conn->close();
    watch_.reset();
  }

  // Opens a watch of `set` from now, then reads which of them exist
  // (revision R); events up to R only repeat the read and are skipped. The
  // watch comes first so that it starts "synced": a watch from a past
  // revision (R + 1 once anything else was written, e.g. a heartbeat) is
  // caught up by etcd's background loop, every 100 ms.
  bool open_watch(const std::vector<std::string>& set, deadline d, std::error_code& ec) {
    drop_watch();
    std::string body;
    for (const auto& k : set) body += "{\"create_request\":{\"key\":\"" + json::base64(k) + "\"}}";
    auto w = std::make_unique<watch_state>();
    const auto& ep = endpoints_[cur_];
    w->conn = std::make_unique<http_connection>(ep.host, ep.port, tls_, tls_ctx_.get());
    std::string why;
    unsigned status = 0;
    const auto o = w->conn->open_stream("/v3/watch", body, d, status, why);
    if (o != http_outcome::ok || status != 200) {
      rotate();
      return fail(ec, o == http_outcome::unauthorized ? error::unauthorized : error::peer_lost,
                  "etcd watch: " + (why.empty() ? "HTTP " + std::to_string(status) : why));
    }
    // One "created" answer per key; events that come meanwhile are kept.
    std::vector<std::string> early;
    for (std::size_t created = 0; created < set.size();) {
      std::string line;
      const auto got = w->conn->next_line(d, line, why);
      if (got == http_outcome::timeout || d.expired())
        return fail(ec, error::timeout, "etcd watch: not created before the deadline");
      if (got != http_outcome::ok) {
        rotate();
        return fail(ec, error::peer_lost, "etcd watch: " + why);
      }
      auto j = json::parse(line);
      const json::value* res = j ? j->find("result") : nullptr;
      if (!res || res->flag("canceled")) return bad_reply(ec, "watch", false);
      if (res->flag("created")) ++created;
      if (!res->array("events").empty()) early.push_back(std::move(line));
    }
    std::int64_t rev = 0;
    std::set<std::string> present;
    for (std::size_t first = 0; first < set.size(); first += etcd_max_txn_ops) {
      const std::size_t last = std::min(set.size(), first + etcd_max_txn_ops);
      std::string txn = "{\"success\":[";
      for (std::size_t i = first; i < last; ++i)
        txn += std::string(i == first ? "" : ",") + "{\"request_range\":{\"key\":\"" + json::base64(set[i]) +
               "\",\"keys_only\":true}}";
      txn += "]}";
      json::value r;
      if (!call("/v3/kv/txn", txn, d, retry::always, r, ec)) return false;
      // Several transactions: events after the first one's revision are
      // applied (later reads only repeat them).
      if (first == 0) rev = revision(r);
      const auto& rs = r.array("responses");
      if (rs.size() != last - first) return bad_reply(ec, "txn", false);
      for (std::size_t i = first; i < last; ++i) {
        const json::value* rr = rs[i - first].find("response_range");
        if (rr && !rr->array("kvs").empty()) present.insert(set[i]);
      }
    }
    w->keys = set;
    w->present = std::move(present);
    w->read_revision = rev;
    watch_ = std::move(w);
    for (const auto& line : early)
      if (!take_events(line)) {
        drop_watch();
        return bad_reply(ec, "watch", false);
      }
    return true;
  }

  // Applies one message of the watch stream; false when the watch must be
  // made again (cancelled, compacted, an error, or not etcd's JSON).
  bool take_events(const std::string& line) {
    auto j = json::parse(line);
    if (!j) return false;
    const json::value* res = j->find("result");
    if (!res) return false;  // {"error": ...}
    if (res->flag("canceled") || res->i64("compact_revision") != 0) return false;
    for (const auto& e : res->array("events")) {
      const json::value* kv = e.find("kv");
      if (!kv) continue;
      if (kv->i64("mod_revision") <= watch_->read_revision) continue;  // the read saw it already
      auto k = json::unbase64(kv->str("key"));
      if (!k) return false;
      if (e.str("type") == "DELETE") {
        watch_->present.erase(*k);
      } else {
        watch_->present.insert(*k);
        if (auto v = json::unbase64(kv->str("value"))) remember(*k, std::move(*v), kv->i64("mod_revision"));
      }
    }
    return true;
  }

  std::vector<store_address::endpoint> endpoints_;
  std::string prefix_;
  tls_options tls_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds connect_timeout_;
  std::chrono::milliseconds attempt_timeout_;
  std::unique_ptr<asio::ssl::context> tls_ctx_;  // before the connections that use it
  std::vector<std::unique_ptr<http_connection>> conns_;
  std::size_t cur_ = 0;
  std::unique_ptr<watch_state> watch_;
  // key -> (value, mod_revision) as last seen: `add` compares the revision and
  // puts the sum in one round trip while no one else wrote the key.
  std::unordered_map<std::string, std::pair<std::string, std::int64_t>> cache_;
};

}  // namespace detail
}  // namespace elastic
EBBFLOW_END_NAMESPACE
