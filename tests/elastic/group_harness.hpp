// SPDX-License-Identifier: Apache-2.0
// The in-process harness of the elastic group tests: members as threads on a
// loopback network, each with its own connection to one shared memory_store.
#pragma once

#include <ebbflow/elastic/group.hpp>
#include <ebbflow/elastic/kv_store.hpp>
#include <ebbflow/elastic/loopback_network.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

// The group tests take what they use from here with `using namespace
// ebbflow_test`: the short names below, and the chrono literals (500ms).
namespace ebbflow_test {
namespace ef = ebbflow;
namespace el = ebbflow::elastic;
using namespace std::chrono_literals;

// Forwards to one shared memory_store (each worker gets its own "client").
// One member's connection to the job's store. It counts, where asked, the
// calls made on it (`calls`), the reads of the join-ticket counter
// (`join_seq_reads`, all connections of a run) and of the tickets
// themselves (`ticket_reads`).
struct store_ref {
  std::shared_ptr<el::memory_store> s;
  std::atomic<long>* calls = nullptr;
  std::atomic<long>* join_seq_reads = nullptr;
  // While set, every call on this member's connections blocks, as in a
  // stopped process: its heartbeat thread stays silent.
  std::shared_ptr<std::atomic<bool>> frozen{};
  // Reads of join tickets ("<prefix>/join/<n>") on this connection, where asked.
  std::atomic<long>* ticket_reads = nullptr;
  void count() {
    while (frozen && frozen->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (calls) calls->fetch_add(1);
  }
  void set(const std::string& k, std::string_view v, ef::deadline d) { count(), s->set(k, v, d); }
  std::optional<std::string> try_get(const std::string& k, ef::deadline d) {
    count();
    if (ticket_reads && k.find("/join/") != std::string::npos) ticket_reads->fetch_add(1);
    return s->try_get(k, d);
  }
  std::int64_t add(const std::string& k, std::int64_t x, ef::deadline d) {
    count();
    const auto r = s->add(k, x, d);
    if (join_seq_reads && x == 0 && k.ends_with("/join_seq")) join_seq_reads->fetch_add(1);
    return r;
  }
  el::memory_store::cas_result compare_set(const std::string& k, std::string_view e, std::string_view v,
                                           ef::deadline d) {
    return count(), s->compare_set(k, e, v, d);
  }
  void wait(const std::vector<std::string>& k, ef::deadline d) { count(), s->wait(k, d); }
  bool erase(std::string_view k) { return count(), s->erase(k); }
};
using test_group = el::group<store_ref, el::loopback_network>;

}  // namespace ebbflow_test
