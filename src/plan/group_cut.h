// A cut per virtual worker (HetPipe; issue 30): groups of devices of
// different mixes cut the model differently, each by the exact DP for its
// own devices, against one cut shared by every group.
//
// With per-group cuts, stage k of one group and stage k of another hold
// different layers, so a stage's replicas no longer hold the same
// gradient segments. Morph's gradients are exact fixed-point sums per
// parameter tensor (int64, associative): any set of ranks that holds a
// layer can sum it exactly, whatever the cuts. The ranks that must sum
// together are those holding the same layers: the common refinement of
// every group's cut (reduceBlocks()), each block summed among its D
// holders, one per group. `morph run` forms one "stage" process group per
// stage index (a shared cut), so it runs only shared cuts; the planner
// compares the two (docs/planner.md, "A cut per group").
//
// Pure logic: no tensors, no I/O.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "plan/partitioner.h"

namespace morph {

// Layers [first, end) held by stage `stage[d]` of group d in every group.
struct ReduceBlock {
  size_t first = 0, end = 0;
  std::vector<int> stage;  // per group
};

// The common refinement of the groups' cuts, front to back. Every group's
// cut must have the same depth and cover the same layers (InputError).
std::vector<ReduceBlock> reduceBlocks(const std::vector<std::vector<size_t>>& group_cuts);

// InputError unless every cut has `stages` + 1 strictly increasing
// boundaries from 0 to `layers`, one per group.
void checkGroupCuts(size_t layers, int stages, size_t groups, const std::vector<std::vector<size_t>>& group_cuts);

// Per group (its devices' types, one entry per device; every group of the
// same depth), its own best order and cut: bestDevicePipeline(), once per
// distinct composition. nullopt for a group that nothing fits.
std::vector<std::optional<DevicePipeline>> perGroupPipelines(size_t layers,
                                                             const std::vector<std::vector<int>>& groups,
                                                             const DeviceStageFns& fns);

// One cut for every group, each group's devices in the order given (stage
// k of group d on groups[d][k]): the cut whose slowest stage over every
// group is fastest, every stage within its device's cap (an exact DP: stage
// k's time is the largest over the groups). nullopt when none fits.
std::optional<StageCut> sharedCut(size_t layers, const std::vector<std::vector<int>>& groups,
                                  const DeviceStageFns& fns);

}  // namespace morph
