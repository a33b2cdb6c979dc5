#include "plan/partitioner.h"

#include <algorithm>
#include <type_traits>
#include <utility>

namespace morph {
namespace {

// Best way to cut the suffix [i, L) into r stages, for every (r, i). Both
// entry points are this one DP with a different stage cost, combined by max.
template <typename T>
struct Table {
  std::vector<std::vector<T>> best;       // best[r][i]; meaningful iff next[r][i] != 0
  std::vector<std::vector<size_t>> next;  // end j of the first stage; 0 = infeasible (j > i)
  // bytes(i, next, r) of that stage, once known: the DP evaluates it when a
  // cap needs it, the walk otherwise. One node, one triple: never twice.
  std::vector<std::vector<std::optional<int64_t>>> bytes;
};

// cost(i, j, r) -> optional<pair<T, optional<int64_t>>>: the stage's cost and,
// if computed on the way, its bytes; nullopt when the stage does not fit.
// Only the stage placed r-th from the end is asked about, and only when the
// rest [j, L) can be cut into r - 1 stages, so callbacks run for no dead end.
// lb(i, j, r): a bound <= the stage's cost, nondecreasing in j (or null):
// once it reaches the best found for (r, i), no wider stage can win.
// With a cutoff, stages and suffixes costing cutoff or more are dropped
// (the caller only wants answers below it).
template <typename T, typename Cost, typename Lb = std::nullptr_t>
Table<T> solve(size_t L, int R, Cost cost, Lb lb = nullptr, std::optional<T> cutoff = std::nullopt) {
  const size_t rows = static_cast<size_t>(R) + 1;
  Table<T> t{std::vector<std::vector<T>>(rows, std::vector<T>(L + 1)),
             std::vector<std::vector<size_t>>(rows, std::vector<size_t>(L + 1, 0)),
             std::vector<std::vector<std::optional<int64_t>>>(
                 rows, std::vector<std::optional<int64_t>>(L + 1))};
  t.next[0][L] = L;  // zero stages fit exactly the empty suffix, at cost T{} (costs are >= 0)
  for (int r = 1; r <= R; ++r) {
    const size_t rest = static_cast<size_t>(r) - 1;  // stages after this one
    // The top row is only read at i == 0 (the whole model in R stages).
    const size_t last_i = r == R ? 0 : L - static_cast<size_t>(r);
    for (size_t i = 0; i <= last_i; ++i) {
      // Ascending j, replaced on strict improvement only: ties keep the
      // shortest first stage, so the answer is a function of the inputs.
      for (size_t j = i + 1; j + rest <= L; ++j) {
        if constexpr (!std::is_same_v<Lb, std::nullptr_t>) {
          const T low = lb(i, j, r);
          if (t.next[r][i] != 0 && !(low < t.best[r][i])) break;
          if (cutoff && !(low < *cutoff)) break;
        }
        if (t.next[r - 1][j] == 0) continue;
        auto c = cost(i, j, r);
        if (!c) continue;
        // Exact doubles, no epsilon: max() only picks among callback values.
        T v = std::max(c->first, t.best[r - 1][j]);
        if (cutoff && !(v < *cutoff)) continue;
        if (t.next[r][i] == 0 || v < t.best[r][i]) {
          t.best[r][i] = v;
          t.next[r][i] = j;
          t.bytes[r][i] = c->second;
        }
      }
    }
  }
  return t;
}

// The cut into P stages found by solve(), with per-stage bytes filled in.
template <typename T>
StageCut walk(Table<T>& t, int P, const StageCostFns& fns) {
  StageCut cut;
  cut.cuts.push_back(0);
  size_t i = 0;
  for (int r = P; r >= 1; --r) {
    const size_t j = t.next[r][i];
    auto& b = t.bytes[r][i];
    if (!b) b = fns.bytes(i, j, r);
    cut.bytes.push_back(*b);
    cut.cuts.push_back(j);
    i = j;
  }
  return cut;
}

}  // namespace

std::vector<std::optional<StageCut>> minMaxCuts(size_t layers, int max_stages, const StageCostFns& fns,
                                                int64_t cap) {
  std::vector<std::optional<StageCut>> out(static_cast<size_t>(std::max(max_stages, 0)));
  const int R = static_cast<int>(std::min<size_t>(out.size(), layers));
  if (R == 0) return out;
  // seconds(i, j) does not depend on r, so every row shares one lazy table.
  std::vector<std::optional<double>> secs((layers + 1) * (layers + 1));
  auto cost = [&](size_t i, size_t j, int r)
      -> std::optional<std::pair<double, std::optional<int64_t>>> {
    std::optional<int64_t> b;
    if (cap > 0) {
      b = fns.bytes(i, j, r);
      if (*b > cap) return std::nullopt;
    }
    auto& s = secs[i * (layers + 1) + j];
    if (!s) s = fns.seconds(i, j);
    return std::make_pair(*s, b);
  };
  Table<double> t = fns.seconds_lb ? solve<double>(layers, R, cost, [&](size_t i, size_t j, int) { return fns.seconds_lb(i, j); })
                                   : solve<double>(layers, R, cost);
  for (int P = 1; P <= R; ++P) {
    if (t.next[P][0] == 0) continue;
    StageCut cut = walk(t, P, fns);
    cut.bottleneck_s = t.best[P][0];
    out[static_cast<size_t>(P) - 1] = std::move(cut);
  }
  return out;
}

std::optional<StageCut> minPeakBytesCut(size_t layers, int stages, const StageCostFns& fns) {
  if (stages < 1 || static_cast<size_t>(stages) > layers) return std::nullopt;
  auto cost = [&](size_t i, size_t j, int r) {
    const int64_t b = fns.bytes(i, j, r);
    return std::optional<std::pair<int64_t, std::optional<int64_t>>>(std::make_pair(b, b));
  };
  Table<int64_t> t = solve<int64_t>(layers, stages, cost);
  StageCut cut = walk(t, stages, fns);
  // Stages are disjoint, so each (i, j) here is asked for once.
  for (size_t k = 0; k + 1 < cut.cuts.size(); ++k)
    cut.bottleneck_s = std::max(cut.bottleneck_s, fns.seconds(cut.cuts[k], cut.cuts[k + 1]));
  return cut;
}

std::optional<DevicePipeline> bestDevicePipeline(size_t layers, std::vector<int> types, const DeviceStageFns& fns,
                                                 bool all_orders) {
  const int P = static_cast<int>(types.size());
  if (P < 1 || static_cast<size_t>(P) > layers) return std::nullopt;
  int T = 0;
  for (int t : types) T = std::max(T, t + 1);
  // Shared by every order: time per (range, type), bytes per (range, r).
  const size_t n = layers + 1;
  // (-1: not asked yet; callbacks return >= 0.)
  std::vector<double> secs(n * n * static_cast<size_t>(T), -1.0);
  std::vector<int64_t> bytes(n * n * static_cast<size_t>(P + 1), -1);
  auto sec = [&](size_t i, size_t j, int t) {
    double& s = secs[(i * n + j) * static_cast<size_t>(T) + static_cast<size_t>(t)];
    if (s < 0) s = fns.seconds(i, j, t);
    return s;
  };
  auto mem = [&](size_t i, size_t j, int r) {
    int64_t& b = bytes[(i * n + j) * static_cast<size_t>(P + 1) + static_cast<size_t>(r)];
    if (b < 0) b = fns.bytes(i, j, r);
    return b;
  };
  std::optional<DevicePipeline> best;
  if (all_orders) std::sort(types.begin(), types.end());
  do {
    // Position k = P - r from the front.
    auto cost = [&](size_t i, size_t j, int r) -> std::optional<std::pair<double, std::optional<int64_t>>> {
      const int t = types[static_cast<size_t>(P - r)];
      const int64_t cap = fns.caps.empty() ? 0 : fns.caps[static_cast<size_t>(t)];
      const int64_t b = mem(i, j, r);
      if (cap > 0 && b > cap) return std::nullopt;
      return std::make_pair(sec(i, j, t), std::optional<int64_t>(b));
    };
    // Only an order strictly better than the best so far matters.
    auto lb = [&](size_t i, size_t j, int r) { return fns.seconds_lb(i, j, types[static_cast<size_t>(P - r)]); };
    const std::optional<double> cutoff = best ? std::optional<double>(best->cut.bottleneck_s) : std::nullopt;
    Table<double> tab = fns.seconds_lb ? solve<double>(layers, P, cost, lb, cutoff)
                                       : solve<double>(layers, P, cost, nullptr, cutoff);
    if (tab.next[static_cast<size_t>(P)][0] == 0) continue;
    if (best && !(tab.best[static_cast<size_t>(P)][0] < best->cut.bottleneck_s)) continue;
    StageCostFns plain{[&](size_t, size_t) { return 0.0; }, [&](size_t i, size_t j, int r) { return mem(i, j, r); }};
    DevicePipeline d;
    d.order = types;
    d.cut = walk(tab, P, plain);
    d.cut.bottleneck_s = tab.best[static_cast<size_t>(P)][0];
    best = std::move(d);
  } while (all_orders && std::next_permutation(types.begin(), types.end()));
  return best;
}

}  // namespace morph
