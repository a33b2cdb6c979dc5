#include "exec/grad_accumulator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <thread>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "comm/communicator.h"
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
  if (acc.bits() == 32) return {acc.exact32Buffer(), acc.exact32Buffer() + acc.totalElements()};
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
    // Storing (a segment's first VN) is adding into zeros, whatever the
    // memory held before.
    std::vector<int64_t> zero(g.size(), 0), c(g.size(), -7), d(g.size(), 11);
    quantizeAdd(g.data(), g.size(), scale, zero.data());
    QuantizeResult rc = quantizeStore(g.data(), g.size(), scale, c.data());
    QuantizeResult rd = quantizeStoreScalar(g.data(), g.size(), scale, d.data());
    if (!ra.overflow) {
      EXPECT_EQ(c, zero) << "scale " << scale;
      EXPECT_EQ(d, zero) << "scale " << scale;
    }
    EXPECT_EQ(rc.max_abs, ra.max_abs);
    EXPECT_EQ(rd.max_abs, ra.max_abs);
    EXPECT_EQ(rc.overflow, ra.overflow);
    EXPECT_EQ(rd.overflow, ra.overflow);
  }
  std::vector<int64_t> acc(2, 0);
  float ties[2] = {0.5f, -2.5f};
  quantizeAddScalar(ties, 2, 0, acc.data());
  EXPECT_EQ(acc[0], 0);   // half to even
  EXPECT_EQ(acc[1], -2);
}

// Two VNs in one pass (quantizePair*, GradAccumulator::addPair) give the
// integers of two single passes, and the flags of both inputs, on every
// length (the vector loop's tail included), with NaN, Inf and values past
// the bound in either input.
TEST(FixedPoint, PairKernelsEqualTwoSinglePasses) {
  SplitMix64 rng(11);
  for (int64_t n : {0, 1, 3, 7, 8, 9, 15, 16, 17, 31, 1031}) {
    for (int trial = 0; trial < 40; ++trial) {
      auto g = makeVnGrads(2, n, 100 * static_cast<uint64_t>(n) + static_cast<uint64_t>(trial));
      const int kind = trial % 6;
      if (n > 0 && kind == 1) g[0][rng.below(static_cast<uint64_t>(n))] = 3e9f;  // past the bound at scale 40
      if (n > 0 && kind == 2) g[1][rng.below(static_cast<uint64_t>(n))] = -INFINITY;
      if (n > 0 && kind == 3) g[0][rng.below(static_cast<uint64_t>(n))] = NAN;
      if (n > 0 && kind == 4) g[1][rng.below(static_cast<uint64_t>(n))] = NAN;
      const int scale = trial % 2 ? 40 : 3;
      const double bound = trial % 3 ? kFixedBound : std::ldexp(1.0, 44);
      std::vector<int64_t> two(static_cast<size_t>(n), 5), pair(two), pair_s(two), stored(static_cast<size_t>(n), -9);
      QuantizeResult r1 = quantizeAddScalar(g[0].data(), n, scale, two.data(), bound);
      QuantizeResult r2 = quantizeAddScalar(g[1].data(), n, scale, two.data(), bound);
      const bool overflow = r1.overflow || r2.overflow, nonfinite = r1.nonfinite || r2.nonfinite;
      QuantizeResult p = quantizePairAdd(g[0].data(), g[1].data(), n, scale, pair.data(), bound);
      QuantizeResult ps = quantizePairAddScalar(g[0].data(), g[1].data(), n, scale, pair_s.data(), bound);
      QuantizeResult st = quantizePairStore(g[0].data(), g[1].data(), n, scale, stored.data(), bound);
      const std::string at = "n " + std::to_string(n) + " trial " + std::to_string(trial);
      for (const QuantizeResult& r : {p, ps, st}) {
        EXPECT_EQ(r.overflow, overflow) << at;
        EXPECT_EQ(r.nonfinite, nonfinite) << at;
        if (!nonfinite) {
          EXPECT_EQ(r.max_abs, std::max(r1.max_abs, r2.max_abs)) << at;
        }
      }
      if (overflow) continue;  // the buffer is garbage then: the step is redone
      EXPECT_EQ(pair, two) << at;
      EXPECT_EQ(pair_s, two) << at;
      for (auto& v : stored) v += 5;
      EXPECT_EQ(stored, two) << at;
      // And the single vector kernel against the scalar one, flags included.
      std::vector<int64_t> v1(static_cast<size_t>(n), 5);
      QuantizeResult a = quantizeAdd(g[0].data(), n, scale, v1.data(), bound);
      quantizeAdd(g[1].data(), n, scale, v1.data(), bound);
      EXPECT_EQ(v1, two) << at;
      EXPECT_EQ(a.max_abs, r1.max_abs) << at;
    }
  }
  // Through the accumulator: addPair of a fresh segment stores, of a used one adds.
  auto g = makeVnGrads(4, 1000, 3);
  GradAccumulator one(std::vector<int64_t>{1000}, ReduceMode::kExact, 3), two(one);
  one.beginStep();
  two.beginStep();
  for (const auto& v : g) one.add(0, v.data());
  two.addPair(0, g[0].data(), g[1].data());
  two.addPair(0, g[2].data(), g[3].data());
  EXPECT_EQ(std::vector<int64_t>(one.exactBuffer(), one.exactBuffer() + 1000),
            std::vector<int64_t>(two.exactBuffer(), two.exactBuffer() + 1000));
  EXPECT_EQ(one.flagsAndMax(), two.flagsAndMax());
}

// Flags of the vector kernel for NaN, Inf and a value past the bound, alone.
TEST(FixedPoint, VectorKernelFlagsNanInfAndBound) {
  for (int64_t n : {8, 13, 64}) {
    for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
      for (float bad : {NAN, INFINITY, -INFINITY, 1e30f}) {
        std::vector<float> g(static_cast<size_t>(n), 0.25f);
        g[static_cast<size_t>(at)] = bad;
        std::vector<int64_t> a(static_cast<size_t>(n)), b(a);
        QuantizeResult rv = quantizeAdd(g.data(), n, 10, a.data());
        QuantizeResult rs = quantizeAddScalar(g.data(), n, 10, b.data());
        EXPECT_TRUE(rv.overflow) << n << " " << at << " " << bad;
        EXPECT_EQ(rv.nonfinite, rs.nonfinite) << n << " " << at << " " << bad;
        EXPECT_EQ(rv.nonfinite, !std::isfinite(bad));
      }
    }
  }
}

// beginStep() zeroes nothing: a segment's first add() of the step stores,
// and a segment no VN touched reads as zero and is zeroed before the
// buffer goes to a collective, though it held last step's values.
TEST(GradAccumulator, UntouchedSegmentsAreZeroWithoutAZeroingPass) {
  for (ReduceMode mode : {ReduceMode::kExact, ReduceMode::kFloat}) {
    GradAccumulator acc({5, 3}, mode, 3);
    acc.setTail(2);
    const std::vector<float> a = {1, -2, 3, -4, 5}, b = {0.5f, 0.25f, -8};
    acc.beginStep();
    acc.add(0, a.data());
    acc.add(0, a.data());
    acc.add(1, b.data());
    std::vector<float> out(5);
    acc.read(0, 2.0, out.data());
    EXPECT_EQ(out, a);
    acc.beginStep();  // the buffer still holds last step's values
    acc.add(0, a.data());
    acc.read(0, 1.0, out.data());
    EXPECT_EQ(out, a) << "the first add stores";
    std::vector<float> seg1(3, 9.0f);
    acc.read(1, 1.0, seg1.data());
    EXPECT_EQ(seg1, std::vector<float>(3, 0.0f));
    EXPECT_EQ(acc.readScalar(1, 2), 0.0);
    EXPECT_FALSE(GradAccumulator::nonfiniteOf(acc.flagsAndMax()));
    if (mode == ReduceMode::kExact) {
      const int64_t* buf = acc.exactBuffer();  // settles
      for (int64_t i = 5; i < 10; ++i) EXPECT_EQ(buf[i], 0) << "value " << i;
    } else {
      const float* buf = acc.floatBuffer();
      for (int64_t i = 5; i < 10; ++i) EXPECT_EQ(buf[i], 0.0f) << "value " << i;
    }
    acc.add(1, b.data());  // after settling: added to the zeros
    acc.read(1, 1.0, seg1.data());
    EXPECT_EQ(seg1, b);
  }
}

TEST(FixedPoint, ScaleKeepsMaximumBelowBoundWithHeadroom) {
  for (double m : {1e-12, 0.3, 1.0, 7.9, 8.0, 1e9}) {
    int s = scaleFor(m, 3);
    EXPECT_LT(m * std::ldexp(1.0, s), std::ldexp(1.0, 48));
    EXPECT_GE(m * std::ldexp(1.0, s), std::ldexp(1.0, 47));
  }
}

// Runs fn(comm, r) for each rank r of one real Gloo group of D ranks over
// loopback, each in a thread of its own; returns each rank's error ("" if
// it ran through).
std::vector<std::string> onGlooRanks(int D, const std::function<void(Communicator&, int)>& fn) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(static_cast<size_t>(D));
  std::vector<std::thread> ranks;
  for (int r = 0; r < D; ++r)
    ranks.emplace_back([&, r] {
      try {
        GlooOptions go;
        go.interface_addr = "127.0.0.1";
        auto comm = makeGlooCommunicator(c10::make_intrusive<c10d::PrefixStore>("pg", store), r, D, go);
        fn(*comm, r);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  return errors;
}

// The sharded exact sum (comm/communicator.h) over real Gloo groups of 2 to
// 4 ranks (threads, an in-memory store), fed by accumulators of 3 segments
// with their own scales and divisors: every rank reads the same floats as
// one accumulator that summed every rank's VNs itself, for run lengths that
// divide evenly, do not, and equal the group size. A run that starts past
// the buffer's first segment checks the offsets.
TEST(ShardedSum, EveryRankReadsTheFloatsOfOneAccumulatorOverAllVns) {
  for (int D : {2, 3, 4})
    for (int64_t tail : {int64_t{0}, int64_t{1}, int64_t{7}}) {
      // Segment 0 stays out of the run; the run is segments [1, 4).
      const std::vector<int64_t> sizes = {5, 1000 + tail, 3, D == 4 && tail == 7 ? int64_t{1} : int64_t{300}};
      const std::vector<double> divisors = {256.0, 256.0, 8.0};
      const int vns_per_rank = 2;
      std::vector<std::vector<std::vector<float>>> g;  // [rank][segment] VN values, vns_per_rank VNs
      for (int r = 0; r < D; ++r) {
        g.emplace_back();
        for (size_t s = 0; s < sizes.size(); ++s) {
          auto v = makeVnGrads(vns_per_rank, sizes[s], 100 * D + 10 * r + s + tail);
          std::vector<float> flat;
          for (auto& x : v) flat.insert(flat.end(), x.begin(), x.end());
          g.back().push_back(flat);
        }
      }
      auto fill = [&](GradAccumulator& acc, int r) {
        for (int k = 0; k < vns_per_rank; ++k)
          for (size_t s = 0; s < sizes.size(); ++s) acc.add(s, g[static_cast<size_t>(r)][s].data() + k * sizes[s]);
      };
      // Scales that bound these values (|g| < 2^9), one per segment.
      const int sc = scaleFor(512.0, 3);
      const std::vector<int> scales = {sc, sc - 1, sc - 5, sc};
      // The reference: one accumulator with every rank's VNs.
      GradAccumulator ref(sizes, ReduceMode::kExact, 3);
      ref.setScales(scales);
      ref.beginStep();
      for (int r = 0; r < D; ++r) fill(ref, r);
      std::vector<std::vector<float>> want;
      ASSERT_FALSE(GradAccumulator::overflowOf(ref.flagsAndMax()));
      for (size_t s = 1; s < 4; ++s) {
        want.emplace_back(static_cast<size_t>(sizes[s]));
        ref.read(s, divisors[s - 1], want.back().data());
      }
      std::vector<std::vector<std::vector<float>>> got(static_cast<size_t>(D));
      const std::vector<std::string> errors = onGlooRanks(D, [&](Communicator& comm, int r) {
        GradAccumulator acc(sizes, ReduceMode::kExact, 3);
        acc.setScales(scales);
        acc.beginStep();
        fill(acc, r);
        const int64_t off = acc.segmentOffset(1), n = acc.totalElements() - off;
        ShardScratch scratch;
        auto w = startShardedSum(comm, acc.exactBuffer() + off, n, 0, scratch,
                                 [&](int64_t begin, const int64_t* sums, int64_t len, float* out) {
                                   acc.dequantizeRange(1, 4, divisors, off + begin, sums, len, out);
                                 });
        acc.markFloats(1, 4, divisors);
        w->advance();
        w->wait();
        for (size_t s = 1; s < 4; ++s) {
          got[static_cast<size_t>(r)].emplace_back(static_cast<size_t>(sizes[s]));
          acc.read(s, divisors[s - 1], got[static_cast<size_t>(r)].back().data());
        }
      });
      for (int r = 0; r < D; ++r) {
        ASSERT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
        for (size_t s = 0; s < 3; ++s)
          EXPECT_EQ(std::memcmp(got[static_cast<size_t>(r)][s].data(), want[s].data(), want[s].size() * 4), 0)
              << D << " ranks, tail " << tail << ", rank " << r << ", segment " << s + 1;
      }
    }
}

// Several sums in flight (the buckets of one step), started, advanced and
// waited for in the same order on every rank, but with starts and advances
// interleaved differently on some ranks (as when a rank's last VN ends
// later): every sum still gets its own rank-wide total. With tags shared
// between sums, a receive took another sum's message: with 3 or more ranks
// the all-gather's forwarded chunk of one sum met the next sum's own chunk.
TEST(ShardedSum, SumsInFlightEachGetTheirOwnTotal) {
  const std::vector<int64_t> lens = {7, 300, 12, 400000};  // the last in several pieces
  auto value = [](int r, size_t s, int64_t i) { return static_cast<int64_t>((r + 1) * 1000003 + s * 7919 + i); };
  for (int D : {3, 4}) {
    std::vector<std::vector<std::vector<float>>> got(static_cast<size_t>(D));
    const std::vector<std::string> errors = onGlooRanks(D, [&](Communicator& comm, int r) {
      std::vector<std::vector<int64_t>> data(lens.size());
      std::vector<ShardScratch> scratch(lens.size());
      std::vector<std::unique_ptr<PendingWork>> work;
      auto start = [&](size_t s) {
        for (int64_t i = 0; i < lens[s]; ++i) data[s].push_back(value(r, s, i));
        work.push_back(startShardedSum(comm, data[s].data(), lens[s], 0, scratch[s],
                                       [](int64_t, const int64_t* sums, int64_t len, float* out) {
                                         for (int64_t i = 0; i < len; ++i) out[i] = static_cast<float>(sums[i]);
                                       }));
      };
      if (r % 2 == 0) {  // all started, then all advanced (the executors' way)
        for (size_t s = 0; s < lens.size(); ++s) start(s);
        for (auto& w : work) w->advance();
      } else {  // each advanced before the next starts
        for (size_t s = 0; s < lens.size(); ++s) {
          start(s);
          work.back()->advance();
        }
      }
      for (auto& w : work) w->wait();
      for (size_t s = 0; s < lens.size(); ++s) {
        const float* f = reinterpret_cast<const float*>(data[s].data());
        got[static_cast<size_t>(r)].emplace_back(f, f + lens[s]);
      }
    });
    for (int r = 0; r < D; ++r) {
      ASSERT_EQ(errors[static_cast<size_t>(r)], "") << D << " ranks, rank " << r;
      for (size_t s = 0; s < lens.size(); ++s)
        for (int64_t i = 0; i < lens[s]; ++i) {
          int64_t sum = 0;
          for (int q = 0; q < D; ++q) sum += value(q, s, i);
          ASSERT_EQ(got[static_cast<size_t>(r)][s][static_cast<size_t>(i)], static_cast<float>(sum))
              << D << " ranks, rank " << r << ", sum " << s << ", value " << i;
        }
    }
  }
}

// The last `keep` values of a sharded sum stay integers, summed bit for bit
// (a step's loss statistics and the slots whose doubles' bits ride in
// them), while the values before them become floats: with the kept values
// inside the last chunk, spanning several chunks, and all of them.
TEST(ShardedSum, KeptValuesStayIntegersAndTheRestBecomeFloats) {
  struct Case {
    int64_t n, keep;
  };
  const std::vector<Case> cases = {{300, 5}, {13, 9}, {400000, 70}, {8, 8}};
  auto value = [](int r, int64_t i) {
    // Rank 0's kept values are a double's bits, the others' zero (a slot).
    if (i % 3 == 0) return r == 0 ? static_cast<int64_t>(0x400921FB54442D18LL + i) : int64_t{0};
    return static_cast<int64_t>((r + 1) * 1000003 + i * 7919 - 5000000);
  };
  for (int D : {2, 3, 4}) {
    std::vector<std::vector<std::vector<int64_t>>> got(static_cast<size_t>(D));
    const std::vector<std::string> errors = onGlooRanks(D, [&](Communicator& comm, int r) {
      std::vector<std::vector<int64_t>> data(cases.size());
      std::vector<ShardScratch> scratch(cases.size());
      std::vector<std::unique_ptr<PendingWork>> work;
      for (size_t c = 0; c < cases.size(); ++c) {
        for (int64_t i = 0; i < cases[c].n; ++i) data[c].push_back(value(r, i));
        work.push_back(startShardedSum(comm, data[c].data(), cases[c].n, cases[c].keep, scratch[c],
                                       [](int64_t, const int64_t* sums, int64_t len, float* out) {
                                         for (int64_t i = 0; i < len; ++i) out[i] = static_cast<float>(sums[i]);
                                       }));
      }
      for (auto& w : work) w->advance();
      for (auto& w : work) w->wait();
      got[static_cast<size_t>(r)] = data;
    });
    for (int r = 0; r < D; ++r) {
      ASSERT_EQ(errors[static_cast<size_t>(r)], "") << D << " ranks, rank " << r;
      for (size_t c = 0; c < cases.size(); ++c) {
        const std::vector<int64_t>& d = got[static_cast<size_t>(r)][c];
        const float* f = reinterpret_cast<const float*>(d.data());
        for (int64_t i = 0; i < cases[c].n; ++i) {
          int64_t sum = 0;
          for (int q = 0; q < D; ++q) sum += value(q, i);
          if (i < cases[c].n - cases[c].keep) {
            ASSERT_EQ(f[i], static_cast<float>(sum)) << D << " ranks, rank " << r << ", case " << c << ", value " << i;
          } else {
            ASSERT_EQ(d[static_cast<size_t>(i)], sum) << D << " ranks, rank " << r << ", case " << c << ", value " << i;
          }
        }
      }
    }
  }
}

// read() of a sharded run's floats with another divisor than the sum used
// is a bug in the caller, caught.
TEST(ShardedSum, ReadingWithAnotherDivisorIsCaught) {
  GradAccumulator acc({4, 4}, ReduceMode::kExact, 3);
  acc.beginStep();
  acc.markFloats(0, 2, {256.0, 8.0});
  std::vector<float> out(4);
  EXPECT_ANY_THROW(acc.read(0, 8.0, out.data()));
  EXPECT_NO_THROW(acc.read(1, 8.0, out.data()));
  acc.beginStep();  // marks last one attempt
  EXPECT_NO_THROW(acc.read(0, 8.0, out.data()));
}

// A Gloo group that counts the point-to-point transfers started on it.
class CountingComm : public Communicator {
 public:
  explicit CountingComm(Communicator& c) : c_(c) {}
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  void allreduceMax(double* d, int64_t n) override { c_.allreduceMax(d, n); }
  void broadcast(torch::Tensor& t, int root) override { c_.broadcast(t, root); }
  std::unique_ptr<PendingWork> allreduceSumAsync(int64_t* d, int64_t n) override { return c_.allreduceSumAsync(d, n); }
  std::unique_ptr<PendingWork> allreduceSumAsync(float* d, int64_t n) override { return c_.allreduceSumAsync(d, n); }
  std::unique_ptr<PendingWork> allreduceSumAsync(int32_t* d, int64_t n) override { return c_.allreduceSumAsync(d, n); }
  std::unique_ptr<PendingWork> send(torch::Tensor t, int peer, int tag) override {
    ++sends;
    return c_.send(std::move(t), peer, tag);
  }
  std::unique_ptr<PendingWork> recv(torch::Tensor t, int peer, int tag) override {
    ++recvs;
    return c_.recv(std::move(t), peer, tag);
  }
  int sends = 0, recvs = 0;

 private:
  Communicator& c_;
};

// Two ranks pass nothing on in either ring, so a sharded sum sends each
// chunk whole: one transfer each way for the reduce-scatter and one for
// the all-gather's floats, and one of the kept integers (they are in the
// last chunk), in both formats, for a bucket that 3 ranks still send in several pieces (there a
// piece is passed on while the rest arrives). The sums stay right.
TEST(ShardedSum, TwoRanksSendEachChunkWhole) {
  const int64_t n = 400000, keep = 5;
  auto value = [](int r, int64_t i) { return static_cast<int64_t>((r + 1) * 1009 + i % 7919); };
  for (int D : {2, 3})
    for (int bits : {64, 32}) {
      std::vector<std::pair<int, int>> transfers(static_cast<size_t>(D));
      std::vector<std::vector<float>> got(static_cast<size_t>(D));
      const std::vector<std::string> errors = onGlooRanks(D, [&](Communicator& gloo, int r) {
        CountingComm comm(gloo);
        ShardScratch scratch;
        std::vector<int64_t> d64;
        std::vector<int32_t> d32;
        for (int64_t i = 0; i < n; ++i) {
          d64.push_back(value(r, i));
          d32.push_back(static_cast<int32_t>(value(r, i)));
        }
        auto work = bits == 64 ? startShardedSum(comm, d64.data(), n, keep, scratch,
                                                 [](int64_t, const int64_t* s, int64_t len, float* out) {
                                                   for (int64_t i = 0; i < len; ++i) out[i] = static_cast<float>(s[i]);
                                                 })
                               : startShardedSum(comm, d32.data(), n, keep, scratch,
                                                 [](int64_t, const int32_t* s, int64_t len, float* out) {
                                                   for (int64_t i = 0; i < len; ++i) out[i] = static_cast<float>(s[i]);
                                                 });
        work->wait();
        const float* f = bits == 64 ? reinterpret_cast<const float*>(d64.data())
                                    : reinterpret_cast<const float*>(d32.data());
        got[static_cast<size_t>(r)].assign(f, f + (n - keep));
        transfers[static_cast<size_t>(r)] = {comm.sends, comm.recvs};
      });
      for (int r = 0; r < D; ++r) {
        ASSERT_EQ(errors[static_cast<size_t>(r)], "") << D << " ranks, " << bits << " bits, rank " << r;
        const auto [sends, recvs] = transfers[static_cast<size_t>(r)];
        if (D == 2) {
          // The reduce-scatter's one each way; the all-gather's floats each
          // way, and the kept integers from the last chunk's owner (rank 0).
          EXPECT_EQ(sends, r == 0 ? 3 : 2) << bits << " bits, rank " << r;
          EXPECT_EQ(recvs, r == 0 ? 2 : 3) << bits << " bits, rank " << r;
        } else {
          EXPECT_GT(sends, 2 * (D - 1) + 1) << bits << " bits, rank " << r << ": pieces to pass on";
        }
        for (int64_t i = 0; i < n - keep; i += 997) {
          int64_t sum = 0;
          for (int q = 0; q < D; ++q) sum += value(q, i);
          ASSERT_EQ(got[static_cast<size_t>(r)][static_cast<size_t>(i)], static_cast<float>(sum))
              << D << " ranks, " << bits << " bits, rank " << r << ", value " << i;
        }
      }
    }
}

// --- The 32-bit format (reduce.bits = 32, issue 31) --------------------------

// By construction: for every VN count the exact mode allows, V values each
// at the bound sum below 2^31 (every partial sum of a step fits in int32).
TEST(Exact32, EveryVnCountsSumsOfBoundedValuesFitInInt32) {
  for (int64_t V = 1; V <= 4096; ++V) {
    ASSERT_LE(static_cast<double>(V) * fixedBound(32, V), std::ldexp(1.0, 31) - 1) << V << " VNs";
    ASSERT_GE(fixedTop(32, V), 18) << V << " VNs";  // at least 18 bits for the largest value
  }
  EXPECT_EQ(fixedBound(64, 4096), kFixedBound);
  EXPECT_EQ(fixedTop(32, 1), 30);
  EXPECT_EQ(fixedTop(32, 8), 27);
  EXPECT_EQ(fixedTop(32, 9), 26);
}

// The largest gradients the bound allows, fed to many VNs, all of one sign
// (the worst case) and of alternating signs: no overflow is flagged, the
// int32 buffer's sums are V times the rounded value (had any partial sum
// left int32, the wrapped sum would differ). A value at the bound is
// flagged.
TEST(Exact32, LargestAllowedGradientsOfManyVnsSumWithoutOverflow) {
  for (int64_t V : {int64_t{1}, int64_t{3}, int64_t{8}, int64_t{100}, int64_t{256}, int64_t{1000}, int64_t{4096}}) {
    const int s = 7;
    const double bound = fixedBound(32, V);
    // The largest float below the bound at scale s.
    const float big = std::nextafter(static_cast<float>(std::ldexp(bound, -s)), 0.0f);
    ASSERT_LT(std::ldexp(static_cast<double>(big), s), bound);
    GradAccumulator acc(std::vector<int64_t>{4}, ReduceMode::kExact, 0, 32, V);
    acc.setScales({s});
    acc.beginStep();
    for (int64_t v = 0; v < V; ++v) {
      const float g[4] = {big, -big, v % 2 ? big : -big, v == 0 ? big : 0.0f};
      acc.add(0, g);
    }
    const std::vector<double> f = acc.flagsAndMax();
    ASSERT_FALSE(GradAccumulator::overflowOf(f)) << V << " VNs";
    const int64_t q = static_cast<int64_t>(std::nearbyint(std::ldexp(static_cast<double>(big), s)));
    const int32_t* sums = acc.exact32Buffer();
    EXPECT_EQ(int64_t{sums[0]}, V * q) << V << " VNs";
    EXPECT_EQ(int64_t{sums[1]}, -V * q) << V << " VNs";
    EXPECT_EQ(int64_t{sums[2]}, V % 2 ? -q : 0) << V << " VNs";  // VN 0 has -big
    EXPECT_EQ(int64_t{sums[3]}, q) << V << " VNs";
    // At the bound: flagged (the step is redone with the exact maxima).
    GradAccumulator over(std::vector<int64_t>{1}, ReduceMode::kExact, 0, 32, V);
    over.setScales({s});
    over.beginStep();
    const float at = static_cast<float>(std::ldexp(bound, -s));
    over.add(0, &at);
    EXPECT_TRUE(GradAccumulator::overflowOf(over.flagsAndMax())) << V << " VNs";
    // The redo's scale (from the exact maximum, headroom 0) takes it.
    over.updateScales(over.flagsAndMax());
    over.beginStep();
    over.add(0, &at);
    EXPECT_FALSE(GradAccumulator::overflowOf(over.flagsAndMax())) << V << " VNs";
  }
}

// The int32 buffer (reduce.bits = 32) holds what the int64 kernels' sums
// narrowed to int32 held before it (narrowTo32): on random gradients up to
// the bound, singly and in pairs, stored and added, over lengths that end
// in the AVX2 loop's scalar tail; and bit for bit modulo 2^32 even where a
// term is past the bound (the step is redone then, but no path differs).
// The floats read() gives and the flags are the same as from the int64
// sums.
TEST(Exact32, Int32BufferHoldsTheNarrowedInt64Sums) {
  SplitMix64 rng(31);
  for (int64_t V : {int64_t{2}, int64_t{8}, int64_t{12}, int64_t{64}}) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{301}, int64_t{4099}}) {
      for (bool past : {false, true}) {
        const int s = 20;
        const double bound = fixedBound(32, V);
        const double top = std::ldexp(bound, -s);  // |g| below this fits
        std::vector<std::vector<float>> g(static_cast<size_t>(V), std::vector<float>(static_cast<size_t>(n)));
        for (auto& v : g)
          for (auto& x : v) {
            // Near the bound: the largest values a step keeps.
            x = static_cast<float>((rng.uniform() * 2.0 - 1.0) * top * (rng.below(4) == 0 ? 1.0 : 0.001));
            if (std::fabs(x) >= top) x = std::nextafter(static_cast<float>(top), 0.0f);
          }
        if (past) g[1][static_cast<size_t>(n) / 2] = static_cast<float>(top * 3.5);  // past the bound
        GradAccumulator acc(std::vector<int64_t>{n}, ReduceMode::kExact, 0, 32, V);
        acc.setScales({s});
        acc.beginStep();
        std::vector<int64_t> ref(static_cast<size_t>(n));
        bool ref_overflow = false;
        // VN 0 stores, then pairs (stored into a fresh accumulator's
        // second segment below), then singles added.
        for (int64_t v = 0; v < V; ++v) {
          const float* a = g[static_cast<size_t>(v)].data();
          if (v % 3 == 1 && v + 1 < V) {
            const float* b = g[static_cast<size_t>(v + 1)].data();
            acc.addPair(0, a, b);
            ref_overflow = quantizePairAdd(a, b, n, s, ref.data(), bound).overflow || ref_overflow;
            ++v;
          } else {
            acc.add(0, a);
            ref_overflow = (v == 0 ? quantizeStore(a, n, s, ref.data(), bound) : quantizeAdd(a, n, s, ref.data(), bound))
                               .overflow ||
                           ref_overflow;
          }
        }
        const std::vector<double> f = acc.flagsAndMax();
        ASSERT_EQ(GradAccumulator::overflowOf(f), ref_overflow);
        ASSERT_EQ(ref_overflow, past) << V << " VNs, n " << n;
        std::vector<int32_t> narrowed(static_cast<size_t>(n));
        narrowTo32(ref.data(), n, narrowed.data());
        const int32_t* got = acc.exact32Buffer();
        ASSERT_EQ(0, std::memcmp(got, narrowed.data(), static_cast<size_t>(n) * 4))
            << V << " VNs, n " << n << ", past the bound " << past;
        if (past) continue;
        std::vector<float> want(static_cast<size_t>(n)), out(static_cast<size_t>(n));
        dequantize(ref.data(), n, s, 256.0, want.data());
        acc.read(0, 256.0, out.data());
        ASSERT_EQ(0, std::memcmp(out.data(), want.data(), static_cast<size_t>(n) * 4)) << V << " VNs, n " << n;
        // A pair stored first, and the portable kernels: the same bits.
        GradAccumulator pair(std::vector<int64_t>{n}, ReduceMode::kExact, 0, 32, V);
        pair.setScales({s});
        pair.beginStep();
        pair.addPair(0, g[0].data(), g[1].data());
        std::vector<int64_t> ref2(static_cast<size_t>(n), 0);
        quantizePairAddScalar(g[0].data(), g[1].data(), n, s, ref2.data(), bound);
        std::vector<int32_t> scalar32(static_cast<size_t>(n), 0);
        quantizePairAddScalar(g[0].data(), g[1].data(), n, s, scalar32.data(), bound);
        quantizeAddScalar(g[2 % V].data(), n, s, scalar32.data(), bound);
        quantizeAddScalar(g[2 % V].data(), n, s, ref2.data(), bound);
        pair.add(0, g[2 % V].data());
        narrowTo32(ref2.data(), n, narrowed.data());
        ASSERT_EQ(0, std::memcmp(pair.exact32Buffer(), narrowed.data(), static_cast<size_t>(n) * 4))
            << V << " VNs, n " << n;
        ASSERT_EQ(0, std::memcmp(scalar32.data(), narrowed.data(), static_cast<size_t>(n) * 4))
            << V << " VNs, n " << n;
      }
    }
  }
}

// The 32-bit sum is order independent too, and within its resolution (one
// quantum of the agreed scale per VN) of the float64 sum.
TEST(Exact32, SumIsOrderIndependentAndWithinItsResolution) {
  const int vns = 8;
  const int64_t n = 1003;
  auto g = makeVnGrads(vns, n, 17);
  std::vector<int> order(vns), reversed(vns);
  std::iota(order.begin(), order.end(), 0);
  std::iota(reversed.rbegin(), reversed.rend(), 0);
  GradAccumulator a(std::vector<int64_t>{n}, ReduceMode::kExact, 3, 32, vns);
  GradAccumulator b(std::vector<int64_t>{n}, ReduceMode::kExact, 3, 32, vns);
  int attempts;
  accumulate(a, g, order, &attempts);  // settles the scale
  auto ra = accumulate(a, g, order, &attempts);
  EXPECT_EQ(attempts, 1);
  accumulate(b, g, reversed, &attempts);
  EXPECT_EQ(accumulate(b, g, reversed, &attempts), ra);
  std::vector<float> mean(n);
  a.read(0, vns, mean.data());
  const double quantum = std::ldexp(1.0, -a.scales()[0]);
  for (int64_t i = 0; i < n; ++i) {
    double ref = 0;
    for (int v = 0; v < vns; ++v) ref += g[v][i];
    ref /= vns;
    ASSERT_NEAR(mean[i], ref, std::fabs(ref) * 0x1p-23 + quantum / 2) << "element " << i;
  }
}

// Any int64 values (doubles' bits in slots, loss sums) go through int32
// sums exactly as 16-bit lanes: 4096 summands, as many as exact mode's VNs.
TEST(Exact32, LanesCarryInt64SumsThroughInt32Sums) {
  SplitMix64 rng(99);
  const int64_t k = 5, W = 4096;
  std::vector<int32_t> lane_sums(static_cast<size_t>(4 * k), 0);
  std::vector<uint64_t> want(static_cast<size_t>(k), 0);
  std::vector<int32_t> lanes(static_cast<size_t>(4 * k));
  for (int64_t w = 0; w < W; ++w) {
    std::vector<int64_t> v(static_cast<size_t>(k));
    for (auto& x : v) x = static_cast<int64_t>(rng.next());
    v[0] = w == 7 ? static_cast<int64_t>(0x400921FB54442D18LL) : 0;  // a slot: one writer
    v[1] = -1;                                                      // carries through every lane
    splitLanes(v.data(), k, lanes.data());
    for (int64_t i = 0; i < 4 * k; ++i) {
      ASSERT_GE(lanes[static_cast<size_t>(i)], 0);
      const int64_t sum = int64_t{lane_sums[static_cast<size_t>(i)]} + lanes[static_cast<size_t>(i)];
      ASSERT_LE(sum, int64_t{INT32_MAX});  // no int32 overflow in the lanes
      lane_sums[static_cast<size_t>(i)] = static_cast<int32_t>(sum);
    }
    for (int64_t i = 0; i < k; ++i) want[static_cast<size_t>(i)] += static_cast<uint64_t>(v[static_cast<size_t>(i)]);
  }
  std::vector<int64_t> got(static_cast<size_t>(k));
  joinLanes(lane_sums.data(), k, got.data());
  for (int64_t i = 0; i < k; ++i) EXPECT_EQ(static_cast<uint64_t>(got[static_cast<size_t>(i)]), want[static_cast<size_t>(i)]) << i;
  EXPECT_EQ(got[0], static_cast<int64_t>(0x400921FB54442D18LL));
  EXPECT_EQ(got[1], -W);
}

// startSum32's wire over real Gloo groups of 2-4 ranks: each rank's
// 32-bit accumulator's int32 values plus kept int64 values as lanes; the
// int32 sharded sum gives every rank the floats of one accumulator over all
// VNs and the kept values' int64 sums; so does the int32 all-reduce.
TEST(ShardedSum, Int32WireReadsTheFloatsOfOneAccumulatorAndKeepsLanes) {
  for (int D : {2, 3, 4}) {
    const std::vector<int64_t> sizes = {1000, 3, 301};
    const std::vector<double> divisors = {256.0, 256.0, 8.0};
    const int vns_per_rank = 2;
    const int64_t V = vns_per_rank * D, keep = 3;
    std::vector<std::vector<std::vector<float>>> g;
    for (int r = 0; r < D; ++r) {
      g.emplace_back();
      for (size_t s = 0; s < sizes.size(); ++s) {
        auto v = makeVnGrads(vns_per_rank, sizes[s], 300 * D + 10 * r + s);
        std::vector<float> flat;
        for (auto& x : v) flat.insert(flat.end(), x.begin(), x.end());
        g.back().push_back(flat);
      }
    }
    auto kept = [](int r, int64_t i) { return i == 0 ? int64_t{-123456789012345} * (r + 1) : (i == 1 && r == 1 ? int64_t{0x400921FB54442D18LL} : int64_t{0}); };
    auto fill = [&](GradAccumulator& acc, int r) {
      for (int k = 0; k < vns_per_rank; ++k)
        for (size_t s = 0; s < sizes.size(); ++s) acc.add(s, g[static_cast<size_t>(r)][s].data() + k * sizes[s]);
    };
    const int sc = scaleFor(512.0, 3, fixedTop(32, V));
    const std::vector<int> scales = {sc, sc - 2, sc};
    GradAccumulator ref(sizes, ReduceMode::kExact, 3, 32, V);
    ref.setScales(scales);
    ref.beginStep();
    for (int r = 0; r < D; ++r) fill(ref, r);
    ASSERT_FALSE(GradAccumulator::overflowOf(ref.flagsAndMax()));
    std::vector<std::vector<float>> want;
    for (size_t s = 0; s < 3; ++s) {
      want.emplace_back(static_cast<size_t>(sizes[s]));
      ref.read(s, divisors[s], want.back().data());
    }
    for (bool sharded : {true, false}) {
      std::vector<std::vector<std::vector<float>>> got(static_cast<size_t>(D));
      std::vector<std::vector<int64_t>> got_kept(static_cast<size_t>(D));
      const std::vector<std::string> errors = onGlooRanks(D, [&](Communicator& comm, int r) {
        GradAccumulator acc(sizes, ReduceMode::kExact, 3, 32, V);
        acc.setScales(scales);
        acc.beginStep();
        fill(acc, r);
        const int64_t n = acc.totalElements();
        std::vector<int64_t> k64(static_cast<size_t>(keep));
        for (int64_t i = 0; i < keep; ++i) k64[static_cast<size_t>(i)] = kept(r, i);
        ShardScratch scratch;
        std::vector<int32_t> wire(static_cast<size_t>(n + 4 * keep));
        std::memcpy(wire.data(), acc.exact32Buffer(), static_cast<size_t>(n) * 4);
        splitLanes(k64.data(), keep, wire.data() + n);
        std::vector<float> floats(static_cast<size_t>(n));
        if (sharded) {
          auto w = startShardedSum(comm, wire.data(), n + 4 * keep, 4 * keep, scratch,
                                   [&](int64_t begin, const int32_t* sums, int64_t len, float* out) {
                                     acc.dequantizeRange(0, 3, divisors, begin, sums, len, out);
                                   });
          w->advance();
          w->wait();
          std::memcpy(floats.data(), wire.data(), static_cast<size_t>(n) * 4);
        } else {
          comm.allreduceSumAsync(wire.data(), n + 4 * keep)->wait();
          acc.dequantizeRange(0, 3, divisors, 0, wire.data(), n, floats.data());
        }
        joinLanes(wire.data() + n, keep, k64.data());
        got_kept[static_cast<size_t>(r)] = k64;
        for (size_t s = 0; s < 3; ++s) {
          const float* f = floats.data() + acc.segmentOffset(s);
          got[static_cast<size_t>(r)].emplace_back(f, f + sizes[s]);
        }
      });
      for (int r = 0; r < D; ++r) {
        ASSERT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
        for (size_t s = 0; s < 3; ++s)
          EXPECT_EQ(std::memcmp(got[static_cast<size_t>(r)][s].data(), want[s].data(), want[s].size() * 4), 0)
              << D << " ranks, sharded " << sharded << ", rank " << r << ", segment " << s;
        for (int64_t i = 0; i < keep; ++i) {
          int64_t sum = 0;
          for (int q = 0; q < D; ++q) sum += kept(q, i);
          EXPECT_EQ(got_kept[static_cast<size_t>(r)][static_cast<size_t>(i)], sum)
              << D << " ranks, sharded " << sharded << ", rank " << r << ", kept " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace morph
