// The two executors of a worker and what they share.
//
// Executor is what the control plane calls: step, abandon a failed step,
// evaluate, export and import the training state, hash. VnExecutor runs a
// data-parallel worker: each step, forward and backward for each of its VNs
// (loss summed over the VN's samples, random streams seeded by (seed, step,
// vn), batch statistics per VN), every VN's gradient added into one exact
// fixed-point buffer, reduced across workers in buckets while the last VN's
// backward still runs. StageExecutor (pipeline.h) runs one pipeline stage.
// Both hold a StepCore: the model, the exact reduction (the fixed-point
// buffer, its scale state, the redo when the agreed bound was exceeded) and
// the optimiser applied to the exact mean gradient.
//
// No executor decides which VNs or layers it owns (the plan does), and none
// talks to the network except through its Communicators.
#pragma once

#include <functional>
#include <map>
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
#include "models/model.h"

namespace morph {

// Gradient bytes per all-reduce bucket: MORPH_BUCKET_BYTES (a whole number
// of bytes, >= 1; anything else is an InputError naming it), else 25 MiB.
// A tuning knob: it never changes results.
int64_t bucketBytes();

// How exact sums cross a group of more than one worker: MORPH_EXACT_WIRE =
// "sharded" (a ring reduce-scatter of the int64 values, each rank turning
// its chunk into floats, then a ring all-gather of the floats:
// comm/communicator.h startShardedSum), "allreduce" (Gloo's int64 ring
// all-reduce; every rank turns all of it) or "auto" (the default: sharded
// for runs of at least kShardedMinValues values, where sending a quarter
// fewer bytes outweighs 2 (W - 1) transfers' latencies). Anything else is
// an InputError naming it. A tuning knob: results never depend on it
// (tests/cli/buckets_test.sh), but every worker of a job must use the same
// (runtime fingerprint).
enum class ExactWire { kAuto, kSharded, kAllreduce };
ExactWire exactWire();
constexpr int64_t kShardedMinValues = int64_t{1} << 16;
// Whether an exact sum of `values` int64s over a group of `group` workers
// goes the sharded way (by exactWire()).
bool useShardedSum(int64_t values, int group);

struct StepStats {
  int64_t step = 0;
  double loss = 0.0;            // mean training loss over the global batch
  double train_accuracy = 0.0;  // over the global batch
  double lr = 0.0;
  double grad_norm = 0.0;       // before clipping; 0 when clipping is off
  int attempts = 1;             // > 1 when the fixed-point bound forced a redo
  double seconds = 0.0;         // wall time of the step on this worker
  double reduce_seconds = 0.0;  // of which spent in collectives
  // Payload bytes this worker handed to all-reduces in the step (every
  // attempt; gradients, flags and loss statistics), point-to-point
  // transfers of a pipeline not included.
  int64_t reduced_bytes = 0;
};

struct EvalStats {
  double accuracy = 0.0;
  double loss = 0.0;     // mean per sample
  double seconds = 0.0;  // wall time of the evaluation on this worker
};

// Test seam: what tests change in a run without hooks in the production
// path (an executor without a probe behaves as with this default one).
class ExecutorProbe {
 public:
  virtual ~ExecutorProbe() = default;
  // Each VN's gradient of each parameter, before it is quantised; may
  // change it in place. `attempt` counts redos of the step from 1.
  virtual void onGradient(int64_t /*step*/, int64_t /*vn*/, int /*attempt*/, torch::Tensor& /*grad*/) {}
  // The order in which a data-parallel worker runs its VNs each step: a
  // permutation of `vns`.
  virtual std::vector<int64_t> vnOrder(std::vector<int64_t> vns) { return vns; }
  // Named points of a step (the test build's faults strike there; it may
  // throw, as a lost collective would). A data-parallel step: "compute"
  // before this worker's first VN (no sum started), "reduce" once its last
  // VN has started every sum, before it waits for them, "reduced" once
  // they all ended here, before the optimiser step. A pipeline step:
  // "last-sum" once its last world collective ended here. The first
  // attempt of a step only.
  virtual void atPoint(const char* /*point*/, int64_t /*step*/) {}
};

// The state and the step logic both executors share.
class StepCore {
 public:
  // `train` must outlive the core; total_steps feeds the LR schedule.
  // `stage_local`: hold no layer (each is built and freed at once, keeping
  // only its shapes) until holdLayers().
  StepCore(const JobSpec& job, int64_t total_steps, const Dataset& train, bool stage_local);

  // Control values that ride on the step's reduction of flags (for the
  // control plane: pending generation, leave requests): a pipeline's MAX
  // all-reduce, a data-parallel step's gradient sum (VnExecutor::
  // writeSlots); reducedControl() is their maximum over workers once a
  // step returns.
  void setControl(std::vector<double> local) { control_ = std::move(local); }
  const std::vector<double>& reducedControl() const { return reduced_control_; }
  // Emulates a device `factor` times slower (>= 1; 1 = this machine's
  // speed): after each VN's compute (a forward, backward or recompute in a
  // pipeline) the worker idles (factor - 1) x the time that compute took.
  // Timing only: the results are unchanged. docs/resources.md.
  void setSlowdown(double factor);
  double slowdown() const { return slowdown_; }
  void setProbe(ExecutorProbe* probe) { probe_ = probe; }

  int64_t nextStep() const { return step_; }
  LayerList& model() { return *model_; }
  const GradAccumulator& accumulator() const { return *acc_; }
  // Bytes of the parameters this worker holds now (a pipeline stage: its
  // own layers and the copy of a tied weight), and the most it held at any
  // point since it was built.
  int64_t modelBytes() const;
  int64_t peakModelBytes() const { return peak_model_bytes_; }
  std::string jobId() const;
  // The job keys that change the model, with their values: a resume must
  // match them all (job files may change evaluation, logging, checkpoint
  // and folder keys).
  nlohmann::json meaning() const;
  // Layers whose state this worker holds, in order: all of them, or a
  // stage's own plus the layer owning a weight it shares. What a resume
  // loads.
  std::vector<size_t> heldLayers() const;

  // Training state: everything a resumed or joining worker needs to continue
  // bit for bit (parameters, buffers, optimiser state, scale state, step),
  // per layer; here of layers [lo, hi) (first_layer = lo). The tensors are
  // the live ones: snapshot them before training on.
  CheckpointData exportState(size_t lo, size_t hi) const;
  NamedTensors layerState(size_t layer) const;  // one layer's part of it
  // Loads step, optimiser step count and scale state, and the layers in
  // `data` (from data.first_layer on) into the tensors this worker holds;
  // tensors it does not hold are skipped. Unless `partial` (a stage loading
  // its layers in parts, or the step alone), `data` must hold every layer.
  // Throws InputError naming what does not fit when `data` is not a state
  // of this job's model.
  void importState(const CheckpointData& data, bool partial);
  // The whole state as live tensors in a fixed order plus integers, for
  // broadcasting it to data-parallel workers that join.
  std::vector<torch::Tensor> stateTensors() const;
  std::vector<int64_t> stateMeta() const;  // step, optimiser steps, scales...
  void setStateMeta(const std::vector<int64_t>& meta);
  // Copies one layer's state (as layerState() names it, e.g. received from
  // another worker) into the tensors this worker holds of that layer;
  // tensors it does not hold are skipped. InputError naming the tensor
  // when names, types or shapes differ.
  void importLayer(size_t layer, const NamedTensors& state);
  // The hash of layers [lo, hi) (core/model_hash.h): per layer, in order.
  std::vector<std::string> layerHashes(size_t lo, size_t hi) const;

  // A pipeline step whose stage sums and flags are done is *prepared* until
  // its last world collective ends (StageExecutor::reduce). When that
  // collective fails here, the buffer set aside by abandonBuffer() still
  // holds the whole step for this worker's layers: if another member got
  // through it (it committed the step), finishPrepared() commits the step
  // here too, bit for bit as they did (its loss is not known here: only
  // the metrics line needs it, and theirs has it); else discardPrepared().
  // docs/pipeline.md, "One step for every stage".
  bool prepared() const { return prepared_acc_ != nullptr; }
  void finishPrepared();
  void discardPrepared() { prepared_acc_ = nullptr; }

  // Wave Synchronous Parallel (docs/wsp.md). Per segment of the buffer, in
  // its order: what kind of value it sums and the live tensor holding the
  // state behind it (a parameter; a batch norm's running mean or variance;
  // none for the loss statistics), with the batch norm's momentum.
  struct Segment {
    enum Kind { kParam, kBnMean, kBnVar, kStats } kind;
    torch::Tensor state;
    double momentum = 0.0;
  };
  std::vector<Segment> segments() const;
  GradAccumulator& buffer() { return *acc_; }
  // The minibatch of this step, without any optimiser: a step's VNs and
  // their local redo as runStep does them, then plain SGD on the local
  // weights, w -= lr(step) x scale x sum / B, batch norms left as they
  // are; the buffer keeps the sums until the next step.
  void setLocalSgd(bool on, double scale = 1.0) {
    local_sgd_ = on;
    local_scale_ = scale;
  }
  void setStepCounter(int64_t step) { step_ = step; }

 private:
  friend class VnExecutor;
  friend class StageExecutor;
  void finishLocal(GradAccumulator& acc, StepStats& st);

  // One step: for each attempt, `run` (the VNs' forward and backward,
  // quantised into the buffer) and `reduce` (the buffer's sums and the
  // flags with the control values, gathered in them or MAX-reduced: it
  // fills `flags` when flags_after_sum_); redone with the agreed
  // scales when the bound was exceeded. Then the exact mean gradient of
  // every parameter this worker updates, batch-norm statistics, loss,
  // clipping (pipeline: the per-tensor squares MAX-reduced over `norm_world`)
  // and the optimiser step.
  StepStats runStep(const std::function<void(int attempt)>& run,
                    const std::function<void(std::vector<double>& flags)>& reduce, Communicator* norm_world);
  // MAX-reduces `flags` with the control values appended (and splits them
  // off again).
  void reduceFlags(Communicator& comm, std::vector<double>& flags);
  // The step in flight is prepared (see prepared()) once its sums other
  // than the last and its flags are done, unless the flags ask for a redo
  // (overflow) or a stop (non-finite), or the step clips (the global norm
  // needs a world collective after the sums).
  void markPrepared(const std::vector<double>& flags);
  // The end of a step whose sums and agreed flags are in `acc`: each owned
  // parameter's mean gradient, batch-norm statistics, loss (when `stats`),
  // clipping and the optimiser step; the step counter moves on.
  void finishStep(GradAccumulator& acc, StepStats& st, bool stats, Communicator* norm_world);
  // Starts the sum of the buffer's segments [first, end) over `comm`
  // (exact or float as the job says; exactWire() picks the exact one's
  // wire). read() gives the sums once the work is waited.
  std::unique_ptr<PendingWork> startSum(Communicator& comm, size_t first, size_t end);
  // startSum's reduce.bits = 32 path: the int32 buffer's run is the wire;
  // `tail` int64 slots (the last run's) ride as lanes after it.
  std::unique_ptr<PendingWork> startSum32(Communicator& comm, size_t first, size_t end, size_t float_end,
                                          int64_t tail, bool sharded);
  // After a CommFailure: collectives of the failed generation may still
  // write into the buffer, so it is set aside (never reused) and a fresh
  // one with the same scale state takes over.
  void abandonBuffer();
  // Replaces the buffer with one of `sizes` (per segment), same scales.
  void resizeBuffer(std::vector<int64_t> sizes);
  // Gives storage (built from the job seed) to the hollow layers in
  // `layers` and to the parameters `params` of other layers, and points
  // shared-weight aliases at their owners.
  void holdLayers(const std::vector<char>& layers, const std::vector<size_t>& params);
  // The converse, when a pipeline stage moves (a morph): frees every layer
  // not in `layers` (parameters, gradients, buffers, optimiser state),
  // except the parameters `params` of other layers.
  void releaseLayers(const std::vector<char>& layers, const std::vector<size_t>& params);
  uint64_t vnSeed(int64_t vn) const;
  void emulateSlowdown(double compute_seconds) const;
  size_t segOf(size_t param) const { return params_.size() - 1 - param; }
  // Adds one evaluation batch's summed loss (models/loss.h) and correct predictions.
  void scoreBatch(const torch::Tensor& out, const torch::Tensor& targets, double& loss, int64_t& correct) const;
  void notePeak() { peak_model_bytes_ = std::max(peak_model_bytes_, modelBytes()); }

  JobSpec job_;
  int64_t total_steps_;
  const Dataset* train_;
  std::shared_ptr<LayerList> model_;
  std::vector<torch::Tensor> params_;
  std::vector<VnBatchNorm*> bns_;
  std::unique_ptr<Optimizer> opt_;
  std::unique_ptr<GradAccumulator> acc_;
  GlobalSampler sampler_;
  Prefetcher prefetch_;
  // Segment layout: parameters in reverse order (gradients become ready
  // roughly back to front), then batch-norm mean/var, then [loss, correct].
  size_t bn_seg_ = 0, stats_seg_ = 0;
  std::vector<int64_t> seg_sizes_;  // of the whole model
  std::vector<int> seg_need_;       // contributions per segment per VN (2 for a tied weight)
  // Quantised terms a summed value may have over a step: VNs x the most
  // contributions per VN (the 32-bit format's bound, GradAccumulator).
  int64_t exact_terms_ = 1;
  std::vector<char> seg_ready_;     // per segment, for the current VN
  // Gradient hooks: while accumulating, each parameter's gradient of the
  // current VN goes into the buffer, then on_grad_ runs (the VN executor
  // starts the buckets that are complete).
  bool accumulating_ = false;
  // Exact mode, two VNs in one pass over the buffer: while hold_grads_, the
  // hooks quantise nothing and holdGrads() then takes each hooked leaf's
  // gradient from its grad (held_, by leaf); the next VN's gradient of that
  // leaf is quantised with it (GradAccumulator::addPair). flushHeld()
  // quantises those no later gradient met; dropHeld() forgets them (a step
  // begun again).
  std::vector<torch::Tensor> hooked_;    // the parameters, then the tied uses' leaves
  std::vector<size_t> hooked_param_;     // per hooked leaf: its parameter
  bool hold_grads_ = false;
  std::vector<torch::Tensor> held_;
  // VnExecutor: each leaf's grad is freed as soon as a later hook of the
  // same backward runs (consumed_: the leaves quantised since), not kept
  // until the next VN starts.
  bool free_consumed_ = false;
  std::vector<size_t> consumed_;
  void holdGrads();
  void flushHeld();
  void dropHeld() { std::fill(held_.begin(), held_.end(), torch::Tensor()); }
  int64_t vn_ = 0;  // the VN whose backward runs
  int attempt_ = 1;
  std::function<void()> on_grad_;
  std::vector<size_t> own_params_;  // parameters this worker updates (a stage: incl. a tied copy)
  std::vector<char> norm_owner_;    // per parameter: this worker counts it in the global norm
  std::vector<size_t> own_bns_;     // indices into bns_ this worker updates
  std::vector<double> control_, reduced_control_;
  // runStep() leaves the flags to its `reduce` (VnExecutor: they are gathered
  // in the sum, VnExecutor::writeSlots).
  bool flags_after_sum_ = false;
  std::vector<std::unique_ptr<GradAccumulator>> graveyard_acc_;  // abandoned buffers: never touched again
  // Scratch memory of sharded sums, per run (by its first segment); set
  // aside with the buffer when a step is abandoned.
  std::map<size_t, ShardScratch> scratch_;
  std::vector<std::map<size_t, ShardScratch>> graveyard_scratch_;
  int64_t step_ = 0;
  bool local_sgd_ = false;  // setLocalSgd
  double local_scale_ = 1.0;
  bool prepared_ = false;  // the step in flight is prepared (markPrepared)
  std::vector<double> prepared_flags_;
  GradAccumulator* prepared_acc_ = nullptr;  // a prepared step's buffer, in graveyard_acc_
  double slowdown_ = 1.0;
  int64_t peak_model_bytes_ = 0;
  ExecutorProbe* probe_ = nullptr;
};

// What the control plane calls.
class Executor {
 public:
  virtual ~Executor() = default;
  virtual StepStats step() = 0;  // runs step core().nextStep()
  // After a CommFailure in step(): the step did not commit; the executor
  // is ready for the next generation's communicators.
  virtual void abandonStep() = 0;
  // Loss and accuracy on `test` in batches of `batch`.
  virtual EvalStats evaluate(const Dataset& test, int64_t batch) = 0;
  // The state of the layers this worker runs (StepCore::exportState).
  virtual CheckpointData exportState() const = 0;
  virtual void importState(const CheckpointData& data, bool partial = false) { core_.importState(data, partial); }
  // The hashes of the layers this worker runs, in order (the model hash is
  // their combination: core/model_hash.h).
  virtual std::vector<std::string> layerHashes() const = 0;
  StepCore& core() { return core_; }
  const StepCore& core() const { return core_; }
  // Each step, this worker's compute seconds per VN (its VNs' forward and
  // backward, recomputation in a pipeline, and the emulated slowdown; the
  // last attempt) go into control value `index` (StepCore::setControl) just
  // before they are reduced: each member writes its own slot and
  // leaves the others 0, so every member learns every member's speed
  // (control/straggler.h). -1: off.
  void setSpeedSlot(int index) { speed_slot_ = index; }

 protected:
  Executor(const JobSpec& job, int64_t total_steps, const Dataset& train, bool stage_local)
      : core_(job, total_steps, train, stage_local) {}
  StepCore core_;
  int speed_slot_ = -1;
};

// The data-parallel executor: the worker's VNs in turn, gradients reduced in
// buckets across all workers.
class VnExecutor : public Executor {
 public:
  // `comm` must outlive its use (setCommunicator() replaces it).
  VnExecutor(const JobSpec& job, int64_t total_steps, const Dataset& train, Communicator& comm);

  void setCommunicator(Communicator* comm) { comm_ = comm; }
  // VNs [begin, end) of every step are this worker's (at least one).
  void setVnRange(int64_t begin, int64_t end);

  StepStats step() override;
  // WSP (docs/wsp.md): this worker's minibatch of step core().nextStep()
  // alone, summed over its VNs only and applied as local SGD
  // (StepCore::setLocalSgd); the buffer then holds its sums.
  StepStats localStep();
  void abandonStep() override;
  EvalStats evaluate(const Dataset& test, int64_t batch) override;
  CheckpointData exportState() const override { return core_.exportState(0, core_.model_->size()); }
  std::vector<std::string> layerHashes() const override { return core_.layerHashes(0, core_.model_->size()); }
  std::string hash() const;  // the model hash

 private:
  // hold: keep this VN's gradients for the next VN's (StepCore::hold_grads_).
  void runVn(int64_t vn, bool last, bool hold);
  // What each worker gathers through the last bucket's sum instead of a
  // MAX all-reduce: in exact mode its flags and maxima
  // (GradAccumulator::flagsAndMax, as double bits in int64 slots: adding
  // the others' zeros keeps them), then the control values (its seconds
  // per VN included); float mode only the control values (its flags are
  // read from the summed buffer). writeSlots() fills this worker's slots
  // of the buffer's tail before the last bucket starts; readSlots() gives
  // the maximum over workers of each value (all are >= 0).
  size_t slotValues() const;
  void writeSlots();
  std::vector<double> readSlots() const;
  // Starts the all-reduce of every bucket whose segments are complete, in
  // bucket order; `all`: the rest too (end of the backward pass).
  void launchReadyBuckets(bool all);

  // A bucket is a contiguous run of segments reduced by one all-reduce.
  struct Bucket {
    size_t first_seg, end_seg;
  };
  Communicator* comm_;
  LocalCommunicator alone_;  // localStep's
  std::vector<Bucket> buckets_;  // the last one holds the statistics
  size_t next_bucket_ = 0;       // next bucket to launch
  bool launching_ = false;       // last local VN: start reductions early
  std::vector<std::unique_ptr<PendingWork>> inflight_;
  std::vector<std::unique_ptr<PendingWork>> graveyard_work_;  // of abandoned steps
  int64_t vn_begin_ = 0, vn_end_ = 0;
  double run_start_ = 0;         // the step's VNs started (its last attempt)
  int64_t run_vns_ = 0;          // ... this many
};

}  // namespace morph
