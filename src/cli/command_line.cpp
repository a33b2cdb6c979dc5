// parseCommandLine, checkArguments, exitCodeOf (command_line.h).
#include "cli/command_line.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>

#include "cli/cli11_parse.h"
#include "control/protocol/worker_label.h"
#include "core/error.h"

int morph::parseCommandLine(int argc, char** argv, Invocation& inv) {
  // The options write straight into the invocation.
  auto& run = inv.run;
  auto& run_export = inv.run_export;
  auto& export_checkpoint = inv.export_checkpoint;
  auto& export_job = inv.export_job;
  auto& export_out = inv.export_out;
  auto& export_overrides = inv.export_overrides;
  auto& worker = inv.worker;
  auto& calib = inv.calib;
  auto& peer_join = inv.peer_join;
  auto& sim = inv.sim;
  auto& plan = inv.plan;
  auto& ctl_join = inv.ctl_join;
  auto& ctl_token_file = inv.ctl_token_file;
  auto& resize_workers = inv.resize_workers;
  auto& slow_worker = inv.slow_worker;
  auto& slow_factor = inv.slow_factor;
  auto& view_dir = inv.view_dir;
  auto& view_status = inv.view_status;
  auto& csim = inv.csim;
  auto& cgen = inv.cgen;
  auto& live = inv.live;
  live.slots = 0;  // required unless a subcommand runs
  auto& client = inv.client;
  auto& submit_job = inv.submit_job;
  auto& submit_priority = inv.submit_priority;
  auto& submit_demand = inv.submit_demand;
  auto& submit_overrides = inv.submit_overrides;
  auto& submit_profile = inv.submit_profile;
  auto& queue_json = inv.queue_json;
  auto& cancel_id = inv.cancel_id;

  CLI::App app{"morph: training that decouples the model from the hardware it runs on"};
  app.require_subcommand(1);

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
  run_cmd->add_option("--export", run_export,
                      "when the job ends, write the trained model to FILE (docs/models.md, \"Export\")");

  auto* export_cmd = app.add_subcommand("export", "write a checkpoint's model as a file PyTorch loads");
  export_cmd->add_option("CHECKPOINT", export_checkpoint, "a step-* folder, or a folder of them (the newest)")
      ->required();
  export_cmd->add_option("--job", export_job, "the job file the checkpoint was trained from")->required();
  export_cmd->add_option("--out", export_out, "the file to write")->required();
  export_cmd->add_option("--set", export_overrides, "override a job key, as for the run");

  auto* worker_cmd = app.add_subcommand("worker", "join a running job as a worker");
  worker_cmd->add_option("--join", worker.join, "HOST:PORT of the job's manager")->required();
  worker_cmd->add_option("--token-file", worker.token_file,
                         "the job's token (OUT/token of `morph run`; default: $MORPH_TOKEN)");
  worker_cmd->add_option("--connect-timeout", worker.connect_timeout_s, "seconds to wait for the manager")
      ->check(CLI::Range(0.1, 3600.0));
  worker_cmd->add_option("--label", worker.label,
                         "a label posted with this worker's id and listed by `morph status` (e.g. its node)");

  auto* calib_cmd = app.add_subcommand("calibrate", "measure the job's per-layer and communication costs once");
  calib_cmd->add_option("job", calib.job_path, "job file (TOML)")->required();
  calib_cmd->add_option("--out", calib.out, "profile file (default runs/<job name>/profile.json)");
  calib_cmd->add_option("--set", calib.overrides, "override a job key");
  calib_cmd->add_option("--budget", calib.budget_s, "seconds of measuring rounds over the layers (at least 7 rounds)")->check(CLI::Range(0.01, 60.0));
  calib_cmd->add_option("--resources", calib.resources,
                        "devices (checked; emulated types share this machine's profile, scaled by their slowdown)");
  calib_cmd->add_flag("--quiet", calib.quiet, "no progress output");
  calib_cmd->add_flag("--no-colocated{false}", calib.colocated,
                      "skip the short real runs of 2 and 3 worker processes that fit the co-located contention "
                      "model (docs/planner.md); the profile keeps the older one");
  auto* peer_cmd = app.add_subcommand("calibrate-peer", "");  // started by calibrate; hidden
  peer_cmd->group("");
  peer_cmd->add_option("--join", peer_join)->required();

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

  auto* resize_cmd = app.add_subcommand("resize", "ask a running job to grow or shrink");
  resize_cmd->add_option("--join", ctl_join, "HOST:PORT of the job's manager")->required();
  resize_cmd->add_option("--workers", resize_workers, "the new number of workers")->required()->check(CLI::Range(1, 4096));
  resize_cmd->add_option("--token-file", ctl_token_file, "the job's token (OUT/token; default: $MORPH_TOKEN)");
  resize_cmd->add_option("--release", inv.resize_release,
                         "worker ids (morph status: members) to release before any other when it shrinks")
      ->delimiter(',');
  auto* status_cmd = app.add_subcommand("status", "membership, generation, step and throughput of a running job");
  status_cmd->add_option("--join", ctl_join, "HOST:PORT of the job's manager")->required();
  status_cmd->add_option("--token-file", ctl_token_file, "the job's token (OUT/token; default: $MORPH_TOKEN)");
  auto* slow_cmd = app.add_subcommand("slow", "emulate a worker that became F times slower (F = 1 restores it)");
  slow_cmd->add_option("--join", ctl_join, "HOST:PORT of the job's manager")->required();
  slow_cmd->add_option("--worker", slow_worker, "the worker's id (morph status: members)")->required();
  slow_cmd->add_option("--factor", slow_factor, "slowdown factor, 1 to 1000")->required();
  slow_cmd->add_option("--token-file", ctl_token_file, "the job's token (OUT/token; default: $MORPH_TOKEN)");
  auto* view_cmd = app.add_subcommand("view", "serve the status page of a finished run (its --out folder)");
  view_cmd->add_option("DIR", view_dir, "the run's output folder, e.g. runs/NAME")->required();
  view_cmd->add_option("--status", view_status, "ADDR:PORT to serve on (default 127.0.0.1:0, printed)");

  // Many jobs on one pool of slots (docs/cluster.md).
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
  cluster_cmd->add_option("--resources", live.resources,
                          "the slots' device types (docs/resources.md; one slot per device, host local)");
  cluster_cmd->add_flag("--slurm", live.slurm,
                        "inside a Slurm allocation: managers and workers as job steps (slots: SLURM_NTASKS)");
  auto* csim_cmd = cluster_cmd->add_subcommand("simulate", "run a trace of jobs under a policy in simulated time");
  csim_cmd->add_option("trace", csim.trace, "trace (JSON; morph cluster generate writes one)")->required();
  csim_cmd->add_option("--slots", csim.slots, "worker slots (default: the devices of --resources)")
      ->check(CLI::Range(1, 1 << 20));
  csim_cmd->add_option("--resources", csim.resources, "the slots' device types (docs/resources.md; one slot per device)");
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

  if (const int rc = parseCli11(app, argc, argv); rc >= 0) return rc;

  using C = Invocation::Command;
  inv.plan_workers_given = plan_workers->count() > 0;
  inv.command = *run_cmd ? C::kRun
              : *export_cmd ? C::kExport
              : *calib_cmd ? C::kCalibrate
              : *peer_cmd ? C::kCalibratePeer
              : *sim_cmd ? C::kSimulate
              : *plan_cmd ? C::kPlan
              : *resize_cmd ? C::kResize
              : *status_cmd ? C::kStatus
              : *slow_cmd ? C::kSlow
              : *view_cmd ? C::kView
              : *csim_cmd ? C::kClusterSimulate
              : *cgen_cmd ? C::kClusterGenerate
              : *cluster_cmd ? C::kCluster
              : *submit_cmd ? C::kSubmit
              : *queue_cmd ? C::kQueue
              : *cancel_cmd ? C::kCancel
              : C::kWorker;
  (void)worker_cmd;
  return -1;
}

void morph::checkArguments(const Invocation& inv) {
  using C = Invocation::Command;
  if (inv.command == C::kRun) {
    const RunOptions& run = inv.run;
    if (run.workers == 0 && run.spawn >= 0) throw InputError("--spawn needs --workers");
    // Checked here too, not only by the manager: a single-process run
    // would otherwise accept the pair silently.
    if (run.heartbeat_interval_s >= run.heartbeat_timeout_s)
      throw InputError("--heartbeat-interval " + std::to_string(run.heartbeat_interval_s) +
                       " s must be shorter than --heartbeat-timeout " + std::to_string(run.heartbeat_timeout_s) + " s");
  }
  if (inv.command == C::kWorker && !inv.worker.label.empty()) {
    const std::string why = WorkerLabel::problem(inv.worker.label);
    if (!why.empty()) throw InputError("--label '" + inv.worker.label + "': " + why);
  }
  if (inv.command == C::kPlan && !inv.plan_workers_given && inv.plan.resources.empty())
    throw InputError("morph plan needs --workers or --resources");
}

std::string morph::hugePageTunables(const char* glibc_tunables) {
  const std::string given = glibc_tunables ? glibc_tunables : "";
  if (given.find("glibc.malloc.hugetlb=") != std::string::npos) return given;
  return given.empty() ? "glibc.malloc.hugetlb=1" : given + ":glibc.malloc.hugetlb=1";
}

int morph::exitCodeOf(const std::function<int()>& command) {
  try {
    return command();
  } catch (const InputError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "morph: error: %s\n", e.what());
    return 2;
  } catch (const JobError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "morph: job stopped: %s\n", e.what());
    return 3;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "morph: job stopped: %s\n", e.what());
    return 3;
  }
}
