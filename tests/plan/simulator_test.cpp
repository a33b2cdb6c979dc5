// The simulator against makespans computed by hand.
#include "plan/simulator.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "hand_profiles.h"

namespace morph {
namespace {

// A profile of `layers` identical layers and free communication, on a host
// with cores enough for every rank.
Profile uniform(size_t layers, double f, double b, double rc) {
  return handProfile(layers, [&](size_t, LayerCost& c) {
    c.forward_s = c.forward_nograd_s = f;
    c.backward_s = b;
    c.recompute_s = rc;
  });
}

// One layer per stage, one replica of M VNs.
PlanSpec pipeline(int P, int64_t M, ScheduleKind kind, bool rc = false) {
  PlanSpec s;
  s.stages = P;
  s.replicas = 1;
  for (int k = 0; k <= P; ++k) s.cuts.push_back(static_cast<size_t>(k));
  s.schedule = kind;
  s.recompute = rc;
  s.vn_shares = {M};
  return s;
}

// DataParallelReductionByHand's job: two layers of 100 values, f = 1,
// b = 2; the 64-bit exact all-reduce of 2 ranks 0.1 s + 1 ms a byte, the
// optimiser 1 ms a parameter, a step's overhead 10 ms; 2 replicas, worker
// 0 with 3 VNs and worker 1 one. Tests add their own fits.
Profile handDataParallelProfile() {
  Profile prof = uniform(2, 1, 2, 0);
  for (auto& l : prof.layers) l.params = 100, l.param_bytes = 400;
  prof.allreduce_exact[2] = LinearFit{0.1, 0.001, {}};
  prof.optimizer_s_per_param = 0.001;
  prof.step_overhead_s = 0.01;
  return prof;
}
PlanSpec handDataParallelPlan() {
  PlanSpec plan;
  plan.replicas = 2;
  plan.vn_shares = {3, 1};
  return plan;
}

const ScheduleKind kKinds[] = {ScheduleKind::kGpipe, ScheduleKind::k1F1B, ScheduleKind::kVaruna};

TEST(Simulator, UniformCostsGiveTheBubbleFormula) {
  const double f = 1.0, b = 2.0;
  for (ScheduleKind kind : kKinds)
    for (int P : {2, 3, 4})
      for (int64_t M : {1, 2, 4, 8}) {
        const Profile prof = uniform(static_cast<size_t>(P), f, b, 0);
        const SimResult r = simulate(prof, pipeline(P, M, kind));
        EXPECT_DOUBLE_EQ(r.schedule_seconds, static_cast<double>(M + P - 1) * (f + b))
            << toString(kind) << " P=" << P << " M=" << M;
        for (int k = 0; k < P; ++k) {
          EXPECT_DOUBLE_EQ(r.stages[static_cast<size_t>(k)].busy_s, static_cast<double>(M) * (f + b));
          EXPECT_NEAR(r.stages[static_cast<size_t>(k)].bubble, bubbleFraction(P, M), 1e-12)
              << toString(kind) << " P=" << P << " M=" << M << " stage " << k;
        }
      }
}

TEST(Simulator, ChargesTransfersAndHidesVarunaRecompute) {
  // P=2, M=1, one-way transfer 0.5: F on rank 0 [0,1], arrives 1.5; rank 1
  // F [1.5,2.5], B [2.5,4.5]; the gradient arrives 5; rank 0 B [5,7].
  Profile prof = uniform(2, 1, 2, 1);
  prof.p2p.latency_s = 0.5;
  EXPECT_DOUBLE_EQ(simulate(prof, pipeline(2, 1, ScheduleKind::k1F1B)).schedule_seconds, 7.0);
  // Recompute (1): 1F1B runs it after the gradient arrives at 4 (done 7);
  // Varuna while waiting for it (done 6).
  prof.p2p.latency_s = 0;
  EXPECT_DOUBLE_EQ(simulate(prof, pipeline(2, 1, ScheduleKind::k1F1B, true)).schedule_seconds, 7.0);
  EXPECT_DOUBLE_EQ(simulate(prof, pipeline(2, 1, ScheduleKind::kVaruna, true)).schedule_seconds, 6.0);
  for (int P : {2, 3, 4})
    for (int64_t M : {2, 4, 8}) {
      Profile q = uniform(static_cast<size_t>(P), 1, 2, 1);
      q.p2p.latency_s = 0.1;
      EXPECT_LE(simulate(q, pipeline(P, M, ScheduleKind::kVaruna, true)).schedule_seconds,
                simulate(q, pipeline(P, M, ScheduleKind::k1F1B, true)).schedule_seconds)
          << "P=" << P << " M=" << M;
    }
}

TEST(Simulator, NonUniformProfileByHand) {
  // Stage 0: f=1, b=2; stage 1: f=2, b=4; 1F1B, M=2.
  Profile prof = uniform(2, 1, 2, 0);
  prof.layers[1].forward_s = 2;
  prof.layers[1].backward_s = 4;
  // Rank 1: F0 [1,3] B0 [3,7] F1 [7,9] B1 [9,13]; rank 0: F0 [0,1] F1 [1,2],
  // B0 when g0 arrives (7) [7,9], B1 at 13 [13,15].
  EXPECT_DOUBLE_EQ(simulate(prof, pipeline(2, 2, ScheduleKind::k1F1B)).schedule_seconds, 15.0);
  // With 0.5 per transfer: a0 arrives 1.5, F0 [1.5,3.5] B0 [3.5,7.5], g0 at
  // 8; a1 (sent at 2) at 2.5; F1 [7.5,9.5] B1 [9.5,13.5], g1 at 14; rank 0
  // B0 [8,10] B1 [14,16].
  prof.p2p.latency_s = 0.5;
  const SimResult r = simulate(prof, pipeline(2, 2, ScheduleKind::k1F1B));
  EXPECT_DOUBLE_EQ(r.schedule_seconds, 16.0);
  EXPECT_DOUBLE_EQ(r.stages[0].busy_s, 6.0);
  EXPECT_DOUBLE_EQ(r.stages[1].busy_s, 12.0);
  // Per-message delay (an emulated link, LinkEmulation) adds to every transfer.
  prof.p2p.latency_s = 0;
  SimOptions o;
  o.link_delay_s = 0.5;
  EXPECT_DOUBLE_EQ(simulate(prof, pipeline(2, 2, ScheduleKind::k1F1B), o).schedule_seconds, 16.0);
}

TEST(Simulator, DataParallelReductionByHand) {
  // Two layers of 100 values, f=1, b=2; worker 0 has 3 VNs, worker 1 one.
  Profile prof = handDataParallelProfile();
  prof.allreduce_max[2] = LinearFit{0.05, 0.0, {}};
  PlanSpec plan = handDataParallelPlan();
  // Worker 0 computes until 18 (its last backward ends there too): the
  // parameter bucket (1600 bytes) with the statistics and each worker's
  // slots of flags, maxima and control values (2 + 2 x (4 x 2 + 4 + 2 + 2)
  // = 34 values, 272 bytes) reduces [18, 19.972]; no MAX all-reduce (the
  // slots replace it). Optimiser 0.2, overhead 0.01.
  const SimResult r = simulate(prof, plan);
  EXPECT_NEAR(r.schedule_seconds, 18.0, 1e-12);
  EXPECT_NEAR(r.step_seconds, 19.972 + 0.2 + 0.01, 1e-12);
  // Buckets of one layer each: layer 1's starts as soon as its backward is
  // done (16), before the worker finishes.
  SimOptions small;
  small.bucket_bytes = 800;
  const SimResult s = simulate(prof, plan, small);
  // l1 [16, 16.9]; l0 with the statistics and slots (1072 bytes) [18, 19.172].
  EXPECT_NEAR(s.step_seconds, 19.172 + 0.2 + 0.01, 1e-12);
  // In one process nothing is reduced or posted.
  SimOptions alone;
  alone.in_process = true;
  plan.replicas = 1;
  plan.vn_shares = {4};
  EXPECT_NEAR(simulate(prof, plan, alone).step_seconds, 24.0 + 0.2, 1e-12);
}

TEST(Simulator, Exact32SendsFloatBytesAndLanes) {
  // DataParallelReductionByHand's job in the 32-bit exact format
  // (reduce.bits = 32): the 200 parameter values as int32 and the 34
  // integers of statistics and slots as 4 lanes each, 336 values of 4 bytes
  // (1344 bytes), at the float all-reduce's cost (an int32 reduce-scatter
  // and a float all-gather send its bytes): 0.1 + 1344 x 0.0005.
  Profile prof = handDataParallelProfile();
  prof.fingerprint.reduce_mode = "exact32";
  prof.allreduce_float[2] = LinearFit{0.1, 0.0005, {}};
  const PlanSpec plan = handDataParallelPlan();
  EXPECT_NEAR(simulate(prof, plan).step_seconds, 18.0 + 0.1 + 1344 * 0.0005 + 0.2 + 0.01, 1e-12);
  EXPECT_DOUBLE_EQ(prof.reduceSeconds(1000, 2), 0.1 + 4000 * 0.0005);
  // Memory: the int32 buffer (half the int64 one) and half the scratch.
  const int64_t b32 = stageBytes(prof, 0, 2, 1, false, {});
  prof.fingerprint.reduce_mode = "exact";
  EXPECT_DOUBLE_EQ(prof.reduceSeconds(1000, 2), 0.1 + 8000 * 0.001);
  EXPECT_EQ(b32 - stageBytes(prof, 0, 2, 1, false, {}), (200 + 2) * (7 - 14));
}

TEST(Simulator, RanksShareTheHostsCores) {
  Profile prof = uniform(2, 1, 2, 0);
  prof.host_cores = 1;
  // Two ranks computing 3 s per VN each on one core: 2 x 4 x 3 = 24 s of
  // compute cannot finish before 24 s (the pipeline alone takes 15).
  EXPECT_DOUBLE_EQ(simulate(prof, pipeline(2, 4, ScheduleKind::k1F1B)).schedule_seconds, 24.0);
  prof.host_cores = 2;
  EXPECT_DOUBLE_EQ(simulate(prof, pipeline(2, 4, ScheduleKind::k1F1B)).schedule_seconds, 15.0);
}

TEST(Simulator, HostsEmulatedOnOneMachineShareItsCores) {
  Profile prof = uniform(2, 1, 2, 0);
  prof.host_cores = 1;
  SimOptions hosts;
  hosts.rank_host = {0, 1};  // each rank on a host of one core: the pipeline alone
  EXPECT_DOUBLE_EQ(simulate(prof, pipeline(2, 4, ScheduleKind::k1F1B), hosts).schedule_seconds, 15.0);
  hosts.hosts_share_cores = true;  // both on this one machine's core, as RanksShareTheHostsCores
  EXPECT_DOUBLE_EQ(simulate(prof, pipeline(2, 4, ScheduleKind::k1F1B), hosts).schedule_seconds, 24.0);
  // The contention factor counts every rank of the machine too: 4
  // processes at 1.5x each against 1 per host.
  prof.host_cores = 16;
  prof.host_contention.factors = {{1, 1.0}, {4, 1.5}};
  PlanSpec dp;
  dp.replicas = 4;
  dp.vn_shares = {1, 1, 1, 1};
  hosts.rank_host = {0, 1, 2, 3};
  hosts.hosts_share_cores = false;
  const double apart = simulate(prof, dp, hosts).schedule_seconds;
  hosts.hosts_share_cores = true;
  EXPECT_DOUBLE_EQ(simulate(prof, dp, hosts).schedule_seconds, simulate(prof, dp).schedule_seconds);
  EXPECT_GT(simulate(prof, dp, hosts).schedule_seconds, apart * 1.2);
}

TEST(Simulator, RingExtrapolationBeyondMeasuredGroups) {
  Profile prof = uniform(1, 1, 1, 0);
  prof.allreduce_exact[2] = LinearFit{0.002, 1e-9, {}};
  EXPECT_DOUBLE_EQ(prof.exactOrFloatAllreduce(true, 1e6, 1), 0.0);
  EXPECT_DOUBLE_EQ(prof.exactOrFloatAllreduce(true, 1e6, 2), 0.002 + 1e-3);
  // g = 4: 6 steps of 0.001 s, and 2*3/4 of the buffer at 1e-9 s/byte.
  EXPECT_NEAR(prof.exactOrFloatAllreduce(true, 1e6, 4), 0.006 + 1.5e-3, 1e-15);
}

// Collectives between hosts (docs/planner.md, "Between hosts"): the
// one-host fit plus, per ring step, the link's latency, plus the bytes each
// rank sends over the link's rate.
SimOptions betweenHosts(std::vector<int> hosts) {
  SimOptions o;
  o.rank_host = std::move(hosts);
  o.cross_host_bytes_per_s = 1e6;
  o.cross_host_latency_s = 1e-3;
  return o;
}

TEST(Simulator, DataParallelSumBetweenHostsPaysTheLinkForTheWireBytes) {
  // 4 replicas of one VN each (6 s) on 4 hosts; two layers of 40,000
  // parameters: one bucket of 80,000 values plus the statistics and slots
  // (2 + 4 x (4 x 2 + 4 + 2 + 4) = 74 values): 80,074 >= 65,536, the
  // sharded sum. Each rank sends 3/4 x 80,074 x 12 = 720,666 bytes (int64
  // reduce-scatter, float all-gather): 0.720666 s at 1 MB/s, and 6 ring
  // steps of 1 ms. The one-host fit 0.3, the optimiser 0.08, overhead 0.01.
  Profile prof = uniform(2, 1, 2, 0);
  for (auto& l : prof.layers) l.params = 40000, l.param_bytes = 160000;
  prof.allreduce_exact[4] = LinearFit{0.3, 0.0, {}};
  prof.allreduce_float[4] = LinearFit{0.3, 0.0, {}};
  prof.optimizer_s_per_param = 1e-6;
  prof.step_overhead_s = 0.01;
  PlanSpec plan;
  plan.replicas = 4;
  plan.vn_shares = {1, 1, 1, 1};
  const double alone = 6.0 + 0.3 + 0.08 + 0.01;
  EXPECT_NEAR(simulate(prof, plan).step_seconds, alone, 1e-12);
  EXPECT_NEAR(simulate(prof, plan, betweenHosts({0, 1, 2, 3})).step_seconds, alone + 0.720666 + 0.006, 1e-12);
  EXPECT_DOUBLE_EQ(sumWireBytes(prof, 80074, 4), 720666);
  // Hosts 0, 1, 0, 1 in ring order: each host's link carries two ranks'
  // sends at once.
  EXPECT_NEAR(simulate(prof, plan, betweenHosts({0, 1, 0, 1})).step_seconds, alone + 2 * 0.720666 + 0.006, 1e-12);
  // Ranks 0, 1 and 2, 3 share a host: one hop leaves each.
  EXPECT_NEAR(simulate(prof, plan, betweenHosts({0, 0, 1, 1})).step_seconds, alone + 0.720666 + 0.006, 1e-12);
  // One host, or no link: bit for bit the one-host step.
  EXPECT_EQ(simulate(prof, plan, betweenHosts({0, 0, 0, 0})).step_seconds, simulate(prof, plan).step_seconds);
  SimOptions no_link;
  no_link.rank_host = {0, 1, 2, 3};
  EXPECT_EQ(simulate(prof, plan, no_link).step_seconds, simulate(prof, plan).step_seconds);
  // The 32-bit format: 8 bytes per value (int32 reduce-scatter, float
  // all-gather), the slots as 4 lanes: 80,000 + 4 x 74 = 80,296 values,
  // 3/4 x 80,296 x 8 = 481,776 bytes.
  prof.fingerprint.reduce_mode = "exact32";
  EXPECT_NEAR(simulate(prof, plan, betweenHosts({0, 1, 2, 3})).step_seconds, alone + 0.481776 + 0.006, 1e-12);
  // Float: Gloo's float ring all-reduce, 8 bytes per value; no flags or
  // maxima in the slots (2 + 4 x (2 + 4) = 26): 3/4 x 80,026 x 8.
  prof.fingerprint.reduce_mode = "float";
  EXPECT_NEAR(simulate(prof, plan, betweenHosts({0, 1, 2, 3})).step_seconds, alone + 0.480156 + 0.006, 1e-12);
}

TEST(Simulator, SmallExactSumBetweenHostsGoesAsGlooInt64) {
  // DataParallelReductionByHand's job on two hosts: its bucket of 234
  // values is below 65,536, so Gloo's int64 ring all-reduce: 1/2 x 234 x
  // 16 = 1,872 bytes (1.872 s at 1 kB/s) and 2 ring steps of 0.5 s.
  const Profile prof = handDataParallelProfile();
  const PlanSpec plan = handDataParallelPlan();
  SimOptions o;
  o.rank_host = {0, 1};
  o.cross_host_bytes_per_s = 1000;
  o.cross_host_latency_s = 0.5;
  EXPECT_NEAR(simulate(prof, plan, o).step_seconds, 19.972 + 1.872 + 1.0 + 0.2 + 0.01, 1e-12);
}

TEST(Simulator, PipelineReplicasSumBetweenHostsPayTheLink) {
  // P = 2, D = 2, one VN per replica, replica d on host d (ranks 0, 1 on
  // host 0; 2, 3 on host 1): the pipeline's messages stay on their host,
  // each stage's sum among its replicas and the world's MAX and loss sums
  // cross. 1F1B: rank 0 F [0,1], rank 1 F [1,2] B [2,4], rank 0 B [4,6].
  // Stage 0: its 40,000 values (below 65,536: Gloo's int64 ring) after 6:
  // fit 0.1, 1/2 x 40,000 x 16 = 320,000 bytes at 1 MB/s, 2 steps of
  // 1 ms: done 6.422. The MAX (96 bytes, 4 ranks) 0.05 + 3/2 x 96 / 1e6 +
  // 6 ms, the loss sums (2 values) 0.02 + 3/4 x 2 x 16 / 1e6 + 6 ms: 6.082168.
  // Stage 0 steps 40,000 parameters (0.04) after 6.422; overhead 0.01.
  Profile prof = uniform(2, 1, 2, 0);
  for (auto& l : prof.layers) l.params = 40000, l.param_bytes = 160000;
  prof.allreduce_exact[2] = LinearFit{0.1, 0.0, {}};
  prof.allreduce_exact[4] = LinearFit{0.02, 0.0, {}};
  prof.allreduce_max[4] = LinearFit{0.05, 0.0, {}};
  prof.optimizer_s_per_param = 1e-6;
  prof.step_overhead_s = 0.01;
  PlanSpec plan = pipeline(2, 1, ScheduleKind::k1F1B);
  plan.replicas = 2;
  plan.vn_shares = {1, 1};
  EXPECT_NEAR(simulate(prof, plan).step_seconds, 6.1 + 0.04 + 0.01, 1e-12);
  const SimResult r = simulate(prof, plan, betweenHosts({0, 0, 1, 1}));
  EXPECT_NEAR(r.schedule_seconds, 6.0, 1e-12);
  EXPECT_NEAR(r.step_seconds, 6.422 + 0.04 + 0.01, 1e-12);
  // Its stages on two hosts instead (ranks 0, 2 on host 0): each message
  // pays 1 ms + 1,000 bytes at 1 MB/s, 2 ms (stage 0's backward [4.004,
  // 6.004]), and each stage's sum stays on its host: 6.004 + 0.1 + 0.04.
  EXPECT_NEAR(simulate(prof, plan, betweenHosts({0, 1, 0, 1})).step_seconds, 6.104 + 0.04 + 0.01, 1e-12);
  // All on one host: bit for bit the step without hosts.
  EXPECT_EQ(simulate(prof, plan, betweenHosts({0, 0, 0, 0})).step_seconds, simulate(prof, plan).step_seconds);
}

TEST(Simulator, TiedWeightBetweenHostsPaysTheLink) {
  // P = 2, D = 1, one VN, stage k on host k: layer 1 uses layer 0's weight
  // of 100,000 values (>= 65,536: the sharded sum, 1/2 x 100,000 x 12 =
  // 600,000 bytes, 0.6 s at 1 MB/s, 2 ring steps of 1 ms). Each message
  // 2 ms: rank 0 F [0,1], rank 1 F [1.002,2.002] B [2.002,4.002], rank 0 B
  // [4.004,6.004]. The tied sum: 6.004 + 0.1 + 0.602 = 6.706, after the
  // MAX (0.05 + 96 bytes + 2 ms) and the loss sums (0.1 + 16 bytes + 2 ms),
  // done at 6.158112. No optimiser time, no overhead.
  Profile prof = uniform(2, 1, 2, 0);
  prof.layers[0].params = 100000, prof.layers[0].param_bytes = 400000;
  prof.layers[1].tied_params = 100000, prof.layers[1].tied_owner = 0;
  prof.allreduce_exact[2] = LinearFit{0.1, 0.0, {}};
  prof.allreduce_max[2] = LinearFit{0.05, 0.0, {}};
  const PlanSpec plan = pipeline(2, 1, ScheduleKind::k1F1B);
  EXPECT_NEAR(simulate(prof, plan).step_seconds, 6.0 + 0.1 + 0.05, 1e-12);  // the loss sums after the MAX
  EXPECT_NEAR(simulate(prof, plan, betweenHosts({0, 1})).step_seconds, 6.706, 1e-12);
}

TEST(Simulator, RejectsPlansThatDoNotFitTheProfile) {
  const Profile prof = uniform(3, 1, 1, 0);
  PlanSpec bad = pipeline(2, 2, ScheduleKind::k1F1B);
  bad.cuts = {0, 1, 2};  // does not reach layer 3
  EXPECT_THROW(simulate(prof, bad), InputError);
  PlanSpec shares = pipeline(3, 2, ScheduleKind::k1F1B);
  shares.vn_shares = {0};
  EXPECT_THROW(simulate(prof, shares), InputError);
}

// A device type with its own profile (a resources file's types.NAME.profile)
// computes with its own per-layer times, times its slowdown.
TEST(Simulator, EachRankComputesWithItsDevicesOwnLayerCosts) {
  // The job's profile: two layers of f=1, b=2. Rank 1's type takes f=2,
  // b=4 on layer 1: the stages of NonUniformProfileByHand, so 15.
  const Profile prof = uniform(2, 1, 2, 0);
  DeviceCosts slow_attention;
  slow_attention.origin = "b.json";
  slow_attention.layers = {{9, 9, 9, 9}, {2, 2, 4, 0}};  // layer 0 is never on rank 1
  SimOptions o;
  o.device_costs = std::make_shared<const std::vector<DeviceCosts>>(std::vector<DeviceCosts>{slow_attention});
  o.rank_costs = {-1, 0};
  const SimResult r = simulate(prof, pipeline(2, 2, ScheduleKind::k1F1B), o);
  EXPECT_DOUBLE_EQ(r.schedule_seconds, 15.0);
  EXPECT_DOUBLE_EQ(r.stages[0].busy_s, 6.0);
  EXPECT_DOUBLE_EQ(r.stages[1].busy_s, 12.0);
  // Its slowdown multiplies its own times: stage 1 f=4, b=8. Rank 1: F0
  // [1,5] B0 [5,13] F1 [13,17] B1 [17,25]; rank 0: F0 [0,1] F1 [1,2], B0
  // [13,15], B1 [25,27].
  PlanSpec slowed = pipeline(2, 2, ScheduleKind::k1F1B);
  slowed.slowdown = {1.0, 2.0};
  EXPECT_DOUBLE_EQ(simulate(prof, slowed, o).schedule_seconds, 27.0);

  // Data parallelism: replica 0's type takes f=0.5, b=1 per layer (3 per
  // VN against the profile's 6): 3 VNs there take 9, 1 VN here 6.
  DeviceCosts fast;
  fast.origin = "a.json";
  fast.layers = {{0.5, 0.5, 1, 0.5}, {0.5, 0.5, 1, 0.5}};
  SimOptions dp;
  dp.device_costs = std::make_shared<const std::vector<DeviceCosts>>(std::vector<DeviceCosts>{fast});
  dp.rank_costs = {0, -1};
  PlanSpec plan;
  plan.replicas = 2;
  plan.vn_shares = {3, 1};
  EXPECT_NEAR(simulate(prof, plan, dp).schedule_seconds, 9.0, 1e-12);
  plan.vn_shares = {1, 3};
  EXPECT_NEAR(simulate(prof, plan, dp).schedule_seconds, 18.0, 1e-12);

  // Tables that do not fit the plan or the profile are refused.
  SimOptions bad = dp;
  bad.rank_costs = {0};
  EXPECT_THROW(simulate(prof, plan, bad), InputError);
  bad.rank_costs = {0, 1};
  EXPECT_THROW(simulate(prof, plan, bad), InputError);
  DeviceCosts short_table = fast;
  short_table.layers.pop_back();
  bad.device_costs = std::make_shared<const std::vector<DeviceCosts>>(std::vector<DeviceCosts>{short_table});
  bad.rank_costs = {0, -1};
  EXPECT_THROW(simulate(prof, plan, bad), InputError);
}

// WSP (docs/planner.md, "WSP beside sync"): two uniform layers of f = 1,
// b = 2 make one VN 6 s; 20 parameters, 22 pushed values, 20 pulled floats.
PlanSpec vws(std::vector<int64_t> shares, std::vector<double> slowdown = {}) {
  PlanSpec s;
  s.replicas = static_cast<int>(shares.size());
  s.vn_shares = std::move(shares);
  s.slowdown = std::move(slowdown);
  return s;
}

TEST(SimulatorWsp, ASlowerVirtualWorkerSetsTheClockAndCommunicationDoesNotScale) {
  Profile prof = uniform(2, 1, 2, 0);
  prof.p2p.latency_s = 0.5;  // each push and pull message: 0.5 s
  const WspOptions w{2, 3};  // D = 2, 3 minibatches a wave
  // Even: 3 minibatches x 2 VNs x 6 s = 36 s, push 0.5, pull 0.5.
  const WspSimResult even = simulateWsp(prof, vws({2, 2}), w);
  EXPECT_DOUBLE_EQ(even.clock_seconds, 37.0);
  EXPECT_DOUBLE_EQ(even.step_seconds, 37.0 / 3);
  // VW 1 twice as slow: its compute doubles (72 s), its messages do not.
  const WspSimResult slow = simulateWsp(prof, vws({2, 2}, {1.0, 2.0}), w);
  EXPECT_DOUBLE_EQ(slow.vws[0].cycle_s, 37.0);
  EXPECT_DOUBLE_EQ(slow.vws[1].compute_s, 72.0);
  EXPECT_DOUBLE_EQ(slow.clock_seconds, 73.0);
  EXPECT_EQ(slow.slowest, 1);
  // Speed-sized shares (3 + 1) take the slow VW off the path: 3 x 18 + 1.
  EXPECT_DOUBLE_EQ(simulateWsp(prof, vws({3, 1}, {1.0, 2.0}), w).clock_seconds, 55.0);
  // The same from VW 1's type's own per-layer costs (f = 2, b = 4 on both
  // layers: 12 s a VN) instead of a slowdown.
  SimOptions own;
  own.device_costs = std::make_shared<const std::vector<DeviceCosts>>(
      std::vector<DeviceCosts>{{"b.json", {{2, 2, 4, 0}, {2, 2, 4, 0}}, 0.0}});
  own.rank_costs = {-1, 0};
  const WspSimResult tables = simulateWsp(prof, vws({2, 2}), w, own);
  EXPECT_DOUBLE_EQ(tables.vws[1].compute_s, 72.0);
  EXPECT_DOUBLE_EQ(tables.clock_seconds, 73.0);
  EXPECT_DOUBLE_EQ(simulateWsp(prof, vws({3, 1}), w, own).clock_seconds, 55.0);
}

TEST(SimulatorWsp, StalenessZeroWaveOneIsTheSyncStepPlusTheServersClock) {
  Profile prof = uniform(2, 1, 2, 0);  // free communication
  prof.optimizer_s_per_param = 0.01;
  prof.quantize_s_per_value = 0.001;
  const PlanSpec plan = vws({3, 1});
  const SimResult sync = simulate(prof, plan);
  EXPECT_DOUBLE_EQ(sync.step_seconds, 18.0 + 0.2);  // 3 VNs x 6 s, then the optimiser over 20 parameters
  const WspSimResult d0 = simulateWsp(prof, plan, {0, 1});
  // A shard's clock: 2 pushes x 11 values summed, the optimiser over 10 parameters.
  EXPECT_DOUBLE_EQ(d0.server_seconds, 0.001 * 22 + 0.01 * 10);
  EXPECT_NEAR(d0.clock_seconds - d0.server_seconds, sync.step_seconds, 1e-12);
  // D >= 1: the shard's clock runs beside the next wave.
  EXPECT_NEAR(simulateWsp(prof, plan, {1, 1}).clock_seconds, sync.step_seconds, 1e-12);
}

TEST(SimulatorWsp, ALongerWaveAmortisesThePushAndPull) {
  Profile prof = uniform(2, 1, 2, 0);
  prof.p2p.latency_s = 0.5;
  prof.p2p.seconds_per_byte = 1e-3;
  // Push: 11 values x 8 + a 32-byte header = 120 bytes; pull: 10 floats x 4 + 8 = 48.
  const WspSimResult one = simulateWsp(prof, vws({2, 2}), {1, 1});
  EXPECT_DOUBLE_EQ(one.vws[0].push_s, 0.5 + 0.120);
  EXPECT_DOUBLE_EQ(one.vws[0].pull_s, 0.5 + 0.048);
  for (int64_t nm : {1, 2, 4, 16})
    EXPECT_NEAR(simulateWsp(prof, vws({2, 2}), {1, nm}).step_seconds, 12.0 + 1.168 / static_cast<double>(nm), 1e-12)
        << "wave " << nm;
  // Between hosts: each message also pays the link's latency and bytes.
  SimOptions two_hosts;
  two_hosts.rank_host = {0, 1};
  two_hosts.cross_host_latency_s = 1.0;
  two_hosts.cross_host_bytes_per_s = 1000.0;
  EXPECT_NEAR(simulateWsp(prof, vws({2, 2}), {1, 1}, two_hosts).step_seconds, 12.0 + 1.168 + 2.0 + 0.168, 1e-12);
}

TEST(SimulatorWsp, SyncAndWspPayTheLinkForTheSameBytesPerExchange) {
  // Two VWs on two hosts, two layers of 40,000 parameters: a sync step's
  // sharded sum sends 1/2 x 80,034 x 12 = 480,204 bytes per rank (80,000
  // parameters, 34 statistics and slots) in 2 ring steps; a WSP wave
  // pushes 8 x 80,002 / 2 + 32 = 320,040 bytes and pulls 4 x 80,000 / 2 +
  // 8 = 160,008, one message each: 480,048 bytes. What the link adds (at
  // 1 MB/s, 1 ms a message) differs by those 156 bytes only.
  Profile prof = uniform(2, 1, 2, 0);
  for (auto& l : prof.layers) l.params = 40000, l.param_bytes = 160000;
  const PlanSpec plan = vws({2, 2});
  const SimOptions link = betweenHosts({0, 1});
  const double sync_link = simulate(prof, plan, link).step_seconds - simulate(prof, plan).step_seconds;
  const double wsp_link = simulateWsp(prof, plan, {1, 1}, link).clock_seconds - simulateWsp(prof, plan, {1, 1}).clock_seconds;
  EXPECT_NEAR(sync_link, 0.480204 + 0.002, 1e-12);
  EXPECT_NEAR(wsp_link, 0.480048 + 0.002, 1e-12);
}

TEST(SimulatorWsp, VirtualWorkersShareTheHostsCoresAndBadPlansAreRefused) {
  Profile prof = uniform(2, 1, 2, 0);
  prof.host_cores = 1;  // both VWs compute 12 s a clock on one core: 24 s
  EXPECT_DOUBLE_EQ(simulateWsp(prof, vws({2, 2}), {1, 1}).clock_seconds, 24.0);
  SimOptions hosts;
  hosts.rank_host = {0, 1};  // a core each: 12 s
  EXPECT_DOUBLE_EQ(simulateWsp(prof, vws({2, 2}), {1, 1}, hosts).clock_seconds, 12.0);
  hosts.hosts_share_cores = true;  // emulated on one machine of one core
  EXPECT_DOUBLE_EQ(simulateWsp(prof, vws({2, 2}), {1, 1}, hosts).clock_seconds, 24.0);
  // With messages: on the shared core each VW's wave stretches to the
  // machine's 24 s of compute, and its pushes and pulls come after it (a
  // cores bound over the whole clock alone would hide them).
  prof.p2p.latency_s = 0.5;
  hosts.hosts_share_cores = false;  // apart: 12 s of compute each, then the messages
  EXPECT_DOUBLE_EQ(simulateWsp(prof, vws({2, 2}), {1, 1}, hosts).clock_seconds, 12.0 + 1.0);  // a push, a pull
  hosts.hosts_share_cores = true;
  EXPECT_DOUBLE_EQ(simulateWsp(prof, vws({2, 2}), {1, 1}, hosts).clock_seconds, 24.0 + 1.0);
  EXPECT_THROW(simulateWsp(prof, vws({4}), {1, 1}), InputError);  // one VW
  EXPECT_THROW(simulateWsp(prof, pipeline(2, 2, ScheduleKind::k1F1B), {1, 1}), InputError);
  EXPECT_THROW(simulateWsp(prof, vws({2, 2}), {1, 0}), InputError);
}

}  // namespace
}  // namespace morph
