// The live cluster scheduler, `morph cluster --slots N`, and its clients
// `morph submit`, `morph queue`, `morph cancel` (docs/cluster.md).
//
// The scheduler owns N worker slots on this machine. Each job runs as an
// ordinary Morph job (`morph run JOB --workers K`, its outputs under
// OUT/jobs/<id>/), and the scheduler changes its worker count through the
// job's own resize path (`morph resize`), so scheduling never changes a
// job's result. On every submission, completion and cancellation it asks
// the policy (policy.h, the same code the simulator runs) for targets and
// applies them: shrinks first; a start or a grow only once the slots are
// free (a shrinking job holds its slots until its metrics show it on its
// new worker count), so jobs never hold more slots than exist.
//
// Requests are JSON over HTTP on --host:--port (loopback by default), each
// carrying the cluster's token (OUT/token) as `Authorization: Bearer`.
// No libtorch: the job file's validation comes in as a callback.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "sched/policy.h"

namespace morph::sched {

// What the scheduler needs of a job file (validated: InputError otherwise).
struct JobFacts {
  std::string name;
  int64_t steps = 0;  // 0: unknown until the data is loaded (epochs)
  int64_t virtual_nodes = 1;
  // With a calibration profile: seconds per step by worker count (the
  // planner's best plan on each), the morph policy's speed for the job;
  // empty: taken as linear.
  std::map<int, double> step_seconds;
  // With a profile and slot types: seconds per step by slots per type (the
  // planner's best plan on those devices; Speed's by-type table).
  std::map<std::vector<int>, double> step_seconds_by_type;
};
using JobValidator = std::function<JobFacts(const std::string& path, const std::vector<std::string>& overrides,
                                            const std::string& profile)>;

struct LiveClusterOptions {
  int slots = 1;
  std::string policy = "morph";
  std::string host = "127.0.0.1";
  int port = 0;  // 0: a free one (printed, and written to OUT/address)
  std::string out = "runs/cluster";
  std::string self_exe;  // the morph binary that runs the jobs
  double resize_seconds = 0.6;
  // The slots' device types (a resources file, docs/resources.md); empty:
  // one type. A job started on slots of these types runs with their
  // emulated slowdowns (`morph run --resources`, a file written per job).
  std::string resources;
  std::vector<SlotType> types;
  JobValidator validate;
  // Inside a Slurm allocation (salloc/sbatch): each job's manager is a job
  // step (`srun --nodes=1 --ntasks=1 --overlap`, on the allocation's first
  // node) and each of its workers a step of its own (`srun --nodes=1
  // --ntasks=1 --exclusive morph worker --join`); a grow starts worker
  // steps, a shrink lets the released workers' steps end. Slots default to
  // the allocation's tasks (SLURM_NTASKS). With `resources`, the slots are
  // its devices, each on the node its `host` names (slurmNodes), and a
  // worker step runs on a node of its slot's type (`srun --nodelist=NODE`,
  // `morph worker --label NODE`).
  bool slurm = false;
  // The resources file's devices as (type name, host), in its order; read
  // only with `slurm`.
  std::vector<std::pair<std::string, std::string>> devices;
};
// Serves until SIGINT or SIGTERM; then ends its running jobs (SIGTERM to
// each job's process group, SIGKILL after 10 s) and returns 0.
int runCluster(const LiveClusterOptions& options);

// The live scheduler's slot accounting, decided apart from the processes
// (decide, then apply; tests/sched/live_plan_test.cpp): which of the
// policy's targets can be applied now.
struct SlotState {
  int64_t id = 0;
  int priority = 1;
  bool running = false;  // false: queued
  int target = 0;        // workers last asked of it (running)
  int held = 0;          // slots it holds: its target, more while a shrink or a grow is under way
  int desired = 0;       // the policy's target
  bool ready = true;     // running: its port known, no resize, grow or move under way
  bool can_move = true;  // running: it can run on one worker more (a move's in-between)
  // With slot types (planSlotActions' `types` not empty): the slots it
  // holds of each type (summing to `held`) and the policy's slots of each
  // type (summing to `desired`; empty: any).
  std::vector<int> held_types, desired_types;
};
struct SlotAction {
  // kMove (slot types only): the same worker count on other types: one
  // worker more on a free slot of `types`, then the worker on a slot of
  // `release` released (the job holds one slot more in between).
  enum Kind { kShrink, kStart, kGrow, kMove } kind;
  size_t job;  // index into the states
  int workers;  // the count asked (a move's: its count, unchanged)
  // With slot types: the types of the slots it takes (a start, a grow, a
  // move; fastest first) and of those it gives back (a shrink, a move).
  std::vector<int> types, release;
};
// Shrinks first (a shrinking job keeps holding its slots until the shrink
// has taken effect); then, in priority order (priority, then id), the starts
// and grows that fit in the slots no job holds; a queued job that does not
// fit waits without blocking the ones behind it (the policy decided the
// order). Sets `held` of the jobs it starts or grows. Given held slots that
// sum to at most `slots`, they still do after.
//
// With slot types (`types`, their counts summing to `slots`), also per type:
// a start or a grow takes the free slots of the types the policy asked for
// beyond what the job holds, then any free slot, fastest first; a shrink
// gives back slots of the types the job holds beyond the policy's, slowest
// first, then its slowest; a running job at its count whose types differ
// from the policy's moves, one slot at a time, onto a free slot of a type
// it lacks, giving back one of a type it holds in excess (only when both
// exist, and not while a shrink of it takes effect). Sets `held_types` of
// the jobs it starts, grows or moves; per type, held slots stay within the
// type's count.
std::vector<SlotAction> planSlotActions(std::vector<SlotState>& jobs, int slots,
                                        const std::vector<SlotType>& types = {});

// Slot types under Slurm (docs/cluster.md, "Slot types under Slurm"): a
// node of the allocation and its worker slots, all of one type (an index
// into the cluster's types).
struct SlurmNode {
  std::string name;
  int type = 0;
  int slots = 0;
};
// The nodes of the resources file `file`'s devices ((type name, host) each,
// of the cluster's `types`), in the order they are first listed. InputError
// naming the file for a device whose host is not one of the allocation's
// nodes (`scontrol show hostnames`), a node given devices of two types, or
// (with `tasks`, the allocation's tasks per node in its order) a node given
// more devices than it has tasks: its worker steps would wait for a task
// instead of running.
std::vector<SlurmNode> slurmNodes(const std::vector<std::pair<std::string, std::string>>& devices,
                                  const std::vector<SlotType>& types, const std::vector<std::string>& allocation,
                                  const std::string& file, const std::vector<int>& tasks = {});
// SLURM_TASKS_PER_NODE ("2(x3),1": 2 tasks on each of the first 3 nodes, 1
// on the next) as one count per node; InputError unless it gives exactly
// `nodes` counts.
std::vector<int> slurmTasksPerNode(const std::string& spec, size_t nodes);
// The node a new worker step on a slot of `type` runs on: of that type's
// nodes, the one with the most slots free (`used`: worker steps on each,
// by index), the first listed on a tie; -1 when the type has no node.
int pickNode(const std::vector<SlurmNode>& nodes, const std::vector<int>& used, int type);

struct ClusterClientOptions {
  std::string cluster;     // HOST:PORT
  std::string token_file;  // empty: $MORPH_TOKEN
};
// Prints the new job's id. The job file is validated here first (exit 2
// before anything is queued), and again by the scheduler.
int runSubmit(const ClusterClientOptions& c, const std::string& job_path, int priority, int demand,
              const std::vector<std::string>& overrides, const std::string& profile, const JobValidator& validate);
int runQueue(const ClusterClientOptions& c, bool json);
int runCancel(const ClusterClientOptions& c, int64_t id);

}  // namespace morph::sched
