// The `morph` command: parses arguments and maps errors to exit codes
// (0 success, 2 bad input, 3 the job could not go on).
#include "cli/cli.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <climits>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <numeric>

#include "control/client_commands.h"
#include "control/run_setup.h"
#include "control/runner.h"
#include "core/error.h"
#include "core/job_spec.h"
#include "core/sys.h"
#include "models/export.h"
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

}  // namespace

int morph::morphMain(int argc, char** argv) {
  morph::tuneAllocator();
  // A peer that dies must not kill the process writing to it: Gloo's pairs
  // write without MSG_NOSIGNAL, and every writer here handles EPIPE. Set
  // first, so that workers forked from the zygote and workers started by
  // hand (`morph worker`) ignore SIGPIPE too, not only those exec'd by a
  // manager whose status server happened to ignore it already.
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{"morph: training that decouples the model from the hardware it runs on"};
  app.require_subcommand(1);

  morph::RunOptions run;
  run.self_exe = selfExe(argv[0]);
  auto* run_cmd = app.add_subcommand("run", "run a job (embedded manager and local workers)");
  run_cmd->add_option("job", run.job_path, "job file (TOML)")->required();
  run_cmd->add_option("--workers", run.workers,
                      "worker processes (default: train inside this process)")
      ->check(CLI::Range(1, 4096));
  run_cmd->add_option("--spawn", run.spawn,
                      "of those, how many to start here (the rest join with `morph worker`)")
      ->check(CLI::Range(0, 4096));
  run_cmd->add_option("--steps", run.steps, "override job.steps")->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  run_cmd->add_option("--out", run.out_dir, "output folder (default runs/<job name>)");
  run_cmd->add_option("--port", run.port, "port of the job's store (default: a free one)")
      ->check(CLI::Range(0, 65535));
  run_cmd->add_option("--host", run.host,
                      "the address the job's store listens on and other workers reach this machine by "
                      "(default 127.0.0.1: local workers only; 0.0.0.0 listens on every interface)");
  run_cmd->add_option("--status", run.status,
                      "ADDR:PORT of the live status page, /metrics and /api/status (default 127.0.0.1:0: "
                      "loopback, a free port; printed at start; \"off\": none)");
  run_cmd->add_option("--set", run.overrides, "override a job key: --set batch.global=128");
  run_cmd->add_option("--checkpoint-dir", run.checkpoint_dir,
                      "where checkpoints go (default: checkpoint.dir, else OUT/checkpoints); shared by every host");
  run_cmd->add_option("--resume", run.resume,
                      "continue from the newest intact checkpoint in this folder (e.g. runs/NAME/checkpoints)");
  run_cmd->add_option("--replay", run.replay,
                      "a WSP run's OUT/wsp_log.jsonl: every pull gets what that run's got (same job and mapping; "
                      "docs/wsp.md)");
  run_cmd->add_option("--heartbeat-interval", run.heartbeat_interval_s, "seconds between worker heartbeats")
      ->check(CLI::Range(0.001, 60.0));
  run_cmd->add_option("--heartbeat-timeout", run.heartbeat_timeout_s,
                      "seconds of silence after which a remote worker is declared dead")
      ->check(CLI::Range(0.01, 3600.0));
  run_cmd->add_option("--stages", run.stages, "pipeline depth P (data-parallel width = workers / P)")
      ->check(CLI::Range(1, 4096));
  run_cmd->add_option("--schedule", run.schedule, "pipeline schedule: gpipe, 1f1b (default) or varuna")
      ->check(CLI::IsMember({"gpipe", "1f1b", "varuna"}));
  run_cmd->add_flag("--recompute", run.recompute,
                    "pipeline: keep only each VN's stage input and recompute the forward before backward");
  run_cmd->add_option("--plan", run.plan,
                      "auto (calibrate if needed, plan for --workers, run the best plan) or a plan file (JSON); "
                      "default: an even split");
  run_cmd->add_option("--trace", run.trace, "write a Chrome trace (JSON) of every pipeline rank's actions");
  run_cmd->add_option("--memory-cap", run.memory_cap_mib,
                      "MiB a worker may use: a pipeline stage that would need more is rejected before training")
      ->check(CLI::Range(1.0, 1e9));
  run_cmd->add_option("--resources", run.resources,
                      "devices per worker slot (TOML: types with memory and slowdown; docs/resources.md)");
  run_cmd->add_flag("--quiet", run.quiet, "no progress output");
  std::string run_export;
  run_cmd->add_option("--export", run_export,
                      "when the job ends, write the trained model to FILE (docs/models.md, \"Export\")");

  std::string export_checkpoint, export_job, export_out;
  std::vector<std::string> export_overrides;
  auto* export_cmd = app.add_subcommand("export", "write a checkpoint's model as a file PyTorch loads");
  export_cmd->add_option("CHECKPOINT", export_checkpoint, "a step-* folder, or a folder of them (the newest)")
      ->required();
  export_cmd->add_option("--job", export_job, "the job file the checkpoint was trained from")->required();
  export_cmd->add_option("--out", export_out, "the file to write")->required();
  export_cmd->add_option("--set", export_overrides, "override a job key, as for the run");

  morph::WorkerOptions worker;
  auto* worker_cmd = app.add_subcommand("worker", "join a running job as a worker");
  worker_cmd->add_option("--join", worker.join, "HOST:PORT of the job's manager")->required();
  worker_cmd->add_option("--token-file", worker.token_file,
                         "the job's token (OUT/token of `morph run`; default: $MORPH_TOKEN)");
  worker_cmd->add_option("--connect-timeout", worker.connect_timeout_s, "seconds to wait for the manager")
      ->check(CLI::Range(0.1, 3600.0));

  morph::CalibrateOptions calib;
  calib.self_exe = run.self_exe;
  auto* calib_cmd = app.add_subcommand("calibrate", "measure the job's per-layer and communication costs once");
  calib_cmd->add_option("job", calib.job_path, "job file (TOML)")->required();
  calib_cmd->add_option("--out", calib.out, "profile file (default runs/<job name>/profile.json)");
  calib_cmd->add_option("--set", calib.overrides, "override a job key");
  calib_cmd->add_option("--budget", calib.budget_s, "seconds of measuring rounds over the layers (at least 7 rounds)")->check(CLI::Range(0.01, 60.0));
  calib_cmd->add_option("--resources", calib.resources,
                        "devices (checked; emulated types share this machine's profile, scaled by their slowdown)");
  calib_cmd->add_flag("--quiet", calib.quiet, "no progress output");
  std::string peer_join;
  auto* peer_cmd = app.add_subcommand("calibrate-peer", "");  // started by calibrate; hidden
  peer_cmd->group("");
  peer_cmd->add_option("--join", peer_join)->required();

  morph::SimulateOptions sim;
  auto* sim_cmd = app.add_subcommand("simulate", "predict one plan's step time and memory from a profile");
  sim_cmd->add_option("job", sim.job_path, "job file (TOML)")->required();
  sim_cmd->add_option("--profile", sim.profile, "profile from morph calibrate")->required();
  sim_cmd->add_option("--stages", sim.stages, "pipeline depth P")->check(CLI::Range(1, 4096));
  sim_cmd->add_option("--workers", sim.workers, "workers (D = workers / P; default: one process)")
      ->check(CLI::Range(1, 1 << 20));
  sim_cmd->add_option("--schedule", sim.schedule, "gpipe, 1f1b or varuna")
      ->check(CLI::IsMember({"gpipe", "1f1b", "varuna"}));
  sim_cmd->add_flag("--recompute", sim.recompute, "recompute activations");
  sim_cmd->add_option("--plan", sim.plan, "a plan file (cut, and optionally replicas, schedule, VN shares)");
  sim_cmd->add_option("--set", sim.overrides, "override a job key");
  sim_cmd->add_option("--resources", sim.resources, "devices per worker slot (their slowdowns)");
  sim_cmd->add_flag("--json", sim.json, "one JSON object");

  morph::PlanOptions plan;
  auto* plan_cmd = app.add_subcommand("plan", "search depth, width, schedule, recomputation and cut for N workers");
  plan_cmd->add_option("job", plan.job_path, "job file (TOML)")->required();
  plan_cmd->add_option("--profile", plan.profile, "profile from morph calibrate")->required();
  auto* plan_workers = plan_cmd->add_option("--workers", plan.workers, "workers available")->check(CLI::Range(1, 1 << 20));
  plan_cmd->add_option("--resources", plan.resources, "devices per worker slot (instead of --workers)")
      ->excludes(plan_workers);
  plan_cmd->add_option("--memory-cap", plan.memory_cap_mib, "MiB a worker may use")->check(CLI::Range(1.0, 1e9));
  plan_cmd->add_option("--top", plan.top, "plans to show")->check(CLI::Range(1, 1000));
  plan_cmd->add_option("--out", plan.out, "write the best plan here (for morph run --plan FILE)");
  plan_cmd->add_option("--set", plan.overrides, "override a job key");
  plan_cmd->add_flag("--json", plan.json, "one JSON object");

  std::string ctl_join, ctl_token_file;
  int resize_workers = 0;
  auto* resize_cmd = app.add_subcommand("resize", "ask a running job to grow or shrink");
  resize_cmd->add_option("--join", ctl_join, "HOST:PORT of the job's manager")->required();
  resize_cmd->add_option("--workers", resize_workers, "the new number of workers")->required()->check(CLI::Range(1, 4096));
  resize_cmd->add_option("--token-file", ctl_token_file, "the job's token (OUT/token; default: $MORPH_TOKEN)");
  auto* status_cmd = app.add_subcommand("status", "membership, generation, step and throughput of a running job");
  status_cmd->add_option("--join", ctl_join, "HOST:PORT of the job's manager")->required();
  status_cmd->add_option("--token-file", ctl_token_file, "the job's token (OUT/token; default: $MORPH_TOKEN)");
  int64_t slow_worker = -1;
  double slow_factor = 1.0;
  auto* slow_cmd = app.add_subcommand("slow", "emulate a worker that became F times slower (F = 1 restores it)");
  slow_cmd->add_option("--join", ctl_join, "HOST:PORT of the job's manager")->required();
  slow_cmd->add_option("--worker", slow_worker, "the worker's id (morph status: members)")->required();
  slow_cmd->add_option("--factor", slow_factor, "slowdown factor, 1 to 1000")->required();
  slow_cmd->add_option("--token-file", ctl_token_file, "the job's token (OUT/token; default: $MORPH_TOKEN)");
  auto* view_cmd = app.add_subcommand("view", "serve the status page of a finished run (its --out folder)");
  std::string view_dir, view_status;
  view_cmd->add_option("DIR", view_dir, "the run's output folder, e.g. runs/NAME")->required();
  view_cmd->add_option("--status", view_status, "ADDR:PORT to serve on (default 127.0.0.1:0, printed)");

  // Many jobs on one pool of slots (docs/cluster.md).
  morph::sched::ClusterSimulateOptions csim;
  morph::sched::ClusterGenerateOptions cgen;
  morph::sched::LiveClusterOptions live;
  live.self_exe = run.self_exe;
  live.slots = 0;  // required unless a subcommand runs
  auto* cluster_cmd = app.add_subcommand("cluster", "schedule many jobs on a pool of worker slots (docs/cluster.md)");
  cluster_cmd->require_subcommand(0, 1);
  cluster_cmd->add_option("--slots", live.slots, "worker slots on this machine")->check(CLI::Range(1, 4096));
  cluster_cmd->add_option("--policy", live.policy, "fifo, wfs or morph (default morph)");
  cluster_cmd->add_option("--port", live.port, "port of the scheduler (default: a free one, printed)")
      ->check(CLI::Range(0, 65535));
  cluster_cmd->add_option("--host", live.host, "address to listen on (default 127.0.0.1)");
  cluster_cmd->add_option("--out", live.out, "output folder: token, address, queue.json, jobs/<id>/ (default runs/cluster)");
  cluster_cmd->add_option("--resize-seconds", live.resize_seconds, "resize cost the morph policy weighs (default 0.6)")
      ->check(CLI::Range(0.0, 1e6));
  cluster_cmd->add_flag("--slurm", live.slurm,
                        "inside a Slurm allocation: managers and workers as job steps (slots: SLURM_NTASKS)");
  auto* csim_cmd = cluster_cmd->add_subcommand("simulate", "run a trace of jobs under a policy in simulated time");
  csim_cmd->add_option("trace", csim.trace, "trace (JSON; morph cluster generate writes one)")->required();
  csim_cmd->add_option("--slots", csim.slots, "worker slots")->required()->check(CLI::Range(1, 1 << 20));
  csim_cmd->add_option("--policy", csim.policy, "fifo, wfs or morph (default morph)");
  csim_cmd->add_option("--resize-seconds", csim.resize_seconds,
                       "seconds a resized job makes no progress (default 0.6)")->check(CLI::Range(0.0, 1e6));
  csim_cmd->add_option("--start-seconds", csim.start_seconds,
                       "seconds a started job takes before its first step (default 0)")->check(CLI::Range(0.0, 1e6));
  csim_cmd->add_option("--table-rows", csim.table_rows, "rows of the allocation table (default 40)")
      ->check(CLI::Range(0, 1 << 30));
  csim_cmd->add_flag("--json", csim.json, "one JSON object");
  auto* cgen_cmd = cluster_cmd->add_subcommand("generate", "write a seeded synthetic trace (Poisson arrivals)");
  cgen_cmd->add_option("--jobs", cgen.gen.jobs, "jobs (default 20)")->check(CLI::Range(1, 1 << 20));
  cgen_cmd->add_option("--per-hour", cgen.gen.per_hour, "mean arrivals per hour (default 12)")
      ->check(CLI::Range(1e-6, 1e9));
  cgen_cmd->add_option("--seed", cgen.gen.seed, "random seed (default 1)");
  cgen_cmd->add_option("--max-demand", cgen.gen.max_demand, "largest demand drawn from 1, 2, 4, 8 (default 8)")
      ->check(CLI::Range(1, 8));
  cgen_cmd->add_option("--min-minutes", cgen.gen.min_minutes, "shortest run time at full demand (default 20)")
      ->check(CLI::Range(1e-3, 1e6));
  cgen_cmd->add_option("--max-minutes", cgen.gen.max_minutes, "longest run time at full demand (default 180)")
      ->check(CLI::Range(1e-3, 1e6));
  cgen_cmd->add_option("--max-serial", cgen.gen.max_serial, "largest serial fraction of a step (default 0.1)")
      ->check(CLI::Range(0.0, 1.0));
  cgen_cmd->add_option("--out", cgen.out, "trace file (default: standard output)");
  csim.resolve = morph::plannedStepSeconds;
  const morph::sched::JobValidator validate = [](const std::string& path, const std::vector<std::string>& ov,
                                                 const std::string& profile) {
    const morph::JobSpec job = morph::loadJobFile(path, ov);
    morph::sched::JobFacts f{job.name, job.steps, job.virtual_nodes, {}};
    if (!profile.empty())
      f.step_seconds = morph::plannedStepSeconds(path, profile, static_cast<int>(std::min<int64_t>(job.virtual_nodes, 32)));
    return f;
  };
  live.validate = validate;
  morph::sched::ClusterClientOptions client;
  std::string submit_job;
  int submit_priority = 1, submit_demand = 0;
  std::vector<std::string> submit_overrides;
  std::string submit_profile;
  bool queue_json = false;
  int64_t cancel_id = -1;
  auto* submit_cmd = app.add_subcommand("submit", "queue a job on a running `morph cluster` (prints its id)");
  submit_cmd->add_option("job", submit_job, "job file (TOML; validated before it is queued)")->required();
  submit_cmd->add_option("--cluster", client.cluster, "HOST:PORT of `morph cluster`")->required();
  submit_cmd->add_option("--priority", submit_priority, "priority (default 1; VirtualFlow uses 1, 5, 10)")
      ->check(CLI::Range(1, 1000000));
  submit_cmd->add_option("--demand", submit_demand, "most workers it may use (default: min(VNs, slots))")
      ->check(CLI::Range(1, 4096));
  submit_cmd->add_option("--set", submit_overrides, "override a job key");
  submit_cmd->add_option("--profile", submit_profile,
                         "the job's calibration profile: the morph policy's speed by worker count (default: linear)");
  submit_cmd->add_option("--token-file", client.token_file, "the cluster's token (OUT/token; default: $MORPH_TOKEN)");
  auto* queue_cmd = app.add_subcommand("queue", "the jobs of a running `morph cluster`");
  queue_cmd->add_option("--cluster", client.cluster, "HOST:PORT of `morph cluster`")->required();
  queue_cmd->add_option("--token-file", client.token_file, "the cluster's token (OUT/token; default: $MORPH_TOKEN)");
  queue_cmd->add_flag("--json", queue_json, "one JSON object");
  auto* cancel_cmd = app.add_subcommand("cancel", "cancel a queued or running job of `morph cluster`");
  cancel_cmd->add_option("id", cancel_id, "the job's id (morph submit printed it)")->required();
  cancel_cmd->add_option("--cluster", client.cluster, "HOST:PORT of `morph cluster`")->required();
  cancel_cmd->add_option("--token-file", client.token_file, "the cluster's token (OUT/token; default: $MORPH_TOKEN)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }

  try {
    if (*run_cmd) {
      if (run.workers == 0 && run.spawn >= 0) throw morph::InputError("--spawn needs --workers");
      // Checked here too, not only by the manager: a single-process run
      // would otherwise accept the pair silently.
      if (run.heartbeat_interval_s >= run.heartbeat_timeout_s)
        throw morph::InputError("--heartbeat-interval " + std::to_string(run.heartbeat_interval_s) +
                                " s must be shorter than --heartbeat-timeout " +
                                std::to_string(run.heartbeat_timeout_s) + " s");
      return run_export.empty() ? morph::runJob(run) : runAndExport(run, run_export);
    }
    if (*export_cmd) {
      const morph::JobSpec job = morph::loadJobFile(export_job, export_overrides);
      const int64_t step = morph::exportModel(job, export_checkpoint, export_out);
      std::printf("morph: exported the model of step %lld to %s\n", static_cast<long long>(step), export_out.c_str());
      return 0;
    }
    if (*calib_cmd) return morph::runCalibrate(calib);
    if (*peer_cmd) return morph::runCalibratePeer(peer_join);
    if (*sim_cmd) return morph::runSimulate(sim);
    if (*plan_cmd) {
      if (plan_workers->count() == 0 && plan.resources.empty()) throw morph::InputError("morph plan needs --workers or --resources");
      return morph::runPlan(plan);
    }
    if (*resize_cmd) return morph::runResize(ctl_join, resize_workers, ctl_token_file);
    if (*status_cmd) return morph::runStatus(ctl_join, ctl_token_file);
    if (*slow_cmd) return morph::runSlow(ctl_join, slow_worker, slow_factor, ctl_token_file);
    if (*view_cmd) return morph::runView(view_dir, view_status);
    if (*csim_cmd) return morph::sched::runClusterSimulate(csim);
    if (*cgen_cmd) return morph::sched::runClusterGenerate(cgen);
    if (*cluster_cmd) {
      if (live.slurm && live.slots < 1 && std::getenv("SLURM_NTASKS")) live.slots = std::atoi(std::getenv("SLURM_NTASKS"));
      if (live.slots < 1) throw morph::InputError("morph cluster needs --slots N (or a subcommand: simulate, generate)");
      return morph::sched::runCluster(live);
    }
    if (*submit_cmd)
      return morph::sched::runSubmit(client, submit_job, submit_priority, submit_demand, submit_overrides, submit_profile,
                                     validate);
    if (*queue_cmd) return morph::sched::runQueue(client, queue_json);
    if (*cancel_cmd) return morph::sched::runCancel(client, cancel_id);
    return morph::runWorker(worker);
  } catch (const morph::InputError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "morph: error: %s\n", e.what());
    return 2;
  } catch (const morph::JobError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "morph: job stopped: %s\n", e.what());
    return 3;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "morph: job stopped: %s\n", e.what());
    return 3;
  }
}
