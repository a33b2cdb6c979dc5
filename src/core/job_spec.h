// Job spec: what a job *means* (data, model, global batch, optimiser,
// reduction), never the hardware it runs on. Loaded from TOML, validated in
// full before any work starts; every problem is an InputError naming the
// file, the key and what was expected (docs/job_file.md lists the keys).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace morph {

enum class ReduceMode { kExact, kFloat };
// [sync] mode: bulk-synchronous steps (every existing job), or Wave
// Synchronous Parallel through parameter servers (docs/wsp.md).
enum class SyncMode { kSync, kWsp };

// Input paths (data.path, the npy files, model.path) are stored as parseJob
// resolved them: a relative one given in the job file (or with --set) is
// joined to the job file's folder, so the result is absolute, or relative
// to the working directory when the job file's path was.
struct DataSpec {
  std::string dataset;  // "fashion-mnist" | "synthetic" | "fortunes-char" | "npy"
  std::string path;     // folder with the dataset's files
  // npy only: the four .npy files, and the normalisation of inputs,
  // x' = (x * scale - mean) / std, scale = 1/255 for uint8 and 1 for float32.
  std::string train_x, train_y, test_x, test_y;
  double mean = 0.0, std = 1.0;
  int64_t seq_len = 0;     // fortunes-char: characters per sample
  int64_t train_size = 0;  // synthetic only
  int64_t test_size = 0;   // synthetic only
};

struct ModelSpec {
  std::string name;              // "mlp" | "cnn" | "gpt-mini" | "torchscript"
  std::vector<int64_t> hidden;   // mlp hidden widths
  std::vector<int64_t> channels; // cnn conv channels
  int64_t fc = 0;                // cnn fully connected width
  int64_t layers = 0, dim = 0, heads = 0;  // gpt-mini
  int64_t seq_len = 0;           // gpt-mini: context length (= data.seq_len)
  // mlp, cnn: one sample's shape as the model sees it, (C, H, W) for
  // images, and the number of classes. From the data (npy); else 1x28x28, 10.
  std::vector<int64_t> input = {1, 28, 28};
  int64_t classes = 10;
  double dropout = 0.0;
  // torchscript: the module file and XXH64 of its bytes (a resume and
  // every worker must train the same file).
  std::string path, digest;
  // torchscript: model.cuts, module paths to cut before (docs/models.md);
  // empty: the default cuts.
  std::vector<std::string> cuts;
  // "cross_entropy" (int64 class labels) | "mse" (float32 targets, npy
  // only). `target`: mse: one sample's target shape, () for one value.
  std::string loss = "cross_entropy";
  std::vector<int64_t> target;
};

struct OptimSpec {
  std::string name = "sgd";  // "sgd" | "adamw"
  double lr = 0.05;
  double momentum = 0.0;
  bool nesterov = false;
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  int64_t warmup_steps = 0;
  std::string schedule = "constant";  // "constant" | "cosine"
  double min_lr = 0.0;
  double clip_norm = 0.0;  // 0 = no clipping
};

struct JobSpec {
  std::string file;  // where the spec came from, for messages
  std::string name;
  uint64_t seed = 1;
  int64_t steps = 0;   // resolved: either given, or from epochs once the dataset size is known
  double epochs = 0;   // 0 when steps was given
  int threads = 1;     // intra-op threads per worker (determinism needs it fixed)

  DataSpec data;
  ModelSpec model;
  int64_t global_batch = 0;
  int64_t virtual_nodes = 1;
  OptimSpec optim;
  ReduceMode reduce_mode = ReduceMode::kExact;
  int headroom_bits = 3;
  // reduce.bits: the exact sum's fixed-point width on the wire, 64 or 32
  // (docs/exact_reduction.md, "The 32-bit format").
  int reduce_bits = 64;
  // [sync] (docs/wsp.md): mode; with "wsp", staleness D (waves a virtual
  // worker may run ahead of the slowest, >= 0) and wave Nm (minibatches
  // per wave, >= 1). Both apply only to "wsp".
  SyncMode sync_mode = SyncMode::kSync;
  int64_t staleness = 0;
  int64_t wave = 1;
  // sync.stale_update (wsp only; docs/wsp.md, "Stale pushes"): what a
  // server does with a push computed on weights s >= 1 clocks old: "none"
  // (as a fresh one), "scale" (its gradient x 1/(1 + s)), "bypass" (x 1/(1
  // + s), applied outside the momentum buffer), "bypass_squared" (as
  // "bypass", x 1/(1 + s)^2). Pushes with s = 0 are applied as they are
  // under every rule.
  std::string stale_update = "bypass";
  // sync.server_steps (wsp only; docs/wsp.md, "What the parameter servers
  // apply per clock"): "per_minibatch" (the servers' optimiser takes one
  // step per minibatch of the wave, each on the wave's mean gradient at its
  // step's learning rate: a sync job's momentum and schedule per step) or
  // "per_clock" (one step per clock on the wave's summed gradient at the
  // wave's first learning rate: the rule before this key).
  std::string server_steps = "per_minibatch";
  int64_t eval_every = 0;  // 0: only at the end
  int64_t eval_batch = 1000;
  int64_t log_every = 10;
  int64_t checkpoint_every = 0;  // steps; 0 = no checkpoints
  int64_t checkpoint_keep = 3;
  int64_t checkpoint_max_failures = 3;  // intervals in a row without a checkpoint before the job stops
  std::string checkpoint_dir;     // "" = OUT/checkpoints (docs/job_file.md)
  // Stragglers of data-parallel jobs (docs/distributed.md, "Stragglers"):
  // a worker whose seconds per VN stay over factor x (or under 1/factor x)
  // what its peers or its device type predict for `steps` committed steps
  // (one step within the factor takes one back) is re-planned around (when
  // replan).
  double straggler_factor = 2.0;
  int64_t straggler_steps = 10;
  bool straggler_replan = true;
  // Pipeline jobs: seconds between the manager's checks whether workers
  // waiting as spares make a faster shape (a join is checked at once).
  double grow_interval = 5.0;
  // Seconds a member waits in a collective before it asks whether the
  // members it waits for are still alive (docs/distributed.md,
  // "Deadlines"); 0: derived from the measured step, evaluation and
  // checkpoint-snapshot times. A member that still heart-beats is never
  // given up on for being slow.
  double collective_timeout = 0;

  int64_t vnSize() const { return global_batch / virtual_nodes; }
  // Loss terms per sample: 1 for classification, seq_len for a language
  // model. The step's loss and gradient are means over all of them.
  // mse: every value of a sample's target.
  int64_t targetsPerSample() const;
  bool regression() const { return model.loss == "mse"; }
  // Steps for a dataset of `train_size` samples (resolves `epochs`).
  int64_t resolveSteps(int64_t train_size) const;
};

// Loads and validates `path`, applying `overrides` ("key.path=value", value in
// TOML syntax, bare words taken as strings) first. Throws InputError.
JobSpec loadJobFile(const std::string& path, const std::vector<std::string>& overrides = {});
// The text of a job file; InputError when it cannot be read.
std::string readJobFile(const std::string& path);
// Same, from TOML text; `origin` is the job file's path: it names the
// source in messages, and relative input paths are taken from its folder.
JobSpec parseJob(const std::string& toml_text, const std::string& origin,
                 const std::vector<std::string>& overrides = {});

const char* toString(ReduceMode m);
const char* toString(SyncMode m);

}  // namespace morph
