// SPDX-License-Identifier: Apache-2.0
// A small multilayer perceptron (64 → hidden → 10, tanh, softmax
// cross-entropy) in plain C++, with SGD + momentum. The elastic examples,
// benchmarks and end-to-end tests train it on the digits data set. Not part
// of the library.
//
// tanh, not ReLU: the equivalence tests compare an elastic run with a
// single-process run whose sums differ by rounding only. At a ReLU's kink a
// rounding difference flips a unit on or off and changes a gradient by a
// whole sample's share: one run in about thirty failed that way (a unit 2.6e-7
// from its kink at step 324). A smooth activation keeps rounding differences
// the size of rounding.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace mlp {

struct shape {
  int in = 64, hidden = 64, out = 10;
  [[nodiscard]] std::size_t params() const noexcept {
    return static_cast<std::size_t>(in * hidden + hidden + hidden * out + out);
  }
};

//! Parameters in one flat vector: W1 (hidden×in), b1, W2 (out×hidden), b2.
inline std::vector<float> init(const shape& s, std::uint64_t seed) {
  std::vector<float> p(s.params(), 0.f);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n1(0.f, std::sqrt(2.f / static_cast<float>(s.in)));
  std::normal_distribution<float> n2(0.f, std::sqrt(2.f / static_cast<float>(s.hidden)));
  std::size_t k = 0;
  for (int i = 0; i < s.in * s.hidden; ++i) p[k++] = n1(rng);
  k += static_cast<std::size_t>(s.hidden);
  for (int i = 0; i < s.hidden * s.out; ++i) p[k++] = n2(rng);
  return p;
}

//! Forward pass of one sample; writes class probabilities and the hidden layer. Returns the loss.
inline float forward(const shape& s, std::span<const float> p, const float* x, int label, float* hidden, float* prob) {
  const float* W1 = p.data();
  const float* b1 = W1 + s.in * s.hidden;
  const float* W2 = b1 + s.hidden;
  const float* b2 = W2 + s.hidden * s.out;
  for (int h = 0; h < s.hidden; ++h) {
    float z = b1[h];
    for (int i = 0; i < s.in; ++i) z += W1[h * s.in + i] * x[i];
    hidden[h] = std::tanh(z);
  }
  float m = -1e30f;
  for (int o = 0; o < s.out; ++o) {
    float z = b2[o];
    for (int h = 0; h < s.hidden; ++h) z += W2[o * s.hidden + h] * hidden[h];
    prob[o] = z;
    m = std::max(m, z);
  }
  float sum = 0;
  for (int o = 0; o < s.out; ++o) sum += (prob[o] = std::exp(prob[o] - m));
  for (int o = 0; o < s.out; ++o) prob[o] /= sum;
  return -std::log(std::max(prob[label], 1e-30f));
}

//! Adds `scale` × the gradient of sample (x, label) to `g`; returns its loss.
inline float accumulate(const shape& s, std::span<const float> p, const float* x, int label, float scale,
                        std::span<float> g) {
  std::vector<float> hidden(static_cast<std::size_t>(s.hidden)), prob(static_cast<std::size_t>(s.out)),
      dh(static_cast<std::size_t>(s.hidden), 0.f);
  const float loss = forward(s, p, x, label, hidden.data(), prob.data());
  const float* W2 = p.data() + s.in * s.hidden + s.hidden;
  float* gW1 = g.data();
  float* gb1 = gW1 + s.in * s.hidden;
  float* gW2 = gb1 + s.hidden;
  float* gb2 = gW2 + s.hidden * s.out;
  for (int o = 0; o < s.out; ++o) {
    const float d = (prob[static_cast<std::size_t>(o)] - (o == label ? 1.f : 0.f)) * scale;
    gb2[o] += d;
    for (int h = 0; h < s.hidden; ++h) {
      gW2[o * s.hidden + h] += d * hidden[static_cast<std::size_t>(h)];
      dh[static_cast<std::size_t>(h)] += d * W2[o * s.hidden + h];
    }
  }
  for (int h = 0; h < s.hidden; ++h) {
    const float a = hidden[static_cast<std::size_t>(h)];
    const float d = dh[static_cast<std::size_t>(h)] * (1 - a * a);  // tanh' = 1 - tanh²
    gb1[h] += d;
    for (int i = 0; i < s.in; ++i) gW1[h * s.in + i] += d * x[i];
  }
  return loss;
}

//! SGD with momentum: v = mu·v + g; p -= lr·v.
inline void sgd_step(std::span<float> p, std::span<float> v, std::span<const float> g, float lr, float mu) {
  for (std::size_t k = 0; k < p.size(); ++k) {
    v[k] = mu * v[k] + g[k];
    p[k] -= lr * v[k];
  }
}

//! Fraction of (x, y) classified correctly.
inline double accuracy(const shape& s, std::span<const float> p, std::span<const float> x, std::span<const int> y) {
  std::vector<float> hidden(static_cast<std::size_t>(s.hidden)), prob(static_cast<std::size_t>(s.out));
  std::size_t ok = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    forward(s, p, &x[i * static_cast<std::size_t>(s.in)], y[i], hidden.data(), prob.data());
    ok += static_cast<std::size_t>(std::max_element(prob.begin(), prob.end()) - prob.begin()) ==
          static_cast<std::size_t>(y[i]);
  }
  return y.empty() ? 0.0 : static_cast<double>(ok) / static_cast<double>(y.size());
}

}  // namespace mlp
