// Membership: who the job's workers are and whether they are alive —
// registrations (an id taken, its pid announced, its data loaded, its
// fingerprint matched), local processes that ended, heartbeats, and the
// failures of workers that never started. It decides from the store and a
// Clock; what a death means for the running generation is Generations'.
// docs/distributed.md, "Generations" and "Deadlines".
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "control/manager/clock.h"
#include "control/manager/processes.h"

namespace morph {

namespace store {
class Table;
}

// A worker that took an id (workers/next_id) must announce its pid within
// this long, or the id is skipped (it died while registering).
constexpr double kAnnounceDeadlineS = 10.0;

// Thrown where the job cannot go on (no worker left, no stage left, a
// worker's fatal error); the manager adds the last committed step and the
// newest good checkpoint and stops its workers (JobError, exit 3).
class NoWorkerLeft : public std::runtime_error {
 public:
  explicit NoWorkerLeft(const std::string& why) : std::runtime_error(why) {}
};

struct WorkerInfo {
  pid_t pid = -1;        // local child, or -1
  bool alive = true;
  bool placeable = false;  // data loaded ("workers/<id>/ready")
  bool announced = true;   // false: took an id but never posted its pid
  double warned = 0;       // when it was last reported slow to answer a generation change
  std::string label;      // `morph worker --label` (workers/<id>/label), "" when none
  std::string hb;        // last heartbeat value seen
  double hb_time = 0;    // when it last changed
};

class Membership {
 public:
  struct Options {
    double hb_interval = 0, hb_timeout = 0;  // --heartbeat-interval, --heartbeat-timeout (seconds)
    bool exact = true;  // reduce.mode exact: a worker whose fingerprint differs is refused
    int spawned = 0;    // local workers started at the beginning
  };
  // `fingerprint`: what every worker must match (runtimeFingerprint; the
  // data's is taken from the first worker).
  Membership(WorkerProcesses& procs, Options o, nlohmann::json fingerprint)
      : procs_(procs), o_(o), fingerprint_(std::move(fingerprint)) {}

  // A worker process for each of `count` more workers.
  void spawn(int count);
  // Ids taken since the last call: announced (pid posted), skipped after
  // kAnnounceDeadlineS without a pid, failed to start (their reason), or
  // ready and admitted (placeable) or refused.
  void pollRegistrations(c10d::Store& store, const Clock& clock);
  // What died: the worker and why (the caller's markDead).
  struct Death {
    int64_t id;
    std::string why;
  };
  // Local children that ended: one that left generation `gen` gracefully
  // is no longer alive; the others are deaths. InputError when one exited
  // 2 (the job's input is bad: every child is stopped).
  std::vector<Death> pollChildren(c10d::Store& store, int64_t gen);
  // Workers whose heartbeat has not moved for the heartbeat timeout
  // (looked at every heartbeat interval).
  std::vector<Death> pollHeartbeats(c10d::Store& store, const Clock& clock, int64_t gen);
  // What markDead found: the worker was already dead; it never got ready
  // (a start failure, reported); or it was placeable.
  enum class Dead { kAlready, kNeverReady, kPlaceable };
  // Marks `id` dead and kills its process. NoWorkerLeft when it posted a
  // fatal error (the job cannot go on).
  Dead markDead(c10d::Store& store, int64_t id, const std::string& why);
  // A worker that could not start before generation 0 (id -1: a local
  // process that ended before it registered).
  void startFailed(int64_t id, const std::string& why, bool input);
  // Generation 0 formed: later start failures are joiners'.
  void setStarted() { started_ = true; }
  void killAll();
  // Waits until every live local worker has exited, then retires the
  // processes (WorkerProcesses::retire: the zygote ends and is reaped).
  void waitLocal();
  // Forgets the keys of workers that were already gone at the previous
  // generation change (the store stays bounded).
  void forgetDeparted(store::Table& table, c10d::Store& store);

  std::map<int64_t, WorkerInfo>& workers() { return workers_; }
  const std::map<int64_t, WorkerInfo>& workers() const { return workers_; }
  WorkerInfo& operator[](int64_t id) { return workers_[id]; }
  // Alive workers plus local processes not registered yet.
  int aliveOrStarting() const;
  // Anyone left: a live worker or a process still registering.
  bool anyone() const;
  // Alive, placeable workers that are not `members`, in id order.
  std::vector<int64_t> waiting(const std::vector<int64_t>& members) const;
  size_t unregistered() const { return unregistered_pids_.size(); }
  size_t unannounced() const { return unannounced_.size(); }
  const std::vector<std::string>& startFailures() const { return start_failures_; }
  bool startFailuresAllInput() const { return start_failures_input_; }
  const nlohmann::json& fingerprint() const { return fingerprint_; }
  const Options& options() const { return o_; }

 private:
  void admit(c10d::Store& store, int64_t id, WorkerInfo& w);

  WorkerProcesses& procs_;
  Options o_;
  nlohmann::json fingerprint_;
  bool started_ = false;
  std::map<int64_t, WorkerInfo> workers_;
  std::set<pid_t> unregistered_pids_;
  std::map<int64_t, double> unannounced_;  // id -> when it was first seen without a pid
  int unmatched_deaths_ = 0;  // local workers that died before announcing an id (skipped ids not counted twice)
  // Workers that could not start before generation 0 (each with why) and
  // whether every one of them failed on bad input (exit 2 if none starts).
  std::vector<std::string> start_failures_;
  bool start_failures_input_ = true;
  double last_hb_poll_ = 0;
  std::set<int64_t> gone_before_, forgotten_;  // departed workers: at the last generation change; keys deleted
};

}  // namespace morph
