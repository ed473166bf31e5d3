// SPDX-License-Identifier: Apache-2.0
// The demo's output, kept out of the training loop: per-step metrics (CSV and
// JSON lines), membership events, the per-worker sample log that the
// integration test checks, and live progress on the terminal. Not part of the
// library.
#pragma once

#include <ebbflow/core/deadline.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace demo {

//! Seconds since the Unix epoch (the same clock in every process, so rows
//! written by successive coordinators line up).
inline double unix_now() { return ebbflow::wall_seconds(); }

//! One committed step as the coordinator saw it.
struct step_record {
  std::int64_t step = 0;  // steps committed after this one
  std::int64_t epoch = 0;
  double epoch_progress = 0;  // fraction of the epoch done after this step
  std::int64_t generation = 0;
  int world_size = 1;
  double loss = 0;        // global mean training loss of the step
  double test_acc = NAN;  // NaN: not evaluated at this step
  std::size_t global_batch = 0;
  std::vector<std::size_t> batches;  // every rank's batch, rank order
};

//! Appends rows to files in the report folder (opened lazily, in append mode:
//! after a failure of the coordinator the next one continues the same files)
//! and renders progress. Used by the current rank 0 only.
class report {
 public:
  report(std::string dir, bool progress, int log_every, std::int64_t total_steps)
      : dir_(std::move(dir)), progress_(progress), log_every_(log_every), total_(total_steps) {}
  report(const report&) = delete;
  report& operator=(const report&) = delete;
  ~report() {
    if (tty_) std::fputs("\n", tty_), std::fclose(tty_);
    for (auto* f : {csv_, jsonl_, events_})
      if (f) std::fclose(f);
  }

  void step(const step_record& r) {
    const double now = unix_now();
    window_.push_back({now, r.global_batch});
    if (window_.size() > 10) window_.pop_front();
    double rate = 0;
    if (window_.size() >= 2) {
      std::size_t samples = 0;
      for (std::size_t i = 1; i < window_.size(); ++i) samples += window_[i].second;
      rate = static_cast<double>(samples) / std::max(1e-9, now - window_.front().first);
    }
    if (!std::isnan(r.test_acc)) last_acc_ = r.test_acc;
    std::string plan;
    for (auto b : r.batches) plan += (plan.empty() ? "" : ";") + std::to_string(b);
    if (!dir_.empty()) {
      if (!csv_) {
        csv_ = open("metrics.csv");
        if (csv_ && std::ftell(csv_) == 0)
          std::fputs("step,time_s,epoch,epoch_progress,generation,world_size,loss,test_acc,samples_per_s,batches\n",
                     csv_);
        jsonl_ = open("metrics.jsonl");
      }
      const std::string acc = std::isnan(r.test_acc) ? "" : std::to_string(r.test_acc);
      if (csv_) {
        std::fprintf(csv_, "%lld,%.3f,%lld,%.4f,%lld,%d,%.6f,%s,%.1f,%s\n", static_cast<long long>(r.step), now,
                     static_cast<long long>(r.epoch), r.epoch_progress, static_cast<long long>(r.generation),
                     r.world_size, r.loss, acc.c_str(), rate, plan.c_str());
        std::fflush(csv_);
      }
      if (jsonl_) {
        std::string arr;
        for (auto b : r.batches) arr += (arr.empty() ? "" : ",") + std::to_string(b);
        std::fprintf(jsonl_,
                     "{\"step\":%lld,\"time_s\":%.3f,\"epoch\":%lld,\"epoch_progress\":%.4f,\"generation\":%lld,"
                     "\"world_size\":%d,\"loss\":%.6f,\"test_acc\":%s,\"samples_per_s\":%.1f,\"batches\":[%s]}\n",
                     static_cast<long long>(r.step), now, static_cast<long long>(r.epoch), r.epoch_progress,
                     static_cast<long long>(r.generation), r.world_size, r.loss, acc.empty() ? "null" : acc.c_str(),
                     rate, arr.c_str());
        std::fflush(jsonl_);
      }
    }
    show(r, rate, plan);
  }

  //! A membership change (`what`: initial, join, leave, failure).
  void event(std::string_view what, std::int64_t step, int old_size, int new_size, std::int64_t generation,
             double stall_s) {
    if (progress_ && what != "initial") {  // above the progress line
      if (!tty_) tty_ = std::fopen("/dev/tty", "w");
      if (tty_)
        std::fprintf(tty_, "\r\033[K -> %.*s: %d -> %d workers at step %lld (ready after %.0f ms)\n",
                     static_cast<int>(what.size()), what.data(), old_size, new_size, static_cast<long long>(step),
                     stall_s * 1e3);
    }
    if (dir_.empty()) return;
    if (!events_) {
      events_ = open("events.csv");
      if (events_ && std::ftell(events_) == 0)
        std::fputs("time_s,step,event,old_size,new_size,generation,stall_ms\n", events_);
    }
    if (!events_) return;
    std::fprintf(events_, "%.3f,%lld,%.*s,%d,%d,%lld,%.1f\n", unix_now(), static_cast<long long>(step),
                 static_cast<int>(what.size()), what.data(), old_size, new_size, static_cast<long long>(generation),
                 stall_s * 1e3);
    std::fflush(events_);
  }

 private:
  std::FILE* open(const char* name) {
    std::filesystem::create_directories(dir_);
    return std::fopen((std::filesystem::path(dir_) / name).c_str(), "a");
  }

  // A terminal gets one live line (rendered at most 10 times a second);
  // otherwise a plain line every `log_every_` steps.
  void show(const step_record& r, double rate, const std::string& plan) {
    char acc[16] = "  -  ";
    if (!std::isnan(last_acc_)) std::snprintf(acc, sizeof acc, "%5.1f%%", 100 * last_acc_);
    if (progress_) {
      if (!tty_) tty_ = std::fopen("/dev/tty", "w");
      const double now = unix_now();
      if (!tty_ || (now - last_render_ < 0.1 && r.step != total_)) return;
      last_render_ = now;
      constexpr int width = 20;
      const int full = static_cast<int>(std::lround(r.epoch_progress * width));
      std::string bar(static_cast<std::size_t>(full), '#');
      bar.resize(width, '.');
      std::fprintf(tty_,
                   "\r\033[K epoch %lld [%s] step %lld/%lld  loss %.3f  acc %s  %6.0f samples/s  world %d  batches %s",
                   static_cast<long long>(r.epoch), bar.c_str(), static_cast<long long>(r.step),
                   static_cast<long long>(total_), r.loss, acc, rate, r.world_size, plan.c_str());
      std::fflush(tty_);
    } else if (log_every_ > 0 && (r.step % log_every_ == 0 || r.step == total_)) {
      std::printf("step %lld/%lld epoch %lld  loss %.3f  acc %s  %.0f samples/s  world %d  batches %s\n",
                  static_cast<long long>(r.step), static_cast<long long>(total_), static_cast<long long>(r.epoch),
                  r.loss, acc, rate, r.world_size, plan.c_str());
      std::fflush(stdout);
    }
  }

  std::string dir_;
  bool progress_;
  int log_every_;
  std::int64_t total_;
  std::FILE* csv_ = nullptr;
  std::FILE* jsonl_ = nullptr;
  std::FILE* events_ = nullptr;
  std::FILE* tty_ = nullptr;
  double last_render_ = 0;
  double last_acc_ = NAN;
  std::deque<std::pair<double, std::size_t>> window_;  // (commit time, samples) of the last steps
};

//! Every worker's log of the samples it trained on, for the exactly-once check:
//! `A <step> <generation> <epoch> <index>...` before the gradient allreduce
//! (an attempt; flushed before any byte of it can reach a peer) and
//! `C <step> <generation>` once the step is committed. A step counts once,
//! in the newest generation in which any worker committed it; every attempt
//! in that generation went into the committed update.
class sample_log {
 public:
  sample_log(const std::string& dir, long long worker) {
    if (dir.empty()) return;
    std::filesystem::create_directories(dir);
    f_ = std::fopen((std::filesystem::path(dir) / ("samples-" + std::to_string(worker) + ".log")).c_str(), "a");
  }
  sample_log(const sample_log&) = delete;
  sample_log& operator=(const sample_log&) = delete;
  ~sample_log() {
    if (f_) std::fclose(f_);
  }
  void attempt(std::int64_t step, std::int64_t generation, std::int64_t epoch, std::span<const std::size_t> indices) {
    if (!f_) return;
    std::string line = "A " + std::to_string(step) + " " + std::to_string(generation) + " " + std::to_string(epoch);
    for (auto i : indices) line += " " + std::to_string(i);
    line += "\n";
    std::fputs(line.c_str(), f_);
    std::fflush(f_);
  }
  void commit(std::int64_t step, std::int64_t generation) {
    if (!f_) return;
    std::fprintf(f_, "C %lld %lld\n", static_cast<long long>(step), static_cast<long long>(generation));
    std::fflush(f_);
  }

 private:
  std::FILE* f_ = nullptr;
};

}  // namespace demo
