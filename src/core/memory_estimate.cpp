#include "core/memory_estimate.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/parse_number.h"

namespace morph {
namespace {

struct ModelCount {
  double params = 0, buffers = 0;  // values; buffers: batch-norm running statistics
  std::string keys;
};

// Mirrors buildModel (models/zoo.cpp) layer by layer.
ModelCount countModel(const ModelSpec& m) {
  ModelCount c;
  double in = 1;
  for (int64_t v : m.input) in *= static_cast<double>(v);
  const double classes = static_cast<double>(m.classes);
  auto linear = [&](double a, double b) { c.params += a * b + b; };
  if (m.name == "mlp") {
    double prev = in;
    for (int64_t h : m.hidden) {
      linear(prev, static_cast<double>(h));
      prev = static_cast<double>(h);
    }
    linear(prev, classes);
    c.keys = "model.hidden";
  } else if (m.name == "cnn") {
    const double c0 = static_cast<double>(m.channels.at(0)), c1 = static_cast<double>(m.channels.at(1));
    const double chan = static_cast<double>(m.input.at(0));
    c.params += chan * c0 * 9 + 2 * c0 + c0 * c1 * 9 + 2 * c1;  // convs without bias, batch-norm scale and shift
    c.buffers += 2 * c0 + 2 * c1;
    const double flat = c1 * static_cast<double>(m.input.at(1) / 4) * static_cast<double>(m.input.at(2) / 4);
    linear(flat, static_cast<double>(m.fc));
    linear(static_cast<double>(m.fc), classes);
    c.keys = "model.channels, model.fc";
  } else if (m.name == "gpt-mini") {
    const double d = static_cast<double>(m.dim);
    c.params += 256 * d + static_cast<double>(m.seq_len) * d;  // token and position embeddings (the head is tied)
    c.params += static_cast<double>(m.layers) * (12 * d * d + 13 * d);  // per block: 2 layer norms, qkv, proj, 4x MLP
    c.params += 2 * d;                                                  // final layer norm
    c.keys = "model.dim, model.layers";
  }
  return c;
}

}  // namespace

MemoryEstimate estimateJobMemory(const JobSpec& job) {
  MemoryEstimate e;
  const ModelCount c = countModel(job.model);
  e.parameters = c.params;
  e.model_keys = c.keys;
  // Per parameter, as a worker keeps it (exec/trainer.cpp, exec/pipeline.cpp):
  // the float32 value, its mean gradient, the accumulator over VNs (int64
  // fixed point in exact mode, int32 with reduce.bits = 32), the optimiser's state, and with checkpoints
  // the snapshot of value and state handed to the writer.
  int64_t state = 0;
  if (job.optim.name == "adamw") state = 2;
  else if (job.optim.momentum > 0.0) state = 1;
  const bool exact = job.reduce_mode == ReduceMode::kExact;
  const bool exact64 = exact && job.reduce_bits == 64;
  e.bytes_per_parameter = 4 + 4 + (exact64 ? 8 : 4) + 4 * state;
  e.per_parameter = std::string("value 4 + gradient 4 + ") +
                    (exact64 ? "int64 accumulator 8" : exact ? "int32 accumulator 4" : "float accumulator 4");
  if (state > 0) e.per_parameter += " + " + std::string(state == 2 ? "adamw state 8" : "momentum 4");
  if (job.checkpoint_every > 0) {
    e.bytes_per_parameter += 4 + 4 * state;
    e.per_parameter += " + checkpoint snapshot " + std::to_string(4 + 4 * state);
  }
  e.model_bytes = e.parameters * static_cast<double>(e.bytes_per_parameter) + 4 * c.buffers;

  const DataSpec& d = job.data;
  if (d.dataset == "synthetic") {
    // (N, 28, 28) uint8 images and (N) int64 labels per split (data/dataset.cpp).
    e.data_bytes = static_cast<double>(d.train_size + d.test_size) * (28 * 28 + 8);
    e.data_keys = "data.train_size, data.test_size";
  } else if (d.dataset == "fashion-mnist") {
    e.data_bytes = 70000.0 * (28 * 28 + 8);
    e.data_keys = "data.path";
  } else if (d.dataset == "fortunes-char") {
    // The corpus is read whole: its files' sizes.
    std::error_code ec;
    for (const auto& f : std::filesystem::directory_iterator(d.path, ec))
      if (f.is_regular_file(ec)) e.data_bytes += static_cast<double>(f.file_size(ec));
    e.data_keys = "data.path";
  } else {
    e.data_keys = "data.train_x";  // npy: memory-mapped, paged in and out by the kernel
  }
  return e;
}

int64_t availableMemoryBytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream ss(line.substr(13));
    std::string kib, unit;
    ss >> kib >> unit;
    const auto v = parseInt64(kib);
    if (!v || unit != "kB") return -1;
    return *v * 1024;
  }
  return -1;
}

std::string formatBytes(double bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) {
    bytes /= 1024;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

void checkJobFitsMemory(const JobSpec& job, double model_copies, double data_copies, int64_t available) {
  if (available < 0) return;
  const MemoryEstimate e = estimateJobMemory(job);
  const double model = model_copies * e.model_bytes, data = data_copies * e.data_bytes;
  const double need = model + data;
  if (need <= static_cast<double>(available)) return;
  std::ostringstream os;
  os << job.file << ": " << (model >= data ? e.model_keys : e.data_keys) << ": the job needs at least "
     << formatBytes(need) << " of memory but this machine has " << formatBytes(static_cast<double>(available))
     << " available (MemAvailable in /proc/meminfo). Estimate: model " << formatBytes(model) << " = ";
  if (model_copies != 1) os << model_copies << " copies x ";
  char params[32];
  std::snprintf(params, sizeof params, "%.4g", e.parameters);
  os << params << " parameters x " << e.bytes_per_parameter << " bytes (" << e.per_parameter << "); data "
     << formatBytes(data);
  if (data_copies != 1) os << " (" << data_copies << " copies)";
  os << " from " << e.data_keys << "; activations not counted. Make "
     << (model >= data ? e.model_keys : e.data_keys) << " smaller"
     << (model_copies > 1 || data_copies > 1 ? ", or start fewer workers on this machine" : "");
  throw InputError(os.str());
}

WspMemory wspWorkerMemory(const WspMemoryInput& in) {
  const double vs = in.shard_values, w = static_cast<double>(in.vws);
  const double state = 4 * vs;  // global weights: a float per value (parameters, running statistics)
  WspMemory m;
  // ScaledValues of the whole buffer (wsp_worker.h: wave_), int64 per value.
  m.wave_sum = static_cast<int64_t>(8 * in.values);
  // WspWorker::push keeps every other shard's payload until its send is
  // done, and builds one more vector per shard.
  m.push = static_cast<int64_t>(8 * (in.values - in.values / w) + 8 * vs);
  // ParamShard: the weights, the parameters' gradient (dequantised clock
  // sum) and the optimiser state.
  m.shard = static_cast<int64_t>(state + 4 * in.shard_params * (1 + in.optim_copies));
  // WspWorker::serve: a push buffer per peer thread.
  m.receive = static_cast<int64_t>(8 * vs * (w - 1));
  // ParamShard::pending_: every VW's pushes of pending_clocks clocks but the
  // one whose absence holds the oldest; applyClock's sum and push()'s copy.
  const double pushes = static_cast<double>(std::max<int64_t>(1, in.pending_clocks)) * w - 1;
  m.pending = static_cast<int64_t>(8 * vs * (pushes + 2));
  // ParamShard::pull's copy and serve's clone, per peer at once.
  m.replies = static_cast<int64_t>(2 * state * (w - 1));
  if (in.checkpoints) m.snapshot = static_cast<int64_t>(state + 4 * in.shard_params * in.optim_copies);
  // WspWorker::own_ (read-my-writes, D >= 1): a float per value of each of
  // its waves a shard may not have applied, pending_clocks at most.
  if (in.pending_clocks > 1) m.own = static_cast<int64_t>(4 * in.values * static_cast<double>(in.pending_clocks));
  return m;
}

std::string WspMemory::describe() const {
  std::string s;
  auto add = [&](const char* what, int64_t b) {
    if (b == 0) return;
    s += (s.empty() ? "" : " + ") + std::string(what) + " " + formatBytes(static_cast<double>(b));
  };
  add("wave sum", wave_sum);
  add("push", push);
  add("shard", shard);
  add("push buffers", receive);
  add("pending pushes", pending);
  add("pull replies", replies);
  add("snapshot", snapshot);
  add("own pushes", own);
  return s;
}

int64_t wspPendingClocks(int64_t staleness, int64_t clocks) {
  const int64_t gate = staleness + 1;
  return clocks > 0 ? std::min(gate, clocks) : gate;
}

void checkWspMemory(const std::string& job_file, const std::string& where, int64_t worker_bytes, WspMemoryInput in,
                    int64_t staleness, int64_t clocks, int64_t cap) {
  in.pending_clocks = wspPendingClocks(staleness, clocks);
  const WspMemory m = wspWorkerMemory(in);
  const int64_t need = worker_bytes + m.total();
  if (cap <= 0 || need <= cap) return;
  // Only the pushes a shard may hold grow with a key (sync.staleness); a
  // VW runs its minibatches one at a time, so sync.wave adds nothing.
  auto needAt = [&](int64_t d) {
    WspMemoryInput t = in;
    t.pending_clocks = wspPendingClocks(d, clocks);
    return worker_bytes + wspWorkerMemory(t).total();
  };
  const int64_t need0 = needAt(0);
  std::ostringstream os;
  os << job_file << ": key '" << (need0 <= cap ? "sync.staleness" : "sync.mode") << "': a WSP virtual worker on "
     << where << " needs about " << formatBytes(static_cast<double>(need)) << " but may use "
     << formatBytes(static_cast<double>(cap)) << ": the data-parallel worker "
     << formatBytes(static_cast<double>(worker_bytes)) << " + " << m.describe() << " (its shard may hold "
     << in.pending_clocks << " clocks of every virtual worker's pushes with sync.staleness = " << staleness
     << "; sync.wave adds nothing: a virtual worker runs its minibatches one at a time)";
  if (need0 <= cap) {
    // The need grows with D: the largest D that fits, by bisection.
    int64_t lo = 0, hi = staleness;  // needAt(lo) fits, needAt(hi) does not
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      (needAt(mid) <= cap ? lo : hi) = mid;
    }
    os << "; expected at most " << lo << ", got " << staleness;
  } else {
    os << "; even sync.staleness = 0 needs " << formatBytes(static_cast<double>(need0))
       << ": use sync.mode = \"sync\", a device with more memory or a smaller model";
  }
  throw InputError(os.str());
}

}  // namespace morph
