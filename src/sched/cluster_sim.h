// Traces of many jobs and the event-driven cluster simulator: the same
// Policy code as the live scheduler, under simulated time. A decision is
// taken on every arrival and completion; a running job whose worker count
// changes makes no progress for the resize cost; progress between events
// is each job's rate (its speed table) times the time it ran.
//
// No libtorch, no processes. The only clock read is the decision time of
// each policy call (a measurement, it never changes a result).
// Trace format and commands: docs/cluster.md.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sched/policy.h"

namespace morph::sched {

struct TraceJob {
  std::string name;
  double arrival = 0;  // seconds from the trace's start
  int priority = 1;
  int demand = 1;
  int64_t steps = 1;
  Speed speed;         // seconds per step by worker count
};

struct Trace {
  std::vector<TraceJob> jobs;
};

// The speed of a job given as a job file and a calibration profile: seconds
// per step by worker count 1..max_workers (the planner's best plan on each
// count) and, with slot types, by slots per type (the planner's best plan
// on those devices).
using ProfileResolver = std::function<Speed(const std::string& job_file, const std::string& profile, int max_workers,
                                            const std::vector<SlotType>& types)>;

// Parses a trace (docs/cluster.md). InputError naming `origin`, the job
// (jobs[i] and its name) and the key, with what was expected. A job given
// as "job" and "profile" files (relative to the trace's folder) needs
// `resolve` (given `types`, the cluster's slot types, if any).
Trace traceFromJson(const std::string& text, const std::string& origin, const ProfileResolver& resolve = {},
                    const std::vector<SlotType>& types = {});
Trace readTrace(const std::string& path, const ProfileResolver& resolve = {}, const std::vector<SlotType>& types = {});
std::string traceToJson(const Trace& trace);  // pretty; traceFromJson reads it back

// A seeded synthetic trace: Poisson arrivals, priorities uniform from
// {1, 5, 10}, demands uniform from {1, 2, 4, 8} (at most max_demand), a
// single-worker step time and a serial fraction per job (Amdahl:
// t(k) = t1 * (serial + (1 - serial) / k), a sublinear speed-up) and a run
// time at full demand drawn log-uniformly.
struct TraceGenOptions {
  int jobs = 20;
  double per_hour = 12;
  uint64_t seed = 1;
  int max_demand = 8;
  double min_minutes = 20, max_minutes = 180;  // run time at full demand
  double max_serial = 0.1;                     // serial fraction drawn from [0, max_serial]
};
Trace generateTrace(const TraceGenOptions& options);

struct SimConfig {
  int slots = 8;
  // The slots' types (counts summing to `slots`; docs/cluster.md, "Slot
  // types"); empty: one type. A job's rate is its speed on the slots it
  // holds of each type (Speed::stepsPerSecond).
  std::vector<SlotType> types;
  PolicyOptions policy;  // resize_seconds: the pause of a resized job
  double start_seconds = 0;  // a started job's start-up (processes, data) before its first step
};

struct JobOutcome {
  std::string name;
  int priority = 1, demand = 1;
  double arrival = 0, start = 0, end = 0;
  int resizes = 0;      // worker-count changes while it ran
  int max_workers = 0;  // most slots it held
  double jct() const { return end - arrival; }
  double queued() const { return start - arrival; }
};

// One decision that changed something: every job's slots after it (by
// trace index; 0 for a job queued, done or not yet arrived).
struct AllocationRow {
  double time = 0;
  std::vector<int> workers;
  std::vector<std::vector<int>> by_type;  // with slot types: each job's slots per type
};

struct ClusterSimResult {
  std::string policy;
  int slots = 0;
  double makespan_s = 0;     // first arrival to last completion
  double mean_jct_s = 0, median_jct_s = 0, mean_queue_s = 0;
  double utilisation = 0;    // slot-seconds held / (slots * makespan)
  int64_t resizes = 0;
  int64_t decisions = 0;     // policy calls (one per distinct event time)
  double decision_mean_s = 0, decision_max_s = 0;
  std::vector<JobOutcome> jobs;     // in trace order
  std::vector<AllocationRow> rows;  // decisions that changed an allocation
};

// InputError when a job demands more than config.slots. InternalError when
// the policy breaks one of its rules (policy.h).
ClusterSimResult simulateCluster(const Trace& trace, const Policy& policy, const SimConfig& config);

}  // namespace morph::sched
