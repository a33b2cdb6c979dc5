#include "plan/allocation.h"

#include <algorithm>
#include <map>
#include <numeric>

namespace morph {

namespace {

// Device indices of each type, types fastest first (ties: lower index).
std::vector<std::vector<int>> byType(const std::vector<PoolDevice>& pool) {
  std::map<int, std::vector<int>> of;
  for (size_t i = 0; i < pool.size(); ++i) of[pool[i].type].push_back(static_cast<int>(i));
  std::vector<std::vector<int>> out;
  for (auto& [t, devs] : of) out.push_back(devs);
  std::stable_sort(out.begin(), out.end(), [&](const auto& a, const auto& b) {
    return pool[static_cast<size_t>(a[0])].slowdown < pool[static_cast<size_t>(b[0])].slowdown;
  });
  return out;
}

void sortGroups(Grouping& g) {
  for (auto& grp : g.groups) std::sort(grp.begin(), grp.end());
}

}  // namespace

Grouping groupNodePartition(const std::vector<PoolDevice>& pool) {
  Grouping g{"NP", {}, {}};
  std::map<int, std::vector<int>> hosts;
  for (size_t i = 0; i < pool.size(); ++i) hosts[pool[i].host].push_back(static_cast<int>(i));
  for (auto& [h, devs] : hosts) {
    if (!g.groups.empty() && devs.size() != g.groups.front().size()) {
      g.why_not = "the hosts have different numbers of devices";
      g.groups.clear();
      return g;
    }
    g.groups.push_back(devs);
  }
  return g;
}

Grouping groupEqualDistribution(const std::vector<PoolDevice>& pool) {
  Grouping g{"ED", {}, {}};
  const auto types = byType(pool);
  size_t D = 0;
  for (const auto& t : types) D = std::gcd(D, t.size());
  if (D == 0) {
    g.why_not = "no devices";
    return g;
  }
  g.groups.assign(D, {});
  for (const auto& t : types)
    for (size_t i = 0; i < t.size(); ++i) g.groups[i / (t.size() / D)].push_back(t[i]);
  sortGroups(g);
  return g;
}

Grouping groupHybrid(const std::vector<PoolDevice>& pool) {
  Grouping g{"HD", {}, {}};
  const auto types = byType(pool);
  if (types.size() < 2) {
    g.why_not = "one device type";
    return g;
  }
  const Grouping ed = groupEqualDistribution(pool);
  const size_t P = ed.groups.front().size();
  if (P % 2 != 0) {
    g.why_not = "ED's groups have an odd number of devices (" + std::to_string(P) + ")";
    return g;
  }
  const size_t T = types.size();
  for (size_t a = 0, b = T - 1; a <= b; ++a, --b) {
    const auto& x = types[a];
    const auto& y = types[b];
    if (a == b) {  // the middle type of an odd count: groups of it alone
      if (x.size() % P != 0) {
        g.why_not = "the middle type's " + std::to_string(x.size()) + " devices do not fill groups of " +
                    std::to_string(P);
        g.groups.clear();
        return g;
      }
      for (size_t i = 0; i < x.size(); i += P) g.groups.emplace_back(x.begin() + static_cast<long>(i), x.begin() + static_cast<long>(i + P));
      break;
    }
    if (x.size() != y.size() || x.size() % (P / 2) != 0) {
      g.why_not = "paired types have different counts or do not fill half groups of " + std::to_string(P);
      g.groups.clear();
      return g;
    }
    for (size_t i = 0; i < x.size(); i += P / 2) {
      std::vector<int> grp(x.begin() + static_cast<long>(i), x.begin() + static_cast<long>(i + P / 2));
      grp.insert(grp.end(), y.begin() + static_cast<long>(i), y.begin() + static_cast<long>(i + P / 2));
      g.groups.push_back(std::move(grp));
    }
    if (b == 0) break;
  }
  sortGroups(g);
  return g;
}

std::vector<Grouping> allocationPolicies(const std::vector<PoolDevice>& pool) {
  return {groupNodePartition(pool), groupEqualDistribution(pool), groupHybrid(pool)};
}

Grouping groupBySpeed(const std::vector<int>& by_speed, int stages, int groups, bool balanced) {
  Grouping g{balanced ? "balanced" : "sorted", {}, {}};
  const size_t P = static_cast<size_t>(stages), D = static_cast<size_t>(groups);
  g.groups.assign(D, {});
  for (size_t i = 0; i < P * D && i < by_speed.size(); ++i) {
    const size_t round = i / D, pos = i % D;
    const size_t d = !balanced ? i / P : round % 2 == 0 ? pos : D - 1 - pos;
    g.groups[d].push_back(by_speed[i]);
  }
  sortGroups(g);
  return g;
}

}  // namespace morph
