#include "plan/morph_plan.h"

#include <algorithm>
#include <map>

namespace morph {

MorphShape chooseMorphShape(int workers, int stages, int target, int64_t virtual_nodes, size_t layers,
                            const std::function<bool(int stages, int replicas)>& fits) {
  workers = std::min(workers, target);
  if (workers <= 0 || stages <= 0 || layers == 0) return {};
  auto ok = [&](int p, int d) { return !fits || fits(p, d); };
  auto replicas = [&](int p) { return static_cast<int>(std::min<int64_t>(workers / p, virtual_nodes)); };
  const int deepest = std::min<int>(workers, static_cast<int>(layers));
  if (workers >= stages) {
    // Fewer replicas would give each more VNs to hold, so only deeper
    // pipelines can fit where this one does not.
    for (int p = stages; p <= std::max(stages, deepest); ++p)
      if (ok(p, replicas(p))) return {p, replicas(p)};
    return {};
  }
  for (int p = deepest; p >= 1; --p)
    if (ok(p, 1)) return {p, 1};
  return {};
}

std::vector<size_t> layersNeeded(const std::vector<size_t>& cuts, int stage,
                                 const std::vector<std::pair<size_t, size_t>>& tied) {
  const size_t lo = cuts[static_cast<size_t>(stage)], hi = cuts[static_cast<size_t>(stage) + 1];
  std::vector<size_t> out;
  for (size_t l = lo; l < hi; ++l) out.push_back(l);
  for (const auto& [user, owner] : tied)
    if (lo <= user && user < hi && (owner < lo || owner >= hi) &&
        std::find(out.begin(), out.end(), owner) == out.end())
      out.push_back(owner);
  std::sort(out.begin(), out.end());
  return out;
}

MorphPlan planMorph(const MorphInput& in, const MorphShape& shape, const std::vector<size_t>& cuts) {
  MorphPlan plan;
  plan.shape = shape;
  plan.cuts = cuts;
  const int P = shape.stages, slots = shape.workers();
  for (const MorphCandidate& c : in.candidates) plan.step = std::max(plan.step, c.step);
  const int64_t S = plan.step;
  // S is a committed step (never a prepared one's): a member that got
  // through the step's last collective shows that every member had its sums.
  auto holds = [&](const MorphCandidate& c, size_t l) {
    return S >= 0 && (c.step == S || (c.prepared && c.step + 1 == S)) && c.held_lo <= l && l < c.held_hi;
  };
  auto bytes = [&](size_t l) { return l < in.layer_bytes.size() ? in.layer_bytes[l] : 0; };
  std::vector<std::vector<size_t>> need(static_cast<size_t>(slots));
  for (int r = 0; r < slots; ++r) need[static_cast<size_t>(r)] = layersNeeded(cuts, r % P, in.tied);

  // Repeatedly the (slot, candidate) pair whose candidate already holds the
  // most of the slot's layers (by bytes, each layer counting at least 1),
  // so that as little as possible moves; ties go to the earlier slot and
  // the earlier candidate.
  std::vector<int> slot_of(in.candidates.size(), -1);
  std::vector<int> cand_of(static_cast<size_t>(slots), -1);
  while (true) {
    int best_slot = -1, best_cand = -1;
    int64_t best = 0;
    for (int r = 0; r < slots; ++r) {
      if (cand_of[static_cast<size_t>(r)] >= 0) continue;
      for (size_t c = 0; c < in.candidates.size(); ++c) {
        if (slot_of[c] >= 0) continue;
        int64_t overlap = 0;
        for (size_t l : need[static_cast<size_t>(r)])
          if (holds(in.candidates[c], l)) overlap += bytes(l) + 1;
        if (overlap > best) best = overlap, best_slot = r, best_cand = static_cast<int>(c);
      }
    }
    if (best_slot < 0) break;
    cand_of[static_cast<size_t>(best_slot)] = best_cand;
    slot_of[static_cast<size_t>(best_cand)] = best_slot;
  }
  // The slots no holder fits: the remaining candidates in order.
  size_t next = 0;
  for (int r = 0; r < slots; ++r) {
    if (cand_of[static_cast<size_t>(r)] >= 0) continue;
    while (next < in.candidates.size() && slot_of[next] >= 0) ++next;
    if (next == in.candidates.size()) break;
    cand_of[static_cast<size_t>(r)] = static_cast<int>(next);
    slot_of[next] = r;
  }
  for (int r = 0; r < slots; ++r)
    if (cand_of[static_cast<size_t>(r)] >= 0)
      plan.members.push_back(in.candidates[static_cast<size_t>(cand_of[static_cast<size_t>(r)])].id);
  for (size_t c = 0; c < in.candidates.size(); ++c)
    if (slot_of[c] < 0) plan.spares.push_back(in.candidates[c].id);
  if (static_cast<int>(plan.members.size()) < slots) {
    plan.live = false;
    plan.why_not_live = "fewer workers than the shape needs";
    return plan;
  }

  auto member = [&](int r) -> const MorphCandidate& {
    return in.candidates[static_cast<size_t>(cand_of[static_cast<size_t>(r)])];
  };
  for (int r = 0; r < slots && plan.meta_source < 0; ++r)
    if (S >= 0 && member(r).step == S) plan.meta_source = r;
  if (plan.meta_source < 0) {
    plan.live = false;
    plan.why_not_live = "no member holds the state of a committed step";
    return plan;
  }
  for (int r = 0; r < slots; ++r)
    if (member(r).prepared && member(r).step + 1 == S) plan.finishing.push_back(r);
  // Each missing layer from the holder that has sent the fewest bytes so far.
  std::map<int, int64_t> sent;
  for (int r = 0; r < slots; ++r) {
    for (size_t l : need[static_cast<size_t>(r)]) {
      if (holds(member(r), l)) continue;
      int src = -1;
      for (int h = 0; h < slots; ++h)
        if (holds(member(h), l) && (src < 0 || sent[h] < sent[src])) src = h;
      if (src < 0) {
        plan.live = false;
        plan.why_not_live = "no surviving worker holds layer " + std::to_string(l) + " at step " + std::to_string(S);
        plan.transfers.clear();
        plan.bytes_moved = 0;
        plan.finishing.clear();
        return plan;
      }
      sent[src] += bytes(l);
      plan.bytes_moved += bytes(l);
      plan.transfers.push_back({l, src, r});
    }
  }
  return plan;
}

}  // namespace morph
