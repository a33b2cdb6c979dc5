// Trained models out of Morph (docs/models.md, "Export"): a checkpoint's
// parameters and buffers as a file PyTorch loads.
#pragma once

#include <string>

#include "core/job_spec.h"

namespace morph {

// Writes the model of `checkpoint` (a step-* folder, or a folder of them:
// its newest intact checkpoint) of `job` to `out`. A TorchScript job: the
// job's module file with the checkpoint's parameters and buffers
// (torch.jit.load reads it); a built-in model: a torch.load-able dict of
// named tensors, "LAYER.NAME". InputError naming the file for a checkpoint
// of another job or model, or a tensor the module does not have. Returns
// the checkpoint's step.
int64_t exportModel(const JobSpec& job, const std::string& checkpoint, const std::string& out);

}  // namespace morph
