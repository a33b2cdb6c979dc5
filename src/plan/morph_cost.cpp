#include "plan/morph_cost.h"

#include <algorithm>
#include <limits>
#include <map>

namespace morph {

int64_t morphHorizon(int64_t steps_left) {
  if (steps_left < 0) return kMorphHorizonSteps;
  return std::max<int64_t>(1, std::min(steps_left, kMorphHorizonSteps));
}

std::vector<int64_t> layerMoveBytes(const Profile& profile) {
  std::vector<int64_t> out;
  for (const LayerCost& l : profile.layers) out.push_back(l.param_bytes + l.optimizer_bytes + l.buffer_bytes);
  return out;
}

double moveSeconds(const std::vector<MorphTransfer>& transfers, const std::vector<int64_t>& layer_bytes,
                   const LinearFit& p2p) {
  constexpr double kLengthBytes = 8;  // the int64 length message ahead of each layer
  std::map<int, double> in, out;
  for (const MorphTransfer& t : transfers) {
    const double b = t.layer < layer_bytes.size() ? static_cast<double>(layer_bytes[t.layer]) : 0.0;
    const double s = p2p.at(kLengthBytes) + p2p.at(b);
    in[t.dst] += s;
    out[t.src] += s;
  }
  double worst = 0;
  for (const auto& [rank, s] : in) worst = std::max(worst, s);
  for (const auto& [rank, s] : out) worst = std::max(worst, s);
  return worst;
}

MorphCost morphCost(const MorphCostInput& in, const MorphShape& shape, const std::vector<size_t>& cuts,
                    double step_seconds) {
  MorphCost c;
  c.step_seconds = step_seconds;
  c.horizon = std::max<int64_t>(1, in.horizon);
  const MorphPlan mp = planMorph(in.morph, shape, cuts);
  c.live = mp.live;
  if (mp.live) {
    c.bytes_moved = mp.bytes_moved;
    c.transfers = mp.transfers.size();
    c.move_seconds = moveSeconds(mp.transfers, in.morph.layer_bytes, in.p2p);
  } else {
    // Every member reloads the checkpoint and the steps since are done
    // again, at this candidate's step time.
    const int64_t ck = in.checkpoint_step ? in.checkpoint_step() : -1;
    c.feasible = ck >= 0 && mp.members.size() == static_cast<size_t>(shape.workers());
    c.steps_redone = c.feasible ? std::max<int64_t>(0, mp.step - ck) : 0;
    c.redo_seconds = static_cast<double>(c.steps_redone) * step_seconds;
  }
  c.total_seconds = c.feasible ? c.move_seconds + c.redo_seconds + static_cast<double>(c.horizon) * step_seconds
                               : std::numeric_limits<double>::infinity();
  return c;
}

size_t cheapestMorph(const std::vector<MorphCost>& costs) {
  size_t best = 0;
  for (size_t i = 1; i < costs.size(); ++i)
    if (costs[i].total_seconds < costs[best].total_seconds) best = i;
  return best;
}

bool morphPays(const MorphCost& cost, double now_step_seconds, double gain) {
  return cost.feasible &&
         cost.total_seconds < gain * static_cast<double>(std::max<int64_t>(1, cost.horizon)) * now_step_seconds;
}

std::vector<MorphCandidate> steadyHolders(int stages, int replicas, const std::vector<size_t>& cuts, int joiners) {
  std::vector<MorphCandidate> out;
  int64_t id = 0;
  for (int r = 0; r < stages * replicas; ++r) {
    const size_t k = static_cast<size_t>(r % stages);
    MorphCandidate c;
    c.id = id++;
    c.step = 0;
    if (k + 1 < cuts.size()) c.held_lo = cuts[k], c.held_hi = cuts[k + 1];
    out.push_back(c);
  }
  for (int j = 0; j < joiners; ++j) out.push_back({id++, -1, 0, 0});
  return out;
}

}  // namespace morph
