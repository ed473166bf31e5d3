// SPDX-License-Identifier: Apache-2.0
//! @file bucket.hpp
//! Tensor fusion: packs many small gradient tensors into a few flat buckets
//! (Horovod tensor fusion, PyTorch DDP buckets) so that each bucket is one
//! compressed allreduce, large enough to compress well and to amortise the
//! per-collective latency.
//!
//! Tensors are assigned in registration order (for DDP: reverse order of the
//! backward pass, so the first bucket fills first) and a bucket closes when
//! adding the next tensor would exceed `bucket_bytes`; a tensor larger than
//! the cap gets a bucket of its own. `mark_ready(t)` reports the bucket that
//! became complete, so a caller can start its allreduce while backward still
//! runs. Host memory. Not thread-safe (one training thread).
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <optional>
#include <span>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace compress {

//! Assigns tensors to fused float buckets (see the file comment) and owns
//! the bucket buffers (host memory). Not thread-safe.
class bucket_manager {
 public:
  //! Where tensor `i` lives inside its bucket.
  struct slot {
    std::size_t bucket = 0, offset = 0, size = 0;
    //! @var bucket
    //! Index of the bucket holding the tensor.
    //! @var offset
    //! First element of the tensor within its bucket.
    //! @var size
    //! Element count of the tensor.
  };

  //! `sizes[i]` = element count of tensor i. @throws std::invalid_argument if bucket_bytes < 4.
  bucket_manager(std::span<const std::size_t> sizes, std::size_t bucket_bytes) {
    EBBFLOW_ENFORCE(bucket_bytes >= sizeof(float), "bucket_bytes " << bucket_bytes << " below one float");
    const std::size_t cap = bucket_bytes / sizeof(float);
    slots_.reserve(sizes.size());
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      if (buckets_.empty() || (fill_ > 0 && fill_ + sizes[i] > cap)) {
        buckets_.push_back({});
        fill_ = 0;
      }
      slots_.push_back({buckets_.size() - 1, fill_, sizes[i]});
      buckets_.back().tensors.push_back(i);
      fill_ += sizes[i];
      buckets_.back().data.resize(fill_);
    }
    pending_.resize(buckets_.size());
    reset_ready();
  }

  //! Number of buckets.
  [[nodiscard]] std::size_t bucket_count() const noexcept { return buckets_.size(); }
  //! Number of registered tensors.
  [[nodiscard]] std::size_t tensor_count() const noexcept { return slots_.size(); }
  //! Where `tensor` lives. @throws std::out_of_range for an unknown tensor.
  [[nodiscard]] const slot& slot_of(std::size_t tensor) const { return slots_.at(tensor); }
  //! Tensors of bucket b, in registration order.
  [[nodiscard]] std::span<const std::size_t> tensors_of(std::size_t b) const { return buckets_.at(b).tensors; }
  //! The fused buffer of bucket b (host memory, owned by the manager).
  [[nodiscard]] std::span<float> bucket(std::size_t b) { return buckets_.at(b).data; }

  //! Copies tensor `t` (host memory, `slot_of(t).size` floats) into its bucket.
  void pack(std::size_t t, std::span<const float> grad) {
    const slot& s = slots_.at(t);
    EBBFLOW_ENFORCE(grad.size() == s.size,
                    "tensor " << t << " has " << grad.size() << " elements, registered " << s.size);
    if (s.size) std::memcpy(buckets_[s.bucket].data.data() + s.offset, grad.data(), s.size * sizeof(float));
  }
  //! Copies tensor `t` back out of its bucket.
  void unpack(std::size_t t, std::span<float> grad) const {
    const slot& s = slots_.at(t);
    EBBFLOW_ENFORCE(grad.size() == s.size,
                    "tensor " << t << " has " << grad.size() << " elements, registered " << s.size);
    if (s.size) std::memcpy(grad.data(), buckets_[s.bucket].data.data() + s.offset, s.size * sizeof(float));
  }
  //! Packs `grad` for tensor t and marks it ready; returns the bucket index
  //! when this completed the bucket (each bucket is returned once per step).
  std::optional<std::size_t> mark_ready(std::size_t t, std::span<const float> grad) {
    pack(t, grad);
    const std::size_t b = slots_[t].bucket;
    EBBFLOW_ENFORCE(pending_[b] > 0, "tensor " << t << " marked ready twice in one step");
    if (--pending_[b] == 0) return b;
    return std::nullopt;
  }
  //! Starts a new step: every bucket waits for all its tensors again.
  void reset_ready() {
    for (std::size_t b = 0; b < buckets_.size(); ++b) pending_[b] = buckets_[b].tensors.size();
  }

  //! Convenience for one step: packs all `grads`, calls `reduce(bucket_span,
  //! bucket_index)` per bucket, unpacks. `grads[i]` is tensor i.
  template <class Reduce>
  void allreduce(std::span<const std::span<float>> grads, Reduce&& reduce) {
    EBBFLOW_ENFORCE(grads.size() == slots_.size(), grads.size()
                                                       << " tensors given, " << slots_.size() << " registered");
    for (std::size_t t = 0; t < grads.size(); ++t) pack(t, grads[t]);
    for (std::size_t b = 0; b < buckets_.size(); ++b) reduce(std::span<float>(buckets_[b].data), b);
    for (std::size_t t = 0; t < grads.size(); ++t) unpack(t, grads[t]);
  }

 private:
  struct bucket_data {
    std::vector<std::size_t> tensors;
    std::vector<float> data;
  };
  std::vector<slot> slots_;
  std::vector<bucket_data> buckets_;
  std::vector<std::size_t> pending_;
  std::size_t fill_ = 0;
};

}  // namespace compress
EBBFLOW_END_NAMESPACE
