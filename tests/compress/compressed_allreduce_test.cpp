// SPDX-License-Identifier: Apache-2.0
// Multi-rank compressed allreduce over the in-process loopback transport:
// 2-5 ranks, odd sizes, several segments; every codec within its stated
// error of the exact sum, every rank with the same bits. The same runs over
// real UCX processes in tests/comm/ucx_collectives_test (scenario compressed).
#include <ebbflow/comm/communicator.hpp>
#include <ebbflow/comm/loopback_transport.hpp>
#include <ebbflow/config.hpp>
#include <ebbflow/compress.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

namespace ef = ebbflow;
namespace cx = ebbflow::compress;
using comm_t = ef::comm::transport_communicator<ef::comm::loopback_transport>;
using namespace std::chrono_literals;

namespace {
std::vector<float> normal_vec(std::size_t n, unsigned seed, float mean = 0.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(mean, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
cx::allreduce_options small_opts() {
  cx::allreduce_options o;
  o.segment_bytes = 4096;          // 4 KiB of wire per segment: several segments per chunk
  o.dense_threshold_bytes = 1024;  // compress anything from 256 elements up
  o.timeout = std::chrono::seconds(30);
  return o;
}

// Runs `calls` allreduces of per-rank inputs make(rank, call) on p ranks;
// returns each rank's result of every call.
// With `stats`, each rank's counters after the last call.
template <class Codec, class Make>
std::vector<std::vector<std::vector<float>>> run_group(int p, Codec c, std::size_t calls, Make make,
                                                       cx::allreduce_options o = small_opts(),
                                                       cx::matrix_shape shape = {},
                                                       std::vector<cx::allreduce_stats>* stats = nullptr) {
  std::vector<std::vector<std::vector<float>>> out(static_cast<std::size_t>(p));
  if (stats) stats->assign(static_cast<std::size_t>(p), {});
  ef::comm::spawn_loopback(p, [&](ef::comm::loopback_transport& t) {
    comm_t comm(t);
    cx::compressed_allreduce<Codec, ef::comm::loopback_transport> ar(comm, c, {}, o);
    for (std::size_t k = 0; k < calls; ++k) {
      std::vector<float> g = make(t.rank(), k);
      if (shape.size())
        ar.run(g, 7, shape);
      else
        ar.run(g, 7);
      out[static_cast<std::size_t>(t.rank())].push_back(std::move(g));
    }
    if (stats) (*stats)[static_cast<std::size_t>(t.rank())] = ar.stats();
  });
  return out;
}
template <class Make>
std::vector<double> exact_sum(int p, std::size_t n, std::size_t call, Make make) {
  std::vector<double> s(n, 0.0);
  for (int r = 0; r < p; ++r) {
    auto g = make(r, call);
    for (std::size_t i = 0; i < n; ++i) s[i] += g[i];
  }
  return s;
}
void expect_same_on_all_ranks(const std::vector<std::vector<std::vector<float>>>& out) {
  for (std::size_t r = 1; r < out.size(); ++r)
    for (std::size_t k = 0; k < out[0].size(); ++k) ASSERT_EQ(out[r][k], out[0][k]) << "rank " << r << " call " << k;
}
}  // namespace

struct Shape {
  int ranks;
  std::size_t n;
};
class AllreduceTest : public ::testing::TestWithParam<Shape> {};
// Under ThreadSanitizer the 65,537-element shape (three quarters of the
// test's time there) adds arithmetic, not interleavings: every other shape
// still runs on 2-5 ranks, and the release and ASan builds run it too.
static std::vector<Shape> shapes() {
  std::vector<Shape> s{{2, 1}, {2, 300}, {3, 10007}, {4, 257}, {5, 4099}, {5, 3}};
#if !EBBFLOW_SANITIZE_THREAD
  s.push_back({4, 65537});
#endif
  return s;
}
INSTANTIATE_TEST_SUITE_P(RanksAndSizes, AllreduceTest, ::testing::ValuesIn(shapes()), [](const auto& i) {
  std::string name = "p";  // appended, not "p" + std::string: GCC 12's -Wrestrict false positive
  name += std::to_string(i.param.ranks);
  name += "_n";
  name += std::to_string(i.param.n);
  return name;
});

template <class Codec>
void check_cast(int p, std::size_t n) {
  auto make = [n](int r, std::size_t) { return normal_vec(n, 100 + static_cast<unsigned>(r)); };
  auto out = run_group(p, Codec{}, 1, make);
  expect_same_on_all_ranks(out);
  auto s = exact_sum(p, n, 0, make);
  std::vector<double> abs_sums(n, 0.0);
  for (int r = 0; r < p; ++r) {
    auto g = make(r, 0);
    for (std::size_t i = 0; i < n; ++i) abs_sums[i] += std::fabs(g[i]);
  }
  for (std::size_t i = 0; i < n; ++i) {
    const double abs_sum = abs_sums[i];
    // p encodes along the chain, each within unit roundoff of a partial sum.
    ASSERT_LE(std::fabs(out[0][0][i] - s[i]), (p + 1) * Codec::unit_roundoff * abs_sum + 1e-5) << i;
  }
}
TEST_P(AllreduceTest, Fp16WithinRoundoffOfExactSum) { check_cast<cx::fp16_codec>(GetParam().ranks, GetParam().n); }
TEST_P(AllreduceTest, Bf16WithinRoundoffOfExactSum) { check_cast<cx::bf16_codec>(GetParam().ranks, GetParam().n); }

// The range of the cast codecs. The ring decodes, adds and re-encodes at
// every hop, so its running sums, not only the inputs, must fit the code:
// they did not (fp16: 4 ranks of 60000 gave inf). Each case runs `Codec` on
// p ranks over make(rank, i) and wants every element finite and within
// (p + 1) unit roundoffs of the sum of magnitudes, or, with `saturate`,
// +-inf (the exact sum's sign) and counted in `stats().saturated` on every
// rank; the same bits on every rank.
template <class Codec, class Make>
void check_cast_range(const char* what, int p, std::size_t n, Make make, bool saturate = false) {
  SCOPED_TRACE(what);
  std::vector<cx::allreduce_stats> stats;
  auto out = run_group(
      p, Codec{}, 1,
      [&](int r, std::size_t) {
        std::vector<float> v(n);
        for (std::size_t i = 0; i < n; ++i) v[i] = make(r, i);
        return v;
      },
      small_opts(), {}, &stats);
  expect_same_on_all_ranks(out);
  const bool dense = n * 4 < small_opts().dense_threshold_bytes;
  for (std::size_t i = 0; i < n; ++i) {
    double sum = 0, mag = 0;
    for (int r = 0; r < p; ++r) sum += make(r, i), mag += std::fabs(make(r, i));
    const float got = out[0][0][i];
    if (saturate) {
      ASSERT_TRUE(std::isinf(got) && (got > 0) == (sum > 0)) << i << ": " << got;
    } else {
      ASSERT_TRUE(std::isfinite(got)) << i << ": " << got << ", exact " << sum;
      ASSERT_LE(std::fabs(got - sum), (p + 1) * Codec::unit_roundoff * mag) << i << ": " << got << ", exact " << sum;
    }
  }
  for (const auto& s : stats) EXPECT_EQ(s.saturated, saturate && !dense ? n : 0u);
}

// A small spread, so that not every element rounds alike.
float spread(std::size_t i) { return 1.0f - static_cast<float>(i % 5) / 8192.0f; }

TEST_P(AllreduceTest, Fp16KeepsAMeanInRangeWhoseSumIsNot) {
  const int p = GetParam().ranks;
  const std::size_t n = GetParam().n;
  // The numbers: every rank 60000 (30000); the sum is beyond 65504.
  for (const float v : {60000.0f, 30000.0f, 65504.0f})
    check_cast_range<cx::fp16_codec>("every rank alike", p, n, [&](int, std::size_t) { return v; });
  check_cast_range<cx::fp16_codec>("every rank different", p, n, [&](int r, std::size_t i) {
    return 65000.0f * spread(i + static_cast<std::size_t>(r)) * (r % 2 ? 0.5f : 1.0f);
  });
}

// Half the ranks +a, the others -a: the sum is a or 0, but the ring's
// running sums reach ceil(p/2) a. fp16: a = 60000, and 100000, beyond fp16
// on its own.
TEST_P(AllreduceTest, Fp16KeepsRunningSumsBeyondItsRange) {
  const int p = GetParam().ranks;
  const std::size_t n = GetParam().n;
  const int k = (p + 1) / 2;  // ranks with +a
  for (const float a : {60000.0f, 100000.0f})
    check_cast_range<cx::fp16_codec>("+-a", p, n, [&](int r, std::size_t i) { return (r < k ? a : -a) * spread(i); });
}

// bf16's largest value is 2^-8 below FLT_MAX; between it and FLT_MAX, bf16
// rounds to inf. Two ranks: +-w, each alone in that window. More: the ring
// starting at rank 0 (b, bf16-exact) adds rank 1's w - b: a running sum in
// the window; rank 2 takes b away again (the sum is w - b).
TEST_P(AllreduceTest, Bf16KeepsRunningSumsBetweenItsLargestValueAndFloats) {
  const int p = GetParam().ranks;
  const std::size_t n = GetParam().n;
  const float bf16_max = 0x1.FEp127f, flt_max = std::numeric_limits<float>::max();
  const float w = (bf16_max + 0x1p119f) / 2 + flt_max / 2,
              b = 0x1.1p127f;  // w: halfway from rounding to inf to FLT_MAX
  ASSERT_GT(w - (w - b) * (1 - spread(4)), bf16_max + 0x1p119f);
  check_cast_range<cx::bf16_codec>("window", p, n, [&](int r, std::size_t i) {
    if (p == 2) return (r == 0 ? w : -w) * spread(i);
    return r == 0 ? b : r == 1 ? (w - b) * spread(i) : r == 2 ? -b : 1.0f;
  });
}

// The ring's hop never unscales its running sums: +-2e38
// on every rank, running sums up to ceil(p/2) 2e38, beyond FLT_MAX, the sum
// 2e38 or 0. (The dense path, tensors below the threshold, is float's
// arithmetic: such running sums overflow there, as in any float allreduce.)
TEST_P(AllreduceTest, CastCodecsKeepRunningSumsBeyondFloat) {
  const int p = GetParam().ranks;
  const std::size_t n = GetParam().n;
  if (n * 4 < small_opts().dense_threshold_bytes) return;  // dense: float's arithmetic
  const int k = (p + 1) / 2;
  const auto pm = [&](int r, std::size_t i) { return (r < k ? 2e38f : -2e38f) * spread(i); };
  check_cast_range<cx::fp16_codec>("fp16", p, n, pm);
  check_cast_range<cx::bf16_codec>("bf16", p, n, pm);
}

// The block scales follow the values from call to call, with the
// error-feedback residual of the last call (at another magnitude) added in:
// magnitudes jumping by 2^+-70 between calls stay finite and, summed over
// the calls, within a few roundings of the largest call of the sum of the
// exact sums.
TEST_P(AllreduceTest, CastCodecsFollowTheRangeFromCallToCall) {
  const int p = GetParam().ranks;
  const std::size_t n = GetParam().n;
  const float mags[] = {60000.0f, 1e-3f, 1e20f, 1e-20f, 60000.0f, 3e-5f};
  const std::size_t calls = std::size(mags);
  auto make = [&](int r, std::size_t k) {
    auto v = normal_vec(n, 70 + static_cast<unsigned>(r) + 10 * static_cast<unsigned>(k));
    for (auto& x : v) x *= mags[k];
    return v;
  };
  const auto check = [&](auto codec) {
    using codec_t = decltype(codec);
    std::vector<cx::allreduce_stats> stats;
    auto out = run_group(p, codec, calls, make, small_opts(), {}, &stats);
    expect_same_on_all_ranks(out);
    std::vector<double> acc(n, 0.0), ex(n, 0.0), mag(n, 0.0);
    for (std::size_t k = 0; k < calls; ++k) {
      const auto s = exact_sum(p, n, k, make);
      for (int r = 0; r < p; ++r) {
        const auto v = make(r, k);
        for (std::size_t i = 0; i < n; ++i) mag[i] = std::max(mag[i], double(std::fabs(v[i])));
      }
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_TRUE(std::isfinite(out[0][k][i])) << codec.name() << " call " << k << " i " << i;
        acc[i] += out[0][k][i], ex[i] += s[i];
      }
    }
    // Error feedback: what was not sent stays in the residuals, at most a
    // rounding of the largest magnitude per rank.
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_LE(std::fabs(acc[i] - ex[i]), 2 * (p + 1) * p * codec_t::unit_roundoff * mag[i] + 1e-30)
          << codec.name() << " i " << i;
    for (const auto& st : stats) EXPECT_EQ(st.saturated, 0u);
  };
  check(cx::fp16_codec{});
  check(cx::bf16_codec{});
}

// A sum beyond float's range cannot be represented: +-inf, counted.
TEST_P(AllreduceTest, CastCodecsCountASumBeyondFloat) {
  const int p = GetParam().ranks;
  const std::size_t n = GetParam().n;
  const auto big = [](int, std::size_t i) { return (i % 2 ? 2e38f : -2e38f) * spread(i); };
  check_cast_range<cx::fp16_codec>("fp16", p, n, big, true);
  check_cast_range<cx::bf16_codec>("bf16", p, n, big, true);
}

// The block scales go up as well as down: gradients far below fp16's
// normal range (6.1e-5) keep its relative precision instead of rounding to
// multiples of 2^-24 (or to 0).
TEST_P(AllreduceTest, Fp16KeepsItsPrecisionOnTinyValues) {
  const int p = GetParam().ranks;
  const std::size_t n = GetParam().n;
  for (const float v : {1e-7f, 1e-20f, 1e-38f})
    check_cast_range<cx::fp16_codec>("tiny", p, n, [&](int r, std::size_t i) {
      return v * static_cast<float>(1 + (i + static_cast<std::size_t>(r)) % 7) * (r % 3 == 1 ? -1.0f : 1.0f);
    });
}

// A non-finite input is not a saturation: the element comes out non-finite
// (infinities with their sign) and nothing is counted; the other elements
// are as usual.
TEST_P(AllreduceTest, CastCodecsPassANonFiniteInputOnUncounted) {
  const int p = GetParam().ranks;
  const std::size_t n = GetParam().n;
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<cx::allreduce_stats> stats;
  auto make = [&](int r, std::size_t) {
    auto v = normal_vec(n, 40 + static_cast<unsigned>(r));
    if (r == p - 1) v[0] = inf;
    return v;
  };
  auto out = run_group(p, cx::fp16_codec{}, 1, make, small_opts(), {}, &stats);
  expect_same_on_all_ranks(out);
  EXPECT_EQ(out[0][0][0], inf);
  const auto s = exact_sum(p, n, 0, make);
  std::vector<double> mag(n, 0.0);
  for (int r = 0; r < p; ++r) {
    const auto v = make(r, 0);
    for (std::size_t i = 0; i < n; ++i) mag[i] += std::fabs(v[i]);
  }
  for (std::size_t i = 1; i < n; ++i)
    ASSERT_LE(std::fabs(out[0][0][i] - s[i]), (p + 1) * cx::fp16_codec::unit_roundoff * mag[i]) << i;
  for (const auto& st : stats) EXPECT_EQ(st.saturated, 0u);
}

template <class Codec>
void check_quant(int p, std::size_t n) {
  std::vector<std::vector<float>> g;
  for (int r = 0; r < p; ++r) g.push_back(normal_vec(n, 200 + static_cast<unsigned>(r), 0.1f));
  auto make = [&](int r, std::size_t) { return g[static_cast<std::size_t>(r)]; };
  auto out = run_group(p, Codec{}, 1, make);
  expect_same_on_all_ranks(out);
  auto s = exact_sum(p, n, 0, make);
  for (std::size_t b = 0; b * 256 < n; ++b) {
    const std::size_t e = std::min(n, b * 256 + 256);
    double amax_sum = 0;  // every partial sum's block max is <= this
    for (int r = 0; r < p; ++r) {
      double a = 0;
      for (std::size_t i = b * 256; i < e; ++i) a = std::max(a, double(std::fabs(g[static_cast<std::size_t>(r)][i])));
      amax_sum += a;
    }
    const double bound = n * 4 < 1024 ? 1e-5 * amax_sum : p * amax_sum / Codec::levels * 1.001 + 1e-5;
    for (std::size_t i = b * 256; i < e; ++i) ASSERT_LE(std::fabs(out[0][0][i] - s[i]), bound) << i;
  }
}
TEST_P(AllreduceTest, Int8WithinPStepsOfExactSum) { check_quant<cx::int8_codec>(GetParam().ranks, GetParam().n); }
TEST_P(AllreduceTest, Int4WithinPStepsOfExactSum) { check_quant<cx::int4_codec>(GetParam().ranks, GetParam().n); }

TEST_P(AllreduceTest, TopKIsExactOnSparseEnoughGradients) {
  const int p = GetParam().ranks;
  const std::size_t n = GetParam().n;
  // ~2.5 % non-zeros per rank, below the 5 % slots of every 1024-element segment.
  auto make = [n](int r, std::size_t) {
    auto v = normal_vec(n, 300 + static_cast<unsigned>(r));
    for (std::size_t i = 0; i < n; ++i)
      if ((i * 7 + static_cast<std::size_t>(r)) % 40 != 0) v[i] = 0.0f;
    return v;
  };
  auto out = run_group(p, cx::topk_codec(0.05), 1, make);
  expect_same_on_all_ranks(out);
  auto s = exact_sum(p, n, 0, make);
  for (std::size_t i = 0; i < n; ++i) ASSERT_NEAR(out[0][0][i], s[i], 1e-5 * (1 + std::fabs(s[i]))) << i;
}

// Biased codes (top-k of dense gradients, 1-bit sign) are judged as they are
// used: over many steps the sum of allreduced updates tracks the sum of the
// exact sums, with a relative gap that shrinks as steps accumulate.
template <class Codec>
void check_tracking(int p, std::size_t n, Codec c, double bound) {
  const std::size_t calls = 60;
  auto make = [n](int r, std::size_t k) {
    return normal_vec(n, 1000 * static_cast<unsigned>(k) + static_cast<unsigned>(r), 0.2f);
  };
  auto out = run_group(p, c, calls, make);
  expect_same_on_all_ranks(out);
  std::vector<double> acc(n, 0.0), ex(n, 0.0);
  double gap_at_5 = 0;
  auto gap = [&] {
    double e = 0, d = 0;
    for (std::size_t i = 0; i < n; ++i) e += (acc[i] - ex[i]) * (acc[i] - ex[i]), d += ex[i] * ex[i];
    return std::sqrt(e / d);
  };
  for (std::size_t k = 0; k < calls; ++k) {
    auto s = exact_sum(p, n, k, make);
    for (std::size_t i = 0; i < n; ++i) acc[i] += out[0][k][i], ex[i] += s[i];
    if (k == 4) gap_at_5 = gap();
  }
  const double g = gap();
  EXPECT_LT(g, bound) << c.name();
  if (n * 4 >= 1024) {
    EXPECT_LT(g, gap_at_5) << c.name();
  }
}
TEST_P(AllreduceTest, TopKWithErrorFeedbackTracksTheSum) {
  check_tracking(GetParam().ranks, GetParam().n, cx::topk_codec(0.05), 0.35);
}
TEST_P(AllreduceTest, SignTwoPhaseWithErrorFeedbackTracksTheSum) {
  check_tracking(GetParam().ranks, GetParam().n, cx::sign_codec{}, 0.35);
}

TEST_P(AllreduceTest, PowerSgdReconstructsALowRankSumExactly) {
  const int p = GetParam().ranks;
  const cx::matrix_shape s{std::max<std::size_t>(1, GetParam().n / 37), 37};
  const std::size_t n = s.size();
  // M_r = U_r V^T with V shared: the sum has rank <= 2.
  auto v = normal_vec(s.cols * 2, 5);
  auto make = [&](int r, std::size_t) {
    auto u = normal_vec(s.rows * 2, 600 + static_cast<unsigned>(r));
    std::vector<float> m(n, 0.0f);
    for (std::size_t i = 0; i < s.rows; ++i)
      for (std::size_t j = 0; j < s.cols; ++j) m[i * s.cols + j] = u[i * 2] * v[j * 2] + u[i * 2 + 1] * v[j * 2 + 1];
    return m;
  };
  auto out = run_group(p, cx::powersgd_codec(4), 1, make, small_opts(), s);
  expect_same_on_all_ranks(out);
  auto ex = exact_sum(p, n, 0, make);
  double e = 0, d = 0;
  for (std::size_t i = 0; i < n; ++i) e += (out[0][0][i] - ex[i]) * (out[0][0][i] - ex[i]), d += ex[i] * ex[i];
  EXPECT_LT(std::sqrt(e / d), 1e-4);
}

TEST_P(AllreduceTest, PowerSgdDefaultShapeTracksTheSum) {
  check_tracking(GetParam().ranks, GetParam().n, cx::powersgd_codec(2), 0.5);
}

// PowerSGD at any magnitude: the factors are kept near 1 by powers of two,
// so a rank-1 sum is reproduced from 1e-30 to 1e30 over calls with a warm
// start. It came out 0 (rel. error 1) below about 1e-9, where P = M Q with
// Q ~ M fell under the orthogonalisation's eps, and above about 1e18, where
// its squares overflowed.
TEST(Allreduce, PowerSgdReconstructsALowRankSumAtAnyMagnitude) {
  const cx::matrix_shape s{64, 48};
  for (int p : {2, 3, 5})
    for (const float a : {1e-30f, 1e-9f, 1e18f, 1e30f}) {
      auto make = [&](int r, std::size_t) {
        std::vector<float> m(s.size());
        for (std::size_t i = 0; i < s.rows; ++i)
          for (std::size_t j = 0; j < s.cols; ++j)
            m[i * s.cols + j] = a * (1.0f + 0.01f * static_cast<float>(i % 7) + static_cast<float>(r)) *
                                (1.0f - 0.02f * static_cast<float>(j % 5));
        return m;
      };
      auto out = run_group(p, cx::powersgd_codec(4), 3, make, small_opts(), s);
      expect_same_on_all_ranks(out);
      const auto ex = exact_sum(p, s.size(), 0, make);
      for (std::size_t k = 0; k < 3; ++k) {
        double e = 0, d = 0;
        for (std::size_t i = 0; i < s.size(); ++i)
          e += (out[0][k][i] - ex[i]) * (out[0][k][i] - ex[i]), d += ex[i] * ex[i];
        EXPECT_LT(std::sqrt(e / d), 1e-5) << p << " ranks, magnitude " << a << ", call " << k;
      }
    }
}

// One key, one size, another matrix shape: the warm-start Q of the first
// shape (cols x r) must not be read as the second's (out of bounds before).
TEST(Allreduce, PowerSgdStartsAfreshWhenTheMatrixShapeChanges) {
  cx::allreduce_options o = small_opts();
  o.dense_threshold_bytes = 0;
  const std::size_t n = 4096;
  auto rank1 = [](cx::matrix_shape s, float scale) {  // u v^T: exact at any rank >= 1
    std::vector<float> m(s.size());
    for (std::size_t i = 0; i < s.rows; ++i)
      for (std::size_t j = 0; j < s.cols; ++j)
        m[i * s.cols + j] =
            scale * (1.0f + 0.01f * static_cast<float>(i % 7)) * (1.0f - 0.02f * static_cast<float>(j % 5));
    return m;
  };
  std::vector<std::vector<float>> out(2);
  ef::comm::spawn_loopback(2, [&](ef::comm::loopback_transport& t) {
    comm_t comm(t);
    cx::compressed_allreduce<cx::powersgd_codec, ef::comm::loopback_transport> ar(comm, cx::powersgd_codec(4), {}, o);
    auto g = rank1({1024, 4}, 1.0f);
    ar.run(g, 0, cx::matrix_shape{1024, 4});
    auto h = rank1({4, 1024}, 1.0f);
    ar.run(h, 0, cx::matrix_shape{4, 1024});
    out[static_cast<std::size_t>(t.rank())] = h;
  });
  const auto ex = rank1({4, 1024}, 2.0f);
  ASSERT_EQ(out[0], out[1]);
  for (std::size_t i = 0; i < n; ++i) ASSERT_NEAR(out[0][i], ex[i], 1e-4 * (1 + std::fabs(ex[i]))) << i;
}

// A step whose gradient has lower rank than r (or is zero) empties columns
// of P; the warm-start Q must not keep them empty: a later rank-2 sum is
// reproduced exactly again from the step after (it stayed at rank 0 or 1).
TEST(Allreduce, PowerSgdRecoversTheRankAfterALowerRankStep) {
  const cx::matrix_shape s{64, 64};
  auto v = normal_vec(s.cols * 2, 5);
  auto low = [&](int r, std::size_t rank) {  // rank-`rank` matrix, shared V
    auto u = normal_vec(s.rows * 2, 600 + static_cast<unsigned>(r));
    std::vector<float> m(s.size(), 0.0f);
    for (std::size_t i = 0; i < s.rows; ++i)
      for (std::size_t j = 0; j < s.cols; ++j)
        for (std::size_t c = 0; c < rank; ++c) m[i * s.cols + j] += u[i * 2 + c] * v[j * 2 + c];
    return m;
  };
  for (const std::size_t first : {0u, 1u}) {
    for (const bool ef_on : {false, true}) {
      cx::allreduce_options o = small_opts();
      o.dense_threshold_bytes = 0;
      o.error_feedback = ef_on;
      auto make = [&](int r, std::size_t k) { return low(r, k == 0 ? first : 2); };
      auto out = run_group(2, cx::powersgd_codec(4), 4, make, o, s);
      expect_same_on_all_ranks(out);
      for (std::size_t k = 2; k < 4; ++k) {
        auto ex = exact_sum(2, s.size(), k, make);
        double e = 0, d = 0;
        for (std::size_t i = 0; i < s.size(); ++i)
          e += (out[0][k][i] - ex[i]) * (out[0][k][i] - ex[i]), d += ex[i] * ex[i];
        EXPECT_LT(std::sqrt(e / d), 1e-3)
            << "first step of rank " << first << ", error feedback " << ef_on << ", step " << k;
      }
    }
  }
}

// Small tensors are the communicator's allreduce: exact, counted, and on
// the latency-optimal algorithm it picks for their size (recursive doubling
// here), sending what that algorithm sends.
TEST(Allreduce, DenseBelowThresholdIsTheCommunicatorsLatencyOptimalAllreduce) {
  for (std::size_t n : {std::size_t{100}, std::size_t{1024}}) {  // 400 B, and 4 KiB of gradient
    auto make = [n](int r, std::size_t) { return normal_vec(n, static_cast<unsigned>(r)); };
    std::mutex m;
    std::size_t dense = 0;
    ef::comm::spawn_loopback(3, [&](ef::comm::loopback_transport& t) {
      comm_t comm(t);
      cx::compressed_allreduce<cx::fp16_codec, ef::comm::loopback_transport> ar(comm, {});
      auto g = make(t.rank(), 0);
      ar.run(g);
      auto s = exact_sum(3, n, 0, make);
      for (std::size_t i = 0; i < n; ++i) EXPECT_NEAR(g[i], s[i], 1e-5);
      EXPECT_EQ(comm.allreduce_algorithm_for(n, ef::dtype::f32), ef::comm::allreduce_algorithm::recursive_doubling);
      EXPECT_EQ(ar.stats().wire_bytes_sent, comm.allreduce_bytes_sent(n, ef::dtype::f32));
      EXPECT_GT(ar.stats().wire_bytes_sent, 0u);
      std::lock_guard lk(m);
      dense += ar.stats().dense_calls;
    });
    EXPECT_EQ(dense, 3u);
  }
}

TEST(Allreduce, WireBytesMatchThePrediction) {
  const std::size_t n = 100000;
  ef::comm::spawn_loopback(4, [&](ef::comm::loopback_transport& t) {
    comm_t comm(t);
    cx::compressed_allreduce<cx::int8_codec, ef::comm::loopback_transport> ar(comm, {});
    auto g = normal_vec(n, 1);
    ar.run(g);
    EXPECT_EQ(ar.stats().wire_bytes_sent, ar.wire_bytes(n));
    // fp16: 2 (p-1)/p x (2 bytes per element + 1 per block of 256).
    cx::compressed_allreduce<cx::fp16_codec, ef::comm::loopback_transport> half(comm, {});
    half.run(g);
    EXPECT_EQ(half.stats().wire_bytes_sent, half.wire_bytes(n));
    EXPECT_NEAR(static_cast<double>(half.wire_bytes(n)), 2.0 * 3 / 4 * n * (2 + 1.0 / 256), 1024.0);
    // ~ 2 (p-1)/p n (1 + 4/256) bytes: about 4x fewer than dense floats.
    EXPECT_LT(ar.wire_bytes(n), 2 * 3 * n * 4 / 4 / 3.8);
    // PowerSGD's factors and tail are the communicator's allreduces: counted as they are sent.
    cx::compressed_allreduce<cx::powersgd_codec, ef::comm::loopback_transport> low(comm, cx::powersgd_codec(2));
    low.run(g);
    EXPECT_EQ(low.stats().wire_bytes_sent, low.wire_bytes(n));
    EXPECT_LT(low.wire_bytes(n), 2 * 3 * n * 4 / 4 / 50);  // rank 2 factors: 50x fewer than dense floats
  });
}

// Several allreduce objects and the communicator's own collectives on one
// transport, in one order on every rank but at different speeds (a rank
// runs ahead into the next collective while another still receives the
// last): no tag spaces to hand out, every result exact or within its codec's
// error, the same bits on every rank.
TEST(Allreduce, ObjectsAndCollectivesShareOneCommunicatorWithNoTagBookkeeping) {
  const int p = 4;
  const std::size_t big = 20000, small = 200;  // 800 B: below small_opts' dense threshold
  auto make = [](int r, std::size_t k, std::size_t n) { return normal_vec(n, 50 * static_cast<unsigned>(k) + r); };
  std::vector<std::vector<std::vector<float>>> out(p);
  ef::comm::spawn_loopback(p, [&](ef::comm::loopback_transport& t) {
    comm_t comm(t);
    cx::compressed_allreduce<cx::fp16_codec, ef::comm::loopback_transport> a(comm, {}, {}, small_opts());
    cx::compressed_allreduce<cx::int8_codec, ef::comm::loopback_transport> b(comm, {}, {}, small_opts());
    cx::compressed_allreduce<cx::topk_codec, ef::comm::loopback_transport> c(comm, cx::topk_codec(0.5), {},
                                                                             small_opts());
    const int r = t.rank();
    auto& mine = out[static_cast<std::size_t>(r)];
    for (std::size_t k = 0; k < 3; ++k) {
      // Rank r starts round k late by r ms, and so on: sends of fast ranks
      // reach slow ones before their receives are posted.
      std::this_thread::sleep_for(std::chrono::milliseconds((r + static_cast<int>(k)) % p));
      mine.push_back(make(r, 10 * k, big));
      a.run(mine.back(), 1);
      mine.push_back(make(r, 10 * k + 1, small));
      comm.allreduce(ef::view(std::span(mine.back())), ef::reduce_op::sum, ef::deadline::after(10s));
      mine.push_back(make(r, 10 * k + 2, big));
      b.run(mine.back(), 2);
      mine.push_back(make(r, 10 * k + 3, small));
      a.run(mine.back(), 3);  // below the threshold: dense
      mine.push_back(make(r, 10 * k + 4, big));
      c.run(mine.back(), 4);
      std::vector<std::int32_t> ranks(static_cast<std::size_t>(p));
      const std::int32_t me = r;
      comm.allgather(ef::view(std::span(&me, 1)), ef::view(std::span(ranks)), ef::deadline::after(10s));
      EXPECT_EQ(ranks[3], 3);
    }
  });
  expect_same_on_all_ranks(out);
  for (std::size_t i = 0; i < out[0].size(); ++i) {
    const std::size_t k = i / 5 * 10 + i % 5, n = out[0][i].size();
    const auto ex = exact_sum(p, n, k, [&](int r, std::size_t kk) { return make(r, kk, n); });
    double e = 0, d = 0;
    for (std::size_t j = 0; j < n; ++j) e += (out[0][i][j] - ex[j]) * (out[0][i][j] - ex[j]), d += ex[j] * ex[j];
    EXPECT_LT(std::sqrt(e / d), i % 5 == 4 ? 0.9 : i % 5 == 2 ? 0.05 : 1e-3) << "collective " << i;
  }
}

TEST(Allreduce, DeadPeerFailsWithPeerLostInsteadOfHanging) {
  auto hub = std::make_shared<ef::comm::loopback_hub>(3);
  hub->kill(2);
  std::vector<std::jthread> th;
  std::vector<std::error_code> ecs(2);
  for (int r = 0; r < 2; ++r)
    th.emplace_back([&, r] {
      ef::comm::loopback_transport t(hub, r);
      comm_t comm(t);
      cx::compressed_allreduce<cx::fp16_codec, ef::comm::loopback_transport> ar(comm, {}, {}, small_opts());
      auto g = normal_vec(5000, 1);
      ar.run(g, 0, ecs[static_cast<std::size_t>(r)]);
    });
  th.clear();
  for (auto& ec : ecs) EXPECT_EQ(ec, ef::errc::peer_lost) << ec.message();
}
