// The co-located contention model (Profile::host_contention, issue 30):
// fitted from a short real run of the job's worker processes on one host.
// Calibration (src/control/plan_commands.cpp) runs it: a 2-stage 1F1B
// pipeline of the job, two worker processes beside the manager, with
// --trace, and hands over what it measured; this fits the model. Pure
// logic: no processes, no files, no clocks.
#pragma once

#include <string>
#include <vector>

#include "plan/profile.h"
#include "plan/simulator.h"

namespace morph {

// What the run measured, over its steady steps.
struct ColocatedRun {
  PlanSpec plan;                     // what ran: a pipeline (stages, cuts, schedule, one replica of
                                     // its VNs), or data parallelism (1 stage, n replicas, their shares)
  std::vector<double> stage_busy_s;  // a pipeline's, per stage: compute (forward, backward, recompute)
                                     // per step; data parallelism: none (its step says it)
  double step_seconds = 0;           // median wall time between two step commits
  std::string label;                 // "2-stage 1f1b, 8 VNs, 2 worker processes" (the profile says it)
};

// The model, relative to `p`'s own (single-process) figures:
//  - factors {1: 1, n: f}, n = the run's worker processes, f = the stages'
//    measured compute over what `p` gives the same actions (>= 1): what
//    each process's compute costs when n share this host;
//  - pipeline_step_s = the measured step minus simulate()'s step for the
//    same plan with those factors (>= 0): what a pipeline pays per step on
//    a busy host that the simulator's parts leave out.
// InputError when the run does not fit the profile or measured nothing.
HostContention fitHostContention(const Profile& p, const ColocatedRun& run, const SimOptions& opts);

// Several runs (repeats of one plan, runs of other process counts), each
// measured in its own machine state: per process count n the median of
// its runs' factors (as above); pipeline_step_s the median over all runs
// of the step beyond simulate()'s with those factors (>= 0). One noisy
// run of three moves neither. measured_on: the runs' labels.
//
// A data-parallel run of n workers (all busy at once) gives
// busy_factors[n]: the factor x >= 1 at which simulate() gives its
// measured step (found by bisection; the cores bound included; the median
// of a count's runs). pipeline_step_s comes from the pipeline runs only.
// InputError when no pipeline run is given.
HostContention fitHostContention(const Profile& p, const std::vector<ColocatedRun>& runs, const SimOptions& opts);

// Calibration times one VN through the whole model several times, spaced
// over the calibration (the layers' rounds, after the communication, before
// and after each co-located run): the median of those times.
double wholeModelSeconds(std::vector<double> samples);

// Scales `p`'s per-layer compute (forward, forward without autograd,
// recompute, and the timed part of backward, not its quantisation, which
// is per value) by `ratio`: the layers, scaled to one whole-model time
// when measured, moved to another (wholeModelSeconds()).
void rescaleLayerCompute(Profile& p, double ratio);

}  // namespace morph
