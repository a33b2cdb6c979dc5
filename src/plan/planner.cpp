#include "plan/planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <queue>
#include <tuple>

#include "core/error.h"
#include "plan/allocation.h"
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
    base_ = prefixes(nullptr);
    if (rq.sim.device_costs)
      for (const DeviceCosts& d : *rq.sim.device_costs) tables_.push_back(prefixes(&d));
  }

  // Seconds per VN of stage [i, j): its compute, or the transfer of its
  // outgoing activation or incoming gradient when a link is slower (the
  // sender and receiver threads overlap them with compute).
  double seconds(size_t i, size_t j, bool rc) const { return std::max(compute(i, j, rc), linkSeconds(i, j)); }
  // stageComputeSeconds() in O(1), from prefix sums; `table`: an index in
  // rq.sim.device_costs (a device type's own costs), -1: the profile's.
  double compute(size_t i, size_t j, bool rc, int table = -1) const {
    const Prefixes& t = prefixesOf(table);
    const auto& pre = rc && j < L_ ? t.rc : t.plain;
    return pre[j] - pre[i];
  }
  // A device type's optimiser seconds per parameter (table as compute()).
  double optimizerPerParam(int table = -1) const {
    return table < 0 ? p_.optimizer_s_per_param : (*rq_.sim.device_costs)[static_cast<size_t>(table)].optimizer_s_per_param;
  }
  double linkSeconds(size_t i, size_t j) const {
    double s = 0;
    const double d = rq_.sim.link_delay_s;
    if (j < L_) s = std::max(s, p_.p2p.at(static_cast<double>(p_.layers[j - 1].output_bytes)) + d);
    if (i > 0) s = std::max(s, p_.p2p.at(static_cast<double>(p_.layers[i - 1].output_bytes)) + d);
    return s;
  }

  // VNs stashed at once by the stage r-th from the end, Varuna's moves
  // included: the rank's list in an r-stage pipeline is the same as in any
  // longer one (1F1B's warm-up depends on P - k only). For r = 1 (the last
  // stage) this is the last rank of a 1-stage list, which makes no moves.
  static int64_t live(ScheduleKind kind, int r, int64_t M, bool rc) { return runStashBound({kind, r, M, rc}, 0); }

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
  // With `factors` (per stage, its device's slowdown; empty: 1), each
  // stage's compute is that much longer; with `tables` (per stage, its
  // device's cost table, as compute(); empty: the profile's), each stage's
  // compute and optimiser step are its device's.
  double lowerBound(const std::vector<size_t>& cuts, int64_t M, int D, ScheduleKind kind, bool rc,
                    const std::vector<double>& factors = {}, const std::vector<int>& tables = {}) const {
    const size_t P = cuts.size() - 1;
    std::vector<double> f(P, 0.0), b(P, 0.0), values(P, -tied_values_);
    auto tableOf = [&](size_t k) { return tables.empty() ? -1 : tables[k]; };
    for (size_t k = 0; k < P; ++k) {
      const int t = tableOf(k);
      const DeviceCosts* d = t < 0 ? nullptr : &(*rq_.sim.device_costs)[static_cast<size_t>(t)];
      // The forward the schedule runs (the simulator's): without autograd's
      // records where the stage recomputes (never the last). Not the
      // cheaper of the two: the forwards a stage runs while it waits for
      // its first gradient are subtracted from that wait, so a cheaper
      // one there overstates the idle time (Planner tests).
      const bool no_grad = rc && cuts[k + 1] < L_;
      for (size_t l = cuts[k]; l < cuts[k + 1]; ++l) {
        if (d) {
          f[k] += no_grad ? d->layers[l].forward_nograd_s : d->layers[l].forward_s;
          b[k] += d->layers[l].backward_s;
        } else {
          f[k] += no_grad ? p_.layers[l].forward_nograd_s : p_.layers[l].forward_s;
          b[k] += p_.layers[l].backward_s;
        }
        values[k] += static_cast<double>(p_.layers[l].params + p_.layers[l].bn_values);
      }
      if (!factors.empty()) f[k] *= factors[k], b[k] *= factors[k];
    }
    double best = 0, fill_f = 0, fill_b = 0, after = 0;
    for (size_t k = 0; k < P; ++k) after += f[k] + b[k];
    for (size_t k = 0; k < P; ++k) {
      after -= f[k] + b[k];
      const double v = std::max(values[k], 0.0);
      const double reduce = P == 1 ? 0.0
                                   : p_.reduceSeconds(v, D) +
                                         optimizerPerParam(tableOf(k)) * v;
      const double ahead = kind == ScheduleKind::k1F1B ? std::min<double>(static_cast<double>(P - k - 1), M - 1.0)
                                                       : M - 1.0;
      const double idle = std::max(0.0, after - ahead * f[k]);
      const double per_vn = factors.empty() ? seconds(cuts[k], cuts[k + 1], rc)
                                            : std::max(compute(cuts[k], cuts[k + 1], rc, tableOf(k)) * factors[k],
                                                       linkSeconds(cuts[k], cuts[k + 1]));
      best = std::max(best, static_cast<double>(M) * per_vn + fill_f + idle + std::max(reduce, fill_b));
      fill_f += f[k], fill_b += b[k];
    }
    return best;
  }

  // planJob() without a resources file puts every rank on this host: the
  // simulator never ends the compute phase sooner than the host's compute
  // (V VNs through the whole model, times the contention of two or more
  // processes) over its cores, and after it come, for a pipeline, the MAX
  // all-reduce and the statistics' sum over all P x D ranks, and the step
  // overhead. Without it, with more workers than cores, every candidate's
  // bound lay far below its step and nearly all of them were simulated
  // (`--workers 1024`: 30 s).
  // The host's compute is exact for a cut: each stage's per-VN compute
  // (with recomputation where the stage recomputes), times V.
  double oneHostBound(const std::vector<size_t>& cuts, int D, bool rc) const {
    if (rq_.sim.in_process || !rq_.host_bounds) return 0.0;
    const int P = static_cast<int>(cuts.size()) - 1, n = P * D;
    // Data parallelism: every worker busy at once (the simulator's factor).
    const double contention = P == 1 ? p_.dataParallelFactor(n, n) : p_.computeFactor(n, n);
    double per_vn = 0;
    for (int k = 0; k < P; ++k) per_vn += compute(cuts[static_cast<size_t>(k)], cuts[static_cast<size_t>(k) + 1], rc && P > 1);
    double t = static_cast<double>(rq_.virtual_nodes) * per_vn * contention /
               static_cast<double>(std::max(1, p_.host_cores));
    if (P > 1) {
      const double max_bytes = 8.0 * (4.0 * static_cast<double>(L_) + 4.0);
      const double max_reduce = p_.allreduceSeconds(p_.allreduce_max, max_bytes, n);
      t += max_reduce * (rq_.sim.clipping ? 2.0 : 1.0) + p_.reduceSeconds(2.0, n) + p_.pipelineStepSeconds();
    }
    return (t + p_.step_overhead_s) * (1.0 - 1e-9);  // sums in another order: never above the simulator's
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
            },
            [this](size_t i, size_t j) { return computeLowerBound(i, j); }};
  }

  // The compute of layers [i, j) per VN with or without recomputation is
  // at least this (an O(1) prefix difference, nondecreasing in j); table
  // as compute().
  double computeLowerBound(size_t i, size_t j, int table = -1) const {
    const Prefixes& t = prefixesOf(table);
    return t.lb[j] - t.lb[i];
  }

  // The best cut for every P, for this schedule's memory situation. Without
  // a cap only the recomputation flag changes the cut.
  const std::vector<std::optional<StageCut>>& cuts(ScheduleKind kind, bool rc, int64_t M, int max_stages) {
    const bool capped = rq_.memory_cap_bytes > 0;
    const bool gpipe = kind == ScheduleKind::kGpipe, varuna = kind == ScheduleKind::kVaruna;
    // 1F1B stashes min(r, M) VNs, Varuna min(r + 1, M) (its moves,
    // runStashBound()): M beyond the deepest stage (plus one) changes nothing.
    const int64_t m_eff = !capped ? 0 : gpipe ? M : std::min<int64_t>(M, max_stages + (varuna ? 1 : 0));
    const int klass = !capped ? 0 : gpipe ? 1 : varuna ? 3 : 2;
    auto key = std::make_tuple(klass, rc, m_eff);
    auto it = cuts_.find(key);
    // A table made for fewer stages cannot answer this P; without a cap one
    // table for the deepest pipeline serves every M.
    if (it != cuts_.end() && static_cast<int>(it->second.size()) >= max_stages) return it->second;
    return cuts_[key] = minMaxCuts(L_, max_stages, fns(kind, rc, std::max<int64_t>(M, 1), max_stages),
                                   rq_.memory_cap_bytes);
  }

 private:
  // Per layer, prefix sums of one VN's compute: at least (lb), plain, and
  // with recomputation (rc).
  struct Prefixes {
    std::vector<double> lb{0.0}, plain{0.0}, rc{0.0};
  };
  Prefixes prefixes(const DeviceCosts* d) const {
    Prefixes t;
    for (size_t l = 0; l < L_; ++l) {
      const LayerCost& c = p_.layers[l];
      const LayerTimes own = d ? d->layers[l] : LayerTimes{c.forward_s, c.forward_nograd_s, c.backward_s, c.recompute_s};
      t.lb.push_back(t.lb.back() + std::min(own.forward_s, own.forward_nograd_s) + own.backward_s);
      t.plain.push_back(t.plain.back() + own.forward_s + own.backward_s);
      t.rc.push_back(t.rc.back() + own.forward_nograd_s + own.recompute_s + own.backward_s);
    }
    return t;
  }
  const Prefixes& prefixesOf(int table) const { return table < 0 ? base_ : tables_[static_cast<size_t>(table)]; }

  const Profile& p_;
  const PlanRequest& rq_;
  size_t L_;
  double tied_values_ = 0;
  Prefixes base_;
  std::vector<Prefixes> tables_;  // by rq.sim.device_costs index
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
// steps stay under this; beyond it, three orders (pipelineFor()), each
// with its exact cut.
constexpr double kMaxDeviceOrderWork = 2e6;
// Orders tried per group for a given cut (an O(P) check each).
constexpr double kMaxOrdersPerCut = 5000;

// No pipeline of P stages whose one VN takes `c` seconds of compute in all
// steps M VNs faster than this. Stage k cannot finish before the stages
// ahead of it passed VN 0 forward (their forward times), it did its M
// forwards and backwards, and the last gradient went back through them:
// T >= S_k + M c_k for every k (S_k: the compute of the stages before k).
// The stage times that make the largest of these smallest make them all
// equal, c_k = (T - S_k) / M, so T - S_k = T (1 - 1/M)^k and
// c = S_P = T (1 - (1 - 1/M)^P).
double fillBound(double c, int64_t M, int P) {
  if (M <= 0) return 0;
  return c / (1.0 - std::pow(1.0 - 1.0 / static_cast<double>(M), P));
}

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

// Heterogeneous devices (planner.h): groups of devices (virtual workers)
// with one shared cut, each group in its own device order, VN shares by
// group speed. Devices are classed by (slowdown, memory, cost table):
// devices of one class are interchangeable. A class's stage time is its
// cost table's per-layer compute (the profile's, or its type's own,
// rq.slot_costs) times its slowdown.
class DeviceSearch {
 public:
  DeviceSearch(const Profile& p, const PlanRequest& rq, Search& search)
      : p_(p), rq_(rq), search_(search), L_(p.layers.size()) {
    for (size_t s = 0; s < rq.slot_slowdown.size(); ++s) {
      const Kind k{rq.slot_slowdown[s], capOf(static_cast<int>(s)), tableOfSlot(static_cast<int>(s))};
      auto it = std::find(kinds_.begin(), kinds_.end(), k);
      class_.push_back(static_cast<int>(it - kinds_.begin()));
      if (it == kinds_.end()) kinds_.push_back(k);
    }
    for (int h : rq.slot_host) {
      if (h < 0) throw InputError("planning: a device's host index is " + std::to_string(h) + ", expected >= 0");
      hosts_ = std::max(hosts_, h + 1);
    }
    whole_bytes_ = stageBytes(p, 0, L_, 1, false, rq.sim);
    per_vn_ = stageComputeSeconds(p, 0, L_, false);
    for (const LayerCost& c : p.layers) c_lb_ += std::min(c.forward_s, c.forward_nograd_s) + c.backward_s;
    f0_ = 1e300;
    for (const Kind& k : kinds_) {
      caps_.push_back(k.memory);
      const DeviceCosts* d = k.table < 0 ? nullptr : &(*rq.sim.device_costs)[static_cast<size_t>(k.table)];
      // The profile's classes exactly as before per-type costs (the same
      // expressions, so the same plans).
      class_vn_.push_back(d ? stageComputeSeconds(p, 0, L_, false, d) * k.factor : per_vn_ * k.factor);
      has_tables_ = has_tables_ || d;
      f0_ = std::min(f0_, k.factor);
    }
    if (has_tables_) {
      // Per layer, its fastest class's time at least: a bound on any
      // device's stage, and on one VN's path through any group.
      fast_prefix_.push_back(0.0);
      fast_opt_ = 1e300;
      for (size_t l = 0; l < L_; ++l) {
        double m = 1e300;
        for (const Kind& k : kinds_) m = std::min(m, search.computeLowerBound(l, l + 1, k.table) * k.factor);
        fast_prefix_.push_back(fast_prefix_.back() + m);
      }
      for (const Kind& k : kinds_) fast_opt_ = std::min(fast_opt_, search.optimizerPerParam(k.table) * k.factor);
    }
    // The host's cores carry each layer at its own table's cost, without
    // the slowdown (an emulated slow device idles): at least each layer on
    // the table cheapest at it.
    host_lb_ = 0;
    for (size_t l = 0; l < L_; ++l) {
      double m = 1e300;
      for (const Kind& k : kinds_) m = std::min(m, search.computeLowerBound(l, l + 1, k.table));
      host_lb_ += m;
    }
    host_lb_ *= 1.0 - 1e-12;  // sums in another order
    min_p2p_ = 1e300;
    for (size_t l = 0; l + 1 < L_; ++l)
      min_p2p_ = std::min(min_p2p_, p.p2p.at(static_cast<double>(p.layers[l].output_bytes)) + rq.sim.link_delay_s);
    min_p2p_ = std::max(0.0, L_ > 1 ? min_p2p_ : 0.0);
  }
  // Some class has its own per-layer costs (rq.slot_costs).
  bool hasTables() const { return has_tables_; }
  // The profile's compute of the whole model per VN, at least, and the
  // smallest slowdown.
  double computeLowerBound() const { return c_lb_; }
  double minFactor() const { return f0_; }
  // The compute of layers [i, j) per VN on any of the devices is at least
  // this (nondecreasing in j). Without cost tables: the profile's bound on
  // the fastest device; with them, each layer on the class fastest at it
  // (less a rounding margin: sums in another order).
  double fastLowerBound(size_t i, size_t j) const {
    if (!has_tables_) return search_.computeLowerBound(i, j) * f0_;
    return (fast_prefix_[j] - fast_prefix_[i]) * (1.0 - 1e-12);
  }
  // One VN through the whole model on these devices takes at least this.
  double fastWhole() const { return has_tables_ ? fastLowerBound(0, L_) : c_lb_ * f0_; }
  // The optimiser's seconds per parameter on any of the devices, at least.
  double fastOptimizerPerParam() const { return has_tables_ ? fast_opt_ : p_.optimizer_s_per_param * f0_; }
  // One VN's forward and backward through P stages on these devices: the
  // whole model's compute on the fastest of them (with cost tables: each
  // layer on the class fastest at it), and 2 (P - 1) transfers of the
  // smallest activation. No plan on them steps faster.
  double pathLowerBound(const std::vector<int>& group) const {
    return groupFastWhole(group) + 2.0 * static_cast<double>(group.size() - 1) * min_p2p_;
  }
  double minTransfer() const { return min_p2p_; }
  // Seconds of one VN through the whole model on `slot`'s device: orders
  // devices by speed.
  double slotSeconds(int slot) const { return class_vn_[static_cast<size_t>(classOf(slot))]; }
  int tableOfSlot(int slot) const { return rq_.slot_costs.empty() ? -1 : rq_.slot_costs[static_cast<size_t>(slot)]; }

  int64_t capOf(int slot) const {
    const int64_t c = rq_.slot_memory.empty() ? 0 : rq_.slot_memory[static_cast<size_t>(slot)];
    return c > 0 ? c : rq_.memory_cap_bytes;
  }
  int classOf(int slot) const { return class_[static_cast<size_t>(slot)]; }
  std::vector<PoolDevice> pool() const {
    std::vector<PoolDevice> out;
    for (size_t s = 0; s < class_.size(); ++s)
      out.push_back({class_[s], has_tables_ ? slotSeconds(static_cast<int>(s)) : rq_.slot_slowdown[s],
                     rq_.slot_host.empty() ? 0 : rq_.slot_host[s]});
    return out;
  }
  int64_t wholeBytes() const { return whole_bytes_; }

  // hostBound() for every plan of P x D devices on `hosts` hosts, before
  // any cut or share is known: the busiest host computes at least the
  // average of V VNs through the whole model (each layer on the table
  // cheapest at it, times the contention) over the hosts, on its cores.
  // Where hosts hold more ranks than cores this bound, not the devices'
  // speeds, orders the shapes and ends the search.
  double shapeHostBound(int P, int D, int hosts) const {
    if (rq_.sim.in_process || !rq_.host_bounds) return 0.0;
    const int n = P * D;
    // One host: its n processes' factor; more: each host holds at least
    // one of them (factors >= 1: a lower bound).
    const double contention = hosts <= 1 ? p_.computeFactor(n, n) : p_.computeFactor(1, n);
    const double busy = static_cast<double>(rq_.virtual_nodes) * host_lb_ * contention /
                        static_cast<double>(std::max(1, hosts));
    return (busy / static_cast<double>(std::max(1, p_.host_cores)) + afterHostCompute(P, n)) * (1.0 - 1e-9);
  }

  // The plans of one grouping (every schedule and recomputation for P > 1)
  // with their lower bounds (the slowest group's VNs times its slowest
  // stage). min_each = 1: every group gets a VN (a policy's fixed groups);
  // 0: a grouping where a group would get none is left out (fewer groups
  // are tried too).
  // `stage_lb` (per VN, a bound on any P-stage cut's slowest stage) and
  // `cutoff`: a grouping that cannot beat cutoff even with every group's
  // slowest stage at its bound is skipped before any cut is searched.
  void plans(const Grouping& g, int64_t min_each, std::vector<std::pair<double, PlanSpec>>& out,
             double stage_lb = 0, double cutoff = 1e300) {
    const int D = static_cast<int>(g.groups.size());
    if (D == 0 || g.groups.front().empty() || rq_.virtual_nodes < D * min_each) return;
    const int P = static_cast<int>(g.groups.front().size());
    if (static_cast<size_t>(P) > L_) return;
    if (cutoff < 1e300) {
      // Each group's slowest stage per VN is at least stage_lb and at least
      // its compute spread perfectly over its devices; the best shares for
      // these bounds bound every plan of this grouping.
      // (With cost tables: the group's P stages hold every layer, each at
      // least on the class fastest at it, so the slowest at least 1/P.)
      std::vector<double> t;
      for (const auto& grp : g.groups) {
        double speed = 0;
        for (int s : grp) speed += 1.0 / rq_.slot_slowdown[static_cast<size_t>(s)];
        t.push_back(std::max(stage_lb, has_tables_ ? groupFastWhole(grp) / static_cast<double>(P) : c_lb_ / speed));
      }
      const auto shares = weightedShares(rq_.virtual_nodes, t, min_each);
      double bound = 0;
      for (size_t d = 0; d < t.size(); ++d) {
        bound = std::max(bound, static_cast<double>(shares[d]) * t[d]);
        // A group with a VN also takes one VN's whole path.
        if (shares[d] > 0) bound = std::max(bound, pathLowerBound(g.groups[d]));
      }
      // And fillBound() per group, VNs given where they raise it least
      // (for P = 1 it is M c, which the shares above already bound: skipped,
      // it was most of the time of a data-parallel shape of 512 VNs).
      if (P > 1) {
        using Next = std::pair<double, size_t>;
        std::priority_queue<Next, std::vector<Next>, std::greater<Next>> next;
        std::vector<int64_t> m(t.size(), std::max<int64_t>(min_each, 0));
        std::vector<double> c(t.size());
        double fill = 0;
        for (size_t d = 0; d < t.size(); ++d) {
          c[d] = groupFastWhole(g.groups[d]);
          fill = std::max(fill, fillBound(c[d], m[d], P));
          next.push({fillBound(c[d], m[d] + 1, P), d});
        }
        for (int64_t v = m[0] * static_cast<int64_t>(t.size()); v < rq_.virtual_nodes; ++v) {
          const auto [val, d] = next.top();
          next.pop();
          fill = std::max(fill, val);
          ++m[d];
          next.push({fillBound(c[d], m[d] + 1, P), d});
        }
        bound = std::max(bound, fill);
      }
      if (bound >= cutoff) return;
    }
    if (P == 1) {
      std::vector<double> t;
      for (const auto& grp : g.groups) {
        const int64_t cap = capOf(grp[0]);
        if (cap > 0 && whole_bytes_ > cap) return;
        t.push_back(slotSeconds(grp[0]));
      }
      PlanSpec plan;
      plan.replicas = D;
      plan.cuts = {0, L_};
      for (const auto& grp : g.groups) plan.workers.push_back(grp[0]);
      finish(plan, t, min_each, out);
      return;
    }
    // Groups of the same classes are alike: one order search each.
    std::vector<std::vector<int>> comps;
    std::vector<size_t> comp_of;
    for (const auto& grp : g.groups) {
      std::vector<int> c;
      for (int s : grp) c.push_back(classOf(s));
      std::sort(c.begin(), c.end());
      auto it = std::find(comps.begin(), comps.end(), c);
      comp_of.push_back(static_cast<size_t>(it - comps.begin()));
      if (it == comps.end()) comps.push_back(c);
    }
    const int64_t M = (rq_.virtual_nodes + D - 1) / D;
    for (ScheduleKind kind : rq_.schedules) {
      bool plain_fits = false;
      for (bool rc : {false, true}) {
        // Recomputation only adds compute: it is tried when the plain
        // schedule does not fit the devices' memory.
        if (rc && (!rq_.try_recompute || plain_fits)) continue;
        const StageCostFns base = search_.fns(kind, rc, M, P);
        // Each composition's own best order and cut; every cut found is
        // then tried on all groups (exact when the groups are alike).
        std::vector<std::vector<size_t>> cuts;
        std::vector<DevicePipeline> own;  // per composition, its own best order and cut
        bool feasible = true;
        for (const auto& c : comps) {
          auto d = pipelineFor(c, kind, rc, M, base);
          if (!d) {
            feasible = false;
            break;
          }
          own.push_back(*d);
          if (std::find(cuts.begin(), cuts.end(), d->cut.cuts) == cuts.end()) cuts.push_back(d->cut.cuts);
        }
        if (!feasible) continue;
        double best_bound = 0;
        std::optional<PlanSpec> best;
        std::vector<double> best_t;
        std::vector<std::vector<int>> best_orders;
        for (const auto& cut : cuts) {
          std::vector<std::vector<int>> orders;
          std::vector<double> comp_t;
          for (const auto& c : comps) {
            auto o = orderFor(c, cut, rc, base);
            if (!o) break;
            orders.push_back(o->first);
            comp_t.push_back(o->second);
          }
          if (orders.size() != comps.size()) continue;
          std::vector<double> t;
          for (int d = 0; d < D; ++d) t.push_back(comp_t[comp_of[static_cast<size_t>(d)]]);
          const auto shares = weightedShares(rq_.virtual_nodes, t, min_each);
          double bound = 0;
          for (int d = 0; d < D; ++d) bound = std::max(bound, static_cast<double>(shares[static_cast<size_t>(d)]) * t[static_cast<size_t>(d)]);
          if (best && !(bound < best_bound)) continue;
          PlanSpec plan;
          plan.stages = P;
          plan.replicas = D;
          plan.cuts = cut;
          plan.schedule = kind;
          plan.recompute = rc;
          best = plan, best_bound = bound, best_t = t, best_orders = orders;
        }
        if (!best) continue;
        plain_fits = !rc;
        best->workers = slotsInOrder(g, comp_of, best_orders);
        const PlanSpec proto = *best;
        const size_t before = out.size();
        finish(*best, best_t, min_each, out);
        // Groups whose own cuts differ: a cut per group too (group_cut.h).
        if (rq_.compare_group_cuts && cuts.size() > 1)
          groupCutCandidate(g, comp_of, own, proto, out.size() > before ? out.back().second : PlanSpec{}, min_each);
      }
    }
  }

  // Plans with a cut per group (PlanSpec::group_cuts), each with its shared
  // counterpart (same groups, schedule and recomputation), by bound.
  struct GroupCutCandidate {
    double bound;
    PlanSpec per_group, shared;
  };
  std::vector<GroupCutCandidate>& groupCutCandidates() { return group_cands_; }
  // Each rank's own stage within its device's memory (the simulator's
  // stage figure is the largest over the groups).
  bool ranksFit(const PlanSpec& plan) const {
    const int P = plan.stages;
    const int64_t M_max = *std::max_element(plan.vn_shares.begin(), plan.vn_shares.end());
    for (int d = 0; d < plan.replicas; ++d)
      for (int k = 0; k < P; ++k) {
        const auto& c = plan.group_cuts.empty() ? plan.cuts : plan.group_cuts[static_cast<size_t>(d)];
        const int64_t cap = capOf(plan.workers[static_cast<size_t>(d * P + k)]);
        if (cap > 0 && stageBytes(p_, c[static_cast<size_t>(k)], c[static_cast<size_t>(k) + 1],
                                  runStashBound({plan.schedule, P, M_max, plan.recompute}, k), plan.recompute,
                                  rq_.sim) > cap)
          return false;
      }
    return true;
  }

 private:
  // Worker slots of each group in its composition's class order.
  std::vector<int> slotsInOrder(const Grouping& g, const std::vector<size_t>& comp_of,
                                const std::vector<std::vector<int>>& orders) const {
    std::vector<int> workers;
    for (size_t d = 0; d < g.groups.size(); ++d) {
      std::vector<int> left = g.groups[d];
      for (int cls : orders[comp_of[d]]) {
        auto it = std::find_if(left.begin(), left.end(), [&](int s) { return classOf(s) == cls; });
        workers.push_back(*it);
        left.erase(it);
      }
    }
    return workers;
  }

  // Every group on its own composition's best order and cut (the exact DP
  // for its devices, pipelineFor()), VN shares by those groups' times;
  // kept with `shared` (this grouping's shared-cut plan, before finish())
  // for PlanOutcome::group_cuts.
  // (`shared`: vn_shares empty when every group did not get a VN.)
  void groupCutCandidate(const Grouping& g, const std::vector<size_t>& comp_of, const std::vector<DevicePipeline>& own,
                         const PlanSpec& proto, const PlanSpec& shared, int64_t min_each) {
    const size_t D = g.groups.size();
    PlanSpec plan = proto;
    std::vector<std::vector<int>> orders;
    for (const DevicePipeline& o : own) orders.push_back(o.order);
    plan.workers = slotsInOrder(g, comp_of, orders);
    plan.group_cuts.clear();
    std::vector<double> t;
    for (size_t d = 0; d < D; ++d) {
      plan.group_cuts.push_back(own[comp_of[d]].cut.cuts);
      t.push_back(own[comp_of[d]].cut.bottleneck_s);
    }
    plan.cuts = plan.group_cuts.front();
    std::vector<std::pair<double, PlanSpec>> one;
    finish(plan, t, min_each, one);
    if (one.empty()) return;
    group_cands_.push_back({one.front().first, std::move(one.front().second), shared});
  }

  // Shares, per-rank slowdowns and the bound; out only if every group gets
  // a VN.
  // The bound is Search::lowerBound() per group, on its devices' speeds.
  void finish(PlanSpec& plan, const std::vector<double>& t, int64_t min_each,
              std::vector<std::pair<double, PlanSpec>>& out) {
    plan.vn_shares = weightedShares(rq_.virtual_nodes, t, min_each);
    if (std::find(plan.vn_shares.begin(), plan.vn_shares.end(), 0) != plan.vn_shares.end()) return;
    for (int s : plan.workers) plan.slowdown.push_back(rq_.slot_slowdown[static_cast<size_t>(s)]);
    const size_t P = static_cast<size_t>(plan.stages);
    double bound = 0;
    // Groups of the same device factors, tables and share have the same
    // bound (hundreds of groups, a few distinct): computed once each.
    std::map<std::tuple<std::vector<double>, std::vector<int>, int64_t, std::vector<size_t>>, double> seen;
    for (size_t d = 0; d < t.size(); ++d) {
      std::vector<double> f(plan.slowdown.begin() + static_cast<long>(d * P),
                            plan.slowdown.begin() + static_cast<long>((d + 1) * P));
      std::vector<int> tables;
      if (has_tables_)
        for (size_t k = 0; k < P; ++k) tables.push_back(tableOfSlot(plan.workers[d * P + k]));
      // (A cut per group: the group's own cut, PlanSpec::group_cuts.)
      const std::vector<size_t>& cuts = plan.group_cuts.empty() ? plan.cuts : plan.group_cuts[d];
      auto key = std::make_tuple(std::move(f), std::move(tables), plan.vn_shares[d],
                                 plan.group_cuts.empty() ? std::vector<size_t>{} : cuts);
      auto it = seen.find(key);
      if (it == seen.end())
        it = seen.emplace(key, search_.lowerBound(cuts, plan.vn_shares[d], plan.replicas, plan.schedule,
                                                  plan.recompute, std::get<0>(key), std::get<1>(key)))
                 .first;
      bound = std::max(bound, it->second);
    }
    out.push_back({std::max(bound, hostBound(plan)), std::move(plan)});
  }

  // What simulate() charges at least after the compute of its busiest host:
  // the ranks of a host share its cores (compute phase >= the host's
  // compute, as this machine's, over its cores), then, for a pipeline, the
  // MAX all-reduce and the statistics' sum over all ranks, and the step
  // overhead. Tighter than lowerBound() wherever hosts hold more ranks
  // than cores; O(ranks).
  double hostBound(const PlanSpec& plan) const {
    if (rq_.sim.in_process || !rq_.host_bounds) return 0.0;
    const int P = plan.stages, n = plan.stages * plan.replicas;
    auto hostOfRank = [&](int r) {  // whose cores: SimOptions::hosts_share_cores as the simulator
      const int slot = plan.workers[static_cast<size_t>(r)];
      return rq_.slot_host.empty() || rq_.sim.hosts_share_cores ? 0 : rq_.slot_host[static_cast<size_t>(slot)];
    };
    std::vector<int> on_host(static_cast<size_t>(std::max(1, hosts_)), 0);  // the simulator's factor per host
    for (int r = 0; r < n; ++r) ++on_host[static_cast<size_t>(hostOfRank(r))];
    std::vector<double> host_busy(static_cast<size_t>(hosts_), 0.0);
    for (int d = 0; d < plan.replicas; ++d)
      for (int k = 0; k < P; ++k) {
        const auto& cuts = plan.group_cuts.empty() ? plan.cuts : plan.group_cuts[static_cast<size_t>(d)];
        const int slot = plan.workers[static_cast<size_t>(d * P + k)];
        const int host = hostOfRank(d * P + k);
        const int m = on_host[static_cast<size_t>(host)];
        const double f = P == 1 ? p_.dataParallelFactor(m, n) : p_.computeFactor(m, n);
        host_busy[static_cast<size_t>(host)] +=
            static_cast<double>(plan.vn_shares[static_cast<size_t>(d)]) * f *
            search_.compute(cuts[static_cast<size_t>(k)], cuts[static_cast<size_t>(k) + 1],
                            plan.recompute && P > 1, tableOfSlot(slot));
      }
    double t = 0;
    for (double busy : host_busy) t = std::max(t, busy / static_cast<double>(std::max(1, p_.host_cores)));
    if (P == 1) {
      // Data parallelism steps the optimiser on every worker after the
      // last bucket is reduced: the slowest worker's step comes after it.
      double opt = 0;
      for (int r = 0; r < n; ++r) {
        const int s = plan.workers[static_cast<size_t>(r)];
        opt = std::max(opt, search_.optimizerPerParam(tableOfSlot(s)) * rq_.slot_slowdown[static_cast<size_t>(s)] *
                                p_.dataParallelFactor(on_host[static_cast<size_t>(hostOfRank(r))], n));
      }
      t += opt * static_cast<double>(p_.totalParams());
    }
    return (t + afterHostCompute(P, n)) * (1.0 - 1e-9);  // sums in another order: never above the simulator's
  }

  // What simulate() charges after the compute phase at least, for P stages
  // on n ranks: a pipeline's MAX all-reduce(s) and the statistics' sum over
  // every rank; data parallelism's last bucket (reduced after the last VN:
  // it holds at least the statistics and every worker's slots, 2 + n (2 +
  // n) values, and the batch-norm statistics); the step overhead.
  double afterHostCompute(int P, int n) const {
    double t = p_.step_overhead_s;
    if (P == 1) {
      double stats = 2.0 + static_cast<double>(n) * (2.0 + static_cast<double>(n));
      for (const LayerCost& c : p_.layers) stats += static_cast<double>(c.bn_values);
      t += p_.reduceSeconds(stats, n);
    }
    if (P > 1) {
      const double max_bytes = 8.0 * (4.0 * static_cast<double>(L_) + 4.0);
      t += p_.allreduceSeconds(p_.allreduce_max, max_bytes, n) * (rq_.sim.clipping ? 2.0 : 1.0) +
           p_.reduceSeconds(2.0, n) + p_.pipelineStepSeconds();
    }
    return t;
  }

  // A class's stage: its cost table's compute times its slowdown.
  double lbSeconds(size_t i, size_t j, int cls) const {
    const Kind& k = kinds_[static_cast<size_t>(cls)];
    return search_.computeLowerBound(i, j, k.table) * k.factor;
  }
  double classSeconds(size_t i, size_t j, bool rc, int cls) const {
    const Kind& k = kinds_[static_cast<size_t>(cls)];
    return std::max(search_.compute(i, j, rc, k.table) * k.factor, search_.linkSeconds(i, j));
  }
  // One VN through the whole model on the group's devices, at least: its
  // fastest device's (with cost tables: each layer on the class fastest
  // at it, of every class).
  double groupFastWhole(const std::vector<int>& group) const {
    if (has_tables_) return fastWhole();
    double f = 1e300;
    for (int s : group) f = std::min(f, rq_.slot_slowdown[static_cast<size_t>(s)]);
    return c_lb_ * f;
  }

  // One group's best device order and cut (exact over its distinct orders
  // while they are few), memoised by (classes, memory situation).
  std::optional<DevicePipeline> pipelineFor(const std::vector<int>& comp, ScheduleKind kind, bool rc, int64_t M,
                                            const StageCostFns& base) {
    const int P = static_cast<int>(comp.size());
    const bool capped = std::any_of(caps_.begin(), caps_.end(), [](int64_t c) { return c > 0; });
    const bool gpipe = kind == ScheduleKind::kGpipe, varuna = kind == ScheduleKind::kVaruna;
    const int64_t m_eff = !capped ? 0 : gpipe ? M : std::min<int64_t>(M, P + (varuna ? 1 : 0));
    const int klass = !capped ? 0 : gpipe ? 1 : varuna ? 3 : 2;
    auto key = std::make_tuple(comp, klass, rc, m_eff);
    if (auto it = pipes_.find(key); it != pipes_.end()) return it->second;
    std::optional<DevicePipeline> d;
    if (capped) {
      // The best pipeline without the caps is also the best with them
      // when it fits them: try it first (one answer for every schedule).
      auto free_key = std::make_tuple(comp, 0, rc, int64_t{0});
      auto it = pipes_.find(free_key);
      if (it == pipes_.end()) it = pipes_.emplace(free_key, solvePipeline(comp, rc, base, false, 0, 0)).first;
      if (it->second) {
        const DevicePipeline& f = *it->second;
        bool fits = true;
        for (int k = 0; k < P && fits; ++k) {
          const int64_t cap = caps_[static_cast<size_t>(f.order[static_cast<size_t>(k)])];
          fits = cap <= 0 || base.bytes(f.cut.cuts[static_cast<size_t>(k)], f.cut.cuts[static_cast<size_t>(k) + 1], P - k) <= cap;
        }
        if (fits) d = f;
      }
    }
    if (!d) d = solvePipeline(comp, rc, base, capped, klass, m_eff);
    pipes_[key] = d;
    return d;
  }

  // use_caps: within each class's memory, for the memory situation
  // (klass, m_eff) that `base` describes; else without caps.
  std::optional<DevicePipeline> solvePipeline(const std::vector<int>& comp, bool rc, const StageCostFns& base,
                                              bool use_caps, int klass, int64_t m_eff) {
    const int P = static_cast<int>(comp.size());
    const std::vector<int64_t> caps = use_caps ? caps_ : std::vector<int64_t>(caps_.size(), 0);
    std::optional<DevicePipeline> d;
    auto secs = [this, rc](size_t i, size_t j, int cls) { return classSeconds(i, j, rc, cls); };
    auto lb = [this](size_t i, size_t j, int cls) { return lbSeconds(i, j, cls); };
    if (std::all_of(comp.begin(), comp.end(), [&](int c) { return c == comp[0]; })) {
      // One class: one DP answers every depth; keep the table (per memory
      // situation: the bytes callback is this schedule's).
      const int cls = comp[0];
      auto& table = one_class_[std::make_tuple(cls, use_caps ? klass : 0, rc, use_caps ? m_eff : 0)];
      if (static_cast<int>(table.size()) < P) {
        table = minMaxCuts(L_, std::max(P, static_cast<int>(table.size())),
                           {[&](size_t i, size_t j) { return secs(i, j, cls); }, base.bytes,
                            [&](size_t i, size_t j) { return lbSeconds(i, j, cls); }},
                           caps[static_cast<size_t>(cls)]);
      }
      if (table[static_cast<size_t>(P) - 1]) d = DevicePipeline{comp, *table[static_cast<size_t>(P) - 1]};
    } else if (distinctOrders(comp) * P * static_cast<double>(L_ * L_) <= kMaxDeviceOrderWork) {
      d = bestDevicePipeline(L_, comp, {secs, base.bytes, caps, lb});
    } else {
      // Too many orders: three, each with its exact cut: the memory-rich
      // devices first (1F1B stashes the most at the front), then the
      // fastest; the fastest first; the slowest first.
      auto memory = [&](int c) {
        const int64_t m = kinds_[static_cast<size_t>(c)].memory;
        return m > 0 ? m : INT64_MAX;
      };
      auto speed = [&](int c) { return has_tables_ ? class_vn_[static_cast<size_t>(c)] : kinds_[static_cast<size_t>(c)].factor; };
      std::vector<int> orders[3] = {comp, comp, comp};
      std::stable_sort(orders[0].begin(), orders[0].end(), [&](int a, int b) {
        return memory(a) != memory(b) ? memory(a) > memory(b) : speed(a) < speed(b);
      });
      std::stable_sort(orders[1].begin(), orders[1].end(), [&](int a, int b) { return speed(a) < speed(b); });
      std::stable_sort(orders[2].begin(), orders[2].end(), [&](int a, int b) { return speed(a) > speed(b); });
      for (const auto& order : orders) {
        auto o = bestDevicePipeline(L_, order, {secs, base.bytes, caps, lb}, false);
        if (o && (!d || o->cut.bottleneck_s < d->cut.bottleneck_s)) d = std::move(o);
      }
    }
    return d;
  }

  // For a fixed cut: the group's device order with the fastest slowest
  // stage, every stage within its device's memory, and that stage's time.
  std::optional<std::pair<std::vector<int>, double>> orderFor(const std::vector<int>& comp,
                                                              const std::vector<size_t>& cut, bool rc,
                                                              const StageCostFns& base) {
    const size_t P = comp.size();
    std::vector<int64_t> bytes(P);
    for (size_t k = 0; k < P; ++k) bytes[k] = base.bytes(cut[k], cut[k + 1], static_cast<int>(P - k));
    auto fits = [&](size_t k, int cls) {
      const int64_t cap = caps_[static_cast<size_t>(cls)];
      return cap <= 0 || bytes[k] <= cap;
    };
    std::optional<std::pair<std::vector<int>, double>> best;
    if (distinctOrders(comp) <= kMaxOrdersPerCut) {
      std::vector<int> o = comp;
      std::sort(o.begin(), o.end());
      do {
        double t = 0;
        bool ok = true;
        for (size_t k = 0; k < P && ok; ++k) {
          ok = fits(k, o[k]);
          t = std::max(t, classSeconds(cut[k], cut[k + 1], rc, o[k]));
        }
        if (ok && (!best || t < best->second)) best = std::make_pair(o, t);
      } while (std::next_permutation(o.begin(), o.end()));
      return best;
    }
    // Greedy: the heaviest stage first, to the fastest device left that
    // holds it.
    std::vector<size_t> stages(P);
    for (size_t k = 0; k < P; ++k) stages[k] = k;
    std::stable_sort(stages.begin(), stages.end(), [&](size_t a, size_t b) {
      return search_.compute(cut[a], cut[a + 1], rc) > search_.compute(cut[b], cut[b + 1], rc);
    });
    std::vector<int> left = comp, order(P, -1);
    std::sort(left.begin(), left.end(), [&](int a, int b) {
      return has_tables_ ? class_vn_[static_cast<size_t>(a)] < class_vn_[static_cast<size_t>(b)]
                         : kinds_[static_cast<size_t>(a)].factor < kinds_[static_cast<size_t>(b)].factor;
    });
    double t = 0;
    for (size_t k : stages) {
      auto it = std::find_if(left.begin(), left.end(), [&](int cls) { return fits(k, cls); });
      if (it == left.end()) return std::nullopt;
      order[k] = *it;
      t = std::max(t, classSeconds(cut[k], cut[k + 1], rc, *it));
      left.erase(it);
    }
    return std::make_pair(order, t);
  }

  const Profile& p_;
  const PlanRequest& rq_;
  Search& search_;
  size_t L_;
  struct Kind {
    double factor;   // slowdown
    int64_t memory;  // cap (capOf())
    int table;       // cost table (rq.slot_costs), -1: the profile's
    bool operator==(const Kind& o) const { return factor == o.factor && memory == o.memory && table == o.table; }
  };
  std::vector<Kind> kinds_;       // class -> kind
  std::vector<int> class_;        // slot -> class
  std::vector<int64_t> caps_;     // class -> memory
  std::vector<double> class_vn_;  // class -> one VN through the whole model (its table, times its factor)
  int64_t whole_bytes_ = 0;
  int hosts_ = 1;  // host indices are below this
  double per_vn_ = 0, c_lb_ = 0, min_p2p_ = 0, f0_ = 1.0, host_lb_ = 0;
  bool has_tables_ = false;
  std::vector<double> fast_prefix_;  // with tables: per layer, the fastest class's lower bound, summed
  double fast_opt_ = 0;
  std::map<std::tuple<std::vector<int>, int, bool, int64_t>, std::optional<DevicePipeline>> pipes_;
  std::map<std::tuple<int, int, bool, int64_t>, std::vector<std::optional<StageCut>>> one_class_;
  std::vector<GroupCutCandidate> group_cands_;
};

// rq.slot_costs names tables that exist and cover the profile's layers.
void checkSlotCosts(const Profile& p, const PlanRequest& rq) {
  if (rq.slot_costs.empty()) return;
  if (rq.slot_costs.size() != rq.slot_slowdown.size())
    throw InputError("planning: " + std::to_string(rq.slot_costs.size()) + " device cost tables for " +
                     std::to_string(rq.slot_slowdown.size()) + " devices");
  for (int t : rq.slot_costs) {
    if (t < 0) continue;
    if (!rq.sim.device_costs || static_cast<size_t>(t) >= rq.sim.device_costs->size())
      throw InputError("planning: a device names cost table " + std::to_string(t) + " of " +
                       std::to_string(rq.sim.device_costs ? rq.sim.device_costs->size() : 0));
    const DeviceCosts& d = (*rq.sim.device_costs)[static_cast<size_t>(t)];
    if (d.layers.size() != p.layers.size())
      throw InputError(d.origin + ": has " + std::to_string(d.layers.size()) + " layers, the job's profile " +
                       std::to_string(p.layers.size()));
  }
}

bool samePlan(const PlanSpec& a, const PlanSpec& b) {
  return a.stages == b.stages && a.replicas == b.replicas && a.cuts == b.cuts && a.schedule == b.schedule &&
         a.recompute == b.recompute && a.vn_shares == b.vn_shares && a.workers == b.workers &&
         a.group_cuts == b.group_cuts;
}

// The simulator's view of a plan's hosts (resources file hosts).
SimOptions simOptionsFor(const PlanRequest& rq, const PlanSpec& plan, Search& search) {
  SimOptions so = rq.sim;
  so.schedules = &search.schedules_;
  if (!rq.slot_host.empty() && !plan.workers.empty())
    for (int s : plan.workers) so.rank_host.push_back(rq.slot_host[static_cast<size_t>(s)]);
  if (!rq.slot_costs.empty() && !plan.workers.empty())
    for (int s : plan.workers) so.rank_costs.push_back(rq.slot_costs[static_cast<size_t>(s)]);
  return so;
}

// Simulates `plan`; false when a rank's stage exceeds its device's memory.
bool simulateOnDevices(const Profile& p, const PlanRequest& rq, Search& search, const DeviceSearch& ds,
                       const PlanSpec& plan, PlanChoice& ch) {
  ch.sim = simulate(p, plan, simOptionsFor(rq, plan, search));
  for (size_t r = 0; r < plan.workers.size(); ++r) {
    const int64_t cap = ds.capOf(plan.workers[r]);
    if (cap > 0 && ch.sim.stages[r % static_cast<size_t>(plan.stages)].peak_bytes > cap) return false;
  }
  ch.plan = plan;
  return true;
}

std::vector<int> slotsBySpeed(const PlanRequest& rq, const DeviceSearch& ds) {
  std::vector<int> by_speed(rq.slot_slowdown.size());
  for (size_t s = 0; s < by_speed.size(); ++s) by_speed[s] = static_cast<int>(s);
  // Fastest first; among equals, the most memory first.
  // (With cost tables: by one VN through the whole model on each.)
  std::stable_sort(by_speed.begin(), by_speed.end(), [&](int a, int b) {
    const double fa = ds.hasTables() ? ds.slotSeconds(a) : rq.slot_slowdown[static_cast<size_t>(a)];
    const double fb = ds.hasTables() ? ds.slotSeconds(b) : rq.slot_slowdown[static_cast<size_t>(b)];
    if (fa != fb) return fa < fb;
    const int64_t ca = ds.capOf(a) > 0 ? ds.capOf(a) : INT64_MAX, cb = ds.capOf(b) > 0 ? ds.capOf(b) : INT64_MAX;
    return ca > cb;
  });
  return by_speed;
}

// PlanOutcome::group_cuts: the per-group candidates in the order of their
// bound, simulated while the bound could beat both the best plan (a shared
// cut) and the fastest per-group plan so far, at most
// kMaxGroupCutSimulations of them (a report, not a choice: planning time
// stays the shared search's): exact for "does a cut per group beat the
// best plan?" over the groupings searched when the cap is not reached. When none does,
// the chosen plan's groups with a cut each (else the candidate of the
// smallest bound): one simulation. Then the shared counterpart.
constexpr int64_t kMaxGroupCutSimulations = 16;
void compareGroupCuts(const Profile& p, const PlanRequest& rq, Search& search, DeviceSearch& ds, PlanOutcome& out) {
  auto& cands = ds.groupCutCandidates();
  if (cands.empty() || out.plans.empty()) return;
  std::stable_sort(cands.begin(), cands.end(), [](const auto& a, const auto& b) { return a.bound < b.bound; });
  GroupCutComparison cmp;
  cmp.candidates = static_cast<int64_t>(cands.size());
  const double best_shared = out.plans.front().sim.step_seconds;
  const DeviceSearch::GroupCutCandidate* pick = nullptr;
  auto sim = [&](const DeviceSearch::GroupCutCandidate& c) {
    if (!ds.ranksFit(c.per_group)) return false;
    ++cmp.simulated;
    const SimResult r = simulate(p, c.per_group, simOptionsFor(rq, c.per_group, search));
    if (pick && !(r.step_seconds < cmp.per_group.sim.step_seconds)) return false;
    cmp.per_group.plan = c.per_group;
    cmp.per_group.sim = r;
    pick = &c;
    return true;
  };
  for (const auto& c : cands) {
    if (c.bound >= std::min(best_shared, pick ? cmp.per_group.sim.step_seconds : 1e300) ||
        cmp.simulated >= kMaxGroupCutSimulations)
      break;
    sim(c);
  }
  cmp.beats_best = pick && cmp.per_group.sim.step_seconds < best_shared;
  if (!cmp.beats_best) {
    pick = nullptr;
    for (const auto& c : cands)
      if (samePlan(c.shared, out.plans.front().plan) && sim(c)) {
        cmp.of_chosen = true;
        break;
      }
    for (const auto& c : cands)
      if (!pick && sim(c)) break;
  }
  if (!pick) return;
  const PlanSpec* shared = &pick->shared;
  // The shared counterpart: among the planner's own results when there,
  // else simulated here.
  for (const PlanChoice& c : out.plans)
    if (samePlan(c.plan, *shared)) {
      cmp.shared = c;
      break;
    }
  if (!cmp.shared && !shared->vn_shares.empty()) {
    PlanChoice ch;
    ++cmp.simulated;
    if (simulateOnDevices(p, rq, search, ds, *shared, ch)) cmp.shared = ch;
  }
  out.group_cuts = std::move(cmp);
}

// Heterogeneous devices: see planner.h.
PlanOutcome planDevices(const Profile& p, const PlanRequest& rq, Search& search) {
  const auto t0 = std::chrono::steady_clock::now();
  const size_t L = p.layers.size();
  const int N = static_cast<int>(rq.slot_slowdown.size());
  const int64_t V = rq.virtual_nodes;
  DeviceSearch ds(p, rq, search);
  const std::vector<int> by_speed = slotsBySpeed(rq, ds);
  PlanOutcome out;
  const size_t K = static_cast<size_t>(std::max(1, rq.top_k));
  auto kth = [&] { return out.plans.size() >= K ? out.plans[K - 1].sim.step_seconds : 1e300; };
  // Simulates the plans whose bound could still make the top K
  // (`shape_bound`: their shape's, PlanChoice::bound_s).
  auto tryPlans = [&](std::vector<std::pair<double, PlanSpec>>& cands, double shape_bound) {
    std::stable_sort(cands.begin(), cands.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    out.candidates += static_cast<int64_t>(cands.size());
    for (auto& [bound, plan] : cands) {
      if (bound >= kth()) break;
      // A policy's plan may also be one of the planner's own groupings.
      if (std::any_of(out.plans.begin(), out.plans.end(), [&](const PlanChoice& c) { return samePlan(c.plan, plan); }))
        continue;
      PlanChoice ch;
      ++out.simulated;
      if (!simulateOnDevices(p, rq, search, ds, plan, ch)) continue;
      ch.bound_s = std::max(bound, shape_bound);
      auto pos = std::upper_bound(out.plans.begin(), out.plans.end(), ch, [](const PlanChoice& a, const PlanChoice& b) {
        return a.sim.step_seconds < b.sim.step_seconds;
      });
      out.plans.insert(pos, std::move(ch));
      if (out.plans.size() > K) out.plans.pop_back();
    }
    cands.clear();
  };
  std::vector<std::pair<double, PlanSpec>> cands;
  // The allocation policies, when the pool names hosts.
  if (!rq.slot_host.empty()) {
    for (const Grouping& g : allocationPolicies(ds.pool()))
      if (g.why_not.empty()) ds.plans(g, 1, cands);
    tryPlans(cands, 0.0);
  }
  // The planner's own groupings: D groups of P on the fastest devices,
  // using whole classes (the fastest class, the two fastest, ..., all:
  // within a class devices are alike), D = devices / P; data parallelism
  // on any number of the fastest. Shapes are taken in the order of a
  // lower bound no plan of that shape can beat, stopping once it cannot
  // beat the K-th best simulated plan: the larger of all their compute
  // spread perfectly over their speeds (V x the whole model's fastest
  // compute per VN / sum(1 / slowdown)), the most loaded group's VNs
  // (at least V / D) times the best P-stage cut on the fastest device, and
  // one VN's path through P stages (pathLowerBound()). With device types
  // of their own per-layer costs, "the fastest" is each layer on the
  // class fastest at it (DeviceSearch::fastLowerBound()), and the spread is
  // that over D * P devices.
  std::vector<double> speed_sum(static_cast<size_t>(N) + 1, 0.0);
  for (int i = 0; i < N; ++i)
    speed_sum[static_cast<size_t>(i) + 1] = speed_sum[static_cast<size_t>(i)] + 1.0 / rq.slot_slowdown[static_cast<size_t>(by_speed[static_cast<size_t>(i)])];
  // hosts_used[i]: the hosts of the i fastest devices (the groupings below
  // take the D * P fastest).
  std::vector<int> hosts_used(static_cast<size_t>(N) + 1, 0);
  {
    std::vector<int> seen_host;
    for (int i = 0; i < N; ++i) {
      const int h = rq.slot_host.empty() ? 0 : rq.slot_host[static_cast<size_t>(by_speed[static_cast<size_t>(i)])];
      if (std::find(seen_host.begin(), seen_host.end(), h) == seen_host.end()) seen_host.push_back(h);
      hosts_used[static_cast<size_t>(i) + 1] = static_cast<int>(seen_host.size());
    }
  }
  const int max_p = static_cast<int>(std::min<size_t>(L, static_cast<size_t>(N)));
  const double c_fast = ds.fastWhole();  // one VN through the whole model, at least
  const double c_lb = ds.computeLowerBound(), f0 = ds.minFactor();  // without tables: c_fast = c_lb * f0
  const auto fastest_cuts =
      minMaxCuts(L, max_p,
                 {[&](size_t i, size_t j) { return std::max(ds.fastLowerBound(i, j), search.linkSeconds(i, j)); },
                  [](size_t, size_t, int) { return int64_t{0}; },
                  [&](size_t i, size_t j) { return ds.fastLowerBound(i, j); }},
                 0);
  std::vector<int> counts;  // whole classes
  for (int i = 1; i <= N; ++i)
    if (i == N || ds.classOf(by_speed[static_cast<size_t>(i)]) != ds.classOf(by_speed[static_cast<size_t>(i) - 1]))
      counts.push_back(i);
  std::vector<std::tuple<double, int, int>> shapes;  // (bound, P, D)
  double params = 0, values = 0;
  for (const LayerCost& c : p.layers) {
    params += static_cast<double>(c.params);
    values += static_cast<double>(c.params + c.bn_values) - static_cast<double>(c.tied_params);
  }
  values = std::max(values, 0.0);
  auto addShape = [&](int P, int D) {
    if (D < 1 || D > V) return;
    const double spread = ds.hasTables() ? static_cast<double>(V) * c_fast / static_cast<double>(D * P)
                                         : static_cast<double>(V) * c_lb / speed_sum[static_cast<size_t>(D * P)];
    const double loaded = static_cast<double>((V + D - 1) / D) * fastest_cuts[static_cast<size_t>(P) - 1]->bottleneck_s;
    const double path = std::max(c_fast + 2.0 * (P - 1) * ds.minTransfer(),
                                 fillBound(c_fast, (V + D - 1) / D, P));
    // Some stage holds at least 1/P of the values; they are summed among
    // the D groups after its compute (data parallelism: every bucket, one
    // after another) and then stepped by the optimiser.
    const double share = (P == 1 ? params : values) / P;
    double reduce = p.reduceSeconds(share, D);
    if (P > 1) {
      // Pipelines reduce after the compute: stage k is done no sooner than
      // its M VNs' compute plus its reduction and step. Averaged over the P
      // stages (all reductions are affine in bytes): M c / P + the
      // reduction and step of 1/P of the values.
      const double m = static_cast<double>((V + D - 1) / D);
      reduce += ds.hasTables() ? ds.fastOptimizerPerParam() * share + m * c_fast / static_cast<double>(P)
                               : p.optimizer_s_per_param * share * f0 + m * c_lb * f0 / static_cast<double>(P);
    }
    shapes.emplace_back(std::max({spread, loaded, path, reduce,
                                  ds.shapeHostBound(P, D, hosts_used[static_cast<size_t>(D * P)])}),
                        P, D);
  };
  for (int D = 1; D <= N; ++D) addShape(1, D);
  for (int P = 2; P <= max_p; ++P) {
    int last = 0;
    for (int n : counts)
      if (n / P != last) addShape(P, last = n / P);
  }
  std::stable_sort(shapes.begin(), shapes.end());
  for (const auto& [bound, P, D] : shapes) {
    if (bound >= kth()) break;
    const double stage_lb = fastest_cuts[static_cast<size_t>(P) - 1]->bottleneck_s;
    const Grouping sorted = groupBySpeed(by_speed, P, D, false);
    ds.plans(sorted, 0, cands, stage_lb, kth());
    if (P > 1 && D > 1) {
      const Grouping balanced = groupBySpeed(by_speed, P, D, true);
      if (balanced.groups != sorted.groups) ds.plans(balanced, 0, cands, stage_lb, kth());
    }
    tryPlans(cands, bound);
  }
  if (out.plans.empty()) {
    // Name the tightest device and what the model needs at best on all N.
    int tight = 0;
    for (int s = 1; s < N; ++s)
      if (ds.capOf(s) > 0 && (ds.capOf(tight) <= 0 || ds.capOf(s) < ds.capOf(tight))) tight = s;
    int64_t need = ds.wholeBytes();
    for (int P = 2; P <= max_p; ++P)
      if (auto c = minPeakBytesCut(L, P, search.fns(ScheduleKind::k1F1B, true, V, P)))
        need = std::min(need, *std::max_element(c->bytes.begin(), c->bytes.end()));
    int64_t largest = 0;
    for (int s = 0; s < N; ++s) largest = std::max(largest, ds.capOf(s));
    throw InputError("the devices cannot hold the model: its smallest pipeline stage over " + std::to_string(max_p) +
                     " devices needs " + fmtMib(need) + " MiB, the largest device has " + fmtMib(largest) +
                     " MiB (" + fmtMib(need - largest) + " MiB short); the tightest is worker slot " +
                     std::to_string(tight) + " with " + fmtMib(ds.capOf(tight)) + " MiB");
  }
  if (rq.compare_group_cuts) compareGroupCuts(p, rq, search, ds, out);
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
  checkSlotCosts(p, rq);
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
          cands.push_back({P, D, kind, rc, *cut,
                           std::max(search.lowerBound(cut->cuts, M, D, kind, rc), search.oneHostBound(cut->cuts, D, rc))});
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
    ch.bound_s = c.lower_bound;
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

std::vector<AllocationRow> compareAllocations(const Profile& p, const PlanRequest& rq, const PlanOutcome& mine) {
  if (rq.slot_slowdown.empty()) throw InputError("comparing allocations needs a resources file");
  checkSlotCosts(p, rq);
  Search search(p, rq);
  DeviceSearch ds(p, rq, search);
  std::vector<AllocationRow> rows;
  for (const Grouping& g : allocationPolicies(ds.pool())) {
    AllocationRow row{g.policy, g.groups, std::nullopt, g.why_not};
    if (row.why_not.empty() && g.groups.front().size() > p.layers.size())
      row.why_not = std::to_string(g.groups.front().size()) + " devices per group, the model has " +
                    std::to_string(p.layers.size()) + " layers";
    if (row.why_not.empty() && static_cast<int64_t>(g.groups.size()) > rq.virtual_nodes)
      row.why_not = std::to_string(g.groups.size()) + " groups, " + std::to_string(rq.virtual_nodes) + " VNs";
    if (row.why_not.empty()) {
      std::vector<std::pair<double, PlanSpec>> cands;
      ds.plans(g, 1, cands);
      for (auto& [bound, plan] : cands) {
        PlanChoice ch;
        if (!simulateOnDevices(p, rq, search, ds, plan, ch)) continue;
        if (!row.best || ch.sim.step_seconds < row.best->sim.step_seconds) row.best = std::move(ch);
      }
      if (!row.best) row.why_not = "no cut fits every group's devices";
    }
    rows.push_back(std::move(row));
  }
  AllocationRow row{"planner", {}, mine.plans.front(), ""};
  const PlanSpec& plan = row.best->plan;
  for (int d = 0; d < plan.replicas; ++d)
    row.groups.emplace_back(plan.workers.begin() + d * plan.stages, plan.workers.begin() + (d + 1) * plan.stages);
  rows.push_back(std::move(row));
  return rows;
}

std::string allocationTable(const std::vector<AllocationRow>& rows, const std::function<std::string(int)>& device) {
  auto line = [](const char* fmt, auto... args) {
    char buf[512];
    std::snprintf(buf, sizeof buf, fmt, args...);
    return std::string(buf);
  };
  std::string out = line("%-8s %3s %3s %-8s %12s %11s  %-14s %s\n", "policy", "P", "D", "schedule", "step ms",
                         "vs planner", "VN shares", "groups (stage order)");
  const double mine = rows.back().best->sim.step_seconds;
  for (const AllocationRow& r : rows) {
    if (!r.best) {
      out += line("%-8s  not applicable: %s\n", r.policy.c_str(), r.why_not.c_str());
      continue;
    }
    const PlanSpec& plan = r.best->plan;
    std::string shares, groups;
    for (int64_t v : plan.vn_shares) shares += (shares.empty() ? "" : "+") + std::to_string(v);
    for (int d = 0; d < plan.replicas; ++d) {
      groups += d ? " [" : "[";
      for (int k = 0; k < plan.stages; ++k)
        groups += (k ? " " : "") + device(plan.workers[static_cast<size_t>(d * plan.stages + k)]);
      groups += "]";
    }
    out += line("%-8s %3d %3d %-8s %12.2f %11.3f  %-14s %s\n", r.policy.c_str(), plan.stages, plan.replicas,
                scheduleLabel(plan).c_str(), r.best->sim.step_seconds * 1e3, r.best->sim.step_seconds / mine,
                shares.c_str(), groups.c_str());
  }
  return out;
}

WspPrediction predictWsp(const Profile& p, const PlanRequest& rq, const WspOptions& wsp, int64_t clocks,
                         const std::string& job_file, const std::vector<double>& slot_vn_seconds) {
  const int W = rq.workers;
  if (W < 2)
    throw InputError(job_file + ": key 'sync.mode': \"wsp\" needs at least two virtual workers (--workers N, N >= 2 "
                     "or a resources file of two devices), got " + std::to_string(W));
  if (rq.virtual_nodes < W)
    throw InputError(job_file + ": batch.virtual_nodes = " + std::to_string(rq.virtual_nodes) + " cannot feed " +
                     std::to_string(W) + " virtual workers (each needs at least one VN)");
  const size_t L = p.layers.size();
  WspPrediction out;
  PlanSpec& plan = out.plan;
  plan.stages = 1;
  plan.replicas = W;
  plan.cuts = {0, L};
  std::vector<int64_t> slots;
  for (int v = 0; v < W; ++v) slots.push_back(v);
  plan.vn_shares = wspShares(rq.virtual_nodes, slot_vn_seconds, slots);  // as the runtime's generations
  plan.slowdown = rq.slot_slowdown;  // slot order = VW order
  SimOptions so = rq.sim;
  so.rank_host = rq.slot_host;
  so.rank_costs = rq.slot_costs;
  out.sync = simulate(p, plan, so);
  out.wsp = simulateWsp(p, plan, wsp, so);

  // Memory: the data-parallel worker's, plus what src/wsp adds.
  out.worker_bytes = stageBytes(p, 0, L, 1, false, so);
  double values = 2, largest = 0, params = static_cast<double>(p.totalParams()), param_bytes = 0, optim_bytes = 0;
  for (const LayerCost& c : p.layers) {
    values += static_cast<double>(c.params + c.bn_values);
    largest = std::max(largest, static_cast<double>(c.params + c.bn_values));
    param_bytes += static_cast<double>(c.param_bytes);
    optim_bytes += static_cast<double>(c.optimizer_bytes);
  }
  WspMemoryInput in;
  in.values = values;
  // Shards are contiguous whole tensors balanced by values: none holds more
  // than values / W plus one tensor (here: one layer, an upper bound).
  in.shard_values = std::min(values, values / W + largest);
  in.shard_params = values > 0 ? in.shard_values * params / values : 0;
  in.optim_copies = param_bytes > 0 ? static_cast<int>(std::lround(optim_bytes / param_bytes)) : 0;
  in.vws = W;
  in.checkpoints = so.checkpoints;
  in.pending_clocks = wspPendingClocks(wsp.staleness, clocks);
  out.memory = wspWorkerMemory(in);
  for (int v = 0; v < W; ++v) {
    const int64_t cap = !rq.slot_memory.empty() && rq.slot_memory[static_cast<size_t>(v)] > 0
                            ? rq.slot_memory[static_cast<size_t>(v)]
                            : rq.memory_cap_bytes;
    out.limit_bytes.push_back(cap);
    checkWspMemory(job_file, "worker slot " + std::to_string(v), out.worker_bytes, in, wsp.staleness, clocks, cap);
  }
  return out;
}

}  // namespace morph
