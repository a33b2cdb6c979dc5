// The WSP pieces that need no processes (docs/wsp.md): scaled fixed-point
// sums, the shard map, the pull log's decoder, a shard's clock rule and the
// virtual workers' VN shares by device speed.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "exec/fixed_point.h"
#include "exec/optimizer.h"
#include "wsp/own_pushes.h"
#include "wsp/packed_ints.h"
#include "wsp/param_shard.h"
#include "wsp/scaled_sum.h"
#include "comm/communicator.h"
#include "wsp/wsp_log.h"
#include "wsp/wsp_recovery.h"
#include "plan/profile.h"
#include "plan/resources.h"
#include "plan/vn_shares.h"

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

// A push on the wire (packed_ints.h): every int64, the extremes included,
// comes back as it went, for any length; a block of zeros costs its width
// byte; a wave sum's typical values (zeros and 40-odd-bit values) pack to
// well under 8 bytes a value; a packing that is cut short, has bytes left
// over, a width above 64 or padding that is not zero is refused.
TEST(WspPackedInts, RoundTripsEveryInt64AndRefusesMalformedPackings) {
  std::vector<int64_t> v = {0, 1, -1, 2, -2, INT64_MAX, INT64_MIN, INT64_MAX - 1, INT64_MIN + 1,
                            int64_t{1} << 40, -(int64_t{1} << 40), 12345, -67890};
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < 300; ++i) {  // random widths: every bit count from 0 to 64
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    const int w = i % 65;
    v.push_back(static_cast<int64_t>(w == 0 ? 0 : x >> (64 - w)) * (i % 3 == 0 ? -1 : 1));
  }
  for (int64_t n : {int64_t{0}, int64_t{1}, kPackBlock - 1, kPackBlock, kPackBlock + 1, static_cast<int64_t>(v.size())}) {
    std::vector<uint8_t> packed;
    packInts(v.data(), n, packed);
    EXPECT_LE(static_cast<int64_t>(packed.size()), packedBytesAtMost(n));
    std::vector<int64_t> back(static_cast<size_t>(n), 7);
    unpackInts(packed.data(), static_cast<int64_t>(packed.size()), back.data(), n);
    EXPECT_EQ(back, std::vector<int64_t>(v.begin(), v.begin() + n)) << n << " values";
  }
  // A block's width is its widest value's: INT64_MIN zigzags to all ones.
  std::vector<uint8_t> one;
  const int64_t extremes[] = {INT64_MIN};
  packInts(extremes, 1, one);
  EXPECT_EQ(one, (std::vector<uint8_t>{64, 255, 255, 255, 255, 255, 255, 255, 255}));
  // 1000 zeros: a width byte per block.
  std::vector<uint8_t> zeros;
  const std::vector<int64_t> z(1000, 0);
  packInts(z.data(), 1000, zeros);
  EXPECT_EQ(static_cast<int64_t>(zeros.size()), (1000 + kPackBlock - 1) / kPackBlock);
  // Half zeros, half values below 2^42: under 3 bytes a value (8 unpacked).
  std::vector<int64_t> wave(4096, 0);
  for (size_t i = 2048; i < wave.size(); ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    wave[i] = static_cast<int64_t>(x >> 23) - (int64_t{1} << 40);
  }
  std::vector<uint8_t> wp;
  packInts(wave.data(), 4096, wp);
  EXPECT_LT(wp.size(), 3u * 4096);
  // Malformed packings.
  std::vector<uint8_t> good;
  packInts(v.data(), 40, good);
  std::vector<int64_t> out(40);
  std::vector<uint8_t> cut(good.begin(), good.end() - 1), more = good, wide = good, pad = {1, 0x02};
  more.push_back(0);
  wide[0] = 65;
  EXPECT_THROW(unpackInts(cut.data(), static_cast<int64_t>(cut.size()), out.data(), 40), InternalError);
  EXPECT_THROW(unpackInts(more.data(), static_cast<int64_t>(more.size()), out.data(), 40), InternalError);
  EXPECT_THROW(unpackInts(wide.data(), static_cast<int64_t>(wide.size()), out.data(), 40), InternalError);
  // One value of width 1 (the byte's low bit) with a stray bit set above it.
  EXPECT_THROW(unpackInts(pad.data(), 2, out.data(), 1), InternalError);
  const uint8_t ok[] = {1, 0x01};
  unpackInts(ok, 2, out.data(), 1);
  EXPECT_EQ(out[0], -1);
}

TEST(WspShardPieces, OneLargeTensorIsSplitAtAlignedCuts) {
  // The CNN's shape: a small tensor, one of 95% of the values, two small.
  // Sizes 352, 18560, 401408, 1290: 421610 values.
  // 4 shards: goals 105402, 210805, 316207, all inside segment 2 (it starts
  // at 18912): offsets 86490, 191893, 297295 -> nearest multiples of 4096:
  // 86016 (21 x 4096), 192512 (47 x), 299008 (73 x).
  const ShardPieces p = ShardPieces::cut({352, 18560, 401408, 1290}, 4, 4096);
  EXPECT_EQ(p.segment, (std::vector<size_t>{0, 1, 2, 2, 2, 2, 3}));
  EXPECT_EQ(p.offset, (std::vector<int64_t>{0, 0, 0, 86016, 192512, 299008, 0}));
  EXPECT_EQ(p.size, (std::vector<int64_t>{352, 18560, 86016, 106496, 106496, 102400, 1290}));
  EXPECT_EQ(p.map.first, (std::vector<size_t>{0, 3, 4, 5, 7}));
  // Shard values: 104928, 106496, 106496, 103690 (runs of whole tensors: 420320, 0, 0, 1290).
  // A cut rounds to the nearest multiple from its tensor's start: goal 60
  // of {10, 10, 100} is at 40 in segment 2, which 4096 rounds to 0 (the
  // tensor's start: no piece) and 8 keeps (a cut at 40).
  const ShardPieces q = ShardPieces::cut({10, 10, 100}, 2, 4096);
  EXPECT_EQ(q.size, (std::vector<int64_t>{10, 10, 100}));
  EXPECT_EQ(q.map.first, (std::vector<size_t>{0, 2, 3}));
  const ShardPieces r = ShardPieces::cut({10, 10, 100}, 2, 8);
  EXPECT_EQ(r.offset, (std::vector<int64_t>{0, 0, 0, 40}));
  EXPECT_EQ(r.size, (std::vector<int64_t>{10, 10, 40, 60}));
  EXPECT_EQ(r.map.first, (std::vector<size_t>{0, 3, 4}));
  // ... or to its end when the multiple is past it: goal 60 of {62, 58}
  // at 60, 64 > 62.
  const ShardPieces e = ShardPieces::cut({62, 58}, 2, 64);
  EXPECT_EQ(e.size, (std::vector<int64_t>{62, 58}));
  EXPECT_EQ(e.map.first, (std::vector<size_t>{0, 1, 2}));
  // One tensor cut in three (goals 200 and 400 of 600; align 64: 192, 384).
  const ShardPieces t = ShardPieces::cut({600}, 3, 64);
  EXPECT_EQ(t.offset, (std::vector<int64_t>{0, 192, 384}));
  EXPECT_EQ(t.size, (std::vector<int64_t>{192, 192, 216}));
  EXPECT_EQ(t.map.first, (std::vector<size_t>{0, 1, 2, 3}));
  // Fewer values than shards x align: goals 2 and 5 round to 0 and 4, shard 0 is empty.
  const ShardPieces one = ShardPieces::cut({4, 4}, 3, 4096);
  EXPECT_EQ(one.map.first, (std::vector<size_t>{0, 0, 1, 2}));
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

// The log of a run that lost a worker starts with its restore record; the
// record is nowhere else.
TEST(WspLog, RestoreRecordLeadsTheLogOfARegroupedRun) {
  const RestoreRecord r{1, 8, "/x/step-000000000008"};
  const std::string rec = R"({"vw":0,"pull":0,"clock":9,"versions":[9,9]}
{"vw":1,"pull":0,"clock":9,"versions":[8,9]}
)";
  const ReplayPlan p = ReplayPlan::parse(r.toJson().dump() + "\n" + rec, "log.jsonl", 2);
  ASSERT_TRUE(p.restored.has_value());
  EXPECT_EQ(p.restored->clock, 8);
  EXPECT_EQ(p.restored->checkpoint, r.checkpoint);
  EXPECT_EQ(p.per_shard[0].at(8), 1);
  EXPECT_FALSE(ReplayPlan::parse(rec, "log.jsonl", 2).restored.has_value());
  EXPECT_THROW(ReplayPlan::parse(rec + r.toJson().dump() + "\n", "log.jsonl", 2), InputError);
  EXPECT_THROW(ReplayPlan::parse(R"({"restored":{"clock":-1}})", "log.jsonl", 2), InputError);
}

// docs/wsp.md, "VN shares by device speed": even without a resources file;
// with one, each VN to the device that would finish it first, every VW at
// least one, by worker slot (a regroup's survivors keep their devices'
// speeds; a slot past the file counts as its fastest device).
TEST(WspShares, EvenWithoutDevicesAndSizedBySpeedWithThem) {
  const std::vector<double> none;
  EXPECT_EQ(wspShares(12, none, {0, 1, 2, 3, 4}), evenShares(12, 5));
  EXPECT_EQ(wspShares(8, {1.0, 2.0}, {0, 1}), (std::vector<int64_t>{6, 2}));  // 6 and 4 VN-times (5 + 3: 5 and 6)
  EXPECT_EQ(wspShares(4, {1.0, 2.0}, {0, 1}), (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(wspShares(12, {1.0, 3.0}, {0, 1}), (std::vector<int64_t>{9, 3}));
  EXPECT_EQ(wspShares(12, {1.0, 3.0}, {1, 0}), (std::vector<int64_t>{3, 9}));  // rank order of the slots
  EXPECT_EQ(wspShares(4, {1.0, 100.0}, {0, 1}), (std::vector<int64_t>{3, 1}));  // at least one each
  EXPECT_EQ(wspShares(9, {1.0, 4.0, 2.0}, {0, 2}), (std::vector<int64_t>{6, 3}));  // survivors 0 and 2
  EXPECT_EQ(wspShares(8, {2.0, 4.0}, {1, 5}), (std::vector<int64_t>{3, 5}));  // slot 5: as the fastest
  for (int64_t vns : {5, 12, 13})
    EXPECT_EQ(wspShares(vns, {1.5, 1.5, 1.5}, {0, 1, 2}), evenShares(vns, 3)) << vns;  // equal devices: even
  EXPECT_THROW(wspShares(2, none, {0, 1, 2}), InputError);
  EXPECT_THROW(wspShares(2, {1.0, 1.0, 1.0}, {0, 1, 2}), InputError);
}

TEST(WspShares, DeviceSecondsFromSlowdownsOrEveryTypesProfile) {
  const std::string head = "[types.fast]\nmemory_mib = 64\n[types.slow]\nmemory_mib = 64\nslowdown = 2.5\n";
  const std::string devs = "[[devices]]\ntype = \"slow\"\n[[devices]]\ntype = \"fast\"\ncount = 2\n";
  JobSpec job;
  job.global_batch = 12;
  job.virtual_nodes = 4;
  DeviceVnSeconds d = deviceVnSeconds(parseResources(head + devs, "devs.toml"), job);
  EXPECT_EQ(d.seconds, (std::vector<double>{2.5, 1.0, 1.0}));
  EXPECT_TRUE(d.note.empty());
  // Profiles of this job on both types: slowdown x compute per VN.
  const std::string dir = testing::TempDir();
  auto profile = [&](const std::string& name, double fwd, double bwd) {
    Profile p;
    p.fingerprint = jobFingerprint(job, {"a", "b"});
    p.layers = {LayerCost{"a", fwd, 0, bwd}, LayerCost{"b", fwd, 0, bwd}};
    p.allreduce_exact = p.allreduce_float = p.allreduce_max = {{2, LinearFit{}}};
    writeProfile(p, dir + "/" + name);
  };
  profile("fast.json", 0.001, 0.002);
  profile("slow.json", 0.004, 0.004);
  const std::string both = "[types.fast]\nmemory_mib = 64\nprofile = \"" + dir + "/fast.json\"\n" +
                           "[types.slow]\nmemory_mib = 64\nslowdown = 2.0\nprofile = \"" + dir + "/slow.json\"\n";
  d = deviceVnSeconds(parseResources(both + devs, dir + "/devs.toml"), job);
  ASSERT_EQ(d.seconds.size(), 3u);
  EXPECT_DOUBLE_EQ(d.seconds[0], 2.0 * 0.016);
  EXPECT_DOUBLE_EQ(d.seconds[1], 0.006);
  EXPECT_TRUE(d.note.empty());
  EXPECT_EQ(wspShares(11, d.seconds, {0, 1, 2}), (std::vector<int64_t>{1, 5, 5}));
  // A type without one: the slowdowns alone, and why.
  const std::string one = "[types.fast]\nmemory_mib = 64\n[types.slow]\nmemory_mib = 64\nslowdown = 2.0\nprofile = \"" +
                          dir + "/slow.json\"\n";
  d = deviceVnSeconds(parseResources(one + devs, dir + "/devs.toml"), job);
  EXPECT_EQ(d.seconds, (std::vector<double>{2.0, 1.0, 1.0}));
  EXPECT_NE(d.note.find("types.fast has no profile"), std::string::npos) << d.note;
  // A profile of another job is refused, naming the key.
  JobSpec other = job;
  other.virtual_nodes = 2;
  try {
    deviceVnSeconds(parseResources(both + devs, dir + "/devs.toml"), other);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("types.fast.profile"), std::string::npos) << e.what();
  }
}

// The log records the run's shares; a replay that would give other shares
// (another resources file) is refused, naming the log.
TEST(WspLog, SharesRecordRefusesAReplayOfOtherShares) {
  const std::string rec = R"({"vw":0,"pull":0,"clock":1,"versions":[1,1]}
{"vw":1,"pull":0,"clock":1,"versions":[0,1]}
)";
  const std::string shares = SharesRecord{{9, 3}}.toJson().dump() + "\n";
  const ReplayPlan p = ReplayPlan::parse(shares + rec, "log.jsonl", 2);
  ASSERT_TRUE(p.vn_shares.has_value());
  EXPECT_EQ(*p.vn_shares, (std::vector<int64_t>{9, 3}));
  EXPECT_NO_THROW(p.checkShares({9, 3}, "log.jsonl"));
  try {
    p.checkShares({6, 6}, "log.jsonl");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("log.jsonl: the run gave its virtual workers VN shares 9+3, this one gives 6+6"),
              std::string::npos) << e.what();
  }
  // A log without the record (written before it existed) checks nothing.
  EXPECT_NO_THROW(ReplayPlan::parse(rec, "log.jsonl", 2).checkShares({6, 6}, "log.jsonl"));
  // After the restore record of a regrouped run; never after a pull, never of another count.
  const std::string restored = RestoreRecord{1, 8, "/x"}.toJson().dump() + "\n";
  EXPECT_TRUE(ReplayPlan::parse(restored + shares + rec, "log.jsonl", 2).vn_shares.has_value());
  EXPECT_THROW(ReplayPlan::parse(rec + shares, "log.jsonl", 2), InputError);
  EXPECT_THROW(ReplayPlan::parse(SharesRecord{{9, 2, 1}}.toJson().dump() + "\n" + rec, "log.jsonl", 2), InputError);
  EXPECT_THROW(ReplayPlan::parse("{\"vn_shares\":[9,0]}\n" + rec, "log.jsonl", 2), InputError);
}

// The shard tests' job: 4 samples in 2 VNs, SGD at lr 0.5 (momentum
// `momentum`), WSP.
JobSpec shardJob(double momentum) {
  JobSpec job;
  job.global_batch = 4;
  job.virtual_nodes = 2;
  job.optim.lr = 0.5;
  job.optim.momentum = momentum;
  job.sync_mode = SyncMode::kWsp;
  return job;
}

// One parameter `w` and the statistics segment after it.
std::vector<StepCore::Segment> shardSegments(torch::Tensor w) {
  return {{StepCore::Segment::kParam, w, 0.0}, {StepCore::Segment::kStats, torch::Tensor(), 0.0}};
}

// A push to a shard of shardSegments (one parameter of 2 values): scale 4,
// values `a` and `b` (g = a / 16, b / 16), max |g| 2, one minibatch,
// computed on the shard's version `base`.
std::vector<int64_t> shardPush(int64_t a, int64_t b, int64_t base) {
  double mx = 2.0;
  int64_t bits;
  std::memcpy(&bits, &mx, sizeof bits);
  return {4, bits, a, b, 1, base};
}

// A shard of one parameter, two virtual workers: clock 0 is applied only
// with both pushes, as one SGD step of the summed gradient over the global
// batch; a pull waits for its version; under replay, clock 1 waits for the
// pulls the log says saw version 1.
TEST(WspParamShard, AppliesAClockWithEveryPushAndReplayHoldsVersions) {
  const JobSpec job = shardJob(0.0);
  torch::Tensor w = torch::zeros({2});
  std::vector<StepCore::Segment> segs = shardSegments(w);
  ParamShard shard(job, 10, 2, segs, {2, 2}, 0, 1, {4, 4});
  EXPECT_EQ(shard.pushValues(), 2 + 2 + 2);
  // scale 4, values 16 and -32 (g = 1, -2), max 2, one minibatch.
  const std::vector<int64_t> push = shardPush(16, -32, 0);
  shard.push(0, 0, push.data());
  EXPECT_EQ(shard.version(), 0);
  shard.push(1, 0, push.data());
  EXPECT_EQ(shard.version(), 1);
  const ParamShard::Pulled p = shard.pull(1, -1);
  // sum g = (2, -4) over B = 4: (0.5, -1); w = -lr x g.
  EXPECT_FLOAT_EQ(p.state[0], -0.25f);
  EXPECT_FLOAT_EQ(p.state[1], 0.5f);
  EXPECT_EQ(p.scales[0], scaleFor(2.0, job.headroom_bits, 51));

  shard.expectPulls({{1, 1}});  // one pull saw version 1 (the one above came before)
  const std::vector<int64_t> push1 = shardPush(16, -32, 1);
  shard.push(0, 1, push1.data());
  shard.push(1, 1, push1.data());
  EXPECT_EQ(shard.version(), 1);  // held for the logged pull of version 1
  std::thread t([&] { EXPECT_EQ(shard.pull(0, 1).version, 1); });
  t.join();
  EXPECT_EQ(shard.version(), 2);
}

// A pull for a clock past the version (D >= 1) gets the weights moved on
// by the momentum alone over the missing clocks (docs/wsp.md, "Pulls, the
// gate, and D"); a pull at the version (D = 0: the sync step) gets the
// weights as they are. The old rule handed every pull the stale weights.
TEST(WspParamShard, AStalePullGetsTheMomentumsLookAhead) {
  JobSpec job = shardJob(0.9);
  job.staleness = 2;
  // a = sum over the 2 missing clocks of lr x mu^i: 0.5 (0.9 + 0.81).
  EXPECT_DOUBLE_EQ(ParamShard::predictionCoefficient(job, 10, 1, 3), 0.5 * (0.9 + 0.81));
  EXPECT_EQ(ParamShard::predictionCoefficient(job, 10, 3, 3), 0.0);
  JobSpec nesterov = job;
  nesterov.optim.nesterov = true;
  EXPECT_DOUBLE_EQ(ParamShard::predictionCoefficient(nesterov, 10, 1, 3), 0.5 * (0.81 + 0.729));
  JobSpec plain = job;
  plain.optim.momentum = 0.0;
  EXPECT_EQ(ParamShard::predictionCoefficient(plain, 10, 1, 3), 0.0);

  torch::Tensor w = torch::zeros({2});
  std::vector<StepCore::Segment> segs = shardSegments(w);
  ParamShard shard(job, 10, 2, segs, {2, 2}, 0, 1, {4, 4});
  const std::vector<int64_t> push = shardPush(16, -32, 0);  // g = (1, -2) at scale 4
  shard.push(0, 0, push.data());
  shard.push(1, 0, push.data());
  // Version 1: buf = g = (0.5, -1) (the first step sets it), w = -lr buf.
  const ParamShard::Pulled now = shard.pull(1, -1, {}, 1);
  EXPECT_EQ(now.version, 1);
  EXPECT_FLOAT_EQ(now.state[0], -0.25f);
  EXPECT_FLOAT_EQ(now.state[1], 0.5f);
  const ParamShard::Pulled ahead = shard.pull(1, -1, {}, 3);
  EXPECT_EQ(ahead.version, 1);
  EXPECT_FLOAT_EQ(ahead.state[0], -0.25f - 0.855f * 0.5f);
  EXPECT_FLOAT_EQ(ahead.state[1], 0.5f + 0.855f);
  // The shard's own weights are untouched: the look-ahead is the pull's.
  EXPECT_FLOAT_EQ(shard.pull(1, -1).state[0], -0.25f);
}

// Read-my-writes: what the servers' SGD (momentum, a schedule over clocks)
// will do with a VW's own pushes alone is what the optimiser does from a
// zero buffer with those gradients, clock by clock (a clock without a push
// of its own carries the buffer on).
TEST(WspOwnPushes, TheMoveIsTheServersSgdOnTheVwsOwnGradients) {
  for (bool nesterov : {false, true}) {
    JobSpec job;
    job.wave = 4;
    job.optim.lr = 0.1;
    job.optim.momentum = 0.9;
    job.optim.nesterov = nesterov;
    job.optim.warmup_steps = 6;
    job.optim.schedule = "cosine";
    const int64_t steps = 40, version = 2;
    const std::vector<float> g0{1.0f, -2.0f, 0.5f}, g2{-0.25f, 4.0f, 1.0f};
    const std::vector<float> move = ownPushesMove(job, steps, version, {&g0, nullptr, &g2}, {0, 0, 0}, 3);
    torch::Tensor p = torch::zeros({3}).requires_grad_(true);
    OptimSpec o = job.optim;
    std::unique_ptr<Optimizer> opt = makeOptimizer(o, {p});
    opt->setStepCount(1);  // past PyTorch's first-step convention: buf = mu * 0 + g
    opt->paramState(0);     // the zero buffer
    for (int64_t i = 0; i < 3; ++i) {
      const std::vector<float>& g = i == 0 ? g0 : i == 2 ? g2 : std::vector<float>(3, 0.0f);
      p.mutable_grad() = torch::tensor(g);
      opt->step(learningRate(o, (version + i) * job.wave, steps));
    }
    ASSERT_EQ(move.size(), 3u);
    for (int j = 0; j < 3; ++j) EXPECT_NEAR(-move[j], p.detach()[j].item<float>(), 1e-6) << "nesterov " << nesterov;
    EXPECT_GT(move[0], 0.0f);  // not trivially zero
  }
  JobSpec job;
  EXPECT_TRUE(ownPushesMove(job, 10, 0, {nullptr, nullptr}, {0, 0}, 3).empty());  // none of its own: nothing
}

// A stale push (docs/wsp.md, "Stale pushes"): clock 1 gets VW 0's push
// computed on version 0 (staleness 1: g = (1, -2) / B) and VW 1's fresh one
// (g = (0.5, 0.5) / B); clock 2 two fresh zero pushes, so the momentum
// alone moves the weights. Hand-computed, lr 0.5, mu 0.9, B = 4: clock 0
// (both fresh, g = (1, -2) each) leaves buf = (0.5, -1), w = (-0.25, 0.5).
//   none:   buf = 0.9 buf + (0.25, -0.5) + (0.125, 0.125) = (0.825, -1.275)
//   scale:  buf = 0.9 buf + (0.25, -0.5) / 2 + (0.125, 0.125) = (0.7, -1.025)
//   bypass: buf = 0.9 buf + (0.125, 0.125) = (0.575, -0.775), and
//           w -= lr (0.25, -0.5) / 2 outside it
//   bypass_squared: the same buf, and w -= lr (0.25, -0.5) / 4 outside it
// then clock 2: w -= lr 0.9 buf.
TEST(WspParamShard, AStalePushIsScaledOrBypassesTheMomentum) {
  struct Case {
    const char* rule;
    float w1[2], w2[2];
  };
  const Case cases[] = {
      {"none", {-0.6625f, 1.1375f}, {-0.6625f - 0.37125f, 1.1375f + 0.57375f}},
      {"scale", {-0.6f, 1.0125f}, {-0.6f - 0.315f, 1.0125f + 0.46125f}},
      {"bypass", {-0.6f, 1.0125f}, {-0.6f - 0.25875f, 1.0125f + 0.34875f}},
      {"bypass_squared", {-0.56875f, 0.95f}, {-0.56875f - 0.25875f, 0.95f + 0.34875f}},
  };
  for (const Case& c : cases) {
    JobSpec job = shardJob(0.9);
    job.staleness = 1;
    job.stale_update = c.rule;
    torch::Tensor w = torch::zeros({2});
    ParamShard shard(job, 10, 2, shardSegments(w), {2, 2}, 0, 1, {4, 4});
    shard.push(0, 0, shardPush(16, -32, 0).data());
    shard.push(1, 0, shardPush(16, -32, 0).data());
    shard.push(1, 1, shardPush(8, 8, 1).data());
    shard.push(0, 1, shardPush(16, -32, 0).data());  // computed on version 0
    const ParamShard::Pulled p1 = shard.pull(2, -1);
    EXPECT_NEAR(p1.state[0], c.w1[0], 1e-6) << c.rule;
    EXPECT_NEAR(p1.state[1], c.w1[1], 1e-6) << c.rule;
    shard.push(0, 2, shardPush(0, 0, 2).data());
    shard.push(1, 2, shardPush(0, 0, 2).data());
    const ParamShard::Pulled p2 = shard.pull(3, -1);
    EXPECT_NEAR(p2.state[0], c.w2[0], 1e-6) << c.rule;
    EXPECT_NEAR(p2.state[1], c.w2[1], 1e-6) << c.rule;
  }
  // The factor 1 / (1 + s)^2 ("bypass_squared"), 1 / (1 + s) ("bypass",
  // "scale"); fresh pushes and "none" at 1; bypass only with SGD's
  // momentum, without it both bypass rules act as "scale".
  JobSpec job = shardJob(0.9);
  EXPECT_EQ(job.stale_update, "bypass");  // the default
  EXPECT_DOUBLE_EQ(wspStaleFactor(job, 0), 1.0);
  EXPECT_DOUBLE_EQ(wspStaleFactor(job, 3), 0.25);
  EXPECT_FALSE(wspStaleBypass(job, 0));
  EXPECT_TRUE(wspStaleBypass(job, 1));
  job.stale_update = "bypass_squared";
  EXPECT_DOUBLE_EQ(wspStaleFactor(job, 3), 1.0 / 16);
  EXPECT_TRUE(wspStaleBypass(job, 1));
  job.stale_update = "scale";
  EXPECT_FALSE(wspStaleBypass(job, 1));
  job.stale_update = "bypass_squared";
  job.optim.momentum = 0.0;
  EXPECT_FALSE(wspStaleBypass(job, 1));
  EXPECT_DOUBLE_EQ(wspStaleFactor(job, 3), 0.25);
  job.stale_update = "none";
  EXPECT_DOUBLE_EQ(wspStaleFactor(job, 3), 1.0);
}

// Read-my-writes of a stale own push: the VW's prediction follows the
// servers' rule (lr 0.5, mu 0.9; g0 = 1 pushed at staleness 1, g1 = 2
// fresh): none: 0.5 g0 + 0.5 (0.9 g0 + g1) = 1.95; scale: g0 / 2 into the
// buffer: 0.25 + 0.5 (0.45 + 2) = 1.475; bypass: 0.5 g0 / 2 outside it,
// 0.25 + 0.5 (0 + 2) = 1.25; bypass_squared: 0.5 g0 / 4 outside it,
// 0.125 + 0.5 (0 + 2) = 1.125.
TEST(WspOwnPushes, AStaleOwnPushMovesAsTheServersApplyIt) {
  const std::vector<float> g0{1.0f}, g1{2.0f};
  for (const auto& [rule, want] : std::vector<std::pair<std::string, float>>{
           {"none", 1.95f}, {"scale", 1.475f}, {"bypass", 1.25f}, {"bypass_squared", 1.125f}}) {
    JobSpec job;
    job.optim.lr = 0.5;
    job.optim.momentum = 0.9;
    job.stale_update = rule;
    const std::vector<float> move = ownPushesMove(job, 10, 0, {&g0, &g1}, {1, 0}, 1);
    ASSERT_EQ(move.size(), 1u);
    EXPECT_NEAR(move[0], want, 1e-6) << rule;
  }
}

// Checkpointed versions: the first clock at or past each multiple of
// checkpoint.every steps; with one minibatch a wave, a sync job's steps.
TEST(WspRecovery, CheckpointDueAtTheFirstClockPastEachMultiple) {
  std::vector<int64_t> due;
  for (int64_t v = 0; v <= 12; ++v)
    if (wspCheckpointDue(v, 1, 4, 12)) due.push_back(v);
  EXPECT_EQ(due, (std::vector<int64_t>{4, 8, 12}));
  due.clear();
  // wave 3, every 4 steps, 10 steps: versions 1..4 end at steps 3, 6, 9, 10.
  for (int64_t v = 0; v <= 5; ++v)
    if (wspCheckpointDue(v, 3, 4, 10)) due.push_back(v);
  EXPECT_EQ(due, (std::vector<int64_t>{2, 3}));
  EXPECT_FALSE(wspCheckpointDue(3, 1, 0, 12));  // no checkpoints
}

// What a regroup loses: every push of a wave at or past the restored clock,
// the dead VW's as its peers' shards saw them.
TEST(WspRecovery, LostWorkCountsPushesPastTheRestoredClock) {
  // VW 0 pushed 7 waves, VW 1 (lost) 6 as shard 0 saw it, 5 as shard 2 did.
  const std::vector<int64_t> pushed = mergePushed({{7, 6, 7}, {7, 5, 7, 9}, {}}, 3);
  EXPECT_EQ(pushed, (std::vector<int64_t>{7, 6, 7}));
  const LostWork w = lostWork(pushed, 4);
  EXPECT_EQ(w.restored, 4);
  EXPECT_EQ(w.end, 7);
  EXPECT_EQ(w.pushes, 3 + 2 + 3);
  EXPECT_EQ(lostWork(pushed, 8).pushes, 0);
  EXPECT_EQ(lostWork(pushed, 8).end, 8);
}

// A shard with momentum keeps a snapshot of each due version (weights,
// optimiser state, scales, step count); a shard restored from it applies
// the next clock exactly as the original did; a pull waiting for a push of
// a lost peer gives up once told to stop.
TEST(WspParamShard, SnapshotRestoresTheServersStateAndAWaitCanBeStopped) {
  const JobSpec job = shardJob(0.9);
  torch::Tensor w = torch::zeros({2});
  ParamShard a(job, 10, 2, shardSegments(w), {2, 2}, 0, 1, {4, 4});
  a.keepSnapshots([](int64_t v) { return v == 2; });
  for (int64_t c = 0; c < 3; ++c) {
    a.push(0, c, shardPush(16, -32, c).data());
    a.push(1, c, shardPush(16, -32, c).data());
  }
  EXPECT_EQ(a.received(), (std::vector<int64_t>{3, 3}));
  const ParamShard::Snapshot s = a.takeSnapshot(2);
  EXPECT_EQ(s.version, 2);
  EXPECT_EQ(s.optim_steps, 2);
  ASSERT_EQ(s.optim.size(), 2u);  // one momentum buffer
  EXPECT_THROW(a.takeSnapshot(2), InternalError);  // taken already
  // Restored at version 2 and given clock 2's pushes: version 3, as `a`.
  torch::Tensor w2 = torch::from_blob(const_cast<float*>(s.state.data()), {2}, torch::kFloat32).clone();
  ParamShard b(job, 10, 2, shardSegments(w2), {2, 2}, 0, 1, s.scales);
  b.restore(2, s.optim, s.optim_steps);
  EXPECT_EQ(b.version(), 2);
  b.push(0, 2, shardPush(16, -32, 2).data());
  b.push(1, 2, shardPush(16, -32, 2).data());
  const ParamShard::Pulled pa = a.pull(3, -1), pb = b.pull(3, -1);
  EXPECT_EQ(pa.version, 3);
  EXPECT_EQ(pb.version, 3);
  EXPECT_EQ(pa.state, pb.state);
  // A pull of version 4: VW 1's push of clock 3 never comes.
  a.push(0, 3, shardPush(16, -32, 3).data());
  std::atomic<bool> lost{false};
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    lost = true;
  });
  EXPECT_THROW(a.pull(4, -1, [&] { return lost.load(); }), CommFailure);
  t.join();
}

}  // namespace
}  // namespace morph
