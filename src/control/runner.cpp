// The runner: `morph run` (runJob), in this process (runInProcess) or as
// the manager of worker processes (manager/manager.cpp). What it shares
// with the manager and the worker has a header per concern: after_step.h,
// checkpoints.h, fault_seams.h, run_log.h, run_setup.h.
#include "control/runner.h"

#include <fstream>
#include <optional>
#include <sstream>

#include "control/after_step.h"
#include "control/checkpoints.h"
#include "control/fault_seams.h"
#include "control/manager/manager.h"
#include "control/manager/zygote.h"
#include "control/plan_commands.h"
#include "control/run_log.h"
#include "control/run_setup.h"
#include "core/error.h"
#include "core/job_spec.h"
#include "core/memory_estimate.h"
#include "core/sys.h"
#include "exec/fixed_point.h"
#include "exec/pipeline.h"
#include "plan/resources.h"
#include "plan/vn_shares.h"
#include "status/status_server.h"
#include "wsp/wsp_log.h"

namespace morph {

using json = nlohmann::json;
using namespace detail;

namespace {

// Runs steps until `steps`; the reporter (rank 0) evaluates and emits one
// metrics line per step; `ckpt` (may be null) receives a checkpoint every
// job.checkpoint_every steps. Returns the model hash.
std::string trainLoop(const JobSpec& job, int64_t steps, VnExecutor& tr, const Dataset& test,
                      bool reporter, int workers, int generation, CheckpointWriter* ckpt,
                      const std::function<void(const json&)>& emit) {
  std::optional<CheckpointKeeper> keeper;
  if (ckpt) keeper.emplace(ckpt, job);
  while (tr.core().nextStep() < steps) {
    StepStats st = tr.step();
    // The step is committed: every worker holds its result.
    std::string ckerr;
    if (keeper && dueAfterStep(job, steps, st.step).checkpoint) ckerr = keeper->submit(tr.exportState());
    if (reporter) {
      json line = stepLine(job, steps, st, tr, test, workers, generation);
      if (!ckerr.empty()) line["checkpoint_error"] = ckerr;
      emit(line);
    }
  }
  if (keeper) keeper->flush();
  return tr.hash();
}

int runInProcess(const RunOptions& o, const JobSpec& job) {
  // Before any work: a status port in use is bad input (exit 2).
  const auto status = startStatusPage(o.status, {"", 0, "", job.name, 0,
                                                 job.checkpoint_every > 0 ? checkpointDir(o, job) : "", false});
  pinThreads(job.threads);
  checkBlas(true);
  std::function<void(const std::string&)> say;
  if (!o.quiet) say = [](const std::string& line) { std::printf("morph: %s\n", line.c_str()), std::fflush(stdout); };
  DataPair data = loadData(job, say);
  const int64_t steps = job.resolveSteps(data.train->size());
  const std::string dir = outDir(o, job);
  LocalCommunicator comm;
  VnExecutor tr(job, steps, *data.train, comm);
  if (!o.resume.empty()) resumeFrom(o.resume, tr, true, !o.quiet);
  RunLog log(dir, job, steps, o.quiet, !o.resume.empty());
  if (status) {
    status->setSteps(steps);
    log.setObserver([s = status.get()](const json& l) { s->record(l); });
  }
  auto fs = checkpointFileSystem();
  std::unique_ptr<CheckpointWriter> ckpt;
  if (job.checkpoint_every > 0)
    ckpt = std::make_unique<CheckpointWriter>(checkpointDir(o, job), fs.get(), static_cast<int>(job.checkpoint_keep));
  std::string hash = trainLoop(job, steps, tr, *data.test, true, 1, 0, ckpt.get(),
                               [&](const json& l) { log.record(l); });
  json extra = json::object();
  if (ckpt) extra["checkpoint"] = checkpointTiming(*ckpt);
  writeSummary(dir, job, steps, 1, log, hash, peakRssBytes(), json::array(), extra);
  std::printf("model_hash: %s\n", hash.c_str());
  return 0;
}

// Refuses, before anything is allocated, a job whose local worker processes
// cannot fit this machine's memory (core/memory_estimate.h): each holds the
// dataset; data-parallel workers each hold the whole model, pipeline stages
// together hold one model per P of them.
void checkLocalMemory(const JobSpec& job, const RunOptions& o) {
  const int local = o.workers == 0 ? 1 : o.spawn >= 0 ? o.spawn : o.workers;
  if (local == 0) return;
  const bool pipeline = o.stages > 1 || (!o.plan.empty() && o.plan != "auto");
  const double models = pipeline ? std::max(1.0, static_cast<double>(local) / std::max(1, o.stages)) : local;
  const int64_t available = availableMemoryBytes();
  checkJobFitsMemory(job, models, local, available);
  if (job.sync_mode != SyncMode::kWsp || pipeline || o.workers < 2 || available < 0) return;
  // A WSP virtual worker adds its wave sum, pushes and shard (docs/wsp.md,
  // "Memory and wave"), counted here as a lower bound too: equal shards,
  // and the staleness' pushes only for a job whose steps are known.
  const MemoryEstimate e = estimateJobMemory(job);
  if (e.parameters <= 0) return;  // a TorchScript model: not counted before it is loaded
  WspMemoryInput in;
  in.values = e.parameters + 2;  // batch-norm statistics left out
  in.vws = o.workers;
  in.shard_values = in.values / o.workers;
  in.shard_params = e.parameters / o.workers;
  in.checkpoints = job.checkpoint_every > 0;
  const int64_t clocks = job.steps > 0 ? (job.steps + job.wave - 1) / job.wave : 1;
  checkWspMemory(job.file,
                 "this machine (" + formatBytes(static_cast<double>(available)) + " available for " +
                     std::to_string(local) + " local workers; a lower bound: activations not counted)",
                 static_cast<int64_t>(e.model_bytes + e.data_bytes), in, job.staleness, clocks, available / local);
}

}  // namespace

int runJob(const RunOptions& given) {
  // Local workers are forked from a copy of this process made now, while it
  // runs one thread (control/manager/zygote.h).
  if (given.workers > 0 || given.stages > 1 || !given.plan.empty()) WorkerZygote::start();
  // Read once: the manager sends workers the very text it validated.
  const std::string text = readJobFile(given.job_path);
  JobSpec job = parseJob(text, given.job_path, effectiveOverrides(given));
  checkModel(job);  // a TorchScript model: one forward, before any worker starts
  RunOptions o = given;
  if (!o.resources.empty()) {
    // One worker per listed device; those on "local" are started here.
    const Resources res = readResources(o.resources);
    const int devices = static_cast<int>(res.devices.size());
    if (o.workers == 0) o.workers = devices;
    if (o.workers != devices)
      throw InputError(o.resources + ": lists " + std::to_string(devices) + " devices, but --workers is " +
                       std::to_string(o.workers) + " (one device per worker slot)");
    if (o.spawn < 0) {
      o.spawn = 0;
      for (const Device& d : res.devices) o.spawn += d.host == "local";
    }
  }
  checkLocalMemory(job, o);
  // Numeric environment settings are checked before any work too (workers
  // inherit them and would each fail later).
  bucketBytes();
  exactWire();
  if (!o.schedule.empty() && o.stages <= 1 && o.plan.empty())
    throw InputError("--schedule " + o.schedule + " needs a pipeline (--stages P > 1 or --plan FILE|auto)");
  if (o.plan == "auto") {
    if (o.workers == 0) {
      o.plan.clear();  // one process: there is nothing to choose
      if (o.memory_cap_mib > 0) throw InputError("--plan auto with --memory-cap needs --workers");
    } else {
      o = resolveAutoPlan(o, job);
    }
  }
  const bool pipeline = o.stages > 1 || (!o.plan.empty() && o.plan != "auto");
  if (!pipeline && (o.recompute || !o.trace.empty() || o.memory_cap_mib > 0))
    throw InputError(std::string(o.recompute ? "--recompute" : !o.trace.empty() ? "--trace" : "--memory-cap") +
                     " needs a pipeline (--stages P > 1 or --plan FILE)");
  if (job.sync_mode == SyncMode::kWsp) {
    // docs/wsp.md: a virtual worker is one data-parallel worker process.
    if (pipeline)
      throw InputError(job.file + ": key 'sync.mode': \"wsp\" runs each virtual worker as one data-parallel worker; "
                       "pipelines (--stages, --plan) are not supported in this mode");
    if (o.workers < 2)
      throw InputError(job.file + ": key 'sync.mode': \"wsp\" needs at least two virtual workers (--workers N, N >= 2), got " +
                       std::to_string(std::max(1, o.workers)) + " (one virtual worker is synchronous training: use \"sync\")");
  }
  if (!o.replay.empty()) {
    if (job.sync_mode != SyncMode::kWsp)
      throw InputError("--replay " + o.replay + ": replays a WSP run; " + job.file + " has sync.mode = \"sync\"");
    std::ifstream in(o.replay, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!in) throw InputError("--replay " + o.replay + ": cannot read the file");
    o.replay_text = ss.str();
    // Exit 2 before any work when it does not fit: another worker count, or
    // other VN shares (docs/wsp.md, "VN shares by device speed").
    const ReplayPlan rp = ReplayPlan::parse(o.replay_text, o.replay, o.workers);
    std::vector<double> seconds;
    if (!o.resources.empty()) seconds = deviceVnSeconds(readResources(o.resources), job).seconds;
    std::vector<int64_t> slots;
    for (int64_t s = 0; s < o.workers; ++s) slots.push_back(s);
    rp.checkShares(wspShares(job.virtual_nodes, seconds, slots), o.replay);
  }
  if (o.workers == 0 && pipeline) {
    // One worker per stage by default.
    RunOptions p = o;
    p.workers = o.stages > 1 ? o.stages : 0;
    if (p.workers == 0) throw InputError("--plan FILE needs --workers (a multiple of the plan's stages)");
    return runManager(p, job, text);
  }
  if (o.workers == 0) return runInProcess(o, job);
  return runManager(o, job, text);
}

}  // namespace morph
