// Helpers the runner, the manager and the worker share (internal.h):
// metrics lines, checkpoint loading and keeping, fingerprints, the output
// folder and summary, store values, tokens and the connection to a manager.
// Kept apart from runner.cpp so that the manager and the runner depend on
// this file, not on each other. Never starts training or a process.
#include "control/runner.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <optional>

#include <ATen/Version.h>
#include <torch/version.h>
#include <xxhash.h>

#include "control/after_step.h"
#include "control/internal.h"
#include "exec/fixed_point.h"

namespace morph {

using json = nlohmann::json;
using namespace detail;

namespace detail {

json commitLine(const JobSpec& job, const StepStats& st, int workers, int64_t generation) {
  json line = {{"step", st.step},
               {"loss", st.loss},
               {"lr", st.lr},
               {"samples_per_second", static_cast<double>(job.global_batch) / st.seconds},
               {"workers", workers},
               {"generation", generation},
               {"train_accuracy", st.train_accuracy},
               {"grad_norm", st.grad_norm},
               {"attempts", st.attempts},
               {"step_seconds", st.seconds},
               {"reduce_seconds", st.reduce_seconds},
               {"reduced_bytes", st.reduced_bytes},
               // When the step committed (wall clock): the time between two
               // lines is everything a step costs, between-step work included.
               {"unix_time", std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()}};
  if (job.regression()) line.erase("train_accuracy");  // mse: no classes to be right about
  return line;
}

json stepLine(const JobSpec& job, int64_t steps, const StepStats& st, Executor& tr, const Dataset& test,
              int workers, int64_t generation, const EvalStats* eval) {
  json line = commitLine(job, st, workers, generation);
  if (dueAfterStep(job, steps, st.step).evaluate) {
    EvalStats e = eval ? *eval : tr.evaluate(test, job.eval_batch);
    if (!job.regression()) line["test_accuracy"] = e.accuracy;
    line["test_loss"] = e.loss;
    line["eval_seconds"] = e.seconds;
  }
  return line;
}

namespace {
FileSystemFactory& fileSystemFactory() {
  static FileSystemFactory f;
  return f;
}
FaultHook& faultHook() {
  static FaultHook f;
  return f;
}
}  // namespace

void faultPoint(const std::string& point, int64_t worker) {
  if (faultHook()) faultHook()(point, worker);
}

bool faultHookSet() { return static_cast<bool>(faultHook()); }

std::unique_ptr<FileSystem> checkpointFileSystem() {
  if (fileSystemFactory()) return fileSystemFactory()();
  return std::make_unique<PosixFileSystem>();
}

DataPair loadData(const JobSpec& job, const std::function<void(const std::string&)>& say) {
  const double t0 = nowSeconds();
  DataPair data = loadDatasets(job.data, job.seed);
  if (say) {
    char took[48];
    std::snprintf(took, sizeof took, ", loaded in %.2f s", nowSeconds() - t0);
    say("data: " + describeData(job.data, data) + took);
  }
  return data;
}

namespace {

// Bytes of the files of one checkpoint folder (0 when unreadable).
double folderMegabytes(const std::string& path) {
  uintmax_t bytes = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(path, ec)) {
    std::error_code fec;
    if (e.is_regular_file(fec)) bytes += e.file_size(fec);
  }
  return static_cast<double>(bytes) / 1e6;
}

// Before a resume reads `dir`: which checkpoint it tries first and its size.
void sayLoading(const std::string& dir, FileSystem& fs) {
  const std::vector<int64_t> steps = listCheckpointSteps(dir, fs);
  if (steps.empty()) return;
  const std::string path = (std::filesystem::path(dir) / checkpointDirName(steps.front())).string();
  std::printf("morph: loading checkpoint %s (%.1f MB) ...\n", path.c_str(), folderMegabytes(path));
  std::fflush(stdout);
}

}  // namespace

// Loads the newest good checkpoint of `dir` into `tr`; reports rejected ones.
void resumeFrom(const std::string& dir, Executor& tr, bool report, bool progress) {
  PosixFileSystem fs;
  const double t0 = nowSeconds();
  if (progress) sayLoading(dir, fs);
  std::vector<std::string> problems;
  std::optional<CheckpointData> ck = loadLatestGood(dir, fs, &problems);
  if (report)
    for (const auto& p : problems) std::fprintf(stderr, "morph: warning: skipping damaged checkpoint: %s\n", p.c_str());
  if (!ck) throw InputError("--resume " + dir + ": no intact checkpoint in this folder");
  tr.importState(*ck);
  if (report) {
    const std::string path = (std::filesystem::path(dir) / checkpointDirName(ck->step)).string();
    std::printf("morph: resuming from %s at step %lld (%.1f MB loaded in %.2f s)\n", path.c_str(),
                static_cast<long long>(ck->step), folderMegabytes(path), nowSeconds() - t0);
    std::fflush(stdout);
  }
}

void CheckpointKeeper::failed(const std::string& what) {
  ++failures_;
  if (failures_ >= max_)
    throw JobError(what + "; no checkpoint succeeded for " + std::to_string(failures_) +
                   " intervals in a row (checkpoint.max_failures = " + std::to_string(max_) + ")");
  std::fprintf(stderr, "morph: warning: %s; training goes on, the next interval writes again (%lld of %lld failures in a row)\n",
               what.c_str(), static_cast<long long>(failures_), static_cast<long long>(max_));
}

std::string CheckpointKeeper::submit(const CheckpointData& data) {
  if (w_->lastDurableStep() > last_ok_) {
    last_ok_ = w_->lastDurableStep();
    failures_ = 0;
  }
  try {
    w_->submit(data);
    return "";
  } catch (const JobError& e) {
    // The previous write failed (reported once, now); this one is submitted.
    const std::string what = e.what();
    failed(what);
    w_->submit(data);
    return what;
  }
}

std::string CheckpointKeeper::flush() {
  try {
    w_->flush();
    return "";
  } catch (const JobError& e) {
    const std::string what = e.what();
    failed(what);
    return what;
  }
}

namespace {
// xxh64 over the sizes and an evenly spaced sample of a split's examples.
std::string datasetDigest(const Dataset& d) {
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  const int64_t n = d.size();
  XXH64_update(st, &n, sizeof n);
  const int64_t stride = std::max<int64_t>(1, n / 1024);
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < n; i += stride) idx.push_back(i);
  if (!idx.empty()) {
    Batch b = d.gather(idx);
    for (const torch::Tensor& t : {b.x.contiguous(), b.y.contiguous()})
      XXH64_update(st, t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size());
  }
  const uint64_t h = XXH64_digest(st);
  XXH64_freeState(st);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}
}  // namespace

std::string atenCpuCapability() {
  // at::show_config() is libtorch's exported description of its build and
  // of the level its CPU kernels run at (ATEN_CPU_CAPABILITY or the CPU).
  const std::string config = at::show_config();
  const std::string key = "CPU capability usage: ";
  const size_t at = config.find(key);
  if (at == std::string::npos) return "unknown";
  const size_t begin = at + key.size();
  return config.substr(begin, config.find('\n', begin) - begin);
}

std::string onednnCpuIsa() {
  // oneDNN is a dependency of libtorch (its convolutions); looked up at run
  // time so that a libtorch built without it still links.
  using Effective = int (*)();
  using Name = const char* (*)(int);
  const auto effective = reinterpret_cast<Effective>(dlsym(RTLD_DEFAULT, "dnnl_get_effective_cpu_isa"));
  if (!effective) return "none";
  const int isa = effective();
  if (const auto name = reinterpret_cast<Name>(dlsym(RTLD_DEFAULT, "dnnl_cpu_isa2str")))
    if (const char* s = name(isa)) return s;
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%x", isa);
  return buf;
}

json runtimeFingerprint(const DataPair* data, const ModelSpec* model) {
  const char* bucket = std::getenv("MORPH_BUCKET_BYTES");
  const char* wire = std::getenv("MORPH_EXACT_WIRE");
  json f = {{"torch", TORCH_VERSION},
            {"blas", checkBlas(false)},
            {"aten_cpu", atenCpuCapability()},
            {"onednn_isa", onednnCpuIsa()},
            {"fixed_point", kFixedPointKernel},
            {"MORPH_BUCKET_BYTES", bucket ? bucket : ""},
            {"MORPH_EXACT_WIRE", wire ? wire : ""}};
  if (data) f["data"] = datasetDigest(*data->train) + "/" + datasetDigest(*data->test);
  if (model && model->name == "torchscript") f["model_file"] = model->digest;
  return f;
}

std::vector<std::string> fingerprintDifferences(const json& reference, const json& worker) {
  std::vector<std::string> out;
  for (const auto& [key, value] : reference.items()) {
    const json got = worker.contains(key) ? worker.at(key) : json();
    if (got != value) out.push_back(key + ": manager " + value.dump() + ", worker " + got.dump());
  }
  return out;
}

json checkpointTiming(const CheckpointWriter& w) {
  const CheckpointWriter::Timing t = w.timing();
  const double n = static_cast<double>(std::max<int64_t>(t.writes, 1));
  return {{"writes", t.writes}, {"snapshot_seconds", t.snapshot_seconds / n}, {"write_seconds", t.write_seconds / n}};
}

std::string resumeStepFrom(const std::string& dir, Executor& tr, bool report, bool progress) {
  PosixFileSystem fs;
  const double t0 = nowSeconds();
  if (progress) sayLoading(dir, fs);
  std::vector<std::string> problems;
  const std::optional<std::string> path = newestIntactCheckpoint(dir, fs, &problems);
  if (report)
    for (const auto& p : problems) std::fprintf(stderr, "morph: warning: skipping damaged checkpoint: %s\n", p.c_str());
  if (!path) throw InputError("--resume " + dir + ": no intact checkpoint in this folder");
  const int64_t step = loadStepFrom(*path, tr);
  // Every file was read and verified; each stage loads its layers once placed.
  if (report) {
    std::printf("morph: resuming from %s at step %lld (%.1f MB verified in %.2f s)\n", path->c_str(),
                static_cast<long long>(step), folderMegabytes(*path), nowSeconds() - t0);
    std::fflush(stdout);
  }
  return *path;
}

int64_t loadStepFrom(const std::string& checkpoint, Executor& tr) {
  PosixFileSystem fs;
  const CheckpointData meta = loadLayers(checkpoint, fs, 0, -1);
  tr.importState(meta, /*partial=*/true);
  return meta.step;
}

void loadHeldLayers(const std::string& checkpoint, Executor& tr) {
  PosixFileSystem fs;
  const std::vector<size_t> held = tr.core().heldLayers();
  for (size_t i = 0; i < held.size();) {
    size_t j = i;
    while (j + 1 < held.size() && held[j + 1] == held[j] + 1) ++j;
    tr.importState(loadLayers(checkpoint, fs, static_cast<int64_t>(held[i]), static_cast<int64_t>(held[j])),
                   /*partial=*/true);
    i = j + 1;
  }
}

void writeSummary(const std::string& dir, const JobSpec& job, int64_t steps, int workers,
                  const RunLog& log, const std::string& hash, int64_t peak_rss, const json& resizes,
                  const json& extra) {
  json s = {{"model_hash", hash},
            {"job", job.name},
            {"steps", steps},
            {"global_batch", job.global_batch},
            {"virtual_nodes", job.virtual_nodes},
            {"workers", workers},
            {"stages", 1},
            {"reduce_mode", toString(job.reduce_mode)},
            {"final_loss", log.finalLoss()},
            {"test_accuracy", log.testAccuracy()},
            {"test_loss", log.testLoss()},
            {"samples_per_second", log.steadySamplesPerSecond()},
            {"wall_seconds", log.wallSeconds()},
            {"peak_rss_bytes", peak_rss},
            {"resizes", resizes}};
  if (job.regression()) s.erase("test_accuracy");
  s.update(extra);
  std::string tmp = (std::filesystem::path(dir) / "summary.json.tmp").string();
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << s.dump(2) << '\n';
    if (!out) throw JobError(dir + ": cannot write summary.json");
  }
  std::filesystem::rename(tmp, std::filesystem::path(dir) / "summary.json");
}

// --set overrides plus --steps (an override of job.steps replaces job.epochs).
std::vector<std::string> effectiveOverrides(const RunOptions& o) {
  std::vector<std::string> ov = o.overrides;
  if (o.steps > 0) ov.push_back("job.steps=" + std::to_string(o.steps));
  return ov;
}

std::string outDir(const RunOptions& o, const JobSpec& job) {
  return o.out_dir.empty() ? (std::filesystem::path("runs") / job.name).string() : o.out_dir;
}

std::string checkpointDir(const RunOptions& o, const JobSpec& job) {
  const std::string d = !o.checkpoint_dir.empty() ? o.checkpoint_dir
                        : !job.checkpoint_dir.empty() ? job.checkpoint_dir
                                                      : (std::filesystem::path(outDir(o, job)) / "checkpoints").string();
  return std::filesystem::absolute(d).lexically_normal().string();
}

std::string getString(c10d::Store& s, const std::string& key) {
  auto v = s.get(key);
  return std::string(v.begin(), v.end());
}
int64_t parseStoreInt(const std::string& key, const std::string& value) {
  const size_t digits = value.size() - (value.rfind('-', 0) == 0 ? 1 : 0);
  bool ok = digits > 0 && digits <= 19 &&
            std::all_of(value.end() - static_cast<std::ptrdiff_t>(digits), value.end(),
                        [](char c) { return c >= '0' && c <= '9'; });
  int64_t v = 0;
  if (ok) {
    errno = 0;
    char* end = nullptr;
    v = std::strtoll(value.c_str(), &end, 10);
    ok = errno == 0 && *end == '\0';
  }
  if (!ok)
    throw JobError("the job's store holds '" + value.substr(0, 40) + "' under " + key +
                   ", where a whole number belongs: a worker or client wrote a bad value (docs/distributed.md, store keys)");
  return v;
}
int64_t getInt(c10d::Store& s, const std::string& key) { return parseStoreInt(key, getString(s, key)); }

void setString(c10d::Store& s, const std::string& key, const std::string& value) {
  s.set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

std::string joinLines(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += s + "\n";
  return out;
}
std::vector<std::string> splitLines(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string line;
  while (std::getline(ss, line))
    if (!line.empty()) out.push_back(line);
  return out;
}

std::pair<std::string, int> parseHostPort(const std::string& s, const std::string& flag) {
  const auto colon = s.rfind(':');
  const std::string digits = colon == std::string::npos ? "" : s.substr(colon + 1);
  const bool number = !digits.empty() && digits.size() <= 5 &&
                      std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
  const int port = number ? std::stoi(digits) : 0;
  if (colon == std::string::npos || colon == 0 || port < 1 || port > 65535)
    throw InputError(flag + " '" + s + "': expected HOST:PORT of a running manager (PORT 1..65535)");
  return {s.substr(0, colon), port};
}

std::string readToken(const std::string& token_file) {
  std::string token, from;
  if (!token_file.empty()) {
    std::ifstream in(token_file);
    if (!in)
      throw InputError("missing job token: --token-file " + token_file +
                       ": cannot read it (the job's token is OUT/token of `morph run`)");
    std::getline(in, token);
    from = "--token-file " + token_file;
  } else if (const char* env = std::getenv("MORPH_TOKEN")) {
    token = env;
    from = "MORPH_TOKEN";
  } else {
    throw InputError("missing job token: pass --token-file FILE (the job's OUT/token, written by `morph run`) "
                     "or set MORPH_TOKEN");
  }
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
  if (token.empty()) throw InputError("missing job token: " + from + " is empty");
  return token;
}

std::string createTokenFile(const std::string& path) {
  const std::string token = store::randomToken();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw InputError(path + ": cannot write the job token: " + std::strerror(errno));
  const std::string line = token + "\n";
  const bool ok = ::fchmod(fd, 0600) == 0 && ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  ::close(fd);
  if (!ok) throw InputError(path + ": cannot write the job token");
  return token;
}

c10::intrusive_ptr<StoreClient> connectToManager(const std::string& join, const std::string& token,
                                                 const std::string& role, double timeout_s) {
  auto [host, port] = parseHostPort(join, "--join");
  try {
    return c10::make_intrusive<StoreClient>(host, port, token, role,
                                            std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  } catch (const StoreAuthError& e) {
    throw InputError("rejected job token (" + std::string(e.what()) +
                     "); use the token of the job running there (its OUT/token file)");
  } catch (const std::exception& e) {
    throw InputError("cannot reach the manager at " + join + " within " + std::to_string(static_cast<int>(timeout_s)) +
                     " s (" + e.what() + "); is `morph run` running there, and is the port open?");
  }
}

int64_t newestGoodCheckpoint(const std::string& dir) {
  PosixFileSystem fs;
  std::vector<std::string> problems;
  auto ck = loadLatestGood(dir, fs, &problems);
  return ck ? ck->step : -1;
}

}  // namespace detail

void setCheckpointFileSystemFactory(FileSystemFactory factory) { detail::fileSystemFactory() = std::move(factory); }
void setFaultHook(FaultHook hook) { detail::faultHook() = std::move(hook); }

}  // namespace morph
