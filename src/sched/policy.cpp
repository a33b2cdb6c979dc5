// The three cluster policies (policy.h, docs/cluster.md).
#include "sched/policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <queue>
#include <tuple>

#include "core/error.h"

namespace morph::sched {

Speed::Speed(std::map<int, double> step_seconds) : step_seconds_(std::move(step_seconds)) {
  if (step_seconds_.empty()) throw InputError("step_seconds: expected at least one worker count");
  for (const auto& [k, s] : step_seconds_) {
    if (k < 1) throw InputError("step_seconds: worker count " + std::to_string(k) + " (expected >= 1)");
    if (!std::isfinite(s) || s <= 0 || !std::isfinite(1.0 / s))
      throw InputError("step_seconds[\"" + std::to_string(k) + "\"]: expected seconds > 0");
  }
}

double Speed::stepsPerSecond(int k) const {
  if (k <= 0) return 0;
  if (step_seconds_.empty()) return k;
  auto hi = step_seconds_.lower_bound(k);
  if (hi != step_seconds_.end() && hi->first == k) return 1.0 / hi->second;
  if (hi == step_seconds_.begin()) return (1.0 / hi->second) * k / hi->first;  // below the table
  auto lo = std::prev(hi);
  if (hi == step_seconds_.end()) return 1.0 / lo->second;                       // above: flat
  const double r0 = 1.0 / lo->second, r1 = 1.0 / hi->second;
  return r0 + (r1 - r0) * (k - lo->first) / double(hi->first - lo->first);
}

int ClusterView::allocatedSlots() const {
  int n = 0;
  for (const auto& j : jobs) n += j.allocated;
  return n;
}

const std::vector<std::string>& policyNames() {
  static const std::vector<std::string> names{"fifo", "wfs", "morph"};
  return names;
}

bool priorityBefore(const JobState& a, const JobState& b) {
  return std::tie(b.priority, a.arrival, a.id) < std::tie(a.priority, b.arrival, b.id);
}

namespace {

std::vector<size_t> priorityOrder(const ClusterView& v) {
  std::vector<size_t> order(v.jobs.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return priorityBefore(v.jobs[a], v.jobs[b]); });
  return order;
}

int floorPow2(int x) {
  if (x <= 0) return 0;
  int p = 1;
  while (p <= x / 2) p *= 2;
  return p;
}

// fifo: running jobs keep what they hold; queued jobs start in priority
// order with their full demand while it fits; the first that does not fit
// blocks the ones behind it (no backfilling: a small job never overtakes a
// big one of higher priority).
class FifoPolicy final : public Policy {
 public:
  const char* name() const override { return "fifo"; }
  std::vector<int> allocate(const ClusterView& v) const override {
    std::vector<int> a(v.jobs.size(), 0);
    int free = v.slots;
    for (size_t i = 0; i < v.jobs.size(); ++i) {
      a[i] = v.jobs[i].allocated;
      free -= a[i];
    }
    for (size_t i : priorityOrder(v)) {
      if (a[i] > 0) continue;
      if (v.jobs[i].demand > free) break;
      a[i] = v.jobs[i].demand;
      free -= a[i];
    }
    return a;
  }
};

// wfs: VirtualFlow's Algorithm 1 (docs/cluster.md).
class WfsPolicy final : public Policy {
 public:
  const char* name() const override { return "wfs"; }
  std::vector<int> allocate(const ClusterView& v) const override {
    const std::vector<double> share = waterFill(v);
    std::vector<int> a(v.jobs.size(), 0);
    int free = v.slots;
    for (size_t i = 0; i < v.jobs.size(); ++i) {
      const int demand = v.jobs[i].demand;
      const int whole = int(std::floor(share[i] + 1e-9));
      a[i] = whole >= demand ? demand : floorPow2(whole);
      free -= a[i];
    }
    // Leftover slots by priority: each job in turn grows to the largest
    // power of two (or its demand) that the leftover covers.
    const std::vector<size_t> order = priorityOrder(v);
    for (bool changed = true; changed && free > 0;) {
      changed = false;
      for (size_t i : order) {
        const int demand = v.jobs[i].demand;
        int best = a[i];
        for (int t = 1; t <= demand; t *= 2)
          if (t > best && t - a[i] <= free) best = t;
        if (demand > best && demand - a[i] <= free) best = demand;
        if (best != a[i]) {
          free -= best - a[i];
          a[i] = best;
          changed = true;
        }
      }
    }
    return a;
  }
};

// morph: greedy on priority-weighted progress per slot, two candidates
// (re-plan everything; keep the running jobs and fill only the queued
// ones), the one with more progress over the horizon after resize pauses.
class MorphPolicy final : public Policy {
 public:
  explicit MorphPolicy(PolicyOptions o) : opts_(o) {}
  const char* name() const override { return "morph"; }

  std::vector<int> allocate(const ClusterView& v) const override {
    const size_t n = v.jobs.size();
    std::vector<double> weight(n);
    for (size_t i = 0; i < n; ++i)
      weight[i] = v.jobs[i].priority / std::max(v.jobs[i].remaining_steps, 1e-9);

    // Candidate "replan": every running job keeps at least 1, the rest by gain.
    std::vector<int> replan(n, 0);
    std::vector<char> may_grow(n, 1);
    for (size_t i = 0; i < n; ++i) replan[i] = v.jobs[i].allocated > 0 ? 1 : 0;
    greedy(v, weight, may_grow, replan);
    // Candidate "keep": running jobs as they are; only queued jobs get slots.
    std::vector<int> keep(n, 0);
    for (size_t i = 0; i < n; ++i) {
      keep[i] = std::min(v.jobs[i].allocated, v.jobs[i].demand);
      may_grow[i] = v.jobs[i].allocated > 0 ? 0 : 1;
    }
    greedy(v, weight, may_grow, keep);

    // Horizon: the time to the next completion if nothing changes (the
    // next decision comes then at the latest).
    double horizon = std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < n; ++i)
      if (v.jobs[i].allocated > 0) {
        const double r = rate(v.jobs[i], v.jobs[i].allocated);
        if (r > 0) horizon = std::min(horizon, v.jobs[i].remaining_steps / r);
      }
    if (!std::isfinite(horizon)) return replan;  // nothing runs: no resize to pay for
    auto score = [&](const std::vector<int>& a) {
      double s = 0;
      for (size_t i = 0; i < n; ++i) {
        const bool resized = v.jobs[i].allocated > 0 && a[i] != v.jobs[i].allocated;
        const double window = std::max(0.0, horizon - (resized ? opts_.resize_seconds : 0.0));
        s += weight[i] * rate(v.jobs[i], a[i]) * window;
      }
      return s;
    };
    return score(replan) > score(keep) * (1 + 1e-9) ? replan : keep;
  }

 private:
  static double rate(const JobState& j, int k) {
    return j.speed ? j.speed->stepsPerSecond(k) : (k > 0 ? double(k) : 0.0);
  }

  // Gives free slots to the jobs that may grow, the best average gain per
  // slot first (a gain over several slots counts, so a flat step in a
  // speed table does not stop the search), up to each job's demand.
  void greedy(const ClusterView& v, const std::vector<double>& weight, const std::vector<char>& may_grow,
              std::vector<int>& a) const {
    const size_t n = v.jobs.size();
    int free = v.slots;
    for (int x : a) free -= x;
    std::vector<int> rank(n);
    {
      const std::vector<size_t> order = priorityOrder(v);
      for (size_t r = 0; r < n; ++r) rank[order[r]] = int(r);
    }
    struct Offer {
      double gain;  // weighted steps/s per slot
      int rank;
      size_t job;
      int slots;
      bool operator<(const Offer& o) const {  // max-heap: larger gain, then earlier rank
        return gain != o.gain ? gain < o.gain : rank > o.rank;
      }
    };
    auto best = [&](size_t i) -> Offer {
      Offer o{0, rank[i], i, 0};
      const JobState& j = v.jobs[i];
      const double r0 = rate(j, a[i]);
      const int room = std::min(j.demand - a[i], free);
      for (int m = 1; m <= room; ++m) {
        const double g = weight[i] * (rate(j, a[i] + m) - r0) / m;
        if (g > o.gain * (1 + 1e-12)) {
          o.gain = g;
          o.slots = m;
        }
      }
      return o;
    };
    std::priority_queue<Offer> heap;
    for (size_t i = 0; i < n; ++i)
      if (may_grow[i]) {
        Offer o = best(i);
        if (o.slots > 0) heap.push(o);
      }
    while (free > 0 && !heap.empty()) {
      Offer o = heap.top();
      heap.pop();
      if (o.slots > free) {  // made when more was free: offer again within what is left
        o = best(o.job);
        if (o.slots > 0) heap.push(o);
        continue;
      }
      a[o.job] += o.slots;
      free -= o.slots;
      Offer next = best(o.job);
      if (next.slots > 0) heap.push(next);
    }
  }

  PolicyOptions opts_;
};

}  // namespace

std::vector<double> waterFill(const ClusterView& v) {
  // Each job's share is clamp(level * priority, lo, demand) (lo = 1 for a
  // running job, else 0); the level is the one where the shares sum to the
  // slots (or every job gets its demand). f(level) is piecewise linear:
  // sweep its breakpoints in order.
  const size_t n = v.jobs.size();
  std::vector<double> share(n, 0);
  double demand_sum = 0;
  for (const auto& j : v.jobs) demand_sum += j.demand;
  if (demand_sum <= v.slots) {
    for (size_t i = 0; i < n; ++i) share[i] = v.jobs[i].demand;
    return share;
  }
  struct Event {
    double level;
    size_t job;
    bool end;  // false: the share starts growing; true: it reached the demand
  };
  std::vector<Event> events;
  double constant = 0, slope = 0;
  for (size_t i = 0; i < n; ++i) {
    const auto& j = v.jobs[i];
    const double p = std::max(j.priority, 1);
    const double lo = j.allocated > 0 ? 1.0 : 0.0;
    constant += lo;
    events.push_back({lo / p, i, false});
    events.push_back({j.demand / p, i, true});
  }
  std::stable_sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return a.level != b.level ? a.level < b.level : (!a.end && b.end);
  });
  const double target = v.slots;
  double level = 0;
  size_t e = 0;
  for (;; ++e) {
    const double next = e < events.size() ? events[e].level : std::numeric_limits<double>::infinity();
    if (slope > 0 && constant + next * slope >= target) {
      level = (target - constant) / slope;
      break;
    }
    if (slope == 0 && constant >= target) {
      level = e < events.size() ? events[e].level : 0;
      break;
    }
    MORPH_CHECK(e < events.size(), "water-fill ran past its breakpoints");
    const auto& ev = events[e];
    const double p = std::max(v.jobs[ev.job].priority, 1);
    if (!ev.end) {
      constant -= v.jobs[ev.job].allocated > 0 ? 1.0 : 0.0;  // its lo
      slope += p;
    } else {
      constant += v.jobs[ev.job].demand;
      slope -= p;
      if (std::abs(slope) < 1e-12) slope = 0;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const auto& j = v.jobs[i];
    const double lo = j.allocated > 0 ? 1.0 : 0.0;
    share[i] = std::clamp(level * std::max(j.priority, 1), lo, double(j.demand));
  }
  return share;
}

std::unique_ptr<Policy> makePolicy(const std::string& name, const PolicyOptions& options) {
  if (name == "fifo") return std::make_unique<FifoPolicy>();
  if (name == "wfs") return std::make_unique<WfsPolicy>();
  if (name == "morph") return std::make_unique<MorphPolicy>(options);
  throw InputError("unknown policy '" + name + "' (expected fifo, wfs or morph)");
}

}  // namespace morph::sched
