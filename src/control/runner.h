// Runner: turns a job into training. Two entry points:
//  - runJob(): `morph run`. Without --workers it trains in this process;
//    with --workers N it becomes the manager (hosts the job's store,
//    computes the VN plan, starts local workers, writes the outputs).
//  - runWorker(): `morph worker --join HOST:PORT`.
// The client commands (resize, status, slow) are in client_commands.h.
// The control plane (manager, worker, store keys) is specified in
// docs/distributed.md and docs/store_protocol.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <map>
#include <string>
#include <vector>

namespace morph {

class FileSystem;  // ckpt/checkpoint_store.h

// The test seam for faults in checkpoint writes: every checkpoint writer of
// this process (and of the workers it starts, if they install the same)
// writes through what `factory` returns. Unset: the real file system. The
// shipped binary never sets it; tests/cli/crashy_main.cpp does.
using FileSystemFactory = std::function<std::unique_ptr<FileSystem>()>;
void setCheckpointFileSystemFactory(FileSystemFactory factory);

// The test seam for control-plane faults: a worker calls it at named points
// with its id — "registering" (it took an id, before announcing its pid),
// "registered" (announced and heart-beating, before loading data),
// "evaluate" (before each evaluation it runs as the reporter) and, in a
// pipeline, "last-sum@STEP" (step STEP's last world collective has ended
// here; a hook that throws CommFailure makes it lost). Unset: nothing
// happens. The shipped binary never sets it; tests/cli/crashy_main.cpp does
// (MORPH_TEST_FAULT), and the workers it starts run that binary too.
using FaultHook = std::function<void(const std::string& point, int64_t worker)>;
void setFaultHook(FaultHook hook);

struct RunOptions {
  std::string job_path;
  std::vector<std::string> overrides;  // --set key=value
  int workers = 0;       // 0: train in this process (no c10d)
  int spawn = -1;        // local workers to start (-1: all of them)
  int64_t steps = 0;     // --steps: overrides job.steps when > 0
  std::string out_dir;   // default runs/<job name>
  int port = 0;          // the store's port, 0 = pick a free one
  // The address the store listens on and workers reach the manager by; the
  // default keeps a local job on loopback. "0.0.0.0": every interface (warned).
  std::string host = "127.0.0.1";
  std::string self_exe;  // path of the morph binary (to start workers)
  bool quiet = false;    // no progress output
  std::string resume;    // checkpoint folder to continue from ("" = start fresh)
  std::string replay;    // a WSP run's OUT/wsp_log.jsonl to replay (docs/wsp.md); its text once runJob read it
  std::string replay_text;
  std::string checkpoint_dir;  // where checkpoints go ("" = checkpoint.dir, else OUT/checkpoints)
  double heartbeat_interval_s = 0.1;  // workers' pulse
  double heartbeat_timeout_s = 2.0;   // silence after which a worker is declared dead
  // Pipeline parallelism (stages > 1): D = workers / stages replicas.
  int stages = 1;
  std::string schedule;           // gpipe | 1f1b | varuna; "" = the plan file's, else 1f1b
  bool recompute = false;         // stash stage inputs, recompute before backward
  std::string plan;               // "": even split; "auto": the planner's choice; else a plan file
  std::string profile;            // set by --plan auto: the profile a pipeline morphs with (docs/pipeline.md)
  std::string trace;              // Chrome trace file of every rank's actions ("" = none)
  double memory_cap_mib = 0;      // per worker; 0 = no check
  std::string resources;          // resources file (devices per worker slot; docs/resources.md)
  std::string status = "127.0.0.1:0";  // --status ADDR:PORT of the status page ("off": none)
};

struct WorkerOptions {
  std::string join;  // HOST:PORT of the manager
  std::string token_file;  // the job token ("" = $MORPH_TOKEN)
  double connect_timeout_s = 10.0;
  std::string label;  // --label: posted under workers/<id>/label before its pid ("" = none)
};

// Both return the process exit code (0, 2 or 3); errors are printed.
int runJob(const RunOptions& opts);
int runWorker(const WorkerOptions& opts);

// `morph calibrate`: measures the job's profile (docs/profile_format.md)
// with this process and one peer process, and writes it.
struct CalibrateOptions {
  std::string job_path;
  std::vector<std::string> overrides;
  std::string out;       // default runs/<job name>/profile.json
  std::string self_exe;  // to start the peer process
  std::string resources; // optional: checked; its emulated types share this machine's profile
  double budget_s = 3.0;  // seconds of measuring rounds over the layers
  bool quiet = false;
  bool colocated = true;  // the co-located run (Profile::host_contention); --no-colocated: the older model
};
int runCalibrate(const CalibrateOptions& opts);
int runCalibratePeer(const std::string& join);  // the peer half (hidden command; token in $MORPH_TOKEN)

// `morph simulate`: one plan's predicted step.
struct SimulateOptions {
  std::string job_path, profile, plan, schedule, resources;
  std::vector<std::string> overrides;
  int stages = 1, workers = 0;
  bool recompute = false, json = false;
};
int runSimulate(const SimulateOptions& opts);

// `morph plan`: the best plans for N workers.
struct PlanOptions {
  std::string job_path, profile, out, resources;
  std::vector<std::string> overrides;
  int workers = 1, top = 5;
  double memory_cap_mib = 0;
  bool json = false;
};
int runPlan(const PlanOptions& opts);

// Seconds per step of a job on 1..max_workers workers (at most its VNs):
// the planner's best plan for each count, from the job's calibration
// profile (checked against the job). A cluster trace job given as a job
// file and a profile (docs/cluster.md).
std::map<int, double> plannedStepSeconds(const std::string& job_path, const std::string& profile_path,
                                         int max_workers);
// The same by slots per device type of a resources file (docs/cluster.md,
// "Slot types"): for every allocation of 1..max_workers slots (at most the
// job's VNs) with at most counts[t] of types[t], the planner's best plan
// on those devices (speed-weighted VN shares, pipelines, slow devices left
// idle). An allocation no plan fits (memory) is left out; an empty table
// when there would be more than max_entries allocations.
std::map<std::vector<int>, double> plannedStepSecondsByType(const std::string& job_path,
                                                            const std::string& profile_path, int max_workers,
                                                            const std::string& resources_path,
                                                            const std::vector<std::string>& types,
                                                            const std::vector<int>& counts, int64_t max_entries);

}  // namespace morph
