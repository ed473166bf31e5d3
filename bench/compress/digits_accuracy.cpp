// SPDX-License-Identifier: Apache-2.0
// Accuracy under compression: a 64-32-10 MLP (tanh, softmax cross-entropy)
// trained data-parallel on 4 ranks (threads over the loopback transport) on
// the digits data set shipped by Debian's python3-sklearn, once per codec,
// same seed, same batches, same number of steps. Gradients of the four
// parameter tensors are fused by the bucket manager and summed by
// compressed_allreduce (error feedback on). Prints test accuracy per codec
// and the difference to dense in percentage points.
//
//   digits_accuracy [--csv PATH] [--steps 1500] [--json FILE]
#include <ebbflow/comm/loopback_transport.hpp>
#include <ebbflow/compress.hpp>

#include "bench_util.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace ef = ebbflow;
namespace cx = ebbflow::compress;

namespace {
constexpr int in_dim = 64, hid = 32, classes = 10, ranks = 4;

struct dataset {
  std::vector<std::vector<float>> x;
  std::vector<int> y;
};

dataset load(const std::string& path) {
  dataset d;
  const std::string cmd = "gzip -dc '" + path + "'";
  std::FILE* f = popen(cmd.c_str(), "r");
  if (!f) return d;
  char line[4096];
  while (std::fgets(line, sizeof line, f)) {
    std::vector<float> row;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ',')) row.push_back(std::stof(cell));
    if (row.size() != in_dim + 1) continue;
    d.y.push_back(static_cast<int>(row.back()));
    row.pop_back();
    for (auto& v : row) v /= 16.0f;
    d.x.push_back(std::move(row));
  }
  pclose(f);
  return d;
}

struct mlp {
  std::vector<float> w1, b1, w2, b2;  // w1: hid x in, w2: classes x hid
  explicit mlp(unsigned seed) : w1(hid * in_dim), b1(hid, 0), w2(classes * hid), b2(classes, 0) {
    std::mt19937 g(seed);
    std::normal_distribution<float> n1(0, 1.0f / std::sqrt(float(in_dim))), n2(0, 1.0f / std::sqrt(float(hid)));
    for (auto& w : w1) w = n1(g);
    for (auto& w : w2) w = n2(g);
  }
  // Forward; returns probabilities and the hidden activations.
  void forward(const float* x, float* h, float* p) const {
    for (int j = 0; j < hid; ++j) {
      float a = b1[j];
      for (int i = 0; i < in_dim; ++i) a += w1[j * in_dim + i] * x[i];
      h[j] = std::tanh(a);
    }
    float mx = -1e30f;
    for (int c = 0; c < classes; ++c) {
      float a = b2[c];
      for (int j = 0; j < hid; ++j) a += w2[c * hid + j] * h[j];
      p[c] = a;
      mx = std::max(mx, a);
    }
    float s = 0;
    for (int c = 0; c < classes; ++c) s += (p[c] = std::exp(p[c] - mx));
    for (int c = 0; c < classes; ++c) p[c] /= s;
  }
  // Accumulates the gradient of the mean loss over `count` samples, scaled by `scale`.
  void backward(const float* x, int y, float scale, std::vector<std::vector<float>>& g) const {
    float h[hid], p[classes], dh[hid] = {};
    forward(x, h, p);
    for (int c = 0; c < classes; ++c) {
      const float d = (p[c] - (c == y ? 1.0f : 0.0f)) * scale;
      g[3][c] += d;
      for (int j = 0; j < hid; ++j) g[2][c * hid + j] += d * h[j], dh[j] += d * w2[c * hid + j];
    }
    for (int j = 0; j < hid; ++j) {
      const float d = dh[j] * (1 - h[j] * h[j]);
      g[1][j] += d;
      for (int i = 0; i < in_dim; ++i) g[0][j * in_dim + i] += d * x[i];
    }
  }
  std::vector<std::vector<float>*> params() { return {&w1, &b1, &w2, &b2}; }
};

double accuracy(const mlp& m, const dataset& d, std::size_t begin, std::size_t end) {
  std::size_t ok = 0;
  for (std::size_t i = begin; i < end; ++i) {
    float h[hid], p[classes];
    m.forward(d.x[i].data(), h, p);
    ok += static_cast<int>(std::max_element(p, p + classes) - p) == d.y[i];
  }
  return double(ok) / double(end - begin);
}

// Trains on [0, train_end) with global batch 64 (16 per rank), returns rank 0's test accuracy.
// `dense`: every bucket goes dense (the communicator's allreduce), whatever the codec.
template <class Codec>
double train(const dataset& d, std::size_t train_end, int steps, Codec codec, std::size_t* wire, bool dense = false) {
  double acc = 0;
  std::size_t wire_sum = 0;
  std::mutex mu;
  ef::comm::spawn_loopback(ranks, [&](ef::comm::loopback_transport& t) {
    mlp m(42);  // same initial model on every rank
    const std::vector<std::size_t> sizes{m.w1.size(), m.b1.size(), m.w2.size(), m.b2.size()};
    cx::bucket_manager buckets(sizes, 1 << 20);
    cx::allreduce_options o;
    o.dense_threshold_bytes = dense ? SIZE_MAX : 0;  // compress every bucket, or none
    ef::comm::transport_communicator comm(t);
    cx::compressed_allreduce<Codec, ef::comm::loopback_transport> ar(comm, codec, {}, o);
    std::mt19937 g(7);  // same batch sequence on every rank
    std::uniform_int_distribution<std::size_t> pick(0, train_end - 1);
    const int per_rank = 16, global = per_rank * ranks;
    const float lr = 0.5f;
    std::vector<std::vector<float>> grad(4);
    for (int s = 0; s < steps; ++s) {
      std::vector<std::size_t> batch(global);
      for (auto& b : batch) b = pick(g);
      for (std::size_t k = 0; k < 4; ++k) grad[k].assign(sizes[k], 0.0f);
      for (int i = 0; i < per_rank; ++i) {
        const std::size_t idx = batch[static_cast<std::size_t>(t.rank() * per_rank + i)];
        m.backward(d.x[idx].data(), d.y[idx], 1.0f / global, grad);
      }
      std::vector<std::span<float>> views(grad.begin(), grad.end());
      buckets.allreduce(std::span<const std::span<float>>(views),
                        [&](std::span<float> b, std::size_t id) { ar.run(b, id); });
      auto ps = m.params();
      for (std::size_t k = 0; k < 4; ++k)
        for (std::size_t i = 0; i < sizes[k]; ++i) (*ps[k])[i] -= lr * grad[k][i];
    }
    if (t.rank() == 0) {
      std::lock_guard lk(mu);
      acc = accuracy(m, d, train_end, d.x.size());
    }
    std::lock_guard lk(mu);
    wire_sum += ar.stats().wire_bytes_sent;
  });
  *wire = wire_sum / ranks / static_cast<std::size_t>(steps);
  return acc;
}
}  // namespace

int main(int argc, char** argv) {
  const std::string path =
      bench::arg(argc, argv, "--csv", "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz");
  const int steps = std::stoi(bench::arg(argc, argv, "--steps", "1500"));
  bench::json_lines json(bench::arg(argc, argv, "--json", ""));
  dataset d = load(path);
  if (d.x.size() != 1797) {
    std::fprintf(stderr, "digits: expected 1797 rows from %s, got %zu (install python3-sklearn)\n", path.c_str(),
                 d.x.size());
    return 2;
  }
  // Fixed shuffle, 1397 train / 400 test.
  std::vector<std::size_t> perm(d.x.size());
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(123));
  dataset s;
  for (auto i : perm) s.x.push_back(d.x[i]), s.y.push_back(d.y[i]);
  const std::size_t train_end = 1397;

  struct row {
    std::string name;
    std::function<double(std::size_t*)> run;
  };
  std::vector<row> rows{
      {"dense", [&](std::size_t* w) { return train(s, train_end, steps, cx::fp16_codec{}, w, true); }},
      {"fp16", [&](std::size_t* w) { return train(s, train_end, steps, cx::fp16_codec{}, w); }},
      {"bf16", [&](std::size_t* w) { return train(s, train_end, steps, cx::bf16_codec{}, w); }},
      {"int8", [&](std::size_t* w) { return train(s, train_end, steps, cx::int8_codec{}, w); }},
      {"int4", [&](std::size_t* w) { return train(s, train_end, steps, cx::int4_codec{}, w); }},
      {"sign1+EF", [&](std::size_t* w) { return train(s, train_end, steps, cx::sign_codec{}, w); }},
      {"topk1%+EF", [&](std::size_t* w) { return train(s, train_end, steps, cx::topk_codec(0.01), w); }},
      {"powersgd-r2", [&](std::size_t* w) { return train(s, train_end, steps, cx::powersgd_codec(2), w); }},
  };
  std::printf("# digits: %zu train / %zu test, MLP 64-32-10, 4 ranks x 16 samples, %d SGD steps, lr 0.5\n", train_end,
              s.x.size() - train_end, steps);
  std::printf("%-12s %10s %12s %16s\n", "codec", "test_acc", "vs_dense_pp", "wire_B/step/rank");
  double dense = 0;
  for (auto& r : rows) {
    std::size_t wire = 0;
    const double a = r.run(&wire);
    if (r.name == "dense") dense = a;
    std::printf("%-12s %9.2f%% %+11.2f %16zu\n", r.name.c_str(), 100 * a, 100 * (a - dense), wire);
    json.write("\"bench\":\"digits_accuracy\",\"codec\":\"" + r.name + "\",\"steps\":" + std::to_string(steps) +
               ",\"test_accuracy\":" + std::to_string(a) + ",\"delta_pp\":" + std::to_string(100 * (a - dense)) +
               ",\"wire_bytes_per_step\":" + std::to_string(wire));
  }
}
