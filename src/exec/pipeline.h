// Pipeline set-up that does not need a running job: where to cut a model
// into stages, and how much memory each stage will need.
//
// The stage executor itself is part of Trainer (setPipeline(); trainer.h),
// since a stage is a worker training a contiguous range of the model's layers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/job_spec.h"
#include "data/dataset.h"
#include "exec/schedule.h"
#include "models/model.h"

namespace morph {

// stages + 1 layer boundaries giving each stage floor or ceil of
// layers / stages consecutive layers. InputError when stages > layers.
std::vector<size_t> evenCuts(size_t layers, int stages);

struct StageMemory {
  // Parameters (and buffers) and optimiser state: the stage's own, with the
  // copy of a weight tied to another stage.
  int64_t model_bytes = 0;
  int64_t optimizer_bytes = 0;
  int64_t accumulator_bytes = 0;  // the fixed-point gradient buffer (own segments)
  int64_t grad_bytes = 0;         // this stage's gradients
  int64_t vn_activation_bytes = 0;  // one VN's forward, measured
  int64_t vn_input_bytes = 0;       // one VN's stage input (what recomputation stashes)
  int64_t live_vns = 0;             // most VNs stashed at once (schedule)
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

// Estimates each stage's memory for the job cut at `cuts`, run with the
// given schedule on `micro_batches` VNs per replica: the tensor sizes are
// exact, a VN's activations are measured by running one training forward
// of each stage on real samples and reading the allocator's bytes in use.
std::vector<StageMemory> estimateStageMemory(const JobSpec& job, const std::vector<size_t>& cuts,
                                             const ScheduleOptions& schedule, const Dataset& train);

}  // namespace morph
