#include "plan/planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <tuple>

#include "core/error.h"
#include "plan/partitioner.h"

namespace morph {

namespace {

double mib(int64_t b) { return static_cast<double>(b) / 1048576.0; }

std::string fmtMib(int64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", mib(b));
  return buf;
}

// The search state shared by every candidate: cached schedules' stash
// counts and cached cuts per memory situation.
class Search {
 public:
  Search(const Profile& p, const PlanRequest& rq) : p_(p), rq_(rq), L_(p.layers.size()) {}

  // Seconds per VN of stage [i, j): its compute, or the transfer of its
  // outgoing activation or incoming gradient when a link is slower (the
  // sender and receiver threads overlap them with compute).
  double seconds(size_t i, size_t j, bool rc) const {
    double s = stageComputeSeconds(p_, i, j, rc);
    const double d = rq_.sim.link_delay_s;
    if (j < L_) s = std::max(s, p_.p2p.at(static_cast<double>(p_.layers[j - 1].output_bytes)) + d);
    if (i > 0) s = std::max(s, p_.p2p.at(static_cast<double>(p_.layers[i - 1].output_bytes)) + d);
    return s;
  }

  // VNs stashed at once by the stage r-th from the end: the rank's list in
  // an r-stage pipeline is the same as in any longer one (1F1B's warm-up
  // depends on P - k only), so the generator answers it.
  int64_t live(ScheduleKind kind, int r, int64_t M, bool rc) {
    auto key = std::make_tuple(static_cast<int>(kind), r, M, rc);
    auto it = live_.find(key);
    if (it != live_.end()) return it->second;
    const int64_t v = peakLiveActivations(makeSchedule({kind, r, M, rc})[0]);
    return live_[key] = v;
  }

  StageCostFns fns(ScheduleKind kind, bool rc, int64_t M) {
    return {[this, rc](size_t i, size_t j) { return seconds(i, j, rc); },
            [this, kind, rc, M](size_t i, size_t j, int r) {
              return stageBytes(p_, i, j, live(kind, r, M, rc), rc, rq_.sim);
            }};
  }

  // The best cut for every P, for this schedule's memory situation. Without
  // a cap only the recomputation flag changes the cut.
  const std::vector<std::optional<StageCut>>& cuts(ScheduleKind kind, bool rc, int64_t M, int max_stages) {
    const bool capped = rq_.memory_cap_bytes > 0;
    const bool gpipe = kind == ScheduleKind::kGpipe;
    // 1F1B and Varuna stash min(r, M) VNs: M beyond the deepest stage
    // changes nothing.
    const int64_t m_eff = !capped ? 0 : gpipe ? M : std::min<int64_t>(M, max_stages);
    const int klass = !capped ? 0 : gpipe ? 1 : 2;
    auto key = std::make_tuple(klass, rc, m_eff);
    auto it = cuts_.find(key);
    if (it != cuts_.end()) return it->second;
    return cuts_[key] = minMaxCuts(L_, max_stages, fns(kind, rc, std::max<int64_t>(M, 1)), rq_.memory_cap_bytes);
  }

 private:
  const Profile& p_;
  const PlanRequest& rq_;
  size_t L_;
  std::map<std::tuple<int, int, int64_t, bool>, int64_t> live_;
  std::map<std::tuple<int, bool, int64_t>, std::vector<std::optional<StageCut>>> cuts_;
};

struct Candidate {
  int P, D;
  ScheduleKind kind;
  bool rc;
  int64_t M;
  const StageCut* cut;
  double lower_bound;
};

[[noreturn]] void explainInfeasible(const Profile& p, const PlanRequest& rq, Search& search, int max_stages) {
  // The plan whose largest stage is smallest, to say what is missing.
  int64_t best = -1;
  std::string where;
  for (int P = 1; P <= max_stages; ++P) {
    const int D = std::max(1, static_cast<int>(std::min<int64_t>(rq.workers / P, rq.virtual_nodes)));
    const int64_t M = (rq.virtual_nodes + D - 1) / D;
    for (ScheduleKind kind : rq.schedules)
      for (bool rc : {false, true}) {
        if ((rc && !rq.try_recompute) || (P == 1 && (rc || kind != rq.schedules.front()))) continue;
        auto cut = minPeakBytesCut(p.layers.size(), P, search.fns(kind, rc, M));
        if (!cut) continue;
        size_t k = 0;
        for (size_t s = 0; s < cut->bytes.size(); ++s)
          if (cut->bytes[s] > cut->bytes[k]) k = s;
        if (best >= 0 && cut->bytes[k] >= best) continue;
        best = cut->bytes[k];
        const size_t a = cut->cuts[k], b = cut->cuts[k + 1];
        const std::string layers = b - a == 1 ? "layer " + p.layers[a].name
                                              : "layers " + p.layers[a].name + ".." + p.layers[b - 1].name;
        where = P == 1 ? "one worker holding the whole model needs " + fmtMib(best) + " MiB"
                       : "the closest plan (" + std::to_string(P) + " stages, " + toString(kind) +
                             (rc ? " with recomputation" : "") + ") still needs " + fmtMib(best) +
                             " MiB for stage " + std::to_string(k) + " (" + layers + ")";
      }
  }
  throw InputError("no plan fits --memory-cap " + fmtMib(rq.memory_cap_bytes) + " MiB on " +
                   std::to_string(rq.workers) + (rq.workers == 1 ? " worker: " : " workers: ") + where + ", " +
                   fmtMib(best - rq.memory_cap_bytes) + " MiB over the cap");
}

}  // namespace

std::string scheduleLabel(const PlanSpec& plan) { return plan.stages == 1 ? "-" : toString(plan.schedule); }

PlanOutcome planJob(const Profile& p, const PlanRequest& rq) {
  const auto t0 = std::chrono::steady_clock::now();
  const size_t L = p.layers.size();
  if (L == 0) throw InputError("the profile has no layers");
  if (rq.workers < 1) throw InputError("planning needs at least one worker");
  if (rq.virtual_nodes < 1) throw InputError("planning needs at least one VN");
  if (rq.schedules.empty()) throw InputError("planning needs at least one schedule");
  int max_stages = static_cast<int>(std::min<size_t>(L, static_cast<size_t>(rq.workers)));
  if (rq.max_stages > 0) max_stages = std::min(max_stages, rq.max_stages);
  Search search(p, rq);

  std::vector<Candidate> cands;
  for (int P = 1; P <= max_stages; ++P) {
    const int max_d = static_cast<int>(std::min<int64_t>(rq.workers / P, rq.virtual_nodes));
    for (ScheduleKind kind : rq.schedules)
      for (bool rc : {false, true}) {
        if (rc && !rq.try_recompute) continue;
        if (P == 1 && (rc || kind != rq.schedules.front())) continue;  // no schedule to choose
        for (int D = 1; D <= max_d; ++D) {
          const int64_t M = (rq.virtual_nodes + D - 1) / D;
          const auto& cuts = search.cuts(kind, rc, M, max_stages);
          const auto& cut = cuts[static_cast<size_t>(P) - 1];
          if (!cut) continue;
          cands.push_back({P, D, kind, rc, M, &*cut, cut->bottleneck_s * static_cast<double>(M)});
        }
      }
  }
  PlanOutcome out;
  out.candidates = static_cast<int64_t>(cands.size());
  if (cands.empty()) explainInfeasible(p, rq, search, max_stages);
  // Smallest bound first; ties: fewer workers, then shallower pipelines.
  std::stable_sort(cands.begin(), cands.end(), [](const Candidate& a, const Candidate& b) {
    if (a.lower_bound != b.lower_bound) return a.lower_bound < b.lower_bound;
    if (a.P * a.D != b.P * b.D) return a.P * a.D < b.P * b.D;
    return a.P < b.P;
  });
  const size_t K = static_cast<size_t>(std::max(1, rq.top_k));
  for (const Candidate& c : cands) {
    if (out.plans.size() == K && c.lower_bound >= out.plans.back().sim.step_seconds) break;
    PlanChoice ch;
    ch.plan.stages = c.P;
    ch.plan.replicas = c.D;
    ch.plan.cuts = c.cut->cuts;
    ch.plan.schedule = c.kind;
    ch.plan.recompute = c.rc;
    ch.plan.vn_shares = evenShares(rq.virtual_nodes, c.D);
    ch.bottleneck_s = c.cut->bottleneck_s;
    ch.sim = simulate(p, ch.plan, rq.sim);
    ++out.simulated;
    if (rq.memory_cap_bytes > 0) {
      // The cut fits by construction; the simulator's own per-stage figure
      // (Varuna's run-time moves aside) is checked again.
      bool fits = true;
      for (const StageSim& s : ch.sim.stages) fits = fits && s.peak_bytes <= rq.memory_cap_bytes;
      if (!fits) continue;
    }
    auto pos = std::upper_bound(out.plans.begin(), out.plans.end(), ch, [](const PlanChoice& a, const PlanChoice& b) {
      return a.sim.step_seconds < b.sim.step_seconds;
    });
    out.plans.insert(pos, ch);
    if (out.plans.size() > K) out.plans.pop_back();
  }
  if (out.plans.empty()) explainInfeasible(p, rq, search, max_stages);
  out.planning_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace morph
