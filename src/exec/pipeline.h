// The stage executor (a worker training a contiguous range of the model's
// layers, one stage of a pipeline) and the pipeline set-up that does not
// need a running job: where to cut a model into stages, and how much memory
// each stage will need.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/job_spec.h"
#include "data/dataset.h"
#include "exec/schedule.h"
#include "exec/trainer.h"
#include "models/model.h"

namespace morph {

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
  Communicator* world = nullptr;  // every rank: flags, loss, clipping, evaluation sums
  Communicator* stage = nullptr;  // this stage's replicas (rank = replica); null when replicas == 1
  // Per set of stages that hold a shared weight (its owner's layer and the
  // layers that use it; StageExecutor::tiedStageSets), the group of those
  // stages of every replica that this stage is in (rank = the stage's place
  // in the set * replicas + replica).
  std::map<std::vector<int>, Communicator*> tied;
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

class SendChannel;  // pipeline.cpp
struct SendChannelDeleter {
  void operator()(SendChannel* c) const;
};

// One pipeline stage. Per step it runs its schedule's action list over its
// replica's VNs: activations go to the next stage and gradients to the
// previous one, each VN's gradient is quantised into the single-worker
// segment layout, and the stage's replicas, the tied weight's two stages and
// every rank reduce what they share, so the step gives the single-process
// bits. It holds only its own layers.
class StageExecutor : public Executor {
 public:
  // Holds no layer until place() (every layer is built and freed at once,
  // keeping its shapes).
  StageExecutor(const JobSpec& job, int64_t total_steps, const Dataset& train);
  ~StageExecutor() override;
  // For a pipeline cut (stages + 1 layer boundaries): the sets of stages,
  // sorted, that hold a weight shared between layers on different stages
  // (the owner's and its users'), each set once, in order. Each set needs a
  // process group of its own, which sums the weight's gradient exactly.
  std::vector<std::vector<int>> tiedStageSets(const std::vector<size_t>& cuts);
  // Runs stage placement.stage of replica placement.replica over the
  // replica's VNs [vn_begin, vn_end), following the schedule's action list
  // (validated here; InputError if it is not valid). Builds the stage's
  // layers (and the copy of a weight it shares with another stage) from the
  // job seed, nothing else; learns its input's shape from the previous
  // stage. Every rank of the pipeline calls it at the same time.
  // Called again (a morph: a new generation with another placement), it
  // frees the layers the worker no longer runs and keeps the state of
  // those it still runs; layers new to it start from the seed until
  // importLayers() gives them their state.
  void place(const PipelinePlacement& placement, int64_t vn_begin, int64_t vn_end, const PipelineComms& comms);
  const PipelinePlacement& placement() const { return pipe_; }
  // The layers this stage runs, [first, second).
  std::pair<size_t, size_t> layerRange() const;
  // Layers (parameters, buffers, optimiser state) received from other
  // workers; each must be one this placement holds, in whole or in part
  // (a stage's copy of a tied weight takes only that tensor).
  void importLayers(const std::map<size_t, NamedTensors>& layers);
  // Per-action trace and per-step timing.
  void setTracing(bool on) { tracing_ = on; }
  const std::vector<TraceEvent>& trace() const { return trace_; }
  const std::vector<StageTiming>& stageTimings() const { return timings_; }

  StepStats step() override;
  void abandonStep() override;
  // Every rank calls it at the same step; the batches flow through the
  // stages (each replica takes an even share of them) and the last stages'
  // sums are combined over the world, so no rank needs the whole model.
  EvalStats evaluate(const Dataset& test, int64_t batch) override;
  CheckpointData exportState() const override;  // this stage's layers
  std::vector<std::string> layerHashes() const override;  // this stage's layers

 private:
  void runSchedule();
  // Stage gradients among replicas and the tied weight with flags and
  // control values (MAX) over every rank, then loss statistics (SUM) over
  // every rank (pipeline.cpp says why in that order).
  void reduce(std::vector<double>& flags);

  PipelinePlacement pipe_;
  PipelineComms pcomm_;
  int64_t vn_begin_ = 0, vn_end_ = 0;
  std::vector<Action> actions_;     // this rank's list for one step
  std::vector<std::pair<size_t, size_t>> own_runs_;  // segment runs reduced among replicas
  std::vector<std::pair<size_t, std::vector<int>>> tied_segs_;  // segment, the stages that sum it
  std::vector<std::vector<int64_t>> cut_shapes_;  // this stage's input [k-1] and output [k]
  bool tracing_ = false;
  std::vector<TraceEvent> trace_;
  std::vector<StageTiming> timings_;
  std::unique_ptr<SendChannel, SendChannelDeleter> act_out_, grad_out_;
  // Of past placements: a sender may still be blocked on a peer of a failed
  // generation, so it is never destroyed while the process runs.
  std::vector<std::unique_ptr<SendChannel, SendChannelDeleter>> old_channels_;
};

// One layer's state moving from world rank `src` to world rank `dst` when a
// pipeline morphs (docs/pipeline.md, "Morphing").
struct LayerTransfer {
  size_t layer;
  int src, dst;
};

// Every rank of `world` calls it with the same list, before it is placed
// anew: it sends the layers it is the source of (from the state it holds
// now: StepCore::layerState) and receives those it is the destination of,
// point to point, encoded as checkpoint tensor files (checksummed). Returns
// the layers received; adds the bytes received to `*bytes_in`. Throws
// CommFailure when a peer fails, InputError on a damaged message.
std::map<size_t, NamedTensors> moveLayers(const StepCore& core, Communicator& world,
                                          const std::vector<LayerTransfer>& transfers, int64_t* bytes_in);

// stages + 1 layer boundaries giving each stage floor or ceil of
// layers / stages consecutive layers. InputError when stages > layers.
std::vector<size_t> evenCuts(size_t layers, int stages);

struct StageMemory {
  // Parameters (and buffers) and optimiser state: the stage's own, with the
  // copy of a weight tied to another stage.
  int64_t model_bytes = 0;
  int64_t optimizer_bytes = 0;
  int64_t accumulator_bytes = 0;  // the fixed-point gradient buffer (own segments), exact: + the sharded sum's scratch
  int64_t grad_bytes = 0;         // this stage's gradients
  int64_t vn_activation_bytes = 0;  // one VN's forward, measured
  int64_t vn_input_bytes = 0;       // one VN's stage input (what recomputation stashes)
  int64_t live_vns = 0;             // most VNs stashed at once (runStashBound)
  int64_t activation_bytes = 0;     // all VN-dependent memory
  // The process's fixed cost (runtime, libraries, data: this process's
  // resident size when the estimate starts), and the largest layer of
  // another stage: a worker builds each layer from the seed and frees the
  // others' at once, so one of them exists at a time.
  int64_t runtime_bytes = 0, init_bytes = 0;
  int64_t snapshot_bytes = 0;  // with checkpoints: the copy of its state a stage hands its writer
  int64_t training() const {
    return model_bytes + optimizer_bytes + accumulator_bytes + grad_bytes + activation_bytes + snapshot_bytes;
  }
  int64_t total() const { return runtime_bytes + init_bytes + training(); }
};

// An emulated slow link for pipeline sends: every activation/gradient
// message is held back delay_ms +- jitter_ms (uniform, order kept per
// channel) on its sender's send thread before it is sent. A seam for the
// test and bench harness only (tests/cli/crashy_main.cpp sets it from
// MORPH_TEST_PIPE_DELAY_MS): the shipped binary never sets it, so its
// sends are never delayed. It changes timing only, never results; the
// planner and simulator read delay_ms as the link delay of each message
// (SimOptions::link_delay_s). Set it before the first pipeline starts.
struct LinkEmulation {
  double delay_ms = 0;
  double jitter_ms = 0;
};
void setLinkEmulation(const LinkEmulation& e);
LinkEmulation linkEmulation();

// Estimates each stage's memory for the job cut at `cuts`, run with the
// given schedule on `micro_batches` VNs per replica: the tensor sizes are
// exact, a VN's activations are measured by running one training forward
// of each stage on real samples and reading the allocator's bytes in use.
std::vector<StageMemory> estimateStageMemory(const JobSpec& job, const std::vector<size_t>& cuts,
                                             const ScheduleOptions& schedule, const Dataset& train);

}  // namespace morph
