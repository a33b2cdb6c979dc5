// What a running job's step costs, measured from its own committed steps,
// and the speed the live scheduler decides with once it has measured some
// (docs/cluster.md, "Measured step time").
//
// The planner's predicted step time (a job's calibration profile) leaves
// out what the control plane adds to every step: on this machine it
// predicted 2.5-2.7 ms on one worker where the jobs stepped in 3-4.5 ms
// (bench/cluster_live_vs_sim.py). The live scheduler therefore measures
// each job's mean step on each worker count as it runs and decides with
// that (jobs with a profile), and `morph queue --json` reports the same figure
// (`step_seconds`), which a trace's step_seconds takes: the simulator and
// the live scheduler then weigh a job's step alike.
//
// Pure logic: the scheduler feeds in what it reads from metrics.jsonl.
#pragma once

#include <cstdint>
#include <map>

#include "sched/policy.h"

namespace morph::sched {

// A job's mean seconds per step by worker count, from the committed steps
// seen (a sample of them: the scheduler reads the newest line of
// metrics.jsonl on each of its rounds). Consecutive sightings on the same
// worker count make a stretch, measured from its first step seen to its
// last; the time across a change of worker count (the resize's pause,
// which the policy charges apart as resize_seconds) and before the first
// step (the start-up) count in no stretch.
class StepMeter {
 public:
  // A committed step: its index, its commit time (seconds) and its worker
  // count (>= 1). A step at or before the last one seen is ignored.
  void observe(int64_t step, double time, int workers);
  // Mean seconds per step by worker count, over the counts with at least
  // `min_steps` steps measured (summed over their stretches).
  std::map<int, double> table(int64_t min_steps = 1) const;

 private:
  struct Span {
    double seconds = 0;
    int64_t steps = 0;
  };
  std::map<int, Span> closed_;  // finished stretches, summed by worker count
  int workers_ = 0;             // the open stretch's count; 0: none yet
  int64_t first_step_ = 0, last_step_ = -1;
  double first_time_ = 0, last_time_ = 0;
};

// The speed a job is scheduled with once some of its steps are measured:
// the measured mean on every measured count; on any other count k up to
// max_workers, the planned step time scaled by measured / planned at the
// nearest measured count (the smaller one on a tie), so the planner's
// shape of the speed-up is kept and its level is what the job showed.
// `planned` null or linear: a linear speed-up (k workers, k times the
// rate). Without measurements: `planned` itself (linear when null). The
// live scheduler calibrates only jobs with a profile: an uncalibrated
// linear speed has no unit, and policies compare jobs' rates.
Speed calibratedSpeed(const Speed* planned, const std::map<int, double>& measured, int max_workers);

}  // namespace morph::sched
