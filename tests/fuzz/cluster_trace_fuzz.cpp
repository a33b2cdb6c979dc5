// libFuzzer target: a cluster trace (traceFromJson, src/sched/cluster_sim.cpp)
// on arbitrary bytes, then, for what parses (at most 40 jobs, demands up to
// 64), the simulation of it under every policy on as many slots as the
// largest demand. Bad input must throw InputError; a crash, a sanitizer
// report, a hang, a broken policy rule (InternalError: a suspended job, a
// target outside [0, demand], more slots than exist) or a job that never
// ends is a bug. What is accepted must be consistent: every rate finite and
// > 0, every job ending after it arrived. Built and run by
// tests/fuzz/run_fuzz.sh.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "sched/cluster_sim.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  morph::sched::Trace t;
  try {
    t = morph::sched::traceFromJson(text, "fuzz.json");
  } catch (const morph::InputError&) {
    return 0;
  }
  int slots = 1;
  for (const auto& j : t.jobs) {
    if (j.demand < 1 || j.steps < 1 || j.priority < 1 || !(j.arrival >= 0)) __builtin_trap();
    for (int k = 1; k <= std::min(j.demand, 64); ++k) {
      const double r = j.speed.stepsPerSecond(k);
      if (!std::isfinite(r) || r <= 0) __builtin_trap();
    }
    slots = std::max(slots, j.demand);
  }
  if (t.jobs.size() > 40 || slots > 64) return 0;
  for (const auto& name : morph::sched::policyNames()) {
    morph::sched::SimConfig c;
    c.slots = slots;
    const auto r = morph::sched::simulateCluster(t, *morph::sched::makePolicy(name), c);
    for (const auto& j : r.jobs)
      if (!(j.end >= j.arrival) || !(j.start >= j.arrival)) __builtin_trap();
  }
  return 0;
}
