#include "control/manager/partitions.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "control/protocol/keys.h"
#include "control/protocol/message.h"
#include "control/protocol/reach_report.h"
#include "control/store_access.h"

namespace morph {

using namespace detail;

using json = nlohmann::json;

namespace {

struct Best {
  std::vector<size_t> set;  // indices into members, ascending
  double speed = 0;
  std::vector<int64_t> ids;  // sorted
};

bool better(const std::vector<size_t>& cand, const std::vector<int64_t>& members,
            const std::map<int64_t, double>& speed, const Best& best) {
  if (cand.size() != best.set.size()) return cand.size() > best.set.size();
  double s = 0;
  std::vector<int64_t> ids;
  for (size_t i : cand) {
    auto it = speed.find(members[i]);
    s += it == speed.end() ? 1.0 : it->second;
    ids.push_back(members[i]);
  }
  std::sort(ids.begin(), ids.end());
  if (s != best.speed) return s > best.speed;
  return ids < best.ids;
}

// Bron-Kerbosch with a pivot: every maximal group of members that all reach
// each other (a job has tens of workers at most: fine).
void expand(const std::vector<std::vector<bool>>& ok, std::vector<size_t>& r, std::vector<size_t> p,
            std::vector<size_t> x, const std::vector<int64_t>& members, const std::map<int64_t, double>& speed,
            Best& best) {
  if (p.empty() && x.empty()) {
    if (best.set.empty() || better(r, members, speed, best)) {
      std::vector<size_t> s = r;
      std::sort(s.begin(), s.end());
      best.set = s;
      best.speed = 0;
      best.ids.clear();
      for (size_t i : s) {
        auto it = speed.find(members[i]);
        best.speed += it == speed.end() ? 1.0 : it->second;
        best.ids.push_back(members[i]);
      }
      std::sort(best.ids.begin(), best.ids.end());
    }
    return;
  }
  size_t pivot = p.empty() ? x.front() : p.front();
  const std::vector<size_t> cands = [&] {
    std::vector<size_t> c;
    for (size_t v : p)
      if (!ok[pivot][v] || v == pivot) c.push_back(v);
    return c;
  }();
  for (size_t v : cands) {
    std::vector<size_t> np, nx;
    for (size_t u : p)
      if (ok[v][u]) np.push_back(u);
    for (size_t u : x)
      if (ok[v][u]) nx.push_back(u);
    r.push_back(v);
    expand(ok, r, np, nx, members, speed, best);
    r.pop_back();
    p.erase(std::find(p.begin(), p.end(), v));
    x.push_back(v);
  }
}

}  // namespace

std::vector<int64_t> largestReachableGroup(const std::vector<int64_t>& members,
                                           const std::map<int64_t, std::vector<int64_t>>& unreachable,
                                           const std::map<int64_t, double>& speed) {
  const size_t n = members.size();
  std::vector<std::vector<bool>> ok(n, std::vector<bool>(n, true));
  for (size_t i = 0; i < n; ++i) {
    ok[i][i] = false;  // no self loops in the clique search
    auto it = unreachable.find(members[i]);
    if (it == unreachable.end()) continue;
    for (int64_t peer : it->second)
      for (size_t j = 0; j < n; ++j)
        if (members[j] == peer && j != i) ok[i][j] = ok[j][i] = false;
  }
  std::vector<size_t> p(n), r;
  for (size_t i = 0; i < n; ++i) p[i] = i;
  Best best;
  expand(ok, r, p, {}, members, speed, best);
  std::vector<int64_t> group;
  for (size_t i : best.set) group.push_back(members[i]);
  return group;
}

std::optional<Partitions::Split> Partitions::poll(c10d::Store& store, int64_t gen, const std::vector<int64_t>& members,
                                                  const std::map<int64_t, double>& speed, double now) {
  std::map<int64_t, std::vector<int64_t>> cut;
  size_t cuts = 0;
  std::string who;
  for (int64_t id : members) {
    if (aside_.count(id)) continue;
    const std::string k = keys::workerReach(id);
    if (!store.check({k})) continue;
    ReachReport r;
    try {
      r = ReachReport::fromJson(json::parse(getString(store, k), nullptr, false));
    } catch (const MessageError& e) {
      std::fprintf(stderr, "morph: ignoring %s: %s\n", k.c_str(), e.what());
      continue;
    }
    if (r.generation != gen || r.unreachable.empty()) continue;
    cuts += r.unreachable.size();
    std::string peers;
    for (int64_t p : r.unreachable) peers += (peers.empty() ? "" : ", ") + std::to_string(p);
    who += (who.empty() ? "" : "; ") + ("worker " + std::to_string(id) + " cannot reach " + peers);
    cut[id] = std::move(r.unreachable);
  }
  if (cut.empty() || (gen == acted_gen_ && cuts <= acted_cuts_)) return std::nullopt;
  if (seen_gen_ != gen) {
    seen_gen_ = gen;
    seen_at_ = now;
  }
  if (now - seen_at_ < kSettleS) return std::nullopt;  // the other side's reports are on their way
  std::vector<int64_t> live;
  for (int64_t id : members)
    if (!aside_.count(id)) live.push_back(id);
  Split s;
  s.keep = largestReachableGroup(live, cut, speed);
  for (int64_t id : live)
    if (std::find(s.keep.begin(), s.keep.end(), id) == s.keep.end()) s.aside.push_back(id);
  acted_gen_ = gen;
  acted_cuts_ = cuts;
  if (s.aside.empty()) return std::nullopt;
  for (int64_t id : s.aside) aside_.insert(id);
  s.describe = who;
  return s;
}

std::vector<int64_t> Partitions::readmit(c10d::Store& store, int64_t gen) {
  std::vector<int64_t> back;
  for (auto it = aside_.begin(); it != aside_.end();) {
    const std::string k = keys::workerReach(*it);
    bool reaches = false;
    if (store.check({k})) {
      try {
        const ReachReport r = ReachReport::fromJson(json::parse(getString(store, k), nullptr, false));
        reaches = r.generation == gen && r.unreachable.empty();
      } catch (const MessageError&) {
      }
    }
    if (reaches) {
      back.push_back(*it);
      it = aside_.erase(it);
    } else {
      ++it;
    }
  }
  return back;
}

}  // namespace morph
