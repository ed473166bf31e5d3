// SPDX-License-Identifier: Apache-2.0
//! @file ucx/address_exchange.hpp
//! Bootstrap of a UCX group: every rank publishes its worker address and
//! fetches everyone's. Pluggable: anything satisfying `address_exchange`
//! works (the rendezvous store plugs in here); `file_address_exchange` uses a
//! shared directory and needs nothing else (tests, single host, shared FS).
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/comm/ucx/handles.hpp>
#include <ebbflow/comm/ucx/transport.hpp>
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/core/error.hpp>

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <thread>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace comm::ucx {

//! `x(generation, rank, size, my_address, deadline)` publishes `my_address`
//! for (generation, rank) and returns all `size` addresses indexed by rank
//! (its own included), blocking until every rank published or the deadline
//! passed (then throws `system_error` with `errc::timeout` naming a missing
//! rank).
template <class X>
concept address_exchange = requires(X& x, std::int64_t g, int rank, int size, std::span<const std::byte> mine,
                                    deadline d) {
  { x(g, rank, size, mine, d) } -> std::same_as<std::vector<std::vector<std::byte>>>;
};

//! Exchange through files `<dir>/g<generation>.r<rank>.addr`, written to a
//! temporary name and renamed, so readers never see a partial file. Polls
//! every millisecond. Thread-safe for distinct ranks.
class file_address_exchange {
 public:
  //! Exchanges through files in `dir`, a directory every rank can reach (e.g.
  //! a shared or node-local filesystem); touches nothing until called.
  explicit file_address_exchange(std::filesystem::path dir) : dir_(std::move(dir)) {}

  //! Publishes `mine` for (`generation`, `rank`) and returns all `size`
  //! addresses indexed by rank, blocking (polling) until every rank published
  //! or `d` passed. @throws system_error (`errc::timeout` naming a missing
  //! rank), std::invalid_argument when the file cannot be written,
  //! std::filesystem::filesystem_error when the rename fails.
  std::vector<std::vector<std::byte>> operator()(std::int64_t generation, int rank, int size,
                                                 std::span<const std::byte> mine, deadline d) const {
    namespace fs = std::filesystem;
    // Built by appending: GCC 12 at -O3 reports a false -Wrestrict on
    // `"literal" + std::to_string(...)` (GCC bug 105651), which breaks -Werror users.
    auto name = [&](int r) {
      std::string file = "g";
      file += std::to_string(generation);
      file += ".r";
      file += std::to_string(r);
      file += ".addr";
      return dir_ / file;
    };
    const fs::path tmp = name(rank).string() + ".tmp";
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      f.write(reinterpret_cast<const char*>(mine.data()), static_cast<std::streamsize>(mine.size()));
      f.close();
      EBBFLOW_ENFORCE(f.good(), "file_address_exchange: cannot write " << tmp);
    }
    fs::rename(tmp, name(rank));
    std::vector<std::vector<std::byte>> all(static_cast<std::size_t>(size));
    for (int r = 0; r < size; ++r) {
      for (;;) {
        std::ifstream f(name(r), std::ios::binary);
        if (f) {
          std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
          auto& out = all[static_cast<std::size_t>(r)];
          out.resize(bytes.size());
          for (std::size_t i = 0; i < bytes.size(); ++i) out[i] = static_cast<std::byte>(bytes[i]);
          break;
        }
        if (d.expired())
          throw_if(make_error_code(error::timeout), {.rank = rank,
                                                     .generation = generation,
                                                     .peer = r,
                                                     .operation = "address exchange",
                                                     .detail = name(r).string()});
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    return all;
  }

 private:
  std::filesystem::path dir_;
};
static_assert(address_exchange<file_address_exchange>);

//! Builds this rank's UCX transport for `generation`: a fresh worker on
//! `ctx`, its address published and everyone's fetched through `exchange`,
//! then endpoints to every peer, all before `d`. @throws system_error.
template <address_exchange X>
transport connect(const std::shared_ptr<context>& ctx, X& exchange, std::int64_t generation, int rank, int size,
                  deadline d) {
  worker w(ctx);
  auto addrs = exchange(generation, rank, size, w.address(), d);
  return transport(std::move(w), generation, rank, size, addrs, d);
}

}  // namespace comm::ucx
EBBFLOW_END_NAMESPACE
