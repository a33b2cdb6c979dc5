// The planner's commands: `morph calibrate` (this process measures the
// layers; a peer process it starts measures transfers and collectives with
// it over Gloo), `morph simulate`, `morph plan`, and `morph run --plan auto`
// (find or make a matching profile, plan for the workers, run the plan).
// The measuring and planning live in src/plan; this file only wires them to
// files, processes and the terminal.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <cstring>
#include <fstream>
#include <numeric>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "comm/communicator.h"
#include "control/fingerprint.h"
#include "control/plan_commands.h"
#include "control/protocol/keys.h"
#include "control/run_setup.h"
#include "control/store_access.h"
#include "core/error.h"
#include "core/job_spec.h"
#include "core/memory_estimate.h"
#include "core/parse_number.h"
#include "core/sys.h"
#include "exec/pipeline.h"
#include "models/model.h"
#include "plan/calibrate.h"
#include "plan/contention.h"
#include "plan/plan_file.h"
#include "plan/planner.h"
#include "plan/resources.h"
#include "store/server.h"

namespace morph {

using namespace detail;

namespace {

// Calibration's own store: the connection to it, and a wait for the peer.
constexpr auto kCalibConnectTimeout = std::chrono::seconds(10);
constexpr auto kCalibStoreTimeout = std::chrono::seconds(60);
// Seconds of measuring rounds over the layers (docs/profile_format.md).
constexpr double kCalibrateBudget = 3.0;
// VNs both calibration processes compute at once to measure contention.
constexpr int kContentionRounds = 25;

std::vector<std::string> layerNames(const JobSpec& job) {
  auto model = buildModel(job.model, job.seed);
  std::vector<std::string> names;
  for (size_t l = 0; l < model->size(); ++l) names.push_back(model->layerName(l));
  return names;
}


Profile loadProfileFor(const std::string& path, const JobSpec& job) {
  Profile p = readProfile(path);
  checkProfileMatches(p, jobFingerprint(job, layerNames(job)), path);
  return p;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// The co-located runs (docs/planner.md, "Processes that share a host"):
// runs of the job over kColocatedVns VNs beside the manager; the steady
// steps of each are the first kColocatedWarmup left out, and the last.
// kColocatedRuns in this order: a 2-stage pipeline, a 3-stage one (3
// processes on a host of 2 cores), one worker process per stage, 1F1B,
// traced; then 3 data-parallel workers (all busy at once:
// HostContention::busy_factors). fitHostContention takes the median per
// process count, so more runs may be listed; three 2-stage runs did not
// narrow the factor across calibrations (docs/planner.md) and cost about
// 7 s more each, so one.
constexpr int64_t kColocatedVns = 8;
constexpr int kColocatedWarmup = 4;
struct ColocatedShape {
  int stages, workers;  // stages == 1: data parallelism
};
constexpr ColocatedShape kColocatedRuns[] = {{2, 2}, {3, 3}, {1, 3}};
// Each whole-model time beside the runs (WholeModelTimer): at most this
// long, at least 7 VNs.
constexpr double kWholeModelBudgetS = 0.25;
// Steps: enough for about kColocatedSeconds of steady steps, within
// [kColocatedMinSteps, kColocatedMaxSteps]; a run whose predicted step is
// above kColocatedMaxStep is not measured (without a 2-stage run the older
// model stays).
constexpr double kColocatedSeconds = 0.6, kColocatedMaxStep = 0.3;
constexpr int kColocatedMinSteps = 16, kColocatedMaxSteps = 30;
constexpr int kColocatedTimeoutS = 120;

// Runs `argv` with its output to `log`; its exit status, or -1 when it
// ran past `timeout_s` (then it is killed).
int runLogged(const std::vector<std::string>& argv, const std::string& log, int timeout_s) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw JobError("cannot start " + argv[0]);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
    execv(argv[0].c_str(), args.data());
    _exit(3);
  }
  const double until = nowSeconds() + timeout_s;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (nowSeconds() > until) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    usleep(20000);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

double medianOf(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One co-located run (`shape`): what it measured, or nullopt with `why`
// (skipped or failed).
std::optional<ColocatedRun> runColocated(const JobSpec& job, const std::string& job_path,
                                         const std::vector<std::string>& overrides, const std::string& self_exe,
                                         const Profile& p, ColocatedShape shape, std::string& why) {
  JobSpec small = job;
  small.virtual_nodes = kColocatedVns;
  small.global_batch = kColocatedVns * job.vnSize();
  small.checkpoint_every = 0;
  const SimOptions so = simOptionsFor(small, false);
  const int stages = shape.stages;
  const bool dp = stages == 1;
  ColocatedRun run;
  run.plan.stages = stages;
  run.plan.cuts = evenCuts(p.layers.size(), stages);
  run.plan.replicas = dp ? shape.workers : 1;
  run.plan.vn_shares = dp ? evenShares(kColocatedVns, shape.workers) : std::vector<int64_t>{kColocatedVns};
  const double predicted = simulate(p, run.plan, so).step_seconds;
  if (predicted > kColocatedMaxStep) {
    why = "skipped: a step of about " + fmt("%.2f", predicted) + " s, too long to measure in a few seconds";
    return std::nullopt;
  }
  const int steps = std::clamp(kColocatedWarmup + 1 + static_cast<int>(std::ceil(kColocatedSeconds / predicted)),
                               kColocatedMinSteps, kColocatedMaxSteps);
  char tmpl[] = "/tmp/morph_colocated_XXXXXX";
  if (!mkdtemp(tmpl)) {
    why = "skipped: no temporary folder";
    return std::nullopt;
  }
  const std::string dir = tmpl;
  const std::string P = std::to_string(stages);
  std::vector<std::string> argv = {self_exe, "run", job_path};
  for (const std::string& o : overrides) argv.insert(argv.end(), {"--set", o});
  for (const std::string& o : {"batch.virtual_nodes=" + std::to_string(kColocatedVns),
                               "batch.global=" + std::to_string(small.global_batch), std::string("eval.every=0"),
                               std::string("checkpoint.every=0")})
    argv.insert(argv.end(), {"--set", o});
  if (dp)
    argv.insert(argv.end(), {"--steps", std::to_string(steps), "--workers", std::to_string(shape.workers), "--out",
                             dir + "/run", "--status", "off", "--quiet"});
  else
    argv.insert(argv.end(), {"--steps", std::to_string(steps), "--workers", P, "--stages", P, "--schedule", "1f1b",
                             "--trace", dir + "/trace.json", "--out", dir + "/run", "--status", "off", "--quiet"});
  try {
    const int rc = runLogged(argv, dir + "/log", kColocatedTimeoutS);
    if (rc != 0) throw JobError("morph run exited " + std::to_string(rc) + " (" + dir + "/log)");
    // The step time: the median gap between step commits.
    std::vector<double> commits;
    std::vector<int64_t> step_of;
    std::ifstream metrics(dir + "/run/metrics.jsonl");
    for (std::string line; std::getline(metrics, line);) {
      if (line.empty()) continue;
      const json m = json::parse(line);
      commits.push_back(m.at("unix_time").get<double>());
      step_of.push_back(m.at("step").get<int64_t>());
    }
    if (commits.size() < static_cast<size_t>(kColocatedWarmup) + 3) throw JobError("too few steps in metrics.jsonl");
    std::vector<double> gaps;
    for (size_t i = kColocatedWarmup; i + 2 < commits.size(); ++i) gaps.push_back(commits[i + 1] - commits[i]);
    run.step_seconds = medianOf(gaps);
    if (dp) {
      run.label = std::to_string(shape.workers) + " data-parallel workers, " + std::to_string(gaps.size()) +
                  " steady steps";
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
      return run;
    }
    // The cut it ran, and per stage its compute per step (median over the
    // steady steps).
    std::ifstream summary_in(dir + "/run/summary.json");
    const json summary = json::parse(summary_in);
    run.plan.cuts = summary.at("cuts").get<std::vector<size_t>>();
    std::ifstream trace_in(dir + "/trace.json");
    const json trace = json::parse(trace_in);
    // Steps [first, last): the steady ones (the bench's, bench/sim_accuracy.py).
    const int64_t first = step_of[kColocatedWarmup], last = step_of[commits.size() - 2];
    std::map<std::pair<int, int64_t>, double> busy;  // (stage, step) -> seconds
    for (const json& e : trace.at("traceEvents")) {
      if (e.value("ph", "") != "X") continue;
      const std::string cat = e.value("cat", "");
      if (cat != "forward" && cat != "backward" && cat != "recompute") continue;
      const int64_t step = e.at("args").at("step").get<int64_t>();
      if (step < first || step >= last) continue;
      busy[{e.at("tid").get<int>(), step}] += e.at("dur").get<double>() / 1e6;  // microseconds
    }
    for (int k = 0; k < stages; ++k) {
      std::vector<double> per_step;
      for (int64_t s = first; s < last; ++s) per_step.push_back(busy[{k, s}]);
      run.stage_busy_s.push_back(medianOf(per_step));
    }
    run.label = P + "-stage 1f1b, " + std::to_string(last - first) + " steady steps";
  } catch (const std::exception& e) {
    why = std::string("failed: ") + e.what();
    return std::nullopt;
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return run;
}

// The whole model's single-process time, taken again and again over a
// calibration (WholeModelTimer): the layers were scaled to `profiled`; once
// the samples are in, settle() scales them to the samples' median.
struct WholeModelTimes {
  std::vector<double> samples;
  double profiled = 0;
  bool settled = false;
};

double settle(Profile& p, WholeModelTimes& w, const std::function<void(const std::string&)>& say) {
  if (w.settled) return w.profiled;
  const double median = wholeModelSeconds(w.samples);
  const auto [lo, hi] = std::minmax_element(w.samples.begin(), w.samples.end());
  if (w.profiled > 0 && median > 0) rescaleLayerCompute(p, median / w.profiled);
  say("whole model alone: " + std::to_string(w.samples.size()) + " timings over the calibration, " +
      fmt("%.3f", *lo * 1e3) + "-" + fmt("%.3f", *hi * 1e3) + " ms per VN, the layers scaled to their median " +
      fmt("%.3f", median * 1e3) + " ms (x" + fmt("%.3f", w.profiled > 0 ? median / w.profiled : 1.0) + ")");
  w.profiled = median;
  w.settled = true;
  return median;
}

// Fits p.host_contention from the co-located runs, or says why not and
// leaves it (the older model, compute_contention). Times the whole model
// alone after each run (`timer`, into `whole`) and settles the layer
// profile before the fit. (Each run's factor was once taken relative to
// the time right before it: over two calibrations that spread the factors
// x1.22-1.66 where the plain ones were x1.37-1.39, docs/performance.md.)
void measureColocated(const JobSpec& job, const std::string& job_path, const std::vector<std::string>& overrides,
                      const std::string& self_exe, Profile& p, const std::function<void(const std::string&)>& say,
                      WholeModelTimer& timer, WholeModelTimes& whole) {
  const size_t L = p.layers.size();
  if (L < 2) {
    say("co-located run: skipped (one layer: no 2-stage pipeline); the older contention model stays");
    return;
  }
  JobSpec small = job;
  small.virtual_nodes = kColocatedVns;
  small.global_batch = kColocatedVns * job.vnSize();
  const SimOptions so = simOptionsFor(small, false);
  const double t0 = nowSeconds();
  std::vector<ColocatedRun> runs;
  bool two = false;
  std::string line;
  for (const ColocatedShape shape : kColocatedRuns) {
    if (static_cast<size_t>(shape.stages) > L) continue;
    std::string why;
    const double t = nowSeconds();
    std::optional<ColocatedRun> run = runColocated(job, job_path, overrides, self_exe, p, shape, why);
    const std::string what = shape.stages > 1 ? std::to_string(shape.stages) + "-stage run"
                                              : std::to_string(shape.workers) + "-worker data-parallel run";
    if (!run) {
      say("co-located " + what + ": " + why);
      if (runs.empty()) break;  // the first, a 2-stage run: the others would fare alike
      continue;
    }
    line += (line.empty() ? "" : ", ") + what + " " + fmt("%.1f", nowSeconds() - t) + " s";
    whole.samples.push_back(timer.time(kWholeModelBudgetS));
    two = two || shape.stages == 2;
    runs.push_back(std::move(*run));
  }
  if (!two) {
    say("co-located runs: no 2-stage run measured; the older contention model stays");
    return;
  }
  settle(p, whole, say);
  for (size_t i = 0; i < runs.size(); ++i) {
    try {  // its own factor, for the reader: how far the runs agree
      const int n = runs[i].plan.stages * runs[i].plan.replicas;
      const bool dp = runs[i].plan.stages == 1;
      std::vector<ColocatedRun> one{runs[i]};
      if (dp) one.insert(one.begin(), runs[0]);  // a fit needs a pipeline run
      const HostContention h = fitHostContention(p, one, so);
      line += (i ? "; run " : "; runs: ") + std::to_string(i + 1) + " x" +
              fmt("%.3f", dp ? h.busy_factors.at(n) : h.factor(n));
    } catch (const std::exception&) {
    }
  }
  try {
    p.host_contention = fitHostContention(p, runs, so);
  } catch (const std::exception& e) {
    say(std::string("co-located runs: no fit (") + e.what() + "); the older contention model stays");
    return;
  }
  p.host_contention.measured_on = "morph run over " + std::to_string(kColocatedVns) + " VNs: " +
                                  p.host_contention.measured_on;
  std::string factors;
  for (const auto& [n, f] : p.host_contention.factors)
    if (n > 1) factors += (factors.empty() ? "" : ", ") + std::to_string(n) + " processes x" + fmt("%.3f", f);
  for (const auto& [n, f] : p.host_contention.busy_factors)
    factors += ", " + std::to_string(n) + " busy at once x" + fmt("%.3f", f);
  say("co-located runs (" + line + "; " + fmt("%.1f", nowSeconds() - t0) + " s): each process computes " + factors +
      " the single-process figures; a pipeline step " + fmt("%.2f", p.host_contention.pipeline_step_s * 1e3) +
      " ms beyond the simulator's parts");
}

// Measures `job`'s profile: layers here, communication with a peer process,
// and (colocated) a short real run of worker processes on this host.
Profile calibrateJob(const JobSpec& job, const std::string& job_path, const std::vector<std::string>& overrides,
                     const std::string& self_exe, double budget_s, bool quiet, bool colocated) {
  const double t0 = nowSeconds();
  auto say = [&](const std::string& line) {
    if (!quiet) std::printf("calibrate: %s\n", line.c_str()), std::fflush(stdout);
  };
  pinThreads(job.threads);
  DataPair data = loadData(job, say);
  WholeModelTimes whole;
  Profile p = measureCompute(job, *data.train, budget_s, say, &whole.profiled);
  whole.samples.push_back(whole.profiled);
  WholeModelTimer timer(job, *data.train);

  // A store of its own on loopback; the peer proves the token it inherits.
  store::ServerOptions so;
  so.token = store::randomToken();
  so.manager_key = store::randomToken();
  store::StoreServer server(so);
  auto store = c10::make_intrusive<StoreClient>("127.0.0.1", server.port(), so.manager_key, "manager",
                                                kCalibConnectTimeout);
  store->setTimeout(kCalibStoreTimeout);
  const std::vector<int64_t> p2p = p2pSizes(p), ar = allreduceSizes(p);
  setString(*store, keys::kCalibSizes, json({{"p2p", p2p}, {"allreduce", ar}}).dump());
  setString(*store, keys::kCalibJob,
            json({{"path", std::filesystem::absolute(job_path).lexically_normal().string()}, {"overrides", overrides}})
                .dump());
  const std::string join = "127.0.0.1:" + std::to_string(server.port());
  // The peer's environment, built before fork (the store's threads run).
  std::vector<std::string> env_s = {"MORPH_TOKEN=" + so.token};
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "MORPH_TOKEN=", 12) != 0) env_s.push_back(*e);
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  const char* argv[] = {self_exe.c_str(), "calibrate-peer", "--join", join.c_str(), nullptr};
  pid_t pid = fork();
  if (pid < 0) throw JobError("cannot start the calibration peer process");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    execve(self_exe.c_str(), const_cast<char* const*>(argv), envp.data());
    std::perror("morph: exec calibrate-peer");
    _exit(3);
  }
  try {
    GlooOptions go;
    go.interface_addr = "127.0.0.1";
    auto comm = makeGlooCommunicator(c10::make_intrusive<c10d::PrefixStore>(keys::kCalibGroup, store), 0, 2, go);
    measureComm(*comm, p2p, ar, &p, say);
    p.compute_contention = measureContention(job, *data.train, *comm, kContentionRounds);
    say("two workers computing at once: x" + fmt("%.3f", p.compute_contention) + " per VN");
    store->wait({keys::kCalibStoreRtt}, kCalibStoreTimeout);
    // A worker reads the generation key each step and rank 0 posts the
    // step's metrics: two store round trips.
    p.step_overhead_s = 2.0 * std::stod(getString(*store, keys::kCalibStoreRtt));
  } catch (const std::exception& e) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    throw JobError(std::string("calibration failed: ") + e.what());
  }
  int status = 0;
  waitpid(pid, &status, 0);
  whole.samples.push_back(timer.time(kWholeModelBudgetS));  // the peer is gone: alone again
  if (colocated) measureColocated(job, job_path, overrides, self_exe, p, say, timer, whole);
  settle(p, whole, say);
  p.created_unix = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  p.calibration_seconds = nowSeconds() - t0;
  say("done in " + fmt("%.1f", p.calibration_seconds) + " s");
  return p;
}

// Where --plan auto keeps profiles between runs: $MORPH_CACHE, else
// ~/.cache/morph/profiles.
std::string cacheDir() {
  if (const char* c = std::getenv("MORPH_CACHE")) return c;
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/tmp") + "/.cache/morph/profiles";
}

json planJson(const PlanChoice& c, int workers) {
  json peak = json::array(), bubble = json::array(), busy = json::array();
  for (const StageSim& s : c.sim.stages)
    peak.push_back(s.peak_bytes), bubble.push_back(s.bubble), busy.push_back(s.busy_s);
  return {{"stages", c.plan.stages},         {"replicas", c.plan.replicas},
          {"schedule", scheduleLabel(c.plan)}, {"recompute", c.plan.recompute},
          {"cuts", c.plan.cuts},             {"vn_shares", c.plan.vn_shares},
          {"step_seconds", c.sim.step_seconds}, {"peak_bytes", peak},
          {"bubble", bubble},                {"busy_seconds", busy},
          {"idle_workers", workers - c.plan.stages * c.plan.replicas},
          {"workers", c.plan.workers},       {"bound_seconds", c.bound_s}};
}

// A cut per group against one shared cut (docs/planner.md, "A cut per
// group"): never run, reported.
json groupCutsJson(const GroupCutComparison& g, const PlanOutcome& out, int workers) {
  json per_group = planJson(g.per_group, workers);
  per_group["group_cuts"] = g.per_group.plan.group_cuts;
  json doc = {{"per_group", per_group},
              {"best_shared_step_seconds", out.plans.front().sim.step_seconds},
              {"beats_best", g.beats_best},
              {"of_chosen", g.of_chosen},
              {"candidates", g.candidates},
              {"simulated", g.simulated},
              {"runnable", false}};
  if (g.shared) doc["shared_same_groups"] = planJson(*g.shared, workers);
  return doc;
}

void printGroupCuts(const GroupCutComparison& g, const PlanOutcome& out, const std::vector<std::string>& names) {
  const PlanChoice& c = g.per_group;
  std::printf("\na cut per group (HetPipe; morph run runs one shared cut: docs/planner.md, \"A cut per group\"):\n");
  std::printf("  %s: %d stages x %d groups, %s%s: predicted %.2f ms per step",
              g.beats_best  ? "the fastest found, faster than the best plan above"
              : g.of_chosen ? "the chosen plan's groups"
                            : "the groups of the smallest bound (the chosen plan's groups cut alike)",
              c.plan.stages, c.plan.replicas,
              scheduleLabel(c.plan).c_str(), c.plan.recompute ? " with recomputation" : "", c.sim.step_seconds * 1e3);
  if (g.shared)
    std::printf("; one shared cut on the same groups %.2f ms (per group / shared %.3f)", g.shared->sim.step_seconds * 1e3,
                c.sim.step_seconds / g.shared->sim.step_seconds);
  std::printf("; the best plan above %.2f ms (%.3f)\n", out.plans.front().sim.step_seconds * 1e3,
              c.sim.step_seconds / out.plans.front().sim.step_seconds);
  const size_t P = static_cast<size_t>(c.plan.stages);
  for (size_t d = 0; d < c.plan.group_cuts.size(); ++d) {
    std::string slots;
    for (size_t k = 0; k < P; ++k) slots += (k ? " " : "") + std::to_string(c.plan.workers[d * P + k]);
    std::printf("  group %zu [%s], %lld VNs: %s\n", d, slots.c_str(), static_cast<long long>(c.plan.vn_shares[d]),
                describeCuts(names, c.plan.group_cuts[d]).c_str());
  }
}

void printPlans(const PlanOutcome& out, const std::vector<std::string>& names, int workers) {
  std::printf("%3s %3s %3s %4s %-8s %-9s %10s %7s  %-18s %-12s %s\n", "#", "P", "D", "idle", "schedule",
              "recompute", "step ms", "bubble", "peak MiB/stage", "VN shares", "cut");
  for (size_t i = 0; i < out.plans.size(); ++i) {
    const PlanChoice& c = out.plans[i];
    std::string peak;
    double bubble = 0;
    for (const StageSim& s : c.sim.stages) {
      peak += (peak.empty() ? "" : "/") + fmt("%.0f", static_cast<double>(s.peak_bytes) / 1048576.0);
      bubble = std::max(bubble, s.bubble);
    }
    std::string shares;
    for (int64_t v : c.plan.vn_shares) shares += (shares.empty() ? "" : "+") + std::to_string(v);
    std::string cut = describeCuts(names, c.plan.cuts);
    if (!c.plan.workers.empty()) {
      cut += "  (worker slots";
      for (int w : c.plan.workers) cut += " " + std::to_string(w);
      cut += ")";
    }
    std::printf("%3zu %3d %3d %4d %-8s %-9s %10.2f %7.3f  %-18s %-12s %s\n", i + 1, c.plan.stages, c.plan.replicas,
                workers - c.plan.stages * c.plan.replicas, scheduleLabel(c.plan).c_str(),
                c.plan.recompute ? "yes" : "no", c.sim.step_seconds * 1e3, bubble, peak.c_str(), shares.c_str(),
                cut.c_str());
  }
  std::printf("planning: %.1f ms, %lld candidates, %lld simulated\n", out.planning_seconds * 1e3,
              static_cast<long long>(out.candidates), static_cast<long long>(out.simulated));
}

// Each device type's compute as the planner and the simulator charge it
// (docs/resources.md): its slowdown times per-layer costs, the job's
// profile's (`base`) or, for a type with its own profile (measured on such
// a device), that profile's. A type's profile must be of this job (any
// host: the fingerprint's host keys may differ), with the same layers.
struct TypeCosts {
  std::map<std::string, int> table;  // type -> index in tables; -1: base's costs
  std::shared_ptr<std::vector<DeviceCosts>> tables = std::make_shared<std::vector<DeviceCosts>>();
};
TypeCosts typeCosts(const Resources& res, const Profile& base, const JobSpec& job) {
  TypeCosts out;
  for (const auto& [name, t] : res.types) {
    out.table[name] = -1;
    if (t.profile.empty()) continue;
    const std::string key = res.file + ": key 'types." + name + ".profile': " + t.profile;
    const Profile p = readProfile(t.profile);
    std::string diff;
    for (const std::string& d : fingerprintDifferences(p.fingerprint, jobFingerprint(job, base.fingerprint.layers)))
      if (d.rfind("host.", 0) != 0) diff += (diff.empty() ? "" : "; ") + d;
    if (!diff.empty()) throw InputError(key + " is a profile of another job (" + diff + ")");
    if (p.layers.size() != base.layers.size())
      throw InputError(key + " has " + std::to_string(p.layers.size()) + " layers, the job's profile " +
                       std::to_string(base.layers.size()));
    double c = 0;
    for (const LayerCost& l : p.layers) c += l.forward_s + l.backward_s;
    if (!(c > 0)) throw InputError(key + " has no compute times");
    out.table[name] = static_cast<int>(out.tables->size());
    out.tables->push_back(deviceCostsOf(p, t.profile));
  }
  return out;
}

// A resources file's devices as the planner takes them: per worker slot,
// its slowdown, cost table (typeCosts()), memory and host. Returns, per
// type, where its compute comes from (empty without a file).
std::map<std::string, std::string> addDevices(PlanRequest& rq, const std::string& path, const Profile& base,
                                              const JobSpec& job) {
  std::map<std::string, std::string> source;
  if (path.empty()) return source;
  const Resources res = readResources(path);
  const TypeCosts costs = typeCosts(res, base, job);
  for (const auto& [name, t] : res.types)
    source[name] = (costs.table.at(name) >= 0 ? "per-layer costs of its own profile " + t.profile
                                              : std::string("the job's profile")) +
                   (t.slowdown != 1.0 ? fmt(" x slowdown %g", t.slowdown) : std::string());
  std::vector<std::string> hosts;
  for (size_t s = 0; s < res.devices.size(); ++s) {
    rq.slot_slowdown.push_back(res.typeOf(s).slowdown);
    if (!costs.tables->empty()) rq.slot_costs.push_back(costs.table.at(res.devices[s].type));
    rq.slot_memory.push_back(res.typeOf(s).memory_bytes);
    auto it = std::find(hosts.begin(), hosts.end(), res.devices[s].host);
    rq.slot_host.push_back(static_cast<int>(it - hosts.begin()));
    if (it == hosts.end()) hosts.push_back(res.devices[s].host);
  }
  rq.workers = static_cast<int>(res.devices.size());
  if (!costs.tables->empty()) rq.sim.device_costs = costs.tables;
  rq.sim.cross_host_bytes_per_s = res.between_hosts_bytes_per_s;
  rq.sim.hosts_share_cores = res.one_machine;
  rq.sim.cross_host_latency_s = res.between_hosts_latency_s;
  return source;
}

void printTypeSources(const std::map<std::string, std::string>& source) {
  for (const auto& [name, from] : source) std::printf("device type %s: compute from %s\n", name.c_str(), from.c_str());
}

// HetPipe's allocation policies against the planner's choice.
void printAllocations(const std::vector<AllocationRow>& rows) {
  std::printf("\nallocation policies (virtual workers = groups of devices, by worker slot; docs/resources.md):\n%s",
              allocationTable(rows, [](int slot) { return std::to_string(slot); }).c_str());
}

std::string sharesText(const std::vector<int64_t>& shares) {
  std::string t;
  for (int64_t v : shares) t += (t.empty() ? "" : "+") + std::to_string(v);
  return t;
}

json wspJson(const WspPrediction& w, const JobSpec& job) {
  json vws = json::array();
  for (const WspVwSim& v : w.wsp.vws)
    vws.push_back({{"compute_seconds", v.compute_s}, {"push_seconds", v.push_s}, {"pull_seconds", v.pull_s},
                   {"cycle_seconds", v.cycle_s}, {"server_seconds", v.server_s}});
  const WspMemory& m = w.memory;
  return {{"staleness", job.staleness},
          {"wave", job.wave},
          {"virtual_workers", w.plan.replicas},
          {"vn_shares", w.plan.vn_shares},
          {"clock_seconds", w.wsp.clock_seconds},
          {"step_seconds", w.wsp.step_seconds},
          {"server_seconds", w.wsp.server_seconds},
          {"cores_bound_seconds", w.wsp.cores_bound_seconds},
          {"slowest", w.wsp.slowest},
          {"sync_step_seconds", w.sync.step_seconds},
          {"vws", vws},
          {"memory", {{"bytes", w.worker_bytes + m.total()},
                      {"worker_bytes", w.worker_bytes},
                      {"wave_sum", m.wave_sum},
                      {"push", m.push},
                      {"shard", m.shard},
                      {"push_buffers", m.receive},
                      {"pending_pushes", m.pending},
                      {"pull_replies", m.replies},
                      {"snapshot", m.snapshot},
                      {"limit_bytes", w.limit_bytes}}}};
}

void printWsp(const WspPrediction& w, const JobSpec& job) {
  const WspSimResult& r = w.wsp;
  std::printf("\nWSP (sync.staleness = %lld, sync.wave = %lld): %d virtual workers = worker slots 0..%d, VN shares %s "
              "(what morph run gives a WSP job):\n",
              static_cast<long long>(job.staleness), static_cast<long long>(job.wave), w.plan.replicas,
              w.plan.replicas - 1, sharesText(w.plan.vn_shares).c_str());
  std::printf("  predicted %.2f ms per clock = %.2f ms per step's minibatches; sync on the same grouping %.2f ms per "
              "step (WSP/sync %.2f)\n",
              r.clock_seconds * 1e3, r.step_seconds * 1e3, w.sync.step_seconds * 1e3,
              w.sync.step_seconds > 0 ? r.step_seconds / w.sync.step_seconds : 0.0);
  std::printf("  %4s %12s %9s %9s %12s\n", "VW", "compute ms", "push ms", "pull ms", "wave ms");
  for (size_t v = 0; v < r.vws.size(); ++v) {
    const WspVwSim& s = r.vws[v];
    std::printf("  %4zu %12.2f %9.2f %9.2f %12.2f%s\n", v, s.compute_s * 1e3, s.push_s * 1e3, s.pull_s * 1e3,
                s.cycle_s * 1e3, static_cast<int>(v) == r.slowest ? "  slowest" : "");
  }
  std::printf("  shard clock %.2f ms (%s); cores bound %.2f ms per clock\n", r.server_seconds * 1e3,
              job.staleness == 0 ? "on the path: D = 0 waits for it" : "beside the next wave: D >= 1",
              r.cores_bound_seconds * 1e3);
  int64_t limit = 0;
  for (int64_t l : w.limit_bytes) limit = limit == 0 ? l : l > 0 ? std::min(limit, l) : limit;
  std::printf("  memory per VW about %.1f MiB%s: data-parallel worker %.1f MiB + %s\n",
              static_cast<double>(w.worker_bytes + w.memory.total()) / 1048576.0,
              limit > 0 ? (" (limit " + fmt("%.1f", static_cast<double>(limit) / 1048576.0) + " MiB)").c_str() : "",
              static_cast<double>(w.worker_bytes) / 1048576.0, w.memory.describe().c_str());
}

}  // namespace

SimOptions simOptionsFor(const JobSpec& job, bool in_process) {
  SimOptions o;
  o.bucket_bytes = bucketBytes();
  o.link_delay_s = linkEmulation().delay_ms / 1000.0;
  o.clipping = job.optim.clip_norm > 0;
  o.in_process = in_process;
  o.checkpoints = job.checkpoint_every > 0;
  return o;
}

int runCalibrate(const CalibrateOptions& o) {
  const JobSpec job = loadJobFile(o.job_path, o.overrides);
  checkJobFitsMemory(job, 1, 1, availableMemoryBytes());  // it builds the model and loads the data here
  if (!o.resources.empty()) {
    // Emulated device types run on this machine: one profile serves them
    // all, and the planner scales its compute by each type's slowdown. On
    // real mixed hardware, calibrate on a machine of each type.
    const Resources res = readResources(o.resources);
    std::printf("calibrate: %zu device types in %s share this machine's profile (scaled by their slowdown)\n",
                res.types.size(), o.resources.c_str());
  }
  const std::string out = !o.out.empty() ? o.out : "runs/" + job.name + "/profile.json";
  const Profile p = calibrateJob(job, o.job_path, o.overrides, o.self_exe, o.budget_s, o.quiet, o.colocated);
  writeProfile(p, out);
  std::printf("profile: %s (%zu layers, %.1f s)\n", out.c_str(), p.layers.size(), p.calibration_seconds);
  return 0;
}

int runCalibratePeer(const std::string& join) {
  auto store = connectToManager(join, readToken(""), "worker", 30.0);
  const json sizes = json::parse(getString(*store, keys::kCalibSizes));
  const json job_ref = json::parse(getString(*store, keys::kCalibJob));
  const JobSpec job = loadJobFile(job_ref.at("path").get<std::string>(),
                                  job_ref.at("overrides").get<std::vector<std::string>>());
  pinThreads(job.threads);
  DataPair data = loadDatasets(job.data, job.seed);
  GlooOptions go;
  go.interface_addr = "127.0.0.1";
  auto comm = makeGlooCommunicator(c10::make_intrusive<c10d::PrefixStore>(keys::kCalibGroup, store), 1, 2, go);
  measureComm(*comm, sizes.at("p2p").get<std::vector<int64_t>>(), sizes.at("allreduce").get<std::vector<int64_t>>(),
              nullptr, nullptr);
  measureContention(job, *data.train, *comm, kContentionRounds);
  // One store round trip, as a worker pays it between steps.
  std::vector<double> rtt;
  for (int i = 0; i < 41; ++i) {
    const double t0 = nowSeconds();
    setString(*store, keys::kCalibProbe, std::to_string(i));
    (void)getString(*store, keys::kCalibProbe);
    if (i > 0) rtt.push_back((nowSeconds() - t0) / 2);
  }
  std::sort(rtt.begin(), rtt.end());
  setString(*store, keys::kCalibStoreRtt, std::to_string(rtt[rtt.size() / 2]));
  return 0;
}

int runSimulate(const SimulateOptions& o) {
  const JobSpec job = loadJobFile(o.job_path, o.overrides);
  const Profile prof = loadProfileFor(o.profile, job);
  const std::vector<std::string>& names = prof.fingerprint.layers;
  PlanSpec plan;
  if (!o.plan.empty()) {
    const PlanFile pf = readPlanFile(o.plan, names, job.virtual_nodes);
    plan.cuts = pf.cuts;
    plan.stages = pf.stages();
    plan.schedule = pf.schedule.value_or(ScheduleKind::k1F1B);
    plan.recompute = pf.recompute.value_or(false);
    plan.replicas = pf.replicas.value_or(o.workers > 0 ? o.workers / plan.stages : 1);
    plan.vn_shares = pf.vn_shares;
    plan.workers = pf.workers;
  } else {
    plan.stages = o.stages;
    plan.cuts = evenCuts(names.size(), o.stages);
    plan.replicas = o.workers > 0 ? o.workers / o.stages : 1;
  }
  if (!o.schedule.empty()) plan.schedule = parseScheduleKind(o.schedule);
  plan.recompute = plan.recompute || o.recompute;
  if (o.workers > 0 && o.workers % plan.stages != 0)
    throw InputError("--workers " + std::to_string(o.workers) + " is not a multiple of the " +
                     std::to_string(plan.stages) + " stages");
  if (plan.vn_shares.empty()) {
    if (job.virtual_nodes < plan.replicas)
      throw InputError("batch.virtual_nodes = " + std::to_string(job.virtual_nodes) + " cannot feed " +
                       std::to_string(plan.replicas) + " replicas");
    plan.vn_shares = evenShares(job.virtual_nodes, plan.replicas);
  }
  SimOptions so = simOptionsFor(job, o.workers == 0 && plan.stages == 1);
  if (!o.resources.empty()) {
    const Resources res = readResources(o.resources);
    const size_t ranks = static_cast<size_t>(plan.stages * plan.replicas);
    if (res.devices.size() < ranks)
      throw InputError(o.resources + ": lists " + std::to_string(res.devices.size()) + " devices for a plan of " +
                       std::to_string(ranks) + " workers");
    const TypeCosts costs = typeCosts(res, prof, job);
    if (!costs.tables->empty()) so.device_costs = costs.tables;
    std::vector<std::string> hosts;
    for (size_t r = 0; r < ranks; ++r) {
      const size_t slot = plan.workers.empty() ? r : static_cast<size_t>(plan.workers[r]);
      plan.slowdown.push_back(res.typeOf(slot).slowdown);
      if (!costs.tables->empty()) so.rank_costs.push_back(costs.table.at(res.devices[slot].type));
      auto it = std::find(hosts.begin(), hosts.end(), res.devices[slot].host);
      so.rank_host.push_back(static_cast<int>(it - hosts.begin()));
      if (it == hosts.end()) hosts.push_back(res.devices[slot].host);
    }
    so.cross_host_bytes_per_s = res.between_hosts_bytes_per_s;
    so.cross_host_latency_s = res.between_hosts_latency_s;
    so.hosts_share_cores = res.one_machine;
  }
  const SimResult r = simulate(prof, plan, so);
  if (o.json) {
    json stages = json::array();
    for (int k = 0; k < plan.stages; ++k) {
      const StageSim& s = r.stages[static_cast<size_t>(k)];
      stages.push_back({{"layers", {plan.cuts[static_cast<size_t>(k)], plan.cuts[static_cast<size_t>(k) + 1]}},
                        {"busy_seconds", s.busy_s},
                        {"bubble", s.bubble},
                        {"peak_bytes", s.peak_bytes}});
    }
    std::printf("%s\n", json({{"step_seconds", r.step_seconds},
                              {"schedule_seconds", r.schedule_seconds},
                              {"reduce_seconds", r.reduce_seconds},
                              {"stages", stages},
                              {"replicas", plan.replicas},
                              {"schedule", scheduleLabel(plan)},
                              {"recompute", plan.recompute},
                              {"cuts", plan.cuts},
                              {"vn_shares", plan.vn_shares}})
                            .dump(2)
                            .c_str());
    return 0;
  }
  std::printf("predicted step: %.2f ms (compute %.2f ms, then reductions and optimiser %.2f ms)\n",
              r.step_seconds * 1e3, r.schedule_seconds * 1e3, r.reduce_seconds * 1e3);
  std::printf("plan: %d stages x %d replicas, schedule %s%s, cut: %s\n", plan.stages, plan.replicas,
              scheduleLabel(plan).c_str(), plan.recompute ? " with recomputation" : "",
              describeCuts(names, plan.cuts).c_str());
  std::printf("%5s  %-24s %10s %7s %10s\n", "stage", "layers", "busy ms", "bubble", "peak MiB");
  for (int k = 0; k < plan.stages; ++k) {
    const StageSim& s = r.stages[static_cast<size_t>(k)];
    std::printf("%5d  %-24s %10.2f %7.3f %10.1f\n", k,
                describeCuts(names, {plan.cuts[static_cast<size_t>(k)], plan.cuts[static_cast<size_t>(k) + 1]}).c_str(),
                s.busy_s * 1e3, s.bubble, static_cast<double>(s.peak_bytes) / 1048576.0);
  }
  return 0;
}

int runPlan(const PlanOptions& o) {
  const JobSpec job = loadJobFile(o.job_path, o.overrides);
  const Profile prof = loadProfileFor(o.profile, job);
  const std::vector<std::string>& names = prof.fingerprint.layers;
  PlanRequest rq;
  rq.workers = o.workers;
  rq.virtual_nodes = job.virtual_nodes;
  rq.memory_cap_bytes = static_cast<int64_t>(o.memory_cap_mib * 1048576.0);
  rq.top_k = o.top;
  rq.sim = simOptionsFor(job, false);
  const auto type_sources = addDevices(rq, o.resources, prof, job);
  // A WSP job: its own grouping's clock beside sync's step, and whether its
  // virtual workers fit their memory (exit 2 first if not).
  std::optional<WspPrediction> wsp;
  if (job.sync_mode == SyncMode::kWsp) {
    // The VN shares morph run gives it (docs/wsp.md, "VN shares by device speed").
    std::vector<double> share_seconds;
    if (!o.resources.empty()) share_seconds = deviceVnSeconds(readResources(o.resources), job).seconds;
    wsp = predictWsp(prof, rq, {job.staleness, job.wave}, job.steps > 0 ? (job.steps + job.wave - 1) / job.wave : 0,
                     job.file, share_seconds);
  }
  const PlanOutcome out = planJob(prof, rq);
  std::vector<AllocationRow> allocations;
  if (!o.resources.empty()) allocations = compareAllocations(prof, rq, out);
  if (!o.out.empty())
    writePlanFile(o.out, out.plans.front().plan, names,
                  json({{"predicted_step_seconds", out.plans.front().sim.step_seconds}, {"profile", o.profile}}).dump());
  if (o.json) {
    json plans = json::array();
    for (const PlanChoice& c : out.plans) plans.push_back(planJson(c, rq.workers));
    json doc = {{"plans", plans},
                {"planning_seconds", out.planning_seconds},
                {"candidates", out.candidates},
                {"simulated", out.simulated}};
    if (!allocations.empty()) {
      json rows = json::array();
      for (const AllocationRow& r : allocations)
        rows.push_back(r.best ? json{{"policy", r.policy}, {"plan", planJson(*r.best, rq.workers)}}
                              : json{{"policy", r.policy}, {"not_applicable", r.why_not}});
      doc["allocations"] = rows;
    }
    if (wsp) doc["wsp"] = wspJson(*wsp, job);
    if (out.group_cuts) doc["group_cuts"] = groupCutsJson(*out.group_cuts, out, rq.workers);
    if (!type_sources.empty()) doc["device_types"] = type_sources;
    std::printf("%s\n", doc.dump(2).c_str());
    return 0;
  }
  printTypeSources(type_sources);
  printPlans(out, names, rq.workers);
  if (out.group_cuts) printGroupCuts(*out.group_cuts, out, names);
  if (!allocations.empty()) printAllocations(allocations);
  if (wsp) printWsp(*wsp, job);
  if (!o.out.empty()) std::printf("plan: %s\n", o.out.c_str());
  return 0;
}

RunOptions resolveAutoPlan(const RunOptions& o, const JobSpec& job) {
  const std::string dir = outDir(o, job);
  const std::vector<std::string> names = layerNames(job);
  const Fingerprint want = jobFingerprint(job, names);
  const std::string run_profile = dir + "/profile.json";
  const std::string cached = cacheDir() + "/" + fingerprintDigest(want) + ".json";
  Profile prof;
  bool found = false;
  std::string used_profile = run_profile;
  for (const std::string& path : {run_profile, cached}) {
    if (!std::filesystem::exists(path)) continue;
    try {
      prof = readProfile(path);
      if (fingerprintDifferences(prof.fingerprint, want).empty()) {
        found = true;
        used_profile = path;
        std::printf("morph: --plan auto: using the profile %s\n", path.c_str());
        break;
      }
      std::printf("morph: --plan auto: %s is for another job or machine\n", path.c_str());
    } catch (const InputError& e) {
      std::fprintf(stderr, "morph: --plan auto: ignoring %s\n", e.what());
    }
  }
  if (!found) {
    std::printf("morph: --plan auto: no matching profile; calibrating (docs/profile_format.md)\n");
    std::fflush(stdout);
    prof = calibrateJob(job, o.job_path, effectiveOverrides(o), o.self_exe, kCalibrateBudget, o.quiet, true);
    writeProfile(prof, run_profile);
    try {
      writeProfile(prof, cached);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "morph: --plan auto: cannot cache the profile in %s (%s)\n", cached.c_str(), e.what());
    }
  }
  PlanRequest rq;
  rq.workers = std::max(1, o.workers);
  rq.virtual_nodes = job.virtual_nodes;
  rq.memory_cap_bytes = static_cast<int64_t>(o.memory_cap_mib * 1048576.0);
  rq.top_k = 3;
  rq.sim = simOptionsFor(job, o.workers == 0);
  if (o.stages > 1) rq.max_stages = o.stages;  // an upper bound the user set
  const auto type_sources = addDevices(rq, o.resources, prof, job);
  if (!o.schedule.empty()) rq.schedules = {parseScheduleKind(o.schedule)};
  const PlanOutcome out = planJob(prof, rq);
  const PlanChoice& best = out.plans.front();
  if (!o.quiet) {
    printTypeSources(type_sources);
    printPlans(out, names, rq.workers);
  }
  const int used = best.plan.stages * best.plan.replicas;
  RunOptions r = o;
  r.plan = dir + "/plan.json";
  writePlanFile(r.plan, best.plan, names,
                json({{"predicted_step_seconds", best.sim.step_seconds}, {"profile", found ? "cached" : run_profile}}).dump());
  std::printf("morph: --plan auto chose %d stage%s x %d replica%s%s%s, predicted %.2f ms per step (%s)\n",
              best.plan.stages, best.plan.stages == 1 ? "" : "s", best.plan.replicas,
              best.plan.replicas == 1 ? "" : "s",
              best.plan.stages > 1 ? (", " + toString(best.plan.schedule)).c_str() : "",
              best.plan.recompute ? " with recomputation" : "", best.sim.step_seconds * 1e3, r.plan.c_str());
  if (o.workers > used)
    std::printf("morph: %d of the %d workers would not make a step faster; %s %d\n", o.workers - used, o.workers,
                o.resources.empty() ? "starting" : "running on", used);
  std::fflush(stdout);
  r.stages = best.plan.stages;
  r.profile = used_profile;  // a pipeline morphs with the planner too
  r.schedule.clear();  // the plan file's
  r.recompute = false;
  // Devices: every listed worker starts; the plan names the slots it uses.
  if (o.workers > 0 && o.resources.empty()) r.workers = used;
  if (o.spawn > r.workers) r.spawn = r.workers;
  return r;
}

std::map<int, double> plannedStepSeconds(const std::string& job_path, const std::string& profile_path,
                                         int max_workers) {
  const JobSpec job = loadJobFile(job_path);
  const Profile prof = loadProfileFor(profile_path, job);
  std::map<int, double> table;
  for (int k = 1; k <= max_workers && k <= job.virtual_nodes; ++k) {
    PlanRequest rq;
    rq.workers = k;
    rq.virtual_nodes = job.virtual_nodes;
    rq.top_k = 1;
    rq.sim = simOptionsFor(job, false);
    table[k] = planJob(prof, rq).plans.front().sim.step_seconds;
  }
  return table;
}

std::map<std::vector<int>, double> plannedStepSecondsByType(const std::string& job_path,
                                                            const std::string& profile_path, int max_workers,
                                                            const std::string& resources_path,
                                                            const std::vector<std::string>& types,
                                                            const std::vector<int>& counts, int64_t max_entries) {
  const JobSpec job = loadJobFile(job_path);
  const Profile prof = loadProfileFor(profile_path, job);
  const Resources res = readResources(resources_path);
  const TypeCosts costs = typeCosts(res, prof, job);
  const int most = static_cast<int>(std::min<int64_t>(max_workers, job.virtual_nodes));
  // Every allocation of 1..most slots within the counts, odometer order.
  std::vector<std::vector<int>> all;
  std::vector<int> x(types.size(), 0);
  for (;;) {
    size_t d = 0;
    for (; d < x.size(); ++d) {
      if (x[d] < std::min(counts[d], most)) {
        ++x[d];
        break;
      }
      x[d] = 0;
    }
    if (d == x.size()) break;
    const int sum = std::accumulate(x.begin(), x.end(), 0);
    if (sum >= 1 && sum <= most) all.push_back(x);
    if (static_cast<int64_t>(all.size()) > max_entries) return {};  // too many: the slowest-device rule
  }
  std::map<std::vector<int>, double> table;
  for (const std::vector<int>& a : all) {
    PlanRequest rq;
    rq.virtual_nodes = job.virtual_nodes;
    rq.top_k = 1;
    rq.sim = simOptionsFor(job, false);
    if (!costs.tables->empty()) rq.sim.device_costs = costs.tables;
    for (size_t t = 0; t < a.size(); ++t)
      for (int k = 0; k < a[t]; ++k) {
        rq.slot_slowdown.push_back(res.types.at(types[t]).slowdown);
        if (!costs.tables->empty()) rq.slot_costs.push_back(costs.table.at(types[t]));
        rq.slot_memory.push_back(res.types.at(types[t]).memory_bytes);
      }
    rq.workers = static_cast<int>(rq.slot_slowdown.size());
    try {
      table[a] = planJob(prof, rq).plans.front().sim.step_seconds;
    } catch (const InputError&) {
      // No plan fits these devices' memory: the allocation stays unlisted.
    }
  }
  return table;
}

}  // namespace morph
