#include "plan/group_cut.h"

#include <algorithm>
#include <map>
#include <string>

#include "core/error.h"

namespace morph {

void checkGroupCuts(size_t layers, int stages, size_t groups, const std::vector<std::vector<size_t>>& group_cuts) {
  if (group_cuts.size() != groups)
    throw InputError("the plan has " + std::to_string(group_cuts.size()) + " group cuts for " +
                     std::to_string(groups) + " replicas");
  for (size_t d = 0; d < group_cuts.size(); ++d) {
    const std::vector<size_t>& c = group_cuts[d];
    if (c.size() != static_cast<size_t>(stages) + 1 || c.front() != 0 || c.back() != layers)
      throw InputError("replica " + std::to_string(d) + "'s cut does not cover the " + std::to_string(layers) +
                       " layers in " + std::to_string(stages) + " stages");
    for (size_t k = 0; k + 1 < c.size(); ++k)
      if (c[k] >= c[k + 1])
        throw InputError("stage " + std::to_string(k) + " of replica " + std::to_string(d) + " has no layer");
  }
}

std::vector<ReduceBlock> reduceBlocks(const std::vector<std::vector<size_t>>& group_cuts) {
  if (group_cuts.empty()) return {};
  const size_t layers = group_cuts.front().back();
  checkGroupCuts(layers, static_cast<int>(group_cuts.front().size()) - 1, group_cuts.size(), group_cuts);
  std::vector<size_t> bounds;
  for (const auto& c : group_cuts) bounds.insert(bounds.end(), c.begin(), c.end());
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  std::vector<ReduceBlock> out;
  std::vector<size_t> at(group_cuts.size(), 0);  // per group, the stage holding the next block
  for (size_t b = 0; b + 1 < bounds.size(); ++b) {
    ReduceBlock blk{bounds[b], bounds[b + 1], {}};
    for (size_t d = 0; d < group_cuts.size(); ++d) {
      while (group_cuts[d][at[d] + 1] <= blk.first) ++at[d];
      blk.stage.push_back(static_cast<int>(at[d]));
    }
    out.push_back(std::move(blk));
  }
  return out;
}

std::vector<std::optional<DevicePipeline>> perGroupPipelines(size_t layers,
                                                             const std::vector<std::vector<int>>& groups,
                                                             const DeviceStageFns& fns) {
  std::map<std::vector<int>, std::optional<DevicePipeline>> seen;  // by composition: its devices' types, sorted
  std::vector<std::optional<DevicePipeline>> out;
  for (const std::vector<int>& g : groups) {
    std::vector<int> comp = g;
    std::sort(comp.begin(), comp.end());
    auto it = seen.find(comp);
    if (it == seen.end()) it = seen.emplace(comp, bestDevicePipeline(layers, comp, fns)).first;
    out.push_back(it->second);
  }
  return out;
}

std::optional<StageCut> sharedCut(size_t layers, const std::vector<std::vector<int>>& groups,
                                  const DeviceStageFns& fns) {
  if (groups.empty() || groups.front().empty()) return std::nullopt;
  const size_t P = groups.front().size();
  for (const auto& g : groups)
    if (g.size() != P) throw InputError("a shared cut needs groups of one depth");
  // Position k is a "type" of its own: its time the slowest group's device
  // there, its cap the tightest; then one order, the DP's exact cut.
  DeviceStageFns pos;
  pos.seconds = [&](size_t i, size_t j, int k) {
    double t = 0;
    for (const auto& g : groups) t = std::max(t, fns.seconds(i, j, g[static_cast<size_t>(k)]));
    return t;
  };
  pos.bytes = fns.bytes;
  if (fns.seconds_lb)
    pos.seconds_lb = [&](size_t i, size_t j, int k) {
      double t = 0;
      for (const auto& g : groups) t = std::max(t, fns.seconds_lb(i, j, g[static_cast<size_t>(k)]));
      return t;
    };
  std::vector<int> order;
  for (size_t k = 0; k < P; ++k) {
    int64_t cap = 0;
    for (const auto& g : groups) {
      const int64_t c = fns.caps.empty() ? 0 : fns.caps[static_cast<size_t>(g[k])];
      if (c > 0) cap = cap > 0 ? std::min(cap, c) : c;
    }
    pos.caps.push_back(cap);
    order.push_back(static_cast<int>(k));
  }
  auto d = bestDevicePipeline(layers, order, pos, false);
  if (!d) return std::nullopt;
  return d->cut;
}

}  // namespace morph
