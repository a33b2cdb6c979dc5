#include "plan/contention.h"

#include <algorithm>
#include <map>

#include "core/error.h"

namespace morph {

namespace {

double colocatedMedian(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int runProcesses(const ColocatedRun& run) { return run.plan.stages * run.plan.replicas; }

// The run's compute over what `p` gives the same actions with every
// factor 1 (its single-process figures).
double colocatedFactor(const Profile& p, const ColocatedRun& run, const SimOptions& opts) {
  const int P = run.plan.stages, n = runProcesses(run);
  if (n < 2) throw InputError("a co-located run needs at least 2 worker processes");
  if (run.stage_busy_s.size() != static_cast<size_t>(P))
    throw InputError("the co-located run measured " + std::to_string(run.stage_busy_s.size()) +
                     " stages' compute for a plan of " + std::to_string(P));
  if (!(run.step_seconds > 0)) throw InputError("the co-located run measured no step time");
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
  return measured / predicted;
}

}  // namespace

HostContention fitHostContention(const Profile& p, const ColocatedRun& run, const SimOptions& opts) {
  return fitHostContention(p, std::vector<ColocatedRun>{run}, opts);
}

HostContention fitHostContention(const Profile& p, const std::vector<ColocatedRun>& runs, const SimOptions& opts) {
  if (runs.empty()) throw InputError("no co-located run to fit");
  std::map<int, std::vector<double>> by_count;  // process count -> each run's factor
  for (const ColocatedRun& run : runs) by_count[runProcesses(run)].push_back(colocatedFactor(p, run, opts));
  HostContention h;
  h.factors[1] = 1.0;
  for (const auto& [n, fs] : by_count) h.factors[n] = std::max(1.0, colocatedMedian(fs));
  for (const ColocatedRun& run : runs) h.measured_on += (h.measured_on.empty() ? "" : "; ") + run.label;
  Profile fitted = p;
  fitted.host_contention = h;  // pipeline_step_s 0: the residuals
  std::vector<double> beyond;
  for (const ColocatedRun& run : runs) beyond.push_back(run.step_seconds - simulate(fitted, run.plan, opts).step_seconds);
  h.pipeline_step_s = std::max(0.0, colocatedMedian(beyond));
  return h;
}

}  // namespace morph
