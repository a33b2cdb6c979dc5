// Generations: when the job regroups and into what. It starts a transition
// (a member posted ready or left, a death, waiting workers that can grow
// the job, a resize request, a straggler), decides when every member has
// answered it (or is stuck past its deadline), and publishes the next
// generation: its members, their VN ranges (plan/vn_shares.h; a pipeline's
// from PipelineMorpher), the GenerationPlan under gen/<g>/plan, and the
// record of the resize, completed when its first step commits. It also
// relays `morph slow` on gen/want and keeps the store bounded.
// Each decision reads the store and a Clock (docs/distributed.md,
// "Generations", "Deadlines").
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "control/manager/clock.h"
#include "control/manager/membership.h"
#include "control/manager/partitions.h"
#include "control/manager/pipeline_morph.h"
#include "control/protocol/generation_plan.h"
#include "control/protocol/generation_want.h"
#include "control/runner.h"
#include "control/straggler.h"
#include "core/job_spec.h"

namespace morph {

// Generation 0 forms when every expected worker is ready; if that has not
// happened this long after the manager started, it forms with the workers
// that are ready (none: exit 3).
constexpr double kStartDeadlineS = 120.0;
// A member that has not answered a generation change after
// max(kRegroupFloorS, kDeadlineFactor x the longest measured time between
// two committed steps) is reported; it is declared dead only once its
// heartbeats stop (a busy member is not a dead one).
constexpr double kRegroupFloorS = 60.0;
constexpr double kDeadlineFactor = 4.0;
// ... except one that still has not answered after kStuckFactor x that
// deadline: it heart-beats but is stuck (seen: a survivor of a pipeline
// morph whose joiner died while state moved), and the job would wait for
// it forever; it is declared dead, and the morph goes on without it.
constexpr double kStuckFactor = 3.0;

class Generations {
 public:
  // `table`: the store's keys (the store stays bounded: forgetPast).
  Generations(const RunOptions& o, const JobSpec& job, Membership& membership, PipelineMorpher& pipeline,
              store::Table& table);

  int64_t current() const { return gen_; }
  const std::vector<int64_t>& members() const { return members_; }
  bool inTransition() const { return in_transition_; }
  int target() const { return target_; }
  const std::vector<int64_t>& vnShares() const { return vn_shares_; }
  const nlohmann::json& resizes() const { return resizes_; }
  // A WSP job's last restore after a lost worker (a RestoreRecord's JSON), or null.
  const nlohmann::json& wspRestore() const { return wsp_restore_; }
  bool isMember(int64_t id) const;

  // Generation 0: published when every expected worker is ready, or when
  // those that can start are (the others failed), or kStartDeadlineS after
  // `since`. InputError/JobError when it cannot start.
  void maybeStart(c10d::Store& store, const Clock& clock, double since);
  // A running generation: starts a transition when a member posted ready
  // or left, when waiting workers can grow it, or when a resize request
  // shrinks it. `all_steps_done` (the last step is committed): no growth
  // or shrink any more, the members are posting their results.
  // `steps_left`: the job's steps to go (< 0: unknown), a pipeline morph's
  // horizon (plan/morph_cost.h).
  void watchMembership(c10d::Store& store, const Clock& clock, bool all_steps_done, int64_t steps_left = -1);
  // Every member still alive posted its result of the current generation
  // (its training loop ended). Also while a transition is under way: one
  // started as the last step committed (a resize request, a joiner) is
  // never answered by members that already finished.
  bool resultsPosted(c10d::Store& store) const;
  // What a transition waits for: every member alive has answered
  // (complete) once the members in `stuck` are declared dead (they have
  // not answered for kStuckFactor x the regroup deadline although they
  // heart-beat).
  struct Answered {
    bool complete = false;
    std::vector<Membership::Death> stuck;
  };
  Answered transitionComplete(c10d::Store& store, const Clock& clock);
  // A placeable worker died: a member of a generation still training
  // aborts it (its survivors leave their collectives) and starts a
  // transition. `all_steps_done`: the last step is committed, nothing to redo.
  void onDeath(c10d::Store& store, const Clock& clock, int64_t id, const std::string& why, bool all_steps_done);
  // The next generation, written under gen/<g>/plan and gen/current.
  // `next_step`: the first step whose metrics line the manager has not
  // read; `steps_left` as for watchMembership(). NoWorkerLeft when no
  // member survived.
  GenerationPlan publish(c10d::Store& store, int64_t next_step, int64_t steps_left = -1);
  // A committed step's metrics line: the longest time between two commits
  // (the regroup deadline's measure), stragglers, and the resize record
  // completed at its generation's first step.
  void onCommitted(c10d::Store& store, const Clock& clock, const nlohmann::json& line);
  // Partitions (partitions.h): a member's report that it cannot reach a
  // peer aborts the generation and sets aside the members outside the
  // largest group that can all reach each other; one set aside is admitted
  // again (as a joiner) once it reports that it reaches every member.
  void watchPartitions(c10d::Store& store, const Clock& clock);
  // `morph resize`: the new target (and the workers to release first at the
  // next generation); returns how many workers to start.
  int pollResizeRequests(c10d::Store& store);
  // `morph slow` (ctl/slow/<id>): the factors in effect ride on gen/want,
  // which every member reads before each step (GenerationWant).
  void pollSlowRequests(c10d::Store& store);
  // gen/want: generation g, with the `morph slow` factors in effect.
  void writeWant(c10d::Store& store, int64_t g);
  // The generation's part of the status record.
  nlohmann::json status() const;
  double regroupDeadline() const {
    return job_.collective_timeout > 0 ? job_.collective_timeout
                                       : std::max(kRegroupFloorS, kDeadlineFactor * longest_gap_);
  }

 private:
  void startTransition(const Clock& clock, const std::string& cause);
  // A WSP generation `g` after a lost one (docs/wsp.md, "Checkpoints and
  // lost workers"): chooses the newest intact checkpoint of this run (or
  // the job's start), posts it under gen/<g>/wsp_restore, prints what the
  // regroup loses and returns it for the resize record.
  nlohmann::json restoreWsp(c10d::Store& store, int64_t g);
  // Alive, placeable workers that are not members and not set aside for a
  // partition, in id order.
  std::vector<int64_t> joiners() const;
  void watchStragglers(c10d::Store& store, const Clock& clock, const nlohmann::json& line);
  // Deletes the keys of past generations and departed workers.
  void forgetPast(c10d::Store& store);

  const RunOptions& o_;
  const JobSpec& job_;
  Membership& m_;
  PipelineMorpher& pm_;
  store::Table& table_;
  int target_;
  std::vector<int64_t> members_;
  int64_t gen_ = -1;
  bool in_transition_ = false;
  std::string transition_cause_;
  double transition_start_ = 0;
  double transition_unix_ = 0;  // wall-clock time of the change, for benchmarks
  int64_t resize_seq_ = 0;
  // The workers the last resize request named to release first (ResizeRequest),
  // ordered last at the next publish.
  std::vector<int64_t> release_first_;
  int64_t events_seen_ = 0;
  GenerationWant want_;  // what gen/want holds
  std::map<int64_t, std::string> slow_seen_;  // ctl/slow/<id> values read, by worker
  nlohmann::json resizes_ = nlohmann::json::array();
  // The resize whose first committed step we are waiting for.
  nlohmann::json pending_resize_;
  int64_t pending_gen_ = -1;
  double pending_since_ = 0;
  double last_commit_unix_ = 0, longest_gap_ = 0;  // between two committed steps' lines (seconds)
  std::vector<int64_t> vn_shares_;  // VNs per member of the current generation
  Partitions partitions_;
  StragglerWatch straggler_;        // data parallelism: seconds per VN per worker (straggler.h)
  PipelineStragglerWatch pstraggler_;  // pipelines: the same per stage
  nlohmann::json straggler_note_;      // the straggler re-plan under way, for its resizes entry
  nlohmann::json wsp_restore_;         // restoreWsp's last choice, as a RestoreRecord
};

}  // namespace morph
