// The job's loss (model.loss), in one place: a data-parallel worker's VNs,
// a pipeline's last stage, evaluation, calibration and the memory estimate
// all call these.
//
// Every loss is *summed* over the targets of a batch: a VN contributes the
// sum over its samples, and the step's loss and gradient are that sum,
// reduced exactly over VNs, divided by the global batch's target count
// (JobSpec::targetsPerSample), i.e. the mean PyTorch's reduction='mean'
// takes over the whole global batch.
#pragma once

#include <cstdint>

#include "core/job_spec.h"

namespace morph {

// out: the model's output for b samples; y: their targets, int64 class
// labels (b) or (b, T) for cross-entropy (out is (b, classes) or
// (b, T, classes)), float32 (b, target...) for mse (out holds the same
// number of values per sample and is read in the targets' shape).
torch::Tensor lossSum(const ModelSpec& model, const torch::Tensor& out, const torch::Tensor& y);
// Correct predictions (argmax = label); 0 for mse.
int64_t correctPredictions(const ModelSpec& model, const torch::Tensor& out, const torch::Tensor& y);

}  // namespace morph
