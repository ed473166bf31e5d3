// SPDX-License-Identifier: Apache-2.0
//! @file store_address_exchange.hpp
//! `store_address_exchange`: publishes transport addresses through the
//! rendezvous store (any `kv_store`), for a fixed-size job started by
//! `ebbflow-run`, torchrun, mpirun or Slurm: each rank sets
//! `<prefix>/addr/<generation>/<rank>` and waits (server side) for the others.
//! Models `comm::ucx::address_exchange` (and any exchange of that shape).
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/elastic/kv_store.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic {

//! Address exchange through a `kv_store` (see the file comment). Holds a
//! pointer to the store, not the store; concurrent calls are as safe as the
//! store's calls are.
template <kv_store Store>
class store_address_exchange {
 public:
  //! `store` must outlive the exchange; `prefix` separates jobs sharing a store.
  explicit store_address_exchange(Store& store, std::string prefix = "ebbflow")
      : store_(&store), prefix_(std::move(prefix)) {}

  //! Publishes `mine` for (generation, rank) and returns every rank's address
  //! by rank. Blocks until all `size` ranks published or `d` passes.
  //! @throws system_error (errc::timeout naming the generation) or the store's errors.
  std::vector<std::vector<std::byte>> operator()(std::int64_t generation, int rank, int size,
                                                 std::span<const std::byte> mine, deadline d) const {
    EBBFLOW_ENFORCE(size > 0 && rank >= 0 && rank < size,
                    "store_address_exchange: rank " << rank << " outside [0, " << size << ")");
    auto key = [&](int r) { return prefix_ + "/addr/" + std::to_string(generation) + "/" + std::to_string(r); };
    store_->set(key(rank), to_value(mine), d);
    std::vector<std::string> keys;
    for (int r = 0; r < size; ++r) keys.push_back(key(r));
    store_->wait(keys, d);
    std::vector<std::vector<std::byte>> all;
    for (int r = 0; r < size; ++r) {
      auto v = store_->try_get(keys[static_cast<std::size_t>(r)], d);
      if (!v)
        throw system_error(make_error_code(error::invalid_state), {.rank = rank,
                                                                   .generation = generation,
                                                                   .peer = r,
                                                                   .operation = "address exchange",
                                                                   .detail = "key vanished from the store"});
      all.push_back(to_bytes(*v));
    }
    return all;
  }

 private:
  Store* store_;
  std::string prefix_;
};

}  // namespace elastic
EBBFLOW_END_NAMESPACE
