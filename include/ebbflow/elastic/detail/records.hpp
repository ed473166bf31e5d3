// SPDX-License-Identifier: Apache-2.0
//! @file detail/records.hpp
//! The values the elastic group keeps in the store, and their formats: the
//! record of a generation (binary, `generation_record`), join tickets and a
//! worker's join failures (text), and integers (decimal text). Owned by no
//! one part of the group: every part that reads or writes these keys uses
//! these types, so a format lives in one place.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/elastic/detail/wire.hpp>
#include <ebbflow/elastic/group_types.hpp>      // change_reason
#include <ebbflow/elastic/kv_store.hpp>         // bytes
#include <ebbflow/elastic/planning_policy.hpp>  // member_id

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

// Integers the group stores as decimal text; anything else is a corrupt store.
inline std::int64_t parse_i64(const std::string& v) {
  std::int64_t x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc{} || p != v.data() + v.size())
    throw system_error(
        make_error_code(error::bad_message),
        {.operation = "elastic group", .detail = "store value '" + v.substr(0, 32) + "' is not an integer"});
  return x;
}

// Appends `item` to a list for a message: "1", then "1, 4".
inline void append_listed(std::string& list, const std::string& item) {
  if (!list.empty()) list += ", ";
  list += item;
}

// A member of a generation and the newest step it committed.
struct member_entry {
  member_id id = -1;
  std::int64_t committed = -1;  // newest committed step the member holds; -1: no state
};
// What a member with no step reports to a recovery when its buffers still
// hold its own launch-time initial state (never in a generation record).
inline constexpr std::int64_t own_initial_state = -2;

// The record of generation g under `<prefix>/gen/<g>`, written once
// (compare-and-set) by whoever forms it: its members in rank order, which
// member holds the newest committed state, the plan, and how many join
// tickets were handled. Binary, versioned by its magic number.
struct generation_record {
  std::int64_t generation = 0;
  change_reason reason = change_reason::initial;
  std::vector<member_entry> members;
  member_id source = -1;  // holds the newest committed state
  std::int64_t source_step = 0;
  std::vector<std::uint64_t> plan;  // full-B plan, rank order
  std::uint64_t plan_version = 0;
  std::int64_t joins_seen = 0;  // join tickets handled so far

  [[nodiscard]] bytes encode() const {
    writer w;
    w.put<std::uint32_t>(0xEBBF1001u).put(generation).put(static_cast<std::uint8_t>(reason));
    w.put<std::uint64_t>(members.size());
    for (auto& m : members) w.put(m.id).put(m.committed);
    w.put(source).put(source_step).put<std::uint64_t>(plan.size());
    for (auto b : plan) w.put(b);
    w.put(plan_version).put(joins_seen);
    return w.take();
  }
  static generation_record decode(std::span<const std::byte> in) {
    reader r(in, "generation record");
    generation_record g;
    if (r.get<std::uint32_t>() != 0xEBBF1001u)
      throw system_error(make_error_code(error::bad_message),
                         {.operation = "decode", .detail = "generation record magic"});
    g.generation = r.get<std::int64_t>();
    g.reason = static_cast<change_reason>(r.get<std::uint8_t>());
    const auto n = r.get_count(16);
    for (std::uint64_t i = 0; i < n; ++i) {
      member_entry m;
      m.id = r.get<member_id>();
      m.committed = r.get<std::int64_t>();
      g.members.push_back(m);
    }
    g.source = r.get<member_id>();
    g.source_step = r.get<std::int64_t>();
    const auto p = r.get_count(8);
    for (std::uint64_t i = 0; i < p; ++i) g.plan.push_back(r.get<std::uint64_t>());
    g.plan_version = r.get<std::uint64_t>();
    g.joins_seen = r.get<std::int64_t>();
    r.expect_end();
    return g;
  }
  [[nodiscard]] int rank_of(member_id id) const noexcept {
    for (std::size_t i = 0; i < members.size(); ++i)
      if (members[i].id == id) return static_cast<int>(i);
    return -1;
  }
};

// A join ticket reads "<member> <failures whose cool-down it waited out>
// <worker key>"; the member id is parsed (and checked) by its reader.
struct join_ticket {
  std::string id;
  std::int64_t held_for = 0;
  std::string worker;
  static join_ticket parse(const std::string& v) {
    join_ticket t;
    std::istringstream in(v);
    in >> t.id >> t.held_for >> std::ws;
    std::getline(in, t.worker);
    return t;
  }
};

// A worker's join failures in a row, as stored: "<count>" (after a reset),
// or "<count> <generation> <member>,<member>,..." naming the members of the
// failed generation already counted, so every recovering member can apply
// the same failure and only the first one counts it.
struct join_failures {
  std::int64_t count = 0;
  std::int64_t generation = -1;
  std::vector<member_id> members;

  static join_failures parse(const std::optional<std::string>& v) {
    join_failures f;
    if (!v || v->empty()) return f;
    std::istringstream in(*v);
    in >> f.count;
    if (in >> f.generation) {
      std::string ids;
      in >> ids;
      for (std::size_t at = 0; at < ids.size();) {
        const auto comma = std::min(ids.find(',', at), ids.size());
        f.members.push_back(parse_i64(ids.substr(at, comma - at)));
        at = comma + 1;
      }
    }
    if (in.fail() && !in.eof()) f = {};
    return f;
  }
  std::string str() const {
    std::string s = std::to_string(count) + " " + std::to_string(generation) + " ";
    for (std::size_t i = 0; i < members.size(); ++i) {
      if (i) s += ',';
      s += std::to_string(members[i]);
    }
    return s;
  }
};

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
