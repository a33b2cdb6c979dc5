// The `morph` command line: its subcommands and options parsed into one
// Invocation, the checks that need nothing but the arguments and the job
// file, and the mapping of errors to exit codes. No libtorch here: the
// `morph` front (front_main.cpp) runs it before deciding whether the
// command needs the training engine (cli.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "control/runner.h"
#include "sched/cluster_command.h"
#include "sched/cluster_live.h"

namespace morph {

struct Invocation {
  enum class Command {
    kRun, kExport, kWorker, kCalibrate, kCalibratePeer, kSimulate, kPlan, kResize, kStatus, kSlow, kView,
    kClusterSimulate, kClusterGenerate, kCluster, kSubmit, kQueue, kCancel
  };
  Command command = Command::kRun;

  RunOptions run;
  std::string run_export;  // run --export FILE
  std::string export_checkpoint, export_job, export_out;
  std::vector<std::string> export_overrides;
  WorkerOptions worker;
  CalibrateOptions calib;
  std::string peer_join;
  SimulateOptions sim;
  PlanOptions plan;
  bool plan_workers_given = false;
  std::string ctl_join, ctl_token_file;  // resize, status, slow
  int resize_workers = 0;
  std::vector<int64_t> resize_release;  // resize --release: worker ids released first
  int64_t slow_worker = -1;
  double slow_factor = 1.0;
  std::string view_dir, view_status;
  sched::ClusterSimulateOptions csim;
  sched::ClusterGenerateOptions cgen;
  sched::LiveClusterOptions live;
  sched::ClusterClientOptions client;  // submit, queue, cancel
  std::string submit_job;
  int submit_priority = 1, submit_demand = 0;
  std::vector<std::string> submit_overrides;
  std::string submit_profile;
  bool queue_json = false;
  int64_t cancel_id = -1;
};

// Parses the arguments into `inv`. Returns -1 when inv.command is to run;
// otherwise the process's exit code, the help or the error already printed
// (0 for --help, 2 for bad arguments).
int parseCommandLine(int argc, char** argv, Invocation& inv);

// The checks of argument combinations that no option check covers
// (InputError): made before any work, wherever the command runs.
void checkArguments(const Invocation& inv);

// The value of GLIBC_TUNABLES the engine runs with, given the caller's
// (null: unset): glibc's malloc on transparent huge pages
// (glibc.malloc.hugetlb=1, madvise mode) added, unless the caller chose a
// glibc.malloc.hugetlb of its own. The front sets it before exec'ing the
// engine (tunables are read when a process starts); workers and peers the
// engine starts inherit it. docs/performance.md, "Huge pages".
std::string hugePageTunables(const char* glibc_tunables);

// Runs `command` and maps what it throws to the exit code, with one line
// on stderr: InputError 2 ("morph: error: ..."), JobError and any other
// exception 3 ("morph: job stopped: ...").
int exitCodeOf(const std::function<int()>& command);

}  // namespace morph
