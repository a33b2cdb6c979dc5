// Cluster scheduling policies: how many worker slots each of many Morph
// jobs gets. One interface (a pure function of the jobs, the slots and the
// time), three policies:
//  - fifo: priority order, full demand, no resizes (the baseline);
//  - wfs: VirtualFlow's weighted fair shares (its Algorithm 1): shares
//    water-filled by priority, rounded down to powers of two, leftover
//    slots by priority;
//  - morph: any integer share, chosen from each job's own speed per
//    worker count (sublinear speed-ups), maximising priority-weighted
//    progress, with the cost of a resize counted so it does not thrash.
// The live scheduler and the simulator (cluster_sim.h) call the same code.
//
// Pure logic: no I/O, no clocks, no processes, no libtorch. docs/cluster.md.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace morph::sched {

// A job's speed by worker count: seconds per step on k workers (k >= 1),
// from a trace's step_seconds or a calibration profile through the
// planner. Counts between two listed ones interpolate the rate (steps per
// second) linearly; below the smallest listed count the rate scales
// linearly down to 0 workers; above the largest it stays flat (no gain
// is assumed where none was measured).
class Speed {
 public:
  Speed() = default;  // linear: k steps per second on k workers
  // InputError when empty, a count < 1 or a time not finite and > 0.
  explicit Speed(std::map<int, double> step_seconds);
  double stepsPerSecond(int workers) const;  // 0 for 0 workers
  bool linear() const { return step_seconds_.empty(); }
  const std::map<int, double>& table() const { return step_seconds_; }

 private:
  std::map<int, double> step_seconds_;
};

// One job the scheduler knows and has not finished.
struct JobState {
  int64_t id = 0;
  int priority = 1;              // >= 1; larger runs first and gets more
  int demand = 1;                // slots it asks for, 1..slots; no policy gives more
  double arrival = 0;            // seconds (submit time)
  double remaining_steps = 1;    // > 0
  int allocated = 0;             // slots it holds now; 0: queued
  const Speed* speed = nullptr;  // null: linear (must outlive the call)
};

struct ClusterView {
  double now = 0;   // seconds
  int slots = 0;    // worker slots in all
  std::vector<JobState> jobs;
  int allocatedSlots() const;
  int freeSlots() const { return slots - allocatedSlots(); }
};

struct PolicyOptions {
  // Seconds a running job makes no progress when its worker count changes
  // (bench/morph_latency.py --only small: a join takes 0.4-0.6 s from the
  // event to the first step of the new generation).
  double resize_seconds = 0.6;
};

class Policy {
 public:
  virtual ~Policy() = default;
  virtual const char* name() const = 0;
  // Target slots per job, in the order of view.jobs. Every policy keeps:
  // each target in [0, demand], their sum <= slots, and a running job
  // (allocated > 0) never goes back to 0 (a Morph job shrinks, it is not
  // suspended).
  virtual std::vector<int> allocate(const ClusterView& view) const = 0;
};

// "fifo", "wfs" or "morph"; InputError naming the choices otherwise.
std::unique_ptr<Policy> makePolicy(const std::string& name, const PolicyOptions& options = {});
const std::vector<std::string>& policyNames();

// Priority order: priority descending, then arrival, then id.
bool priorityBefore(const JobState& a, const JobState& b);

// wfs's first stage on its own (tests, docs): real-valued weighted fair
// shares water-filled up to each job's demand, each running job at least 1.
std::vector<double> waterFill(const ClusterView& view);

}  // namespace morph::sched
