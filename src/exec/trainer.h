// Trainer: the VN executor of one worker. Each step it runs forward and
// backward for each of its VNs (loss summed over the VN's samples, random
// stream seeded by (seed, step, vn), batch statistics per VN), adds every
// VN's gradient into one GradAccumulator, reduces it across workers through
// the Communicator, redoes the step if the agreed fixed-point bound was
// exceeded, and applies the optimiser to the exact mean gradient.
//
// It never decides which VNs it owns (the plan does) and never talks to the
// network except through the Communicator.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ckpt/checkpoint_store.h"
#include "comm/communicator.h"
#include "core/job_spec.h"
#include "data/dataset.h"
#include "data/sampler.h"
#include "exec/grad_accumulator.h"
#include "exec/optimizer.h"
#include "exec/prefetcher.h"
#include "exec/schedule.h"
#include "models/model.h"

namespace morph {

class SendChannel;  // pipeline.cpp
struct SendChannelDeleter {
  void operator()(SendChannel* c) const;
};

// Where a worker sits in a pipeline of `stages` stages and `replicas`
// data-parallel copies of it. World rank = replica * stages + stage.
struct PipelinePlacement {
  int stages = 1, stage = 0;
  int replicas = 1, replica = 0;
  std::vector<size_t> cuts;  // stages + 1 layer boundaries: stage k runs [cuts[k], cuts[k+1])
  ScheduleKind schedule = ScheduleKind::k1F1B;
  bool recompute = false;
};

// The process groups of a pipeline worker (each must outlive its use).
struct PipelineComms {
  Communicator* world = nullptr;  // every rank: flags, loss, clipping, state gathers
  Communicator* stage = nullptr;  // this stage's replicas (rank = replica); null when replicas == 1
  Communicator* tied = nullptr;   // first and last stage (tied parameters); null elsewhere
  Communicator* pipe = nullptr;   // this replica's stages (rank = stage): activations and gradients
};

// One action of the stage executor, for --trace (seconds since the epoch).
struct TraceEvent {
  std::string name;  // "forward vn 3"
  int64_t step;
  double start, end;
};

// Per step on a pipeline worker: when the schedule started and ended and how
// long the stage computed (forward, backward, recompute) in between.
struct StageTiming {
  int64_t step;
  double start, end, busy;
};

struct StepStats {
  int64_t step = 0;
  double loss = 0.0;            // mean training loss over the global batch
  double train_accuracy = 0.0;  // over the global batch
  double lr = 0.0;
  double grad_norm = 0.0;       // before clipping; 0 when clipping is off
  int attempts = 1;             // > 1 when the fixed-point bound forced a redo
  double seconds = 0.0;         // wall time of the step on this worker
  double reduce_seconds = 0.0;  // of which spent in collectives
};

struct EvalStats {
  double accuracy = 0.0;
  double loss = 0.0;     // mean per sample
  double seconds = 0.0;  // wall time of the evaluation on this worker
};

class Trainer {
 public:
  // `train` must outlive the trainer; `comm` too. total_steps feeds the LR
  // schedule. `stage_local`: a pipeline worker that does not know its stage
  // yet holds no layer (each is built and freed at once, keeping only its
  // shapes); setPipeline() builds the stage's own layers.
  Trainer(const JobSpec& job, int64_t total_steps, const Dataset& train, Communicator& comm,
          bool stage_local = false);

  // The communicator of the current generation (must outlive its use).
  void setCommunicator(Communicator* comm) { comm_ = comm; }
  // After a CommFailure in step(): the step did not commit. Collectives of
  // the failed generation may still write into their buffers, so those are
  // set aside (never reused) and a fresh accumulator with the same scale
  // state takes over.
  void abandonStep();
  // Control values that ride on the step's MAX all-reduce of flags (for the
  // control plane: pending generation, leave requests); reducedControl() is
  // their maximum over workers once step() returns.
  void setControl(std::vector<double> local) { control_ = std::move(local); }
  const std::vector<double>& reducedControl() const { return reduced_control_; }

  // Emulates a device `factor` times slower (>= 1; 1 = this machine's
  // speed): after each VN's compute (a forward, backward or recompute in a
  // pipeline) the worker idles (factor - 1) x the time that compute took.
  // Timing only: the results are unchanged. docs/resources.md.
  void setSlowdown(double factor);
  double slowdown() const { return slowdown_; }

  // VNs [begin, end) of every step are this worker's.
  void setVnRange(int64_t begin, int64_t end);
  // Processing order of the local VNs (a permutation of the range); tests
  // use it to show that the order does not matter.
  void setVnOrder(std::vector<int64_t> order);
  // Test hook: multiplies VN `vn`'s gradient by `factor` at `step`, first
  // attempt only (a spike beyond the agreed bound).
  void injectGradSpike(int64_t step, int64_t vn, float factor);

  // Pipeline mode: this worker runs stage placement.stage of replica
  // placement.replica over the replica's VNs [vn_begin, vn_end), following
  // the schedule's action list (validated here; InputError if it is not
  // valid). Call before the first step. Afterwards the worker holds its
  // stage's layers (built from the job seed if it held none) and the copy
  // of a weight it shares with another stage, nothing else.
  void setPipeline(const PipelinePlacement& placement, int64_t vn_begin, int64_t vn_end,
                   const PipelineComms& comms);
  bool pipelined() const { return pipe_.stages > 1; }
  const PipelinePlacement& placement() const { return pipe_; }
  // Layers whose state this worker holds (all of them, or after
  // setPipeline() the stage's own plus the layer owning a shared weight), in
  // order: what a resume must load.
  std::vector<size_t> heldLayers() const;
  // Hash of this stage's layers (pipeline replicas of a stage must agree).
  std::string stageHash() const;
  // Per-action trace and per-step timing of the stage executor.
  void setTracing(bool on) { tracing_ = on; }
  const std::vector<TraceEvent>& trace() const { return trace_; }
  const std::vector<StageTiming>& stageTimings() const { return timings_; }

  StepStats step();  // runs step nextStep()
  // Loss and accuracy on `test` in batches of `batch`. Pipeline mode: every
  // rank calls it at the same step; the batches flow through the stages
  // (each replica takes an even share of them) and the last stages' sums
  // are combined over the world, so no rank needs the whole model.
  EvalStats evaluate(const Dataset& test, int64_t batch);

  // Training state: everything a resumed or joining worker needs to continue
  // bit for bit (parameters, buffers, optimiser state, scale state, step).
  // Per layer; a pipeline stage exports its own layers (first_layer is the
  // stage's first), which its replica 0 writes as its share of a
  // checkpoint. The tensors are the live ones: snapshot them before
  // training on.
  CheckpointData exportState() const;
  NamedTensors layerState(size_t layer) const;  // one layer's part of it
  // Loads step, optimiser step count and scale state, and the layers in
  // `data` (from data.first_layer on) into the tensors this worker holds;
  // tensors it does not hold are skipped. Unless `partial` (a stage loading
  // its layers in parts, or the step alone), `data` must hold every layer.
  // Throws InputError naming what does not fit when `data` is not a state
  // of this job's model.
  void importState(const CheckpointData& data, bool partial = false);
  // The same state as live tensors in a fixed order plus integers, for
  // broadcasting it to workers that join.
  std::vector<torch::Tensor> stateTensors() const;
  std::vector<int64_t> stateMeta() const;  // step, optimiser steps, scales...
  void setStateMeta(const std::vector<int64_t>& meta);
  std::string jobId() const;

  int64_t nextStep() const { return step_; }
  LayerList& model() { return *model_; }
  const GradAccumulator& accumulator() const { return *acc_; }
  std::string hash() const;
  // Bytes of the parameters this worker holds now (a pipeline stage: its
  // own layers and the copy of a tied weight), and the most it held at any
  // point since it was built.
  int64_t modelBytes() const;
  int64_t peakModelBytes() const { return peak_model_bytes_; }

 private:
  void runVn(int64_t vn, bool last);
  void runLocalVns(bool first_attempt);
  void runStageSchedule(bool first_attempt);
  // Builds the layers in `held` that are hollow (from the job seed) and
  // points shared-weight aliases at their owners.
  void holdLayers(const std::vector<char>& held);
  void freeOtherStages();  // parameters, buffers and optimiser state this stage does not use
  void notePeak() { peak_model_bytes_ = std::max(peak_model_bytes_, modelBytes()); }
  EvalStats evaluateStages(const Dataset& test, int64_t batch);
  EvalStats evaluateWhole(const Dataset& test, int64_t batch);
  // Adds one evaluation batch's summed cross-entropy and correct predictions.
  static void scoreBatch(const torch::Tensor& logits, const torch::Tensor& targets, double& loss, int64_t& correct);
  // Both MAX-reduce `flags` with the control values appended (and split them
  // off again); then the local path waits for its buckets, the pipeline
  // reduces its stage, tied and loss segments.
  void reduceFlags(Communicator& comm, std::vector<double>& flags);
  void reduceLocal(std::vector<double>& flags);
  void reducePipeline(std::vector<double>& flags);
  uint64_t vnSeed(int64_t vn) const;
  void emulateSlowdown(double compute_seconds) const;
  void onGrad(size_t param, const torch::Tensor& grad);
  void launchReadyBuckets(bool all);
  size_t segOf(size_t param) const { return params_.size() - 1 - param; }

  // A bucket is a contiguous run of segments reduced by one all-reduce.
  struct Bucket {
    size_t first_seg, end_seg;
  };

  JobSpec job_;
  int64_t total_steps_;
  Communicator* comm_;
  std::shared_ptr<LayerList> model_;
  std::vector<torch::Tensor> params_;
  std::vector<VnBatchNorm*> bns_;
  std::unique_ptr<Optimizer> opt_;
  std::unique_ptr<GradAccumulator> acc_;
  GlobalSampler sampler_;
  Prefetcher prefetch_;
  std::vector<int64_t> order_;
  // Segment layout: parameters in reverse order (gradients become ready
  // roughly back to front), then batch-norm mean/var, then [loss, correct].
  size_t bn_seg_ = 0, stats_seg_ = 0;
  std::vector<Bucket> buckets_;     // the last one holds the statistics
  std::vector<char> seg_ready_;     // per segment, for the current VN
  size_t next_bucket_ = 0;          // next bucket to launch
  bool accumulating_ = false;       // inside a VN's backward
  bool launching_ = false;          // last local VN: start reductions early
  bool spike_now_ = false;
  std::vector<std::unique_ptr<PendingWork>> inflight_;
  std::vector<int64_t> seg_sizes_;
  std::vector<int> seg_need_;       // contributions per segment per VN (2 for a tied weight)
  std::vector<size_t> own_params_;  // parameters this worker updates (a stage: incl. a tied copy)
  std::vector<char> norm_owner_;    // per parameter: this worker counts it in the global norm
  std::vector<size_t> own_bns_;     // indices into bns_ this worker updates
  // Pipeline mode (stages > 1).
  PipelinePlacement pipe_;
  PipelineComms pcomm_;
  int64_t vn_begin_ = 0, vn_end_ = 0;
  std::vector<Action> actions_;     // this rank's list for one step
  std::vector<std::pair<size_t, size_t>> own_runs_;  // segment runs reduced among replicas
  std::vector<size_t> tied_segs_;   // segments summed between first and last stage
  std::vector<std::vector<int64_t>> cut_shapes_;
  bool tracing_ = false;
  std::vector<TraceEvent> trace_;
  std::vector<StageTiming> timings_;
  const Dataset* train_ = nullptr;
  std::unique_ptr<SendChannel, SendChannelDeleter> act_out_, grad_out_;
  std::vector<double> control_, reduced_control_;
  // Buffers and works of abandoned steps: kept alive, never touched again.
  std::vector<std::unique_ptr<GradAccumulator>> graveyard_acc_;
  std::vector<std::unique_ptr<PendingWork>> graveyard_work_;
  int64_t step_ = 0;
  int64_t spike_step_ = -1, spike_vn_ = -1;
  float spike_factor_ = 1.0f;
  double slowdown_ = 1.0;
  int64_t peak_model_bytes_ = 0;
};

}  // namespace morph
