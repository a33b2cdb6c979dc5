// WorkerJob: phases 2-5 of a registered worker (start-up, then generation
// after generation: wait, join, train, regroup or finish). Protocol:
// docs/distributed.md ("Generations"). It never forks and never decides
// membership: the manager's GenerationPlan places it.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/checkpoint_store.h"
#include "comm/communicator.h"
#include "control/checkpoints.h"
#include "control/protocol/generation_plan.h"
#include "control/protocol/generation_want.h"
#include "control/protocol/member_report.h"
#include "control/store_access.h"
#include "control/worker/registration.h"
#include "core/job_spec.h"
#include "data/dataset.h"
#include "exec/pipeline.h"
#include "exec/trainer.h"

namespace morph {

// Phases 2-5 of a registered worker: start-up (job, data, model, resume:
// `ready`), then generation after generation: wait for one that places it,
// join it, train until the job ends or membership changes, and at the end
// post its result. Destroyed before its caller's error handling runs, as
// the locals of one function were.
class WspWorker;

class WorkerJob {
 public:
  // Reads the job from the store (the text the manager validated).
  explicit WorkerJob(Registration& reg);

  // Phase 2: everything a worker needs before it can join a generation
  // within milliseconds; posts workers/<id>/ready last.
  void startUp();
  // Phases 3-5; returns the exit code.
  int run();

 private:
  // Where this worker sits in a generation it joined.
  struct Placement {
    int rank = -1, world = 0;
    double slowdown = 1.0;  // its emulated device's (resources file)
    Communicator* comm = nullptr;  // the generation's world group
  };
  // Phase 3: waits for a generation newer than ours into `plan`; false
  // when the worker should exit instead (job finished, leave requested).
  bool waitForGeneration(GenerationPlan& plan);
  void probeWhileAside(int64_t cur);
  // Phase 4a: forms the generation's process groups, receives its state and
  // sets up its checkpoint writer (CommFailure: regroup).
  Placement joinGeneration(const GenerationPlan& plan, int rank);
  // Phase 4b: trains until the last step (false) or a regroup (true).
  bool trainLoop(const Placement& p);
  // The same for a WSP job (docs/wsp.md): every minibatch of this virtual
  // worker, through the parameter servers; never regroups (a lost peer:
  // CommFailure, after reporting what this member knew of the pushes).
  bool trainWsp(const Placement& p);
  // A WSP generation that follows a lost one: every member first restores
  // the servers' state the manager chose (gen/<g>/wsp_restore).
  void restoreWsp();
  // A WSP replay of a run that lost a worker (its log's RestoreRecord):
  // loads the checkpoint that run's last generation restored (docs/wsp.md).
  void replayStart();
  // Phase 5: posts the result and waits for the job to finish.
  void finish(const Placement& p);
  // Reports the committed step when leaving a generation (ready or left).
  void report(const std::string& what);
  // gen/want (JobError naming the key when malformed).
  GenerationWant readWant();
  // The core's emulated slowdown: its device's (resources file) x `morph
  // slow`'s factor (StepCore::setSlowdown).
  void applySlowdown(double device_slowdown) {
    const double want = device_slowdown * slow_factor_;
    if (want != core_->slowdown()) core_->setSlowdown(want);
  }

  // The test build's faults at a step's points: "compute@12", "reduce@12",
  // "reduced@12", "last-sum@12" (ExecutorProbe::atPoint).
  struct FaultProbe : ExecutorProbe {
    int64_t id = -1;
    void atPoint(const char* point, int64_t step) override;
  };

  Registration& reg_;
  c10::intrusive_ptr<StoreClient> store_;
  const int64_t id_;
  FaultProbe fault_probe_;
  // Declaration order is destruction order (reversed): as the locals of the
  // one function this class was split from.
  JobSpec job_;
  // `morph slow`'s factor for this worker, as gen/want last carried it
  // (GenerationWant: read before each step, nothing else polls).
  double slow_factor_ = 1.0;
  std::string ckpt_dir_;
  DataPair data_;
  int64_t steps_ = 0;
  LocalCommunicator none_;
  // The executor: a data-parallel worker's, or a pipeline stage's (placed
  // when its generation forms).
  std::unique_ptr<VnExecutor> vn_ex_;
  std::unique_ptr<StageExecutor> stage_ex_;
  Executor* tr_ = nullptr;
  StepCore* core_ = nullptr;
  std::string resume_ckpt_;  // stage-local: the checkpoint whose layers this worker loads once placed
  std::unique_ptr<FileSystem> fs_;
  std::unique_ptr<CheckpointWriter> ckpt_;
  std::optional<detail::CheckpointKeeper> keeper_;  // counts failed checkpoint writes of `ckpt_`
  double hb_timeout_ = 0;
  double last_aside_probe_ = 0;  // probeWhileAside
  double last_commit_ = 0, longest_gap_ = 0;  // between two committed steps here (seconds)
  // Process groups of past generations whose work was abandoned (a
  // CommFailure), and a pipeline's: never destroyed, since their threads
  // may still be blocked on a dead peer until Gloo's own timeout. Those of
  // the current generation start at gen_first_group_.
  std::vector<std::unique_ptr<Communicator>> comms_;
  size_t gen_first_group_ = 0;
  // Data parallelism: the groups of a generation that ended in a regroup
  // with every collective completed; destroyed (their Gloo device thread,
  // sockets and buffers freed) once the next generation's group is in use.
  std::vector<std::unique_ptr<Communicator>> finished_groups_;
  // Nor at exit: a group whose work was abandoned blocks its destructor
  // until Gloo's own timeout (a ceiling of minutes now, see "Deadlines"),
  // and the process ends anyway.
  struct LeaveGroupsAtExit {
    std::vector<std::unique_ptr<Communicator>>& groups;
    ~LeaveGroupsAtExit() {
      for (auto& g : groups) (void)g.release();
    }
  } leave_groups_at_exit_;
  LeaveGroupsAtExit leave_finished_at_exit_{finished_groups_};
  int64_t gen_ = -1;
  nlohmann::json last_line_;  // metrics of the last step this worker committed
  nlohmann::json wsp_result_;  // a WSP job's pushes, pulls and log records (WspWorker::result)
  // WSP: the job's start (its first state, or the --resume checkpoint's),
  // restored when a generation is lost before any checkpoint was written.
  std::optional<CheckpointData> wsp_start_;
  // WSP workers of lost generations: never destroyed, their server threads
  // may still wait on the aborted group (as comms_).
  std::vector<WspWorker*> abandoned_wsp_;
  HeldLayers held_;  // pipeline: the layers this worker holds at its committed step
};

}  // namespace morph
