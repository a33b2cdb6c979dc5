// What the planner's commands (plan_commands.cpp) give the rest of the
// control plane: `morph run --plan auto` and the simulator's options for a
// job. The commands themselves (calibrate, simulate, plan) are declared in
// runner.h.
#pragma once

#include "control/runner.h"
#include "core/job_spec.h"
#include "plan/simulator.h"

namespace morph {

// `--plan auto`: finds (or measures) the job's profile, plans for o.workers
// and returns the options that run the chosen plan (a plan file in the run
// folder).
RunOptions resolveAutoPlan(const RunOptions& o, const JobSpec& job);
// What the executor will do that a profile does not know: bucket size and
// emulated link delay (environment), clipping and checkpoints (the job).
SimOptions simOptionsFor(const JobSpec& job, bool in_process);

}  // namespace morph
