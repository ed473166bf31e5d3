// SPDX-License-Identifier: Apache-2.0
//! @file impl/group/state_transfer.hpp
//! Streaming the committed state (registered buffers plus step, epoch and
//! cursor) from the members holding the newest step to those that lack it,
//! over the new generation's point-to-point tags; a launched worker
//! receives into a staging copy so a sender's death leaves its own state.
//! Training thread only.
#pragma once

#include <ebbflow/elastic/detail/group_impl.hpp>
#include <ebbflow/elastic/detail/wire.hpp>

#include <algorithm>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>

EBBFLOW_BEGIN_NAMESPACE
namespace elastic::detail {

template <kv_store Store, network Net>
void group_impl<Store, Net>::sync_state() {
  if (gen_.source == id_ && step_ < 0) take_own_initial_state();
  const auto d = deadline::after(opts_.op_timeout);
  auto& c = *comm_;
  auto raw = [](void* p, std::size_t n) { return buffer_view{p, n, dtype::u8, memory_space::host}; };
  // Point-to-point tags of the state transfer (collectives never use p2p tags).
  constexpr std::uint32_t tag_size = 1, tag_header = 2, tag_first = 3;
  // Every member holding the newest state (they committed the same steps,
  // so they hold the same bits) serves a share of those that lack it:
  // receiver i (in rank order) gets it from holder i mod S, so k newcomers
  // cost the members about k/S transfers' time, not k.
  std::vector<std::size_t> holders, receivers;
  for (std::size_t j = 0; j < gen_.members.size(); ++j)
    (gen_.members[j].committed >= gen_.source_step ? holders : receivers).push_back(j);
  if (holders.empty() && !receivers.empty())
    fail(error::invalid_state, "no member of generation " + std::to_string(gen_.generation) + " holds the state");
  auto sender_of = [&](std::size_t i) { return holders[i % holders.size()]; };
  const auto me = static_cast<std::size_t>(rank_);
  std::vector<std::size_t> to;  // the receivers this member serves
  for (std::size_t i = 0; i < receivers.size(); ++i)
    if (sender_of(i) == me) to.push_back(receivers[i]);
  if (!to.empty()) {
    if (gen_.generation == 0) fault_point("initial-sync");  // formed generation 0; nothing sent yet
    detail::writer w;
    w.put(step_).put(epoch_).put<std::uint64_t>(cursor_).put<std::uint64_t>(state_.size());
    for (auto& s : state_) {
      w.put_bytes(elastic::to_bytes(s.name));
      w.put<std::uint64_t>(s.data.size());
    }
    bytes header = w.take();
    std::uint64_t header_size = header.size();
    // Post every send to every receiver first, then wait: the receivers
    // are served in parallel, and a slow one does not hold up the others.
    std::vector<comm::request<transport_type>> sends;
    for (auto j : to) {
      const int peer = static_cast<int>(j);
      sends.push_back(c.isend(raw(&header_size, sizeof header_size), peer, tag_size));
      sends.push_back(c.isend(raw(header.data(), header.size()), peer, tag_header));
    }
    if (step_ > 0) fault_point("sync-send");
    for (std::size_t k = 0; k < state_.size(); ++k) {
      for (auto j : to)
        sends.push_back(c.isend(raw(state_[k].data.data(), state_[k].data.size()), static_cast<int>(j),
                                tag_first + static_cast<std::uint32_t>(k)));
      if (k == 0 && gen_.generation == 0) fault_point("initial-sync-part");  // headers and first buffers posted
    }
    for (auto& r : sends) r.wait(d);
    for (auto j : to)
      EBBFLOW_LOG_INFO("sent state of step " << step_ << " to member " << gen_.members[j].id << " (rank " << j << ")");
  } else if (const auto it = std::ranges::find(receivers, me); it != receivers.end()) {
    const auto from = sender_of(static_cast<std::size_t>(it - receivers.begin()));
    const int src = static_cast<int>(from);
    const member_id source = gen_.members[from].id;
    std::uint64_t header_size = 0;
    {
      // A newcomer waits here until the members switch, which may be many
      // steps away: poll gently (the members' CPU is not ours to spin on),
      // then take the state at full speed. If the job ends first (the
      // members finished before they switched), `finish` said so: a clear
      // error, not a timeout.
      if (opts_.join && opts_.rt_priority > 0) take_member_scheduling();
      auto first = c.irecv(raw(&header_size, sizeof header_size), src, tag_size);
      std::error_code ec;
      auto next_check = steady_clock::now() + opts_.heartbeat;
      while (!first.test(ec) && !d.expired()) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        if (steady_clock::now() < next_check) continue;
        next_check = steady_clock::now() + opts_.heartbeat;
        if (job_done())
          fail_job_finished("finished before the members switched to generation " + std::to_string(gen_.generation) +
                            ": this worker never received the state");
      }
      first.wait(d);  // returns at once when done; throws naming the peer on an error or the deadline
    }
    if (opts_.join) became_member();  // the members switched: from here on this newcomer is one of them
    if (header_size > (std::uint64_t{1} << 24))
      fail(error::bad_message, "state header of " + std::to_string(header_size) + " bytes");
    bytes header(header_size);
    c.recv(raw(header.data(), header.size()), src, tag_header, d);
    if (opts_.join) fault_point("sync-recv");
    detail::reader rd(header, "state header");
    const auto step = rd.get<std::int64_t>();
    const auto epoch = rd.get<std::int64_t>();
    const auto cursor = rd.get<std::uint64_t>();
    const auto n = rd.get<std::uint64_t>();
    if (n != state_.size())
      fail(error::invalid_state, "member " + std::to_string(source) + " has " + std::to_string(n) +
                                     " registered state buffers, this member " + std::to_string(state_.size()));
    for (std::size_t k = 0; k < state_.size(); ++k) {
      auto nm = rd.get_bytes();
      const auto sz = rd.get<std::uint64_t>();
      const std::string name(reinterpret_cast<const char*>(nm.data()), nm.size());
      if (name != state_[k].name || sz != state_[k].data.size()) {
        std::ostringstream os;
        os << "state buffer " << k << " is '" << name << "' of " << sz << " bytes on member " << source << " but '"
           << state_[k].name << "' of " << state_[k].data.size() << " bytes here";
        fail(error::invalid_state, os.str());
      }
    }
    // A launched worker whose buffers still hold its own initial state
    // receives into a copy first: should the sender die midway, its buffers
    // stay a valid initial state (recover() may make it the source).
    std::size_t total = 0;
    for (auto& s : state_) total += s.data.size();
    if (own_initial_state_ && total <= opts_.initial_staging) {
      auto staged = std::make_unique_for_overwrite<std::byte[]>(total);
      for (std::size_t k = 0, off = 0; k < state_.size(); off += state_[k++].data.size()) {
        c.recv(raw(staged.get() + off, state_[k].data.size()), src, tag_first + static_cast<std::uint32_t>(k), d);
      }
      own_initial_state_ = false;
      for (std::size_t k = 0, off = 0; k < state_.size(); off += state_[k++].data.size())
        if (!state_[k].data.empty()) std::memcpy(state_[k].data.data(), staged.get() + off, state_[k].data.size());
    } else {
      own_initial_state_ = false;  // from here on a failure may leave the buffers part written
      for (std::size_t k = 0; k < state_.size(); ++k)
        c.recv(raw(state_[k].data.data(), state_[k].data.size()), src, tag_first + static_cast<std::uint32_t>(k), d);
    }
    step_ = step;
    epoch_ = epoch;
    cursor_ = cursor;
    EBBFLOW_LOG_INFO("received state of step " << step_ << " from member " << source);
  }
}

}  // namespace elastic::detail
EBBFLOW_END_NAMESPACE
