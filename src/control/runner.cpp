#include "control/runner.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "ckpt/checkpoint_store.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "core/job_spec.h"
#include "core/sys.h"
#include "data/dataset.h"
#include "exec/trainer.h"

namespace morph {

using json = nlohmann::json;

std::vector<std::pair<int64_t, int64_t>> assignVns(int64_t virtual_nodes, int workers) {
  if (workers < 1) throw InputError("--workers: expected at least 1 worker");
  if (workers > virtual_nodes)
    throw InputError("--workers " + std::to_string(workers) + ": the job has only " +
                     std::to_string(virtual_nodes) +
                     " virtual nodes (batch.virtual_nodes), so at most that many workers can hold one");
  std::vector<std::pair<int64_t, int64_t>> out;
  const int64_t base = virtual_nodes / workers, extra = virtual_nodes % workers;
  int64_t begin = 0;
  for (int w = 0; w < workers; ++w) {
    int64_t n = base + (w < extra ? 1 : 0);
    out.emplace_back(begin, begin + n);
    begin += n;
  }
  return out;
}

namespace {

// Steps excluded from the steady-state throughput (allocator and cache warm-up).
int64_t warmupSteps(int64_t steps) { return std::min<int64_t>(5, steps / 10); }

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

  void record(const json& line) {
    metrics_ << line.dump() << '\n';
    metrics_.flush();
    const int64_t step = line.at("step").get<int64_t>();
    const bool eval = line.contains("test_accuracy");
    if (first_step_ < 0) first_step_ = step;
    if (step >= first_step_ + warmupSteps(steps_ - first_step_)) {
      steady_samples_ += job_.global_batch;
      steady_seconds_ += line.at("step_seconds").get<double>();
    }
    final_loss_ = line.at("loss").get<double>();
    if (eval) {
      test_accuracy_ = line.at("test_accuracy").get<double>();
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
};

// The training loop every worker runs. The reporter (rank 0) evaluates and
// emits one metrics line per step.
std::string trainLoop(const JobSpec& job, int64_t steps, Trainer& tr, const Dataset& test,
                      bool reporter, int workers, int generation, CheckpointWriter* ckpt,
                      const std::function<void(const json&)>& emit) {
  while (tr.nextStep() < steps) {
    StepStats st = tr.step();
    // The step is committed: every worker holds its result.
    if (ckpt && (st.step + 1) % job.checkpoint_every == 0) ckpt->submit(tr.exportState());
    if (!reporter) continue;
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
                 {"reduce_seconds", st.reduce_seconds}};
    const bool last = st.step + 1 == steps;
    if (last || (job.eval_every > 0 && (st.step + 1) % job.eval_every == 0)) {
      EvalStats e = tr.evaluate(test, job.eval_batch);
      line["test_accuracy"] = e.accuracy;
      line["test_loss"] = e.loss;
    }
    emit(line);
  }
  if (ckpt) ckpt->flush();
  return tr.hash();
}

// Test hook (MORPH_TEST_CRASH_IN_CHECKPOINT=<step>): the process dies halfway
// through writing the first layer file of that step's checkpoint, as a
// machine losing power would.
class CrashingFileSystem : public PosixFileSystem {
 public:
  explicit CrashingFileSystem(int64_t step) : tag_(".tmp-" + checkpointDirName(step)) {}
  void writeFile(const std::string& path, const std::string& bytes) override {
    if (path.find(tag_) != std::string::npos && path.find("layer-") != std::string::npos) {
      PosixFileSystem::writeFile(path, bytes.substr(0, bytes.size() / 2));
      std::fprintf(stderr, "morph: test hook: crashing while writing %s\n", path.c_str());
      _exit(9);
    }
    PosixFileSystem::writeFile(path, bytes);
  }

 private:
  std::string tag_;
};

std::unique_ptr<FileSystem> checkpointFileSystem() {
  if (const char* s = std::getenv("MORPH_TEST_CRASH_IN_CHECKPOINT"))
    return std::make_unique<CrashingFileSystem>(std::atoll(s));
  return std::make_unique<PosixFileSystem>();
}

// Loads the newest good checkpoint of `dir` into `tr`; reports rejected ones.
void resumeFrom(const std::string& dir, Trainer& tr, bool report) {
  PosixFileSystem fs;
  std::vector<std::string> problems;
  std::optional<CheckpointData> ck = loadLatestGood(dir, fs, &problems);
  if (report)
    for (const auto& p : problems) std::fprintf(stderr, "morph: warning: skipping damaged checkpoint: %s\n", p.c_str());
  if (!ck) throw InputError("--resume " + dir + ": no intact checkpoint in this folder");
  tr.importState(*ck);
  if (report) std::printf("morph: resuming from %s at step %lld\n", (std::filesystem::path(dir) / checkpointDirName(ck->step)).c_str(), static_cast<long long>(ck->step));
}

void writeSummary(const std::string& dir, const JobSpec& job, int64_t steps, int workers,
                  const RunLog& log, const std::string& hash, int64_t peak_rss) {
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
            {"resizes", json::array()}};
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

int runInProcess(const RunOptions& o, const JobSpec& job) {
  pinThreads(job.threads);
  checkBlas(true);
  DataPair data = loadDatasets(job.data, job.seed);
  const int64_t steps = job.resolveSteps(data.train->size());
  const std::string dir = outDir(o, job);
  LocalCommunicator comm;
  Trainer tr(job, steps, *data.train, comm);
  if (!o.resume.empty()) resumeFrom(o.resume, tr, true);
  RunLog log(dir, job, steps, o.quiet, !o.resume.empty());
  auto fs = checkpointFileSystem();
  std::unique_ptr<CheckpointWriter> ckpt;
  if (job.checkpoint_every > 0)
    ckpt = std::make_unique<CheckpointWriter>((std::filesystem::path(dir) / "checkpoints").string(), fs.get(),
                                              static_cast<int>(job.checkpoint_keep));
  std::string hash = trainLoop(job, steps, tr, *data.test, true, 1, 0, ckpt.get(),
                               [&](const json& l) { log.record(l); });
  writeSummary(dir, job, steps, 1, log, hash, peakRssBytes());
  std::printf("model_hash: %s\n", hash.c_str());
  return 0;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open job file");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string getString(c10d::Store& s, const std::string& key) {
  auto v = s.get(key);
  return std::string(v.begin(), v.end());
}
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

void killAll(const std::vector<pid_t>& pids, int sig) {
  for (pid_t p : pids)
    if (p > 0) kill(p, sig);
}

// Exit code of the manager when a worker ended with `status`.
int codeForWorkerStatus(int status) {
  if (WIFEXITED(status) && WEXITSTATUS(status) == 2) return 2;
  return 3;
}

int runManager(const RunOptions& o, JobSpec job) {
  const int n = o.workers;
  const auto plan = assignVns(job.virtual_nodes, n);
  const int spawn = o.spawn < 0 ? n : o.spawn;
  if (spawn > n) throw InputError("--spawn: cannot start more local workers than --workers");
  const std::string dir = outDir(o, job);
  std::filesystem::create_directories(dir);

  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(o.port);
  so.isServer = true;
  so.waitWorkers = false;
  so.timeout = std::chrono::seconds(60);
  c10::intrusive_ptr<c10d::TCPStore> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  } catch (const std::exception& e) {
    throw InputError("--port " + std::to_string(o.port) + ": cannot host the job's store: " + e.what());
  }
  const int port = store->getPort();

  // What every worker needs to build the same job.
  setString(*store, "job/text", readFile(o.job_path));
  setString(*store, "job/origin", o.job_path);
  setString(*store, "job/overrides", joinLines(effectiveOverrides(o)));
  setString(*store, "job/world", std::to_string(n));
  setString(*store, "job/out", std::filesystem::absolute(dir).string());
  setString(*store, "job/resume", o.resume.empty() ? "" : std::filesystem::absolute(o.resume).string());
  json pj = {{"generation", 0}, {"world", n}, {"vn_ranges", json::array()}};
  for (auto& r : plan) pj["vn_ranges"].push_back({r.first, r.second});
  setString(*store, "gen/0/plan", pj.dump());

  std::string plan_text;
  for (int w = 0; w < n; ++w)
    plan_text += " w" + std::to_string(w) + "=[" + std::to_string(plan[w].first) + "," +
                 std::to_string(plan[w].second) + ")";
  std::printf("morph: manager on port %d, %d workers (%d local), VN plan:%s\n", port, n, spawn,
              plan_text.c_str());
  if (spawn < n)
    std::printf("morph: waiting for %d more: morph worker --join %s:%d\n", n - spawn, o.host.c_str(), port);
  std::fflush(stdout);

  std::vector<pid_t> children;
  const std::string join = o.host + ":" + std::to_string(port);
  for (int i = 0; i < spawn; ++i) {
    pid_t pid = fork();
    if (pid < 0) throw JobError("cannot start a worker process");
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // no orphans if the manager dies
      execl(o.self_exe.c_str(), o.self_exe.c_str(), "worker", "--join", join.c_str(),
            static_cast<char*>(nullptr));
      std::perror("morph: exec worker");
      _exit(3);
    }
    children.push_back(pid);
  }

  // The steps count is known once a worker has loaded the data set (epochs).
  const double start = nowSeconds();
  std::unique_ptr<RunLog> log;
  int64_t steps = -1, next = 0;
  int finished = 0;
  while (true) {
    int status = 0;
    pid_t done = waitpid(-1, &status, WNOHANG);
    if (done > 0) {
      for (auto& c : children)
        if (c == done) c = -1;
      if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        killAll(children, SIGTERM);
        for (pid_t c : children)
          if (c > 0) waitpid(c, nullptr, 0);
        std::fprintf(stderr, "morph: a worker failed (%s %d); the job stops after %lld committed steps\n",
                     WIFEXITED(status) ? "exit code" : "signal",
                     WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status),
                     static_cast<long long>(next));
        return codeForWorkerStatus(status);
      }
      ++finished;
    }
    if (steps < 0 && store->check({"job/steps"})) {
      steps = std::stoll(getString(*store, "job/steps"));
      next = std::stoll(getString(*store, "job/start_step"));
      log = std::make_unique<RunLog>(dir, job, steps, o.quiet, !o.resume.empty());
    }
    bool progressed = false;
    while (log && next < steps && store->check({"metrics/" + std::to_string(next)})) {
      log->record(json::parse(getString(*store, "metrics/" + std::to_string(next))));
      ++next;
      progressed = true;
    }
    if (log && next == steps) {
      std::vector<std::string> keys;
      for (int r = 0; r < n; ++r) keys.push_back("result/" + std::to_string(r));
      if (store->check(keys)) break;
    }
    if (!progressed) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if (!log && nowSeconds() - start > 120 && spawn == n)
      throw JobError("workers did not start within 120 s");
  }

  std::string hash;
  int64_t peak = 0;
  for (int r = 0; r < n; ++r) {
    json res = json::parse(getString(*store, "result/" + std::to_string(r)));
    std::string h = res.at("model_hash").get<std::string>();
    if (r == 0) hash = h;
    if (h != hash)
      throw JobError("workers disagree on the model after the last step (rank 0 " + hash + ", rank " +
                     std::to_string(r) + " " + h + "): a bug in Morph, please report it");
    peak = std::max(peak, res.at("peak_rss_bytes").get<int64_t>());
  }
  setString(*store, "job/finished", "1");
  for (pid_t c : children)
    if (c > 0) waitpid(c, nullptr, 0);
  writeSummary(dir, job, steps, n, *log, hash, peak);
  std::printf("model_hash: %s\n", hash.c_str());
  return 0;
}

}  // namespace

int runJob(const RunOptions& o) {
  JobSpec job = loadJobFile(o.job_path, effectiveOverrides(o));
  if (o.workers == 0) return runInProcess(o, job);
  return runManager(o, job);
}

int runWorker(const WorkerOptions& o) {
  auto colon = o.join.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 || (port = std::atoi(o.join.c_str() + colon + 1)) <= 0 ||
      port > 65535)
    throw InputError("--join '" + o.join + "': expected HOST:PORT of a running manager");
  const std::string host = o.join.substr(0, colon);
  const std::string iface = localAddressToward(host, port);

  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(port);
  so.isServer = false;
  so.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.connect_timeout_s * 1000));
  c10::intrusive_ptr<c10d::TCPStore> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(host, so);
  } catch (const std::exception& e) {
    throw InputError("cannot reach the manager at " + o.join + " within " +
                     std::to_string(static_cast<int>(o.connect_timeout_s)) +
                     " s; is `morph run` running there, and is the port open?");
  }
  store->setTimeout(std::chrono::seconds(300));

  JobSpec job = parseJob(getString(*store, "job/text"), getString(*store, "job/origin"),
                         splitLines(getString(*store, "job/overrides")));
  const int world = std::stoi(getString(*store, "job/world"));
  const int rank = static_cast<int>(store->add("job/ranks", 1) - 1);
  if (rank >= world)
    throw InputError("the job at " + o.join + " already has its " + std::to_string(world) + " workers");
  pinThreads(job.threads);
  checkBlas(rank == 0);
  DataPair data = loadDatasets(job.data, job.seed);
  const int64_t steps = job.resolveSteps(data.train->size());

  json plan = json::parse(getString(*store, "gen/0/plan"));
  auto range = plan.at("vn_ranges").at(rank);
  auto gen_store = c10::make_intrusive<c10d::PrefixStore>("gen/0", store);
  GlooOptions go;
  go.interface_addr = iface;
  go.timeout = std::chrono::seconds(60);
  auto comm = makeGlooCommunicator(gen_store, rank, world, go);

  Trainer tr(job, steps, *data.train, *comm);
  tr.setVnRange(range.at(0).get<int64_t>(), range.at(1).get<int64_t>());
  const std::string resume = getString(*store, "job/resume");
  if (!resume.empty()) resumeFrom(resume, tr, rank == 0);
  if (rank == 0) {
    setString(*store, "job/start_step", std::to_string(tr.nextStep()));
    setString(*store, "job/steps", std::to_string(steps));
  }
  auto fs = checkpointFileSystem();
  std::unique_ptr<CheckpointWriter> ckpt;
  if (job.checkpoint_every > 0 && rank == 0)
    ckpt = std::make_unique<CheckpointWriter>(getString(*store, "job/out") + "/checkpoints", fs.get(),
                                              static_cast<int>(job.checkpoint_keep));
  std::string hash = trainLoop(job, steps, tr, *data.test, rank == 0, world, 0, ckpt.get(), [&](const json& l) {
    setString(*store, "metrics/" + std::to_string(l.at("step").get<int64_t>()), l.dump());
  });
  json res = {{"model_hash", hash}, {"peak_rss_bytes", peakRssBytes()}, {"bytes_reduced", comm->bytesReduced()}};
  setString(*store, "result/" + std::to_string(rank), res.dump());
  // Stay until the manager has read everything (it hosts the store).
  store->wait({"job/finished"});
  return 0;
}

}  // namespace morph
