// SPDX-License-Identifier: Apache-2.0
//! @file collectives.hpp
//! The codec-specific algorithms behind `compressed_allreduce`, written over
//! the `comm::transport` concept: a ring with decode-add-encode per hop
//! (linear codes), a ring allgather of encoded blocks (sparse codes) and the
//! two-phase sign scheme. Dense traffic is not here: it is the communicator's
//! allreduce. Each call runs under one sequence number that the caller took
//! from the communicator (`coll_ctx::seq`), and numbers its steps within it.
//!
//! Pipelining: the tensor is cut into chunks (one per rank, block aligned) and
//! chunks into segments of `seg_elems`; all receives are posted up front,
//! each segment is sent as soon as it is encoded, so encoding segment k+1
//! overlaps the transfer of segment k, and a segment is forwarded to the next
//! hop as soon as it arrived. Segments of one (peer, tag) arrive in posting
//! order (the transport is non-overtaking), so one tag per ring step suffices.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/comm/transport.hpp>
#include <ebbflow/compress/codec.hpp>
#include <ebbflow/compress/detail/philox.hpp>
#include <ebbflow/compress/kernels/topk.hpp>  // fill_zero
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/core/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace compress::detail {

//! One pipelined segment: elements [begin, begin + len) of the tensor, its
//! encoding at byte `off` of its chunk's encoded area.
struct segment {
  std::size_t begin, len, off, bytes;
};
struct chunk {
  std::size_t begin = 0, end = 0, bytes = 0, area_off = 0;  //!< area_off: offset in a p-chunk arena
  std::vector<segment> segs;
};

//! Chunks (block aligned, one per rank) and their segments.
template <class Codec>
std::vector<chunk> make_layout(const Codec& c, std::size_t n, int parts, std::size_t seg_elems) {
  const std::size_t g = c.block_elems();
  const std::size_t blocks = (n + g - 1) / g;
  seg_elems = std::max(g, seg_elems / g * g);
  std::vector<chunk> out(static_cast<std::size_t>(parts));
  std::size_t area = 0;
  for (std::size_t k = 0; k < out.size(); ++k) {
    auto& ch = out[k];
    ch.begin = std::min(n, blocks * k / out.size() * g);
    ch.end = std::min(n, blocks * (k + 1) / out.size() * g);
    ch.area_off = area;
    for (std::size_t b = ch.begin; b < ch.end; b += seg_elems) {
      const std::size_t len = std::min(seg_elems, ch.end - b);
      const std::size_t bytes = c.max_encoded_bytes(len);
      ch.segs.push_back({b, len, ch.bytes, bytes});
      ch.bytes += bytes;
    }
    area += ch.bytes;
  }
  return out;
}
inline std::size_t area_bytes(const std::vector<chunk>& l) noexcept {
  return l.empty() ? 0 : l.back().area_off + l.back().bytes;
}

//! Per-call context shared by the algorithms.
struct coll_ctx {
  std::size_t seg_elems = 1 << 18;
  deadline dl = deadline::never();
  std::uint64_t seed = 0;
  std::uint64_t stream_base = 0;  //!< unique per (rank, call, tensor)
  std::uint64_t seq = 0;          //!< tag sequence number of this collective
  std::size_t wire_sent = 0;      //!< bytes this rank sent (accumulated)
  std::size_t saturated = 0;      //!< result elements beyond float's range from finite codes (accumulated)
  const char* op = "compressed_allreduce";
};

//! Reusable byte arenas (host memory) of one allreduce object.
struct arenas {
  std::vector<std::byte> a, b, c, ws;
  static std::byte* get(std::vector<std::byte>& v, std::size_t n) {
    if (v.size() < n) v.resize(n);
    return v.data();
  }
};

//! Requests plus the deadline/error plumbing.
template <class T>
class request_set {
 public:
  request_set(T& t, coll_ctx& ctx) : t_(t), ctx_(ctx) {}
  std::size_t recv(int peer, comm::tag_t tag, std::byte* p, std::size_t n) {
    reqs_.push_back(t_.irecv(peer, tag, std::span<std::byte>(p, n)));
    peers_.push_back(peer);
    return reqs_.size() - 1;
  }
  void send(int peer, comm::tag_t tag, const std::byte* p, std::size_t n) {
    sends_.push_back(t_.isend(peer, tag, std::span<const std::byte>(p, n)));
    send_peers_.push_back(peer);
    ctx_.wire_sent += n;
    // Fail fast when the transport already knows the peer is gone: otherwise
    // this rank would first wait for a receive that may never come.
    std::error_code ec;
    if (t_.test(sends_.back(), ec) && ec)
      throw_if(
          ec, {.rank = t_.rank(), .generation = t_.generation(), .peer = peer, .operation = ctx_.op, .detail = "send"});
  }
  //! Blocks until receive `i` completed. @throws system_error (timeout, peer_lost, ...).
  void wait_recv(std::size_t i) { wait(reqs_[i], peers_[i], "recv"); }
  //! True when receive `i` completed; does not block. @throws system_error on a failed receive.
  bool test_recv(std::size_t i) {
    std::error_code ec;
    const bool done = t_.test(reqs_[i], ec);
    throw_if(
        ec,
        {.rank = t_.rank(), .generation = t_.generation(), .peer = peers_[i], .operation = ctx_.op, .detail = "recv"});
    return done;
  }
  void wait_sends() {
    for (std::size_t i = 0; i < sends_.size(); ++i) wait(sends_[i], send_peers_[i], "send");
    sends_.clear();
    send_peers_.clear();
  }

 private:
  void wait(typename T::request& r, int peer, const char* what) {
    std::error_code ec;
    t_.wait(r, ctx_.dl, ec);
    throw_if(ec,
             {.rank = t_.rank(), .generation = t_.generation(), .peer = peer, .operation = ctx_.op, .detail = what});
  }
  T& t_;
  coll_ctx& ctx_;
  std::vector<typename T::request> reqs_, sends_;
  std::vector<int> peers_, send_peers_;
};

inline int mod(int a, int p) noexcept { return ((a % p) + p) % p; }

// Allgather steps are numbered from here; reduce-scatter and all-to-all
// steps (at most max_collective_ranks − 2) stay below it.
inline constexpr std::uint32_t ag_step = 0x8000;
static_assert(comm::max_collective_ranks - 2 < static_cast<int>(ag_step) &&
              (ag_step | static_cast<std::uint32_t>(comm::max_collective_ranks - 2)) <= comm::max_collective_step);

//! The allgather both rings end with. At step s (0 to p - 2) the encoded
//! chunk mod(first - s, p) arrives from the left neighbour into its place in
//! `ag`, goes on to the right unless s is the last step, and is decoded into
//! `data`. Step 0's own chunk (mod(first + 1, p)) is sent with `tag(0)` by the
//! caller once encoded.
template <class T>
struct ring_allgather {
  request_set<T>& rq;
  const std::vector<chunk>& layout;
  std::byte* ag;
  std::uint64_t seq;
  int p, first, left, right;
  std::vector<std::size_t> ids{};

  [[nodiscard]] comm::tag_t tag(int s) const noexcept {
    return comm::make_tag(seq, ag_step | static_cast<std::uint32_t>(s));
  }
  [[nodiscard]] const chunk& arriving(int s) const noexcept {
    return layout[static_cast<std::size_t>(mod(first - s, p))];
  }
  //! Posts every receive of the allgather (before any send of the collective).
  void post() {
    for (int s = 0; s < p - 1; ++s)
      for (const auto& sg : arriving(s).segs)
        ids.push_back(rq.recv(left, tag(s), ag + arriving(s).area_off + sg.off, sg.bytes));
  }
  //! Forwards and decodes every arriving chunk, in order.
  template <class Codec, class Ex>
  void finish(const Codec& codec, Ex& ex, float* data) {
    std::size_t k = 0;
    for (int s = 0; s < p - 1; ++s) {
      const chunk& c = arriving(s);
      for (const auto& sg : c.segs) {
        rq.wait_recv(ids[k++]);
        if (s < p - 2) rq.send(right, tag(s + 1), ag + c.area_off + sg.off, sg.bytes);
        codec.decode(ex, ag + c.area_off + sg.off, data + sg.begin, sg.len);
      }
    }
  }
};

inline encode_context seg_ctx(const coll_ctx& ctx, std::uint64_t phase, std::size_t begin, std::byte* ws) noexcept {
  return {ctx.seed, mix64(ctx.stream_base ^ mix64((phase << 56) ^ begin)), ws};
}

//! The ring's hop: encodes decode(`in`) + `data` (+ `res`) into `out`.
//! Codecs that can do it in one pass (`decode_add_encode`: the casts, which
//! keep the running sum in their scaled units) leave `data` as it is; the
//! others decode-add into `data` and encode that.
template <class Codec, class Ex>
void add_encode(const Codec& c, Ex& ex, const std::byte* in, float* data, float* res, std::byte* out, std::size_t n,
                const encode_context& ctx) {
  if constexpr (requires { c.decode_add_encode(ex, in, data, res, out, n); }) {
    c.decode_add_encode(ex, in, data, res, out, n);
  } else {
    c.decode_add(ex, in, data, n);
    c.encode(ex, data, res, out, n, ctx);
  }
}

//! Ring allreduce (sum) of `data[0, n)` with decode-add-encode per hop.
//! `res` (nullable) is the error-feedback residual of this rank, n floats:
//! every rank encodes every region exactly once per call, so the residual of
//! each region carries exactly that encode's error into the next call.
//! Each hop is `add_encode`. `ctx.saturated` counts the results beyond
//! float's range, for codecs that can tell (`saturated`: the casts).
template <class Codec, class T, class Ex>
void ring_allreduce(T& t, const Codec& codec, Ex& ex, float* data, std::size_t n, float* res, coll_ctx& ctx,
                    arenas& ar) {
  const int p = t.size(), r = t.rank();
  if (p == 1 || n == 0) return;
  const auto L = make_layout(codec, n, p, ctx.seg_elems);
  const std::size_t area = area_bytes(L);
  std::byte* rs_in = arenas::get(ar.a, area);
  std::byte* rs_out = arenas::get(ar.b, area);
  std::byte* ag = arenas::get(ar.c, area);
  std::byte* ws = arenas::get(ar.ws, codec.workspace_bytes(ctx.seg_elems) + 8);
  const int left = mod(r - 1, p), right = mod(r + 1, p);
  const auto tag_rs = [&](int s) { return comm::make_tag(ctx.seq, static_cast<std::uint32_t>(s)); };
  const auto& ch = [&](int c) -> const chunk& { return L[static_cast<std::size_t>(c)]; };

  request_set<T> rq(t, ctx);
  std::vector<std::size_t> rs_ids;
  for (int s = 0; s < p - 1; ++s)
    for (const auto& sg : ch(mod(r - s - 1, p)).segs)
      rs_ids.push_back(rq.recv(left, tag_rs(s), rs_in + ch(mod(r - s - 1, p)).area_off + sg.off, sg.bytes));
  ring_allgather<T> gather{rq, L, ag, ctx.seq, p, r, left, right};
  gather.post();

  float* no_res = nullptr;
  for (const auto& sg : ch(r).segs) {  // reduce-scatter step 0: my own chunk, local data
    codec.encode(ex, data + sg.begin, res ? res + sg.begin : no_res, rs_out + ch(r).area_off + sg.off, sg.len,
                 seg_ctx(ctx, 0, sg.begin, ws));
    ex.wait();
    rq.send(right, tag_rs(0), rs_out + ch(r).area_off + sg.off, sg.bytes);
  }
  std::size_t k = 0;
  for (int s = 0; s < p - 1; ++s) {
    const chunk& c = ch(mod(r - s - 1, p));
    for (const auto& sg : c.segs) {
      rq.wait_recv(rs_ids[k++]);
      // The last step completes the chunk: encode it once for the allgather
      // and keep exactly what the others will decode.
      std::byte* out = (s < p - 2 ? rs_out : ag) + c.area_off + sg.off;
      add_encode(codec, ex, rs_in + c.area_off + sg.off, data + sg.begin, res ? res + sg.begin : no_res, out, sg.len,
                 seg_ctx(ctx, 0, sg.begin, ws));
      if (s < p - 2) {
        ex.wait();
        rq.send(right, tag_rs(s + 1), out, sg.bytes);
      } else {
        codec.decode(ex, out, data + sg.begin, sg.len);
        ex.wait();
        rq.send(right, gather.tag(0), out, sg.bytes);
      }
    }
  }
  gather.finish(codec, ex, data);
  ex.wait();
  // Every chunk's final encoding is in `ag` now, on every rank: codes that
  // decode beyond float's range are counted the same everywhere.
  if constexpr (requires(const std::byte* e) { codec.saturated(e, data, n); })
    for (const auto& c : L)
      for (const auto& sg : c.segs) ctx.saturated += codec.saturated(ag + c.area_off + sg.off, data + sg.begin, sg.len);
  rq.wait_sends();
}

//! Ring allgather of every rank's encoded tensor; every rank adds the p
//! encodings in rank order (so every rank gets the same bits).
//!
//! The CPU work is spread over the transfer instead of following it: after
//! each own segment is encoded, receives that already completed are forwarded
//! at once, so the ring keeps moving while this rank encodes. A segment is
//! decoded as soon as its turn has come: with `decode_sum` (top-k), in one
//! tiled pass once all p encodings of it are here, which touches `data` once
//! instead of zeroing it and then scattering p times into memory (measured:
//! 18.5-20.6x -> 20.1-22.4x dense at 1 Gbit/s, 4 ranks on 2 cores, paired
//! runs); otherwise the segment is zeroed after its encode (its input is no
//! longer needed) and origin o is added once it is here and origins < o are.
template <class Codec, class T, class Ex>
void sparse_allreduce(T& t, const Codec& codec, Ex& ex, float* data, std::size_t n, float* res, coll_ctx& ctx,
                      arenas& ar) {
  const int p = t.size(), r = t.rank();
  if (p == 1 || n == 0) return;
  const auto L = make_layout(codec, n, 1, ctx.seg_elems);
  const chunk& all = L[0];
  const std::size_t nseg = all.segs.size();
  std::byte* g = arenas::get(ar.a, all.bytes * static_cast<std::size_t>(p));
  std::byte* ws = arenas::get(ar.ws, codec.workspace_bytes(ctx.seg_elems) + 8);
  const auto at = [&](int origin, const segment& sg) {
    return g + all.bytes * static_cast<std::size_t>(origin) + sg.off;
  };
  const int left = mod(r - 1, p), right = mod(r + 1, p);
  request_set<T> rq(t, ctx);
  std::vector<std::size_t> ids;
  for (int s = 0; s < p - 1; ++s)
    for (const auto& sg : all.segs)
      ids.push_back(
          rq.recv(left, comm::make_tag(ctx.seq, static_cast<std::uint32_t>(s)), at(mod(r - s - 1, p), sg), sg.bytes));
  // here[o * nseg + i]: segment i of origin o is in the arena; next[i]: the
  // next origin to add into segment i (valid once segment i is zeroed).
  std::vector<char> here(static_cast<std::size_t>(p) * nseg, 0);
  std::vector<int> next(nseg, 0);
  std::vector<char> zeroed(nseg, 0);
  constexpr bool has_sum = requires(const std::byte* const* e) { codec.decode_sum(ex, e, std::size_t{}, data, n); };
  std::vector<const std::byte*> parts(static_cast<std::size_t>(p));
  const auto apply = [&](std::size_t i) {
    if (!zeroed[i]) return;
    const segment& sg = all.segs[i];
    if constexpr (has_sum) {  // one pass over the segment once all p encodings are here
      for (int o = 0; o < p; ++o)
        if (!here[static_cast<std::size_t>(o) * nseg + i]) return;
      for (int o = 0; o < p; ++o) parts[static_cast<std::size_t>(o)] = at(o, sg);
      if (next[i] == 0) codec.decode_sum(ex, parts.data(), parts.size(), data + sg.begin, sg.len);
      next[i] = p;
    } else {
      while (next[i] < p && here[static_cast<std::size_t>(next[i]) * nseg + i]) {
        codec.decode_add(ex, at(next[i], sg), data + sg.begin, sg.len);
        ++next[i];
      }
    }
  };
  std::size_t k = 0;  // receives handled so far, in posting order
  const auto arrived = [&](std::size_t id) {
    const auto s = static_cast<int>(id / nseg);
    const std::size_t i = id % nseg;
    const segment& sg = all.segs[i];
    const int origin = mod(r - s - 1, p);
    if (s < p - 2) rq.send(right, comm::make_tag(ctx.seq, static_cast<std::uint32_t>(s + 1)), at(origin, sg), sg.bytes);
    here[static_cast<std::size_t>(origin) * nseg + i] = 1;
    apply(i);
  };
  float* no_res = nullptr;
  for (std::size_t i = 0; i < nseg; ++i) {
    const segment& sg = all.segs[i];
    codec.encode(ex, data + sg.begin, res ? res + sg.begin : no_res, at(r, sg), sg.len, seg_ctx(ctx, 1, sg.begin, ws));
    ex.wait();
    rq.send(right, comm::make_tag(ctx.seq, 0), at(r, sg), sg.bytes);
    for (; k < ids.size() && rq.test_recv(ids[k]); ++k) arrived(k);
    if constexpr (!has_sum) ex.bulk(sg.len, kernels::fill_zero{data + sg.begin});  // decode_sum writes every element
    zeroed[i] = 1;
    here[static_cast<std::size_t>(r) * nseg + i] = 1;
    apply(i);
  }
  for (; k < ids.size(); ++k) {
    rq.wait_recv(ids[k]);
    arrived(k);
  }
  ex.wait();
  rq.wait_sends();
}

//! DeepSpeed 1-bit style: every rank encodes its tensor (worker residual
//! `res`) and sends chunk c to rank c; rank c decodes the p versions in rank
//! order, sums, re-encodes with its server residual `res2` (n floats, only
//! chunk c used) and the encoded chunks are allgathered around the ring.
template <class Codec, class T, class Ex>
void two_phase_allreduce(T& t, const Codec& codec, Ex& ex, float* data, std::size_t n, float* res, float* res2,
                         coll_ctx& ctx, arenas& ar) {
  const int p = t.size(), r = t.rank();
  if (p == 1 || n == 0) return;
  const auto L = make_layout(codec, n, p, ctx.seg_elems);
  const std::size_t area = area_bytes(L);
  const chunk& mine = L[static_cast<std::size_t>(r)];
  std::byte* out = arenas::get(ar.a, area);
  std::byte* in = arenas::get(ar.b, mine.bytes * static_cast<std::size_t>(p));
  std::byte* ag = arenas::get(ar.c, area);
  std::byte* ws = arenas::get(ar.ws, codec.workspace_bytes(ctx.seg_elems) + 8);
  const auto& ch = [&](int c) -> const chunk& { return L[static_cast<std::size_t>(c)]; };
  const int left = mod(r - 1, p), right = mod(r + 1, p);
  request_set<T> rq(t, ctx);
  std::vector<std::size_t> a2a_ids(static_cast<std::size_t>(p) * mine.segs.size());
  for (int o = 0; o < p; ++o)
    if (o != r)
      for (std::size_t i = 0; i < mine.segs.size(); ++i)
        a2a_ids[static_cast<std::size_t>(o) * mine.segs.size() + i] =
            rq.recv(o, comm::make_tag(ctx.seq, 0), in + mine.bytes * static_cast<std::size_t>(o) + mine.segs[i].off,
                    mine.segs[i].bytes);
  ring_allgather<T> gather{rq, L, ag, ctx.seq, p, mod(r - 1, p), left, right};
  gather.post();
  float* no_res = nullptr;
  // Phase 1: compressed all-to-all (my chunk last, so the others start early).
  for (int k = 1; k <= p; ++k) {
    const int c = mod(r + k, p);
    for (const auto& sg : ch(c).segs) {
      codec.encode(ex, data + sg.begin, res ? res + sg.begin : no_res, out + ch(c).area_off + sg.off, sg.len,
                   seg_ctx(ctx, 2, sg.begin, ws));
      ex.wait();
      if (c != r) rq.send(c, comm::make_tag(ctx.seq, 0), out + ch(c).area_off + sg.off, sg.bytes);
    }
  }
  // Sum the p versions of my chunk in rank order, re-encode (server residual).
  for (std::size_t i = 0; i < mine.segs.size(); ++i) {
    const segment& sg = mine.segs[i];
    for (int o = 0; o < p; ++o) {
      const std::byte* src =
          o == r ? out + mine.area_off + sg.off : in + mine.bytes * static_cast<std::size_t>(o) + sg.off;
      if (o != r) rq.wait_recv(a2a_ids[static_cast<std::size_t>(o) * mine.segs.size() + i]);
      if (o == 0)
        codec.decode(ex, src, data + sg.begin, sg.len);
      else
        codec.decode_add(ex, src, data + sg.begin, sg.len);
    }
    std::byte* e = ag + mine.area_off + sg.off;
    codec.encode(ex, data + sg.begin, res2 ? res2 + sg.begin : no_res, e, sg.len, seg_ctx(ctx, 3, sg.begin, ws));
    codec.decode(ex, e, data + sg.begin, sg.len);
    ex.wait();
    rq.send(right, gather.tag(0), e, sg.bytes);
  }
  // Phase 2: ring allgather of the re-encoded chunks.
  gather.finish(codec, ex, data);
  ex.wait();
  rq.wait_sends();
}

}  // namespace compress::detail
EBBFLOW_END_NAMESPACE
