#include "plan/contention.h"

#include <algorithm>

#include "core/error.h"

namespace morph {

HostContention fitHostContention(const Profile& p, const ColocatedRun& run, const SimOptions& opts) {
  const int P = run.plan.stages, n = run.plan.stages * run.plan.replicas;
  if (n < 2) throw InputError("a co-located run needs at least 2 worker processes");
  if (run.stage_busy_s.size() != static_cast<size_t>(P))
    throw InputError("the co-located run measured " + std::to_string(run.stage_busy_s.size()) +
                     " stages' compute for a plan of " + std::to_string(P));
  if (!(run.step_seconds > 0)) throw InputError("the co-located run measured no step time");
  // The simulator's busy time of each stage with every factor 1 (the
  // single-process figures of this profile).
  Profile base = p;
  base.host_contention = HostContention{};
  base.host_contention.factors = {{1, 1.0}, {n, 1.0}};
  const SimResult alone = simulate(base, run.plan, opts);
  double measured = 0, predicted = 0;
  for (int k = 0; k < P; ++k) {
    measured += run.stage_busy_s[static_cast<size_t>(k)];
    predicted += alone.stages[static_cast<size_t>(k)].busy_s;
  }
  if (!(measured > 0) || !(predicted > 0)) throw InputError("the co-located run measured no compute");
  HostContention h;
  h.factors = {{1, 1.0}, {n, std::max(1.0, measured / predicted)}};
  h.measured_on = run.label;
  base.host_contention = h;
  h.pipeline_step_s = std::max(0.0, run.step_seconds - simulate(base, run.plan, opts).step_seconds);
  return h;
}

}  // namespace morph
