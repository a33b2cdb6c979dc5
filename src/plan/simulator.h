// Simulator: predicts one training step of a plan from a calibration
// profile, by replaying the very action lists the stage executor runs
// (makeSchedule() in src/exec/schedule.h, and Varuna's run-time moves
// through the same opportunisticMove()) as discrete events:
//  - each rank's compute thread runs its actions in order; forward,
//    backward and recompute take the profile's per-layer times summed over
//    the stage (times the rank's slowdown);
//  - each channel (activations k -> k+1, gradients k+1 -> k) has a sender
//    that transfers one message at a time, in order, and a receiver that
//    posts the next receive only while fewer than kRecvWindow messages wait
//    unused; a transfer starts when the message is handed over, the
//    previous one is done and its receive is posted, and takes the p2p fit
//    (plus an emulated link delay);
//  - after the schedule, the reductions as the executor issues them:
//    data parallel, buckets of the gradient buffer started during the last
//    VN's backward as their layers finish, in order, one at a time; a
//    pipeline, the stage's segments among its replicas, the tied weight
//    between first and last stage, the MAX all-reduce of flags over every
//    rank and the loss sums; then the optimiser step and the per-step
//    overhead.
// A collective starts when its last participant issues it. Ranks of one
// host share its cores: the step is never shorter than the host's total
// compute divided by its cores.
//
// Pure logic: no tensors, no I/O, no clocks. Never reads src/control.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <string>
#include <vector>

#include "exec/schedule.h"
#include "plan/profile.h"
#include "plan/vn_shares.h"  // weightedShares, evenShares: the plans' VN shares

namespace morph {

// One way to run a job: what `morph plan` chooses and `morph run --plan`
// executes.
struct PlanSpec {
  int stages = 1;                 // P
  int replicas = 1;               // D
  std::vector<size_t> cuts;       // P + 1 layer boundaries (empty: the whole model, P = 1)
  ScheduleKind schedule = ScheduleKind::k1F1B;
  bool recompute = false;
  std::vector<int64_t> vn_shares; // VNs per replica, each >= 1
  // Per world rank (replica * P + stage): compute-time factor of its
  // device (>= 1; empty = all 1).
  std::vector<double> slowdown;
  // Per world rank: the worker slot (resources file device) it runs on;
  // empty = rank r on slot r.
  std::vector<int> workers;
  // A cut per replica (HetPipe's virtual workers cut differently; issue
  // 30): P + 1 boundaries each, `cuts` being replica 0's. Empty: every
  // replica runs `cuts`. The simulator sums each layer's gradient among
  // the D ranks that hold it (reduceBlocks(), plan/group_cut.h); `morph
  // run` runs only a shared cut (docs/planner.md, "A cut per group").
  std::vector<std::vector<size_t>> group_cuts;
};

// Action lists by (schedule, P, M, recompute), made once: a planner
// simulates many plans that share them. Not thread-safe.
class ScheduleCache {
 public:
  const Schedule& get(const ScheduleOptions& so);

 private:
  std::map<std::tuple<int, int, int64_t, bool>, Schedule> lists_;
};

struct SimOptions {
  ScheduleCache* schedules = nullptr;  // optional; must outlive the call
  int64_t bucket_bytes = int64_t{25} << 20;  // the executor's MORPH_BUCKET_BYTES
  double link_delay_s = 0;   // per pipeline message: an emulated link's delay (LinkEmulation, test/bench harness)
  bool clipping = false;     // optim.clip_norm > 0: one more MAX all-reduce in pipelines
  bool in_process = false;   // `morph run` without --workers: no collectives, no store
  bool checkpoints = false;  // the job checkpoints: each stage copies its state for its writer
  // Several hosts (a resources file's `host`): per world rank, its host;
  // empty = one host. A pipeline message between two hosts takes the
  // profile's p2p time plus cross_host_latency_s plus bytes over
  // cross_host_bytes_per_s (0: no extra). A collective whose ranks span
  // hosts (a gradient sum, the MAX of flags, the loss sums) takes the
  // profile's one-host fit plus, per step of its ring (2 (g - 1)),
  // cross_host_latency_s, plus the bytes each rank sends
  // (sumWireBytes()) over cross_host_bytes_per_s, once per ring hop that
  // leaves the busiest host (docs/planner.md, "Between hosts").
  std::vector<int> rank_host;
  // The hosts are emulated on this one machine (a resources file's
  // [hosts] one_machine, e.g. network namespaces): links stay per host,
  // but every rank computes on this machine's cores, so the contention
  // factor and the cores bound count all ranks as one host's.
  bool hosts_share_cores = false;
  double cross_host_latency_s = 0;
  double cross_host_bytes_per_s = 0;
  // Device types with their own per-layer costs (a resources file type
  // with a `profile`): the tables, and per world rank the index of its
  // device's table (-1: the profile's own costs; empty: every rank the
  // profile's). A rank's compute (forward, backward, recompute, optimiser)
  // is its table's, times its PlanSpec::slowdown.
  std::shared_ptr<const std::vector<DeviceCosts>> device_costs;
  std::vector<int> rank_costs;
};

struct StageSim {
  double busy_s = 0;     // compute of the stage's busiest replica
  double bubble = 0;     // 1 - busy / schedule makespan, mean over replicas
  int64_t peak_bytes = 0;
};

struct SimResult {
  double step_seconds = 0;      // one training step, start to start
  double schedule_seconds = 0;  // the compute phase (longest replica)
  double reduce_seconds = 0;    // from the end of the compute phase to the optimiser step
  std::vector<StageSim> stages;
};

// The runtime's choice of wire for a 64-bit exact sum (useShardedSum() in
// src/exec/trainer.h, MORPH_EXACT_WIRE = auto): the sharded sum from this
// many values on (kShardedMinValues there; tests/exec/trainer_test.cpp
// checks they agree).
constexpr int64_t kPlanShardedMinValues = int64_t{1} << 16;

// Bytes each of `group` ranks sends to sum `values` values, as the
// runtime's wire carries them (docs/exact_reduction.md), both rings of a
// reduce-scatter and an all-gather: (g - 1) / g x values x 12 for a
// 64-bit exact sum of at least kPlanShardedMinValues (and g) values (int64
// reduce-scatter, float all-gather), x 16 for a smaller one (Gloo's int64
// ring all-reduce), x 8 for float (Gloo's float ring all-reduce) and
// exact32 (int32 reduce-scatter, float all-gather). 0 for one rank.
double sumWireBytes(const Profile& p, double values, int group);

// InputError when the plan does not fit the profile (cuts, shares, sizes).
SimResult simulate(const Profile& profile, const PlanSpec& plan, const SimOptions& opts = {});

// A stage's memory as a fixed part and a part per stashed VN.
struct StageFootprint {
  int64_t fixed_bytes = 0, per_vn_bytes = 0;
  int64_t bytes(int64_t live_vns) const { return fixed_bytes + live_vns * per_vn_bytes; }
};
StageFootprint stageFootprint(const Profile& profile, size_t first, size_t end, bool recompute, const SimOptions& opts);

// Bytes the stage [first, end) needs on one worker, as the executor
// allocates them: the process, the largest other layer (built and freed
// at start), parameters, optimiser state, gradients and the fixed-point buffer
// (int64 or float32 values, from the profile's reduce mode; exact: plus the
// sharded sum's scratch), the stashed
// VNs (`live_vns`, from the schedule) and the receive window. The stage
// [0, layers) is data parallelism: one worker holding the whole model.
int64_t stageBytes(const Profile& profile, size_t first, size_t end, int64_t live_vns, bool recompute,
                   const SimOptions& opts);

// Wave Synchronous Parallel (docs/wsp.md): a data-parallel plan (P = 1)
// whose replicas are the virtual workers, each a wave of `wave` minibatches
// (its VN share of a step each) per clock. What src/wsp does per wave, and
// so what this charges: the minibatches one after another, each its VNs'
// forward and backward and the local SGD update (and on VW 0 the metrics
// line, one store round trip); then a push of the wave sum to every other
// shard and a pull of every other shard's weights, both blocking: the VW
// computes nothing while it pushes or pulls (no overlap). A shard applies a
// clock (the W pushes' exact sum, one optimiser step) on a server thread
// when the last push arrives, beside its VW's compute. Steady state: with
// D = 0 every VW waits for every shard's clock, so a clock is the slowest
// wave (compute + push + pull) plus the slowest shard's step; with D >= 1
// the slowest VW never waits at the gate (the versions it needs were
// applied a wave ago) and the faster ones wait for it once D ahead, so a
// clock is the slowest wave and the server step is hidden. With costs that
// do not vary, every D >= 1 predicts the same clock: D pays off against
// variation, which this does not model.
struct WspOptions {
  int64_t staleness = 0;  // D
  int64_t wave = 1;       // Nm
};

struct WspVwSim {
  double compute_s = 0;  // Nm minibatches: VNs, local update, VW 0's metrics lines
  double push_s = 0;     // its wave sum to the other shards, one after another on its link
  double pull_s = 0;     // the other shards' weights, one after another on its link
  double cycle_s = 0;    // compute + push + pull: its wave when it never waits
  double server_s = 0;   // its process's shard applying one clock
};

struct WspSimResult {
  double clock_seconds = 0;        // steady state: one clock (a wave of every VW), start to start
  double step_seconds = 0;         // clock_seconds / wave: beside a sync step
  double server_seconds = 0;       // the slowest shard's clock
  double cores_bound_seconds = 0;  // the busiest host's CPU per clock over its cores
  int slowest = 0;                 // the VW with the longest cycle
  std::vector<WspVwSim> vws;
};

// InputError when the plan is not data parallelism of >= 2 replicas or
// the options are out of range.
WspSimResult simulateWsp(const Profile& profile, const PlanSpec& plan, const WspOptions& wsp,
                         const SimOptions& opts = {});

// Seconds of one VN's compute on stage [first, end) (forward, backward and,
// with recomputation on a stage that is not the last, the recompute), from
// `costs` (a device type's own, as many layers as the profile) or, when
// null, the profile's.
double stageComputeSeconds(const Profile& profile, size_t first, size_t end, bool recompute,
                           const DeviceCosts* costs = nullptr);

}  // namespace morph
