// Morphing a pipeline job: given the workers the manager has after a
// membership change (survivors with the layers they hold, and joiners),
// chooses the next generation's shape (stages P, replicas D, cut), which
// worker runs which stage, and which layers move between workers. Pure
// logic: the manager publishes the result, the workers carry it out
// (docs/pipeline.md, "Morphing"). Never touches tensors or the network.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace morph {

// A worker the next generation may use.
struct MorphCandidate {
  int64_t id = -1;
  // Its committed step (survivors), or -1 (a joiner, which holds nothing).
  int64_t step = -1;
  // The layers it holds at that step, [held_lo, held_hi) (empty: none).
  size_t held_lo = 0, held_hi = 0;
  // It lost only the last collective of the next step (StepCore::
  // prepared()): where another member committed that step, it can finish
  // it and so holds its layers at step + 1 too.
  bool prepared = false;
};

struct MorphInput {
  // Survivors first, then joiners: earlier candidates are preferred.
  std::vector<MorphCandidate> candidates;
  int stages = 1;             // the current pipeline's depth
  std::vector<size_t> cuts;   // and its cut (stages + 1 boundaries)
  int target = 1;             // the most workers the job may use
  int64_t virtual_nodes = 1;  // replicas need at least one VN each
  std::vector<int64_t> layer_bytes;  // per layer: what moving it costs (parameters and state)
  // Layers that use a weight another layer owns: (user, owner).
  std::vector<std::pair<size_t, size_t>> tied;
};

struct MorphShape {
  int stages = 0, replicas = 0;
  int workers() const { return stages * replicas; }
};

// The documented rule without a profile: keep the depth and use as many
// replicas as `workers` allow (at most `target` workers, one VN per replica
// at least); with fewer workers than stages, the deepest pipeline the
// workers fill, down to one stage; at most one stage per layer. `fits`
// (memory; may be null) must hold for the shape: when the depth kept does
// not fit with the replicas at hand, deeper pipelines are tried (each
// stage holds less). {0, 0} when no shape fits.
MorphShape chooseMorphShape(int workers, int stages, int target, int64_t virtual_nodes, size_t layers,
                            const std::function<bool(int stages, int replicas)>& fits);

struct MorphTransfer {
  size_t layer;
  int src, dst;  // world ranks of the next generation
};

struct MorphPlan {
  MorphShape shape;
  std::vector<size_t> cuts;
  std::vector<int64_t> members;   // by world rank (= replica * stages + stage)
  std::vector<int64_t> spares;    // placeable workers it does not use
  int64_t step = -1;              // the step the generation starts from
  // Live: every layer the new placement needs is held at `step` by some
  // member, and moves from there; meta_source (a rank at `step`) gives the
  // step counter and scale state to the others.
  bool live = true;
  int meta_source = -1;
  std::vector<MorphTransfer> transfers;
  int64_t bytes_moved = 0;  // sum of layer_bytes over the transfers
  // Ranks whose member has step - 1 committed and `step` prepared: each
  // finishes that step from its buffer before state moves.
  std::vector<int> finishing;
  // Not live: some layer has no holder at `step`; every member loads its
  // layers from the newest checkpoint instead (which the manager names).
  std::string why_not_live;
};

// Places the workers of `shape` (cut `cuts`): each slot takes the candidate
// that already holds the most of the slot's layers at the newest committed
// step (ties: candidate order), then every missing layer comes from a holder,
// spreading the sends over holders.
MorphPlan planMorph(const MorphInput& in, const MorphShape& shape, const std::vector<size_t>& cuts);

// The layers world rank `rank`'s stage needs: [cuts[k], cuts[k+1]) and the
// owners of weights they use that sit elsewhere.
std::vector<size_t> layersNeeded(const std::vector<size_t>& cuts, int stage,
                                 const std::vector<std::pair<size_t, size_t>>& tied);

}  // namespace morph
