// Cluster scheduling policies: how many worker slots each of many Morph
// jobs gets. One interface (a pure function of the jobs, the slots and the
// time), three policies:
//  - fifo: priority order, full demand, no resizes (the baseline);
//  - wfs: VirtualFlow's weighted fair shares (its Algorithm 1): shares
//    water-filled by priority, rounded down to powers of two, leftover
//    slots by priority;
//  - morph: any integer share, chosen from each job's own speed per
//    worker count (sublinear speed-ups) and per slot type (device types of
//    a resources file), maximising priority-weighted progress, with the
//    cost of a resize counted so it does not thrash.
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

// One kind of worker slot: a device type of the cluster's resources file
// (docs/resources.md), `count` slots of it.
struct SlotType {
  std::string name;
  double slowdown = 1.0;   // >= 1: its compute takes this many times the speed table's
  int count = 0;
  double memory_mib = 0;   // the type's memory_mib (a live job's resources file)
};

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
  // Also seconds per step by slots per type (counts in the cluster's type
  // order, as SlotType lists them): the planner's best plan on those
  // devices, from the job's calibration profile (speed-weighted VN shares,
  // pipelines, slow devices left idle where that is faster). Same checks.
  Speed(std::map<int, double> step_seconds, std::map<std::vector<int>, double> by_type);
  double stepsPerSecond(int workers) const;  // 0 for 0 workers
  // On by_type[t] slots of each types[t]: the by-type table's entry when it
  // lists these counts; otherwise the rate on their sum divided by the
  // largest slowdown among them (a synchronous data-parallel step with even
  // VN shares, as `morph run --resources` runs without a plan: the slowest
  // device bounds the step).
  double stepsPerSecond(const std::vector<int>& by_type, const std::vector<SlotType>& types) const;
  bool linear() const { return step_seconds_.empty(); }
  const std::map<int, double>& table() const { return step_seconds_; }
  const std::map<std::vector<int>, double>& byType() const { return by_type_; }

 private:
  std::map<int, double> step_seconds_;
  std::map<std::vector<int>, double> by_type_;
};

// One job the scheduler knows and has not finished.
struct JobState {
  int64_t id = 0;
  int priority = 1;              // >= 1; larger runs first and gets more
  int demand = 1;                // slots it asks for, 1..slots; no policy gives more
  double arrival = 0;            // seconds (submit time)
  double remaining_steps = 1;    // > 0
  int allocated = 0;             // slots it holds now; 0: queued
  // With slot types: the slots it holds of each type (view.types order),
  // summing to `allocated`. Empty: untyped (a cluster of one type).
  std::vector<int> held;
  const Speed* speed = nullptr;  // null: linear (must outlive the call)
};

struct ClusterView {
  double now = 0;   // seconds
  int slots = 0;    // worker slots in all
  // The slots' types (their counts sum to `slots`); empty: `slots` slots
  // of one type, slowdown 1.
  std::vector<SlotType> types;
  std::vector<JobState> jobs;
  int allocatedSlots() const;
  int freeSlots() const { return slots - allocatedSlots(); }
  // `types`, or the one implicit type when it is empty.
  std::vector<SlotType> slotTypes() const;
  // A job's held slots per type of slotTypes() (`{allocated}` untyped).
  std::vector<int> heldOf(const JobState& j) const;
};

// Per job (view order), the slots of each type of view.slotTypes().
using TypedTargets = std::vector<std::vector<int>>;

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
  // The same targets by slot type, with, per type, the targets summing to
  // at most its count. This default ignores the types (fifo and wfs, like
  // VirtualFlow's, know none): allocate()'s totals placed by placeBlind().
  virtual TypedTargets allocateTyped(const ClusterView& view) const;
};

// Totals placed on slot types without looking at their speed: a job that
// shrinks gives back slots of its last-listed types first; starts and
// grows, in priority order, take free slots of the first-listed types
// first.
TypedTargets placeBlind(const ClusterView& view, const std::vector<int>& totals);

// "fifo", "wfs" or "morph"; InputError naming the choices otherwise.
std::unique_ptr<Policy> makePolicy(const std::string& name, const PolicyOptions& options = {});
const std::vector<std::string>& policyNames();

// Priority order: priority descending, then arrival, then id.
bool priorityBefore(const JobState& a, const JobState& b);

// wfs's first stage on its own (tests, docs): real-valued weighted fair
// shares water-filled up to each job's demand, each running job at least 1.
std::vector<double> waterFill(const ClusterView& view);

}  // namespace morph::sched
