// Planner: chooses how to run a job on N workers from its calibration
// profile. It searches the pipeline depth P, the data-parallel width D
// (any P * D <= N; the rest idle), the schedule, recomputation, the cut
// (minMaxCuts(): the slowest stage including its sends, under the memory
// cap) and the VN shares, and ranks the candidates by the simulator's step
// time. A lower bound (the bottleneck stage's per-VN time times its VNs,
// plus the fill ahead of it) orders the candidates, so only those that could beat the K-th best so far
// are simulated: the result is the same as simulating every candidate.
//
// Never reads src/control: the control plane calls the planner.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/memory_estimate.h"
#include "plan/simulator.h"

namespace morph {

struct PlanRequest {
  int workers = 1;               // N
  int64_t virtual_nodes = 1;     // V: VNs per step
  int64_t memory_cap_bytes = 0;  // per worker; 0 = none
  int top_k = 5;
  int max_stages = 0;            // 0 = min(layers, workers)
  std::vector<ScheduleKind> schedules{ScheduleKind::kGpipe, ScheduleKind::k1F1B, ScheduleKind::kVaruna};
  bool try_recompute = true;
  SimOptions sim;
  // Heterogeneous devices (a resources file): per worker slot, its compute
  // factor against the profile (> 0) and memory in bytes (0:
  // memory_cap_bytes). Empty: N identical workers.
  std::vector<double> slot_slowdown;
  std::vector<int64_t> slot_memory;
  // Per worker slot, the index in sim.device_costs of its type's own
  // per-layer costs (a resources file type with a `profile`; -1: the
  // profile's costs), times slot_slowdown. Empty: every slot the profile's.
  std::vector<int> slot_costs;
  // Per worker slot, its host (index); empty: one host. Enables the
  // allocation policies (NP needs hosts) and cross-host link costs
  // (sim.cross_host_*).
  std::vector<int> slot_host;
  // Prune by what the simulator charges after the busiest host's compute
  // (its cores shared by its ranks, the step overhead, the pipelines' MAX
  // all-reduce): the same best plan, far fewer simulations where hosts hold
  // more ranks than cores. false: the search before issue 30 (bench/tests).
  bool host_bounds = true;
  // With slot_slowdown: also cut each group by its own devices (HetPipe's
  // virtual workers, PlanSpec::group_cuts) and report the fastest such
  // plan beside the shared cut (PlanOutcome::group_cuts). Never chosen:
  // `morph run` runs one shared cut (docs/planner.md, "A cut per group").
  bool compare_group_cuts = true;
};

struct PlanChoice {
  PlanSpec plan;
  SimResult sim;
  double bottleneck_s = 0;  // the cut's slowest stage, per VN
  // The lower bound the search ordered and pruned it by (its per-VN
  // bottleneck, fill, the host's cores, the pipeline terms; with a
  // resources file also its shape's bound): never above sim.step_seconds,
  // or the pruned search could drop the best plan. 0: none (a policy's row
  // in compareAllocations()).
  double bound_s = 0;
};

// A cut per group against one shared cut, on the same groups, schedule
// and recomputation (planJob() with compare_group_cuts).
struct GroupCutComparison {
  // beats_best: the fastest plan with plan.group_cuts over the groupings
  // searched, faster than plans.front(); else the chosen plan's groups
  // (when they cut differently; else the candidate of the smallest bound),
  // each with a cut of its own.
  PlanChoice per_group;
  bool beats_best = false;
  bool of_chosen = false;  // not beats_best: the chosen plan's groups
  std::optional<PlanChoice> shared;   // its groups with the planner's shared cut (none fits: nullopt)
  int64_t candidates = 0, simulated = 0;
};

struct PlanOutcome {
  std::vector<PlanChoice> plans;  // best first, at most top_k
  int64_t candidates = 0;         // (P, D, schedule, recompute) combinations considered
  int64_t simulated = 0;          // of which simulated
  double planning_seconds = 0;    // the search alone
  // With slot_slowdown and compare_group_cuts: a plan with a cut per group
  // (GroupCutComparison) among the groupings searched whose groups' own
  // cuts differ (nullopt: none did; then a cut per group is the shared
  // cut). Not in `plans`: morph run cannot run it.
  std::optional<GroupCutComparison> group_cuts;
};

// With slot_slowdown set (heterogeneous devices), a plan is D groups of P
// devices (virtual workers; P = 1 is data parallelism) with one shared cut,
// each group in its own device order, VN shares by group speed
// (weightedShares()). The candidates:
//  - the planner's own groupings of the D * P fastest devices, for every
//    P <= min(layers, N) and D <= N / P: contiguous in speed order
//    ("sorted") and dealt back and forth ("balanced"); taken in the order
//    of a lower bound (all their compute spread perfectly over their
//    speeds), stopping once it cannot beat the K-th best simulated plan;
//  - with slot_host, HetPipe's allocation policies NP, ED and HD (see
//    allocation.h), every group given at least one VN.
// For each grouping and schedule: each distinct group's best device order
// and cut (bestDevicePipeline(), exact over distinct orders while they are
// few), then every such cut tried on every group (the best order for that
// cut) and the cut with the fastest slowest group kept: exact when all
// groups are alike (ED, balanced), a search over candidate cuts otherwise.
// With compare_group_cuts, groups whose own cuts differ are also planned
// each on its own cut (PlanOutcome::group_cuts; reported, never chosen).
// InputError when no plan fits the devices' memory, naming the tightest
// device and the shortfall.
PlanOutcome planJob(const Profile& profile, const PlanRequest& request);

// The allocation policies side by side with the planner's choice (with
// slot_slowdown and slot_host set): per policy its groups and its best
// simulated plan (every group gets at least one VN), or why it does not
// apply to this pool; the last row is the planner's, `mine` (planJob()'s
// outcome for the same request).
struct AllocationRow {
  std::string policy;  // NP, ED, HD, planner
  std::vector<std::vector<int>> groups;  // worker slots of each group
  std::optional<PlanChoice> best;
  std::string why_not;
};
std::vector<AllocationRow> compareAllocations(const Profile& profile, const PlanRequest& request,
                                             const PlanOutcome& mine);
// The rows as a text table: policy, P, D, schedule, predicted step, ratio
// to the planner's, VN shares and each group's devices in stage order
// (`device(slot)` names a device).
std::string allocationTable(const std::vector<AllocationRow>& rows, const std::function<std::string(int)>& device);

// WSP beside sync for one grouping (docs/planner.md, "WSP beside sync"):
// the grouping `morph run` gives a WSP job on the request's workers, each
// worker slot a virtual worker in slot order with the VN shares the WSP
// runtime gives it: wspShares() of `slot_vn_seconds` (deviceVnSeconds() of
// the resources file, per slot; empty: even shares). Its sync step
// (simulate(), with the same shares) and WSP clock (simulateWsp()) from the
// same profile, and each VW's memory: the
// data-parallel worker's (stageBytes()) plus wspWorkerMemory(), against its
// device's memory (slot_memory) or memory_cap_bytes.
struct WspPrediction {
  PlanSpec plan;
  SimResult sync;
  WspSimResult wsp;
  int64_t worker_bytes = 0;     // the data-parallel part of a VW
  WspMemory memory;             // the WSP part (the largest shard)
  std::vector<int64_t> limit_bytes;  // per VW; 0: none
};
// `clocks`: the job's clocks, ceil(steps / wave) (0: unknown); it bounds
// the pushes a shard may hold. `job_file` names the file in errors.
// InputError (exit 2) when a VW's memory exceeds its limit: naming
// sync.staleness, the need, the limit and the largest D that fits, when
// D = 0 would fit; naming sync.mode when not even D = 0 fits. Also when the
// request has fewer than 2 workers or more workers than VNs.
WspPrediction predictWsp(const Profile& profile, const PlanRequest& request, const WspOptions& wsp, int64_t clocks,
                         const std::string& job_file, const std::vector<double>& slot_vn_seconds = {});

// "gpipe" etc. for P > 1; "-" for data parallelism (no schedule).
std::string scheduleLabel(const PlanSpec& plan);

}  // namespace morph
