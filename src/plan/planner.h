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
#include <string>
#include <vector>

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
  // factor (>= 1) and memory in bytes (0: memory_cap_bytes). Empty: N
  // identical workers.
  std::vector<double> slot_slowdown;
  std::vector<int64_t> slot_memory;
};

struct PlanChoice {
  PlanSpec plan;
  SimResult sim;
  double bottleneck_s = 0;  // the cut's slowest stage, per VN
};

struct PlanOutcome {
  std::vector<PlanChoice> plans;  // best first, at most top_k
  int64_t candidates = 0;         // (P, D, schedule, recompute) combinations considered
  int64_t simulated = 0;          // of which simulated
  double planning_seconds = 0;    // the search alone
};

// With slot_slowdown set (heterogeneous devices), the candidates are:
//  - data parallelism on the k fastest devices that hold the model, k = 1..N,
//    each with the VN shares that minimise the slowest worker
//    (weightedShares(): faster devices get more VNs);
//  - one pipeline on the P fastest devices, P = 2..min(layers, N), with the
//    device order and cut of bestDevicePipeline() (the slowest stage on its
//    own device's speed, every stage within its device's memory), while
//    the orders to try keep the search small (kMaxDeviceOrderWork).
// InputError when no plan fits the memory cap, naming the stage (its
// layers) that comes closest and by how many MiB it is over, or the layer
// that does not fit even alone.
PlanOutcome planJob(const Profile& profile, const PlanRequest& request);

// "gpipe" etc. for P > 1; "-" for data parallelism (no schedule).
std::string scheduleLabel(const PlanSpec& plan);

}  // namespace morph
