#include "plan/planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>
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
  Search(const Profile& p, const PlanRequest& rq) : p_(p), rq_(rq), L_(p.layers.size()) {
    for (const LayerCost& c : p.layers) tied_values_ += static_cast<double>(c.tied_params);
  }

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
  // depends on P - k only).
  static int64_t live(ScheduleKind kind, int r, int64_t M, bool rc) { return stashedVns({kind, r, M, rc}, 0); }

  // No plan with this cut and M VNs per replica can step faster: some
  // stage k computes all M VNs one after another (or its link carries
  // them), after the first VN's forward through the stages before it and
  // before the last VN's backward through them.
  // No plan with this cut and M VNs per replica can step faster. Stage k
  // computes its M VNs one after another (or its link carries them); before
  // that the first VN's forward crosses the stages ahead of it; it idles
  // while VN 0 goes down the rest of the pipeline and back, except for the
  // forwards the schedule lets it run meanwhile; after its last backward
  // the stages ahead of it drain, while its gradient is summed among the D
  // replicas and applied (pipelines only: data parallelism reduces during
  // its last backward; a tied weight is summed in another group, left out).
  double lowerBound(const std::vector<size_t>& cuts, int64_t M, int D, ScheduleKind kind, bool rc) const {
    const bool exact = p_.fingerprint.reduce_mode != "float";
    const size_t P = cuts.size() - 1;
    std::vector<double> f(P, 0.0), b(P, 0.0), values(P, -tied_values_);
    for (size_t k = 0; k < P; ++k)
      for (size_t l = cuts[k]; l < cuts[k + 1]; ++l) {
        f[k] += std::min(p_.layers[l].forward_s, p_.layers[l].forward_nograd_s);
        b[k] += p_.layers[l].backward_s;
        values[k] += static_cast<double>(p_.layers[l].params + p_.layers[l].bn_values);
      }
    double best = 0, fill_f = 0, fill_b = 0, after = 0;
    for (size_t k = 0; k < P; ++k) after += f[k] + b[k];
    for (size_t k = 0; k < P; ++k) {
      after -= f[k] + b[k];
      const double v = std::max(values[k], 0.0);
      const double reduce = P == 1 ? 0.0
                                   : p_.exactOrFloatAllreduce(exact, v * (exact ? 8.0 : 4.0), D) +
                                         p_.optimizer_s_per_param * v;
      const double ahead = kind == ScheduleKind::k1F1B ? std::min<double>(static_cast<double>(P - k - 1), M - 1.0)
                                                       : M - 1.0;
      const double idle = std::max(0.0, after - ahead * f[k]);
      best = std::max(best, static_cast<double>(M) * seconds(cuts[k], cuts[k + 1], rc) + fill_f + idle +
                                std::max(reduce, fill_b));
      fill_f += f[k], fill_b += b[k];
    }
    return best;
  }

  // A stage's memory parts, computed once per (range, recompute).
  const StageFootprint& memory(size_t i, size_t j, bool rc) {
    auto& table = mem_[rc ? 1 : 0];
    if (table.empty()) table.resize((L_ + 1) * (L_ + 1));
    auto& slot = table[i * (L_ + 1) + j];
    if (!slot) slot = stageFootprint(p_, i, j, rc, rq_.sim);
    return *slot;
  }

  StageCostFns fns(ScheduleKind kind, bool rc, int64_t M, int max_stages) {
    std::vector<int64_t> stash{0};  // by r, the position from the end
    for (int r = 1; r <= max_stages; ++r) stash.push_back(live(kind, r, M, rc));
    return {[this, rc](size_t i, size_t j) { return seconds(i, j, rc); },
            [this, rc, stash](size_t i, size_t j, int r) {
              return memory(i, j, rc).bytes(stash[static_cast<size_t>(r)]);
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
    // A table made for fewer stages cannot answer this P; without a cap one
    // table for the deepest pipeline serves every M.
    if (it != cuts_.end() && static_cast<int>(it->second.size()) >= max_stages) return it->second;
    return cuts_[key] = minMaxCuts(L_, max_stages, fns(kind, rc, std::max<int64_t>(M, 1), max_stages),
                                   rq_.memory_cap_bytes);
  }

 private:
  const Profile& p_;
  const PlanRequest& rq_;
  size_t L_;
  double tied_values_ = 0;
 public:
  ScheduleCache schedules_;

 private:
  std::vector<std::optional<StageFootprint>> mem_[2];
  std::map<std::tuple<int, bool, int64_t>, std::vector<std::optional<StageCut>>> cuts_;
};

struct Candidate {
  int P, D;
  ScheduleKind kind;
  bool rc;
  StageCut cut;  // a copy: the tables it came from may be remade deeper
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
        auto cut = minPeakBytesCut(p.layers.size(), P, search.fns(kind, rc, M, P));
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

// Mixed pipelines are searched over every distinct device order (P devices
// of T types have P! / prod(n_t!)) only while orders x P x layers^2 DP
// steps stay under this; deeper mixed pipelines are left out.
constexpr double kMaxDeviceOrderWork = 5e7;

double distinctOrders(std::vector<int> types) {
  std::sort(types.begin(), types.end());
  double orders = 1;
  size_t run = 0;
  for (size_t i = 0; i < types.size(); ++i) {
    run = i > 0 && types[i] == types[i - 1] ? run + 1 : 1;
    orders = orders * static_cast<double>(i + 1) / static_cast<double>(run);
  }
  return orders;
}

// Heterogeneous devices: see planner.h.
PlanOutcome planDevices(const Profile& p, const PlanRequest& rq, Search& search) {
  const auto t0 = std::chrono::steady_clock::now();
  const size_t L = p.layers.size();
  const int N = static_cast<int>(rq.slot_slowdown.size());
  auto capOf = [&](int slot) {
    const int64_t c = rq.slot_memory.empty() ? 0 : rq.slot_memory[static_cast<size_t>(slot)];
    return c > 0 ? c : rq.memory_cap_bytes;
  };
  std::vector<int> by_speed(static_cast<size_t>(N));
  for (int s = 0; s < N; ++s) by_speed[static_cast<size_t>(s)] = s;
  std::stable_sort(by_speed.begin(), by_speed.end(), [&](int a, int b) {
    return rq.slot_slowdown[static_cast<size_t>(a)] < rq.slot_slowdown[static_cast<size_t>(b)];
  });
  PlanOutcome out;
  // Candidates with a lower bound (the slowest worker's or stage's compute
  // over its VNs), simulated in the order of their bound as in planJob().
  std::vector<std::pair<double, PlanSpec>> cands;
  auto consider = [&](PlanSpec plan, double lower_bound) { cands.push_back({lower_bound, std::move(plan)}); };
  // Data parallelism on the fastest devices that hold the whole model.
  const int64_t whole = stageBytes(p, 0, L, 1, false, rq.sim);
  std::vector<int> fit;
  for (int s : by_speed)
    if (capOf(s) <= 0 || whole <= capOf(s)) fit.push_back(s);
  const double per_vn = stageComputeSeconds(p, 0, L, false);
  for (size_t k = 1; k <= fit.size() && static_cast<int64_t>(k) <= rq.virtual_nodes; ++k) {
    PlanSpec plan;
    plan.replicas = static_cast<int>(k);
    plan.cuts = {0, L};
    std::vector<double> t;
    for (size_t r = 0; r < k; ++r) {
      plan.workers.push_back(fit[r]);
      plan.slowdown.push_back(rq.slot_slowdown[static_cast<size_t>(fit[r])]);
      t.push_back(per_vn * plan.slowdown.back());
    }
    plan.vn_shares = weightedShares(rq.virtual_nodes, t);
    if (std::find(plan.vn_shares.begin(), plan.vn_shares.end(), 0) != plan.vn_shares.end()) break;  // k too many
    double bound = 0;
    for (size_t r = 0; r < k; ++r) bound = std::max(bound, static_cast<double>(plan.vn_shares[r]) * t[r]);
    consider(std::move(plan), bound);
  }
  // One pipeline on the P fastest devices; types = distinct (speed, memory).
  std::vector<std::pair<double, int64_t>> kinds;
  auto typeOf = [&](int slot) {
    const std::pair<double, int64_t> k{rq.slot_slowdown[static_cast<size_t>(slot)], capOf(slot)};
    auto it = std::find(kinds.begin(), kinds.end(), k);
    if (it != kinds.end()) return static_cast<int>(it - kinds.begin());
    kinds.push_back(k);
    return static_cast<int>(kinds.size()) - 1;
  };
  for (int s = 0; s < N; ++s) typeOf(s);
  std::vector<int64_t> caps;
  for (const auto& k : kinds) caps.push_back(k.second);
  const int max_p = static_cast<int>(std::min<size_t>(L, static_cast<size_t>(N)));
  // While the P fastest devices are all of the fastest type there is one
  // order, and one DP answers every such P at once.
  int same = 0;
  while (same < max_p && typeOf(by_speed[static_cast<size_t>(same)]) == typeOf(by_speed[0])) ++same;
  const int fastest = typeOf(by_speed[0]);
  auto deviceSeconds = [&](bool rc) {
    return [&, rc](size_t i, size_t j, int t) {
      const double f = kinds[static_cast<size_t>(t)].first;
      return std::max(stageComputeSeconds(p, i, j, rc) * f, search.seconds(i, j, rc));
    };
  };
  std::map<std::pair<int, bool>, std::vector<std::optional<StageCut>>> one_type;
  for (ScheduleKind kind : rq.schedules)
    for (bool rc : {false, true}) {
      if ((rc && !rq.try_recompute) || same < 2) continue;
      const StageCostFns base = search.fns(kind, rc, rq.virtual_nodes, same);
      auto secs = deviceSeconds(rc);
      one_type[{static_cast<int>(kind), rc}] =
          minMaxCuts(L, same, {[&](size_t i, size_t j) { return secs(i, j, fastest); }, base.bytes},
                     caps[static_cast<size_t>(fastest)]);
    }
  for (int P = 2; P <= max_p; ++P) {
    std::vector<int> chosen(by_speed.begin(), by_speed.begin() + P), types;
    for (int s : chosen) types.push_back(typeOf(s));
    for (ScheduleKind kind : rq.schedules)
      for (bool rc : {false, true}) {
        if (rc && !rq.try_recompute) continue;
        std::optional<DevicePipeline> best;
        if (P <= same) {
          const auto& c = one_type.at({static_cast<int>(kind), rc})[static_cast<size_t>(P) - 1];
          if (c) best = DevicePipeline{types, *c};
        } else if (distinctOrders(types) * P * static_cast<double>(L * L) <= kMaxDeviceOrderWork) {
          const StageCostFns base = search.fns(kind, rc, rq.virtual_nodes, P);
          best = bestDevicePipeline(L, types, {deviceSeconds(rc), base.bytes, caps});
        }
        if (!best) continue;
        PlanSpec plan;
        plan.stages = P;
        plan.cuts = best->cut.cuts;
        plan.schedule = kind;
        plan.recompute = rc;
        plan.vn_shares = {rq.virtual_nodes};
        std::vector<int> left = chosen;
        for (int t : best->order) {
          auto it = std::find_if(left.begin(), left.end(), [&](int s) { return typeOf(s) == t; });
          plan.workers.push_back(*it);
          plan.slowdown.push_back(rq.slot_slowdown[static_cast<size_t>(*it)]);
          left.erase(it);
        }
        consider(std::move(plan), best->cut.bottleneck_s * static_cast<double>(rq.virtual_nodes));
      }
  }
  std::stable_sort(cands.begin(), cands.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  out.candidates = static_cast<int64_t>(cands.size());
  const size_t K = static_cast<size_t>(std::max(1, rq.top_k));
  for (auto& [bound, plan] : cands) {
    if (out.plans.size() >= K && bound >= out.plans[K - 1].sim.step_seconds) break;
    PlanChoice ch;
    SimOptions so = rq.sim;
    so.schedules = &search.schedules_;
    ch.sim = simulate(p, plan, so);
    ++out.simulated;
    bool fits = true;
    for (size_t r = 0; r < plan.workers.size(); ++r) {
      const int64_t cap = capOf(plan.workers[r]);
      fits = fits && !(cap > 0 && ch.sim.stages[r % static_cast<size_t>(plan.stages)].peak_bytes > cap);
    }
    if (!fits) continue;
    ch.plan = std::move(plan);
    auto pos = std::upper_bound(out.plans.begin(), out.plans.end(), ch, [](const PlanChoice& a, const PlanChoice& b) {
      return a.sim.step_seconds < b.sim.step_seconds;
    });
    out.plans.insert(pos, std::move(ch));
  }
  if (out.plans.empty()) {
    // Name the tightest device and what the model needs at best on all N.
    int tight = 0;
    for (int s = 1; s < N; ++s)
      if (capOf(s) > 0 && (capOf(tight) <= 0 || capOf(s) < capOf(tight))) tight = s;
    int64_t need = whole;
    for (int P = 2; P <= max_p; ++P)
      if (auto c = minPeakBytesCut(L, P, search.fns(ScheduleKind::k1F1B, true, rq.virtual_nodes, P)))
        need = std::min(need, *std::max_element(c->bytes.begin(), c->bytes.end()));
    int64_t largest = 0;
    for (int s = 0; s < N; ++s) largest = std::max(largest, capOf(s));
    throw InputError("the devices cannot hold the model: its smallest pipeline stage over " + std::to_string(max_p) +
                     " devices needs " + fmtMib(need) + " MiB, the largest device has " + fmtMib(largest) +
                     " MiB (" + fmtMib(need - largest) + " MiB short); the tightest is worker slot " +
                     std::to_string(tight) + " with " + fmtMib(capOf(tight)) + " MiB");
  }
  if (out.plans.size() > K) out.plans.resize(K);
  out.planning_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
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
  if (!rq.slot_slowdown.empty()) return planDevices(p, rq, search);

  std::vector<Candidate> cands;
  for (int P = 1; P <= max_stages; ++P) {
    const int max_d = static_cast<int>(std::min<int64_t>(rq.workers / P, rq.virtual_nodes));
    for (ScheduleKind kind : rq.schedules)
      for (bool rc : {false, true}) {
        if (rc && !rq.try_recompute) continue;
        if (P == 1 && (rc || kind != rq.schedules.front())) continue;  // no schedule to choose
        for (int D = 1; D <= max_d; ++D) {
          const int64_t M = (rq.virtual_nodes + D - 1) / D;
          // With a cap, the table for this M only needs pipelines that fit
          // D replicas: P <= N / D.
          const int depth = rq.memory_cap_bytes > 0 ? std::min(max_stages, rq.workers / D) : max_stages;
          const auto& cuts = search.cuts(kind, rc, M, depth);
          const auto& cut = cuts[static_cast<size_t>(P) - 1];
          if (!cut) continue;
          cands.push_back({P, D, kind, rc, *cut, search.lowerBound(cut->cuts, M, D, kind, rc)});
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
    ch.plan.cuts = c.cut.cuts;
    ch.plan.schedule = c.kind;
    ch.plan.recompute = c.rc;
    ch.plan.vn_shares = evenShares(rq.virtual_nodes, c.D);
    ch.bottleneck_s = c.cut.bottleneck_s;
    SimOptions so = rq.sim;
    so.schedules = &search.schedules_;
    ch.sim = simulate(p, ch.plan, so);
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
