// SPDX-License-Identifier: Apache-2.0
//! @file worker_models.hpp
//! `plan::worker_models`: one `cost_model` per worker id, and the worker specs
//! to plan with at any time, from the first step on: workers without a
//! fitted model yet (all of them at the start, a newcomer later) are planned
//! with the mean model of the others, and with one common placeholder while
//! nobody has one, which gives the uniform split. Observations that say
//! nothing of a worker's speed (a zero batch, a time that is not positive)
//! are ignored. This is what a loop needs around `replanner` when it has no
//! elastic group (the group's `planner_policy` is built on it).
#pragma once

#include <ebbflow/config.hpp>
#include <ebbflow/plan/batch_planner.hpp>
#include <ebbflow/plan/cost_model.hpp>
#include <ebbflow/plan/plan_error.hpp>

#include <cstddef>
#include <cstdint>
#include <concepts>
#include <map>
#include <ranges>
#include <span>
#include <utility>
#include <vector>

EBBFLOW_BEGIN_NAMESPACE
namespace plan {

//! A range of integer worker ids (`std::vector<std::uint64_t>`, a span of
//! the group's member ids, ...).
template <class R>
concept id_range = std::ranges::input_range<R> && std::integral<std::ranges::range_value_t<R>>;

//! The cost models of a changing set of workers, keyed by worker id. Value
//! type. Fed the same observations in the same order, every rank holds the
//! same models and so computes the same specs, bit for bit.
class worker_models {
 public:
  //! No models yet. `opts` applies to every model made.
  explicit worker_models(cost_model_options opts = {}) : opts_(opts) {}

  //! Feeds worker `id`'s step: `batch` samples took `seconds`. A zero batch
  //! (a worker given no samples still reports its step time) or a time that
  //! is not positive (or NaN) is ignored: returns false.
  //! @throws plan_error(bad_observation) as `cost_model::observe` (an infinite time).
  bool observe(std::uint64_t id, std::size_t batch, double seconds) {
    if (batch == 0 || !(seconds > 0)) return false;
    models_.try_emplace(id, opts_).first->second.observe(batch, seconds);
    return true;
  }

  //! The model of worker `id` when it is fitted (ready, with a positive
  //! seconds per sample), else nullptr.
  [[nodiscard]] const cost_model* fitted(std::uint64_t id) const {
    auto it = models_.find(id);
    return it != models_.end() && it->second.ready() && it->second.c() > 0 ? &it->second : nullptr;
  }

  //! True when at least one of `ids` (a range of integer worker ids) has a fitted model.
  template <id_range Ids>
  [[nodiscard]] bool any_fitted(const Ids& ids) const {
    for (auto id : ids)
      if (fitted(static_cast<std::uint64_t>(id))) return true;
    return false;
  }

  //! The specs of `ids`, in that order (rank order), each capped at
  //! `max_batch`. A worker without a fitted model gets the mean a and c of
  //! the fitted ones among `ids`; when none is fitted, every worker gets
  //! a = 0, c = 1 marked `placeholder`, whose optimal plan is the uniform
  //! split and whose predicted step time is NaN (not known).
  template <id_range Ids>
  [[nodiscard]] std::vector<worker_spec> specs(const Ids& ids, std::size_t max_batch) const {
    double sa = 0, sc = 0;
    int k = 0;
    for (auto id : ids)
      if (const auto* m = fitted(static_cast<std::uint64_t>(id))) sa += m->a(), sc += m->c(), ++k;
    const double mean_a = k ? sa / k : 0, mean_c = k ? sc / k : 1;
    std::vector<worker_spec> out;
    for (auto id : ids) {
      const auto u = static_cast<std::uint64_t>(id);
      const auto* m = fitted(u);
      out.push_back({u, m ? m->a() : mean_a, m ? m->c() : mean_c, max_batch, 0, 0, k == 0});
    }
    return out;
  }

  //! Forgets worker `id` (it left; a worker that comes back starts afresh).
  void erase(std::uint64_t id) { models_.erase(id); }

  //! Every model with its worker id, as bytes (`cost_model::encode` each),
  //! for `decode` on a worker that joins: it then computes the same specs.
  [[nodiscard]] std::vector<std::byte> encode() const {
    detail::model_writer w;
    w.u64(models_.size());
    for (const auto& [id, m] : models_) {
      const auto b = m.encode();
      w.u64(id);
      w.u64(b.size());
      w.out.insert(w.out.end(), b.begin(), b.end());
    }
    return std::move(w.out);
  }
  //! The models `encode` wrote (options from the bytes; `opts` for models
  //! made later). @throws plan_fault(bad_state) for bytes that are not that.
  [[nodiscard]] static worker_models decode(std::span<const std::byte> bytes, cost_model_options opts = {}) {
    detail::model_reader r{bytes};
    worker_models out(opts);
    for (std::uint64_t n = r.u64(), k = 0; k < n; ++k) {
      const std::uint64_t id = r.u64(), len = r.u64();
      EBBFLOW_PLAN_VERIFY(len <= bytes.size() - r.at, plan_errc::bad_state,
                          "cost model of worker " << id << ": " << len << " bytes, " << bytes.size() - r.at << " left");
      EBBFLOW_PLAN_VERIFY(out.models_.try_emplace(id, cost_model::decode(bytes.subspan(r.at, len))).second,
                          plan_errc::bad_state, "cost model of worker " << id << " twice");
      r.at += len;
    }
    EBBFLOW_PLAN_VERIFY(r.at == bytes.size(), plan_errc::bad_state,
                        "cost models of " << bytes.size() << " bytes, " << bytes.size() - r.at << " left over");
    return out;
  }

 private:
  cost_model_options opts_;
  std::map<std::uint64_t, cost_model> models_;
};

//! The former name of `worker_models` (and of its header, plan/cost_models.hpp),
//! kept for one release and then removed.
using cost_models = worker_models;

}  // namespace plan
EBBFLOW_END_NAMESPACE
