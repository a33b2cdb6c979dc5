// Hand-made profiles (and requests) for the plan tests: layer l is named "l<l>" and has,
// unless `set` says otherwise, 10 parameters of 40 bytes, 1000 output bytes
// and no compute; communication is free and the host has cores enough for
// every rank.
#pragma once

#include <functional>
#include <string>

#include "plan/planner.h"
#include "plan/profile.h"

namespace morph {

inline Profile handProfile(size_t layers, const std::function<void(size_t, LayerCost&)>& set) {
  Profile p;
  p.host_cores = 64;
  p.fingerprint.reduce_mode = "exact";
  for (size_t l = 0; l < layers; ++l) {
    LayerCost c;
    c.name = "l" + std::to_string(l);
    c.output_bytes = 1000;
    c.params = 10;
    c.param_bytes = 40;
    set(l, c);
    p.layers.push_back(c);
    p.fingerprint.layers.push_back(c.name);
  }
  for (auto* m : {&p.allreduce_exact, &p.allreduce_float, &p.allreduce_max}) (*m)[2] = LinearFit{};
  return p;
}

// A request for the hand-made pools: `workers` devices, `vns` VNs, 1F1B
// only, no recomputation (each test adds its devices' costs and limits).
inline PlanRequest handRequest(int workers, int64_t vns) {
  PlanRequest rq;
  rq.workers = workers;
  rq.virtual_nodes = vns;
  rq.schedules = {ScheduleKind::k1F1B};
  rq.try_recompute = false;
  return rq;
}

}  // namespace morph
