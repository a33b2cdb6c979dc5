#include "plan/partitioner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace morph {
namespace {

// Every cut of [0, L) into P non-empty contiguous stages, as boundary lists.
void allCuts(size_t L, int P, std::vector<size_t>& cur, std::vector<std::vector<size_t>>& out) {
  const size_t left = static_cast<size_t>(P) - (cur.size() - 1);  // stages still to place
  const size_t at = cur.back();
  if (left == 1) {
    cur.push_back(L);
    out.push_back(cur);
    cur.pop_back();
    return;
  }
  for (size_t j = at + 1; j + (left - 1) <= L; ++j) {
    cur.push_back(j);
    allCuts(L, P, cur, out);
    cur.pop_back();
  }
}

std::vector<std::vector<size_t>> allCuts(size_t L, int P) {
  std::vector<std::vector<size_t>> out;
  if (P < 1 || static_cast<size_t>(P) > L) return out;
  std::vector<size_t> cur{0};
  allCuts(L, P, cur, out);
  return out;
}

int64_t stageBytes(const StageCostFns& f, const std::vector<size_t>& cut, size_t k) {
  const int P = static_cast<int>(cut.size()) - 1;
  return f.bytes(cut[k], cut[k + 1], P - static_cast<int>(k));
}

double bottleneck(const StageCostFns& f, const std::vector<size_t>& cut) {
  double worst = 0;
  for (size_t k = 0; k + 1 < cut.size(); ++k) worst = std::max(worst, f.seconds(cut[k], cut[k + 1]));
  return worst;
}

int64_t peakBytes(const StageCostFns& f, const std::vector<size_t>& cut) {
  int64_t worst = 0;
  for (size_t k = 0; k + 1 < cut.size(); ++k) worst = std::max(worst, stageBytes(f, cut, k));
  return worst;
}

bool fits(const StageCostFns& f, const std::vector<size_t>& cut, int64_t cap) {
  return cap <= 0 || peakBytes(f, cut) <= cap;
}

// Brute force optimum: the smallest bottleneck among the cuts that fit.
std::optional<double> bruteMinMax(const StageCostFns& f, size_t L, int P, int64_t cap) {
  std::optional<double> best;
  for (const auto& cut : allCuts(L, P))
    if (fits(f, cut, cap)) {
      const double b = bottleneck(f, cut);
      if (!best || b < *best) best = b;
    }
  return best;
}

std::optional<int64_t> bruteMinPeak(const StageCostFns& f, size_t L, int P) {
  std::optional<int64_t> best;
  for (const auto& cut : allCuts(L, P)) {
    const int64_t b = peakBytes(f, cut);
    if (!best || b < *best) best = b;
  }
  return best;
}

// P + 1 increasing boundaries from 0 to L, with bytes and bottleneck_s being
// exactly what the callbacks say for that cut.
void expectConsistent(const StageCostFns& f, size_t L, int P, const StageCut& c) {
  ASSERT_EQ(c.cuts.size(), static_cast<size_t>(P) + 1);
  EXPECT_EQ(c.cuts.front(), 0u);
  EXPECT_EQ(c.cuts.back(), L);
  for (size_t k = 0; k + 1 < c.cuts.size(); ++k) EXPECT_LT(c.cuts[k], c.cuts[k + 1]);
  ASSERT_EQ(c.bytes.size(), static_cast<size_t>(P));
  for (size_t k = 0; k < c.bytes.size(); ++k) EXPECT_EQ(c.bytes[k], stageBytes(f, c.cuts, k));
  EXPECT_EQ(c.bottleneck_s, bottleneck(f, c.cuts));
}

// A random model: per-layer compute, a send term that depends on the boundary
// layer (so extending a stage can make it faster), and memory that grows with
// min(r, M) for activations plus an extra for the first stage (embedding).
struct Instance {
  size_t L = 0;
  int max_stages = 0;
  int64_t M = 1, first_extra = 0, cap = 0;
  std::vector<double> compute, send;
  std::vector<int64_t> state, act;

  StageCostFns fns() const {
    StageCostFns f;
    f.seconds = [this](size_t i, size_t j) {
      double s = 0;
      for (size_t l = i; l < j; ++l) s += compute[l];
      if (j < L) s += send[j];
      return s;
    };
    f.bytes = [this](size_t i, size_t j, int r) {
      int64_t st = 0, ac = 0;
      for (size_t l = i; l < j; ++l) st += state[l], ac += act[l];
      return st + std::min<int64_t>(r, M) * ac + (i == 0 ? first_extra : 0);
    };
    return f;
  }
};

Instance randomInstance(std::mt19937& rng) {
  auto uni = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Instance in;
  in.L = static_cast<size_t>(uni(1, 10));
  in.max_stages = uni(0, 4);
  in.M = uni(1, 4);
  in.first_extra = uni(0, 20);
  // Half the instances use coarse values so that ties between cuts are common.
  const bool coarse = uni(0, 1) == 0;
  std::uniform_real_distribution<double> real(0.0, 3.0);
  for (size_t l = 0; l < in.L; ++l) {
    in.compute.push_back(coarse ? 0.5 * uni(0, 4) : real(rng));
    in.send.push_back(coarse ? 0.5 * uni(0, 4) : real(rng));
    in.state.push_back(uni(0, 10));
    in.act.push_back(uni(0, 10));
  }
  // Caps from "none" to "nothing fits": pick around the brute-force minimum
  // peak of a random P so that some P are feasible and others are not.
  const StageCostFns f = in.fns();
  const int P = uni(1, static_cast<int>(std::min<size_t>(in.L, 4)));
  const int64_t peak = *bruteMinPeak(f, in.L, P);
  switch (uni(0, 5)) {
    case 0: in.cap = 0; break;
    case 1: in.cap = -uni(1, 100); break;
    case 2: in.cap = 1; break;
    case 3: in.cap = peak; break;
    default: in.cap = std::max<int64_t>(1, peak + uni(-5, 15)); break;
  }
  return in;
}

// Wraps callbacks so that every distinct argument tuple's call count is kept.
struct Counted {
  std::map<std::pair<size_t, size_t>, int> seconds_calls;
  std::map<std::tuple<size_t, size_t, int>, int> bytes_calls;

  StageCostFns wrap(const StageCostFns& f) {
    StageCostFns w;
    w.seconds = [this, f](size_t i, size_t j) {
      ++seconds_calls[{i, j}];
      return f.seconds(i, j);
    };
    w.bytes = [this, f](size_t i, size_t j, int r) {
      ++bytes_calls[{i, j, r}];
      return f.bytes(i, j, r);
    };
    return w;
  }
  void expectAtMostOnce() const {
    for (const auto& [k, n] : seconds_calls)
      EXPECT_EQ(n, 1) << "seconds(" << k.first << ", " << k.second << ")";
    for (const auto& [k, n] : bytes_calls)
      EXPECT_EQ(n, 1) << "bytes(" << std::get<0>(k) << ", " << std::get<1>(k) << ", "
                      << std::get<2>(k) << ")";
  }
};

TEST(Partitioner, MatchesBruteForceOnRandomInstances) {
  std::mt19937 rng(20240611);
  int feasible = 0, infeasible = 0;
  for (int iter = 0; iter < 600; ++iter) {
    const Instance in = randomInstance(rng);
    const StageCostFns f = in.fns();
    SCOPED_TRACE("iter " + std::to_string(iter) + " L=" + std::to_string(in.L) +
                 " cap=" + std::to_string(in.cap));
    Counted counted;
    const auto got = minMaxCuts(in.L, in.max_stages, counted.wrap(f), in.cap);
    counted.expectAtMostOnce();
    ASSERT_EQ(got.size(), static_cast<size_t>(in.max_stages));
    for (int P = 1; P <= in.max_stages; ++P) {
      SCOPED_TRACE("P=" + std::to_string(P));
      const auto& cut = got[static_cast<size_t>(P) - 1];
      const auto want = bruteMinMax(f, in.L, P, in.cap);
      ASSERT_EQ(cut.has_value(), want.has_value());
      if (!want) {
        ++infeasible;
        continue;
      }
      ++feasible;
      EXPECT_EQ(cut->bottleneck_s, *want);
      expectConsistent(f, in.L, P, *cut);
      EXPECT_TRUE(fits(f, cut->cuts, in.cap));
    }
    // Same inputs, same answer; and with the early stop (a bound on
    // seconds() nondecreasing in j: the compute alone) the same cuts too.
    const auto again = minMaxCuts(in.L, in.max_stages, f, in.cap);
    StageCostFns g = f;
    g.seconds_lb = [&in](size_t i, size_t j) {
      double s = 0;
      for (size_t l = i; l < j; ++l) s += in.compute[l];
      return s;
    };
    const auto pruned = minMaxCuts(in.L, in.max_stages, g, in.cap);
    for (size_t k = 0; k < got.size(); ++k) {
      ASSERT_EQ(again[k].has_value(), got[k].has_value());
      ASSERT_EQ(pruned[k].has_value(), got[k].has_value());
      if (got[k]) {
        EXPECT_EQ(again[k]->cuts, got[k]->cuts);
        EXPECT_EQ(pruned[k]->cuts, got[k]->cuts);
        EXPECT_EQ(pruned[k]->bottleneck_s, got[k]->bottleneck_s);
      }
    }
  }
  // The generator must exercise both outcomes, or the test proves little.
  EXPECT_GT(feasible, 300);
  EXPECT_GT(infeasible, 100);
}

TEST(Partitioner, MinPeakBytesMatchesBruteForce) {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 600; ++iter) {
    const Instance in = randomInstance(rng);
    const StageCostFns f = in.fns();
    for (int P = 0; P <= 5; ++P) {
      SCOPED_TRACE("iter " + std::to_string(iter) + " L=" + std::to_string(in.L) +
                   " P=" + std::to_string(P));
      Counted counted;
      const auto cut = minPeakBytesCut(in.L, P, counted.wrap(f));
      counted.expectAtMostOnce();
      const auto want = bruteMinPeak(f, in.L, P);
      ASSERT_EQ(cut.has_value(), want.has_value());
      if (!want) continue;
      expectConsistent(f, in.L, P, *cut);
      EXPECT_EQ(*std::max_element(cut->bytes.begin(), cut->bytes.end()), *want);
    }
  }
}

StageCostFns perLayer(std::vector<double> secs, std::vector<int64_t> bytes) {
  StageCostFns f;
  f.seconds = [secs](size_t i, size_t j) {
    double s = 0;
    for (size_t l = i; l < j; ++l) s += secs[l];
    return s;
  };
  f.bytes = [bytes](size_t i, size_t j, int) {
    int64_t b = 0;
    for (size_t l = i; l < j; ++l) b += bytes[l];
    return b;
  };
  return f;
}

TEST(Partitioner, EqualLayersSplitEvenly) {
  const auto f = perLayer({1, 1, 1, 1}, {1, 1, 1, 1});
  const auto got = minMaxCuts(4, 4, f, 0);
  ASSERT_EQ(got.size(), 4u);
  ASSERT_TRUE(got[0] && got[1] && got[2] && got[3]);
  EXPECT_EQ(got[0]->cuts, (std::vector<size_t>{0, 4}));
  EXPECT_EQ(got[0]->bottleneck_s, 4.0);
  EXPECT_EQ(got[1]->cuts, (std::vector<size_t>{0, 2, 4}));
  EXPECT_EQ(got[1]->bottleneck_s, 2.0);
  EXPECT_EQ(got[1]->bytes, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(got[2]->bottleneck_s, 2.0);
  EXPECT_EQ(got[3]->cuts, (std::vector<size_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(got[3]->bottleneck_s, 1.0);
}

TEST(Partitioner, CapForcesUnevenCut) {
  // The heavy last layer cannot share a stage of two: {0, 2, 4} needs 5 bytes.
  const auto f = perLayer({1, 1, 1, 1}, {1, 1, 1, 4});
  const auto got = minMaxCuts(4, 3, f, 4);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_FALSE(got[0]);  // 7 bytes in one stage
  ASSERT_TRUE(got[1]);
  EXPECT_EQ(got[1]->cuts, (std::vector<size_t>{0, 3, 4}));
  EXPECT_EQ(got[1]->bottleneck_s, 3.0);
  EXPECT_EQ(got[1]->bytes, (std::vector<int64_t>{3, 4}));
  ASSERT_TRUE(got[2]);
  EXPECT_EQ(got[2]->bottleneck_s, 2.0);
  EXPECT_EQ(got[2]->cuts.back() - got[2]->cuts[2], 1u);  // layer 3 alone
}

TEST(Partitioner, MemoryDependsOnPositionFromTheEnd) {
  // 1F1B: the stage r-th from the end stashes r micro-batches, so the first
  // of two stages may hold one layer only while the last holds three.
  StageCostFns f;
  f.seconds = [](size_t i, size_t j) { return static_cast<double>(j - i); };
  f.bytes = [](size_t i, size_t j, int r) { return static_cast<int64_t>(j - i) * r; };
  const auto got = minMaxCuts(4, 2, f, 3);
  ASSERT_TRUE(got[1]);
  EXPECT_EQ(got[1]->cuts, (std::vector<size_t>{0, 1, 4}));
  EXPECT_EQ(got[1]->bytes, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(got[1]->bottleneck_s, 3.0);
}

TEST(Partitioner, MoreStagesThanLayersIsInfeasible) {
  const auto f = perLayer({1, 2}, {1, 1});
  const auto got = minMaxCuts(2, 4, f, 0);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_TRUE(got[0] && got[1]);
  EXPECT_FALSE(got[2]);
  EXPECT_FALSE(got[3]);
  EXPECT_TRUE(minMaxCuts(2, 0, f, 0).empty());
  for (const auto& c : minMaxCuts(0, 2, f, 0)) EXPECT_FALSE(c);
  EXPECT_FALSE(minPeakBytesCut(2, 3, f));
  EXPECT_FALSE(minPeakBytesCut(2, 0, f));
}

TEST(Partitioner, MinPeakBytesNamesTheSmallestLargestStage) {
  const auto f = perLayer({1, 1, 1, 1}, {1, 1, 1, 4});
  const auto cut = minPeakBytesCut(4, 2, f);
  ASSERT_TRUE(cut);
  EXPECT_EQ(cut->cuts, (std::vector<size_t>{0, 3, 4}));
  EXPECT_EQ(cut->bytes, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(cut->bottleneck_s, 3.0);
}

TEST(Partitioner, CallbacksEvaluatedAtMostOncePerArguments) {
  std::mt19937 rng(99);
  Instance in = randomInstance(rng);
  while (in.L < 10) in = randomInstance(rng);
  in.max_stages = 4;
  for (int64_t cap : {int64_t{0}, int64_t{1}, int64_t{150}, int64_t{1} << 40}) {
    SCOPED_TRACE("cap=" + std::to_string(cap));
    Counted counted;
    const auto got = minMaxCuts(in.L, in.max_stages, counted.wrap(in.fns()), cap);
    counted.expectAtMostOnce();
    // A DP, not an enumeration: at most one call per (i, j) pair.
    EXPECT_LE(counted.seconds_calls.size(), in.L * (in.L + 1) / 2);
    if (cap == int64_t{1} << 40) {
      EXPECT_FALSE(counted.seconds_calls.empty());
    }
  }
}

}  // namespace
}  // namespace morph
