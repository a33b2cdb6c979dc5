// Memory a job needs, estimated from its spec alone (nothing is allocated):
// a job whose model or data cannot fit this machine is refused with exit 2
// before any tensor exists, instead of dying in the kernel's OOM killer
// half-way through start-up.
//
// The estimate is a lower bound: parameters x the bytes the engine keeps per
// parameter (the same accounting as a pipeline stage's estimate,
// exec/pipeline.h estimateStageMemory) plus the in-memory dataset.
// Activations are left out, so a job refused by it cannot fit however it is
// run; a job it lets through may still need more.
#pragma once

#include <cstdint>
#include <string>

#include "core/job_spec.h"

namespace morph {

struct MemoryEstimate {
  double parameters = 0;       // trainable values of the whole model
  int64_t bytes_per_parameter = 0;
  std::string per_parameter;   // what those bytes are, for messages
  double model_bytes = 0;      // parameters x bytes_per_parameter (+ buffers)
  double data_bytes = 0;       // both splits as held in memory (npy: 0, mapped)
  std::string model_keys;      // the job keys that size the model, e.g. "model.hidden"
  std::string data_keys;       // ... and the data, e.g. "data.train_size"
};

// One process holding the whole model and the dataset. Counts parameters
// analytically from job.model (tests compare with buildModel).
MemoryEstimate estimateJobMemory(const JobSpec& job);

// Bytes this machine can still give (MemAvailable of /proc/meminfo); -1 when
// unknown (then nothing is refused).
int64_t availableMemoryBytes();

// Throws InputError naming job.file, the responsible keys, the estimate and
// `available` when `model_copies` models and `data_copies` datasets (one per
// local worker process) exceed it. `available` < 0 checks nothing.
void checkJobFitsMemory(const JobSpec& job, double model_copies, double data_copies, int64_t available);

// "1.5 GiB"
std::string formatBytes(double bytes);

}  // namespace morph
