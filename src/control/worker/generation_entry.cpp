// syncState and a pipeline member's entry (generation_entry.h).
#include "control/worker/generation_entry.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>

#include "control/checkpoints.h"
#include "core/error.h"
#include "core/sys.h"

namespace morph {

using namespace detail;

void syncState(StepCore& tr, Communicator& comm, int source) {
  if (comm.size() == 1) return;
  std::vector<int64_t> meta = tr.stateMeta();
  torch::Tensor m = torch::tensor(meta, torch::kInt64);
  comm.broadcast(m, source);
  std::vector<torch::Tensor> state = tr.stateTensors();
  std::vector<torch::Tensor> flat;
  for (auto& t : state) {
    MORPH_CHECK(t.scalar_type() == torch::kFloat32, "state tensors are float32");
    flat.push_back(t.detach().reshape({-1}));
  }
  torch::Tensor all = torch::cat(flat);
  comm.broadcast(all, source);
  if (comm.rank() != source) {
    torch::NoGradGuard no_grad;
    int64_t off = 0;
    for (auto& t : state) {
      t.copy_(all.narrow(0, off, t.numel()).view(t.sizes()));
      off += t.numel();
    }
    tr.setStateMeta(std::vector<int64_t>(m.data_ptr<int64_t>(), m.data_ptr<int64_t>() + m.numel()));
  }
}

namespace {

// Pipeline member `rank` (= replica * stages + stage): forms the stage,
// tied and pipe process groups of the generation (every rank in the same
// order: world, stage, tied, pipe) and hands the trainer its place.
void setUpPipeline(StageExecutor& tr, const PipelineLayout& p, int rank, const VnRange& range,
                   std::vector<std::unique_ptr<Communicator>>& comms,
                   const c10::intrusive_ptr<c10d::Store>& store, const std::string& gkey,
                   const GlooOptions& go) {
  PipelinePlacement pl;
  pl.stages = p.stages;
  pl.replicas = p.replicas;
  pl.stage = rank % pl.stages;
  pl.replica = rank / pl.stages;
  pl.cuts = p.cuts;
  pl.schedule = parseScheduleKind(p.schedule);
  pl.recompute = p.recompute;
  PipelineComms pc;
  pc.world = comms.back().get();
  auto group = [&](const std::string& name, int r, int size) {
    try {
      comms.push_back(makeGlooCommunicator(c10::make_intrusive<c10d::PrefixStore>(gkey + "/" + name, store), r,
                                           size, go));
    } catch (const CommFailure&) {
      throw;
    } catch (const std::exception& e) {
      throw CommFailure("cannot form the " + name + " group of generation " + gkey + ": " + e.what());
    }
    return comms.back().get();
  };
  if (pl.replicas > 1) pc.stage = group("stage/" + std::to_string(pl.stage), pl.replica, pl.replicas);
  // A group per set of stages sharing a weight, in the same order everywhere.
  if (pl.stages > 1)
    for (const std::vector<int>& set : tr.tiedStageSets(pl.cuts)) {
      const auto at = std::find(set.begin(), set.end(), pl.stage);
      if (at == set.end()) continue;
      std::string name = "tied";
      for (int k : set) name += "/" + std::to_string(k);
      pc.tied[set] = group(name, static_cast<int>(at - set.begin()) * pl.replicas + pl.replica,
                           static_cast<int>(set.size()) * pl.replicas);
    }
  pc.pipe = group("pipe/" + std::to_string(pl.replica), pl.stage, pl.stages);
  tr.setTracing(p.trace);
  tr.place(pl, range.begin, range.end, pc);
}

}  // namespace

json enterPipelineGeneration(StageExecutor& ex, const GenerationPlan& plan, int rank,
                             std::vector<std::unique_ptr<Communicator>>& comms,
                             const c10::intrusive_ptr<c10d::Store>& store, const std::string& gkey,
                             const GlooOptions& go, HeldLayers& held, std::string& resume_ckpt, double rendezvous_s) {
  const PipelineLayout& p = *plan.pipeline;
  Communicator& world = *comms.back();
  const VnRange& range = plan.vn_ranges.at(static_cast<size_t>(rank));
  const std::optional<PipelineMorph>& morph = plan.morph;
  json out = {{"rendezvous_seconds", rendezvous_s}, {"move_seconds", 0.0}, {"load_seconds", 0.0}, {"bytes_in", 0}};
  const int P = p.stages;
  const std::vector<size_t>& cuts = p.cuts;
  const HeldLayers next{cuts[static_cast<size_t>(rank % P)], cuts[static_cast<size_t>(rank % P) + 1]};
  auto place = [&] {
    // Layers outside the new range are freed, those inside kept.
    held = {std::max(held.lo, next.lo), std::min(held.hi, next.hi), false};
    if (held.lo >= held.hi) held = {};
    const double t0 = nowSeconds();
    setUpPipeline(ex, p, rank, range, comms, store, gkey, go);
    out["rendezvous_seconds"] = out["rendezvous_seconds"].get<double>() + (nowSeconds() - t0);
  };
  // A step this worker lost only the last collective of (StepCore::
  // prepared()) is finished where the plan says so (planMorph: another
  // member committed it, so every member had its sums), else dropped.
  StepCore& sc = ex.core();
  if (sc.prepared()) {
    const std::vector<int> finishing = morph ? morph->finishing : std::vector<int>();
    if (std::find(finishing.begin(), finishing.end(), rank) != finishing.end()) {
      sc.finishPrepared();
    } else {
      sc.discardPrepared();
    }
  }
  if (!morph) {  // the first generation: every member starts from the same state
    place();
    if (!resume_ckpt.empty()) {
      const double t0 = nowSeconds();
      loadHeldLayers(resume_ckpt, ex);
      out["load_seconds"] = nowSeconds() - t0;
    }
  } else if (morph->live) {
    const int64_t step = morph->step;
    if (ex.core().nextStep() != step) held = {};  // what it holds is of another step
    const double t0 = nowSeconds();
    StepCore& core = ex.core();
    torch::Tensor m = torch::tensor(core.stateMeta(), torch::kInt64);
    world.broadcast(m, morph->meta_source);
    core.setStateMeta(std::vector<int64_t>(m.data_ptr<int64_t>(), m.data_ptr<int64_t>() + m.numel()));
    std::vector<LayerTransfer> transfers;
    for (const MorphTransfer& t : morph->transfers) transfers.push_back({t.layer, t.src, t.dst});
    int64_t bytes = 0;
    std::map<size_t, NamedTensors> got = moveLayers(core, world, transfers, &bytes);
    out["move_seconds"] = nowSeconds() - t0;
    out["bytes_in"] = bytes;
    place();
    ex.importLayers(got);
  } else {
    held = {};  // every layer goes back to the checkpoint's step
    const double t0 = nowSeconds();
    const std::string& ck = morph->checkpoint;
    loadStepFrom(ck, ex);
    place();
    loadHeldLayers(ck, ex);
    out["load_seconds"] = nowSeconds() - t0;
  }
  resume_ckpt.clear();
  held = next;
  return out;
}

}  // namespace morph
