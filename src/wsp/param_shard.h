// ParamShard: one parameter-server shard of a WSP job (docs/wsp.md): the
// global weights (parameters, batch-norm running statistics) of a
// contiguous run of the buffer's segments, their optimiser state and scales,
// and the pushes of clocks not yet applied. It applies clock k once every
// virtual worker's push of wave k is in: their exact sum at the common
// scale, one optimiser step, the next scales; its version is then k + 1.
// Pulls wait for a version. Thread-safe (each peer's requests arrive on a
// thread of their own); it never talks to the network itself.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/job_spec.h"
#include "exec/optimizer.h"
#include "exec/trainer.h"
#include "wsp/scaled_sum.h"

namespace morph {

// Which pieces (ShardPieces) each shard holds: W contiguous runs,
// first[r] .. first[r + 1] (a shard may be empty when a model has fewer
// values than workers times ShardPieces::kAlign).
struct ShardMap {
  std::vector<size_t> first;
  int shards() const { return static_cast<int>(first.size()) - 1; }
  size_t begin(int r) const { return first[static_cast<size_t>(r)]; }
  size_t end(int r) const { return first[static_cast<size_t>(r) + 1]; }
};

// The shards of a WSP job (docs/wsp.md): the buffer's values in segment
// order cut into `shards` contiguous ranges of about equal values, a tensor
// split between shards where a cut falls inside it. Each cut is at the
// value r / W of the total, moved to the nearest multiple of `align` values
// from its tensor's start (or to the tensor's start or end when nearer), so
// that every piece but a tensor's last is a multiple of `align` long: the
// elementwise optimiser then runs the same vector loop over each element as
// on the whole tensor (the same bits). One large tensor (the CNN's fc
// weight, 95% of its values) would otherwise put nearly every push and
// pull on one VW's link.
struct ShardPieces {
  static constexpr int64_t kAlign = 4096;
  std::vector<size_t> segment;         // per piece: the segment it is part of
  std::vector<int64_t> offset, size;   // per piece: its first value in the segment, its values
  ShardMap map;                        // shards as runs of pieces
  static ShardPieces cut(const std::vector<int64_t>& segment_sizes, int shards, int64_t align = kAlign);
};

class ParamShard {
 public:
  // Segments [first, end) of a core's buffer (`segs`: StepCore::segments(),
  // whose state tensors are cloned as the global weights at version 0;
  // `scales`: the buffer's scales, of every segment). `vws` virtual workers
  // push to it; `steps` and job.wave give the clocks and learning rates.
  ParamShard(const JobSpec& job, int64_t steps, int vws, const std::vector<StepCore::Segment>& segs,
             const std::vector<int64_t>& sizes, size_t first, size_t end, const std::vector<int>& scales);

  // int64 values of a push (the wire's payload): per segment its scale and
  // max |g| (as the double's bits), then the values, then the wave's
  // minibatch count, then the version of this shard the wave was computed
  // on (its pull's; the push's staleness is its clock less that).
  int64_t pushValues() const { return 2 * static_cast<int64_t>(sizes_.size()) + values_ + 2; }
  // Floats of a pull's state (parameters and running statistics).
  int64_t stateFloats() const { return state_floats_; }
  // Values of its segments (pieces): what each push to it carries.
  int64_t values() const { return values_; }
  size_t segments() const { return sizes_.size(); }

  // VW `vw`'s push of wave `clock`; applies every clock that is complete.
  void push(int vw, int64_t clock, const int64_t* payload);

  struct Pulled {
    int64_t version = 0;
    std::vector<int> scales;  // of the shard's segments
    std::vector<float> state; // stateFloats()
  };
  // Blocks until the version is at least `at_least` (and, `exactly` >= 0,
  // is exactly that: a replay), then copies it. `stop` (may be empty) is
  // asked every kStopPoll while it waits: CommFailure once it says true
  // (the generation was aborted: a peer whose push it waits for is lost).
  // `clock`: the puller's clock c (-1: none). With SGD and momentum, a
  // pull of version r < c gets the weights predicted for version c: r's
  // weights moved on by the momentum alone over clocks r .. c - 1
  // (predicted(); docs/wsp.md, "Pulls, the gate, and D").
  Pulled pull(int64_t at_least, int64_t exactly, const std::function<bool()>& stop = {}, int64_t clock = -1);
  // The coefficient a of the momentum in the prediction w - a * buf of
  // version `version` for clock `clock` (0 when clock <= version, or
  // without momentum): over the servers' steps of the missing clocks
  // version .. clock - 1 (wspServerSteps each; step j of clock k at
  // lr(k * wave + j)), numbered i = 1, 2, ..., the sum of lr * mu^i
  // (mu^(i+1) with Nesterov).
  static double predictionCoefficient(const JobSpec& job, int64_t steps, int64_t version, int64_t clock);

  // Checkpoints (docs/wsp.md, "Checkpoints and lost workers"). The state
  // at a version: the pull's, plus every parameter's optimiser state (in
  // segment order, each paramState() tensor in its order) and the
  // optimiser's step count.
  struct Snapshot {
    int64_t version = 0, optim_steps = 0;
    std::vector<int> scales;
    std::vector<float> state, optim;
  };
  // From now on, a snapshot is kept of every version `due` says, until
  // takeSnapshot() takes it.
  void keepSnapshots(std::function<bool(int64_t version)> due);
  // Waits (as pull) until version `version` was reached; returns and drops
  // its snapshot. CheckError when it was not kept (or taken already).
  Snapshot takeSnapshot(int64_t version, const std::function<bool()>& stop = {});
  // Starts at `version` (a restored checkpoint): the global weights are the
  // segments' state given to the constructor; `optim`: the optimiser state
  // in Snapshot::optim's layout; `optim_steps` its step count.
  void restore(int64_t version, const std::vector<float>& optim, int64_t optim_steps);
  // Per virtual worker, the waves of its that reached this shard (its
  // highest pushed clock + 1; pushes applied included).
  std::vector<int64_t> received() const;
  static constexpr std::chrono::milliseconds kStopPoll{20};
  // Replay: the number of pulls the log says received each version; clock
  // k is applied only once every pull of version k was served.
  void expectPulls(std::map<int64_t, int64_t> per_version);
  int64_t version() const;

  // Helpers of the wire format.
  static void packPush(const ScaledValues& sum, size_t first, size_t end, int64_t base, std::vector<int64_t>& out);

 private:
  void applyReady();  // with mu_ held
  void applyClock(int64_t k);
  // Waits on cv_ until `ready`, asking `stop` every kStopPoll.
  void waitUntil(std::unique_lock<std::mutex>& l, const std::function<bool()>& ready, const std::function<bool()>& stop);
  Snapshot snapshot() const;  // with mu_ held
  std::vector<torch::Tensor> optimState();  // every parameter's, in order

  const JobSpec job_;
  const int64_t steps_;
  const int vws_;
  std::vector<int64_t> sizes_;
  std::vector<StepCore::Segment::Kind> kinds_;
  std::vector<double> momenta_;
  std::vector<torch::Tensor> state_;   // per segment (undefined for the statistics)
  std::vector<torch::Tensor> params_;  // the parameters among them, for the optimiser
  std::unique_ptr<Optimizer> opt_;
  std::vector<int> scales_;
  int64_t values_ = 0, state_floats_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  int64_t version_ = 0;
  // Pushes not yet applied: clock -> per VW.
  std::map<int64_t, std::map<int, ScaledValues>> pending_;
  std::map<int64_t, std::map<int, int64_t>> bases_;  // clock -> per VW: the version its push was computed on
  bool replay_ = false;
  std::map<int64_t, int64_t> expected_, served_;
  std::function<bool(int64_t)> snapshot_due_;
  std::map<int64_t, Snapshot> snapshots_;
  std::vector<int64_t> received_;  // per VW
};

}  // namespace morph
