// Virtual workers (HetPipe §8): a pool of mixed devices grouped into D
// pipelines of P devices each. Every group runs the same cut (its stages
// are summed with the same stages of the other groups), each in its own
// device order, and faster groups get more VNs; the planner chooses both.
// These functions only form the groups; the planner evaluates them.
//
// Policies, as HetPipe names them (our reading, docs/resources.md):
//  NP  node partition: a group is one host's devices (every host must have
//      the same number).
//  ED  equal distribution: every group gets the same number of devices of
//      every type (D = the greatest common divisor of the type counts).
//  HD  hybrid distribution: types are paired fastest with slowest (the
//      second fastest with the second slowest, ...); a group takes half
//      its devices from each type of one pair. Same depth as ED.
// and the planner's own two shapes on the D * P fastest devices:
//  sorted    group i = the i-th block of P devices in speed order
//            (fast groups and slow groups);
//  balanced  devices dealt in speed order to the groups, back and forth
//            (every group as fast as the others, as far as counts allow).
//
// Pure logic: no tensors, no I/O. Never reads src/control.
#pragma once

#include <string>
#include <vector>

namespace morph {

struct PoolDevice {
  int type = 0;      // index of its (speed, memory) class
  // Its speed, as the time of a VN (a compute factor, or with per-layer
  // type profiles one VN's seconds through the model): only compared.
  double slowdown = 1.0;
  int host = 0;      // index of its host
};

struct Grouping {
  std::string policy;                    // "NP", "ED", "HD", "sorted", "balanced"
  std::vector<std::vector<int>> groups;  // D groups of P device indices (ascending)
  std::string why_not;                   // non-empty: the policy does not apply to this pool
};

Grouping groupNodePartition(const std::vector<PoolDevice>& pool);
Grouping groupEqualDistribution(const std::vector<PoolDevice>& pool);
Grouping groupHybrid(const std::vector<PoolDevice>& pool);
// NP, ED and HD, in that order.
std::vector<Grouping> allocationPolicies(const std::vector<PoolDevice>& pool);

// The D * P first devices of `by_speed` (device indices, fastest first)
// into D groups of P: contiguous blocks (sorted) or dealt back and forth
// (balanced).
Grouping groupBySpeed(const std::vector<int>& by_speed, int stages, int groups, bool balanced);

}  // namespace morph
