#include "control/manager/pipeline_morph.h"

#include <cmath>
#include <cstdio>
#include <fstream>

#include "control/checkpoints.h"
#include "control/manager/membership.h"
#include "control/plan_commands.h"
#include "control/protocol/keys.h"
#include "control/run_log.h"
#include "control/run_setup.h"
#include "control/store_access.h"
#include "core/error.h"
#include "core/memory_estimate.h"
#include "core/model_hash.h"
#include "core/sys.h"
#include "exec/pipeline.h"
#include "models/model.h"
#include "plan/plan_file.h"
#include "plan/planner.h"
#include "plan/vn_shares.h"

namespace morph {

using namespace detail;

void PipelineMorpher::setUp(int workers) {
  target_ = workers;
  setUpPipeline();
}

// Validates the plan before any worker starts: the cut (even or from the
// plan file), its replicas, VN shares and worker slots, the worker count,
// each replica's schedule, the memory cap and each device's memory
// (resources file).
void PipelineMorpher::setUpPipeline() {
  const bool plan_file = !o_.plan.empty() && o_.plan != "auto";
  if (!o_.resources.empty()) res_ = readResources(o_.resources);
  if (res_ && job_.sync_mode == SyncMode::kWsp) {
    // docs/wsp.md, "VN shares by device speed".
    DeviceVnSeconds speeds = deviceVnSeconds(*res_, job_);
    if (!speeds.note.empty()) std::printf("morph: WSP: %s: %s\n", res_->file.c_str(), speeds.note.c_str());
    wsp_vn_seconds_ = std::move(speeds.seconds);
  }
  if (o_.stages <= 1 && !plan_file && !res_) return;
  auto model = buildModel(job_.model, job_.seed);
  std::vector<std::string> names;
  for (size_t l = 0; l < model->size(); ++l) names.push_back(model->layerName(l));
  layer_names_ = names;
  {
    // What moving a layer costs when a pipeline morphs: its tensors and
    // their optimiser state (SGD momentum: one copy; AdamW: two).
    const int64_t copies = job_.optim.name == "adamw" ? 3 : job_.optim.momentum > 0 ? 2 : 1;
    for (size_t l = 0; l < model->size(); ++l) {
      int64_t b = 0;
      for (const auto& p : model->layer(l).parameters()) b += copies * p.numel() * p.element_size();
      for (const auto& t : model->layer(l).buffers()) b += t.numel() * t.element_size();
      layer_bytes_.push_back(b);
      for (auto& [alias, owner] : model->layer(l).tiedLeaves())
        for (size_t o = 0; o < model->size(); ++o)
          for (const auto& p : model->layer(o).parameters())
            if (p.unsafeGetTensorImpl() == owner.unsafeGetTensorImpl()) tied_layers_.push_back({l, o});
    }
  }
  PlanFile pf;
  if (plan_file) {
    pf = readPlanFile(o_.plan, names, job_.virtual_nodes);
    if (o_.stages > 1 && o_.stages != pf.stages())
      throw InputError("--stages " + std::to_string(o_.stages) + " disagrees with " + o_.plan + " (" +
                       std::to_string(pf.stages()) + " stages)");
  } else if (job_.model.name == "torchscript" && static_cast<size_t>(o_.stages) > model->size()) {
    throw InputError(job_.model.path + ": --stages " + std::to_string(o_.stages) + ", but the model has " +
                     std::to_string(model->size()) + " layers (each stage needs at least one; model.cuts " +
                     "can cut at other cut points: docs/models.md)");
  } else {
    pf.cuts = evenCuts(model->size(), o_.stages);
  }
  plan_workers_ = pf.workers;
  if (!plan_workers_.empty()) {
    // The plan names the worker slots it runs on; the other workers started
    // are released at the first generation.
    for (int slot : plan_workers_)
      if (slot >= o_.workers)
        throw InputError(o_.plan + ": key 'workers': slot " + std::to_string(slot) + " but only " +
                         std::to_string(o_.workers) + " workers (--workers)");
    target_ = static_cast<int>(plan_workers_.size());
  }
  const std::vector<size_t>& cuts = pf.cuts;
  const int P = pf.stages();
  if (!o_.schedule.empty() && pf.schedule && *pf.schedule != parseScheduleKind(o_.schedule))
    throw InputError("--schedule " + o_.schedule + " disagrees with " + o_.plan + " (schedule " +
                     toString(*pf.schedule) + ")");
  const ScheduleKind kind = !o_.schedule.empty() ? parseScheduleKind(o_.schedule)
                                                 : pf.schedule.value_or(ScheduleKind::k1F1B);
  const bool recompute = o_.recompute || pf.recompute.value_or(false);
  if (pf.replicas && target_ != P * *pf.replicas)
    throw InputError(o_.plan + ": key 'replicas': the plan runs " + std::to_string(*pf.replicas) + " replicas of " +
                     std::to_string(P) + " stages (" + std::to_string(P * *pf.replicas) + " workers), not --workers " +
                     std::to_string(target_));
  if (P < 2) {  // one stage: plain data parallelism, perhaps with the plan's VN shares
    dp_shares_ = pf.vn_shares;
    if (res_) checkDeviceMemory(cuts, {kind, 1, 1, false}, names);
    return;
  }
  if (target_ % P != 0)
    throw InputError("--workers " + std::to_string(target_) + " is not a multiple of the " +
                     std::to_string(P) + " pipeline stages (data-parallel width = workers / stages)");
  const int D = target_ / P;
  if (job_.virtual_nodes < D)
    throw InputError("batch.virtual_nodes = " + std::to_string(job_.virtual_nodes) + " cannot feed " +
                     std::to_string(D) + " pipeline replicas (each needs at least one VN)");
  const std::vector<VnRange> ranges = pf.vn_shares.empty() ? evenRanges(job_.virtual_nodes, D) : rangesOf(pf.vn_shares);
  int64_t M = 0;  // the largest replica share
  for (const VnRange& r : ranges) {
    M = std::max(M, r.size());
    ScheduleOptions so{kind, P, r.size(), recompute};
    validateSchedule(makeSchedule(so), so);
  }
  std::printf("morph: pipeline of %d stages x %d replicas, schedule %s%s, cut: %s\n", P, D,
              toString(kind).c_str(), recompute ? " with recomputation" : "", describeCuts(names, cuts).c_str());
  if (o_.memory_cap_mib > 0) {
    DataPair data = loadDatasets(job_.data, job_.seed);
    const int64_t cap = static_cast<int64_t>(o_.memory_cap_mib * 1048576.0);
    auto mem = estimateStageMemory(job_, cuts, {kind, P, M, recompute}, *data.train);
    for (int k = 0; k < P; ++k) {
      const StageMemory& m = mem[static_cast<size_t>(k)];
      auto mib = [](int64_t b) { return std::to_string((b + 524288) / 1048576); };
      if (!o_.quiet)
        std::printf("morph: stage %d needs about %s MiB (process %s, largest other layer while building %s; "
                    "training %s: parameters %s, optimiser %s, gradients %s, checkpoint snapshot %s, "
                    "activations %s = %lld VNs x %s)\n",
                    k, mib(m.total()).c_str(), mib(m.runtime_bytes).c_str(), mib(m.init_bytes).c_str(),
                    mib(m.training()).c_str(),
                    mib(m.model_bytes).c_str(), mib(m.optimizer_bytes).c_str(),
                    mib(m.accumulator_bytes + m.grad_bytes).c_str(), mib(m.snapshot_bytes).c_str(),
                    mib(m.activation_bytes).c_str(),
                    static_cast<long long>(m.live_vns),
                    mib(recompute && k + 1 < P ? m.vn_input_bytes : m.vn_activation_bytes).c_str());
      if (m.total() > cap)
        throw InputError("--memory-cap " + std::to_string(static_cast<int64_t>(o_.memory_cap_mib)) +
                         " MiB: pipeline stage " + std::to_string(k) + " (" +
                         describeCuts(names, {cuts[k], cuts[k + 1]}) + ") needs about " + mib(m.total()) +
                         " MiB, of which activations " + mib(m.activation_bytes) + " MiB (" +
                         std::to_string(m.live_vns) + " VNs stashed by " + toString(kind) +
                         "); use more stages, --recompute, 1f1b, or more VNs per batch");
    }
  }
  if (res_) checkDeviceMemory(cuts, {kind, P, M, recompute}, names);
  pipeline_ = PipelineLayout{P, D, cuts, toString(kind), recompute, !o_.trace.empty(), ranges};
  // Morphs re-plan with the profile --plan auto chose by; devices of a
  // resources file use the rule (its slots change meaning as workers go).
  if (!o_.profile.empty() && !res_) profile_ = readProfile(o_.profile);
}

// Morph's own accounting of each device's memory (resources file): the
// stage estimate of --memory-cap against the cap of the device each world
// rank runs on. Exit 2 naming the device, the stage and both sizes.
void PipelineMorpher::checkDeviceMemory(const std::vector<size_t>& cuts, const ScheduleOptions& so,
                                const std::vector<std::string>& names) {
  DataPair data = loadDatasets(job_.data, job_.seed);
  const auto mem = estimateStageMemory(job_, cuts, so, *data.train);
  const int P = so.stages;
  // A WSP virtual worker (P = 1) holds a data-parallel worker's memory plus
  // its wave sum, pushes and server shard (core/memory_estimate.h,
  // docs/wsp.md "Memory and wave"), sized from the same estimate.
  WspMemoryInput wsp;
  int64_t clocks = 0;
  if (job_.sync_mode == SyncMode::kWsp && P == 1) {
    const StageMemory& m = mem[0];
    const double params = static_cast<double>(m.grad_bytes) / 4;  // float32 gradients
    wsp.values = params + static_cast<double>(m.model_bytes - m.grad_bytes) / 4 + 2;  // + running statistics, loss
    double largest = 0;  // a shard holds at most values / W plus one tensor
    const std::vector<char> none;
    for (const auto& shape : buildModel(job_.model, job_.seed, &none)->parameterShapes()) {
      double n = 1;
      for (int64_t d : shape) n *= static_cast<double>(d);
      largest = std::max(largest, n);
    }
    wsp.vws = target_;
    wsp.shard_values = std::min(wsp.values, wsp.values / target_ + largest);
    wsp.shard_params = wsp.shard_values * params / wsp.values;
    wsp.optim_copies = m.grad_bytes > 0 ? static_cast<int>(m.optimizer_bytes / m.grad_bytes) : 0;
    wsp.checkpoints = job_.checkpoint_every > 0;
    const int64_t steps = job_.steps > 0 ? job_.steps : job_.resolveSteps(data.train->size());
    clocks = (steps + job_.wave - 1) / job_.wave;
  }
  for (int r = 0; r < target_; ++r) {
    const size_t slot = plan_workers_.empty() ? static_cast<size_t>(r) : static_cast<size_t>(plan_workers_[static_cast<size_t>(r)]);
    const DeviceType& t = res_->typeOf(slot);
    const int64_t need = mem[static_cast<size_t>(r % P)].total();
    if (need > t.memory_bytes)
      throw InputError(res_->file + ": worker slot " + std::to_string(slot) + " (type " + t.name + ", " +
                       std::to_string(t.memory_bytes >> 20) + " MiB) cannot hold " +
                       (P > 1 ? "stage " + std::to_string(r % P) + " (" +
                                    describeCuts(names, {cuts[static_cast<size_t>(r % P)], cuts[static_cast<size_t>(r % P) + 1]}) + ")"
                              : std::string("the model")) +
                       ": it needs about " + std::to_string((need + 524288) >> 20) + " MiB, " +
                       std::to_string((need - t.memory_bytes + 524288) >> 20) + " MiB more");
    if (wsp.values > 0)
      checkWspMemory(job_.file, "worker slot " + std::to_string(slot) + " (type " + t.name + " of " + res_->file + ")",
                     need, wsp, job_.staleness, clocks, t.memory_bytes);
  }
}

// Chrome trace-event JSON (Perfetto, chrome://tracing): one process per
// replica, one thread per stage, one complete event per action.
void PipelineMorpher::writeTrace(c10d::Store& store, const std::vector<int64_t>& members) {
  const int P = pipeline_->stages;
  json events = json::array();
  std::vector<std::pair<int, json>> ranks;
  double t0 = INFINITY;
  for (size_t r = 0; r < members.size(); ++r) {
    const std::string k = keys::trace(members[r]);
    if (!store.check({k})) continue;
    json ev = json::parse(getString(store, k));
    for (const auto& e : ev) t0 = std::min(t0, e.at(2).get<double>());
    ranks.emplace_back(static_cast<int>(r), std::move(ev));
  }
  for (auto& [r, ev] : ranks) {
    const int stage = r % P, replica = r / P;
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", replica}, {"tid", stage},
                      {"args", {{"name", "replica " + std::to_string(replica)}}}});
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", replica}, {"tid", stage},
                      {"args", {{"name", "stage " + std::to_string(stage) + " (rank " + std::to_string(r) + ")"}}}});
    for (const auto& e : ev) {
      const std::string name = e.at(0).get<std::string>();
      const double a = e.at(2).get<double>(), b = e.at(3).get<double>();
      events.push_back({{"name", name},
                        {"cat", name.substr(0, name.find(" vn"))},
                        {"ph", "X"},
                        {"pid", replica},
                        {"tid", stage},
                        {"ts", (a - t0) * 1e6},
                        {"dur", (b - a) * 1e6},
                        {"args", {{"step", e.at(1)}}}});
    }
  }
  std::ofstream out(o_.trace, std::ios::trunc);
  out << json({{"traceEvents", events}, {"displayTimeUnit", "ms"}}).dump() << '\n';
  if (!out) throw JobError(o_.trace + ": cannot write the trace");
  if (!o_.quiet) std::printf("morph: trace of %zu actions in %s\n", events.size(), o_.trace.c_str());
}

// The pipeline's figures for summary.json (and the Chrome trace): the
// measured bubble fraction over the steady steps, the formula's, the mean
// step time and each stage's peak memory.
json PipelineMorpher::pipelineResults(const std::vector<json>& results, int64_t first_step, int64_t steps) {
  const int P = pipeline_->stages;
  json out = planSummary();
  out["bubble_formula"] = bubbleFraction(P, pipeline_->replica_ranges.at(0).size());
  std::map<int64_t, std::vector<std::array<double, 3>>> per_step;  // step -> (start, end, busy) per rank
  std::vector<int64_t> stage_peak(static_cast<size_t>(P), 0), stage_params(static_cast<size_t>(P), 0),
      stage_peak_params(static_cast<size_t>(P), 0);
  for (const json& r : results) {
    const int s = r.at("stage").get<int>();
    stage_peak[static_cast<size_t>(s)] = std::max(stage_peak[static_cast<size_t>(s)], r.at("peak_rss_bytes").get<int64_t>());
    stage_params[static_cast<size_t>(s)] = std::max(stage_params[static_cast<size_t>(s)], r.at("param_bytes").get<int64_t>());
    stage_peak_params[static_cast<size_t>(s)] =
        std::max(stage_peak_params[static_cast<size_t>(s)], r.at("peak_param_bytes").get<int64_t>());
    for (const auto& t : r.at("timings"))
      per_step[t.at(0).get<int64_t>()].push_back({t.at(1).get<double>(), t.at(2).get<double>(), t.at(3).get<double>()});
  }
  out["stage_peak_rss_bytes"] = stage_peak;
  out["stage_param_bytes"] = stage_params;  // parameters held at the end (the trainer's accounting)
  out["stage_peak_param_bytes"] = stage_peak_params;  // the most any worker of the stage ever held
  double bubble = 0, span_sum = 0;
  int64_t n = 0;
  const int64_t skip = first_step + warmupSteps(steps - first_step);
  for (auto& [step, ranks] : per_step) {
    if (step < skip || ranks.size() != results.size()) continue;
    double start = ranks[0][0], end = ranks[0][1];
    for (auto& r : ranks) start = std::min(start, r[0]), end = std::max(end, r[1]);
    const double span = end - start;
    if (span <= 0) continue;
    double b = 0;
    for (auto& r : ranks) b += 1.0 - r[2] / span;
    bubble += b / static_cast<double>(ranks.size());
    span_sum += span;
    ++n;
  }
  out["bubble_fraction"] = n ? bubble / static_cast<double>(n) : NAN;
  out["schedule_seconds"] = n ? span_sum / static_cast<double>(n) : NAN;
  return out;
}

int64_t PipelineMorpher::morphMemoryCap() const {
  int64_t cap = o_.memory_cap_mib > 0 ? static_cast<int64_t>(o_.memory_cap_mib * 1048576.0) : 0;
  if (res_)
    for (size_t slot = 0; slot < res_->devices.size(); ++slot) {
      const int64_t m = res_->typeOf(slot).memory_bytes;
      if (m > 0) cap = cap > 0 ? std::min(cap, m) : m;
    }
  return cap;
}

// The planner's plans a morph weighs: its best few by step time, of which
// the one that costs least over the next K steps, its move included, is
// taken (docs/planner.md, "Morph choices: what a morph moves").
constexpr int kMorphPlans = 5;

const std::vector<PipelineMorpher::MorphTarget>& PipelineMorpher::plannedTargets(int workers) {
  auto it = planned_.find(workers);
  if (it != planned_.end()) return it->second;
  std::vector<MorphTarget>& out = planned_[workers];
  if (workers <= 0) return out;
  PlanRequest rq;
  rq.workers = workers;
  rq.virtual_nodes = job_.virtual_nodes;
  rq.memory_cap_bytes = morphMemoryCap();
  rq.top_k = kMorphPlans;
  rq.sim = simOptionsFor(job_, false);
  try {
    for (const PlanChoice& c : planJob(*profile_, rq).plans) {
      MorphTarget t;
      t.by = "planner";
      t.shape = {c.plan.stages, c.plan.replicas};
      t.cuts = c.plan.cuts.empty() ? evenCuts(layer_names_.size(), 1) : c.plan.cuts;
      t.schedule = toString(c.plan.schedule);
      t.recompute = c.plan.recompute;
      t.vn_shares = c.plan.vn_shares;
      t.predicted_s = c.sim.step_seconds;
      out.push_back(t);
    }
  } catch (const InputError& e) {  // no plan fits the memory cap
    std::printf("morph: the planner finds no plan for %d workers: %s\n", workers, e.what());
  }
  return out;
}

MorphCostInput PipelineMorpher::costInput(std::vector<MorphCandidate> holders, int target_workers,
                                          int64_t steps_left) const {
  MorphCostInput in;
  in.morph.candidates = std::move(holders);
  in.morph.stages = pipeline_->stages;
  in.morph.cuts = pipeline_->cuts;
  in.morph.target = target_workers;
  in.morph.virtual_nodes = job_.virtual_nodes;
  // The profile's per-layer figures (parameters, optimiser state, buffers);
  // the model's own where the profile does not name every layer.
  in.morph.layer_bytes = profile_ && profile_->layers.size() == layer_names_.size() ? layerMoveBytes(*profile_)
                                                                                     : layer_bytes_;
  in.morph.tied = tied_layers_;
  if (profile_) in.p2p = profile_->p2p;
  in.horizon = morphHorizon(steps_left);
  return in;
}

PipelineMorpher::MorphTarget PipelineMorpher::morphTarget(int workers, int target_workers,
                                                          const MorphCostInput* at_hand) {
  workers = std::min(workers, target_workers);
  const size_t L = layer_names_.size();
  const int P = pipeline_->stages;
  const std::vector<size_t> cur_cuts = pipeline_->cuts;
  const int64_t cap = morphMemoryCap();
  MorphTarget t;
  if (profile_) {
    const std::vector<MorphTarget>& plans = plannedTargets(workers);
    if (plans.empty()) {
      t.by = "planner";
      return t;
    }
    if (!at_hand) return plans.front();
    std::vector<MorphCost> costs;
    for (const MorphTarget& c : plans) costs.push_back(morphCost(*at_hand, c.shape, c.cuts, c.predicted_s));
    const size_t i = cheapestMorph(costs);
    t = plans[i];
    t.cost = costs[i];
    const MorphCost& c = costs[i];
    char buf[320];
    int n = std::snprintf(buf, sizeof buf, "the planner's cheapest of %zu plans over the next %lld steps: ",
                          plans.size(), static_cast<long long>(c.horizon));
    if (c.live)
      n += std::snprintf(buf + n, sizeof buf - static_cast<size_t>(n), "moves %.1f MiB in %.1f ms + ",
                         static_cast<double>(c.bytes_moved) / 1048576.0, c.move_seconds * 1e3);
    else
      n += std::snprintf(buf + n, sizeof buf - static_cast<size_t>(n), "%lld steps redone + ",
                         static_cast<long long>(c.steps_redone));
    n += std::snprintf(buf + n, sizeof buf - static_cast<size_t>(n), "%lld x %.2f ms = %.3f s",
                       static_cast<long long>(c.horizon), c.step_seconds * 1e3, c.total_seconds);
    if (i != 0)
      std::snprintf(buf + n, sizeof buf - static_cast<size_t>(n),
                    " (the fastest step, %d x %d at %.2f ms, would cost %.3f s)", plans[0].shape.stages,
                    plans[0].shape.replicas, plans[0].predicted_s * 1e3, costs[0].total_seconds);
    t.figures = buf;
    return t;
  }
  // The rule: stages cut evenly unless the depth stays; each stage's
  // estimate (pipeline.h) must fit the cap.
  t.by = "rule";
  auto cutsFor = [&](int p) { return p == P ? cur_cuts : evenCuts(L, p); };
  const ScheduleKind kind = parseScheduleKind(pipeline_->schedule);
  const bool recompute = pipeline_->recompute;
  std::function<bool(int, int)> fits;
  if (cap > 0)
    fits = [&](int p, int d) {
      auto it = fits_.find({p, d});
      if (it != fits_.end()) return it->second;
      if (!mem_train_) mem_train_ = std::move(loadDatasets(job_.data, job_.seed).train);
      const int64_t M = (job_.virtual_nodes + d - 1) / d;  // the largest replica share
      bool ok = true;
      for (const StageMemory& m : estimateStageMemory(job_, cutsFor(p), {kind, p, M, recompute}, *mem_train_))
        ok = ok && m.total() <= cap;
      return fits_[{p, d}] = ok;
    };
  t.shape = chooseMorphShape(workers, P, target_workers, job_.virtual_nodes, L, fits);
  if (t.shape.workers() > 0) t.cuts = cutsFor(t.shape.stages);
  t.schedule = toString(kind);
  t.recompute = recompute;
  return t;
}

// Growth: the rule grows whenever the workers at hand make a bigger shape;
// the planner when its cheapest plan for them, the state its morph moves
// included, costs less over the next K steps than K steps of the current
// plan by kGrowGain (morphPays()). Checked when the number of waiting
// workers changes and every elastic.grow_interval seconds while some wait.
bool PipelineMorpher::shouldGrow(int size, int joiners, int target_workers, double now, int64_t steps_left) {
  constexpr double kGrowGain = 0.97;
  if (joiners == 0) {
    grow_joiners_ = 0;
    return false;
  }
  if (joiners == grow_joiners_ && now - grow_checked_ < job_.grow_interval) return false;
  grow_joiners_ = joiners;
  grow_checked_ = now;
  const MorphShape cur = pipeline_->shape();
  if (!profile_) {
    const MorphTarget could = morphTarget(size + joiners, target_workers);
    return could.shape.workers() > 0 && could.shape.workers() > cur.workers();
  }
  // From the current placement: every member holds its stage at one step,
  // the other workers at hand nothing. A growth never counts on a
  // checkpoint (no checkpoint_step: a candidate that must reload one is
  // not taken).
  const MorphCostInput at_hand =
      costInput(steadyHolders(cur.stages, cur.replicas, pipeline_->cuts, std::max(0, size + joiners - cur.workers())),
                target_workers, steps_left);
  const MorphTarget could = morphTarget(size + joiners, target_workers, &at_hand);
  if (could.shape.workers() == 0 || !could.cost) return false;
  PlanSpec now_plan;
  now_plan.stages = cur.stages;
  now_plan.replicas = cur.replicas;
  now_plan.cuts = pipeline_->cuts;
  now_plan.schedule = parseScheduleKind(pipeline_->schedule);
  now_plan.recompute = pipeline_->recompute;
  now_plan.vn_shares = pipeline_->replicaShares();
  const double now_s = simulate(*profile_, now_plan, simOptionsFor(job_, false)).step_seconds;
  const bool faster = morphPays(*could.cost, now_s, kGrowGain);
  char buf[512];
  std::snprintf(buf, sizeof buf, "%d x %d predicted %.2f ms per step against %.2f ms now; %s, against %lld x %.2f ms = %.3f s",
                could.shape.stages, could.shape.replicas, could.predicted_s * 1e3, now_s * 1e3, could.figures.c_str(),
                static_cast<long long>(could.cost->horizon), now_s * 1e3,
                static_cast<double>(could.cost->horizon) * now_s);
  if (!faster && grow_said_ != buf) {
    std::printf("morph: %d workers at hand, %d waiting: the planner keeps %d x %d (%s)\n", size + joiners, joiners,
                cur.stages, cur.replicas, buf);
    grow_said_ = buf;
  }
  return faster;
}

PipelineMorph PipelineMorpher::publishMorph(std::vector<int64_t>& members, const std::vector<int64_t>& survivors,
                                   const std::map<int64_t, MemberReport>& reports,
                                           const std::vector<int64_t>& waiting, int target_workers,
                                           const MeasuredShares& measured, std::vector<int64_t>& released,
                                           int64_t steps_left) {
  const double t0 = nowSeconds();
  MorphInput in;
  in.stages = pipeline_->stages;
  in.cuts = pipeline_->cuts;
  in.target = target_workers;
  in.virtual_nodes = job_.virtual_nodes;
  in.layer_bytes = layer_bytes_;
  in.tied = tied_layers_;
  for (int64_t id : survivors) {
    const MemberReport& r = reports.at(id);
    MorphCandidate c;
    c.id = id;
    c.step = r.committed;
    // The layers it holds at that step, and whether the next step is
    // prepared (none when it reported no layers of this model).
    if (r.held && r.held->hi <= layer_names_.size())
      c.held_lo = r.held->lo, c.held_hi = r.held->hi, c.prepared = r.held->prepared;
    in.candidates.push_back(c);
  }
  for (int64_t id : waiting) in.candidates.push_back({id, -1, 0, 0});
  // The newest intact checkpoint, looked up (it is read and checked) only
  // when some candidate or the morph itself cannot go live.
  const std::string cdir = checkpointDir(o_, job_);
  int64_t ck_step = -2;
  auto checkpointStep = [&] {
    if (ck_step == -2) ck_step = job_.checkpoint_every > 0 ? newestGoodCheckpoint(cdir) : -1;
    return ck_step;
  };
  std::optional<MorphCostInput> at_hand;
  if (profile_) {
    at_hand = costInput(in.candidates, target_workers, steps_left);
    at_hand->checkpoint_step = checkpointStep;
  }
  const MorphTarget target =
      morphTarget(static_cast<int>(in.candidates.size()), target_workers, at_hand ? &*at_hand : nullptr);
  const MorphShape shape = target.shape;
  if (shape.workers() == 0)
    throw NoWorkerLeft("no pipeline shape fits the " + std::to_string(in.candidates.size()) + " workers left" +
                 (morphMemoryCap() > 0 ? " within the memory cap" : ""));
  const std::vector<size_t>& cuts = target.cuts;
  const MorphPlan mp = planMorph(in, shape, cuts);
  // Spares beyond --workers leave; the others wait for the next change.
  released.clear();
  const size_t keep_spares = static_cast<size_t>(std::max(0, target_workers - shape.workers()));
  for (size_t i = keep_spares; i < mp.spares.size(); ++i) released.push_back(mp.spares[i]);
  PipelineMorph m;
  m.live = mp.live;
  m.step = mp.step;
  m.from = pipeline_->shape();
  m.to = shape;
  std::string how;
  if (mp.live) {
    m.meta_source = mp.meta_source;
    m.transfers = mp.transfers;
    m.expected_bytes = mp.bytes_moved;
    m.finishing = mp.finishing;
    char buf[160];
    std::snprintf(buf, sizeof buf, "%zu layers move between workers (about %.1f MiB)", mp.transfers.size(),
                  static_cast<double>(mp.bytes_moved) / 1048576.0);
    how = buf;
    // Members that lost only the last collective of the step the others
    // committed finish it from their buffers (StepCore::prepared()).
    std::string finishing;
    for (int r : mp.finishing)
      finishing += (finishing.empty() ? "" : ", ") + std::to_string(mp.members[static_cast<size_t>(r)]);
    if (!finishing.empty())
      how += "; worker " + finishing + " finishes step " + std::to_string(mp.step - 1) +
             " from its buffer (it lost only the step's last collective)";
  } else {
    // Some layer has no holder at the newest step: every member reloads
    // from the newest checkpoint and the steps since are done again.
    const int64_t ck = checkpointStep();
    if (ck < 0)
      throw NoWorkerLeft("pipeline cannot morph: " + mp.why_not_live + ", and there is no checkpoint to restore it from");
    m.checkpoint = cdir + "/" + checkpointDirName(ck);
    m.steps_redone = std::max<int64_t>(0, mp.step - ck);
    how = mp.why_not_live + ": every stage reloads the checkpoint of step " + std::to_string(ck) + " and " +
          std::to_string(std::max<int64_t>(0, mp.step - ck)) + " steps are done again";
  }
  // VNs per replica: by measured speed after a straggler re-plan (the
  // placement's replicas), else the planner's, else even.
  std::vector<int64_t> shares = target.vn_shares;
  if (measured)
    if (auto m_shares = measured(mp.members, shape.stages)) shares = *m_shares;
  const std::vector<VnRange> ranges = shares.size() == static_cast<size_t>(shape.replicas)
                                          ? rangesOf(shares)
                                          : evenRanges(job_.virtual_nodes, shape.replicas);
  const bool schedule_changes = target.schedule != pipeline_->schedule || target.recompute != pipeline_->recompute;
  const MorphShape was = pipeline_->shape();
  pipeline_->stages = shape.stages;
  pipeline_->replicas = shape.replicas;
  pipeline_->cuts = cuts;
  pipeline_->replica_ranges = ranges;
  pipeline_->schedule = target.schedule;
  pipeline_->recompute = target.recompute;
  m.planning_seconds = nowSeconds() - t0;
  m.chosen_by = target.by;
  m.to_cuts = cuts;
  std::string why = target.by != "planner" ? "the rule"
                    : !target.figures.empty()
                        ? target.figures
                        : "the planner's choice, predicted " + std::to_string(target.predicted_s * 1e3).substr(0, 6) +
                              " ms per step";
  if (schedule_changes) why += ", schedule " + target.schedule + (target.recompute ? " with recomputation" : "");
  std::printf("morph: pipeline morphs from %d stages x %d replicas to %d x %d (cut: %s; %s); %s\n", was.stages,
              was.replicas, shape.stages, shape.replicas, describeCuts(layer_names_, cuts).c_str(), why.c_str(),
              how.c_str());
  members = mp.members;
  return m;
}

// A pipeline job's model hash from each stage's layer hashes
// (core/model_hash.h): no worker needs the whole model for it.
std::string PipelineMorpher::pipelineHash(const std::map<int, std::string>& stage_hashes) {
  std::vector<std::pair<std::string, std::string>> layers;
  const int P = pipeline_->stages;
  for (int k = 0; k < P; ++k)
    if (!stage_hashes.count(k))
      throw NoWorkerLeft("no worker of pipeline stage " + std::to_string(k) +
                   " reported the end of training (see its error above)");
  for (const auto& [stage, sh] : stage_hashes) {
    size_t a = 0;
    while (a <= sh.size()) {
      const size_t b = std::min(sh.find(',', a), sh.size());
      layers.emplace_back("", sh.substr(a, b - a));
      a = b + 1;
    }
  }
  if (layers.size() != layer_names_.size())
    throw JobError("the stages reported " + std::to_string(layers.size()) + " layer hashes for " +
                   std::to_string(layer_names_.size()) + " layers: a bug in Morph, please report it");
  for (size_t l = 0; l < layers.size(); ++l) layers[l].first = layer_names_[l];
  return layeredHash(layers);
}

}  // namespace morph
