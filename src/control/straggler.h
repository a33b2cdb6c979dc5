// Stragglers in data-parallel jobs: the manager's running estimate of each
// worker's seconds per VN (the median of its last `steps` figures) and the re-plan it asks for (StragglerWatch).
// `morph slow` (runSlow, client_commands.h) emulates one: the manager relays its
// factor on gen/want, which every member reads before each step
// (control/protocol/generation_want.h). docs/distributed.md, "Stragglers".
//
// Where the figures come from: every member writes its compute seconds per
// VN of the step (its VNs' forward and backward plus the emulated slowdown,
// VnExecutor::setSpeedSlot) into its own slot of the control values that
// ride on the step's reduction (VnExecutor::writeSlots; a pipeline's MAX
// all-reduce), so rank 0's metrics line carries every
// member's (`vn_seconds`, rank order) at no extra round trip.
//
// StragglerWatch is pure logic (no store, no clock): it never changes a
// result, only who computes which VNs — every VN assignment gives the same
// model bits.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace morph {

struct StragglerOptions {
  double factor = 1.5;  // a worker deviates when its seconds per VN are > factor x (or < 1/factor x) expected
  int64_t steps = 5;    // ... for this many committed steps (net of steps within it; Worker::streak)
  bool replan = true;   // false: report only (the bench's "do nothing")
};

// What observe() found: a worker off its expected speed for `steps` steps,
// and the plan the measured speeds call for.
struct StragglerEvent {
  int64_t worker = -1;
  double ratio = 1;               // measured / expected seconds per VN (> 1: slower)
  double seconds_per_vn = 0;      // its estimate
  double expected_seconds = 0;    // what its peers (or its device type) predict
  bool drop = false;              // the step is predicted faster without it
  std::vector<int64_t> members;   // the next generation's, in rank order (without it when dropped)
  std::vector<int64_t> shares;    // VNs per member of `members`
  double predicted_now = 0;       // compute seconds per step: current shares, measured speeds
  double predicted_after = 0;     // ... with `shares`
  bool changes = true;            // false: the measured speeds call for the current plan
  // Pipelines: `members` are replica indices and `shares` each replica's
  // VNs (PipelineStragglerWatch).
  bool by_replica = false;
  std::string describe() const;   // one line for the manager's output
};

class StragglerWatch {
 public:
  explicit StragglerWatch(StragglerOptions o = {}) : o_(o) {}

  // A generation starts: `members` in rank order with `shares` VNs each and
  // their devices' slowdowns (resources file; 1 = this machine). Streaks
  // restart and the generation's first step is not counted (one-off costs).
  void newGeneration(const std::vector<int64_t>& members, const std::vector<int64_t>& shares,
                     const std::vector<double>& device_slowdown);
  // One committed step's seconds per VN, per member in rank order (<= 0:
  // unknown). Returns an event once a worker's figure has been off its
  // expected one by the factor (each step on its own, against that step's
  // median) at o.steps more committed steps than it was within it since
  // its streak began (Worker::streak); the caller then accept()s it (the
  // measured speeds become the expected ones, so it is reported once, and
  // the next o.steps steps are not counted). The event's plan changes
  // (`changes`) only when it drops the worker or cuts the predicted compute
  // by a tenth or more.
  std::optional<StragglerEvent> observe(const std::vector<double>& vn_seconds);
  void accept(const StragglerEvent& e);
  // Shares for `members` from the measured speeds once a re-plan has been
  // made (engage()); nullopt before (the manager's own rule applies).
  // Workers never measured count at their device's expected speed; every
  // member gets at least one VN.
  std::optional<std::vector<int64_t>> shares(const std::vector<int64_t>& members, int64_t vns) const;
  void engage() { engaged_ = true; }
  // Moves the workers being dropped to the end of `candidates` (the
  // manager releases the tail), and forgets them.
  void orderForDrop(std::vector<int64_t>& candidates);
  void drop(int64_t id) { dropping_.push_back(id); }
  std::optional<double> estimate(int64_t id) const;
  const StragglerOptions& options() const { return o_; }

 private:
  struct Worker {
    std::vector<double> recent;  // its last `steps` figures
    double est = 0;       // seconds per VN: their median; 0 = none yet
    double expected = 1;  // seconds per VN relative to the group's base
    // Steps off the expected speed in one direction: +1 at a step off by
    // the factor, -1 (not to 0) at a step within it, restarted at a step
    // off the other way. So one noisy step in a slow run delays the flag
    // by two steps instead of restarting the window, and isolated hiccups
    // (never two off for one within) never add up.
    int64_t streak = 0;
    int dir = 0;  // +1 slower, -1 faster, 0 none yet
  };
  // Seconds per VN of an expected-speed worker: the median of est / expected.
  double base(const std::vector<int64_t>& ids) const;
  double secondsOf(int64_t id, double base) const;

  StragglerOptions o_;
  std::map<int64_t, Worker> w_;
  std::vector<int64_t> members_, shares_;
  bool skip_ = true, engaged_ = false;
  double last_base_ = 0;
  int64_t cooldown_ = 0;  // steps not counted after a re-plan
  std::vector<int64_t> dropping_;
};

// Stragglers in pipeline jobs. A stage's workers (one per replica) do the
// same work per VN, so each stage has its own StragglerWatch over its
// replicas; a replica runs at the pace of its slowest stage, so the re-plan
// gives each replica VNs by its bottleneck's measured seconds per VN (the
// placement stays: nothing moves). It needs D >= 2 (a stage's only worker
// has no peer to compare with) and never drops a worker.
class PipelineStragglerWatch {
 public:
  explicit PipelineStragglerWatch(StragglerOptions o = {}) : o_(o) {}
  // `members` in rank order (rank = replica * stages + stage), each
  // replica's VN share. A new depth or cut forgets the estimates (a stage's
  // work changed).
  void newGeneration(const std::vector<int64_t>& members, int stages, const std::vector<size_t>& cuts,
                     const std::vector<int64_t>& replica_shares);
  // One committed step's seconds per VN per rank.
  std::optional<StragglerEvent> observe(const std::vector<double>& vn_seconds);
  void accept(const StragglerEvent& e);
  void engage() { engaged_ = true; }
  // VN shares per replica of `members` (rank order, `stages` per replica)
  // by measured speed once a re-plan was made; nullopt before, or when some
  // worker was never measured.
  std::optional<std::vector<int64_t>> shares(const std::vector<int64_t>& members, int stages, int64_t vns) const;

 private:
  double secondsOf(int64_t id) const;  // its estimate; 0 = none
  std::vector<double> replicaSeconds(const std::vector<int64_t>& members, int stages) const;
  StragglerOptions o_;
  std::vector<StragglerWatch> stage_;  // by stage
  std::vector<int64_t> members_, shares_;
  std::vector<size_t> cuts_;
  int stages_ = 0;
  int flagged_stage_ = -1;
  StragglerEvent flagged_;
  bool engaged_ = false;
};

// The largest share x seconds per VN: the compute part of a step.
double predictedCompute(const std::vector<int64_t>& shares, const std::vector<double>& seconds_per_vn);

}  // namespace morph
