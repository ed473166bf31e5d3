// SPDX-License-Identifier: Apache-2.0
//! @file prefetcher.hpp
//! `prefetcher`: loads the next global batches into page-locked host memory on
//! background threads, splits each on the CPU into per-device sub-batches, and
//! copies them to the devices while the current step computes (ScaleDNN's
//! mini-batch pre-loading with CPU-centric batch splitting).
//!
//! Pipeline (threads owned by the prefetcher):
//! ```
//!  index_source.plan(step) -> [loader threads] load(sample, bytes) into a
//!  pinned_pool lease -> [copy thread] stage.copy(slot, device, sub-batch)
//!  -> ready queue -> next() on the consumer's thread -> batch (RAII) -> slot free
//! ```
//! At most `depth` steps are in flight (a ring of `depth` slots); the staging
//! bytes of all of them come from one `pinned_pool` of fixed size; stage
//! buffers are allocated once. Memory never grows after construction.
//!
//! Ordering: `next()` returns steps 0, 1, 2, ... in order, each exactly once;
//! within a step, sample i of the global batch lies at byte
//! `i * sample_bytes` of the concatenated sub-batches, device d holding
//! positions [sum(split[0..d)), sum(split[0..d])) of `indices`.
//!
//! Errors: an exception thrown by `load` (or by the source or the stage) for
//! step s is rethrown by the `next()` call that would have returned step s,
//! as `load_error` (an `ebbflow::system_error`, `errc::load_failed`) naming
//! the step and sample. With `error_policy::stop` the prefetcher then ends
//! (later `next()` return an empty batch); with `error_policy::skip_step` the
//! failed step is skipped and step s+1 follows.
//!
//! Thread safety: `next()` is for one consumer thread at a time; `shutdown()`,
//! `stats()` and releasing batches may happen on any thread. Every blocking
//! call takes a deadline.
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/core/deadline.hpp>
#include <ebbflow/core/error.hpp>
#include <ebbflow/core/memory.hpp>
#include <ebbflow/prefetch/device_stage.hpp>
#include <ebbflow/prefetch/index_source.hpp>
#include <ebbflow/prefetch/pinned_pool.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <stop_token>
#include <string>

EBBFLOW_BEGIN_NAMESPACE
namespace prefetch {

//! What the prefetcher does after a step failed to load.
enum class error_policy {
  stop,       //!< report the failed step, then end (no later step is delivered)
  skip_step,  //!< report the failed step, then continue with the next one
};

//! A step could not be prepared: a run-time condition, so an
//! `ebbflow::system_error` whose `code()` is `errc::load_failed`. `step()` is
//! the step, `sample()` the global sample index whose load failed
//! (`no_sample` when the failure was not in a sample's load, e.g. the source
//! or the device copy), `cause()` the original exception. `what()` reads
//! "prefetch: data load failed (step 3, sample 17: <cause>)".
class load_error : public system_error {
 public:
  //! `sample()` when the failure was not in one sample's load.
  static constexpr std::size_t no_sample = std::numeric_limits<std::size_t>::max();
  //! The error of `step`, caused by `cause` while loading `sample` (or `no_sample`).
  load_error(std::uint64_t step, std::size_t sample, std::exception_ptr cause)
      : system_error(make_error_code(error::load_failed),
                     error_context{.operation = "prefetch", .detail = describe(step, sample, cause)}),
        step_(step),
        sample_(sample),
        cause_(std::move(cause)) {}
  [[nodiscard]] std::uint64_t step() const noexcept { return step_; }  //!< the failed step
  //! The global sample index whose load failed, or `no_sample`. With a
  //! chunk-level `load` (one call for several samples) the prefetcher cannot
  //! tell which one failed: the chunk's first sample.
  [[nodiscard]] std::size_t sample() const noexcept { return sample_; }
  //! The original exception.
  [[nodiscard]] std::exception_ptr cause() const noexcept { return cause_; }
  //! Rethrows the original exception.
  [[noreturn]] void rethrow_cause() const { std::rethrow_exception(cause_); }

 private:
  // "step 3, sample 17: <what the cause says>".
  static std::string describe(std::uint64_t step, std::size_t sample, const std::exception_ptr& cause);
  std::uint64_t step_;
  std::size_t sample_;
  std::exception_ptr cause_;
};

//! Construction parameters. `sample_bytes` and `max_batch_samples` are required.
struct prefetch_options {
  std::size_t sample_bytes = 0;                //!< bytes of one sample (fixed)
  std::size_t max_batch_samples = 0;           //!< largest global batch any step may have
  std::size_t max_device_samples = 0;          //!< largest sub-batch of one device; 0: max_batch_samples
  std::size_t depth = 3;                       //!< steps in flight (ring slots), >= 1
  std::size_t pool_bytes = 0;                  //!< pinned staging bound; 0: depth * max_batch_samples * sample_bytes
  unsigned loaders = 2;                        //!< loader threads, >= 1
  std::size_t chunk_samples = 0;               //!< samples per loader task; 0: about batch / (4 * loaders)
  error_policy on_error = error_policy::stop;  //!< what to do after a step failed to load
  //! Staging allocator; empty: the stage's preferred one (cudaHostAlloc for
  //! cuda_stage), else `mlock_allocator()`.
  std::optional<host_allocator> allocator = std::nullopt;
};

//! Counters readable at any time from any thread (`prefetcher::stats()`).
struct prefetch_stats {
  std::uint64_t steps_delivered = 0;  //!< batches returned by next()
  std::uint64_t steps_planned = 0;    //!< steps taken from the index source
  std::size_t queue_depth = 0;        //!< steps ready and not yet taken by next()
  std::size_t in_flight = 0;          //!< slots in use (planned, loading, ready or held)
  double consumer_stall_s = 0;        //!< total time next() waited for a batch
  std::uint64_t samples_loaded = 0;   //!< successful load calls (samples)
  std::uint64_t bytes_loaded = 0;     //!< bytes written by successful loads
  double loader_busy_s = 0;           //!< summed time inside load callbacks
  double loader_bytes_per_s = 0;      //!< bytes_loaded / seconds since construction
  std::uint64_t load_errors = 0;      //!< failed steps
  pool_stats pool = {};               //!< staging pool: bytes in use, peak, capacity, locked
  std::size_t stage_bytes = 0;        //!< stage buffers allocated at construction (0 if unknown)
};

namespace detail {
template <class Source, class Load, class Stage>
class prefetch_state;
}

//! A delivered step. Owns its ring slot until destroyed or `release()`d;
//! move-only. Not thread-safe itself (release it from one thread). The spans
//! stay valid until release. `data(d)` is in `Stage::space` memory: wait on
//! `event(d)` (CUDA: `event(d).wait(stream)`) before using it. On the empty
//! batch `indices()` and `sizes()` are empty and `devices()` is 0, while the
//! per-device accessors `data(d)`, `indices(d)` and `event(d)` throw, as they
//! do for `d >= devices()`.
template <class State>
class basic_batch {
 public:
  using stage_type = typename State::stage_type;            //!< the prefetcher's `Stage`
  using event_type = typename stage_type::event_type;       //!< readiness of one device's data
  static constexpr memory_space space = stage_type::space;  //!< memory space of `data(d)`

  //! The empty batch (false; owns no slot).
  basic_batch() noexcept = default;
  //! Takes over `o`'s slot; `o` becomes empty.
  basic_batch(basic_batch&&) noexcept = default;
  //! Releases this batch's slot, then takes over `o`'s; `o` becomes empty.
  basic_batch& operator=(basic_batch&& o) noexcept {
    if (this != &o) {
      release();
      state_ = std::move(o.state_);
      slot_ = o.slot_;
      step_ = o.step_;
    }
    return *this;
  }
  ~basic_batch() { release(); }

  //! False for the empty batch that marks the end of data or shutdown.
  explicit operator bool() const noexcept { return state_ != nullptr; }
  //! The index source's step number of this batch.
  [[nodiscard]] std::uint64_t step() const noexcept { return step_; }
  //! Global batch sample indices, in order.
  [[nodiscard]] std::span<const std::size_t> indices() const noexcept;
  //! Samples in the global batch.
  [[nodiscard]] std::size_t size() const noexcept { return indices().size(); }
  //! Per-device sub-batch sizes (samples).
  [[nodiscard]] std::span<const std::size_t> sizes() const noexcept;
  //! Number of local devices (sub-batches).
  [[nodiscard]] std::size_t devices() const noexcept { return sizes().size(); }
  //! Sample indices of device `d`'s sub-batch.
  //! @throws std::invalid_argument for the empty batch or `d >= devices()`.
  [[nodiscard]] std::span<const std::size_t> indices(std::size_t d) const;
  //! Device `d`'s sub-batch bytes (`sizes()[d] * sample_bytes`), in `space` memory.
  //! @throws std::invalid_argument for the empty batch or `d >= devices()`.
  [[nodiscard]] mspan<std::byte, space> data(std::size_t d) const;
  //! Readiness of `data(d)`.
  //! @throws std::invalid_argument for the empty batch or `d >= devices()`.
  [[nodiscard]] event_type event(std::size_t d) const;
  //! Gives the slot back to the prefetcher (idempotent, noexcept).
  void release() noexcept;

 private:
  friend State;
  basic_batch(std::shared_ptr<State> s, std::size_t slot, std::uint64_t step) noexcept
      : state_(std::move(s)), slot_(slot), step_(step) {}
  // Throws unless this batch holds a slot and `d` is one of its devices.
  void check_device(const char* what, std::size_t d) const;
  std::shared_ptr<State> state_;
  std::size_t slot_ = 0;
  std::uint64_t step_ = 0;
};

//! The prefetcher. `Source` models `index_source`; `Load` is one of
//! * `void(std::size_t sample, std::span<std::byte> dst)`: fill one sample;
//! * `void(std::size_t sample, std::span<std::byte> dst, std::stop_token)`:
//!   the same, and should return early once the token is stopped (shutdown);
//! * `void(std::span<const std::size_t> samples, std::span<std::byte> dst)`:
//!   fill a chunk of consecutive positions of one step (batch-level loading).
//! `load` runs on the loader threads, concurrently with itself for different
//! samples; `dst` is page-locked host memory when the pool is locked.
//! `Stage` models `device_stage` (`cpu_stage` here, `cuda_stage` for CUDA).
template <index_source Source, class Load, device_stage Stage = cpu_stage>
class prefetcher {
 public:
  //! The shared state behind the threads and batches (implementation detail).
  using state_type = detail::prefetch_state<Source, Load, Stage>;
  //! What `next()` returns.
  using batch = basic_batch<state_type>;

  //! Allocates the staging pool and stage buffers and starts the threads.
  //! @throws std::invalid_argument for bad options; std::bad_alloc.
  prefetcher(Source source, Load load, Stage stage, prefetch_options opt);
  prefetcher(const prefetcher&) = delete;
  prefetcher& operator=(const prefetcher&) = delete;
  //! `shutdown()` then joins the threads (blocks until `load` calls return).
  ~prefetcher();

  //! The next step's batch, waiting until it is ready or `until` passes. An
  //! empty batch means the source ended (or the prefetcher was shut down or
  //! stopped after an error). Blocking; one consumer thread at a time.
  //! @throws load_error for a step that failed to load;
  //! system_error(errc::timeout) when `until` passes (the step is still
  //! pending: a later call returns it).
  [[nodiscard]] batch next(deadline until);
  //! `next(deadline::after(timeout))`.
  template <class Rep, class Period>
  [[nodiscard]] batch next(std::chrono::duration<Rep, Period> timeout) {
    return next(deadline::after(timeout));
  }

  //! Stops loading and wakes every waiter (a waiting next() returns an empty
  //! batch). Non-blocking; callable from any thread, also from `load`.
  void shutdown() noexcept;
  //! `shutdown()` and wait until every background thread has exited or
  //! `until` passes. @returns true when all exited.
  bool close(deadline until);

  //! The counters now; any thread, at any time. Read while the threads run,
  //! so they need not be mutually consistent.
  [[nodiscard]] prefetch_stats stats() const;
  //! The options in effect: as given, with a zero `max_device_samples` or
  //! `pool_bytes` replaced by its computed default.
  [[nodiscard]] const prefetch_options& options() const noexcept;

 private:
  std::shared_ptr<state_type> state_;
};

//! Deduces `prefetcher<Source, Load, Stage>` from the constructor's arguments.
template <class Source, class Load, class Stage>
prefetcher(Source, Load, Stage, prefetch_options) -> prefetcher<Source, Load, Stage>;

}  // namespace prefetch
EBBFLOW_END_NAMESPACE

#include <ebbflow/prefetch/impl/prefetcher.hpp>
