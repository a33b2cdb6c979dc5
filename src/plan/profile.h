// Calibration profile: what one VN of a job costs on one kind of machine,
// per layer, plus the costs of point-to-point transfers and collectives.
// Scale-invariant: it never depends on the global batch, the VN count, the
// workers or the stages. Format: docs/profile_format.md (version 1).
//
// This file is pure data and parsing: it does no measuring (calibrate.h)
// and no planning (simulator.h, planner.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace morph {

struct JobSpec;

// t(bytes) = latency_s + bytes * seconds_per_byte.
struct LinearFit {
  double latency_s = 0.0;
  double seconds_per_byte = 0.0;
  std::vector<std::pair<double, double>> samples;  // (bytes, seconds) it was fitted to
  double at(double bytes) const { return latency_s + bytes * seconds_per_byte; }
};
// Least-squares line through `samples` (clamped to non-negative terms).
LinearFit fitLine(std::vector<std::pair<double, double>> samples);

// Worker processes that share a host's cores compute slower than one
// process alone (caches, memory bandwidth, the processes' own threads: a
// receiver, a sender, Gloo's, the heartbeat, and the manager beside them),
// and a pipeline pays per step what the simulator's parts do not add up to
// on a busy host. Measured by calibration (plan/contention.h), relative to
// the same calibration's single-process figures: 1 for one process by
// construction.
struct HostContention {
  // Worker processes on the host -> factor on each one's compute (>= 1).
  // A count above the largest measured takes its factor (the cores bound
  // of the simulator covers more processes than cores). Empty: not measured.
  std::map<int, double> factors;
  // Worker processes on the host that all compute at once (data
  // parallelism: every worker busy from the step's start to its end) ->
  // the factor on each one's compute, beyond sharing the cores (the
  // simulator's cores bound: k busy processes on c < k cores each run at
  // c/k): time slicing, caches warmed by another process. Fitted from a
  // co-located data-parallel run (3 workers on a host of 2 cores pay more
  // than a 3-stage pipeline whose stages are rarely busy together). A count
  // without an entry at or below it, or an entry below factors', takes
  // factors' (busyFactor()). Empty: as factors.
  std::map<int, double> busy_factors;
  // Seconds per pipeline step that the measured run took beyond the
  // simulator's prediction with `factors` (>= 0): wake-ups of blocked
  // stages, the collectives and the manager's and store's per-step work
  // on a host whose cores are busy.
  double pipeline_step_s = 0;
  // What it was fitted from, for the reader (docs/profile_format.md).
  std::string measured_on;
  bool measured() const { return !factors.empty(); }
  double factor(int processes) const;
  // The factor of `processes` all busy at once: busy_factors' entry (the
  // lower listed count's; above the largest, its), never below factor().
  double busyFactor(int processes) const;
};

struct LayerCost {
  std::string name;
  double forward_s = 0, forward_nograd_s = 0, backward_s = 0, recompute_s = 0;  // one VN
  int64_t output_bytes = 0;      // one VN's output activation (float32)
  int64_t params = 0;            // parameter values owned
  int64_t param_bytes = 0, buffer_bytes = 0, optimizer_bytes = 0;
  int64_t activation_bytes = 0;  // kept for the backward by one VN's forward
  int64_t tied_params = 0;       // values of a weight owned by layer tied_owner
  int tied_owner = -1;
  int64_t bn_values = 0;         // batch-norm statistics reduced per step
};

// What the profile is valid for (docs/profile_format.md, "fingerprint").
struct Fingerprint {
  std::string model, dataset, reduce_mode, optimizer, cpu, blas, torch;
  std::vector<std::string> layers;
  int64_t vn_size = 0;
  int threads = 1;
};
Fingerprint jobFingerprint(const JobSpec& job, const std::vector<std::string>& layer_names);
// One line per differing key: "vn_size: profile 8, job 16". Empty when equal.
std::vector<std::string> fingerprintDifferences(const Fingerprint& profile, const Fingerprint& job);
// Short hex digest of the fingerprint (cache file names).
std::string fingerprintDigest(const Fingerprint& f);

struct Profile {
  static constexpr int kVersion = 1;
  Fingerprint fingerprint;
  double created_unix = 0, calibration_seconds = 0;
  int64_t runtime_bytes = 0;
  int64_t input_bytes = 0;
  std::vector<LayerCost> layers;
  LinearFit p2p;
  // Group size -> fit, for int64 SUM ("exact"), float32 SUM ("float") and
  // float64 MAX of a few values ("max").
  std::map<int, LinearFit> allreduce_exact, allreduce_float, allreduce_max;
  double optimizer_s_per_param = 0;
  double quantize_s_per_value = 0;
  double step_overhead_s = 0;
  // One VN's compute while another worker process of the host computes too,
  // over the same alone (>= 1): shared cores, caches and memory bandwidth.
  // The older contention model: every process of a plan of two or more.
  double compute_contention = 1.0;
  int host_cores = 1;
  // The co-located model (docs/planner.md, "Processes that share a host"),
  // fitted by calibration from a short real 2-stage run of the job on this
  // host (plan/contention.h). When present it replaces compute_contention.
  HostContention host_contention;

  // The factor on the compute of a process whose host runs `on_host` worker
  // processes of a plan of `in_plan`: with host_contention, its factor for
  // that count (1 for one process); without, compute_contention for every
  // process of a plan of two or more.
  double computeFactor(int on_host, int in_plan) const;
  // The same for data parallelism, where every worker of the host computes
  // at once: host_contention's busyFactor() (>= computeFactor()).
  double dataParallelFactor(int on_host, int in_plan) const;
  // Per step of a pipeline (P >= 2) of worker processes, on top of what
  // the simulator charges: host_contention's, else 0.
  double pipelineStepSeconds() const { return host_contention.measured() ? host_contention.pipeline_step_s : 0.0; }

  // Seconds for an all-reduce of `bytes` over `group` ranks: 0 for one rank;
  // a measured group size uses its fit; others extrapolate from the
  // smallest measured group with the ring algorithm's cost
  // ((g-1) * 2a + 2(g-1)/g * bytes * b, with a, b the 2-rank terms).
  double allreduceSeconds(const std::map<int, LinearFit>& fits, double bytes, int group) const;
  double exactOrFloatAllreduce(bool exact, double bytes, int group) const {
    return allreduceSeconds(exact ? allreduce_exact : allreduce_float, bytes, group);
  }
  // The job's reduction (fingerprint.reduce_mode): "exact" (64-bit: the
  // allreduce_exact fit, measured over int64 sums, 8 bytes per value),
  // "exact32" (reduce.bits = 32: an int32 reduce-scatter and a float
  // all-gather carry a float all-reduce's bytes, so the allreduce_float fit
  // at 4 bytes per value) or "float" (the same fit).
  bool exact() const { return fingerprint.reduce_mode != "float"; }
  // Bytes per summed value in the buffer a bucket is sized by (the runtime's
  // VnExecutor: 8 for "exact", else 4).
  double valueBytes() const { return fingerprint.reduce_mode == "exact" ? 8.0 : 4.0; }
  // Seconds to sum `values` values among `group` ranks.
  double reduceSeconds(double values, int group) const {
    return exactOrFloatAllreduce(fingerprint.reduce_mode == "exact", values * valueBytes(), group);
  }
  int64_t totalParams() const;
};

// One device type's compute, per layer of the job, measured on such a
// device (a resources file's `types.NAME.profile`): a profile's forward,
// backward and recompute columns and its optimiser time. The planner and
// the simulator charge a device with such costs its own per-layer times
// (times its slowdown); a device without them is charged the job
// profile's times times its slowdown (docs/resources.md).
struct LayerTimes {
  double forward_s = 0, forward_nograd_s = 0, backward_s = 0, recompute_s = 0;  // one VN
};
struct DeviceCosts {
  std::string origin;              // the profile they came from (messages)
  std::vector<LayerTimes> layers;  // the job profile's layers, in order
  double optimizer_s_per_param = 0;
};
DeviceCosts deviceCostsOf(const Profile& p, const std::string& origin);

std::string profileToJson(const Profile& p);  // pretty JSON text
// InputError naming `origin` (a file) and the key when the text is not a
// version-1 profile.
Profile profileFromJson(const std::string& text, const std::string& origin);
Profile readProfile(const std::string& path);   // InputError if unreadable
void writeProfile(const Profile& p, const std::string& path);  // atomic (temp + rename)
// InputError "<origin>: profile made for a different job: <differences>"
// unless the fingerprints match.
void checkProfileMatches(const Profile& p, const Fingerprint& job, const std::string& origin);

}  // namespace morph
