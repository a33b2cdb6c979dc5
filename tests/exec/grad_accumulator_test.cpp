#include "exec/grad_accumulator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "data/sampler.h"
#include "exec/fixed_point.h"

namespace morph {
namespace {

// VN gradients with magnitudes spread over many binades (like real ones).
std::vector<std::vector<float>> makeVnGrads(int vns, int64_t n, uint64_t seed) {
  SplitMix64 rng(seed);
  std::vector<std::vector<float>> g(vns, std::vector<float>(n));
  for (auto& v : g)
    for (auto& x : v)
      x = static_cast<float>((rng.uniform() - 0.5) * std::ldexp(1.0, static_cast<int>(rng.below(20)) - 10));
  return g;
}

// One step of the accumulator protocol in a single process: add all VNs in
// `order`, redo on overflow, return the buffer.
std::vector<int64_t> accumulate(GradAccumulator& acc, const std::vector<std::vector<float>>& g,
                                const std::vector<int>& order, int* attempts) {
  for (*attempts = 1;; ++*attempts) {
    acc.beginStep();
    for (int v : order) acc.add(0, g[v].data());
    auto f = acc.flagsAndMax();
    acc.updateScales(f);
    if (!GradAccumulator::overflowOf(f)) break;
  }
  return {acc.exactBuffer(), acc.exactBuffer() + acc.totalElements()};
}

TEST(GradAccumulator, SumIsBitwiseIndependentOfVnOrder) {
  const int vns = 16;
  const int64_t n = 1003;  // not a multiple of the vector width
  auto g = makeVnGrads(vns, n, 42);
  std::vector<int> order(vns);
  std::iota(order.begin(), order.end(), 0);
  GradAccumulator ref(std::vector<int64_t>{n}, ReduceMode::kExact, 3);
  int attempts;
  auto expected = accumulate(ref, g, order, &attempts);
  std::vector<float> expected_mean(n);
  ref.read(0, vns, expected_mean.data());
  SplitMix64 rng(7);
  for (int trial = 0; trial < 5; ++trial) {
    for (int i = vns - 1; i > 0; --i) std::swap(order[i], order[rng.below(i + 1)]);
    GradAccumulator acc(std::vector<int64_t>{n}, ReduceMode::kExact, 3);
    EXPECT_EQ(accumulate(acc, g, order, &attempts), expected);
    std::vector<float> mean(n);
    acc.read(0, vns, mean.data());
    EXPECT_EQ(0, std::memcmp(mean.data(), expected_mean.data(), n * sizeof(float)));
  }
  // A float sum in two orders generally differs in the last bits: that is
  // what exact mode exists to prevent.
}

TEST(GradAccumulator, MatchesFloat64ReferenceSumWithinRounding) {
  const int vns = 8;
  const int64_t n = 4096;
  auto g = makeVnGrads(vns, n, 3);
  std::vector<int> order(vns);
  std::iota(order.begin(), order.end(), 0);
  GradAccumulator acc(std::vector<int64_t>{n}, ReduceMode::kExact, 3);
  int attempts;
  accumulate(acc, g, order, &attempts);
  std::vector<float> mean(n);
  acc.read(0, vns, mean.data());
  double max_abs = 0;
  for (auto& v : g)
    for (float x : v) max_abs = std::max(max_abs, std::fabs(double(x)));
  for (int64_t i = 0; i < n; ++i) {
    double ref = 0;
    for (int v = 0; v < vns; ++v) ref += g[v][i];
    ref /= vns;
    // float rounding of the result, plus one fixed-point quantum per VN.
    double quantum = std::ldexp(1.0, -acc.scales()[0]);
    double tol = std::fabs(ref) * 0x1p-23 + quantum * vns / vns + max_abs * 0x1p-45;
    ASSERT_NEAR(mean[i], ref, tol) << "element " << i;
  }
}

TEST(GradAccumulator, SpikeBeyondBoundRedoesAndStaysOrderIndependent) {
  const int vns = 6;
  const int64_t n = 257;
  auto g = makeVnGrads(vns, n, 11);
  std::vector<int> order{0, 1, 2, 3, 4, 5}, reversed{5, 4, 3, 2, 1, 0};
  // Settle the scale on normal gradients first (as after a normal step).
  GradAccumulator a(std::vector<int64_t>{n}, ReduceMode::kExact, 3), b(std::vector<int64_t>{n}, ReduceMode::kExact, 3);
  int attempts;
  accumulate(a, g, order, &attempts);
  accumulate(b, g, reversed, &attempts);
  ASSERT_EQ(a.scales(), b.scales());
  const int scale_before = a.scales()[0];
  // A spike: one VN's gradient jumps by 2^20, beyond the agreed bound.
  for (auto& x : g[4]) x *= 1048576.0f;
  auto ra = accumulate(a, g, order, &attempts);
  EXPECT_EQ(attempts, 2);
  auto rb = accumulate(b, g, reversed, &attempts);
  EXPECT_EQ(attempts, 2);
  EXPECT_EQ(ra, rb);
  EXPECT_LT(a.scales()[0], scale_before);
  // The redo's sum is right.
  std::vector<float> mean(n);
  a.read(0, 1.0, mean.data());
  double ref = 0;
  for (int v = 0; v < vns; ++v) ref += g[v][0];
  EXPECT_NEAR(mean[0], ref, std::fabs(ref) * 1e-6 + 1e-3);
}

TEST(GradAccumulator, NonFiniteGradientIsFlagged) {
  GradAccumulator acc(std::vector<int64_t>{5}, ReduceMode::kExact, 3);
  acc.beginStep();
  float g[5] = {1, 2, NAN, 4, 5};
  acc.add(0, g);
  auto f = acc.flagsAndMax();
  EXPECT_TRUE(GradAccumulator::nonfiniteOf(f));
  EXPECT_TRUE(GradAccumulator::overflowOf(f));
  GradAccumulator fl(std::vector<int64_t>{5}, ReduceMode::kFloat, 3);
  fl.beginStep();
  g[2] = INFINITY;
  fl.add(0, g);
  EXPECT_TRUE(GradAccumulator::nonfiniteOf(fl.flagsAndMax()));
}

TEST(FixedPoint, VectorAndScalarKernelsAgreeBitwise) {
  auto g = makeVnGrads(1, 1031, 5)[0];
  g[17] = 0.5f;   // ties round to even after scaling by 2^0... exercised below
  g[18] = -2.5f;
  for (int scale : {0, 1, 20, 40}) {
    std::vector<int64_t> a(g.size(), 3), b(g.size(), 3);
    QuantizeResult ra = quantizeAdd(g.data(), g.size(), scale, a.data());
    QuantizeResult rb = quantizeAddScalar(g.data(), g.size(), scale, b.data());
    EXPECT_EQ(a, b) << "scale " << scale;
    EXPECT_EQ(ra.max_abs, rb.max_abs);
    EXPECT_EQ(ra.overflow, rb.overflow);
  }
  std::vector<int64_t> acc(2, 0);
  float ties[2] = {0.5f, -2.5f};
  quantizeAddScalar(ties, 2, 0, acc.data());
  EXPECT_EQ(acc[0], 0);   // half to even
  EXPECT_EQ(acc[1], -2);
}

TEST(FixedPoint, ScaleKeepsMaximumBelowBoundWithHeadroom) {
  for (double m : {1e-12, 0.3, 1.0, 7.9, 8.0, 1e9}) {
    int s = scaleFor(m, 3);
    EXPECT_LT(m * std::ldexp(1.0, s), std::ldexp(1.0, 48));
    EXPECT_GE(m * std::ldexp(1.0, s), std::ldexp(1.0, 47));
  }
}

}  // namespace
}  // namespace morph
