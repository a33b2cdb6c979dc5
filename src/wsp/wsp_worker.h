// WspWorker: one virtual worker of a WSP job and the parameter-server shard
// its process hosts (docs/wsp.md). It runs its minibatches with local SGD,
// pushes one wave sum per wave to every shard, waits at the gate
// (c_local - version <= D for every shard) and pulls the shards' weights;
// a thread per peer serves that peer's pushes and pulls of this process's
// shard. All traffic is Gloo point to point on the generation's world
// group (tags kRequestTag, kReplyTag); nothing else uses that group while
// it runs. It never decides membership and writes no files: the log
// records go back in its result.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "core/job_spec.h"
#include "exec/trainer.h"
#include "wsp/param_shard.h"
#include "wsp/scaled_sum.h"
#include "wsp/wsp_log.h"

namespace morph {

class WspWorker {
 public:
  static constexpr int kRequestTag = 2801, kReplyTag = 2802;
  // Receives each checkpoint of the servers' state (docs/wsp.md,
  // "Checkpoints and lost workers"); it copies what it keeps before it
  // returns.
  using CheckpointSink = std::function<void(const CheckpointData&)>;
  // `ex` runs VNs [begin, end) of every step (setVnRange); `world` is the
  // generation's group, one rank per virtual worker. `replay`: the log's
  // plan, or null. All must outlive the worker. It starts at clock
  // core().nextStep() / wave: 0, or a checkpoint's clock whose state `ex`
  // holds (its weights, optimiser state and scales become the servers').
  // `checkpoint` (rank 0's; may be empty): with checkpoint.every, every
  // shard keeps its state at the due clocks, and rank 0 gathers it.
  WspWorker(const JobSpec& job, int64_t steps, VnExecutor& ex, Communicator& world, const ReplayPlan* replay,
            CheckpointSink checkpoint = {});
  ~WspWorker();

  // Runs every minibatch from core().nextStep() to the last; `minibatch`
  // after each but the last, and once more for the last after the final
  // pull (the local model is then every shard's final weights). Throws
  // CommFailure when a peer is lost: its server threads still run until
  // the generation's abort ends their transfers, so the worker must then
  // outlive them (keep it; see WorkerJob).
  void run(const std::function<void(const StepStats&)>& minibatch);
  // Waves pushed (its local clock).
  int64_t clock() const { return clock_; }
  // Per VW, its waves that reached this process's shard.
  std::vector<int64_t> received() const { return shard_->received(); }

  const std::vector<PullRecord>& pulls() const { return records_; }
  int64_t pushes() const { return pushes_; }
  int64_t maxGap() const;
  // Where this VW's wall clock went (docs/wsp.md, "Where a clock's time
  // goes"): its minibatches (forward, backward, local update, an emulated
  // device's sleep), of which the main thread's CPU time; the callback
  // after each (metrics line, evaluations); waiting for its pushes' sends;
  // its own shard's pull (the gate: until that shard reached the version);
  // the other shards' replies after it; gathering checkpoints.
  struct Seconds {
    double compute = 0, compute_cpu = 0, minibatch = 0, push = 0, gate = 0, pull = 0, checkpoint = 0;
    nlohmann::json toJson(int vw) const;
  };
  const Seconds& seconds() const { return seconds_; }
  // {"vw", "pushes", "pulls", "max_clock_gap", "seconds", "shard_values",
  // "push_bytes", "push_unpacked_bytes", "records": [...]} for the result.
  nlohmann::json result() const;

 private:
  void serve(int peer);  // a peer's requests, until it says bye
  void push(int64_t clock, int64_t minibatches);
  void pullAll(int64_t clock, bool final);
  void bye();
  // Rank 0: gathers every shard's snapshot of version k into a checkpoint.
  void gatherCheckpoint(int64_t k);
  // Each parameter or running statistic of `d` (an exportState() of the
  // executor) that is a segment's state: f(segment, -1, tensor), then for
  // a parameter its optimiser state: f(segment, i, tensor), i = 0, 1, ...
  void eachSegmentTensor(CheckpointData& d, const std::function<void(size_t, int, torch::Tensor&)>& f) const;
  bool stop() const { return world_.aborted(); }

  const JobSpec& job_;
  const int64_t steps_;
  VnExecutor& ex_;
  Communicator& world_;
  const ReplayPlan* replay_;
  const CheckpointSink checkpoint_;
  const int me_, vws_;
  int64_t clock_ = 0, checkpointed_ = 0;  // waves pushed; the newest version gathered
  // The buffer's segments (orig_) cut into pieces between the shards
  // (ShardPieces): segs_ and sizes_ are per piece, a piece's state a view
  // of its part of the segment's tensor; map_ gives each shard's pieces.
  ShardPieces pieces_;
  ShardMap map_;
  std::unique_ptr<ParamShard> shard_;  // the one this process hosts
  std::vector<StepCore::Segment> orig_, segs_;
  std::vector<int64_t> sizes_;
  // A per-segment array of the buffer, per piece.
  template <typename T>
  std::vector<T> perPiece(const T* per_segment) const;
  ScaledValues wave_;
  std::vector<std::thread> servers_;
  std::mutex err_mu_;
  std::exception_ptr server_error_;
  std::vector<PullRecord> records_;
  int64_t pushes_ = 0;
  // Bytes of its pushes to other shards: sent (packed, packed_ints.h) and
  // what they would have been at 8 bytes a value.
  int64_t push_bytes_ = 0, push_unpacked_bytes_ = 0;
  Seconds seconds_;
  // Its own pushes a shard may not have applied yet: per wave, the wave's
  // mean-gradient part G / B of every parameter segment (floats, the
  // buffer's layout; empty for the other segments). A pull adds what they
  // will do to the pulled weights (read-my-writes, docs/wsp.md).
  std::map<int64_t, std::vector<std::vector<float>>> own_;
  // Per wave in own_, per shard: that push's staleness (its clock less the
  // version it was computed on).
  std::map<int64_t, std::vector<int64_t>> own_stale_;
  // Per shard, the version the current wave is computed on: its last
  // pull's (the starting clock before the first). Sent with each push.
  std::vector<int64_t> base_;
  void addOwnPushes(int r, int64_t version, int64_t clock);
};

}  // namespace morph
