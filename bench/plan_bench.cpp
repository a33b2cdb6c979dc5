// Planner speed and cut quality.
//
// 1. planning_seconds (the search alone, as `morph plan` reports it) for
//    8, 128 and 1024 workers, on a synthetic 96-layer transformer-like
//    profile (an embedding, 94 equal blocks with +-20% noise, a head three
//    blocks heavy; 512 VNs) and, with --profile FILE, on a calibrated one
//    (e.g. gpt-mini's), without and with a memory cap. Varuna reports
//    0.4-0.7 s for 128 GPUs.
// 2. Heterogeneous pools of 8, 128 and 1024 devices of 3 types (the
//    synthetic profile): planning_seconds of planDevices.
// 2a. The same pools with per-layer type profiles (issue 30, "a real
//    profile per device type"): types 1 and 2 get tables of their own whose
//    per-layer ratio to the profile alternates (1.5 / 0.5 x on even / odd
//    blocks for type 1, the reverse for type 2), against one factor per
//    type with the same whole-model compute: planning_seconds, simulations
//    and the best plan's step (each simulated with the per-layer costs).
// 2c. A cut per group (issue 30, HetPipe): the pools of 2 and 2a (8, 128
//    and 1024 devices; one factor per type, and per-layer type profiles), the
//    planner's best (shared-cut) plan, the fastest plan it found with a
//    cut per group (PlanOutcome::group_cuts) and the shared cut on the same
//    groups, simulated; planning_seconds with and without the comparison.
// 2b. Allocation policies (HetPipe §8) on HetPipe's testbed shape: 4 hosts
//    of 4 devices of one type each, compute factors and memory from the
//    four GPUs' FP32 peak and memory (TITAN RTX 1.0 / 24 GiB, TITAN V 1.1 /
//    12 GiB, RTX 2060 2.5 / 6 GiB, Quadro P4000 3.1 / 8 GiB), pipeline
//    messages between hosts over 56 Gb/s InfiniBand (7 GB/s, plus 5 us),
//    within a host the profile's p2p (10 GB/s): the predicted step of NP,
//    ED, HD and the planner's choice (compareAllocations()), for a
//    synthetic 48-layer model (4 Mi parameters per block, 2 sequences of
//    512 tokens per VN, 64 VNs) that fits every host's devices.
// 3. Cut quality: for each P the planner's cut (min-max DP over the
//    calibrated costs) against the equal-layer-count split Varuna's code
//    uses, both simulated with 1F1B on one replica: predicted step time of
//    the even split over the DP's.
//
// 4. Hosts with more ranks than cores (issue 30): planning_seconds with and
//    without the host bounds (the search before), the simulations each
//    ran and whether both chose a plan of the same step, for --workers 8,
//    128, 1024 on one host and pools of 8, 128, 1024 devices of 3 types, 8
//    per host (e.g. --profile for gpt-mini with 48 blocks, dim 32, --vns 512).
//
//   build/bench/plan_bench [--profile FILE] [--vns V] [--repeat 5] [--group-cuts-only]
#include <chrono>
#include <cstdio>
#include <random>

#include "bench_cli.h"
#include "exec/pipeline.h"
#include "plan/planner.h"

using namespace morph;

namespace {

// `seqs` sequences of 512 tokens per VN, `block_params` per block.
Profile synthetic(size_t layers, int64_t block_params = 12 * 1024 * 1024, int64_t seqs = 8) {
  std::mt19937 rng(42);
  std::uniform_real_distribution<double> noise(0.8, 1.2);
  Profile p;
  p.host_cores = 1 << 20;  // one worker per host
  p.fingerprint.reduce_mode = "exact";
  p.runtime_bytes = int64_t{300} << 20;
  p.input_bytes = seqs * 512 * 8;
  for (size_t l = 0; l < layers; ++l) {
    LayerCost c;
    c.name = l == 0 ? "embed" : l + 1 == layers ? "head" : "block" + std::to_string(l);
    const double w = (l == 0 ? 0.05 : l + 1 == layers ? 3.0 : noise(rng)) * static_cast<double>(seqs) / 8.0;
    c.forward_s = c.forward_nograd_s = c.recompute_s = 0.004 * w;
    c.backward_s = 0.008 * w;
    c.output_bytes = seqs * 512 * 1024 * 4;  // sequences x 512 tokens x 1024 dims
    c.params = l == 0 ? 50000 * 1024 : block_params;
    c.param_bytes = 4 * c.params;
    c.optimizer_bytes = 8 * c.params;
    c.activation_bytes = 16 * c.output_bytes;
    if (l + 1 == layers) c.tied_params = 50000 * 1024, c.tied_owner = 0;
    p.layers.push_back(c);
    p.fingerprint.layers.push_back(c.name);
  }
  p.p2p = LinearFit{5e-5, 1e-10, {}};                // ~10 GB/s
  p.allreduce_exact[2] = LinearFit{1e-4, 2e-10, {}};
  p.allreduce_float[2] = LinearFit{1e-4, 1e-10, {}};
  p.allreduce_max[2] = LinearFit{5e-5, 0, {}};
  p.optimizer_s_per_param = 1e-9;
  return p;
}

void speed(const char* label, const Profile& p, int64_t vns, int repeat) {
  std::printf("\n%s: %zu layers, %lld VNs\n", label, p.layers.size(), static_cast<long long>(vns));
  std::printf("%8s %10s %14s %12s %10s %12s  %s\n", "workers", "cap MiB", "planning ms", "candidates", "simulated",
              "step ms", "best plan");
  int64_t whole = 0;
  for (const LayerCost& c : p.layers) whole += c.param_bytes + c.optimizer_bytes;
  for (int n : {8, 128, 1024})
    for (int64_t cap : {int64_t{0}, whole * 5 / 4 + p.runtime_bytes}) {
      PlanRequest rq;
      rq.workers = n;
      rq.virtual_nodes = vns;
      rq.memory_cap_bytes = cap;
      rq.top_k = 5;
      double best = 1e30;
      PlanOutcome out;
      for (int r = 0; r < repeat; ++r) {
        try {
          out = planJob(p, rq);
        } catch (const std::exception& e) {
          std::printf("%8d %10lld  %s\n", n, static_cast<long long>(cap >> 20), e.what());
          break;
        }
        best = std::min(best, out.planning_seconds);
      }
      if (out.plans.empty()) continue;
      const PlanChoice& c = out.plans.front();
      std::fflush(stdout);
      std::printf("%8d %10lld %14.2f %12lld %10lld %12.2f  P=%d D=%d %s%s\n", n, static_cast<long long>(cap >> 20),
                  best * 1e3, static_cast<long long>(out.candidates), static_cast<long long>(out.simulated),
                  c.sim.step_seconds * 1e3, c.plan.stages, c.plan.replicas, scheduleLabel(c.plan).c_str(),
                  c.plan.recompute ? "+rc" : "");
    }
}

void cuts(const char* label, const Profile& p, int64_t vns) {
  std::printf("\n%s: the planner's cut vs an equal-count split (1F1B, one replica, %lld VNs)\n", label,
              static_cast<long long>(vns));
  std::printf("%4s %16s %16s %10s\n", "P", "even split ms", "planner cut ms", "even/cut");
  const size_t L = p.layers.size();
  for (int P : {2, 3, 4, 8, 16}) {
    if (static_cast<size_t>(P) > L) break;
    PlanRequest rq;
    rq.workers = P;
    rq.virtual_nodes = vns;
    rq.max_stages = P;
    rq.schedules = {ScheduleKind::k1F1B};
    rq.try_recompute = false;
    rq.top_k = 1000;
    const PlanOutcome out = planJob(p, rq);
    const PlanChoice* dp = nullptr;
    for (const PlanChoice& c : out.plans)
      if (c.plan.stages == P && c.plan.replicas == 1) dp = &c;
    if (!dp) continue;
    PlanSpec even = dp->plan;
    even.cuts = evenCuts(L, P);
    const double e = simulate(p, even).step_seconds, d = dp->sim.step_seconds;
    std::printf("%4d %16.2f %16.2f %10.3f\n", P, e * 1e3, d * 1e3, e / d);
  }
}

// planJob `repeat` times: the last outcome, and in *best the shortest
// planning time.
PlanOutcome planTimed(const Profile& p, const PlanRequest& rq, int repeat, double* best) {
  PlanOutcome out;
  *best = 1e30;
  for (int r = 0; r < repeat; ++r) {
    out = planJob(p, rq);
    *best = std::min(*best, out.planning_seconds);
  }
  return out;
}

// Heterogeneous pools: 3 device types (speed factors 1, 1.5 and 2; the
// slower, the less memory), equal numbers of each.
void devices(const Profile& p, int64_t vns, int repeat) {
  std::printf("\nheterogeneous pools, 3 types, %lld VNs\n", static_cast<long long>(vns));
  std::printf("%8s %14s %12s %12s  %s\n", "devices", "planning ms", "simulated", "step ms", "best plan");
  int64_t whole = 0;
  for (const LayerCost& c : p.layers) whole += c.param_bytes + c.optimizer_bytes;
  for (int n : {8, 128, 1024}) {
    PlanRequest rq;
    rq.virtual_nodes = vns;
    rq.workers = n;
    for (int s = 0; s < n; ++s) {
      rq.slot_slowdown.push_back(1.0 + 0.5 * (s % 3));
      rq.slot_memory.push_back(whole * (4 - s % 3) + p.runtime_bytes);
    }
    double best = 0;
    const PlanOutcome out = planTimed(p, rq, repeat, &best);
    const PlanChoice& c = out.plans.front();
    std::printf("%8d %14.2f %12lld %12.2f  P=%d D=%d %s\n", n, best * 1e3, static_cast<long long>(out.simulated),
                c.sim.step_seconds * 1e3, c.plan.stages, c.plan.replicas, scheduleLabel(c.plan).c_str());
  }
}

// Per-layer tables of types 1 and 2 (slowdowns 1.5 and 2 on the whole):
// type t's layers take its factor (1 + 0.5 t) times 1.5 on one parity of
// layer and 0.5 on the other, the parities opposite for the two types.
// `factors` (if given): 1 for type 0, then each table's whole-model
// compute against the profile's, the one speed factor per type.
std::vector<DeviceCosts> alternatingTypeTables(const Profile& p, std::vector<double>* factors) {
  std::vector<DeviceCosts> tables;
  if (factors) *factors = {1.0};
  double base = 0;
  for (const LayerCost& c : p.layers) base += c.forward_s + c.backward_s;
  for (int t = 1; t <= 2; ++t) {
    DeviceCosts d = deviceCostsOf(p, "type" + std::to_string(t));
    double sum = 0;
    for (size_t l = 0; l < d.layers.size(); ++l) {
      const double k = (1.0 + 0.5 * t) * ((l % 2 == static_cast<size_t>(t % 2)) ? 1.5 : 0.5);
      LayerTimes& x = d.layers[l];
      x.forward_s *= k, x.forward_nograd_s *= k, x.backward_s *= k, x.recompute_s *= k;
      sum += x.forward_s + x.backward_s;
    }
    tables.push_back(d);
    if (factors) factors->push_back(sum / base);
  }
  return tables;
}

// A pool of n devices of types 0, 1, 2 in turn, each with memory for 4, 3
// and 2 copies of the model's weights and optimiser state (plus the
// process), planning `vns` VNs: with `tables` (per-layer costs of types 1
// and 2) or, without, one speed factor per type (`factors`, by type).
// per_host > 0: that many devices per host.
PlanRequest mixedPool(const Profile& p, int n, int64_t vns, std::shared_ptr<const std::vector<DeviceCosts>> tables,
                      const std::vector<double>& factors, int per_host) {
  int64_t whole = 0;
  for (const LayerCost& c : p.layers) whole += c.param_bytes + c.optimizer_bytes;
  PlanRequest rq;
  rq.virtual_nodes = vns;
  rq.workers = n;
  for (int s = 0; s < n; ++s) {
    rq.slot_slowdown.push_back(tables ? 1.0 : factors[static_cast<size_t>(s % 3)]);
    rq.slot_memory.push_back(whole * (4 - s % 3) + p.runtime_bytes);
    if (per_host > 0) rq.slot_host.push_back(s / per_host);
    if (tables) rq.slot_costs.push_back(s % 3 - 1);
  }
  rq.sim.device_costs = std::move(tables);
  return rq;
}

void perLayerTypes(const Profile& p, int64_t vns, int repeat) {
  std::printf("\nheterogeneous pools, 3 types, types 1 and 2 with per-layer profiles, %lld VNs\n",
              static_cast<long long>(vns));
  std::printf("%8s %-10s %14s %12s %14s  %s\n", "devices", "costs", "planning ms", "simulated", "step ms (true)",
              "best plan");
  std::vector<double> factors;
  const auto shared = std::make_shared<const std::vector<DeviceCosts>>(alternatingTypeTables(p, &factors));
  for (int n : {8, 128, 1024})
    for (bool per_layer : {false, true}) {
      const PlanRequest rq = mixedPool(p, n, vns, per_layer ? shared : nullptr, factors, 0);
      double best = 0;
      const PlanOutcome out = planTimed(p, rq, repeat, &best);
      const PlanChoice& c = out.plans.front();
      // The chosen plan on the devices as they are (per-layer costs).
      PlanSpec truth = c.plan;
      SimOptions so = rq.sim;
      so.device_costs = shared;
      truth.slowdown.clear();
      for (int slot : truth.workers) {
        truth.slowdown.push_back(1.0);
        so.rank_costs.push_back(slot % 3 - 1);
      }
      std::printf("%8d %-10s %14.2f %12lld %14.2f  P=%d D=%d %s\n", n, per_layer ? "per-layer" : "one factor",
                  best * 1e3, static_cast<long long>(out.simulated), simulate(p, truth, so).step_seconds * 1e3,
                  c.plan.stages, c.plan.replicas, scheduleLabel(c.plan).c_str());
    }
}

void groupCuts(const Profile& p, int64_t vns, int repeat) {
  std::printf("\na cut per group against one shared cut, 3 types, %lld VNs, 8 devices per host (simulated)\n",
              static_cast<long long>(vns));
  std::printf("%8s %-10s %10s %10s %10s | %10s %10s %6s | %10s %10s | %9s %9s  %s\n", "devices", "costs",
              "plan ms", "plan ms", "best", "per group", "shared", "ratio", "compute", "compute", "reduce", "reduce",
              "per-group plan");
  std::printf("%8s %-10s %10s %10s %10s | %10s %10s %6s | %10s %10s | %9s %9s\n", "", "", "(without)", "(with)",
              "step ms", "step ms", "step ms", "", "per group", "shared", "per group", "shared");
  const auto shared = std::make_shared<const std::vector<DeviceCosts>>(alternatingTypeTables(p, nullptr));
  for (int n : {8, 128, 1024})
    for (bool per_layer : {false, true}) {
      const PlanRequest rq = mixedPool(p, n, vns, per_layer ? shared : nullptr, {1.0, 1.5, 2.0}, 8);
      PlanRequest off = rq;
      off.compare_group_cuts = false;
      double t_off = 0, t_on = 0;
      planTimed(p, off, repeat, &t_off);
      const PlanOutcome out = planTimed(p, rq, repeat, &t_on);
      const double best = out.plans.front().sim.step_seconds;
      const char* costs = per_layer ? "per-layer" : "one factor";
      if (!out.group_cuts) {
        std::printf("%8d %-10s %10.2f %10.2f %10.1f |  (every grouping's groups cut alike)\n", n, costs, t_off * 1e3,
                    t_on * 1e3, best * 1e3);
        continue;
      }
      const GroupCutComparison& g = *out.group_cuts;
      const PlanSpec& pg = g.per_group.plan;
      const SimResult none{};
      const SimResult& sh = g.shared ? g.shared->sim : none;
      std::printf("%8d %-10s %10.2f %10.2f %10.1f | %10.1f %10.1f %6.3f | %10.1f %10.1f | %9.1f %9.1f  P=%d D=%d %s, "
                  "%lld of %lld simulated%s\n",
                  n, costs, t_off * 1e3, t_on * 1e3, best * 1e3, g.per_group.sim.step_seconds * 1e3,
                  sh.step_seconds * 1e3, g.shared ? g.per_group.sim.step_seconds / sh.step_seconds : 0.0,
                  g.per_group.sim.schedule_seconds * 1e3, sh.schedule_seconds * 1e3,
                  g.per_group.sim.reduce_seconds * 1e3, sh.reduce_seconds * 1e3, pg.stages, pg.replicas,
                  scheduleLabel(pg).c_str(), static_cast<long long>(g.simulated), static_cast<long long>(g.candidates),
                  g.beats_best  ? ", beats the best"
                  : g.of_chosen ? ", the chosen plan's groups"
                                : ", the smallest bound's groups");
    }
}

void allocation(const Profile& p, int64_t vns) {
  std::printf("\nallocation policies: 16 devices, 4 hosts x 4 of one type, %lld VNs\n", static_cast<long long>(vns));
  const char* names[] = {"RTX", "V", "2060", "P4000"};
  const double slowdown[] = {1.0, 1.1, 2.5, 3.1};
  const int64_t gib[] = {24, 12, 6, 8};
  PlanRequest rq;
  rq.virtual_nodes = vns;
  rq.workers = 16;
  for (int h = 0; h < 4; ++h)
    for (int i = 0; i < 4; ++i) {
      rq.slot_slowdown.push_back(slowdown[h]);
      rq.slot_memory.push_back(gib[h] << 30);
      rq.slot_host.push_back(h);
    }
  rq.sim.cross_host_bytes_per_s = 7e9;
  rq.sim.cross_host_latency_s = 5e-6;
  const PlanOutcome mine = planJob(p, rq);
  const auto rows = compareAllocations(p, rq, mine);
  std::printf("%s", allocationTable(rows, [&](int slot) { return std::string(names[slot / 4]); }).c_str());
  std::printf("planning: %.1f ms\n", mine.planning_seconds * 1e3);
}

// Planning where hosts hold more ranks than cores (issue 30): with and
// without the host bounds (PlanRequest::host_bounds = false: the search as
// before), planning_seconds, simulations and the best plan's step, for
// `--workers N` on this one host (the profile's host_cores) and for a
// resources-file pool of 3 types (slowdown 1, 1.5, 2; 16, 12, 8 GiB), 8
// devices per host, hosts cycling the types, a 56 Gb/s link between hosts.
void hosts(const char* label, const Profile& p, int64_t vns, int repeat) {
  std::printf("\n%s, %lld VNs, %d cores per host: planning with the host bounds (after) and without (before)\n",
              label, static_cast<long long>(vns), p.host_cores);
  std::printf("%-22s %12s %12s %8s %10s %10s %8s %12s  %s\n", "pool", "before ms", "after ms", "ratio",
              "sim before", "sim after", "same", "step ms", "best plan");
  auto row = [&](const std::string& pool, PlanRequest rq) {
    double t[2] = {1e30, 1e30};
    PlanOutcome out[2];
    for (int b = 0; b < 2; ++b) {
      rq.host_bounds = b == 1;
      for (int r = 0; r < repeat; ++r) {
        out[b] = planJob(p, rq);
        t[b] = std::min(t[b], out[b].planning_seconds);
      }
    }
    const PlanChoice& c = out[1].plans.front();
    std::printf("%-22s %12.1f %12.1f %8.1f %10lld %10lld %8s %12.2f  P=%d D=%d %s%s\n", pool.c_str(), t[0] * 1e3,
                t[1] * 1e3, t[0] / t[1], static_cast<long long>(out[0].simulated),
                static_cast<long long>(out[1].simulated),
                out[0].plans.front().sim.step_seconds == c.sim.step_seconds ? "yes" : "NO", c.sim.step_seconds * 1e3,
                c.plan.stages, c.plan.replicas, scheduleLabel(c.plan).c_str(), c.plan.recompute ? "+rc" : "");
  };
  for (int n : {8, 128, 1024}) {
    PlanRequest rq;
    rq.workers = n;
    rq.virtual_nodes = vns;
    row("--workers " + std::to_string(n), rq);
  }
  for (int n : {8, 128, 1024}) {
    PlanRequest rq;
    rq.workers = n;
    rq.virtual_nodes = vns;
    rq.sim.cross_host_bytes_per_s = 7e9;
    rq.sim.cross_host_latency_s = 5e-6;
    for (int s = 0; s < n; ++s) {
      const int host = s / 8, type = host % 3;
      rq.slot_slowdown.push_back(1.0 + 0.5 * type);
      rq.slot_memory.push_back(int64_t{16 - 4 * type} << 30);
      rq.slot_host.push_back(host);
    }
    row(std::to_string(n) + " devices, " + std::to_string((n + 7) / 8) + " hosts", rq);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::string profile;
  int64_t vns = 16;
  int repeat = 5;
  CLI::App app{"planner speed, cut quality and allocation policies (bench/README.md)"};
  app.add_option("--profile", profile, "a calibrated profile (morph calibrate) to plan as well")
      ->check(CLI::ExistingFile);
  app.add_option("--vns", vns, "VNs for the --profile rows")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--repeat", repeat, "plannings per figure (the best counts)")->check(CLI::Range(1, 1000));
  bool group_cuts_only = false;
  app.add_flag("--group-cuts-only", group_cuts_only, "section 2c alone (a cut per group)");
  if (const int rc = bench::parseArgs(app, argc, argv); rc >= 0) return rc;
  const Profile syn = synthetic(96);
  if (group_cuts_only) {
    groupCuts(syn, 512, repeat);
    return 0;
  }
  speed("synthetic", syn, 512, repeat);
  cuts("synthetic", syn, 64);
  devices(syn, 512, repeat);
  perLayerTypes(syn, 512, repeat);
  groupCuts(syn, 512, repeat);
  allocation(synthetic(48, 4 * 1024 * 1024, 2), 64);
  Profile two_cores = syn;
  two_cores.host_cores = 2;
  two_cores.compute_contention = 1.1;
  hosts("synthetic, 2 cores", two_cores, 512, repeat);
  if (!profile.empty()) {
    const Profile p = readProfile(profile);
    speed(profile.c_str(), p, vns, repeat);
    cuts(profile.c_str(), p, vns);
    hosts(profile.c_str(), p, vns, repeat);
  }
  return 0;
}
