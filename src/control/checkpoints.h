// Checkpoints as the runner, the manager and the worker use them: resuming
// from a folder (whole, or a stage-local worker's two halves), keeping the
// due ones written through failures (CheckpointKeeper), the writer's timing
// figures, the newest good step, and the marker that proves a worker sees
// the manager's folder. The format itself: src/ckpt (docs/checkpoint_format.md).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "ckpt/checkpoint_store.h"
#include "core/job_spec.h"
#include "exec/trainer.h"

namespace morph {
namespace detail {

using json = nlohmann::json;

// Loads the newest intact checkpoint of `dir`; reports damaged ones on
// stderr. Throws InputError when there is none. `report`: says on stdout
// which checkpoint it resumes from; `progress`: also, before loading, which
// one it reads and its size.
void resumeFrom(const std::string& dir, Executor& tr, bool report, bool progress);
// A stage-local worker's resume, in two halves. First, before it is placed:
// picks the newest checkpoint of `dir` whose every file is intact (so all
// workers pick the same one), loads its step and scale state and returns
// its path. Then, once placed: loads the layers the worker holds (its
// stage's, on whatever cut the checkpoint was written with) from it.
std::string resumeStepFrom(const std::string& dir, Executor& tr, bool report, bool progress);
void loadHeldLayers(const std::string& checkpoint, Executor& tr);
// The first half alone, from one checkpoint folder: its step and scale
// state. Returns the step.
int64_t loadStepFrom(const std::string& checkpoint, Executor& tr);
// Submits the due checkpoints to a writer. A failed write (the writer
// reports it at the next submit or flush) does not stop training: it is
// reported on stderr and in the step's metrics line (`checkpoint_error`) and
// the next interval writes again; JobError (exit 3) once
// job.checkpoint_max_failures intervals in a row had no checkpoint succeed.
class CheckpointKeeper {
 public:
  CheckpointKeeper(CheckpointWriter* writer, const JobSpec& job) : w_(writer), max_(job.checkpoint_max_failures) {}
  // Returns the failure reported now ("" if none).
  std::string submit(const CheckpointData& data);
  std::string flush();
  const CheckpointWriter* writer() const { return w_; }

 private:
  void failed(const std::string& what);
  CheckpointWriter* w_;
  int64_t max_;
  int64_t failures_ = 0;  // intervals in a row whose write failed
  int64_t last_ok_ = -1;
};

// A writer's durable checkpoints and its mean seconds per checkpoint:
// snapshot (in the training thread) and write (in the background; the
// committer's includes waiting for the other stages' shares).
json checkpointTiming(const CheckpointWriter& w);
// Newest intact checkpoint step under `dir`, or -1.
int64_t newestGoodCheckpoint(const std::string& dir);
// The same among those of step <= `at_most` (a later one is another run's).
int64_t newestGoodCheckpointAtMost(const std::string& dir, int64_t at_most);
// The file the manager writes into the checkpoint folder and every worker
// reads back (a worker that does not see it cannot write checkpoints that
// anyone finds).
constexpr const char* kCheckpointMarker = ".morph-job";

}  // namespace detail
}  // namespace morph
