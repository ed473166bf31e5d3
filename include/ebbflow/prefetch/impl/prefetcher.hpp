// SPDX-License-Identifier: Apache-2.0
//! @file impl/prefetcher.hpp
//! Definitions for prefetch/prefetcher.hpp. The shared state lives in
//! `detail::prefetch_state`, owned jointly by the prefetcher and the batches
//! it handed out, so a batch released after the prefetcher is gone is safe.
#pragma once

#include <ebbflow/prefetch/prefetcher.hpp>
#include <ebbflow/core/log.hpp>
#include <ebbflow/core/thread_name.hpp>

#include <algorithm>
#include <atomic>
#include <concepts>
#include <condition_variable>
#include <mutex>
#include <sstream>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace prefetch {

inline std::string load_error::describe(std::uint64_t step, std::size_t sample, const std::exception_ptr& cause) {
  std::ostringstream os;
  os << "step " << step;
  if (sample != no_sample) os << ", sample " << sample;
  os << ": ";
  try {
    if (cause) std::rethrow_exception(cause);
    os << "unknown error";
  } catch (const std::exception& e) {
    os << e.what();
  } catch (...) {
    os << "non-standard exception";
  }
  return os.str();
}

namespace detail {

// Which of the documented `load` signatures `Load` has.
enum class load_kind { none, sample, sample_stop, chunk };
template <class Load>
constexpr load_kind kind_of() {
  if constexpr (std::invocable<Load&, std::size_t, std::span<std::byte>, std::stop_token>)
    return load_kind::sample_stop;
  else if constexpr (std::invocable<Load&, std::size_t, std::span<std::byte>>)
    return load_kind::sample;
  else if constexpr (std::invocable<Load&, std::span<const std::size_t>, std::span<std::byte>>)
    return load_kind::chunk;
  else
    return load_kind::none;
}

template <class Stage>
host_allocator preferred_allocator(const std::optional<host_allocator>& given) {
  if (given) return *given;
  if constexpr (requires {
                  { Stage::preferred_allocator() } -> std::convertible_to<host_allocator>;
                })
    return Stage::preferred_allocator();
  else
    return mlock_allocator();
}

template <class Source, class Load, class Stage>
class prefetch_state : public std::enable_shared_from_this<prefetch_state<Source, Load, Stage>> {
 public:
  using stage_type = Stage;
  using batch = basic_batch<prefetch_state>;
  static constexpr load_kind kind = kind_of<Load>();
  static_assert(kind != load_kind::none,
                "prefetcher: Load must be callable as load(std::size_t, std::span<std::byte>[, std::stop_token]) "
                "or load(std::span<const std::size_t>, std::span<std::byte>)");

  prefetch_state(Source source, Load load, Stage stage, prefetch_options opt)
      : source_(std::move(source)),
        load_(std::move(load)),
        stage_(std::move(stage)),
        opt_(checked(opt)),
        devices_(stage_.devices()),
        pool_(opt_.pool_bytes, preferred_allocator<Stage>(opt_.allocator)),
        slots_(opt_.depth),
        t0_(steady_clock::now()) {
    stage_.prepare(opt_.depth, opt_.max_device_samples * opt_.sample_bytes);
    for (auto& s : slots_) {
      s.plan.indices.reserve(opt_.max_batch_samples);
      s.plan.split.reserve(devices_);
      s.offsets.reserve(devices_ + 1);
    }
    // Space freed in the pool may unblock a loader waiting to stage a step.
    pool_.on_release(
        [](void* self) noexcept {
          auto* st = static_cast<prefetch_state*>(self);
          { std::lock_guard lk(st->m_); }  // orders the wake-up after a waiter's check
          st->cv_work_.notify_all();
        },
        this);
  }

  ~prefetch_state() { join(); }

  void start() {
    std::lock_guard jl(join_m_);
    try {
      for (unsigned i = 0; i < opt_.loaders; ++i) {
        threads_.emplace_back([this] { guarded([this] { loader_loop(); }); });
        ::ebbflow::detail::name_thread(threads_.back(), "ebbflow-load" + std::to_string(i));
      }
      threads_.emplace_back([this] { guarded([this] { copy_loop(); }); });
      ::ebbflow::detail::name_thread(threads_.back(), "ebbflow-copy");
    } catch (...) {
      shutdown();
      throw;  // the destructor joins what started
    }
  }

  // ---------------------------------------------------------------- consumer
  batch next(deadline until) {
    std::unique_lock lk(m_);
    const auto t0 = steady_clock::now();
    const bool ok =
        cv_ready_.wait_until(lk, until.at(), [&] { return stopped_ || at_end_locked() || head_ready_locked(); });
    stall_ns_.fetch_add(static_cast<std::uint64_t>((steady_clock::now() - t0).count()), std::memory_order_relaxed);
    if (!ok)
      EBBFLOW_THROW((system_error(make_error_code(error::timeout),
                                  {.operation = "prefetch::next", .detail = "step " + std::to_string(consume_step_)})));
    if (stopped_ || at_end_locked()) return {};
    const std::uint64_t s = consume_step_++;
    const std::size_t idx = index(s);
    slot_t& sl = slots_[idx];
    if (sl.error) {
      load_error e(s, sl.error_sample, std::exchange(sl.error, nullptr));
      sl.ph = phase::free;
      lk.unlock();
      cv_work_.notify_all();
      EBBFLOW_THROW(e);
    }
    sl.ph = phase::held;
    delivered_.fetch_add(1, std::memory_order_relaxed);
    return batch(this->shared_from_this(), idx, s);
  }

  void give_back(std::size_t idx) noexcept {
    try {
      stage_.consumed(idx);
    } catch (const std::exception& e) {
      EBBFLOW_LOG_ERROR("prefetch: stage consumed() failed: " << e.what());
    }
    {
      std::lock_guard lk(m_);
      slots_[idx].ph = phase::free;
    }
    cv_work_.notify_all();
  }

  void shutdown() noexcept {
    {
      std::lock_guard lk(m_);
      stopped_ = true;
    }
    stop_.request_stop();
    cv_work_.notify_all();
    cv_copy_.notify_all();
    cv_ready_.notify_all();
  }

  bool close(deadline until) {
    shutdown();
    std::lock_guard jl(join_m_);
    {
      std::unique_lock lk(m_);
      if (!cv_exit_.wait_until(lk, until.at(), [&] { return exited_ == threads_.size(); })) return false;
    }
    for (auto& t : threads_)
      if (t.joinable()) t.join();
    return true;
  }

  void join() noexcept {
    shutdown();
    std::lock_guard jl(join_m_);
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }

  prefetch_stats stats() const {
    prefetch_stats r;
    {
      std::lock_guard lk(m_);
      for (const auto& s : slots_) {
        if (s.ph != phase::free) ++r.in_flight;
        if (s.ph == phase::ready && s.step >= consume_step_ && s.step < end_step_) ++r.queue_depth;
      }
      r.steps_planned = plan_step_;
    }
    r.steps_delivered = delivered_.load(std::memory_order_relaxed);
    r.consumer_stall_s = 1e-9 * static_cast<double>(stall_ns_.load(std::memory_order_relaxed));
    r.samples_loaded = samples_.load(std::memory_order_relaxed);
    r.bytes_loaded = bytes_.load(std::memory_order_relaxed);
    r.loader_busy_s = 1e-9 * static_cast<double>(busy_ns_.load(std::memory_order_relaxed));
    const double wall = std::chrono::duration<double>(steady_clock::now() - t0_).count();
    r.loader_bytes_per_s = wall > 0 ? static_cast<double>(r.bytes_loaded) / wall : 0.0;
    r.load_errors = errors_.load(std::memory_order_relaxed);
    r.pool = pool_.stats();
    if constexpr (requires(const Stage& s) {
                    { s.bytes() } -> std::convertible_to<std::size_t>;
                  })
      r.stage_bytes = stage_.bytes();
    return r;
  }

  const prefetch_options& options() const noexcept { return opt_; }

  // ---------------------------------------------------------------- batch access (slot is held)
  std::span<const std::size_t> indices(std::size_t idx) const noexcept { return slots_[idx].plan.indices; }
  std::span<const std::size_t> sizes(std::size_t idx) const noexcept { return slots_[idx].plan.split; }
  std::span<const std::size_t> indices(std::size_t idx, std::size_t d) const noexcept {
    const auto& s = slots_[idx];
    return std::span<const std::size_t>(s.plan.indices).subspan(s.offsets[d], s.plan.split[d]);
  }
  mspan<std::byte, Stage::space> data(std::size_t idx, std::size_t d) const noexcept {
    return {stage_.buffer(idx, d), slots_[idx].plan.split[d] * opt_.sample_bytes};
  }
  typename Stage::event_type stage_event(std::size_t idx, std::size_t d) { return stage_.event(idx, d); }

 private:
  enum class phase : unsigned char { free, staging, loading, loaded, copying, ready, held };
  struct slot_t {
    phase ph = phase::free;
    std::uint64_t step = UINT64_MAX;
    step_plan plan;
    std::vector<std::size_t> offsets;  // device d's first position; offsets[devices] = n
    pinned_lease staging;
    std::size_t next_pos = 0, done = 0;
    std::exception_ptr error;
    std::size_t error_pos = SIZE_MAX, error_sample = load_error::no_sample;
  };

  static prefetch_options checked(prefetch_options o) {
    EBBFLOW_ENFORCE(o.sample_bytes > 0, "prefetcher: sample_bytes must be positive");
    EBBFLOW_ENFORCE(o.max_batch_samples > 0, "prefetcher: max_batch_samples must be positive");
    EBBFLOW_ENFORCE(o.depth >= 1, "prefetcher: depth must be at least 1");
    EBBFLOW_ENFORCE(o.loaders >= 1, "prefetcher: need at least one loader thread");
    if (o.max_device_samples == 0 || o.max_device_samples > o.max_batch_samples)
      o.max_device_samples = o.max_batch_samples;
    const std::size_t batch_bytes = o.max_batch_samples * o.sample_bytes;
    if (o.pool_bytes == 0)
      o.pool_bytes =
          o.depth * ((batch_bytes + pinned_pool::alignment - 1) / pinned_pool::alignment * pinned_pool::alignment);
    EBBFLOW_ENFORCE(o.pool_bytes >= batch_bytes,
                    "prefetcher: pool_bytes "
                        << o.pool_bytes
                        << " cannot hold one batch of max_batch_samples * sample_bytes = " << batch_bytes);
    return o;
  }

  std::size_t index(std::uint64_t step) const noexcept { return static_cast<std::size_t>(step % opt_.depth); }
  bool at_end_locked() const noexcept { return consume_step_ >= end_step_; }
  bool head_ready_locked() const noexcept {
    const slot_t& s = slots_[index(consume_step_)];
    return s.step == consume_step_ && s.ph == phase::ready;
  }

  template <class F>
  void guarded(F f) noexcept {
    try {
      f();
    } catch (const std::exception& e) {
      EBBFLOW_LOG_ERROR("prefetch: internal thread failed, shutting down: " << e.what());
      shutdown();
    } catch (...) {
      shutdown();
    }
    {
      std::lock_guard lk(m_);
      ++exited_;
    }
    cv_exit_.notify_all();
  }

  void fail_locked(slot_t& sl, std::uint64_t step, std::size_t pos, std::size_t sample, std::exception_ptr e) {
    if (!sl.error) errors_.fetch_add(1, std::memory_order_relaxed);
    if (!sl.error || pos < sl.error_pos) {
      sl.error = std::move(e);
      sl.error_pos = pos;
      sl.error_sample = sample;
    }
    if (opt_.on_error == error_policy::stop) end_step_ = std::min(end_step_, step + 1);
  }

  void complete_if_done_locked(slot_t& sl) {
    if (sl.ph == phase::loading && sl.done == sl.plan.indices.size()) {
      sl.ph = phase::loaded;
      cv_copy_.notify_one();
    }
  }

  struct task {
    std::size_t idx;
    std::uint64_t step;
    std::size_t begin, end;
  };

  // The oldest loading step with unassigned positions; positions of failed
  // or discarded steps are retired here without calling load.
  std::optional<task> take_task_locked() {
    for (std::uint64_t s = copy_step_; s < plan_step_; ++s) {
      const std::size_t idx = index(s);
      slot_t& sl = slots_[idx];
      if (sl.step != s || sl.ph != phase::loading) continue;
      const std::size_t n = sl.plan.indices.size();
      if (sl.next_pos >= n) continue;
      if (sl.error || s >= end_step_) {
        sl.done += n - sl.next_pos;
        sl.next_pos = n;
        complete_if_done_locked(sl);
        continue;
      }
      const std::size_t chunk =
          opt_.chunk_samples ? opt_.chunk_samples : std::max<std::size_t>(1, n / (4 * std::size_t{opt_.loaders}));
      const std::size_t b = sl.next_pos, e = std::min(n, b + chunk);
      sl.next_pos = e;
      return task{idx, s, b, e};
    }
    return std::nullopt;
  }

  void run_task_and_finish(std::unique_lock<std::mutex>& lk, const task& t) {
    slot_t& sl = slots_[t.idx];
    const std::size_t sb = opt_.sample_bytes;
    const std::span<std::byte> dst = sl.staging.bytes();
    const std::span<const std::size_t> ind = sl.plan.indices;
    std::size_t ok = 0, fail_pos = SIZE_MAX;
    std::exception_ptr err;
    lk.unlock();
    const auto t0 = steady_clock::now();
    if constexpr (kind == load_kind::chunk) {
      try {
        load_(ind.subspan(t.begin, t.end - t.begin), dst.subspan(t.begin * sb, (t.end - t.begin) * sb));
        ok = t.end - t.begin;
      } catch (...) {
        err = std::current_exception();
        fail_pos = t.begin;
      }
    } else {
      const std::stop_token tok = stop_.get_token();
      for (std::size_t i = t.begin; i < t.end && !tok.stop_requested(); ++i) {
        try {
          if constexpr (kind == load_kind::sample_stop)
            load_(ind[i], dst.subspan(i * sb, sb), tok);
          else
            load_(ind[i], dst.subspan(i * sb, sb));
          ++ok;
        } catch (...) {
          err = std::current_exception();
          fail_pos = i;
          break;
        }
      }
    }
    busy_ns_.fetch_add(static_cast<std::uint64_t>((steady_clock::now() - t0).count()), std::memory_order_relaxed);
    samples_.fetch_add(ok, std::memory_order_relaxed);
    bytes_.fetch_add(ok * sb, std::memory_order_relaxed);
    lk.lock();
    // Positions not loaded because of an error or a stop count as done: the
    // step is reported as failed, or the prefetcher is shutting down.
    sl.done += t.end - t.begin;
    if (err) fail_locked(sl, t.step, fail_pos, ind[fail_pos], std::move(err));
    complete_if_done_locked(sl);
    if (err) cv_ready_.notify_all();
  }

  bool can_plan_locked() const noexcept {
    return !planning_ && !staging_wait_ && plan_step_ < end_step_ && slots_[index(plan_step_)].ph == phase::free;
  }

  void plan_next(std::unique_lock<std::mutex>& lk) {
    const std::uint64_t s = plan_step_;
    slot_t& sl = slots_[index(s)];
    planning_ = true;
    lk.unlock();
    bool more = false;
    std::exception_ptr err;
    try {
      more = static_cast<bool>(source_.plan(s, sl.plan));
      if (more) validate(sl.plan);
    } catch (...) {
      err = std::current_exception();
    }
    lk.lock();
    planning_ = false;
    if (!err && !more) {
      end_step_ = std::min(end_step_, s);
      cv_ready_.notify_all();
      return;
    }
    sl.step = s;
    sl.next_pos = sl.done = 0;
    sl.error = nullptr;
    sl.error_pos = SIZE_MAX;
    sl.error_sample = load_error::no_sample;
    ++plan_step_;
    if (err) {
      // A broken source cannot be continued past: always stop after this step.
      errors_.fetch_add(1, std::memory_order_relaxed);
      sl.error = std::move(err);
      end_step_ = std::min(end_step_, s + 1);
      sl.ph = phase::loaded;
      sl.plan.indices.clear();
      sl.plan.split.clear();
      cv_copy_.notify_one();
      return;
    }
    sl.offsets.assign(1, 0);
    for (std::size_t d = 0; d < devices_; ++d) sl.offsets.push_back(sl.offsets.back() + sl.plan.split[d]);
    sl.ph = phase::staging;
    staging_wait_ = true;
    try_stage_locked();
  }

  void validate(const step_plan& p) const {
    const std::size_t n = p.indices.size();
    EBBFLOW_ENFORCE(p.split.size() == devices_,
                    "prefetch: the plan splits over " << p.split.size() << " devices, the stage has " << devices_);
    std::size_t sum = 0;
    for (std::size_t d = 0; d < devices_; ++d) {
      EBBFLOW_ENFORCE(p.split[d] <= opt_.max_device_samples, "prefetch: device " << d << " gets " << p.split[d]
                                                                                 << " samples > max_device_samples "
                                                                                 << opt_.max_device_samples);
      sum += p.split[d];
    }
    EBBFLOW_ENFORCE(sum == n, "prefetch: split sums to " << sum << " but the batch has " << n << " samples");
    EBBFLOW_ENFORCE(n <= opt_.max_batch_samples,
                    "prefetch: batch of " << n << " samples > max_batch_samples " << opt_.max_batch_samples);
  }

  // Leases staging bytes for the last planned step, when the pool has room.
  bool try_stage_locked() {
    slot_t& sl = slots_[index(plan_step_ - 1)];
    auto lease = pool_.try_acquire(sl.plan.indices.size() * opt_.sample_bytes);
    if (!lease) return false;
    sl.staging = std::move(*lease);
    staging_wait_ = false;
    sl.ph = phase::loading;
    complete_if_done_locked(sl);  // an empty batch is complete at once
    cv_work_.notify_all();
    return true;
  }

  void loader_loop() {
    std::unique_lock lk(m_);
    while (!stopped_) {
      if (auto t = take_task_locked()) {
        run_task_and_finish(lk, *t);
        continue;
      }
      if (staging_wait_) {
        if (try_stage_locked()) continue;
      } else if (can_plan_locked()) {
        plan_next(lk);
        continue;
      }
      cv_work_.wait(lk);
    }
  }

  void copy_loop() {
    std::unique_lock lk(m_);
    for (;;) {
      cv_copy_.wait(lk, [&] {
        if (stopped_) return true;
        const slot_t& s = slots_[index(copy_step_)];
        return copy_step_ < plan_step_ && s.step == copy_step_ && s.ph == phase::loaded;
      });
      if (stopped_) return;
      const std::uint64_t s = copy_step_;
      const std::size_t idx = index(s);
      slot_t& sl = slots_[idx];
      const bool skip = sl.error || s >= end_step_;
      sl.ph = phase::copying;
      lk.unlock();
      std::exception_ptr err;
      if (!skip) {
        try {
          const std::span<const std::byte> src = sl.staging.bytes();
          const std::size_t sb = opt_.sample_bytes;
          for (std::size_t d = 0; d < devices_; ++d)
            stage_.copy(idx, d, src.subspan(sl.offsets[d] * sb, sl.plan.split[d] * sb));
          stage_.finish(idx);
        } catch (...) {
          err = std::current_exception();
        }
      }
      sl.staging.reset();  // outside m_: the pool's release hook takes m_
      lk.lock();
      if (err) fail_locked(sl, s, SIZE_MAX, load_error::no_sample, std::move(err));
      sl.ph = phase::ready;
      ++copy_step_;
      cv_ready_.notify_all();
      cv_work_.notify_all();  // a loader may be waiting to plan into a slot only the copy frees
    }
  }

  // Members are declared in acquisition order; the pool's release hook uses
  // m_ and cv_work_, so they are declared before the slots whose leases it sees.
  Source source_;
  Load load_;
  Stage stage_;
  prefetch_options opt_;
  std::size_t devices_;
  pinned_pool pool_;
  mutable std::mutex m_;
  std::condition_variable cv_work_, cv_copy_, cv_ready_, cv_exit_;
  std::vector<slot_t> slots_;
  std::uint64_t plan_step_ = 0, copy_step_ = 0, consume_step_ = 0, end_step_ = UINT64_MAX;
  bool planning_ = false, staging_wait_ = false, stopped_ = false;
  std::stop_source stop_;
  std::atomic<std::uint64_t> delivered_{0}, samples_{0}, bytes_{0}, busy_ns_{0}, stall_ns_{0}, errors_{0};
  steady_clock::time_point t0_;
  std::mutex join_m_;
  std::size_t exited_ = 0;
  std::vector<std::thread> threads_;
};

}  // namespace detail

// ---------------------------------------------------------------- basic_batch
template <class State>
std::span<const std::size_t> basic_batch<State>::indices() const noexcept {
  return state_ ? state_->indices(slot_) : std::span<const std::size_t>{};
}
template <class State>
std::span<const std::size_t> basic_batch<State>::sizes() const noexcept {
  return state_ ? state_->sizes(slot_) : std::span<const std::size_t>{};
}
template <class State>
void basic_batch<State>::check_device(const char* what, std::size_t d) const {
  EBBFLOW_ENFORCE(
      state_ != nullptr,
      "prefetch batch: " << what << "(" << d << ") on an empty batch (end of data or shutdown, or released)");
  EBBFLOW_ENFORCE(d < devices(), "prefetch batch: " << what << "(" << d << "): device " << d
                                                    << " out of range (devices() = " << devices() << ")");
}
template <class State>
std::span<const std::size_t> basic_batch<State>::indices(std::size_t d) const {
  check_device("indices", d);
  return state_->indices(slot_, d);
}
template <class State>
auto basic_batch<State>::data(std::size_t d) const -> mspan<std::byte, space> {
  check_device("data", d);
  return state_->data(slot_, d);
}
template <class State>
auto basic_batch<State>::event(std::size_t d) const -> event_type {
  check_device("event", d);
  return state_->stage_event(slot_, d);
}
template <class State>
void basic_batch<State>::release() noexcept {
  if (state_) std::exchange(state_, nullptr)->give_back(slot_);
}

// ---------------------------------------------------------------- prefetcher
template <index_source Source, class Load, device_stage Stage>
prefetcher<Source, Load, Stage>::prefetcher(Source source, Load load, Stage stage, prefetch_options opt)
    : state_(std::make_shared<state_type>(std::move(source), std::move(load), std::move(stage), std::move(opt))) {
  state_->start();
}
template <index_source Source, class Load, device_stage Stage>
prefetcher<Source, Load, Stage>::~prefetcher() {
  if (state_) state_->join();
}
template <index_source Source, class Load, device_stage Stage>
auto prefetcher<Source, Load, Stage>::next(deadline until) -> batch {
  return state_->next(until);
}
template <index_source Source, class Load, device_stage Stage>
void prefetcher<Source, Load, Stage>::shutdown() noexcept {
  state_->shutdown();
}
template <index_source Source, class Load, device_stage Stage>
bool prefetcher<Source, Load, Stage>::close(deadline until) {
  return state_->close(until);
}
template <index_source Source, class Load, device_stage Stage>
prefetch_stats prefetcher<Source, Load, Stage>::stats() const {
  return state_->stats();
}
template <index_source Source, class Load, device_stage Stage>
const prefetch_options& prefetcher<Source, Load, Stage>::options() const noexcept {
  return state_->options();
}

}  // namespace prefetch
EBBFLOW_END_NAMESPACE
