#include "plan/contention.h"

#include <algorithm>
#include <cmath>
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

// A data-parallel run of n workers: the factor x on each worker's compute
// (all n busy at once) at which simulate() gives the measured step. The
// step grows with x (compute, the cores bound): bisection.
double busyFactorOf(const Profile& p, const ColocatedRun& run, const SimOptions& opts) {
  const int n = runProcesses(run);
  if (n < 2) throw InputError("a co-located data-parallel run needs at least 2 worker processes");
  if (!(run.step_seconds > 0)) throw InputError("the co-located run measured no step time");
  auto stepAt = [&](double x) {
    Profile q = p;
    q.host_contention = HostContention{};
    q.host_contention.factors = {{1, 1.0}};
    q.host_contention.busy_factors = {{n, x}};
    return simulate(q, run.plan, opts).step_seconds;
  };
  double lo = 1.0, hi = 2.0;
  if (stepAt(lo) >= run.step_seconds) return 1.0;
  while (stepAt(hi) < run.step_seconds) {
    lo = hi, hi *= 2;
    if (hi > 1e6) throw InputError("the co-located data-parallel run is slower than any factor explains");
  }
  for (int i = 0; i < 100 && hi - lo > 1e-12 * hi; ++i) {
    const double mid = 0.5 * (lo + hi);
    (stepAt(mid) < run.step_seconds ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}


}  // namespace

HostContention fitHostContention(const Profile& p, const ColocatedRun& run, const SimOptions& opts) {
  return fitHostContention(p, std::vector<ColocatedRun>{run}, opts);
}

HostContention fitHostContention(const Profile& p, const std::vector<ColocatedRun>& runs, const SimOptions& opts) {
  if (runs.empty()) throw InputError("no co-located run to fit");
  std::map<int, std::vector<double>> by_count, busy_by_count;  // process count -> each run's factor
  for (const ColocatedRun& run : runs) {
    if (run.plan.stages == 1)
      busy_by_count[runProcesses(run)].push_back(busyFactorOf(p, run, opts));
    else
      by_count[runProcesses(run)].push_back(colocatedFactor(p, run, opts));
  }
  if (by_count.empty()) throw InputError("no co-located pipeline run to fit");
  HostContention h;
  h.factors[1] = 1.0;
  for (const auto& [n, fs] : by_count) h.factors[n] = std::max(1.0, colocatedMedian(fs));
  for (const auto& [n, fs] : busy_by_count) h.busy_factors[n] = std::max(1.0, colocatedMedian(fs));
  for (const ColocatedRun& run : runs) h.measured_on += (h.measured_on.empty() ? "" : "; ") + run.label;
  Profile fitted = p;
  fitted.host_contention = h;  // pipeline_step_s 0: the residuals
  std::vector<double> beyond;
  for (const ColocatedRun& run : runs)
    if (run.plan.stages > 1) beyond.push_back(run.step_seconds - simulate(fitted, run.plan, opts).step_seconds);
  h.pipeline_step_s = std::max(0.0, colocatedMedian(beyond));
  return h;
}

double wholeModelSeconds(std::vector<double> samples) {
  if (samples.empty()) throw InputError("no whole-model time");
  return colocatedMedian(std::move(samples));
}

void rescaleLayerCompute(Profile& p, double ratio) {
  if (!(ratio > 0) || !std::isfinite(ratio)) throw InputError("rescaleLayerCompute: a ratio > 0 expected");
  for (LayerCost& c : p.layers) {
    const double quantize = p.quantize_s_per_value * static_cast<double>(c.params + c.tied_params);
    const double timed = std::max(0.0, c.backward_s - quantize);
    c.forward_s *= ratio, c.forward_nograd_s *= ratio, c.recompute_s *= ratio;
    c.backward_s = timed * ratio + quantize;
  }
}

}  // namespace morph
