// SPDX-License-Identifier: Apache-2.0
// A LibTorch training loop (an MLP on the 8x8 digits, torch::optim::SGD with
// momentum) made elastic and heterogeneity-aware with ebbflow. Every line that
// ebbflow adds is marked "ebbflow:"; docs/tutorial.md walks through them.
//
//   ebbflow-run -n 4 --elastic --add 8 --kill 16:2 -- torch_elastic --slowdowns 1,1.5,2,3 --report report
//   torch_elastic --reference --report report     # the same global batches in one process
//
// Heterogeneity is emulated: worker k (EBBFLOW_WORKER_ID) sleeps
// slowdown[k] × (step_us + sample_us × its batch) per step, like a GPU that
// is slowdown[k] times slower (EBBFLOW_SLOWDOWN overrides). The planner sees
// the measured times and gives slow workers smaller batches.
#include <torch/torch.h>

#include <ebbflow/elastic/group.hpp>           // elastic::group
#include <ebbflow/elastic/planner_policy.hpp>  // the exact batch planner as the group's policy
#include <ebbflow/elastic/any_store.hpp>       // the job's store, picked by EBBFLOW_STORE
#include <ebbflow/elastic/ucx_network.hpp>     // collectives over UCX
#include <ebbflow/plan/sampler.hpp>            // plan::epoch_permutation
#include <ebbflow/prefetch/prefetcher.hpp>     // prefetch::prefetcher

#if __has_include(<ebbflow/compress/compressed_allreduce.hpp>)
#include <ebbflow/compress/codecs/cast.hpp>
#include <ebbflow/compress/codecs/quantize.hpp>
#include <ebbflow/compress/codecs/topk.hpp>
#include <ebbflow/compress/compressed_allreduce.hpp>  // compress::compressed_allreduce (--codec)
#define TORCH_ELASTIC_HAS_COMPRESS 1
#endif

#include "../common/digits.hpp"
#include "../common/exit_status.hpp"
#include "../common/factors.hpp"
#include "../common/join.hpp"
#include "../common/training_args.hpp"
#include "report.hpp"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace ef = ebbflow;
namespace el = ebbflow::elastic;
namespace pf = ebbflow::prefetch;
using clk = std::chrono::steady_clock;

namespace {

// The codecs this build has for --codec.
#ifdef TORCH_ELASTIC_HAS_COMPRESS
constexpr const char* codecs[] = {"dense", "fp16", "int8", "topk"};
#else
constexpr const char* codecs[] = {"dense"};  // no <ebbflow/compress/...> in this build
#endif

// The shared flags (training_args.hpp) and this example's own.
struct args : training_args::values {
  std::string codec = "dense";
  std::string report_dir;
  int eval_every = 10, log_every = 0;
  bool progress = false;
};

args parse(int argc, char** argv) {
  args a;
  a.steps = 300;
  a.batch = 128;
  a.hidden = 128;
  cli::parser p("torch_elastic",
                "usage: torch_elastic [options]   (under ebbflow-run, or --reference; see the file comment)\n");
  training_args::add(p, a);
  std::string codec_list;
  for (const char* c : codecs) codec_list += (codec_list.empty() ? "" : "|") + std::string(c);
  p.value(
       "--codec", codec_list, "one of " + codec_list,
       [&a](const std::string& v) {
         a.codec = v;
         return std::ranges::find(codecs, v) != std::end(codecs);
       },
       "how the gradient is summed (default dense: the exact allreduce)")
      .text("--report", "DIR", a.report_dir, "metrics, events, sample logs and results go there")
      .number("--eval-every", "N", a.eval_every, 1, 1 << 30, "test accuracy every N steps (default 10)")
      .number("--log-every", "N", a.log_every, 0, 1 << 30, "a progress line every N steps (default 0: none)")
      .flag("--progress", a.progress, "a live progress line on the terminal");
  p.parse(argc, argv);
  return a;
}

// The model: what a LibTorch user already has.
struct NetImpl : torch::nn::Module {
  explicit NetImpl(int hidden)
      : fc1(register_module("fc1", torch::nn::Linear(digits::pixels, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, digits::classes))) {}
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

// Makes every parameter, its gradient and its momentum buffer a view into one
// flat tensor each, so that ebbflow works on three contiguous buffers and
// never copies a tensor. Backward accumulates into the existing gradient
// views; torch::optim::SGD updates parameters and momentum buffers in place.
struct flat_state {
  torch::Tensor params, grads, momentum;  // grads has one extra slot: the loss rides along in the allreduce
  std::int64_t n = 0;
};

// The optimizer's state is keyed by the parameter: a string in LibTorch 1.13, a pointer later.
template <class Map>
void put_state(Map& state, const torch::Tensor& p, std::unique_ptr<torch::optim::SGDParamState> st) {
  if constexpr (std::is_same_v<typename Map::key_type, std::string>)
    state[c10::guts::to_string(p.unsafeGetTensorImpl())] = std::move(st);
  else
    state[p.unsafeGetTensorImpl()] = std::move(st);
}

flat_state flatten(std::vector<torch::Tensor> params, torch::optim::SGD& opt, torch::Device device) {
  flat_state f;
  for (auto& p : params) f.n += p.numel();
  const auto o = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  f.params = torch::empty({f.n}, o);
  f.grads = torch::zeros({f.n + 1}, o);
  f.momentum = torch::zeros({f.n}, o);
  torch::NoGradGuard no_grad;
  auto& state = opt.state();
  std::int64_t off = 0;
  for (auto& p : params) {
    const auto k = p.numel();
    f.params.narrow(0, off, k).copy_(p.detach().reshape({k}));
    p.set_data(f.params.narrow(0, off, k).view_as(p));
    p.mutable_grad() = f.grads.narrow(0, off, k).view_as(p);
    // SGD creates momentum buffers lazily at its first step; create them now
    // (zeros give the same first step) so that they are registered state too.
    auto st = std::make_unique<torch::optim::SGDParamState>();
    st->momentum_buffer(f.momentum.narrow(0, off, k).view_as(p));
    put_state(state, p, std::move(st));
    off += k;
  }
  return f;
}

// Host bytes of a CPU tensor, for ebbflow's spans (no copy).
std::span<float> floats_of(const torch::Tensor& t) {
  TORCH_CHECK(t.is_cpu() && t.is_contiguous() && t.scalar_type() == torch::kFloat32);
  return {t.data_ptr<float>(), static_cast<std::size_t>(t.numel())};
}

double accuracy(Net& model, const torch::Tensor& x, const torch::Tensor& y) {
  torch::NoGradGuard no_grad;
  model->eval();
  const auto pred = model->forward(x).argmax(1);
  model->train();
  return pred.eq(y).to(torch::kFloat64).mean().item<double>();
}

// One sample in the prefetcher's staging memory: 64 pixels, then the label.
constexpr std::size_t sample_floats = digits::pixels + 1;

// The prefetcher's index source: this worker's slices of the coming steps,
// predicted from the plan in force. A membership change, a re-plan or a
// redone step makes the prediction wrong: the loop sees that the batch's
// samples are not its slice and starts the prefetcher again from the step.
struct slice_source {
  std::size_t n, global_batch;
  std::uint64_t seed;
  std::vector<std::size_t> sizes;  // the group's plan: every rank's batch for a full global batch
  int rank;
  std::int64_t epoch;
  std::size_t cursor;

  bool plan_step(pf::step_plan& out) {
    const std::size_t bt = std::min(global_batch, n - cursor);
    const auto b = el::scale_plan(sizes, bt);  // what the group does for an epoch's short last batch
    const auto r = static_cast<std::size_t>(rank);
    const std::size_t offset = std::accumulate(b.begin(), b.begin() + rank, std::size_t{0});
    const ef::plan::epoch_permutation order(n, seed, static_cast<std::uint64_t>(epoch));
    out.indices.resize(b[r]);
    for (std::size_t j = 0; j < b[r]; ++j) out.indices[j] = order(cursor + offset + j);
    out.split.assign(1, b[r]);
    if ((cursor += bt) >= n) cursor = 0, ++epoch;
    return true;
  }
  bool plan(std::uint64_t, pf::step_plan& out) { return plan_step(out); }
};

// Emulated device time of a step on `b` samples (a slower GPU takes longer).
void emulate_device(const args& a, std::size_t b, double slowdown) {
  const double us = slowdown * (a.step_us + a.sample_us * static_cast<double>(b));
  if (us > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(us));
}

void write_params(const std::string& path, const torch::Tensor& flat) {
  if (path.empty()) return;
  const auto h = flat.to(torch::kCPU).contiguous();
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(h.data_ptr<float>()), static_cast<std::streamsize>(h.numel() * sizeof(float)));
}

void write_result(const args& a, const char* name, std::int64_t steps, double wall_s, double acc, int world) {
  if (a.report_dir.empty()) return;
  std::filesystem::create_directories(a.report_dir);
  std::ofstream f(std::filesystem::path(a.report_dir) / name);
  f << "{\"steps\":" << steps << ",\"wall_s\":" << wall_s << ",\"test_acc\":" << acc << ",\"world_size\":" << world
    << ",\"global_batch\":" << a.batch << ",\"codec\":\"" << a.codec << "\"}\n";
}

// Sums the gradient (and the loss in its last slot) over the group: dense, or
// with a compressed allreduce over the group's communicator. The compressor
// is made again for every generation (the communicator is per generation;
// its error-feedback residuals start from zero). False: a member failed; redo the step.
template <class Group>
class gradient_sum {
 public:
  gradient_sum(Group& g, std::string codec) : group_(g), codec_(std::move(codec)) {}
  bool operator()(std::span<float> grads_and_loss) {
    if (codec_ == "dense") return group_.allreduce(grads_and_loss);
#ifdef TORCH_ELASTIC_HAS_COMPRESS
    if (generation_ != group_.generation()) make(), generation_ = group_.generation();
    return group_.collective([&](auto& comm) {
      run_(grads_and_loss.first(grads_and_loss.size() - 1));
      comm.allreduce(ef::view(grads_and_loss.last(1)), ef::reduce_op::sum);  // the loss, exactly
    });
#else
    return false;
#endif
  }

 private:
#ifdef TORCH_ELASTIC_HAS_COMPRESS
  void make() {
    namespace cz = ef::compress;
    auto& c = group_.communicator();
    auto wrap = [](auto a) { return [a](std::span<float> g) mutable { a->run(g); }; };
    using tr = typename Group::transport_type;
    if (codec_ == "fp16")
      run_ = wrap(std::make_shared<cz::compressed_allreduce<cz::fp16_codec, tr>>(c, cz::fp16_codec{}));
    else if (codec_ == "int8")
      run_ = wrap(std::make_shared<cz::compressed_allreduce<cz::int8_codec, tr>>(c, cz::int8_codec{}));
    else
      run_ = wrap(std::make_shared<cz::compressed_allreduce<cz::topk_codec, tr>>(c, cz::topk_codec(0.1)));
  }
  std::function<void(std::span<float>)> run_;
  std::int64_t generation_ = -1;
#endif
  Group& group_;
  std::string codec_;
};

// The single-process run over the same global batches (same seed, same order).
int reference(const args& a, const digits::data_set& train, const torch::Tensor& test_x, const torch::Tensor& test_y) {
  torch::manual_seed(a.seed);
  Net model(a.hidden);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(a.lr).momentum(a.momentum));
  auto flat = flatten(model->parameters(), optimizer, torch::kCPU);
  const auto t0 = clk::now();
  std::FILE* csv = nullptr;
  if (!a.report_dir.empty()) {
    std::filesystem::create_directories(a.report_dir);
    csv = std::fopen((std::filesystem::path(a.report_dir) / "reference.csv").c_str(), "w");
    if (csv) std::fputs("step,loss,test_acc\n", csv);
  }
  std::size_t cursor = 0;
  std::int64_t epoch = 0;
  std::vector<float> xb;
  std::vector<std::int64_t> yb;
  for (std::int64_t t = 0; t < a.steps; ++t) {
    const ef::plan::epoch_permutation order(train.size(), a.seed, static_cast<std::uint64_t>(epoch));
    const std::size_t bt = std::min(a.batch, train.size() - cursor);
    xb.resize(bt * digits::pixels);
    yb.resize(bt);
    for (std::size_t j = 0; j < bt; ++j) {
      const auto i = order(cursor + j);
      std::memcpy(&xb[j * digits::pixels], &train.x[i * digits::pixels], digits::pixels * sizeof(float));
      yb[j] = train.y[i];
    }
    flat.grads.zero_();
    const auto x = torch::from_blob(xb.data(), {static_cast<std::int64_t>(bt), digits::pixels});
    const auto y = torch::from_blob(yb.data(), {static_cast<std::int64_t>(bt)}, torch::kInt64);
    auto loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    loss.backward();
    optimizer.step();
    if ((cursor += bt) >= train.size()) cursor = 0, ++epoch;
    const bool eval = (t + 1) % a.eval_every == 0 || t + 1 == a.steps;
    if (csv)
      std::fprintf(csv, "%lld,%.6f,%s\n", static_cast<long long>(t + 1), loss.item<double>(),
                   eval ? std::to_string(accuracy(model, test_x, test_y)).c_str() : "");
  }
  if (csv) std::fclose(csv);
  const double wall = std::chrono::duration<double>(clk::now() - t0).count();
  const double acc = accuracy(model, test_x, test_y);
  std::printf("reference: %lld steps in %.2f s, test accuracy %.4f\n", static_cast<long long>(a.steps), wall, acc);
  write_params(a.params_out, flat.params);
  write_result(a, "reference.json", a.steps, wall, acc, 1);
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  const args a = parse(argc, argv);
  torch::set_num_threads(1);  // several workers share this machine's cores
  const digits::data_set all = digits::load();
  digits::data_set train, test;
  digits::split(all, train, test);
  const auto n_test = static_cast<std::int64_t>(test.size());
  const auto test_x = torch::from_blob(const_cast<float*>(test.x.data()), {n_test, digits::pixels}).clone();
  const auto test_y = torch::tensor(std::vector<std::int64_t>(test.y.begin(), test.y.end()));
  if (a.reference) return reference(a, train, test_x, test_y);

  const long long worker = ef::env::get_int("EBBFLOW_WORKER_ID", 0, 0, 1 << 20);
  const double slowdown = ef::env::get_double("EBBFLOW_SLOWDOWN", factors::of(a.slowdowns, worker), 1.0, 1000.0);
  std::fprintf(stderr, "worker %lld: emulated device %.1fx slower than the fastest\n", worker, slowdown);

  // The usual LibTorch setup: same seed everywhere, so every worker starts equal.
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  torch::manual_seed(a.seed);
  Net model(a.hidden);
  model->to(device);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(a.lr).momentum(a.momentum));
  // ebbflow: parameters, gradients and momentum become views into three flat tensors.
  auto flat = flatten(model->parameters(), optimizer, device);
  // On a GPU the group works on host mirrors of the flat tensors; on the CPU they are the same tensors.
  auto host_of = [](const torch::Tensor& t) { return t.is_cpu() ? t : t.to(torch::kCPU); };
  const torch::Tensor h_params = host_of(flat.params), h_momentum = host_of(flat.momentum),
                      h_grads = host_of(flat.grads);

  // ebbflow: join the job (an initial worker, or a newcomer with EBBFLOW_JOIN=1) with the exact batch
  // planner, as the documented loop does (../common/join.hpp).
  el::ucx_network net;
  auto g = examples::join_job(net, a.batch, train.size());
  // ebbflow: the training state that joiners (and members behind after a failure) receive.
  g.register_state("params", std::as_writable_bytes(floats_of(h_params)));
  g.register_state("momentum", std::as_writable_bytes(floats_of(h_momentum)));
  gradient_sum sum_gradients(g, a.codec);  // ebbflow: dense allreduce, or --codec fp16|int8|topk
  bool state_changed = true;               // the state may have arrived from another member
  demo::report report(a.report_dir, a.progress, a.log_every, a.steps);
  g.on_world_changed([&](const el::world_change& w) {
    state_changed = true;
    std::fprintf(stderr, "world changed (%s): %d -> %d workers at step %lld, ready after %.1f ms\n",
                 std::string(el::name(w.reason)).c_str(), w.old_size, w.new_size, static_cast<long long>(w.step),
                 w.stall_seconds * 1e3);
    if (w.rank == 0) report.event(el::name(w.reason), w.step, w.old_size, w.new_size, w.generation, w.stall_seconds);
  });

  // ebbflow: the prefetcher loads this worker's next slices on a background thread.
  auto load = [&](std::size_t i, std::span<std::byte> dst) {
    const float label = static_cast<float>(train.y[i]);
    std::memcpy(dst.data(), &train.x[i * digits::pixels], digits::pixels * sizeof(float));
    std::memcpy(dst.data() + digits::pixels * sizeof(float), &label, sizeof label);
  };
  using prefetcher = pf::prefetcher<slice_source, decltype(load)>;
  const pf::prefetch_options popts{
      .sample_bytes = sample_floats * sizeof(float), .max_batch_samples = a.batch, .depth = 2, .loaders = 1};
  std::optional<prefetcher> loader;
  pf::step_plan mine;
  std::int64_t restarts = -1;  // prefetcher (re)starts after a change of plan

  demo::sample_log samples(a.report_dir, worker);
  const auto t0 = clk::now();
  const std::int64_t steps = a.steps;
  // ebbflow: the documented loop (docs/snippets/training_loop.cpp): runs on while a join finishes, and
  // marks the job finished once the steps are done.
  while (g.keep_training(steps)) {
    const auto s = g.begin_step();  // ebbflow: my slice of the global batch (applies joins and state transfers)
    if (state_changed && !h_params.is_same(flat.params)) flat.params.copy_(h_params), flat.momentum.copy_(h_momentum);
    state_changed = false;
    const std::vector<std::size_t> plan(g.plan().begin(), g.plan().end());
    const slice_source from_here{train.size(), a.batch, a.seed, plan, s.rank, s.epoch, s.cursor};
    slice_source(from_here).plan_step(mine);  // the samples this step must train on
    auto batch = loader ? loader->next(std::chrono::seconds(30)) : prefetcher::batch{};
    if (!batch || !std::ranges::equal(batch.indices(), mine.indices)) {  // ebbflow: the plan changed: restart
      batch = {};
      loader.reset();
      loader.emplace(from_here, load, pf::cpu_stage(1), popts);
      ++restarts;
      batch = loader->next(std::chrono::seconds(30));
      TORCH_CHECK(batch && std::ranges::equal(batch.indices(), mine.indices), "prefetcher out of step");
    }

    const auto c0 = clk::now();
    flat.grads.zero_();  // (not optimizer.zero_grad(): newer LibTorch would drop the gradient views)
    if (s.batch > 0) {
      const auto data = torch::from_blob(batch.data(0).data(), {static_cast<std::int64_t>(s.batch), sample_floats});
      const auto x = data.narrow(1, 0, digits::pixels).to(device);
      const auto y = data.select(1, digits::pixels).to(torch::kInt64).to(device);
      // ebbflow: the gradient of the GLOBAL mean loss: my samples weigh 1 / B_t each.
      namespace F = torch::nn::functional;
      auto loss = F::cross_entropy(model->forward(x), y, F::CrossEntropyFuncOptions().reduction(torch::kSum)) /
                  static_cast<double>(s.global_batch);
      loss.backward();
      flat.grads[flat.n] = loss.detach();
    }
    emulate_device(a, s.batch, slowdown);
    const double compute_s = std::chrono::duration<double>(clk::now() - c0).count();
    samples.attempt(s.step, s.generation, s.epoch, mine.indices);
    if (a.die.now(worker, s.step)) std::raise(SIGKILL);  // fault injection (tests)

    if (!h_grads.is_same(flat.grads)) h_grads.copy_(flat.grads);
    if (!sum_gradients(floats_of(h_grads))) continue;  // ebbflow: allreduce; false: a member failed, redo the step
    if (!h_grads.is_same(flat.grads)) flat.grads.copy_(h_grads);
    optimizer.step();
    if (!h_params.is_same(flat.params)) h_params.copy_(flat.params), h_momentum.copy_(flat.momentum);
    g.end_step(compute_s);  // ebbflow: commit; joins, leaves and re-plans happen here
    samples.commit(s.step, s.generation);

    if (g.active() && g.rank() == 0) {
      const bool eval = g.step() % a.eval_every == 0 || g.step() == steps;
      const std::size_t done = s.cursor + s.global_batch;
      report.step({.step = g.step(),
                   .epoch = s.epoch,
                   .epoch_progress = static_cast<double>(done) / static_cast<double>(train.size()),
                   .generation = s.generation,
                   .world_size = s.world_size,
                   .loss = h_grads[flat.n].item<double>(),
                   .test_acc = eval ? accuracy(model, test_x.to(device), test_y.to(device)) : NAN,
                   .global_batch = s.global_batch,
                   .batches = el::scale_plan(plan, s.global_batch)});
    }
  }
  if (g.active() && g.rank() == 0) {
    const double wall = std::chrono::duration<double>(clk::now() - t0).count();
    const double acc = accuracy(model, test_x.to(device), test_y.to(device));
    std::printf("finished %lld steps in %.2f s: world size %d, test accuracy %.4f, %lld prefetcher restarts\n",
                static_cast<long long>(g.step()), wall, g.size(), acc, static_cast<long long>(restarts));
    write_params(a.params_out, flat.params);
    write_result(a, "result.json", g.step(), wall, acc, g.size());
  }
  return 0;
} catch (const std::exception& e) {
  return exit_status::of("torch_elastic", e);
}
