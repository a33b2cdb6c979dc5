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

Speed::Speed(std::map<int, double> step_seconds, std::map<std::vector<int>, double> by_type)
    : Speed(std::move(step_seconds)) {
  for (const auto& [counts, sec] : by_type) {
    int sum = 0;
    for (int c : counts) {
      if (c < 0) throw InputError("step_seconds by slot type: a negative slot count");
      sum += c;
    }
    if (sum < 1) throw InputError("step_seconds by slot type: an entry without slots");
    if (!std::isfinite(sec) || sec <= 0 || !std::isfinite(1.0 / sec))
      throw InputError("step_seconds by slot type: expected seconds > 0");
  }
  by_type_ = std::move(by_type);
}

double Speed::stepsPerSecond(const std::vector<int>& by_type, const std::vector<SlotType>& types) const {
  int k = 0;
  double slowest = 1.0;
  for (size_t t = 0; t < by_type.size(); ++t)
    if (by_type[t] > 0) {
      k += by_type[t];
      slowest = std::max(slowest, t < types.size() ? types[t].slowdown : 1.0);
    }
  if (k == 0) return 0;
  if (!by_type_.empty()) {
    const auto it = by_type_.find(by_type);
    if (it != by_type_.end()) return 1.0 / it->second;
  }
  return stepsPerSecond(k) / slowest;
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

std::vector<SlotType> ClusterView::slotTypes() const {
  if (!types.empty()) return types;
  SlotType one;
  one.count = slots;
  return {one};
}

std::vector<int> ClusterView::heldOf(const JobState& j) const {
  if (types.empty()) return {j.allocated};
  std::vector<int> h = j.held;
  h.resize(types.size(), 0);
  return h;
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

// morph: priority-weighted progress, two candidates (re-plan everything;
// keep the running jobs and fill only the queued ones), the one with more
// progress over the horizon after resize pauses. Slots of several types
// are shared out exactly (a knapsack over the slots left of each type)
// while that is small, else greedily like one type: on marginal gains.
class MorphPolicy final : public Policy {
 public:
  // Chosen on the VirtualFlow-shaped traces of seeds 1..10 and checked on
  // seeds 11..30 and the 256-slot trace (docs/cluster.md, "morph").
  static constexpr double kCriticalShare = 0.8;

  explicit MorphPolicy(PolicyOptions o) : opts_(o) {}
  const char* name() const override { return "morph"; }

  std::vector<int> allocate(const ClusterView& v) const override {
    const TypedTargets a = allocateTyped(v);
    std::vector<int> totals(a.size());
    for (size_t i = 0; i < a.size(); ++i) totals[i] = std::accumulate(a[i].begin(), a[i].end(), 0);
    return totals;
  }

  TypedTargets allocateTyped(const ClusterView& v) const override {
    const size_t n = v.jobs.size();
    const std::vector<SlotType> types = v.slotTypes();
    const size_t nt = types.size();
    std::vector<double> weight(n);
    TypedTargets held(n);
    for (size_t i = 0; i < n; ++i) {
      const double left = std::max(v.jobs[i].remaining_steps, 1e-9);
      weight[i] = v.jobs[i].priority / (left * left);
      held[i] = v.heldOf(v.jobs[i]);
    }
    auto running = [&](size_t i) { return v.jobs[i].allocated > 0; };

    // Candidate "replan": every running job keeps at least 1 (of its
    // fastest type held), the rest by gain.
    TypedTargets replan(n, std::vector<int>(nt, 0));
    std::vector<char> fixed(n, 0);
    for (size_t i = 0; i < n; ++i)
      if (running(i)) {
        size_t best = nt;
        for (size_t t = 0; t < nt; ++t)
          if (held[i][t] > 0 && (best == nt || types[t].slowdown < types[best].slowdown)) best = t;
        replan[i][best == nt ? 0 : best] = 1;
      }
    if (nt == 1) startLongNarrowJobs(v, types, replan, fixed);
    fill(v, types, weight, fixed, replan);
    // Candidate "keep": running jobs as they are; only queued jobs get slots.
    TypedTargets keep = held;
    for (size_t i = 0; i < n; ++i) {
      int over = std::accumulate(keep[i].begin(), keep[i].end(), 0) - v.jobs[i].demand;
      for (size_t t = nt; t-- > 0 && over > 0;) {
        const int drop = std::min(over, keep[i][t]);
        keep[i][t] -= drop;
        over -= drop;
      }
      fixed[i] = running(i) ? 1 : 0;
    }
    fill(v, types, weight, fixed, keep);

    // Horizon: the time to the next completion if nothing changes (the
    // next decision comes then at the latest).
    double horizon = std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < n; ++i)
      if (running(i)) {
        const double r = rate(v.jobs[i], held[i], types);
        if (r > 0) horizon = std::min(horizon, v.jobs[i].remaining_steps / r);
      }
    if (!std::isfinite(horizon)) return replan;  // nothing runs: no resize to pay for
    auto score = [&](const TypedTargets& a) {
      double s = 0;
      for (size_t i = 0; i < n; ++i) {
        const bool resized = running(i) && a[i] != held[i];
        const double window = std::max(0.0, horizon - (resized ? opts_.resize_seconds : 0.0));
        s += weight[i] * rate(v.jobs[i], a[i], types) * window;
      }
      return s;
    };
    return score(replan) > score(keep) * (1 + 1e-9) ? replan : keep;
  }

 private:
  static double rate(const JobState& j, const std::vector<int>& by_type, const std::vector<SlotType>& types) {
    static const Speed kLinear;
    const Speed& s = j.speed ? *j.speed : kLinear;
    // One type and no table by type (every untyped cluster): the same
    // value without the by-type lookup (the policy's hot loop at 256 slots).
    if (by_type.size() == 1 && s.byType().empty())
      return by_type[0] > 0 ? s.stepsPerSecond(by_type[0]) / std::max(1.0, types[0].slowdown) : 0.0;
    return s.stepsPerSecond(by_type, types);
  }

  // Untyped clusters: a job that cannot fill the cluster alone (its
  // fastest count, at most its demand, is below the slots) and whose time
  // to finish at that count is at least kCriticalShare of the time the
  // whole cluster needs for all the work left (every job's time at its
  // fastest count x that count, over the slots) would, served last, run
  // alone with slots idle: it gets that count before the greedy, longest
  // first, and is fixed there.
  static void startLongNarrowJobs(const ClusterView& v, const std::vector<SlotType>& types,
                                          TypedTargets& a, std::vector<char>& fixed) {
    const size_t n = v.jobs.size();
    const int slots = types[0].count;
    std::vector<double> at_best(n, 0);
    std::vector<int> best(n, 0);
    double work = 0;  // slot-seconds
    for (size_t i = 0; i < n; ++i) {
      double top = 0;
      for (int k = 1; k <= std::min(v.jobs[i].demand, slots); ++k) {
        const double r = rate(v.jobs[i], std::vector<int>{k}, types);
        if (r > top * (1 + 1e-12)) top = r, best[i] = k;
      }
      at_best[i] = top > 0 ? v.jobs[i].remaining_steps / top : 0;
      work += at_best[i] * best[i];
    }
    const double bound = work / std::max(1, slots);
    int left = slots;
    for (size_t i = 0; i < n; ++i) left -= a[i][0];
    std::vector<size_t> critical;
    for (size_t i = 0; i < n; ++i)
      if (best[i] > 0 && best[i] < slots && at_best[i] >= kCriticalShare * bound) critical.push_back(i);
    std::stable_sort(critical.begin(), critical.end(), [&](size_t x, size_t y) { return at_best[x] > at_best[y]; });
    for (size_t i : critical) {
      const int add = std::min(best[i] - a[i][0], left);
      if (add <= 0) continue;
      a[i][0] += add;
      left -= add;
      if (a[i][0] == best[i]) fixed[i] = 1;
    }
  }

  // Completes `a`: the jobs not `fixed` get free slots up to their demand
  // (a running one ends with at least 1).
  void fill(const ClusterView& v, const std::vector<SlotType>& types, const std::vector<double>& weight,
            const std::vector<char>& fixed, TypedTargets& a) const {
    if (types.size() >= 2 && knapsack(v, types, weight, fixed, a)) return;
    greedy(v, types, weight, fixed, a);
  }

  // Exact for several slot types: every job's allocation (slots per type,
  // at most its demand in all) chosen to maximise the summed progress,
  // by dynamic programming over the slots used of each type. Ties go to
  // fewer slots used. false (a untouched) when the table would be large.
  bool knapsack(const ClusterView& v, const std::vector<SlotType>& types, const std::vector<double>& weight,
                const std::vector<char>& fixed, TypedTargets& a) const {
    const size_t n = v.jobs.size(), nt = types.size();
    std::vector<int64_t> stride(nt);
    int64_t states = 1;
    for (size_t t = 0; t < nt; ++t) {
      stride[t] = states;
      states *= types[t].count + 1;
      if (states > (int64_t{1} << 16)) return false;
    }
    struct Choice {
      std::vector<int> x;
      int64_t offset = 0;
      int used = 0;
      double value = 0;
    };
    std::vector<std::vector<Choice>> choices(n);
    int64_t work = 0;
    for (size_t i = 0; i < n; ++i) {
      const JobState& j = v.jobs[i];
      auto add = [&](const std::vector<int>& x) {
        Choice c{x, 0, 0, 0};
        for (size_t t = 0; t < nt; ++t) c.offset += x[t] * stride[t], c.used += x[t];
        c.value = weight[i] * rate(j, x, types);
        choices[i].push_back(std::move(c));
      };
      if (fixed[i]) {
        add(a[i]);
      } else {
        const int lo = j.allocated > 0 ? 1 : 0;
        std::vector<int> x(nt, 0);
        for (;;) {  // every x with x[t] <= min(count[t], demand) and lo <= sum <= demand
          const int sum = std::accumulate(x.begin(), x.end(), 0);
          if (sum >= lo && sum <= j.demand) add(x);
          size_t d = 0;
          for (; d < nt; ++d) {
            if (x[d] < std::min(types[d].count, j.demand)) {
              ++x[d];
              break;
            }
            x[d] = 0;
          }
          if (d == nt) break;
        }
      }
      work += states * int64_t(choices[i].size());
      if (work > 4'000'000) return false;
    }
    const double ninf = -std::numeric_limits<double>::infinity();
    auto better = [](double v1, int u1, double v2, int u2) {
      const double tol = 1e-12 * std::max(std::abs(v1), std::abs(v2));
      if (v1 > v2 + tol) return true;
      if (v1 < v2 - tol) return false;
      return u1 < u2;
    };
    // Per state (slots used of each type): the best value and its slots.
    std::vector<double> val(size_t(states), ninf), nval;
    std::vector<int> used(size_t(states), 0), nused;
    std::vector<std::vector<int32_t>> pick(n, std::vector<int32_t>(size_t(states), -1));
    std::vector<std::vector<int>> digits{static_cast<size_t>(states), std::vector<int>(nt, 0)};
    for (int64_t s = 0; s < states; ++s)
      for (size_t t = 0; t < nt; ++t) digits[size_t(s)][t] = int(s / stride[t] % (types[t].count + 1));
    val[0] = 0;
    const std::vector<size_t> order = priorityOrder(v);
    for (size_t i : order) {
      nval.assign(size_t(states), ninf);
      nused.assign(size_t(states), 0);
      for (int64_t s = 0; s < states; ++s) {
        if (val[size_t(s)] == ninf) continue;
        const std::vector<int>& d = digits[size_t(s)];
        for (size_t c = 0; c < choices[i].size(); ++c) {
          const Choice& ch = choices[i][c];
          bool fits = true;
          for (size_t t = 0; t < nt && fits; ++t) fits = d[t] + ch.x[t] <= types[t].count;
          if (!fits) continue;
          const size_t to = size_t(s + ch.offset);
          const double nv = val[size_t(s)] + ch.value;
          const int nu = used[size_t(s)] + ch.used;
          if (nval[to] == ninf || better(nv, nu, nval[to], nused[to])) {
            nval[to] = nv;
            nused[to] = nu;
            pick[i][to] = int32_t(c);
          }
        }
      }
      val.swap(nval);
      used.swap(nused);
    }
    int64_t best = -1;
    for (int64_t s = 0; s < states; ++s)
      if (val[size_t(s)] != ninf && (best < 0 || better(val[size_t(s)], used[size_t(s)], val[size_t(best)], used[size_t(best)])))
        best = s;
    if (best < 0) return false;
    for (size_t k = order.size(); k-- > 0;) {
      const size_t i = order[k];
      const Choice& ch = choices[i][size_t(pick[i][size_t(best)])];
      a[i] = ch.x;
      best -= ch.offset;
    }
    return true;
  }

  // Gives free slots to the jobs not fixed, the best average gain per slot
  // first (a gain over several slots of one type counts, so a flat step in
  // a speed table does not stop the search), up to each job's demand.
  void greedy(const ClusterView& v, const std::vector<SlotType>& types, const std::vector<double>& weight,
              const std::vector<char>& fixed, TypedTargets& a) const {
    const size_t n = v.jobs.size(), nt = types.size();
    std::vector<int> free(nt);
    for (size_t t = 0; t < nt; ++t) {
      free[t] = types[t].count;
      for (size_t i = 0; i < n; ++i) free[t] -= a[i][t];
    }
    std::vector<int> rank(n);
    {
      const std::vector<size_t> order = priorityOrder(v);
      for (size_t r = 0; r < n; ++r) rank[order[r]] = int(r);
    }
    struct Offer {
      double gain;  // weighted steps/s per slot
      int rank;
      size_t job;
      size_t type;
      int slots;
      bool operator<(const Offer& o) const {  // max-heap: larger gain, then earlier rank, then first type
        if (gain != o.gain) return gain < o.gain;
        if (rank != o.rank) return rank > o.rank;
        return type > o.type;
      }
    };
    auto best = [&](size_t i) -> Offer {
      Offer o{0, rank[i], i, 0, 0};
      const JobState& j = v.jobs[i];
      const double r0 = rate(j, a[i], types);
      const int have = std::accumulate(a[i].begin(), a[i].end(), 0);
      std::vector<int> x = a[i];
      for (size_t t = 0; t < nt; ++t) {
        const int room = std::min(j.demand - have, free[t]);
        for (int m = 1; m <= room; ++m) {
          x[t] = a[i][t] + m;
          const double g = weight[i] * (rate(j, x, types) - r0) / m;
          if (g > o.gain * (1 + 1e-12)) {
            o.gain = g;
            o.type = t;
            o.slots = m;
          }
        }
        x[t] = a[i][t];
      }
      return o;
    };
    std::priority_queue<Offer> heap;
    for (size_t i = 0; i < n; ++i)
      if (!fixed[i]) {
        Offer o = best(i);
        if (o.slots > 0) heap.push(o);
      }
    while (!heap.empty()) {
      Offer o = heap.top();
      heap.pop();
      if (o.slots > free[o.type]) {  // made when more was free: offer again within what is left
        o = best(o.job);
        if (o.slots > 0) heap.push(o);
        continue;
      }
      a[o.job][o.type] += o.slots;
      free[o.type] -= o.slots;
      Offer next = best(o.job);
      if (next.slots > 0) heap.push(next);
    }
  }

  PolicyOptions opts_;
};

}  // namespace

TypedTargets placeBlind(const ClusterView& v, const std::vector<int>& totals) {
  const std::vector<SlotType> types = v.slotTypes();
  const size_t nt = types.size();
  TypedTargets a(v.jobs.size());
  std::vector<int> free(nt);
  for (size_t t = 0; t < nt; ++t) free[t] = types[t].count;
  for (size_t i = 0; i < v.jobs.size(); ++i) {
    a[i] = v.heldOf(v.jobs[i]);
    int over = std::accumulate(a[i].begin(), a[i].end(), 0) - totals[i];
    for (size_t t = nt; t-- > 0 && over > 0;) {  // shrinks: the last-listed types first
      const int drop = std::min(over, a[i][t]);
      a[i][t] -= drop;
      over -= drop;
    }
    for (size_t t = 0; t < nt; ++t) free[t] -= a[i][t];
  }
  for (size_t i : priorityOrder(v)) {  // starts and grows: the first-listed types first
    int more = totals[i] - std::accumulate(a[i].begin(), a[i].end(), 0);
    for (size_t t = 0; t < nt && more > 0; ++t) {
      const int take = std::min(more, std::max(free[t], 0));
      a[i][t] += take;
      free[t] -= take;
      more -= take;
    }
  }
  return a;
}

TypedTargets Policy::allocateTyped(const ClusterView& v) const { return placeBlind(v, allocate(v)); }

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
