#include "plan/simulator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <queue>

#include "core/error.h"
#include "plan/group_cut.h"

namespace morph {

namespace {

constexpr double kUnknown = -1.0;

// One message of a channel, in channel order. Times in seconds from the
// start of the step; kUnknown until the event has been simulated.
struct Msg {
  double posted = kUnknown;   // handed to the sender thread
  double arrival = kUnknown;  // received (the receiver may take it)
  double taken = kUnknown;    // consumed by the receiving rank's action list
};

struct Channel {
  double bytes = 0;
  double extra_s = 0;  // between hosts: the slower link's added time per message
  std::vector<Msg> msgs;
};

struct StageCosts {
  double fwd = 0, bwd = 0, rec = 0;
};

// The per-layer times of one rank's device: its type's own table
// (SimOptions::device_costs), or the profile's.
class LayerView {
 public:
  LayerView(const Profile& p, const DeviceCosts* d) : p_(p), d_(d) {}
  double forward(size_t l) const { return d_ ? d_->layers[l].forward_s : p_.layers[l].forward_s; }
  double forwardNograd(size_t l) const { return d_ ? d_->layers[l].forward_nograd_s : p_.layers[l].forward_nograd_s; }
  double backward(size_t l) const { return d_ ? d_->layers[l].backward_s : p_.layers[l].backward_s; }
  double recompute(size_t l) const { return d_ ? d_->layers[l].recompute_s : p_.layers[l].recompute_s; }
  double optimizerPerParam() const { return d_ ? d_->optimizer_s_per_param : p_.optimizer_s_per_param; }
  const DeviceCosts* costs() const { return d_; }

 private:
  const Profile& p_;
  const DeviceCosts* d_;
};

// The table of world rank `rank` (null: the profile's); checkCosts() has
// checked the indices.
const DeviceCosts* costsOfRank(const SimOptions& o, int rank) {
  if (o.rank_costs.empty()) return nullptr;
  const int t = o.rank_costs[static_cast<size_t>(rank)];
  return t < 0 ? nullptr : &(*o.device_costs)[static_cast<size_t>(t)];
}

void checkCosts(const Profile& prof, const SimOptions& o, int ranks) {
  if (o.rank_costs.empty()) return;
  if (o.rank_costs.size() != static_cast<size_t>(ranks))
    throw InputError("simulate: " + std::to_string(o.rank_costs.size()) + " rank cost tables for " +
                     std::to_string(ranks) + " ranks");
  for (int t : o.rank_costs) {
    if (t < 0) continue;
    if (!o.device_costs || static_cast<size_t>(t) >= o.device_costs->size())
      throw InputError("simulate: a rank names device cost table " + std::to_string(t) + ", there are " +
                       std::to_string(o.device_costs ? o.device_costs->size() : 0));
    const DeviceCosts& d = (*o.device_costs)[static_cast<size_t>(t)];
    if (d.layers.size() != prof.layers.size())
      throw InputError(d.origin + ": has " + std::to_string(d.layers.size()) + " layers, the job's profile " +
                       std::to_string(prof.layers.size()));
  }
}

// The arrival time of message n, once everything it depends on is known:
// its hand-over (plus the emulated delay), the sender's previous transfer,
// and its receive, which the receiver posts after message n-1 arrived and
// once fewer than kRecvWindow received messages wait unused.
double arrivalOf(Channel& c, size_t n, const Profile& prof, double delay) {
  if (n >= c.msgs.size()) return kUnknown;
  Msg& m = c.msgs[n];
  if (m.arrival != kUnknown) return m.arrival;
  if (m.posted == kUnknown) return kUnknown;
  double prev = 0;
  if (n > 0) {
    prev = arrivalOf(c, n - 1, prof, delay);
    if (prev == kUnknown) return kUnknown;
  }
  double recv_posted = prev;
  if (n >= kRecvWindow) {
    const double t = c.msgs[n - kRecvWindow].taken;
    if (t == kUnknown) return kUnknown;
    recv_posted = std::max(recv_posted, t);
  }
  const double start = std::max({m.posted + delay, prev, recv_posted});
  m.arrival = start + prof.p2p.at(c.bytes) + c.extra_s;
  return m.arrival;
}

struct ReplicaRun {
  std::vector<double> end;    // per stage: schedule done and sends delivered
  std::vector<double> last;   // per stage: last action done (the executor's timing.end)
  std::vector<double> busy;   // per stage: compute seconds
};

// Runs one replica's P action lists over M VNs as discrete events. Under
// Varuna the rank whose next action can happen earliest goes first, so its
// decision "has this gradient arrived?" is taken at the right simulated
// time; the other schedules need no global order.
ReplicaRun runReplica(const Profile& prof, const PlanSpec& plan, const std::vector<StageCosts>& cost,
                      int64_t M, const std::vector<int>& hosts, const SimOptions& opts) {
  const int P = plan.stages;
  const ScheduleOptions so{plan.schedule, P, M, plan.recompute};
  Schedule acts = opts.schedules ? opts.schedules->get(so) : makeSchedule(so);
  std::vector<Channel> act(static_cast<size_t>(P)), grad(static_cast<size_t>(P));
  for (int k = 0; k + 1 < P; ++k) {
    const double b = static_cast<double>(prof.layers[plan.cuts[static_cast<size_t>(k) + 1] - 1].output_bytes);
    act[static_cast<size_t>(k)].bytes = b;       // k -> k+1
    grad[static_cast<size_t>(k) + 1].bytes = b;  // k+1 -> k
    if (!hosts.empty() && hosts[static_cast<size_t>(k)] != hosts[static_cast<size_t>(k) + 1]) {
      const double x = opts.cross_host_latency_s + (opts.cross_host_bytes_per_s > 0 ? b / opts.cross_host_bytes_per_s : 0.0);
      act[static_cast<size_t>(k)].extra_s = grad[static_cast<size_t>(k) + 1].extra_s = x;
    }
  }
  std::vector<size_t> pc(static_cast<size_t>(P), 0), act_in(static_cast<size_t>(P), 0),
      grad_in(static_cast<size_t>(P), 0);
  std::vector<long> decided(static_cast<size_t>(P), -1);  // Varuna: index already decided at
  ReplicaRun run;
  run.end.assign(static_cast<size_t>(P), 0.0);
  run.busy.assign(static_cast<size_t>(P), 0.0);
  std::vector<double>& t = run.end;
  const bool varuna = plan.schedule == ScheduleKind::kVaruna;
  const double delay = opts.link_delay_s;
  // The incoming message an action waits for, or null.
  auto incoming = [&](size_t k, const Action& a, size_t* n) -> Channel* {
    if (a.kind == ActionKind::kRecvAct) {
      *n = act_in[k];
      return &act[k - 1];
    }
    if (a.kind == ActionKind::kRecvGrad) {
      *n = grad_in[k];
      return &grad[k + 1];
    }
    return nullptr;
  };
  // Position of each receive's message in its channel: a rank receives in
  // channel order (canSwap() never reorders a channel), so it is the
  // receive's rank among the rank's receives of that kind in the list.
  std::vector<std::vector<size_t>> act_pos(static_cast<size_t>(P), std::vector<size_t>(static_cast<size_t>(M))),
      grad_pos = act_pos;
  for (size_t k = 0; k < static_cast<size_t>(P); ++k) {
    size_t na = 0, ng = 0;
    for (const Action& a : acts[k]) {
      if (a.kind == ActionKind::kRecvAct) act_pos[k][static_cast<size_t>(a.vn)] = na++;
      if (a.kind == ActionKind::kRecvGrad) grad_pos[k][static_cast<size_t>(a.vn)] = ng++;
    }
  }
  auto arrivedBy = [&](size_t k, const Action& a, double now) {
    const bool is_act = a.kind == ActionKind::kRecvAct;
    const size_t n = (is_act ? act_pos : grad_pos)[k][static_cast<size_t>(a.vn)];
    Channel& c = is_act ? act[k - 1] : grad[k + 1];
    const double arr = arrivalOf(c, n, prof, delay);
    return arr != kUnknown && arr <= now;
  };
  auto execute = [&](size_t k, const Action& a, double now) {
    const StageCosts& sc = cost[k];
    switch (a.kind) {
      case ActionKind::kForward: t[k] = now + sc.fwd, run.busy[k] += sc.fwd; break;
      case ActionKind::kBackward: t[k] = now + sc.bwd, run.busy[k] += sc.bwd; break;
      case ActionKind::kRecompute: t[k] = now + sc.rec, run.busy[k] += sc.rec; break;
      case ActionKind::kSendAct: act[k].msgs.push_back({now, kUnknown, kUnknown}), t[k] = now; break;
      case ActionKind::kSendGrad: grad[k].msgs.push_back({now, kUnknown, kUnknown}), t[k] = now; break;
      case ActionKind::kRecvAct: act[k - 1].msgs[act_in[k]++].taken = now, t[k] = now; break;
      case ActionKind::kRecvGrad: grad[k + 1].msgs[grad_in[k]++].taken = now, t[k] = now; break;
    }
    ++pc[k];
  };
  // GPipe and 1F1B never reorder: every action's time follows from its
  // rank's previous action and its message alone, whatever order the ranks
  // are stepped in, so each rank runs as far as it can, in turns.
  for (bool progress = !varuna; progress;) {
    progress = false;
    for (size_t k = 0; k < static_cast<size_t>(P); ++k)
      while (pc[k] < acts[k].size()) {
        const Action& a = acts[k][pc[k]];
        double now = t[k];
        size_t n = 0;
        if (Channel* c = incoming(k, a, &n)) {
          const double arr = arrivalOf(*c, n, prof, delay);
          if (arr == kUnknown) break;
          now = std::max(now, arr);
        }
        execute(k, a, now);
        progress = true;
      }
  }
  // Varuna decides by what has arrived when a rank reaches a receive: the
  // rank whose next action can happen earliest goes first.
  while (varuna) {
    int best = -1;
    double best_t = std::numeric_limits<double>::infinity();
    bool all_done = true;
    for (int k = 0; k < P; ++k) {
      const size_t ku = static_cast<size_t>(k);
      if (pc[ku] >= acts[ku].size()) continue;
      all_done = false;
      const Action& a = acts[ku][pc[ku]];
      double when = t[ku];
      const bool undecided = varuna && a.kind == ActionKind::kRecvGrad && decided[ku] != static_cast<long>(pc[ku]);
      size_t n = 0;
      if (Channel* c = incoming(ku, a, &n); c && !undecided) {
        const double arr = arrivalOf(*c, n, prof, delay);
        if (arr == kUnknown) continue;
        when = std::max(when, arr);
      }
      if (when < best_t) best_t = when, best = k;
    }
    if (all_done) break;
    MORPH_CHECK(best >= 0, "simulated schedule deadlocked (the validator should have refused it)");
    const size_t k = static_cast<size_t>(best);
    std::vector<Action>& list = acts[k];
    const size_t i = pc[k];
    if (varuna && list[i].kind == ActionKind::kRecvGrad && decided[k] != static_cast<long>(i)) {
      // The executor's check, at the moment the rank reaches the receive.
      decided[k] = static_cast<long>(i);
      if (!arrivedBy(k, list[i], t[k])) {
        const size_t j = opportunisticMove(list, i, [&](const Action& c) { return arrivedBy(k, c, t[k]); },
                                           runStashBound(so, static_cast<int>(k)));
        std::rotate(list.begin() + static_cast<std::ptrdiff_t>(i), list.begin() + static_cast<std::ptrdiff_t>(j),
                    list.begin() + static_cast<std::ptrdiff_t>(j) + 1);
      }
      continue;
    }
    execute(k, list[i], best_t);
  }
  for (size_t k = 0; k < static_cast<size_t>(P); ++k)
    MORPH_CHECK(pc[k] == acts[k].size(), "simulated schedule deadlocked (the validator should have refused it)");
  run.last = t;
  // The executor waits for its sends to be delivered before reducing.
  for (int k = 0; k < P; ++k) {
    const size_t ku = static_cast<size_t>(k);
    for (Channel* c : {&act[ku], &grad[ku]})
      if (!c->msgs.empty()) t[ku] = std::max(t[ku], arrivalOf(*c, c->msgs.size() - 1, prof, delay));
  }
  return run;
}

// What the between-hosts link adds to a ring collective whose ranks are on
// `hosts` (in ring order) and of which each rank sends `bytes`: 0 when they
// are all on one host; else every ring step pays the link's latency (2 (g -
// 1) steps: a reduce-scatter and an all-gather) and each host's link
// carries `bytes` once per ring hop that leaves it (one when the host's
// ranks are neighbours in the ring).
double ringLinkSeconds(const SimOptions& o, const std::vector<int>& hosts, double bytes) {
  const size_t g = hosts.size();
  std::map<int, int> leaving;
  int most = 0;
  for (size_t i = 0; i < g; ++i)
    if (hosts[i] != hosts[(i + 1) % g]) most = std::max(most, ++leaving[hosts[i]]);
  if (most == 0) return 0.0;
  return most * (o.cross_host_bytes_per_s > 0 ? bytes / o.cross_host_bytes_per_s : 0.0) +
         2.0 * static_cast<double>(g - 1) * o.cross_host_latency_s;
}

void checkPlan(const Profile& prof, const PlanSpec& plan) {
  const size_t L = prof.layers.size();
  if (L == 0) throw InputError("the profile has no layers");
  if (plan.stages < 1 || plan.replicas < 1) throw InputError("a plan needs at least one stage and one replica");
  if (plan.cuts.size() != static_cast<size_t>(plan.stages) + 1 || plan.cuts.front() != 0 || plan.cuts.back() != L)
    throw InputError("the plan's cuts do not cover the profile's " + std::to_string(L) + " layers in " +
                     std::to_string(plan.stages) + " stages");
  for (int k = 0; k < plan.stages; ++k)
    if (plan.cuts[static_cast<size_t>(k)] >= plan.cuts[static_cast<size_t>(k) + 1])
      throw InputError("stage " + std::to_string(k) + " of the plan has no layer");
  if (plan.vn_shares.size() != static_cast<size_t>(plan.replicas))
    throw InputError("the plan has " + std::to_string(plan.vn_shares.size()) + " VN shares for " +
                     std::to_string(plan.replicas) + " replicas");
  for (int64_t s : plan.vn_shares)
    if (s < 1) throw InputError("every replica needs at least one VN");
  if (!plan.slowdown.empty() && plan.slowdown.size() != static_cast<size_t>(plan.stages * plan.replicas))
    throw InputError("the plan's slowdown list does not have one factor per worker");
  if (!plan.group_cuts.empty()) checkGroupCuts(L, plan.stages, static_cast<size_t>(plan.replicas), plan.group_cuts);
}

}  // namespace

double sumWireBytes(const Profile& p, double values, int group) {
  if (group <= 1) return 0.0;
  const double g = group, sent = (g - 1.0) / g * values;
  if (p.fingerprint.reduce_mode != "exact") return 8.0 * sent;
  return (values >= static_cast<double>(kPlanShardedMinValues) && values >= g ? 12.0 : 16.0) * sent;
}

const Schedule& ScheduleCache::get(const ScheduleOptions& so) {
  auto key = std::make_tuple(static_cast<int>(so.kind), so.stages, so.micro_batches, so.recompute);
  auto it = lists_.find(key);
  if (it != lists_.end()) return it->second;
  return lists_[key] = makeSchedule(so);
}

double stageComputeSeconds(const Profile& p, size_t first, size_t end, bool recompute, const DeviceCosts* costs) {
  const bool rc = recompute && end < p.layers.size();
  const LayerView v(p, costs);
  double s = 0;
  for (size_t l = first; l < end; ++l)
    s += (rc ? v.forwardNograd(l) + v.recompute(l) : v.forward(l)) + v.backward(l);
  return s;
}

StageFootprint stageFootprint(const Profile& p, size_t first, size_t end, bool recompute, const SimOptions& opts) {
  const size_t L = p.layers.size();
  // While building, a worker holds one other stage's layer at a time.
  int64_t init = 0;
  for (size_t l = 0; l < L; ++l)
    if (l < first || l >= end) init = std::max(init, p.layers[l].param_bytes + p.layers[l].buffer_bytes);
  int64_t own = 0, own_buffers = 0, own_optim = 0, own_values = 2, act = 0;
  for (size_t l = first; l < end; ++l) {
    const LayerCost& c = p.layers[l];
    own += c.param_bytes, own_buffers += c.buffer_bytes, own_optim += c.optimizer_bytes;
    own_values += c.params + c.bn_values;
    act += c.activation_bytes;
    // The copy of a weight owned by a layer of another stage.
    if (c.tied_params > 0 && (c.tied_owner < static_cast<int>(first) || c.tied_owner >= static_cast<int>(end))) {
      const LayerCost& o = p.layers[static_cast<size_t>(c.tied_owner)];
      own += c.tied_params * 4, own_values += c.tied_params;
      if (o.param_bytes > 0) own_optim += o.optimizer_bytes * c.tied_params * 4 / o.param_bytes;
    }
  }
  const int64_t model = own + own_buffers;
  const int64_t optim = own_optim;
  // Exact mode: the int64 buffer, and the sharded sum's scratch among
  // replicas (at most 6 bytes per value; counted always, as
  // estimateStageMemory does); the 32-bit format's buffer is int32 (4),
  // and it needs half the scratch (3).
  const int64_t accumulator = own_values * (!p.exact() ? 4 : p.valueBytes() == 8.0 ? 8 + 6 : 4 + 3);
  const int64_t input = first == 0 ? p.input_bytes : p.layers[first - 1].output_bytes;
  StageFootprint m;
  m.fixed_bytes = p.runtime_bytes + init + model + optim + accumulator + own;
  // A checkpoint step's snapshot: a copy of the stage's state for its writer.
  if (opts.checkpoints) m.fixed_bytes += model + optim;
  if (first > 0) m.fixed_bytes += static_cast<int64_t>(kRecvWindow) * input;
  if (recompute && end < L) {  // stashes its input per VN, one VN's activations at a time
    m.per_vn_bytes = input;
    m.fixed_bytes += act;
  } else {
    m.per_vn_bytes = act;
  }
  return m;
}

int64_t stageBytes(const Profile& p, size_t first, size_t end, int64_t live_vns, bool recompute,
                   const SimOptions& opts) {
  return stageFootprint(p, first, end, recompute, opts).bytes(live_vns);
}

SimResult simulate(const Profile& prof, const PlanSpec& plan_in, const SimOptions& opts) {
  PlanSpec plan = plan_in;
  if (plan.cuts.empty() && plan.stages == 1) plan.cuts = {0, prof.layers.size()};
  checkPlan(prof, plan);
  const int P = plan.stages, D = plan.replicas;
  const size_t L = prof.layers.size();
  const double elem = prof.valueBytes();
  auto hostOf = [&](int rank) { return opts.rank_host.empty() ? 0 : opts.rank_host.at(static_cast<size_t>(rank)); };
  // Whose cores a rank computes on (SimOptions::hosts_share_cores).
  auto coresOf = [&](int rank) { return opts.hosts_share_cores ? 0 : hostOf(rank); };
  if (!opts.rank_host.empty() && opts.rank_host.size() != static_cast<size_t>(P * D))
    throw InputError("simulate: " + std::to_string(opts.rank_host.size()) + " rank hosts for " +
                     std::to_string(P * D) + " ranks");
  // Worker processes of one host slow each other down when they compute at
  // the same time (all of a `morph run`'s workers are on one host): each
  // rank's compute takes the factor of its host's process count
  // (Profile::computeFactor); data-parallel workers all compute at once,
  // so theirs is the factor of that many busy processes
  // (Profile::dataParallelFactor), on top of sharing the cores (below).
  std::map<int, int> on_host;
  for (int r = 0; r < P * D; ++r) ++on_host[coresOf(r)];
  auto contentionOf = [&](int rank) {
    if (opts.in_process) return 1.0;
    const int n = on_host[coresOf(rank)];
    return P == 1 ? prof.dataParallelFactor(n, P * D) : prof.computeFactor(n, P * D);
  };
  auto slow = [&](int d, int k) {
    return (plan.slowdown.empty() ? 1.0 : plan.slowdown[static_cast<size_t>(d * P + k)]) * contentionOf(d * P + k);
  };
  checkCosts(prof, opts, P * D);
  auto view = [&](int d, int k) { return LayerView(prof, costsOfRank(opts, d * P + k)); };
  auto group = [&](int n, double values) { return opts.in_process ? 0.0 : prof.reduceSeconds(values, n); };
  const bool exact = prof.exact();
  const double overhead = opts.in_process ? 0.0 : prof.step_overhead_s;
  const double max_bytes = 8.0 * (4.0 * static_cast<double>(L) + 4.0);  // flags and maxima of every segment
  auto maxReduce = [&](int n) { return opts.in_process ? 0.0 : prof.allreduceSeconds(prof.allreduce_max, max_bytes, n); };
  // Collectives whose ranks span hosts (SimOptions::rank_host, with a
  // link): the one-host fit plus what the link adds (ringLinkSeconds()),
  // for the bytes each rank sends. `ranks`: world ranks, ascending (the
  // ring's order). Without a link or on one host exactly group() and
  // maxReduce().
  const bool links = !opts.in_process && !opts.rank_host.empty() &&
                     (opts.cross_host_bytes_per_s > 0 || opts.cross_host_latency_s > 0);
  auto hostsOf = [&](const std::vector<int>& ranks) {
    std::vector<int> h;
    h.reserve(ranks.size());
    for (int r : ranks) h.push_back(hostOf(r));
    return h;
  };
  auto sumAmong = [&](const std::vector<int>& ranks, double values) {
    const int n = static_cast<int>(ranks.size());
    const double t = group(n, values);
    return links ? t + ringLinkSeconds(opts, hostsOf(ranks), sumWireBytes(prof, values, n)) : t;
  };
  auto maxAmong = [&](const std::vector<int>& ranks) {  // Gloo's ring all-reduce of the doubles
    const int n = static_cast<int>(ranks.size());
    const double t = maxReduce(n);
    return links ? t + ringLinkSeconds(opts, hostsOf(ranks), 2.0 * (n - 1.0) / n * max_bytes) : t;
  };
  auto rangeOf = [](int first, int count, int stride) {
    std::vector<int> r;
    for (int i = 0; i < count; ++i) r.push_back(first + i * stride);
    return r;
  };
  SimResult out;
  out.stages.assign(static_cast<size_t>(P), StageSim{});

  if (P == 1) {
    // Data parallelism: each worker runs its VNs one after another; during
    // the last VN's backward, a bucket of the gradient buffer is reduced as
    // soon as the layers it holds are done (back to front), in order.
    std::vector<std::pair<size_t, double>> buckets;  // (lowest layer in it, bytes)
    double bytes = 0;
    size_t low = L;
    for (size_t l = L; l-- > 0;) {
      const double b = static_cast<double>(prof.layers[l].params) * elem;
      if (bytes > 0 && bytes + b > static_cast<double>(opts.bucket_bytes)) {
        buckets.push_back({low, bytes});
        bytes = 0;
      }
      bytes += b, low = l;
    }
    if (bytes > 0) buckets.push_back({low, bytes});
    // The statistics and each worker's slots of flags, maxima and control
    // values (VnExecutor::writeSlots: no MAX all-reduce) ride in the last
    // gradient bucket, after the last VN (the 32-bit format sends each of
    // these integers as 4 int32 lanes).
    const double lanes = prof.fingerprint.reduce_mode == "exact32" ? 4.0 : 1.0;
    double bn = lanes * (2 + static_cast<double>(D) * ((exact ? 4.0 * static_cast<double>(L) + 4.0 : 0.0) + 2.0 + D));
    for (const LayerCost& c : prof.layers) bn += static_cast<double>(c.bn_values);
    if (buckets.empty()) {
      buckets.push_back({0, bn * elem});
    } else {
      buckets.back().second += bn * elem;
    }
    std::vector<double> bucket_ready(buckets.size(), 0.0);
    double compute_end = 0, busy_max = 0;
    // Per replica, its device's compute of one VN (unscaled) and forward.
    std::vector<double> per_vn_all(static_cast<size_t>(D)), fwd_all(static_cast<size_t>(D), 0.0);
    for (int d = 0; d < D; ++d) {
      const LayerView v = view(d, 0);
      per_vn_all[static_cast<size_t>(d)] = stageComputeSeconds(prof, 0, L, false, v.costs());
      for (size_t l = 0; l < L; ++l) fwd_all[static_cast<size_t>(d)] += v.forward(l);
    }
    for (int d = 0; d < D; ++d) {
      const double f = slow(d, 0);
      const LayerView v = view(d, 0);
      const double per_vn = per_vn_all[static_cast<size_t>(d)] * f;
      const double last_bwd_start =
          per_vn * static_cast<double>(plan.vn_shares[static_cast<size_t>(d)] - 1) + fwd_all[static_cast<size_t>(d)] * f;
      const double done = per_vn * static_cast<double>(plan.vn_shares[static_cast<size_t>(d)]);
      for (size_t b = 0; b < buckets.size(); ++b) {
        double ready = done;
        if (b + 1 < buckets.size()) {
          ready = last_bwd_start;
          for (size_t l = L; l-- > buckets[b].first;) ready += v.backward(l) * f;
        }
        bucket_ready[b] = std::max(bucket_ready[b], ready);
      }
      compute_end = std::max(compute_end, done);
      busy_max = std::max(busy_max, done);
    }
    // More workers than the host has cores: they take turns (the ranks of
    // a `morph run` share one host), and their buckets are ready that much
    // later.
    // (An emulated slow device idles; a real one computes on its own: the
    // host's cores carry this machine's compute only.)
    std::map<int, double> host_busy;
    for (int d = 0; d < D; ++d)
      host_busy[coresOf(d)] += per_vn_all[static_cast<size_t>(d)] * contentionOf(d) *
                              static_cast<double>(plan.vn_shares[static_cast<size_t>(d)]);
    double cores_bound = 0;
    for (const auto& [h, busy] : host_busy) cores_bound = std::max(cores_bound, busy / std::max(1, prof.host_cores));
    if (!opts.in_process && cores_bound > compute_end) {
      const double stretch = cores_bound / compute_end;
      for (double& r : bucket_ready) r *= stretch;
      compute_end = cores_bound;
    }
    double prev = 0;
    const std::vector<int> all = rangeOf(0, D, 1);
    for (size_t b = 0; b < buckets.size(); ++b)
      prev = std::max(prev, bucket_ready[b]) + sumAmong(all, buckets[b].second / elem);
    const double reduced = prev;
    double step = 0;
    for (int d = 0; d < D; ++d)
      step = std::max(step, reduced + view(d, 0).optimizerPerParam() * static_cast<double>(prof.totalParams()) * slow(d, 0));
    out.schedule_seconds = compute_end;
    out.reduce_seconds = reduced - compute_end;
    out.step_seconds = step + overhead;
    out.stages[0].busy_s = busy_max;
    out.stages[0].bubble = 0;
    out.stages[0].peak_bytes = stageBytes(prof, 0, L, 1, false, opts);
    return out;
  }

  // Pipelines: each replica's schedule, then the reductions. Replicas with
  // the same VN share and the same devices run alike: simulated once.
  std::vector<ReplicaRun> runs;
  std::map<std::tuple<int64_t, std::vector<double>, std::vector<int>, std::vector<int>, std::vector<size_t>>, size_t> seen;
  const bool per_group = !plan.group_cuts.empty();
  // Replica d's cut: the plan's, or its own (PlanSpec::group_cuts).
  auto cutsOf = [&](int d) -> const std::vector<size_t>& {
    return per_group ? plan.group_cuts[static_cast<size_t>(d)] : plan.cuts;
  };
  for (int d = 0; d < D; ++d) {
    std::vector<double> factors;
    std::vector<int> hosts, tables;
    for (int k = 0; k < P; ++k) {
      factors.push_back(slow(d, k));
      if (!opts.rank_costs.empty()) tables.push_back(opts.rank_costs[static_cast<size_t>(d * P + k)]);
      if (!opts.rank_host.empty()) hosts.push_back(opts.rank_host.at(static_cast<size_t>(d * P + k)));
    }
    // runReplica() looks at hosts only to see which neighbours are on
    // different hosts: replicas on other hosts but with the same crossings
    // run alike (512 replicas on 128 hosts: a few runs, not 512).
    std::vector<int> crossings;
    for (size_t k = 0; k + 1 < hosts.size(); ++k) crossings.push_back(hosts[k] != hosts[k + 1]);
    auto key = std::make_tuple(plan.vn_shares[static_cast<size_t>(d)], factors, crossings, tables,
                               per_group ? cutsOf(d) : std::vector<size_t>{});
    if (auto it = seen.find(key); it != seen.end()) {
      runs.push_back(runs[it->second]);
      continue;
    }
    std::vector<StageCosts> cost(static_cast<size_t>(P));
    for (int k = 0; k < P; ++k) {
      const size_t a = cutsOf(d)[static_cast<size_t>(k)], b = cutsOf(d)[static_cast<size_t>(k) + 1];
      const bool rc = plan.recompute && b < L;
      StageCosts& c = cost[static_cast<size_t>(k)];
      const LayerView v = view(d, k);
      for (size_t l = a; l < b; ++l) {
        c.fwd += rc ? v.forwardNograd(l) : v.forward(l);
        c.bwd += v.backward(l);
        c.rec += v.recompute(l);
      }
      const double f = factors[static_cast<size_t>(k)];
      c.fwd *= f, c.bwd *= f, c.rec *= f;
    }
    seen[key] = runs.size();
    if (per_group) {
      PlanSpec own = plan;  // runReplica() reads the cut for its messages' sizes
      own.cuts = cutsOf(d);
      runs.push_back(runReplica(prof, own, cost, plan.vn_shares[static_cast<size_t>(d)], hosts, opts));
    } else {
      runs.push_back(runReplica(prof, plan, cost, plan.vn_shares[static_cast<size_t>(d)], hosts, opts));
    }
  }
  double compute_end = 0, all_ready = 0;
  for (const ReplicaRun& r : runs)
    for (int k = 0; k < P; ++k) {
      compute_end = std::max(compute_end, r.last[static_cast<size_t>(k)]);
      all_ready = std::max(all_ready, r.end[static_cast<size_t>(k)]);
    }
  // Ranks of one host share its cores: the compute cannot finish sooner
  // than the busiest host's compute divided by its cores (all ranks of a
  // `morph run` are on one host unless opts.rank_host says otherwise).
  std::map<int, double> host_busy;  // this machine's compute (see the data-parallel case)
  for (int d = 0; d < D; ++d)
    for (int k = 0; k < P; ++k)
      host_busy[coresOf(d * P + k)] += runs[static_cast<size_t>(d)].busy[static_cast<size_t>(k)] / slow(d, k) *
                                   contentionOf(d * P + k);
  double cores_bound = 0;
  for (const auto& [h, busy] : host_busy) cores_bound = std::max(cores_bound, busy / std::max(1, prof.host_cores));
  const double stretch = compute_end > 0 && cores_bound > compute_end ? cores_bound / compute_end : 1.0;
  compute_end *= stretch, all_ready *= stretch;
  const std::vector<int> world = rangeOf(0, P * D, 1);
  const double world_max = all_ready + maxAmong(world) + (opts.clipping ? maxAmong(world) : 0.0);
  const double stats = world_max + sumAmong(world, 2);
  int64_t M_max = 0;  // the largest share stashes the most
  for (int64_t s : plan.vn_shares) M_max = std::max(M_max, s);
  double step = 0;
  if (per_group) {
    // A cut per group (PlanSpec::group_cuts): each block of layers that
    // every group holds on one stage (reduceBlocks()) is summed among its
    // D holders once all of them are done and free; a rank sums its blocks
    // front to back, one at a time. A tied weight that some group splits
    // between stages is summed, as in a shared cut, among its holders
    // (2D ranks) after the schedules; its user ranks step a copy.
    auto rankOf = [&](int d, int k) { return static_cast<size_t>(d * P + k); };
    auto stageOf = [&](int d, size_t l) {
      const std::vector<size_t>& c = cutsOf(d);
      return static_cast<int>(std::upper_bound(c.begin(), c.end(), l) - c.begin()) - 1;
    };
    std::vector<double> chain(static_cast<size_t>(P * D), 0.0), params(static_cast<size_t>(P * D), 0.0);
    std::vector<bool> tied_rank(static_cast<size_t>(P * D), false);
    std::vector<double> owner_less(L, 0.0);  // per layer: tied values summed in the tied group instead
    double tied = 0;
    for (size_t u = 0; u < L; ++u) {
      const LayerCost& c = prof.layers[u];
      if (c.tied_params == 0) continue;
      const size_t o = static_cast<size_t>(c.tied_owner);
      bool split = false;
      for (int d = 0; d < D; ++d) split = split || stageOf(d, u) != stageOf(d, o);
      if (!split) continue;
      tied += static_cast<double>(c.tied_params);
      owner_less[o] += static_cast<double>(c.tied_params);
      for (int d = 0; d < D; ++d) {
        tied_rank[rankOf(d, stageOf(d, u))] = tied_rank[rankOf(d, stageOf(d, o))] = true;
        if (stageOf(d, u) != stageOf(d, o)) params[rankOf(d, stageOf(d, u))] += static_cast<double>(c.tied_params);
      }
    }
    for (int d = 0; d < D; ++d)
      for (size_t l = 0; l < L; ++l) params[rankOf(d, stageOf(d, l))] += static_cast<double>(prof.layers[l].params);
    for (const ReduceBlock& blk : reduceBlocks(plan.group_cuts)) {
      double values = 0, start = 0;
      for (size_t l = blk.first; l < blk.end; ++l)
        values += static_cast<double>(prof.layers[l].params + prof.layers[l].bn_values) - owner_less[l];
      std::vector<int> holders;
      for (int d = 0; d < D; ++d) {
        const int k = blk.stage[static_cast<size_t>(d)];
        holders.push_back(static_cast<int>(rankOf(d, k)));
        start = std::max({start, runs[static_cast<size_t>(d)].end[static_cast<size_t>(k)] * stretch, chain[rankOf(d, k)]});
      }
      const double end = start + sumAmong(holders, std::max(values, 0.0));
      for (int d = 0; d < D; ++d) chain[rankOf(d, blk.stage[static_cast<size_t>(d)])] = end;
    }
    std::vector<int> tied_ranks;
    for (int r = 0; r < P * D; ++r)
      if (tied_rank[static_cast<size_t>(r)]) tied_ranks.push_back(r);
    // The fit is of 2D ranks (one weight, its owner's and its user's stage
    // in each group); the link sees the ranks that hold any such weight.
    const double tied_done =
        tied > 0 ? all_ready + group(2 * D, tied) +
                       (links ? ringLinkSeconds(opts, hostsOf(tied_ranks), sumWireBytes(prof, tied, 2 * D)) : 0.0)
                 : 0.0;
    for (int d = 0; d < D; ++d)
      for (int k = 0; k < P; ++k) {
        const size_t r = rankOf(d, k);
        const double done = std::max({stats, chain[r], tied_rank[r] ? tied_done : 0.0});
        step = std::max(step, done + view(d, k).optimizerPerParam() * params[r] * slow(d, k));
      }
    for (int k = 0; k < P; ++k) {
      StageSim& st = out.stages[static_cast<size_t>(k)];
      double bubble = 0;
      for (int d = 0; d < D; ++d) {
        const ReplicaRun& r = runs[static_cast<size_t>(d)];
        double span = 0;
        for (double e : r.last) span = std::max(span, e);
        st.busy_s = std::max(st.busy_s, r.busy[static_cast<size_t>(k)]);
        bubble += span > 0 ? 1.0 - r.busy[static_cast<size_t>(k)] / span : 0.0;
        const size_t a = cutsOf(d)[static_cast<size_t>(k)], b = cutsOf(d)[static_cast<size_t>(k) + 1];
        // The largest over the groups (the planner checks each rank its own).
        st.peak_bytes = std::max(st.peak_bytes, stageBytes(prof, a, b, runStashBound({plan.schedule, P, M_max, plan.recompute}, k),
                                                           plan.recompute, opts));
      }
      st.bubble = bubble / D;
    }
  }
  for (int k = 0; k < P && !per_group; ++k) {
    const size_t a = plan.cuts[static_cast<size_t>(k)], b = plan.cuts[static_cast<size_t>(k) + 1];
    double values = 0, tied = 0, params = 0;
    std::vector<int> tied_ranks;  // the stages that share a weight with this one, in every replica
    for (size_t l = a; l < b; ++l) {
      values += static_cast<double>(prof.layers[l].params + prof.layers[l].bn_values);
      params += static_cast<double>(prof.layers[l].params);
    }
    // A weight used on two stages is summed between them (not among this
    // stage's replicas only); the user stage updates a copy of its own.
    for (size_t u = 0; u < L; ++u) {
      const LayerCost& c = prof.layers[u];
      if (c.tied_params == 0) continue;
      const size_t o = static_cast<size_t>(c.tied_owner);
      const bool user_here = a <= u && u < b, owner_here = a <= o && o < b;
      if (user_here == owner_here) continue;
      tied += static_cast<double>(c.tied_params);
      if (owner_here) values -= static_cast<double>(c.tied_params);
      else params += static_cast<double>(c.tied_params);
      if (links) {
        const size_t other = owner_here ? u : o;
        const int j = static_cast<int>(std::upper_bound(plan.cuts.begin(), plan.cuts.end(), other) - plan.cuts.begin()) - 1;
        for (int d = 0; d < D; ++d) tied_ranks.push_back(d * P + k), tied_ranks.push_back(d * P + j);
      }
    }
    std::sort(tied_ranks.begin(), tied_ranks.end());
    tied_ranks.erase(std::unique(tied_ranks.begin(), tied_ranks.end()), tied_ranks.end());
    double ready = 0;
    for (const ReplicaRun& r : runs) ready = std::max(ready, r.end[static_cast<size_t>(k)] * stretch);
    double done = std::max(stats, ready + sumAmong(rangeOf(k, D, P), values));
    if (tied > 0)
      done = std::max(done, all_ready + group(2 * D, tied) +
                                (links ? ringLinkSeconds(opts, hostsOf(tied_ranks), sumWireBytes(prof, tied, 2 * D)) : 0.0));
    for (int d = 0; d < D; ++d)
      step = std::max(step, done + view(d, k).optimizerPerParam() * params * slow(d, k));
    StageSim& st = out.stages[static_cast<size_t>(k)];
    double bubble = 0;
    for (int d = 0; d < D; ++d) {
      const ReplicaRun& r = runs[static_cast<size_t>(d)];
      double span = 0;  // the schedule's own shape, before sharing cores
      for (double e : r.last) span = std::max(span, e);
      st.busy_s = std::max(st.busy_s, r.busy[static_cast<size_t>(k)]);
      bubble += span > 0 ? 1.0 - r.busy[static_cast<size_t>(k)] / span : 0.0;
    }
    st.bubble = bubble / D;
    st.peak_bytes = stageBytes(prof, a, b, runStashBound({plan.schedule, P, M_max, plan.recompute}, k), plan.recompute, opts);
  }
  out.schedule_seconds = compute_end;
  out.reduce_seconds = step - compute_end;
  // What a measured pipeline of worker processes took per step beyond the
  // parts above (Profile::pipelineStepSeconds).
  out.step_seconds = step + overhead + (opts.in_process ? 0.0 : prof.pipelineStepSeconds());
  return out;
}

WspSimResult simulateWsp(const Profile& prof, const PlanSpec& plan_in, const WspOptions& wsp, const SimOptions& opts) {
  PlanSpec plan = plan_in;
  if (plan.cuts.empty() && plan.stages == 1) plan.cuts = {0, prof.layers.size()};
  checkPlan(prof, plan);
  if (plan.stages != 1 || plan.replicas < 2)
    throw InputError("WSP runs each virtual worker as one data-parallel worker: a plan of 1 stage and at least 2 "
                     "replicas, not " + std::to_string(plan.stages) + " x " + std::to_string(plan.replicas));
  if (wsp.wave < 1 || wsp.staleness < 0) throw InputError("WSP needs sync.wave >= 1 and sync.staleness >= 0");
  const int W = plan.replicas;
  const size_t L = prof.layers.size();
  if (!opts.rank_host.empty() && opts.rank_host.size() != static_cast<size_t>(W))
    throw InputError("simulate: " + std::to_string(opts.rank_host.size()) + " rank hosts for " + std::to_string(W) +
                     " ranks");
  auto hostOf = [&](int v) { return opts.rank_host.empty() ? 0 : opts.rank_host[static_cast<size_t>(v)]; };
  auto coresOf = [&](int v) { return opts.hosts_share_cores ? 0 : hostOf(v); };  // as simulate()
  checkCosts(prof, opts, W);
  // As simulate(): the host's workers compute at once (the factor of its
  // process count), times each device's factor.
  std::map<int, int> on_host;
  for (int v = 0; v < W; ++v) ++on_host[coresOf(v)];
  auto contentionOf = [&](int v) { return prof.computeFactor(on_host[coresOf(v)], W); };
  auto slow = [&](int v) { return (plan.slowdown.empty() ? 1.0 : plan.slowdown[static_cast<size_t>(v)]) * contentionOf(v); };
  // A push carries every value of the buffer (parameters, batch-norm
  // statistics, the loss statistics) as int64; a pull every float of the
  // global weights (parameters, running statistics). Shards are taken as
  // equal (the runtime balances them by values, whole tensors).
  double values = 2, state = 0;
  for (const LayerCost& c : prof.layers) {
    values += static_cast<double>(c.params + c.bn_values);
    state += static_cast<double>(c.params + c.bn_values);
  }
  const double params = static_cast<double>(prof.totalParams()), w = static_cast<double>(W);
  const double push_bytes = 8.0 * values / w + 8.0 * 4, pull_bytes = 4.0 * state / w + 8.0;  // + headers
  auto transfer = [&](double bytes, int from, int to) {
    double t = prof.p2p.at(bytes);
    if (hostOf(from) != hostOf(to))
      t += opts.cross_host_latency_s + (opts.cross_host_bytes_per_s > 0 ? bytes / opts.cross_host_bytes_per_s : 0.0);
    return t;
  };
  const double nm = static_cast<double>(wsp.wave);
  WspSimResult out;
  std::map<int, double> host_cpu;      // a clock's CPU per machine (the cores bound)
  std::map<int, double> compute_cpu;   // of it, the VWs' waves
  std::map<int, double> compute_wall;  // the longest wave on the machine
  for (int v = 0; v < W; ++v) {
    const DeviceCosts* costs = costsOfRank(opts, v);
    const double per_vn = stageComputeSeconds(prof, 0, L, false, costs);
    const double opt = LayerView(prof, costs).optimizerPerParam();
    // A shard's clock: the W pushes summed (a fixed-point add per value
    // each) and one optimiser step over its parameters.
    const double server_cpu = prof.quantize_s_per_value * values + opt * params / w;
    const double f = slow(v), share = static_cast<double>(plan.vn_shares[static_cast<size_t>(v)]);
    WspVwSim s;
    // VnExecutor::localStep: the VNs, then the local SGD update; VW 0 posts
    // each minibatch's metrics line (one of a sync step's two round trips).
    const double minibatch = per_vn * share * f + opt * params * f +
                             (v == 0 ? prof.step_overhead_s / 2 : 0.0);
    s.compute_s = nm * minibatch;
    for (int r = 0; r < W; ++r) {
      if (r == v) continue;
      s.push_s += transfer(push_bytes, v, r);
      s.pull_s += transfer(pull_bytes, r, v);
    }
    s.server_s = server_cpu * f;
    const double wave_cpu = nm * (per_vn * share * contentionOf(v) + opt * params);
    host_cpu[coresOf(v)] += wave_cpu + server_cpu;
    compute_cpu[coresOf(v)] += wave_cpu;
    compute_wall[coresOf(v)] = std::max(compute_wall[coresOf(v)], s.compute_s);
    out.vws.push_back(s);
  }
  // The VWs of a machine compute their waves at the same time (D = 0
  // starts them together each clock; D >= 1 drifts them less than a
  // wave apart while they keep pace): the waves cannot all end before
  // their CPU over its cores, and each stretches by that much, as
  // simulate() stretches data parallelism's compute (an emulated slow
  // device idles after its compute, in proportion to it).
  for (int v = 0; v < W; ++v) {
    WspVwSim& s = out.vws[static_cast<size_t>(v)];
    const int h = coresOf(v);
    const double phase = compute_cpu[h] / std::max(1, prof.host_cores);
    if (compute_wall[h] > 0 && phase > compute_wall[h]) s.compute_s *= phase / compute_wall[h];
    s.cycle_s = s.compute_s + s.push_s + s.pull_s;
  }
  double cycle = 0;
  for (int v = 0; v < W; ++v) {
    const WspVwSim& s = out.vws[static_cast<size_t>(v)];
    if (s.cycle_s > cycle) cycle = s.cycle_s, out.slowest = v;
    out.server_seconds = std::max(out.server_seconds, s.server_s);
  }
  for (const auto& [h, cpu] : host_cpu)
    out.cores_bound_seconds = std::max(out.cores_bound_seconds, cpu / std::max(1, prof.host_cores));
  // D = 0: every VW waits for every shard's clock. D >= 1: the server step
  // overlaps the next wave, but a shard still applies one clock per clock.
  const double clock = wsp.staleness == 0 ? cycle + out.server_seconds : std::max(cycle, out.server_seconds);
  out.clock_seconds = std::max(clock, out.cores_bound_seconds);
  out.step_seconds = out.clock_seconds / nm;
  return out;
}

}  // namespace morph
