// SPDX-License-Identifier: Apache-2.0
// Test helpers for plan/work_stealing.hpp: run one step with one thread per
// slice (random caps, random pauses between chunks) and check that the
// granted chunks cover every slice exactly once.
#pragma once

#include <ebbflow/plan/work_stealing.hpp>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace ws_test {

//! "" when `chunks` grant every item of every slice exactly once and nothing
//! outside; otherwise what is wrong.
inline std::string check_exactly_once(const std::vector<std::size_t>& sizes,
                                      const std::vector<ebbflow::plan::chunk>& chunks) {
  std::vector<std::vector<int>> hit(sizes.size());
  for (std::size_t r = 0; r < sizes.size(); ++r) hit[r].assign(sizes[r], 0);
  std::ostringstream err;
  for (const auto& c : chunks) {
    if (c.rank >= sizes.size() || c.first > c.last || c.last > sizes[c.rank]) {
      err << "chunk rank " << c.rank << " [" << c.first << ", " << c.last << ") out of range; ";
      continue;
    }
    for (std::uint64_t i = c.first; i < c.last; ++i) ++hit[c.rank][i];
  }
  for (std::size_t r = 0; r < sizes.size(); ++r)
    for (std::size_t i = 0; i < sizes[r]; ++i)
      if (hit[r][i] != 1) {
        err << "slice " << r << " item " << i << " claimed " << hit[r][i] << " times; ";
        break;
      }
  return err.str();
}

//! What one simulated step granted.
struct step_result {
  std::vector<ebbflow::plan::chunk> chunks;  //!< every non-empty chunk granted
  std::uint64_t processed = 0;               //!< Σ work_stealer::processed()
  std::uint64_t stolen = 0;                  //!< Σ work_stealer::stolen()
};

//! Runs worker r of every slice on its own thread against `store_for(r)`:
//! `next(cap)` with a random cap in [1, max_cap] and random pauses until it
//! is done, or until it has taken `stop_after` chunks (an abandoned attempt).
template <class StoreFor>
step_result run_step_with(StoreFor store_for, const std::string& prefix, ebbflow::plan::step_id id,
                          const std::vector<std::size_t>& sizes, ebbflow::plan::steal_options o, std::uint64_t seed,
                          std::uint64_t max_cap, int stop_after = -1) {
  step_result out;
  std::mutex mu;
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < sizes.size(); ++r) {
    threads.emplace_back([&, r] {
      std::mt19937_64 rng(seed * 1000003 + r);
      auto& store = store_for(r);
      ebbflow::plan::work_stealer<std::remove_reference_t<decltype(store)>> w(store, prefix, id, sizes, r, o);
      std::vector<ebbflow::plan::chunk> mine;
      for (int k = 0; stop_after < 0 || k < stop_after; ++k) {
        const ebbflow::plan::chunk c = w.next(1 + rng() % max_cap);
        if (c.empty()) break;
        mine.push_back(c);
        // A slow worker: some pause per chunk, scaled per worker.
        if (rng() % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds((r % 3) * (rng() % 200)));
      }
      std::lock_guard lk(mu);
      out.chunks.insert(out.chunks.end(), mine.begin(), mine.end());
      out.processed += w.processed();
      out.stolen += w.stolen();
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

//! As above, every worker on the one (thread-safe) `store`.
template <class Store>
step_result run_step(Store& store, const std::string& prefix, ebbflow::plan::step_id id,
                     const std::vector<std::size_t>& sizes, ebbflow::plan::steal_options o, std::uint64_t seed,
                     std::uint64_t max_cap, int stop_after = -1) {
  return run_step_with([&](std::size_t) -> Store& { return store; }, prefix, id, sizes, o, seed, max_cap, stop_after);
}

}  // namespace ws_test
