// The `morph` command in the training engine: every subcommand
// (command_line.h parses them; 0 success, 2 bad input, 3 the job could not
// go on).
#include "cli/cli.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <numeric>

#include "cli/command_line.h"
#include "control/client_commands.h"
#include "control/run_setup.h"
#include "control/runner.h"
#include "core/error.h"
#include "core/job_spec.h"
#include "core/sys.h"
#include "models/export.h"
#include "plan/resources.h"
#include "sched/cluster_command.h"
#include "sched/cluster_live.h"
#include "status/status_server.h"

namespace {

std::string selfExe(const char* argv0) {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(argv0) : p.string();
}

// morph run JOB --export FILE (docs/models.md, "Export"): the run
// checkpoints its last step (checkpoint.every becomes the greatest common
// divisor of itself and the step count, the step count when it is off),
// then that checkpoint is exported.
int runAndExport(morph::RunOptions run, const std::string& file) {
  morph::JobSpec job = morph::loadJobFile(run.job_path, morph::detail::effectiveOverrides(run));
  if (job.steps <= 0)
    throw morph::InputError("--export needs the job's step count: set job.steps (or --steps) instead of job.epochs");
  const int64_t every = job.checkpoint_every > 0 ? std::gcd(job.checkpoint_every, job.steps) : job.steps;
  run.overrides.push_back("checkpoint.every=" + std::to_string(every));
  const int rc = morph::runJob(run);
  if (rc != 0) return rc;
  job = morph::loadJobFile(run.job_path, morph::detail::effectiveOverrides(run));
  const int64_t step = morph::exportModel(job, morph::detail::checkpointDir(run, job), file);
  if (step != job.steps)
    throw morph::JobError("--export: the newest checkpoint is of step " + std::to_string(step) + ", not the last (" +
                          std::to_string(job.steps) + ")");
  if (!run.quiet) std::printf("morph: exported the model of step %lld to %s\n", static_cast<long long>(step), file.c_str());
  return 0;
}

// A resources file's device types as cluster slot types (docs/cluster.md,
// "Slot types"): the types that have devices, in the file's type order
// (by name), each with its device count.
std::vector<morph::sched::SlotType> slotTypesOf(const std::string& path) {
  std::vector<morph::sched::SlotType> out;
  if (path.empty()) return out;
  const morph::Resources res = morph::readResources(path);
  for (const auto& [name, t] : res.types) {
    morph::sched::SlotType s;
    s.name = name;
    s.slowdown = t.slowdown;
    s.memory_mib = static_cast<double>(t.memory_bytes) / 1048576.0;
    for (const morph::Device& d : res.devices) s.count += d.type == name;
    if (s.count > 0) out.push_back(s);
  }
  return out;
}

// Allocations by type the planner is asked about for one job, at most.
constexpr int64_t kMaxTypedAllocations = 2000;

// A job's speed from its profile: by worker count and, with slot types, by
// slots per type (the planner on those devices).
morph::sched::Speed plannedSpeed(const std::string& job, const std::string& profile, int max_workers,
                                 const std::string& resources, const std::vector<morph::sched::SlotType>& types) {
  std::map<std::vector<int>, double> by_type;
  if (!types.empty()) {
    std::vector<std::string> names;
    std::vector<int> counts;
    for (const auto& t : types) names.push_back(t.name), counts.push_back(t.count);
    by_type = morph::plannedStepSecondsByType(job, profile, max_workers, resources, names, counts,
                                              kMaxTypedAllocations);
  }
  return morph::sched::Speed(morph::plannedStepSeconds(job, profile, max_workers), by_type);
}

// What the cluster scheduler checks of a job file before queueing it (and
// its planned step time when a profile is given, by slot type with a
// resources file).
morph::sched::JobFacts validateJob(const std::string& path, const std::vector<std::string>& ov,
                                   const std::string& profile, const std::string& resources = {},
                                   const std::vector<morph::sched::SlotType>& types = {}) {
  const morph::JobSpec job = morph::loadJobFile(path, ov);
  morph::sched::JobFacts f{job.name, job.steps, job.virtual_nodes, {}, {}};
  if (!profile.empty()) {
    const morph::sched::Speed s =
        plannedSpeed(path, profile, static_cast<int>(std::min<int64_t>(job.virtual_nodes, 32)), resources, types);
    f.step_seconds = s.table();
    f.step_seconds_by_type = s.byType();
  }
  return f;
}

int dispatch(morph::Invocation& inv) {
  using C = morph::Invocation::Command;
  morph::checkArguments(inv);
  switch (inv.command) {
    case C::kRun:
      return inv.run_export.empty() ? morph::runJob(inv.run) : runAndExport(inv.run, inv.run_export);
    case C::kExport: {
      const morph::JobSpec job = morph::loadJobFile(inv.export_job, inv.export_overrides);
      const int64_t step = morph::exportModel(job, inv.export_checkpoint, inv.export_out);
      std::printf("morph: exported the model of step %lld to %s\n", static_cast<long long>(step),
                  inv.export_out.c_str());
      return 0;
    }
    case C::kWorker: return morph::runWorker(inv.worker);
    case C::kCalibrate: return morph::runCalibrate(inv.calib);
    case C::kCalibratePeer: return morph::runCalibratePeer(inv.peer_join);
    case C::kSimulate: return morph::runSimulate(inv.sim);
    case C::kPlan: return morph::runPlan(inv.plan);
    case C::kResize: return morph::runResize(inv.ctl_join, inv.resize_workers, inv.ctl_token_file, inv.resize_release);
    case C::kStatus: return morph::runStatus(inv.ctl_join, inv.ctl_token_file);
    case C::kSlow: return morph::runSlow(inv.ctl_join, inv.slow_worker, inv.slow_factor, inv.ctl_token_file);
    case C::kView: return morph::runView(inv.view_dir, inv.view_status);
    case C::kClusterSimulate: {
      auto& csim = inv.csim;
      csim.types = slotTypesOf(csim.resources);
      csim.resolve = [&csim](const std::string& job, const std::string& profile, int max_workers,
                             const std::vector<morph::sched::SlotType>& types) {
        return plannedSpeed(job, profile, max_workers, csim.resources, types);
      };
      return morph::sched::runClusterSimulate(csim);
    }
    case C::kClusterGenerate: return morph::sched::runClusterGenerate(inv.cgen);
    case C::kCluster: {
      auto& live = inv.live;
      live.types = slotTypesOf(live.resources);
      if (!live.types.empty()) {
        // Under Slurm each device's host is a node of the allocation
        // (checked against it by the scheduler: sched::slurmNodes).
        if (live.slurm)
          for (const morph::Device& d : morph::readResources(live.resources).devices)
            live.devices.emplace_back(d.type, d.host);
        int devices = 0;
        for (const auto& t : live.types) devices += t.count;
        if (live.slots == 0) live.slots = devices;
        if (live.slots != devices)
          throw morph::InputError("--resources " + live.resources + ": lists " + std::to_string(devices) +
                                  " devices, but --slots is " + std::to_string(live.slots) + " (one slot per device)");
      }
      if (live.slurm && live.slots < 1 && std::getenv("SLURM_NTASKS")) live.slots = std::atoi(std::getenv("SLURM_NTASKS"));
      if (live.slots < 1) throw morph::InputError("morph cluster needs --slots N (or a subcommand: simulate, generate)");
      live.validate = [&live](const std::string& path, const std::vector<std::string>& ov, const std::string& profile) {
        return validateJob(path, ov, profile, live.resources, live.types);
      };
      return morph::sched::runCluster(live);
    }
    case C::kSubmit:
      return morph::sched::runSubmit(inv.client, inv.submit_job, inv.submit_priority, inv.submit_demand,
                                     inv.submit_overrides, inv.submit_profile,
                                     [](const std::string& path, const std::vector<std::string>& ov,
                                        const std::string& profile) { return validateJob(path, ov, profile); });
    case C::kQueue: return morph::sched::runQueue(inv.client, inv.queue_json);
    case C::kCancel: return morph::sched::runCancel(inv.client, inv.cancel_id);
  }
  return 2;
}

}  // namespace

int morph::morphMain(int argc, char** argv, const std::string& self_exe) {
  morph::tuneAllocator();
  // A peer that dies must not kill the process writing to it: Gloo's pairs
  // write without MSG_NOSIGNAL, and every writer here handles EPIPE. Set
  // first, so that workers forked from the zygote and workers started by
  // hand (`morph worker`) ignore SIGPIPE too, not only those exec'd by a
  // manager whose status server happened to ignore it already.
  std::signal(SIGPIPE, SIG_IGN);
  morph::Invocation inv;
  const int rc = morph::parseCommandLine(argc, argv, inv);
  if (rc >= 0) return rc;
  const std::string self = self_exe.empty() ? selfExe(argv[0]) : self_exe;
  inv.run.self_exe = inv.calib.self_exe = inv.live.self_exe = self;
  return morph::exitCodeOf([&] { return dispatch(inv); });
}
