// Morph cost: what re-planning a pipeline job to a candidate plan costs over
// the next K steps, so that the manager weighs the state a morph must move
// and the steps it must redo against the step time it buys
// (docs/planner.md, "Morph choices: what a morph moves").
//
//   total = move_seconds + steps_redone x step + K x step
//
// The layers that move are those planMorph() (morph_plan.h) would move for
// the candidate's shape and cut, from the same workers; their bytes are the
// profile's per-layer parameter, optimiser-state and buffer bytes, and their
// time the profile's point-to-point fit. Pure logic: no tensors, no store,
// no clock; never reads src/control.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "plan/morph_plan.h"
#include "plan/profile.h"

namespace morph {

// K, at most: a faster plan repays its morph only until the next membership
// change, which nobody can foresee (docs/planner.md says why 100).
constexpr int64_t kMorphHorizonSteps = 100;
// K for a job with `steps_left` steps to go (< 0: unknown): the steps left,
// at most kMorphHorizonSteps, at least 1.
int64_t morphHorizon(int64_t steps_left);

// Per layer: the bytes a morph moves for it, parameters + optimiser state +
// buffers (the profile's memory figures).
std::vector<int64_t> layerMoveBytes(const Profile& profile);

// Seconds the transfers take: each layer is two messages (its length, 8
// bytes, then its body) on the p2p fit; a rank sends its layers one after
// another and receives its layers one after another, ranks in parallel
// (exec/pipeline.cpp, moveLayers()); the slowest rank's sends or receives.
double moveSeconds(const std::vector<MorphTransfer>& transfers, const std::vector<int64_t>& layer_bytes,
                   const LinearFit& p2p);

struct MorphCostInput {
  // The workers at hand and the layers each holds (morph_plan.h); its
  // layer_bytes are what a layer costs to move (layerMoveBytes()).
  MorphInput morph;
  LinearFit p2p;        // the profile's point-to-point fit
  int64_t horizon = 1;  // K (morphHorizon())
  // The newest intact checkpoint's step, -1 when none. Asked only for a
  // candidate that cannot morph live (a layer it needs has no holder among
  // its members); may be null (no checkpoint).
  std::function<int64_t()> checkpoint_step;
};

struct MorphCost {
  bool feasible = true;  // false: not live and no checkpoint to redo from
  bool live = true;
  int64_t bytes_moved = 0;
  size_t transfers = 0;
  double move_seconds = 0;  // live transfers; a reload from the checkpoint is not charged
  int64_t steps_redone = 0; // not live: the steps since the checkpoint, done again
  double redo_seconds = 0;  // steps_redone x step_seconds
  double step_seconds = 0;  // the candidate's predicted step
  int64_t horizon = 1;      // K
  double total_seconds = 0; // move + redo + K x step; infinity when not feasible
};

// What morphing the workers of `in` to `shape` cut at `cuts` costs, the
// candidate's step being `step_seconds`.
MorphCost morphCost(const MorphCostInput& in, const MorphShape& shape, const std::vector<size_t>& cuts,
                    double step_seconds);

// The cheapest of `costs` by total_seconds; ties go to the earlier (the
// planner ranks its plans by step time, fastest first). 0 when empty.
size_t cheapestMorph(const std::vector<MorphCost>& costs);

// Whether morphing at `cost` beats keeping the current plan, whose step is
// `now_step_seconds`, over the same K steps by the factor `gain` (< 1: the
// margin the predictions need): cost.total_seconds < gain x K x now.
bool morphPays(const MorphCost& cost, double now_step_seconds, double gain);

// The workers of a pipeline that runs in steady state (every member holds
// its stage's layers at the same step), ids 0.. in world rank order, then
// `joiners` workers holding nothing: what a growth decision morphs from.
std::vector<MorphCandidate> steadyHolders(int stages, int replicas, const std::vector<size_t>& cuts, int joiners);

}  // namespace morph
