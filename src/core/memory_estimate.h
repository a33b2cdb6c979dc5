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

// What a WSP virtual worker (docs/wsp.md, "Memory") holds beyond a
// data-parallel worker of the same model, in bytes: what src/wsp allocates.
// A VW runs its minibatches one after another on its local weights, so
// sync.wave adds nothing here: one wave sum whatever the wave; the pushes a
// shard may hold grow with sync.staleness instead (the gate lets the VWs
// push clocks version .. version + D before the slowest pushes `version`).
struct WspMemoryInput {
  double values = 0;        // a push's values: parameters and batch-norm statistics
  double shard_values = 0;  // the largest shard's (<= values / W + the largest tensor)
  double shard_params = 0;  // parameters among them
  int optim_copies = 0;     // optimiser state tensors per parameter (SGD momentum 1, AdamW 2)
  int vws = 2;              // W
  // Clocks whose pushes a shard may hold at once: min(D + 1, the job's
  // clocks) (the job's clocks ceil(steps / wave) where known).
  int64_t pending_clocks = 1;
  bool checkpoints = false;
};
struct WspMemory {
  int64_t wave_sum = 0;  // the VW's int64 wave sum
  int64_t push = 0;      // its push in flight: every other shard's payload
  int64_t shard = 0;     // its shard's global weights, gradient and optimiser state
  int64_t receive = 0;   // the server threads' push buffers, one per peer
  int64_t pending = 0;   // pushes not applied yet: pending_clocks x W - 1 of the shard, and the clock's sum
  int64_t replies = 0;   // pull replies in flight: two copies of the shard's weights per peer
  int64_t snapshot = 0;  // with checkpoints: the shard's kept state
  int64_t own = 0;       // D >= 1: its own pushes not yet applied, as floats (WspWorker::own_)
  int64_t total() const { return wave_sum + push + shard + receive + pending + replies + snapshot + own; }
  // "wave sum 1.0 MiB + push 0.5 MiB + ..."
  std::string describe() const;
};
WspMemory wspWorkerMemory(const WspMemoryInput& in);
// Clocks whose pushes a shard may hold: min(D + 1, clocks); clocks = 0:
// unknown (a job given in epochs before its data is read).
int64_t wspPendingClocks(int64_t staleness, int64_t clocks);
// Throws InputError (exit 2) when a VW's `worker_bytes` (the data-parallel
// worker's estimate) plus wspWorkerMemory(in) exceeds `cap` (0: none), with
// in.pending_clocks = wspPendingClocks(staleness, clocks): naming job_file,
// sync.staleness, `where` (the device), the need and the cap, and the
// largest D that fits, when D = 0 would fit; naming sync.mode otherwise.
void checkWspMemory(const std::string& job_file, const std::string& where, int64_t worker_bytes, WspMemoryInput in,
                    int64_t staleness, int64_t clocks, int64_t cap);

}  // namespace morph
