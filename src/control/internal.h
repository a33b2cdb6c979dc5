// Pieces shared by the in-process runner, the manager and the worker.
// Private to src/control.
#pragma once

#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "ckpt/checkpoint_store.h"
#include "control/runner.h"
#include "status/status_server.h"
#include "store/client.h"
#include "core/error.h"
#include "core/job_spec.h"
#include "core/sys.h"
#include "data/dataset.h"
#include "exec/trainer.h"
#include "plan/simulator.h"

namespace morph {
namespace detail {

using json = nlohmann::json;

// Steps excluded from the steady-state throughput (allocator and cache warm-up).
inline int64_t warmupSteps(int64_t steps) { return std::min<int64_t>(5, steps / 10); }

// metrics.jsonl and the progress display. Owned by whoever writes the outputs
// (the in-process runner or the manager).
class RunLog {
 public:
  // `append`: a resumed run adds to the metrics of the run it continues.
  RunLog(const std::string& dir, const JobSpec& job, int64_t steps, bool quiet, bool append)
      : job_(job), steps_(steps), quiet_(quiet), tty_(isatty(STDOUT_FILENO) != 0) {
    std::filesystem::create_directories(dir);
    metrics_.open(std::filesystem::path(dir) / "metrics.jsonl", append ? std::ios::app : std::ios::trunc);
    if (!metrics_) throw InputError(dir + ": cannot write metrics.jsonl");
    start_ = nowSeconds();
  }

  // Called with every line record() writes (the status page).
  void setObserver(std::function<void(const json&)> f) { observer_ = std::move(f); }

  void record(const json& line) {
    metrics_ << line.dump() << '\n';
    metrics_.flush();
    if (observer_) observer_(line);
    const int64_t step = line.at("step").get<int64_t>();
    const bool eval = line.contains("test_loss");
    if (first_step_ < 0) first_step_ = step;
    if (step >= first_step_ + warmupSteps(steps_ - first_step_)) {
      steady_samples_ += job_.global_batch;
      steady_seconds_ += line.at("step_seconds").get<double>();
    }
    final_loss_ = line.at("loss").get<double>();
    if (eval) {
      if (line.contains("test_accuracy")) test_accuracy_ = line.at("test_accuracy").get<double>();
      test_loss_ = line.at("test_loss").get<double>();
    }
    if (quiet_) return;
    const bool last = step + 1 == steps_;
    char buf[256];
    if (tty_) {
      const int width = 30;
      int filled = static_cast<int>(width * (step + 1) / steps_);
      double elapsed = nowSeconds() - start_;
      double eta = elapsed / static_cast<double>(step + 1) * static_cast<double>(steps_ - step - 1);
      std::snprintf(buf, sizeof buf, "\r[%-*s] step %lld/%lld  loss %.4f  %.0f samples/s  eta %.0fs ",
                    width, std::string(static_cast<size_t>(filled), '#').c_str(),
                    static_cast<long long>(step + 1), static_cast<long long>(steps_), final_loss_,
                    line.at("samples_per_second").get<double>(), eta);
      std::fputs(buf, stdout);
      if (eval || last) std::fputs("\n", stdout);
    } else if ((step + 1) % job_.log_every == 0 || last || step == 0) {
      std::snprintf(buf, sizeof buf, "step %lld/%lld loss %.4f lr %.5g samples/s %.0f\n",
                    static_cast<long long>(step + 1), static_cast<long long>(steps_), final_loss_,
                    line.at("lr").get<double>(), line.at("samples_per_second").get<double>());
      std::fputs(buf, stdout);
    }
    if (eval) {
      if (job_.regression())
        std::snprintf(buf, sizeof buf, "eval after step %lld: test_loss %.6g\n", static_cast<long long>(step + 1),
                      test_loss_);
      else
        std::snprintf(buf, sizeof buf, "eval after step %lld: test_accuracy %.4f test_loss %.4f\n",
                      static_cast<long long>(step + 1), test_accuracy_, test_loss_);
      std::fputs(buf, stdout);
    }
    std::fflush(stdout);
  }

  double steadySamplesPerSecond() const {
    return steady_seconds_ > 0 ? static_cast<double>(steady_samples_) / steady_seconds_ : 0.0;
  }
  double finalLoss() const { return final_loss_; }
  double testAccuracy() const { return test_accuracy_; }
  double testLoss() const { return test_loss_; }
  double wallSeconds() const { return nowSeconds() - start_; }

 private:
  const JobSpec& job_;
  int64_t steps_;
  bool quiet_, tty_;
  std::ofstream metrics_;
  double start_ = 0, steady_seconds_ = 0, final_loss_ = NAN, test_accuracy_ = NAN, test_loss_ = NAN;
  int64_t steady_samples_ = 0;
  int64_t first_step_ = -1;
  std::function<void(const json&)> observer_;
};

// Runs steps until `steps`; the reporter (rank 0) evaluates and emits one
// metrics line per step; `ckpt` (may be null) receives a checkpoint every
// job.checkpoint_every steps. Returns the model hash.
std::string trainLoop(const JobSpec& job, int64_t steps, VnExecutor& tr, const Dataset& test,
                      bool reporter, int workers, int generation, CheckpointWriter* ckpt,
                      const std::function<void(const json&)>& emit);
// The metrics line of a committed step, without evaluation: the same on
// every member (they hold the same reduced values).
json commitLine(const JobSpec& job, const StepStats& st, int workers, int64_t generation);
// The metrics line of a committed step (evaluates when one is due, unless
// `eval` holds that evaluation already).
json stepLine(const JobSpec& job, int64_t steps, const StepStats& st, Executor& tr, const Dataset& test,
              int workers, int64_t generation,
              const EvalStats* eval = nullptr);

std::unique_ptr<FileSystem> checkpointFileSystem();
// The fault seam (runner.h): calls the installed hook, if any.
void faultPoint(const std::string& point, int64_t worker);
// Whether a fault hook is installed (the tests' build).
bool faultHookSet();
// Loads the job's dataset; with `say`, reports what it holds and how long
// loading took in one line ("data: ...", docs/job_file.md, "Progress").
DataPair loadData(const JobSpec& job, const std::function<void(const std::string&)>& say = nullptr);
// Loads the newest intact checkpoint of `dir`; reports damaged ones on
// stderr. Throws InputError when there is none. `report`: says on stdout
// which checkpoint it resumes from; `progress`: also, before loading, which
// one it reads and its size.
void resumeFrom(const std::string& dir, Executor& tr, bool report, bool progress);
// A stage-local worker's resume, in two halves. First, before it is placed:
// picks the newest checkpoint of `dir` whose every file is intact (so all
// workers pick the same one), loads its step and scale state and returns
// its path. Then, once placed: loads the layers the worker holds (its
// stage's, on whatever cut the checkpoint was written with) from it.
std::string resumeStepFrom(const std::string& dir, Executor& tr, bool report, bool progress);
void loadHeldLayers(const std::string& checkpoint, Executor& tr);
// The first half alone, from one checkpoint folder: its step and scale
// state. Returns the step.
int64_t loadStepFrom(const std::string& checkpoint, Executor& tr);
// Submits the due checkpoints to a writer. A failed write (the writer
// reports it at the next submit or flush) does not stop training: it is
// reported on stderr and in the step's metrics line (`checkpoint_error`) and
// the next interval writes again; JobError (exit 3) once
// job.checkpoint_max_failures intervals in a row had no checkpoint succeed.
class CheckpointKeeper {
 public:
  CheckpointKeeper(CheckpointWriter* writer, const JobSpec& job) : w_(writer), max_(job.checkpoint_max_failures) {}
  // Returns the failure reported now ("" if none).
  std::string submit(const CheckpointData& data);
  std::string flush();
  const CheckpointWriter* writer() const { return w_; }

 private:
  void failed(const std::string& what);
  CheckpointWriter* w_;
  int64_t max_;
  int64_t failures_ = 0;  // intervals in a row whose write failed
  int64_t last_ok_ = -1;
};

// The levels at which libtorch's own CPU kernels ("AVX2", "AVX512",
// "NO AVX"; ATEN_CPU_CAPABILITY pins it) and oneDNN's ("cpu_isa_avx2",
// ...; ONEDNN_MAX_CPU_ISA caps it) run: a VN's bits depend on both.
std::string atenCpuCapability();
std::string onednnCpuIsa();

// What must be the same on every worker of an exact job besides the job
// file: libtorch and BLAS (its core type included), the CPU kernel levels
// above, the fixed-point kernel, the MORPH_* settings that
// change collectives, and (`data`, when given) a digest of the data this
// worker loaded (sizes and 1024 evenly spaced samples of each split), and
// (`model`, a TorchScript model) the digest of the module file it read.
json runtimeFingerprint(const DataPair* data, const ModelSpec* model = nullptr);
// "key: manager 'a', worker 'b'" per differing key (keys missing on one side
// included); empty when they agree on every key `reference` has.
std::vector<std::string> fingerprintDifferences(const json& reference, const json& worker);

// A writer's durable checkpoints and its mean seconds per checkpoint:
// snapshot (in the training thread) and write (in the background; the
// committer's includes waiting for the other stages' shares).
json checkpointTiming(const CheckpointWriter& w);
void writeSummary(const std::string& dir, const JobSpec& job, int64_t steps, int workers,
                  const RunLog& log, const std::string& hash, int64_t peak_rss, const json& resizes,
                  const json& extra = json::object());
std::vector<std::string> effectiveOverrides(const RunOptions& o);
std::string outDir(const RunOptions& o, const JobSpec& job);
// Where checkpoints go, absolute: --checkpoint-dir, else checkpoint.dir,
// else OUT/checkpoints.
std::string checkpointDir(const RunOptions& o, const JobSpec& job);
// The file the manager writes into the checkpoint folder and every worker
// reads back (a worker that does not see it cannot write checkpoints that
// anyone finds).
constexpr const char* kCheckpointMarker = ".morph-job";
// What a local worker receives when its manager dies (prctl
// PR_SET_PDEATHSIG): it then exits naming the resume command (worker/liveness.cpp).
constexpr int kManagerDeathSignal = SIGUSR2;
std::string getString(c10d::Store& s, const std::string& key);
// A whole number read from the store, parsed strictly: the value must be
// an optional '-' and digits only, in int64 range ("12abc", "", " 1" are
// refused). JobError naming the key and the value.
int64_t getInt(c10d::Store& s, const std::string& key);
int64_t parseStoreInt(const std::string& key, const std::string& value);
void setString(c10d::Store& s, const std::string& key, const std::string& value);
std::string joinLines(const std::vector<std::string>& v);
std::vector<std::string> splitLines(const std::string& s);
// "HOST:PORT" -> (host, port); throws InputError naming `flag`.
std::pair<std::string, int> parseHostPort(const std::string& s, const std::string& flag);
// The job token (docs/store_protocol.md): the first line of `token_file`
// when given, else $MORPH_TOKEN; InputError saying which is missing or empty.
std::string readToken(const std::string& token_file);
// Writes a fresh random token to `path` (mode 0600) and returns it.
std::string createTokenFile(const std::string& path);
// A store client of the manager at `join` (HOST:PORT) proving `token` for
// `role` ("worker", "worker/<id>", "client"); InputError naming the address
// when it cannot be reached within timeout_s or rejects the token.
c10::intrusive_ptr<StoreClient> connectToManager(const std::string& join, const std::string& token,
                                                 const std::string& role, double timeout_s);
// Newest intact checkpoint step under `dir`, or -1.
int64_t newestGoodCheckpoint(const std::string& dir);

}  // namespace detail

// `job_text` is the job file's text as validated into `job`.
int runManager(const RunOptions& o, const JobSpec& job, const std::string& job_text);
// `--plan auto`: finds (or measures) the job's profile, plans for o.workers
// and returns the options that run the chosen plan (a plan file in the run
// folder). plan_commands.cpp.
RunOptions resolveAutoPlan(const RunOptions& o, const JobSpec& job);
// What the executor will do that a profile does not know: bucket size and
// emulated link delay (environment), clipping and checkpoints (the job).
SimOptions simOptionsFor(const JobSpec& job, bool in_process);

}  // namespace morph
