// SPDX-License-Identifier: Apache-2.0
//! @file impl/compressed_allreduce.hpp
//! Definitions of compressed_allreduce (included by the public header).
#pragma once

#include <ebbflow/compress/compressed_allreduce.hpp>

EBBFLOW_BEGIN_NAMESPACE
namespace compress {

template <class Codec, comm::transport Transport, exec::executor Executor>
compressed_allreduce<Codec, Transport, Executor>::compressed_allreduce(communicator_type& comm, Codec c, Executor ex,
                                                                       allreduce_options opts)
    : comm_(&comm), codec_(std::move(c)), exec_(std::move(ex)), opts_(opts) {
  EBBFLOW_ENFORCE(opts_.segment_bytes >= 4 * kernels::block_size,
                  "segment_bytes " << opts_.segment_bytes << " below one block (" << 4 * kernels::block_size << ")");
}

template <class Codec, comm::transport Transport, exec::executor Executor>
auto compressed_allreduce<Codec, Transport, Executor>::state_for(std::size_t key, std::size_t n, matrix_shape shape)
    -> tensor_state& {
  auto& st = state_[key];
  // A new tensor, another matrix shape of it (PowerSGD's Q would not fit),
  // or the group changed: start afresh.
  if (st.n != n || st.ranks != comm_->size() || st.shape.rows != shape.rows || st.shape.cols != shape.cols) {
    st = tensor_state{};
    st.n = n;
    st.ranks = comm_->size();
    st.shape = shape;
  }
  return st;
}

template <class Codec, comm::transport Transport, exec::executor Executor>
void compressed_allreduce<Codec, Transport, Executor>::run(std::span<float> grad, std::size_t key) {
  run_impl(grad, key, Codec::kind == codec_kind::low_rank ? powersgd_codec::shape_for(grad.size()) : matrix_shape{});
}

template <class Codec, comm::transport Transport, exec::executor Executor>
void compressed_allreduce<Codec, Transport, Executor>::run(std::span<float> grad, std::size_t key, matrix_shape shape) {
  EBBFLOW_ENFORCE(
      Codec::kind != codec_kind::low_rank || shape.size() == grad.size(),
      "matrix shape " << shape.rows << "x" << shape.cols << " does not cover " << grad.size() << " elements");
  run_impl(grad, key, shape);
}

template <class Codec, comm::transport Transport, exec::executor Executor>
void compressed_allreduce<Codec, Transport, Executor>::run(std::span<float> grad, std::size_t key,
                                                           std::error_code& ec) noexcept {
  ec.clear();
  try {
    run(grad, key);
  } catch (const std::system_error& e) {
    ec = e.code();
  } catch (const std::bad_alloc&) {
    ec = std::make_error_code(std::errc::not_enough_memory);
  } catch (...) {
    ec = make_error_code(error::invalid_state);
  }
}

template <class Codec, comm::transport Transport, exec::executor Executor>
void compressed_allreduce<Codec, Transport, Executor>::run_impl(std::span<float> grad, std::size_t key,
                                                                matrix_shape shape) {
  const std::size_t n = grad.size();
  const std::uint64_t call = call_++;
  ++stats_.calls;
  const deadline dl = deadline::after(opts_.timeout);
  if (comm_->size() == 1 || n == 0) return;
  if (n * sizeof(float) < opts_.dense_threshold_bytes) {
    ++stats_.dense_calls;
    dense(grad, dl);
    return;
  }
  tensor_state& st = state_for(key, n, shape);
  float* res = nullptr;
  if (opts_.error_feedback || Codec::kind == codec_kind::sign) {  // sign codes are useless without it
    if (st.res.empty()) st.res.assign(n, 0.0f);
    res = st.res.data();
  }
  if constexpr (Codec::kind == codec_kind::low_rank) {
    run_low_rank(grad, st, shape, dl);
  } else {
    Transport& t = comm_->transport();
    detail::coll_ctx ctx;
    ctx.seg_elems = segment_elems(n);
    ctx.dl = dl;
    ctx.seed = opts_.seed;
    ctx.stream_base = detail::mix64(detail::mix64(call) ^ detail::mix64(key + 0x1234567) ^
                                    detail::mix64(static_cast<std::uint64_t>(t.rank()) + 1));
    ctx.seq = comm_->next_sequence();
    if constexpr (Codec::kind == codec_kind::linear) {
      detail::ring_allreduce(t, codec_, exec_, grad.data(), n, res, ctx, arenas_);
    } else if constexpr (Codec::kind == codec_kind::sparse) {
      detail::sparse_allreduce(t, codec_, exec_, grad.data(), n, res, ctx, arenas_);
    } else {
      if (st.res2.empty()) st.res2.assign(n, 0.0f);
      detail::two_phase_allreduce(t, codec_, exec_, grad.data(), n, res, st.res2.data(), ctx, arenas_);
    }
    stats_.wire_bytes_sent += ctx.wire_sent;
    stats_.saturated += ctx.saturated;
  }
}

template <class Codec, comm::transport Transport, exec::executor Executor>
void compressed_allreduce<Codec, Transport, Executor>::dense(std::span<float> x, deadline d) {
  stats_.wire_bytes_sent += comm_->allreduce_bytes_sent(x.size(), dtype::f32);
  comm_->allreduce(view(x), reduce_op::sum, d);
}

template <class Codec, comm::transport Transport, exec::executor Executor>
void compressed_allreduce<Codec, Transport, Executor>::run_low_rank(std::span<float> grad, tensor_state& st,
                                                                    matrix_shape shape, deadline d) {
  if constexpr (Codec::kind == codec_kind::low_rank) {
    const std::size_t main = shape.size(), r = codec_.rank_for(shape);
    float* m = grad.data();
    if (main > 0 && r > 0) {
      if (opts_.error_feedback)  // M = grad + residual, in place
        exec_.bulk(main, kernels::add_into{m, st.res.data(), m});
      if (st.q.empty()) {
        st.q.resize(shape.cols * r);
        codec_.init_q(exec_, st.q.data(), shape, opts_.seed);
      }
      st.p.resize(shape.rows * r);
      st.q_local.resize(shape.cols * r);
      // The factors are directions: powers of two keep their entries near 1,
      // so that neither P = M Q (Q, the last sum, has M's magnitude) nor the
      // orthogonalisation (squares) leaves float's range or falls below its
      // eps at the gradient's magnitude. Q and the summed P are the same on
      // every rank, so are their scales.
      codec_.normalize(exec_, st.q.data(), shape.cols, shape);
      codec_.compute_p(exec_, m, st.q.data(), st.p.data(), shape);
      exec_.wait();
      dense(st.p, d);
      codec_.normalize(exec_, st.p.data(), shape.rows, shape);
      codec_.orthogonalize(exec_, st.p.data(), shape);
      codec_.compute_q(exec_, m, st.p.data(), st.q_local.data(), shape);
      if (opts_.error_feedback) codec_.residual(exec_, m, st.p.data(), st.q_local.data(), st.res.data(), shape);
      exec_.wait();
      st.q = st.q_local;
      dense(st.q, d);
      codec_.reconstruct(exec_, st.p.data(), st.q.data(), m, shape);  // warm start: keep the summed Q
      codec_.refresh_q(exec_, st.q.data(), shape, opts_.seed);        // ... with its dropped columns refilled
      exec_.wait();
    }
    if (main < grad.size()) dense(grad.subspan(main), d);
  } else {
    (void)grad, (void)st, (void)shape, (void)d;
  }
}

template <class Codec, comm::transport Transport, exec::executor Executor>
std::size_t compressed_allreduce<Codec, Transport, Executor>::segment_elems(std::size_t n) const noexcept {
  std::size_t per = opts_.segment_bytes / 4;  // raw floats
  if constexpr (Codec::kind != codec_kind::low_rank) {
    const std::size_t probe = std::max<std::size_t>(n, 1 << 16);
    const double bytes_per_elem = static_cast<double>(codec_.max_encoded_bytes(probe)) / static_cast<double>(probe);
    if (bytes_per_elem > 0) per = static_cast<std::size_t>(static_cast<double>(opts_.segment_bytes) / bytes_per_elem);
    // ... but at most 4x the raw-float segment, so that encoding still
    // overlaps the transfer for very sparse codes (top-k: ~0.08 B/element).
    // Sparse codes get 16x: each top-k encode draws a fixed-size threshold
    // sample (16384 random reads by default, ~0.3 ms from DRAM), which at 1 M
    // elements per segment cost as much as the selection pass itself;
    // measured on 4 ranks x 8 M elements at 1 Gbit/s, p50 of the top-k
    // allreduce: 39 ms at 1 M elements per segment, 35 at 2 M, 22-24 at 4 M,
    // 25 at 8 M (one segment: no encode/transfer overlap left).
    per = std::min(per, Codec::kind == codec_kind::sparse ? 4 * opts_.segment_bytes : opts_.segment_bytes);
  }
  return std::max<std::size_t>(per, kernels::block_size);
}

template <class Codec, comm::transport Transport, exec::executor Executor>
std::size_t compressed_allreduce<Codec, Transport, Executor>::wire_bytes(std::size_t n) const {
  const auto p = static_cast<std::size_t>(comm_->size());
  if (p <= 1 || n == 0) return 0;
  const auto rk = static_cast<std::size_t>(comm_->rank());
  if constexpr (Codec::kind == codec_kind::low_rank) {
    const matrix_shape s = powersgd_codec::shape_for(n);
    const std::size_t r = codec_.rank_for(s);
    const auto sent = [&](std::size_t count) { return comm_->allreduce_bytes_sent(count, dtype::f32); };
    return (s.size() > 0 && r > 0 ? sent(s.rows * r) + sent(s.cols * r) : 0) + sent(n - s.size());
  } else {
    const std::size_t seg = segment_elems(n);
    if constexpr (Codec::kind == codec_kind::sparse) {
      return (p - 1) * detail::area_bytes(detail::make_layout(codec_, n, 1, seg));
    } else {
      const auto l = detail::make_layout(codec_, n, static_cast<int>(p), seg);
      const std::size_t total = detail::area_bytes(l);
      const auto chunk = [&](std::size_t k) { return l[(rk + k) % p].bytes; };
      // linear: the reduce-scatter sends every chunk but (rank+1)'s, the allgather every chunk but (rank+2)'s;
      // sign: the all-to-all sends every chunk but mine, the allgather every chunk but (rank+1)'s.
      constexpr std::size_t skip = Codec::kind == codec_kind::linear ? 1 : 0;
      return (total - chunk(skip)) + (total - chunk(skip + 1));
    }
  }
}

}  // namespace compress
EBBFLOW_END_NAMESPACE
