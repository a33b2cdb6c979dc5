// Optimisers and learning-rate schedules. Written over plain tensors (not
// torch::optim) so that their state is explicit: it is what checkpoints and
// joining workers must carry to continue bit for bit.
#pragma once

#include <memory>
#include <vector>

#include "core/job_spec.h"

namespace morph {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update of every parameter from its .grad() (the mean gradient).
  virtual void step(double lr) = 0;
  // The live state tensors of parameter i, named ("momentum"; "exp_avg",
  // "exp_avg_sq"); empty when the optimiser keeps none for it. Allocated
  // (zeros) on first use.
  virtual std::vector<std::pair<std::string, torch::Tensor>> paramState(size_t i) = 0;
  // Frees parameter i's state (a pipeline stage drops other stages' state);
  // it comes back as zeros if asked for again.
  virtual void dropState(size_t i) = 0;
  // Steps taken so far (bias correction, first-step momentum).
  int64_t stepCount() const { return steps_; }
  void setStepCount(int64_t n) { steps_ = n; }

 protected:
  int64_t steps_ = 0;
};

std::unique_ptr<Optimizer> makeOptimizer(const OptimSpec& spec, std::vector<torch::Tensor> params);

// Learning rate of `step` (0-based) of a job of `total_steps`: linear warm-up
// from lr/warmup to lr, then constant or cosine decay to min_lr.
double learningRate(const OptimSpec& spec, int64_t step, int64_t total_steps);

// Global L2 norm of the gradients: each tensor's sum of squares in double,
// then those sums added in parameter order, so it is the same bits on every
// worker holding the same gradients, and a pipeline can assemble it from
// the per-tensor sums of its stages.
double squaredNorm(const torch::Tensor& grad);
double normOfSquares(const std::vector<double>& squares);  // sqrt of the ordered sum
// Scales the defined gradients by max_norm / norm when norm > max_norm > 0.
void clipToNorm(const std::vector<torch::Tensor>& params, double norm, double max_norm);

}  // namespace morph
