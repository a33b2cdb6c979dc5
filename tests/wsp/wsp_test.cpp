// The WSP pieces that need no processes (docs/wsp.md): scaled fixed-point
// sums, the shard map, the pull log's decoder and a shard's clock rule.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "core/error.h"
#include "exec/fixed_point.h"
#include "wsp/param_shard.h"
#include "wsp/scaled_sum.h"
#include "wsp/wsp_log.h"

namespace morph {
namespace {

TEST(WspScaledSum, ShiftRoundsHalfToEven) {
  EXPECT_EQ(shiftRightHalfEven(5, 1), 2);    // 2.5 -> 2
  EXPECT_EQ(shiftRightHalfEven(7, 1), 4);    // 3.5 -> 4
  EXPECT_EQ(shiftRightHalfEven(-5, 1), -2);  // -2.5 -> -2
  EXPECT_EQ(shiftRightHalfEven(-7, 1), -4);
  EXPECT_EQ(shiftRightHalfEven(13, 2), 3);   // 3.25
  EXPECT_EQ(shiftRightHalfEven(14, 2), 4);   // 3.5 -> 4
  EXPECT_EQ(shiftRightHalfEven(9, 0), 9);
}

// A server's sum must not depend on the order the pushes arrived in, even
// when their scales differ (each part is shifted on its own).
TEST(WspScaledSum, SumOfPartsIsOrderFreeAtTheCoarsestScale) {
  ScaledValues a({2, 1}), b({2, 1}), c({2, 1});
  const int64_t va[] = {5, -7, 100}, vb[] = {3, 3, 1}, vc[] = {-1, 9, 2};
  const int sa[] = {4, 2}, sb[] = {3, 2}, sc[] = {4, 1};
  const double m[] = {1.0, 2.0};
  a.add(va, sa, m);
  b.add(vb, sb, m);
  c.add(vc, sc, m);
  const ScaledValues x = sumAll({&a, &b, &c}), y = sumAll({&c, &a, &b});
  EXPECT_EQ(x.values, y.values);
  EXPECT_EQ(x.scales, (std::vector<int>{3, 1}));
  // segment 0 at scale 3: 5/2 -> 2, -7/2 -> -4, 3, -1/2 -> 0 (half to even)
  EXPECT_EQ(x.values[0], 2 + 3 + 0);
  EXPECT_EQ(x.terms, 3);
}

TEST(WspShardMap, ContiguousRunsBalancedByValues) {
  const ShardMap m = ShardMap::balance({100, 10, 10, 100, 2}, 2);
  EXPECT_EQ(m.first, (std::vector<size_t>{0, 3, 5}));
  const ShardMap one = ShardMap::balance({4, 4}, 3);  // fewer segments than shards: some empty
  EXPECT_EQ(one.shards(), 3);
  EXPECT_EQ(one.end(2), 2u);
}

TEST(WspLog, RecordsRoundTripAndBadLogsNameTheFile) {
  PullRecord r{1, 0, 3, {2, 1}};
  EXPECT_EQ(r.gap(), 2);
  EXPECT_EQ(PullRecord::fromJson(r.toJson(), "x").versions, r.versions);
  const std::string log = R"({"vw":0,"pull":0,"clock":1,"versions":[1,1]}
{"vw":1,"pull":0,"clock":1,"versions":[0,1]}
)";
  const ReplayPlan p = ReplayPlan::parse(log, "log.jsonl", 2);
  EXPECT_EQ(p.per_shard[0].at(1), 1);
  EXPECT_EQ(p.per_shard[0].at(0), 1);
  EXPECT_THROW(ReplayPlan::parse(log, "log.jsonl", 3), InputError);  // another mapping
  try {
    ReplayPlan::parse("{\"vw\":0}\n", "log.jsonl", 1);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("log.jsonl"), std::string::npos) << e.what();
  }
}

// A shard of one parameter, two virtual workers: clock 0 is applied only
// with both pushes, as one SGD step of the summed gradient over the global
// batch; a pull waits for its version; under replay, clock 1 waits for the
// pulls the log says saw version 1.
TEST(WspParamShard, AppliesAClockWithEveryPushAndReplayHoldsVersions) {
  JobSpec job;
  job.global_batch = 4;
  job.virtual_nodes = 2;
  job.optim.lr = 0.5;
  job.sync_mode = SyncMode::kWsp;
  torch::Tensor w = torch::zeros({2});
  std::vector<StepCore::Segment> segs = {{StepCore::Segment::kParam, w, 0.0},
                                         {StepCore::Segment::kStats, torch::Tensor(), 0.0}};
  ParamShard shard(job, 10, 2, segs, {2, 2}, 0, 1, {4, 4});
  EXPECT_EQ(shard.pushValues(), 2 + 2 + 1);
  // scale 4, values 16 and -32 (g = 1, -2), max 2, one minibatch.
  double mx = 2.0;
  int64_t bits;
  std::memcpy(&bits, &mx, sizeof bits);
  const int64_t push[] = {4, bits, 16, -32, 1};
  shard.push(0, 0, push);
  EXPECT_EQ(shard.version(), 0);
  shard.push(1, 0, push);
  EXPECT_EQ(shard.version(), 1);
  const ParamShard::Pulled p = shard.pull(1, -1);
  // sum g = (2, -4) over B = 4: (0.5, -1); w = -lr x g.
  EXPECT_FLOAT_EQ(p.state[0], -0.25f);
  EXPECT_FLOAT_EQ(p.state[1], 0.5f);
  EXPECT_EQ(p.scales[0], scaleFor(2.0, job.headroom_bits, 51));

  shard.expectPulls({{1, 1}});  // one pull saw version 1 (the one above came before)
  shard.push(0, 1, push);
  shard.push(1, 1, push);
  EXPECT_EQ(shard.version(), 1);  // held for the logged pull of version 1
  std::thread t([&] { EXPECT_EQ(shard.pull(0, 1).version, 1); });
  t.join();
  EXPECT_EQ(shard.version(), 2);
}

}  // namespace
}  // namespace morph
