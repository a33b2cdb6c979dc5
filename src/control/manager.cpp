// Manager: hosts the job's store (store/server.h), tracks membership (registrations,
// heartbeats, local child exits, leave posts), turns every membership change
// into a new generation with a new VN plan, and writes the job's outputs.
// It never trains and never touches tensors. Protocol: docs/distributed.md.
#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include <cctype>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "control/internal.h"
#include "control/protocol/generation_plan.h"
#include "control/protocol/generation_want.h"
#include "control/protocol/member_report.h"
#include "control/protocol/message.h"
#include "plan/morph_plan.h"
#include "control/protocol/keys.h"
#include "control/protocol/job_key_policy.h"
#include "store/local_store.h"
#include "store/server.h"
#include "control/straggler.h"
#include "core/model_hash.h"
#include "exec/pipeline.h"
#include "plan/plan_file.h"
#include "plan/planner.h"
#include "plan/resources.h"
#include "plan/vn_shares.h"

namespace morph {

using namespace detail;

namespace {

// The manager's loop sleeps until a worker writes to the store (heartbeats
// aside) or this long passes: deadlines, heartbeats and local children's
// exits are looked at on this clock (docs/distributed.md, "Deadlines").
constexpr auto kIdleWait = std::chrono::milliseconds(100);
// A worker that took an id (workers/next_id) must announce its pid within
// this long, or the id is skipped (it died while registering).
constexpr double kAnnounceDeadlineS = 10.0;
// Generation 0 forms when every expected worker is ready; if that has not
// happened this long after the manager started, it forms with the workers
// that are ready (none: exit 3).
constexpr double kStartDeadlineS = 120.0;
// A member that has not answered a generation change after
// max(kRegroupFloorS, kDeadlineFactor x the longest measured time between
// two committed steps) is reported; it is declared dead only once its
// heartbeats stop (a busy member is not a dead one).
constexpr double kRegroupFloorS = 60.0;
constexpr double kDeadlineFactor = 4.0;
// ... except one that still has not answered after kStuckFactor x that
// deadline: it heart-beats but is stuck (seen: a survivor of a pipeline
// morph whose joiner died while state moved), and the job would wait for
// it forever; it is declared dead, and the morph goes on without it.
constexpr double kStuckFactor = 3.0;
// A store call of the manager's own (a read that waits for its key) fails
// after this long.
constexpr auto kManagerStoreTimeout = std::chrono::seconds(60);
// The status record (`morph status`, the status page) is rewritten at most
// this often.
constexpr double kStatusIntervalS = 0.5;
// `morph resize` and `morph status` give up on reaching the manager, and
// `morph status` on its first status record, after this long.
constexpr double kClientTimeoutS = 5.0;

struct WorkerInfo {
  pid_t pid = -1;        // local child, or -1
  bool alive = true;
  bool placeable = false;  // data loaded ("workers/<id>/ready")
  bool announced = true;   // false: took an id but never posted its pid
  double warned = 0;       // when it was last reported slow to answer a generation change
  std::string hb;        // last heartbeat value seen
  double hb_time = 0;    // when it last changed
};

class Manager {
 public:
  Manager(const RunOptions& o, const JobSpec& job, const std::string& job_text)
      : o_(o), job_(job), job_text_(job_text), target_(o.workers),
        straggler_({job.straggler_factor, job.straggler_steps, job.straggler_replan}),
        pstraggler_({job.straggler_factor, job.straggler_steps, job.straggler_replan}) {}
  // Phases: checkOptions, publishJob, superviseGenerations, finish.
  int run();

 private:
  void checkOptions();
  void publishJob();
  void superviseGenerations();
  void watchMembership();
  bool resultsPosted();
  std::string pipelineHash(const std::map<int, std::string>& stage_hashes);
  int finish();
  void hostStore();
  void spawn(int count);
  void pollRegistrations();
  void admit(int64_t id, WorkerInfo& w);
  void pollChildren();
  void pollHeartbeats();
  void pollResizeRequests();
  // `morph slow` (ctl/slow/<id>): the factors in effect ride on gen/want,
  // which every member reads before each step (GenerationWant).
  void pollSlowRequests();
  // gen/want: generation g, with the `morph slow` factors in effect.
  void writeWant(int64_t g);
  void pollMetrics();
  void watchStragglers(const json& line);
  void updateStatus();
  void startTransition(const std::string& cause);
  bool transitionComplete();
  void publish();
  // Deletes the keys of past generations and departed workers.
  void forgetPast();
  // A pipeline job's next generation after a membership change: its shape,
  // placement and the layers that move (plan/morph_plan.h). Sets the
  // members (by world rank) and the workers released.
  PipelineMorph publishMorph(std::vector<int64_t>& members, const std::vector<int64_t>& survivors,
                             const std::map<int64_t, MemberReport>& reports, std::vector<int64_t>& released);
  // How a pipeline job runs on `workers` workers: the planner's best plan
  // when the job has a profile (--plan auto), else the documented rule.
  struct MorphTarget {
    MorphShape shape;             // {0, 0}: nothing fits
    std::vector<size_t> cuts;
    std::string schedule;
    bool recompute = false;
    std::vector<int64_t> vn_shares;  // per replica; empty: even
    double predicted_s = 0;          // the planner's step time
    std::string by;                  // "planner" or "rule"
  };
  MorphTarget morphTarget(int workers);
  // The memory cap a morph's shape must fit (--memory-cap, or the smallest
  // device of a resources file); 0: none.
  int64_t morphMemoryCap() const;
  // Whether the pipeline should grow onto `joiners` waiting workers.
  bool shouldGrow(int size, int joiners);
  [[noreturn]] void noWorkerLeft(const std::string& why);
  // A worker that died, failed or was refused before it was ever ready.
  void startFailed(int64_t id, const std::string& why, bool input);
  // Generation 0: publishes it when every expected worker is ready, or when
  // those that can start are (the others failed), or at kStartDeadlineS.
  void maybeStart(double since);
  std::string resumeCommand() const;
  double regroupDeadline() const {
    return job_.collective_timeout > 0 ? job_.collective_timeout
                                       : std::max(kRegroupFloorS, kDeadlineFactor * longest_gap_);
  }
  void markDead(int64_t id, const std::string& why);
  void setUpPipeline();
  json pipelineResults(const std::vector<json>& results);
  // The pipeline's plan as summary.json names it (docs/planner.md).
  json planSummary() const {
    return {{"stages", pipeline_->stages},
            {"replicas", pipeline_->replicas},
            {"schedule", pipeline_->schedule},
            {"recompute", pipeline_->recompute},
            {"cuts", pipeline_->cuts}};
  }
  void writeTrace();
  bool pipelined() const { return pipeline_.has_value(); }
  std::string key(int64_t g, const std::string& what, int64_t id) const {
    return keys::genReport(g, what, id);
  }
  void killChildren() {
    for (auto& [id, w] : workers_)
      if (w.pid > 0 && w.alive) kill(w.pid, SIGKILL);
    for (pid_t p : unregistered_pids_) kill(p, SIGKILL);
  }

  const RunOptions& o_;
  const JobSpec& job_;
  const std::string& job_text_;
  std::string dir_;
  int target_;
  std::unique_ptr<store::StoreServer> server_;
  c10::intrusive_ptr<c10d::Store> store_;  // the manager's own view of the store (store::LocalStore)
  int port_ = 0;
  std::string token_file_;  // OUT/token: what local workers prove
  std::string join_host_;   // how local workers reach the store
  double hb_interval_ = 0, hb_timeout_ = 0;  // --heartbeat-interval, --heartbeat-timeout (seconds)
  std::map<int64_t, WorkerInfo> workers_;
  std::set<int64_t> gone_before_, forgotten_;  // departed workers: at the last generation change; keys deleted
  std::set<pid_t> unregistered_pids_;
  std::vector<int64_t> members_;
  int64_t gen_ = -1;
  bool in_transition_ = false;
  std::string transition_cause_;
  double transition_start_ = 0;
  double transition_unix_ = 0;  // wall-clock time of the change, for benchmarks
  int64_t resize_seq_ = 0;
  GenerationWant want_;  // what gen/want holds
  std::map<int64_t, std::string> slow_seen_;  // ctl/slow/<id> values read, by worker
  int64_t events_seen_ = 0;
  std::unique_ptr<RunLog> log_;
  int64_t steps_ = -1, next_ = 0, committed_ = -1, first_step_ = 0;
  json resizes_ = json::array();
  // The resize whose first committed step we are waiting for.
  json pending_resize_;
  int64_t pending_gen_ = -1;
  double pending_since_ = 0, last_hb_poll_ = 0, last_status_ = 0, last_sps_ = 0;
  // Pipeline jobs (--stages > 1): stages, replicas, cuts, schedule, ...
  std::optional<PipelineLayout> pipeline_;
  json fingerprint_;  // what every worker of an exact job must match (runtimeFingerprint)
  int spawned_ = 0;   // local workers started at the beginning (--spawn, default --workers)
  // Workers that could not start before generation 0 (each with why) and
  // whether every one of them failed on bad input (exit 2 if none starts).
  std::vector<std::string> start_failures_;
  bool start_failures_input_ = true;
  std::map<int64_t, double> unannounced_;  // id -> when it was first seen without a pid
  int unmatched_deaths_ = 0;  // local workers that died before announcing an id (skipped ids not counted twice)
  double last_commit_unix_ = 0, longest_gap_ = 0;  // between two committed steps' lines (seconds)
  // Data parallelism from a plan file: VNs per worker while the job runs
  // on exactly that many (a resize falls back to even shares).
  std::vector<int64_t> dp_shares_;
  // From a plan file: the worker slot (= worker id) of each world rank of
  // the first generation. Devices of a resources file, by worker slot.
  std::vector<int> plan_workers_;
  std::vector<std::string> layer_names_;  // pipeline jobs: the model's layers, for its hash
  std::vector<int64_t> layer_bytes_;      // per layer: parameters, buffers and optimiser state
  std::vector<std::pair<size_t, size_t>> tied_layers_;  // (user, owner) of shared weights
  std::optional<Resources> res_;
  std::vector<int64_t> vn_shares_;  // VNs per member of the current generation
  StragglerWatch straggler_;        // data parallelism: seconds per VN per worker (straggler.h)
  PipelineStragglerWatch pstraggler_;  // pipelines: the same per stage
  json straggler_note_;             // the straggler re-plan under way, for its resizes entry
  void checkDeviceMemory(const std::vector<size_t>& cuts, const ScheduleOptions& so,
                         const std::vector<std::string>& names);
  std::unique_ptr<StatusServer> status_page_;  // --status (docs/status_page.md)
  // Pipeline morphs: the profile of --plan auto, the planner's choice by
  // worker count, the rule's memory verdicts by (stages, replicas), and
  // when spares were last considered for growth.
  std::optional<Profile> profile_;
  std::map<int, MorphTarget> planned_;
  std::map<std::pair<int, int>, bool> fits_;
  std::unique_ptr<Dataset> mem_train_;
  int grow_joiners_ = -1;
  double grow_checked_ = 0;
  std::string grow_said_;
};

// Validates the plan before any worker starts: the cut (even or from the
// plan file), its replicas, VN shares and worker slots, the worker count,
// each replica's schedule, the memory cap and each device's memory
// (resources file).
void Manager::setUpPipeline() {
  const bool plan_file = !o_.plan.empty() && o_.plan != "auto";
  if (!o_.resources.empty()) res_ = readResources(o_.resources);
  if (o_.stages <= 1 && !plan_file && !res_) return;
  auto model = buildModel(job_.model, job_.seed);
  std::vector<std::string> names;
  for (size_t l = 0; l < model->size(); ++l) names.push_back(model->layerName(l));
  layer_names_ = names;
  {
    // What moving a layer costs when a pipeline morphs: its tensors and
    // their optimiser state (SGD momentum: one copy; AdamW: two).
    const int64_t copies = job_.optim.name == "adamw" ? 3 : job_.optim.momentum > 0 ? 2 : 1;
    for (size_t l = 0; l < model->size(); ++l) {
      int64_t b = 0;
      for (const auto& p : model->layer(l).parameters()) b += copies * p.numel() * p.element_size();
      for (const auto& t : model->layer(l).buffers()) b += t.numel() * t.element_size();
      layer_bytes_.push_back(b);
      for (auto& [alias, owner] : model->layer(l).tiedLeaves())
        for (size_t o = 0; o < model->size(); ++o)
          for (const auto& p : model->layer(o).parameters())
            if (p.unsafeGetTensorImpl() == owner.unsafeGetTensorImpl()) tied_layers_.push_back({l, o});
    }
  }
  PlanFile pf;
  if (plan_file) {
    pf = readPlanFile(o_.plan, names, job_.virtual_nodes);
    if (o_.stages > 1 && o_.stages != pf.stages())
      throw InputError("--stages " + std::to_string(o_.stages) + " disagrees with " + o_.plan + " (" +
                       std::to_string(pf.stages()) + " stages)");
  } else {
    pf.cuts = evenCuts(model->size(), o_.stages);
  }
  plan_workers_ = pf.workers;
  if (!plan_workers_.empty()) {
    // The plan names the worker slots it runs on; the other workers started
    // are released at the first generation.
    for (int slot : plan_workers_)
      if (slot >= o_.workers)
        throw InputError(o_.plan + ": key 'workers': slot " + std::to_string(slot) + " but only " +
                         std::to_string(o_.workers) + " workers (--workers)");
    target_ = static_cast<int>(plan_workers_.size());
  }
  const std::vector<size_t>& cuts = pf.cuts;
  const int P = pf.stages();
  if (!o_.schedule.empty() && pf.schedule && *pf.schedule != parseScheduleKind(o_.schedule))
    throw InputError("--schedule " + o_.schedule + " disagrees with " + o_.plan + " (schedule " +
                     toString(*pf.schedule) + ")");
  const ScheduleKind kind = !o_.schedule.empty() ? parseScheduleKind(o_.schedule)
                                                 : pf.schedule.value_or(ScheduleKind::k1F1B);
  const bool recompute = o_.recompute || pf.recompute.value_or(false);
  if (pf.replicas && target_ != P * *pf.replicas)
    throw InputError(o_.plan + ": key 'replicas': the plan runs " + std::to_string(*pf.replicas) + " replicas of " +
                     std::to_string(P) + " stages (" + std::to_string(P * *pf.replicas) + " workers), not --workers " +
                     std::to_string(target_));
  if (P < 2) {  // one stage: plain data parallelism, perhaps with the plan's VN shares
    dp_shares_ = pf.vn_shares;
    if (res_) checkDeviceMemory(cuts, {kind, 1, 1, false}, names);
    return;
  }
  if (target_ % P != 0)
    throw InputError("--workers " + std::to_string(target_) + " is not a multiple of the " +
                     std::to_string(P) + " pipeline stages (data-parallel width = workers / stages)");
  const int D = target_ / P;
  if (job_.virtual_nodes < D)
    throw InputError("batch.virtual_nodes = " + std::to_string(job_.virtual_nodes) + " cannot feed " +
                     std::to_string(D) + " pipeline replicas (each needs at least one VN)");
  const std::vector<VnRange> ranges = pf.vn_shares.empty() ? evenRanges(job_.virtual_nodes, D) : rangesOf(pf.vn_shares);
  int64_t M = 0;  // the largest replica share
  for (const VnRange& r : ranges) {
    M = std::max(M, r.size());
    ScheduleOptions so{kind, P, r.size(), recompute};
    validateSchedule(makeSchedule(so), so);
  }
  std::printf("morph: pipeline of %d stages x %d replicas, schedule %s%s, cut: %s\n", P, D,
              toString(kind).c_str(), recompute ? " with recomputation" : "", describeCuts(names, cuts).c_str());
  if (o_.memory_cap_mib > 0) {
    DataPair data = loadDatasets(job_.data, job_.seed);
    const int64_t cap = static_cast<int64_t>(o_.memory_cap_mib * 1048576.0);
    auto mem = estimateStageMemory(job_, cuts, {kind, P, M, recompute}, *data.train);
    for (int k = 0; k < P; ++k) {
      const StageMemory& m = mem[static_cast<size_t>(k)];
      auto mib = [](int64_t b) { return std::to_string((b + 524288) / 1048576); };
      if (!o_.quiet)
        std::printf("morph: stage %d needs about %s MiB (process %s, largest other layer while building %s; "
                    "training %s: parameters %s, optimiser %s, gradients %s, checkpoint snapshot %s, "
                    "activations %s = %lld VNs x %s)\n",
                    k, mib(m.total()).c_str(), mib(m.runtime_bytes).c_str(), mib(m.init_bytes).c_str(),
                    mib(m.training()).c_str(),
                    mib(m.model_bytes).c_str(), mib(m.optimizer_bytes).c_str(),
                    mib(m.accumulator_bytes + m.grad_bytes).c_str(), mib(m.snapshot_bytes).c_str(),
                    mib(m.activation_bytes).c_str(),
                    static_cast<long long>(m.live_vns),
                    mib(recompute && k + 1 < P ? m.vn_input_bytes : m.vn_activation_bytes).c_str());
      if (m.total() > cap)
        throw InputError("--memory-cap " + std::to_string(static_cast<int64_t>(o_.memory_cap_mib)) +
                         " MiB: pipeline stage " + std::to_string(k) + " (" +
                         describeCuts(names, {cuts[k], cuts[k + 1]}) + ") needs about " + mib(m.total()) +
                         " MiB, of which activations " + mib(m.activation_bytes) + " MiB (" +
                         std::to_string(m.live_vns) + " VNs stashed by " + toString(kind) +
                         "); use more stages, --recompute, 1f1b, or more VNs per batch");
    }
  }
  if (res_) checkDeviceMemory(cuts, {kind, P, M, recompute}, names);
  pipeline_ = PipelineLayout{P, D, cuts, toString(kind), recompute, !o_.trace.empty(), ranges};
  // Morphs re-plan with the profile --plan auto chose by; devices of a
  // resources file use the rule (its slots change meaning as workers go).
  if (!o_.profile.empty() && !res_) profile_ = readProfile(o_.profile);
}

// Morph's own accounting of each device's memory (resources file): the
// stage estimate of --memory-cap against the cap of the device each world
// rank runs on. Exit 2 naming the device, the stage and both sizes.
void Manager::checkDeviceMemory(const std::vector<size_t>& cuts, const ScheduleOptions& so,
                                const std::vector<std::string>& names) {
  DataPair data = loadDatasets(job_.data, job_.seed);
  const auto mem = estimateStageMemory(job_, cuts, so, *data.train);
  const int P = so.stages;
  for (int r = 0; r < target_; ++r) {
    const size_t slot = plan_workers_.empty() ? static_cast<size_t>(r) : static_cast<size_t>(plan_workers_[static_cast<size_t>(r)]);
    const DeviceType& t = res_->typeOf(slot);
    const int64_t need = mem[static_cast<size_t>(r % P)].total();
    if (need > t.memory_bytes)
      throw InputError(res_->file + ": worker slot " + std::to_string(slot) + " (type " + t.name + ", " +
                       std::to_string(t.memory_bytes >> 20) + " MiB) cannot hold " +
                       (P > 1 ? "stage " + std::to_string(r % P) + " (" +
                                    describeCuts(names, {cuts[static_cast<size_t>(r % P)], cuts[static_cast<size_t>(r % P) + 1]}) + ")"
                              : std::string("the model")) +
                       ": it needs about " + std::to_string((need + 524288) >> 20) + " MiB, " +
                       std::to_string((need - t.memory_bytes + 524288) >> 20) + " MiB more");
  }
}

// Chrome trace-event JSON (Perfetto, chrome://tracing): one process per
// replica, one thread per stage, one complete event per action.
void Manager::writeTrace() {
  const int P = pipeline_->stages;
  json events = json::array();
  std::vector<std::pair<int, json>> ranks;
  double t0 = INFINITY;
  for (size_t r = 0; r < members_.size(); ++r) {
    const std::string k = keys::trace(members_[r]);
    if (!store_->check({k})) continue;
    json ev = json::parse(getString(*store_, k));
    for (const auto& e : ev) t0 = std::min(t0, e.at(2).get<double>());
    ranks.emplace_back(static_cast<int>(r), std::move(ev));
  }
  for (auto& [r, ev] : ranks) {
    const int stage = r % P, replica = r / P;
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", replica}, {"tid", stage},
                      {"args", {{"name", "replica " + std::to_string(replica)}}}});
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", replica}, {"tid", stage},
                      {"args", {{"name", "stage " + std::to_string(stage) + " (rank " + std::to_string(r) + ")"}}}});
    for (const auto& e : ev) {
      const std::string name = e.at(0).get<std::string>();
      const double a = e.at(2).get<double>(), b = e.at(3).get<double>();
      events.push_back({{"name", name},
                        {"cat", name.substr(0, name.find(" vn"))},
                        {"ph", "X"},
                        {"pid", replica},
                        {"tid", stage},
                        {"ts", (a - t0) * 1e6},
                        {"dur", (b - a) * 1e6},
                        {"args", {{"step", e.at(1)}}}});
    }
  }
  std::ofstream out(o_.trace, std::ios::trunc);
  out << json({{"traceEvents", events}, {"displayTimeUnit", "ms"}}).dump() << '\n';
  if (!out) throw JobError(o_.trace + ": cannot write the trace");
  if (!o_.quiet) std::printf("morph: trace of %zu actions in %s\n", events.size(), o_.trace.c_str());
}

// The pipeline's figures for summary.json (and the Chrome trace): the
// measured bubble fraction over the steady steps, the formula's, the mean
// step time and each stage's peak memory.
json Manager::pipelineResults(const std::vector<json>& results) {
  const int P = pipeline_->stages;
  json out = planSummary();
  out["bubble_formula"] = bubbleFraction(P, pipeline_->replica_ranges.at(0).size());
  std::map<int64_t, std::vector<std::array<double, 3>>> per_step;  // step -> (start, end, busy) per rank
  std::vector<int64_t> stage_peak(static_cast<size_t>(P), 0), stage_params(static_cast<size_t>(P), 0),
      stage_peak_params(static_cast<size_t>(P), 0);
  for (const json& r : results) {
    const int s = r.at("stage").get<int>();
    stage_peak[static_cast<size_t>(s)] = std::max(stage_peak[static_cast<size_t>(s)], r.at("peak_rss_bytes").get<int64_t>());
    stage_params[static_cast<size_t>(s)] = std::max(stage_params[static_cast<size_t>(s)], r.at("param_bytes").get<int64_t>());
    stage_peak_params[static_cast<size_t>(s)] =
        std::max(stage_peak_params[static_cast<size_t>(s)], r.at("peak_param_bytes").get<int64_t>());
    for (const auto& t : r.at("timings"))
      per_step[t.at(0).get<int64_t>()].push_back({t.at(1).get<double>(), t.at(2).get<double>(), t.at(3).get<double>()});
  }
  out["stage_peak_rss_bytes"] = stage_peak;
  out["stage_param_bytes"] = stage_params;  // parameters held at the end (the trainer's accounting)
  out["stage_peak_param_bytes"] = stage_peak_params;  // the most any worker of the stage ever held
  double bubble = 0, span_sum = 0;
  int64_t n = 0;
  const int64_t skip = first_step_ + warmupSteps(steps_ - first_step_);
  for (auto& [step, ranks] : per_step) {
    if (step < skip || ranks.size() != results.size()) continue;
    double start = ranks[0][0], end = ranks[0][1];
    for (auto& r : ranks) start = std::min(start, r[0]), end = std::max(end, r[1]);
    const double span = end - start;
    if (span <= 0) continue;
    double b = 0;
    for (auto& r : ranks) b += 1.0 - r[2] / span;
    bubble += b / static_cast<double>(ranks.size());
    span_sum += span;
    ++n;
  }
  out["bubble_fraction"] = n ? bubble / static_cast<double>(n) : NAN;
  out["schedule_seconds"] = n ? span_sum / static_cast<double>(n) : NAN;
  return out;
}

// The job's store: a fresh token in OUT/token (mode 0600) for workers and
// clients, a key only this process knows for its own connection, and a
// socket on --host only (loopback by default).
void Manager::hostStore() {
  token_file_ = std::filesystem::absolute(std::filesystem::path(dir_) / "token").string();
  store::ServerOptions so;
  so.token = createTokenFile(token_file_);
  so.manager_key = store::randomToken();
  so.port = o_.port;
  so.bind_addr = o_.host;
  so.policy = std::make_shared<JobKeyPolicy>();
  in_addr probe{};
  if (inet_pton(AF_INET, o_.host.c_str(), &probe) != 1) {  // a host name: the address it resolves to here
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_INET;
    if (getaddrinfo(o_.host.c_str(), nullptr, &hints, &res) != 0 || !res)
      throw InputError("--host " + o_.host + ": cannot resolve it to an IPv4 address of this machine");
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, buf, sizeof buf);
    so.bind_addr = buf;
    freeaddrinfo(res);
  }
  if (so.bind_addr == "0.0.0.0")
    std::fprintf(stderr, "morph: warning: --host 0.0.0.0: the job's store listens on every interface; only the "
                         "token keeps others out, and Gloo's data connections are not authenticated at all "
                         "(docs/distributed.md, \"Security\")\n");
  join_host_ = so.bind_addr == "0.0.0.0" ? "127.0.0.1" : so.bind_addr;
  try {
    server_ = std::make_unique<store::StoreServer>(so);
  } catch (const std::exception& e) {
    throw InputError("--host " + o_.host + " --port " + std::to_string(o_.port) + ": cannot host the job's store: " +
                     e.what());
  }
  port_ = server_->port();
  store_ = c10::make_intrusive<store::LocalStore>(server_->table(), kManagerStoreTimeout);
}

void Manager::spawn(int count) {
  const std::string join = join_host_ + ":" + std::to_string(port_);
  for (int i = 0; i < count; ++i) {
    pid_t pid = fork();
    if (pid < 0) throw JobError("cannot start a worker process");
    if (pid == 0) {
      // No orphans if the manager dies: the worker names the newest good
      // checkpoint and the resume command, and exits (worker.cpp).
      prctl(PR_SET_PDEATHSIG, kManagerDeathSignal);
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      execl(o_.self_exe.c_str(), o_.self_exe.c_str(), "worker", "--join", join.c_str(), "--token-file",
            token_file_.c_str(), static_cast<char*>(nullptr));
      std::perror("morph: exec worker");
      _exit(3);
    }
    unregistered_pids_.insert(pid);
  }
}

void Manager::pollRegistrations() {
  const int64_t n = store_->add(keys::kNextWorkerId, 0);
  const double now = nowSeconds();
  for (int64_t id = 0; id < n; ++id) {
    if (workers_.count(id)) continue;
    const std::string k = keys::workerPid(id);
    if (!store_->check({k})) {
      // Took an id but has not announced itself yet; one that died in
      // between is skipped after a deadline (later ids are not held up).
      auto it = unannounced_.emplace(id, now).first;
      if (now - it->second > kAnnounceDeadlineS) {
        WorkerInfo w;
        w.announced = false;
        w.alive = false;
        workers_[id] = w;
        unannounced_.erase(id);
        if (unmatched_deaths_ > 0) {
          --unmatched_deaths_;  // the local worker that died before registering: counted then
        } else {
          startFailed(id, "took an id but did not announce itself within " +
                              std::to_string(static_cast<int>(kAnnounceDeadlineS)) + " s (it died while registering?)",
                      false);
        }
      }
      continue;
    }
    unannounced_.erase(id);
    WorkerInfo w;
    const std::string pid_text = getString(*store_, k);
    pid_t pid = static_cast<pid_t>(parseStoreInt(k, pid_text));
    if (unregistered_pids_.erase(pid)) w.pid = pid;
    w.hb_time = now;  // watched by heartbeat from now on
    workers_[id] = w;
  }
  bool local_alive = !unregistered_pids_.empty();
  for (auto& [id, w] : workers_) local_alive = local_alive || (w.alive && w.pid > 0);
  for (auto& [id, w] : workers_) {
    if (!w.alive || w.placeable) continue;
    if (store_->check({keys::workerStartError(id)})) {
      // It could not start (bad data, resume folder, checkpoint folder...)
      // and said why before exiting.
      const json e = json::parse(getString(*store_, keys::workerStartError(id)), nullptr, false);
      const std::string why = e.is_object() ? e.value("why", std::string("?")) : std::string("?");
      w.alive = false;
      if (w.pid > 0) kill(w.pid, SIGKILL);
      startFailed(id, why, e.is_object() && e.value("input", false));
      continue;
    }
    if (!store_->check({keys::workerReady(id)})) continue;
    // The data every worker must match is a local worker's (it reads this
    // host's files) when there are any: a remote worker waits for it.
    if (!fingerprint_.contains("data") && spawned_ > 0 && local_alive && w.pid <= 0) continue;
    w.placeable = true;
    admit(id, w);
  }
}

void Manager::startFailed(int64_t id, const std::string& why, bool input) {
  const std::string who = id >= 0 ? "worker " + std::to_string(id) : std::string("a local worker");
  std::fprintf(stderr, "morph: %s could not start: %s\n", who.c_str(), why.c_str());
  std::fflush(stderr);
  if (gen_ >= 0) return;  // a joiner: the job goes on as it is
  start_failures_.push_back(who + ": " + why);
  start_failures_input_ = start_failures_input_ && input;
}

// Generation 0 waits for target_ workers, less those that could not start:
// a job whose other workers can start goes on without the failed ones (a
// replacement may join later, as any joiner does); a job none of whose
// workers can start stops (exit 2 when each failed on bad input, else 3).
void Manager::maybeStart(double since) {
  int placeable = 0, pending = static_cast<int>(unregistered_pids_.size() + unannounced_.size());
  if (plan_workers_.empty()) {
    for (auto& [id, w] : workers_) {
      placeable += w.alive && w.placeable;
      pending += w.alive && !w.placeable;
    }
  } else {  // the plan's own slots
    for (int slot : plan_workers_) {
      auto it = workers_.find(slot);
      placeable += it != workers_.end() && it->second.alive && it->second.placeable;
    }
  }
  const int failed = static_cast<int>(start_failures_.size());
  // A plan file's slots and a pipeline's shape need exactly their workers.
  const bool exact = !plan_workers_.empty() || pipelined();
  const int want = exact ? target_ : std::max(1, target_ - failed);
  if (placeable >= want) {
    if (placeable < target_)
      std::printf("morph: starting with %d of %d workers (%d could not start; others may join later)\n", placeable,
                  target_, failed);
    publish();
    return;
  }
  const std::string why = start_failures_.empty() ? std::string() : " (" + [&] {
    std::string t;
    for (const auto& f : start_failures_) t += (t.empty() ? "" : "; ") + f;
    return t;
  }() + ")";
  if (placeable == 0 && pending == 0 && failed > 0 && failed >= target_) {
    killChildren();
    if (start_failures_input_) throw InputError("no worker could start" + why);
    throw JobError("no worker could start" + why);
  }
  if (failed > 0 && exact && pending == 0 && o_.spawn == o_.workers) {
    killChildren();
    const std::string msg = "the plan needs " + std::to_string(target_) + " workers and only " +
                            std::to_string(placeable) + " could start" + why;
    if (start_failures_input_) throw InputError(msg);
    throw JobError(msg);
  }
  if (nowSeconds() - since > kStartDeadlineS) {
    if (placeable > 0 && !exact) {
      std::printf("morph: starting with %d of %d workers: the others were not ready within %d s\n", placeable,
                  target_, static_cast<int>(kStartDeadlineS));
      publish();
      return;
    }
    killChildren();
    throw JobError("workers did not start within " + std::to_string(static_cast<int>(kStartDeadlineS)) + " s" + why);
  }
}

// A worker that loaded its data posts its fingerprint: in an exact job it
// must match this build, these settings and the first worker's data, or it
// is refused (it exits 2 with the reason); the job goes on without it.
void Manager::admit(int64_t id, WorkerInfo& w) {
  const json got = store_->check({keys::workerFingerprint(id)})
                       ? json::parse(getString(*store_, keys::workerFingerprint(id)), nullptr, false)
                                                        : json();
  if (!fingerprint_.contains("data") && got.is_object() && got.contains("data")) fingerprint_["data"] = got.at("data");
  const std::vector<std::string> diff = fingerprintDifferences(fingerprint_, got.is_object() ? got : json::object());
  if (diff.empty()) return;
  std::string why;
  for (const auto& d : diff) why += (why.empty() ? "" : "; ") + d;
  if (job_.reduce_mode != ReduceMode::kExact) {
    std::fprintf(stderr, "morph: warning: worker %lld differs from this job's (float mode, admitted): %s\n",
                 static_cast<long long>(id), why.c_str());
    return;
  }
  std::fprintf(stderr, "morph: refusing worker %lld: it differs from this job's: %s\n", static_cast<long long>(id),
               why.c_str());
  setString(*store_, keys::workerRefused(id), "this worker differs from the job's (exact mode needs the same on every worker): " + why);
  // Unlike a worker that cannot start, a refused one leaves its slot open:
  // generation 0 waits for a matching worker (kStartDeadlineS).
  w.placeable = false;
  w.alive = false;
}

void Manager::markDead(int64_t id, const std::string& why) {
  WorkerInfo& w = workers_[id];
  if (!w.alive) return;
  w.alive = false;
  if (w.pid > 0) kill(w.pid, SIGKILL);
  const bool member = std::find(members_.begin(), members_.end(), id) != members_.end();
  // Nothing left to recompute: the last step is committed (perhaps not yet
  // read by pollMetrics), and the members are past their training loop.
  const bool all_steps_done =
      log_ && (next_ >= steps_ || store_->check({keys::metrics(steps_ - 1)}));
  // A worker that found the job cannot go on said why before it exited.
  const std::string fatal = keys::workerFatal(id);
  if (store_->check({fatal})) noWorkerLeft("worker " + std::to_string(id) + ": " + getString(*store_, fatal));
  if (!w.placeable) {
    // Never ready: a start-up failure (its own reason, if it posted one).
    const std::string se = keys::workerStartError(id);
    const json e = store_->check({se}) ? json::parse(getString(*store_, se), nullptr, false) : json();
    startFailed(id, e.is_object() ? e.value("why", why) : why, e.is_object() && e.value("input", false));
    return;
  }
  if (member && !all_steps_done) {
    std::fprintf(stderr, "morph: worker %lld %s\n", static_cast<long long>(id), why.c_str());
    // Survivors blocked on the dead peer bail out of their collectives.
    setString(*store_, keys::genAbort(gen_), "1");
    if (!in_transition_) startTransition("failure");
  }
}

void Manager::pollChildren() {
  int status = 0;
  pid_t pid;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
    const bool bad_input = WIFEXITED(status) && WEXITSTATUS(status) == 2;
    int64_t id = -1;
    for (auto& [wid, w] : workers_)
      if (w.pid == pid) id = wid;
    const bool unregistered = unregistered_pids_.erase(pid) > 0;
    if (bad_input) {
      killChildren();
      while (waitpid(-1, nullptr, 0) > 0) {
      }
      throw InputError("a worker rejected the job's input (its message is above)");
    }
    if (id < 0) {
      if (unregistered) ++unmatched_deaths_;
      if (unregistered)
        startFailed(-1, "pid " + std::to_string(pid) + " ended before it registered (" +
                            (WIFEXITED(status) ? "exit code " + std::to_string(WEXITSTATUS(status))
                                               : "signal " + std::to_string(WTERMSIG(status))) + ")",
                    false);
      continue;
    }
    const std::string k = key(gen_, "left", id);
    if (gen_ >= 0 && store_->check({k})) {
      workers_[id].alive = false;  // left gracefully; the transition handles it
    } else {
      markDead(id, WIFEXITED(status) ? "exited with code " + std::to_string(WEXITSTATUS(status))
                                     : "was killed by signal " + std::to_string(WTERMSIG(status)));
    }
  }
}

void Manager::pollHeartbeats() {
  const double now = nowSeconds();
  if (now - last_hb_poll_ < hb_interval_) return;
  last_hb_poll_ = now;
  for (auto& [id, w] : workers_) {
    if (!w.alive) continue;
    const std::string k = keys::workerHeartbeat(id);
    if (store_->check({k})) {
      std::string v = getString(*store_, k);
      if (v != w.hb) {
        w.hb = v;
        w.hb_time = now;
        continue;
      }
    }
    if (now - w.hb_time > hb_timeout_) {
      // A worker that left gracefully stops its heartbeat too.
      if (gen_ >= 0 && store_->check({key(gen_, "left", id)})) {
        w.alive = false;
      } else {
        markDead(id, "missed its heartbeats for " + std::to_string(now - w.hb_time) + " s");
      }
    }
  }
}

void Manager::pollResizeRequests() {
  const int64_t seq = store_->add(keys::kResizeSeq, 0);
  if (seq == resize_seq_) return;
  resize_seq_ = seq;
  const std::string asked = getString(*store_, keys::kResizeTarget);
  const bool number = !asked.empty() && asked.size() <= 6 &&
                      std::all_of(asked.begin(), asked.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!number) {
    std::fprintf(stderr, "morph: ignoring resize to '%s' workers: not a number\n", asked.c_str());
    return;
  }
  const int want = std::stoi(asked);
  if (want < 1 || want > job_.virtual_nodes) {
    std::fprintf(stderr, "morph: ignoring resize to %d workers (1..%lld)\n", want,
                 static_cast<long long>(job_.virtual_nodes));
    return;
  }
  std::printf("morph: resize requested: %d -> %d workers\n", target_, want);
  std::fflush(stdout);
  int alive = 0;
  for (auto& [id, w] : workers_) alive += w.alive;
  alive += static_cast<int>(unregistered_pids_.size());
  target_ = want;
  if (want > alive) spawn(want - alive);
}

void Manager::pollSlowRequests() {
  std::map<int64_t, double> slow;
  for (auto& [id, w] : workers_) {
    if (!w.alive) continue;
    const std::string k = keys::slow(id);
    if (!store_->check({k})) continue;
    const std::string v = getString(*store_, k);
    std::string& seen = slow_seen_[id];
    char* end = nullptr;
    const double f = std::strtod(v.c_str(), &end);
    const bool ok = end != v.c_str() && *end == '\0' && std::isfinite(f) && f >= 1.0 && f <= 1000.0;
    if (!ok && v != seen)
      std::fprintf(stderr, "morph: ignoring slowdown factor '%s' in %s (expected 1 to 1000)\n", v.c_str(), k.c_str());
    seen = v;
    if (ok && f != 1.0) slow[id] = f;
    else if (!ok && want_.slowdown.count(id)) slow[id] = want_.slowdown.at(id);  // the last good one stays
  }
  if (slow == want_.slowdown) return;
  want_.slowdown = std::move(slow);
  writeWant(want_.generation);
}

void Manager::writeWant(int64_t g) {
  want_.generation = g;
  setString(*store_, keys::kGenWant, want_.encode());
}

void Manager::pollMetrics() {
  if (!log_ && store_->check({keys::kJobSteps})) {
    steps_ = getInt(*store_, keys::kJobSteps);
    next_ = first_step_ = getInt(*store_, keys::kJobStartStep);
    log_ = std::make_unique<RunLog>(dir_, job_, steps_, o_.quiet, !o_.resume.empty());
    if (status_page_) {
      status_page_->setSteps(steps_);
      log_->setObserver([s = status_page_.get()](const json& l) { s->record(l); });
    }
  }
  while (log_ && next_ < steps_ && store_->check({keys::metrics(next_)})) {
    json line = json::parse(getString(*store_, keys::metrics(next_)));
    log_->record(line);
    if (line.contains("unix_time")) {
      // Everything between two commits: steps, evaluations, snapshots.
      const double t = line.at("unix_time").get<double>();
      if (last_commit_unix_ > 0) longest_gap_ = std::max(longest_gap_, t - last_commit_unix_);
      last_commit_unix_ = t;
    }
    watchStragglers(line);
    last_sps_ = line.at("samples_per_second").get<double>();
    server_->table().erase(keys::metrics(next_));  // read once: the store stays bounded
    committed_ = next_++;
    if (pending_gen_ >= 0 && line.at("generation").get<int64_t>() >= pending_gen_) {
      pending_resize_["seconds"] = nowSeconds() - pending_since_;
      if (pending_resize_.contains("to_shape")) {
        // What the members measured entering the generation: the slowest
        // member's rendezvous, state movement and checkpoint load, and every
        // byte received.
        double rdv = 0, move = 0, load = 0;
        int64_t bytes = 0;
        for (int64_t id : members_) {
          const std::string k = key(pending_gen_, "morph", id);
          if (!store_->check({k})) continue;
          const json m = json::parse(getString(*store_, k), nullptr, false);
          if (!m.is_object()) continue;
          rdv = std::max(rdv, m.value("rendezvous_seconds", 0.0));
          move = std::max(move, m.value("move_seconds", 0.0));
          load = std::max(load, m.value("load_seconds", 0.0));
          bytes += m.value("bytes_in", int64_t{0});
        }
        pending_resize_["rendezvous_seconds"] = rdv;
        pending_resize_["move_seconds"] = move;
        pending_resize_["load_seconds"] = load;
        pending_resize_["bytes_moved"] = bytes;
      }
      resizes_.push_back(pending_resize_);
      std::printf("morph: generation %lld: %s, %d -> %d workers, first step committed after %.3f s\n",
                    static_cast<long long>(pending_gen_), pending_resize_["cause"].get<std::string>().c_str(),
                    pending_resize_["from"].get<int>(), pending_resize_["to"].get<int>(),
                    pending_resize_["seconds"].get<double>());
      pending_gen_ = -1;
    }
    std::fflush(stdout);
  }
}

// Stragglers (straggler.h): rank 0's line carries every member's seconds
// per VN; a worker off its expected speed by elastic.straggler_factor for
// elastic.straggler_steps steps (net) is re-planned around at the next
// step boundary: VN shares by measured speed, or released when the step is
// predicted faster without it. Data-parallel jobs only.
void Manager::watchStragglers(const json& line) {
  if (in_transition_ || gen_ < 0 || !line.contains("vn_seconds") || line.at("generation").get<int64_t>() != gen_)
    return;
  const auto vs = line.at("vn_seconds").get<std::vector<double>>();
  const auto e = pipelined() ? pstraggler_.observe(vs) : straggler_.observe(vs);
  if (!e) return;
  if (pipelined()) pstraggler_.accept(*e);
  else straggler_.accept(*e);
  const bool act = job_.straggler_replan && e->changes;
  std::printf("morph: straggler at step %lld: %s%s\n", static_cast<long long>(line.at("step").get<int64_t>()),
              e->describe().c_str(),
              !job_.straggler_replan ? " (not re-planning: elastic.straggler_replan = false)"
                                     : (e->changes ? "" : " (the plan stays)"));
  std::fflush(stdout);
  if (!act) return;
  if (pipelined()) pstraggler_.engage();
  else straggler_.engage();
  if (e->drop) {
    straggler_.drop(e->worker);
    target_ = static_cast<int>(members_.size()) - 1;
  }
  straggler_note_ = {{"worker", e->worker}, {"ratio", e->ratio}, {"dropped", e->drop}, {"detected_step", line.at("step")}};
  writeWant(gen_ + 1);
  startTransition("straggler");
}

void Manager::updateStatus() {
  const double now = nowSeconds();
  if (now - last_status_ < kStatusIntervalS) return;
  last_status_ = now;
  int alive = 0;
  for (auto& [id, w] : workers_) alive += w.alive;
  json s = {{"generation", gen_},     {"members", members_},          {"workers", members_.size()},
            {"alive", alive},         {"target_workers", target_},    {"next_step", next_},
            {"steps", steps_},        {"samples_per_second", last_sps_}, {"in_transition", in_transition_},
            {"resizes", resizes_},    {"vn_shares", vn_shares_}, {"store_keys", store_->getNumKeys()}};
  setString(*store_, keys::kStatus, s.dump());
  if (status_page_) status_page_->setStatus(s);
}

void Manager::startTransition(const std::string& cause) {
  in_transition_ = true;
  transition_cause_ = cause;
  transition_start_ = nowSeconds();
  transition_unix_ = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Every member of the current generation has died, left, or reported its
// committed step (ready).
bool Manager::transitionComplete() {
  for (int64_t id : members_) {
    if (!workers_[id].alive) continue;
    if (store_->check({key(gen_, "ready", id)}) || store_->check({key(gen_, "left", id)})) continue;
    // Its heartbeats are watched (pollHeartbeats declares it dead once they
    // stop); one still heart-beating is busy (a long evaluation, step or
    // checkpoint snapshot), so it is waited for and reported, never killed.
    const double now = nowSeconds();
    const double deadline = regroupDeadline();
    if (now - transition_start_ > kStuckFactor * deadline) {
      char why[160];
      std::snprintf(why, sizeof why, "has not answered the generation change for %.0f s (%.0f x the deadline); "
                    "declared dead although it heart-beats", now - transition_start_, kStuckFactor);
      markDead(id, why);
      continue;
    }
    if (now - transition_start_ > deadline && now - workers_[id].warned > deadline) {
      workers_[id].warned = now;
      std::fprintf(stderr,
                   "morph: worker %lld has not answered the generation change for %.0f s but still heart-beats: "
                   "waiting for it (deadline %.0f s = max(%.0f, %.0f x the longest %.1f s between two steps))\n",
                   static_cast<long long>(id), now - transition_start_, deadline, kRegroupFloorS, kDeadlineFactor,
                   longest_gap_);
    }
    return false;
  }
  return true;
}

void Manager::noWorkerLeft(const std::string& why) {
  const std::string cdir = checkpointDir(o_, job_);
  const int64_t ck = newestGoodCheckpoint(cdir);
  std::string ckmsg = ck >= 0 ? cdir + "/" + checkpointDirName(ck) + " (resume with --resume " + cdir + ")" : "none";
  killChildren();
  throw JobError(why + "; the last committed step is " + std::to_string(committed_) +
                 ", the newest good checkpoint " + ckmsg);
}

// A member's report leaving generation `g` (ready or left): JobError
// naming the key when it is not one (control/protocol/member_report.h).
MemberReport readReport(c10d::Store& store, const std::string& key) {
  const json j = json::parse(getString(store, key), nullptr, false);
  try {
    return MemberReport::fromJson(j);
  } catch (const MessageError& e) {
    throw JobError("the job's store holds a malformed report under " + key + " (" + e.what() +
                   "): a worker wrote a bad value (docs/distributed.md, store keys)");
  }
}

void Manager::publish() {
  const int64_t g = gen_ + 1;
  std::vector<int64_t> survivors;
  int64_t best = -1;
  std::map<int64_t, MemberReport> reports;
  bool someone_left = false;
  for (int64_t id : members_) {
    if (store_->check({key(gen_, "left", id)})) {
      someone_left = true;
      workers_[id].alive = false;  // it exits on its own
    }
    if (!workers_[id].alive || !store_->check({key(gen_, "ready", id)})) continue;
    const MemberReport& r = reports[id] = readReport(*store_, key(gen_, "ready", id));
    survivors.push_back(id);
    best = std::max(best, r.committed);
  }
  if (gen_ >= 0 && survivors.empty()) noWorkerLeft("no worker is left");
  // Rank 0 may have lagged one step behind the others (its reduction of
  // that step failed, theirs completed): take that step's line from a
  // member that committed it.
  for (int64_t id : survivors) {
    const json& line = reports.at(id).line;
    if (line.is_null()) continue;
    const int64_t step = line.at("step").get<int64_t>();
    const std::string mk = keys::metrics(step);
    if (step >= next_ && !store_->check({mk})) setString(*store_, mk, line.dump());  // (older ones were read)
  }
  std::vector<int64_t> candidates = survivors;
  for (auto& [id, w] : workers_)
    if (w.alive && w.placeable && std::find(members_.begin(), members_.end(), id) == members_.end())
      candidates.push_back(id);
  straggler_.orderForDrop(candidates);  // a straggler being dropped is released
  // The first generation of a pipeline runs exactly its plan's workers;
  // later ones are placed by publishMorph().
  const size_t size = pipelined() && gen_ < 0
                          ? static_cast<size_t>(target_)
                          : std::min<size_t>({candidates.size(), static_cast<size_t>(target_),
                                              static_cast<size_t>(job_.virtual_nodes)});
  if (gen_ < 0 && !plan_workers_.empty()) {
    // The first generation runs the plan's devices: world rank r on worker
    // slot plan_workers_[r]; the others are released.
    std::vector<int64_t> ordered;
    for (int slot : plan_workers_) ordered.push_back(slot);
    for (int64_t id : candidates)
      if (std::find(ordered.begin(), ordered.end(), id) == ordered.end()) ordered.push_back(id);
    candidates = ordered;
  }
  GenerationPlan plan;
  plan.generation = g;
  plan.members.assign(candidates.begin(), candidates.begin() + static_cast<std::ptrdiff_t>(size));
  plan.released.assign(candidates.begin() + static_cast<std::ptrdiff_t>(size), candidates.end());
  if (pipelined() && gen_ >= 0) plan.morph = publishMorph(plan.members, survivors, reports, plan.released);
  const std::vector<int64_t>& next = plan.members;
  for (size_t r = 0; r < next.size(); ++r)
    if (reports.count(next[r]) && reports.at(next[r]).committed == best) {
      plan.source = static_cast<int>(r);
      break;
    }
  if (pipelined()) {
    plan.pipeline = pipeline_;
    for (size_t r = 0; r < next.size(); ++r)
      plan.vn_ranges.push_back(pipeline_->replica_ranges.at(r / static_cast<size_t>(pipeline_->stages)));
  } else if (auto measured = straggler_.shares(next, job_.virtual_nodes)) {
    plan.vn_ranges = rangesOf(*measured);  // shares by measured speed, once a straggler was re-planned around
  } else if (dp_shares_.size() == next.size()) {
    plan.vn_ranges = rangesOf(dp_shares_);
  } else {
    plan.vn_ranges = evenRanges(job_.virtual_nodes, static_cast<int>(next.size()));
  }
  vn_shares_ = plan.shares();
  if (res_) {
    // Emulated devices: each member idles per its device's slowdown.
    for (int64_t id : next)
      plan.slowdown.push_back(static_cast<size_t>(id) < res_->devices.size() ? res_->typeOf(static_cast<size_t>(id)).slowdown
                                                                              : 1.0);
  }
  if (pipelined()) {
    pstraggler_.newGeneration(next, pipeline_->stages, pipeline_->cuts, pipeline_->replicaShares());
  } else {
    straggler_.newGeneration(next, vn_shares_, plan.slowdown);
  }
  setString(*store_, keys::genPlan(g), plan.toJson().dump());
  setString(*store_, keys::kGenCurrent, std::to_string(g));
  if (!o_.quiet || gen_ < 0) {
    std::string text;
    for (size_t r = 0; r < next.size(); ++r)
      text += " w" + std::to_string(next[r]) + "=[" + std::to_string(plan.vn_ranges[r].begin) + "," +
              std::to_string(plan.vn_ranges[r].end) + ")";
    std::printf("morph: generation %lld, %zu workers, VN plan:%s\n", static_cast<long long>(g), next.size(),
                text.c_str());
  }
  if (gen_ >= 0) {
    std::string cause = transition_cause_;
    if (cause.empty()) cause = someone_left ? "leave" : "failure";
    pending_resize_ = {{"step", best},
                       {"from", static_cast<int>(members_.size())},
                       {"to", static_cast<int>(next.size())},
                       {"cause", cause},
                       {"detected_unix_time", transition_unix_}};
    if (plan.morph) {
      const PipelineMorph& m = *plan.morph;
      const json mj = m.toJson();
      pending_resize_["from_shape"] = mj.at("from_shape");
      pending_resize_["to_shape"] = mj.at("to_shape");
      pending_resize_["live"] = m.live;
      pending_resize_["steps_redone"] = m.live ? 0 : m.steps_redone;
      pending_resize_["planning_seconds"] = m.planning_seconds;
      pending_resize_["chosen_by"] = m.chosen_by;
      pending_resize_["to_cuts"] = m.to_cuts;
    }
    if (cause == "straggler") {
      pending_resize_.update(straggler_note_);
      pending_resize_["vn_shares"] = vn_shares_;
    }
    pending_gen_ = g;
    pending_since_ = transition_start_;
  }
  for (int64_t id : plan.released) workers_[id].alive = false;  // they exit on reading the plan
  std::fflush(stdout);
  members_ = next;
  gen_ = g;
  in_transition_ = false;
  transition_cause_.clear();
  forgetPast();
}

// The store stays bounded however long the job runs and however often it
// regroups (docs/distributed.md, "Store keys"): the keys of generation
// gen_ - 2 (every member left it before gen_ - 1 formed; one generation
// more is kept for a member still on its way out) and of the workers that
// were already gone at the previous generation change (one that exits
// after a leave or release may still write its heartbeat in between).
void Manager::forgetPast() {
  if (gen_ >= 2) server_->table().erasePrefix(keys::genPrefix(gen_ - 2));
  std::set<int64_t> gone;
  for (auto& [id, w] : workers_) {
    if (w.alive || forgotten_.count(id)) continue;
    if (gone_before_.count(id)) {
      server_->table().erasePrefix(keys::workerPrefix(id));
      store_->deleteKey(keys::slow(id));  // `morph slow`'s request for a departed worker
      slow_seen_.erase(id);
      forgotten_.insert(id);
    } else {
      gone.insert(id);
    }
  }
  gone_before_ = std::move(gone);
}

int64_t Manager::morphMemoryCap() const {
  int64_t cap = o_.memory_cap_mib > 0 ? static_cast<int64_t>(o_.memory_cap_mib * 1048576.0) : 0;
  if (res_)
    for (size_t slot = 0; slot < res_->devices.size(); ++slot) {
      const int64_t m = res_->typeOf(slot).memory_bytes;
      if (m > 0) cap = cap > 0 ? std::min(cap, m) : m;
    }
  return cap;
}

Manager::MorphTarget Manager::morphTarget(int workers) {
  workers = std::min(workers, target_);
  const size_t L = layer_names_.size();
  const int P = pipeline_->stages;
  const std::vector<size_t> cur_cuts = pipeline_->cuts;
  const int64_t cap = morphMemoryCap();
  MorphTarget t;
  if (profile_) {
    auto it = planned_.find(workers);
    if (it != planned_.end()) return it->second;
    t.by = "planner";
    if (workers > 0) {
      PlanRequest rq;
      rq.workers = workers;
      rq.virtual_nodes = job_.virtual_nodes;
      rq.memory_cap_bytes = cap;
      rq.top_k = 1;
      rq.sim = simOptionsFor(job_, false);
      try {
        const PlanOutcome out = planJob(*profile_, rq);
        const PlanChoice& best = out.plans.front();
        t.shape = {best.plan.stages, best.plan.replicas};
        t.cuts = best.plan.cuts.empty() ? evenCuts(L, 1) : best.plan.cuts;
        t.schedule = toString(best.plan.schedule);
        t.recompute = best.plan.recompute;
        t.vn_shares = best.plan.vn_shares;
        t.predicted_s = best.sim.step_seconds;
      } catch (const InputError& e) {  // no plan fits the memory cap
        std::printf("morph: the planner finds no plan for %d workers: %s\n", workers, e.what());
      }
    }
    planned_[workers] = t;
    return t;
  }
  // The rule: stages cut evenly unless the depth stays; each stage's
  // estimate (pipeline.h) must fit the cap.
  t.by = "rule";
  auto cutsFor = [&](int p) { return p == P ? cur_cuts : evenCuts(L, p); };
  const ScheduleKind kind = parseScheduleKind(pipeline_->schedule);
  const bool recompute = pipeline_->recompute;
  std::function<bool(int, int)> fits;
  if (cap > 0)
    fits = [&](int p, int d) {
      auto it = fits_.find({p, d});
      if (it != fits_.end()) return it->second;
      if (!mem_train_) mem_train_ = std::move(loadDatasets(job_.data, job_.seed).train);
      const int64_t M = (job_.virtual_nodes + d - 1) / d;  // the largest replica share
      bool ok = true;
      for (const StageMemory& m : estimateStageMemory(job_, cutsFor(p), {kind, p, M, recompute}, *mem_train_))
        ok = ok && m.total() <= cap;
      return fits_[{p, d}] = ok;
    };
  t.shape = chooseMorphShape(workers, P, target_, job_.virtual_nodes, L, fits);
  if (t.shape.workers() > 0) t.cuts = cutsFor(t.shape.stages);
  t.schedule = toString(kind);
  t.recompute = recompute;
  return t;
}

// Growth: the rule grows whenever the workers at hand make a bigger shape;
// the planner when its plan for them is predicted faster than the current
// one by kGrowGain. Checked when the number of waiting workers changes and
// every elastic.grow_interval seconds while some wait.
bool Manager::shouldGrow(int size, int joiners) {
  constexpr double kGrowGain = 0.97;
  if (joiners == 0) {
    grow_joiners_ = 0;
    return false;
  }
  const double now = nowSeconds();
  if (joiners == grow_joiners_ && now - grow_checked_ < job_.grow_interval) return false;
  grow_joiners_ = joiners;
  grow_checked_ = now;
  const MorphShape cur = pipeline_->shape();
  const MorphTarget could = morphTarget(size + joiners);
  if (could.shape.workers() == 0) return false;
  if (!profile_) return could.shape.workers() > cur.workers();
  PlanSpec now_plan;
  now_plan.stages = cur.stages;
  now_plan.replicas = cur.replicas;
  now_plan.cuts = pipeline_->cuts;
  now_plan.schedule = parseScheduleKind(pipeline_->schedule);
  now_plan.recompute = pipeline_->recompute;
  now_plan.vn_shares = pipeline_->replicaShares();
  const double now_s = simulate(*profile_, now_plan, simOptionsFor(job_, false)).step_seconds;
  const bool faster = could.predicted_s < kGrowGain * now_s;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%d x %d predicted %.2f ms per step against %.2f ms now", could.shape.stages,
                could.shape.replicas, could.predicted_s * 1e3, now_s * 1e3);
  if (!faster && grow_said_ != buf) {
    std::printf("morph: %d workers at hand, %d waiting: the planner keeps %d x %d (%s)\n", size + joiners, joiners,
                cur.stages, cur.replicas, buf);
    grow_said_ = buf;
  }
  return faster;
}

PipelineMorph Manager::publishMorph(std::vector<int64_t>& members, const std::vector<int64_t>& survivors,
                                   const std::map<int64_t, MemberReport>& reports, std::vector<int64_t>& released) {
  const double t0 = nowSeconds();
  MorphInput in;
  in.stages = pipeline_->stages;
  in.cuts = pipeline_->cuts;
  in.target = target_;
  in.virtual_nodes = job_.virtual_nodes;
  in.layer_bytes = layer_bytes_;
  in.tied = tied_layers_;
  for (int64_t id : survivors) {
    const MemberReport& r = reports.at(id);
    MorphCandidate c;
    c.id = id;
    c.step = r.committed;
    // The layers it holds at that step, and whether the next step is
    // prepared (none when it reported no layers of this model).
    if (r.held && r.held->hi <= layer_names_.size())
      c.held_lo = r.held->lo, c.held_hi = r.held->hi, c.prepared = r.held->prepared;
    in.candidates.push_back(c);
  }
  for (auto& [id, w] : workers_)
    if (w.alive && w.placeable && std::find(members_.begin(), members_.end(), id) == members_.end())
      in.candidates.push_back({id, -1, 0, 0});
  const MorphTarget target = morphTarget(static_cast<int>(in.candidates.size()));
  const MorphShape shape = target.shape;
  if (shape.workers() == 0)
    noWorkerLeft("no pipeline shape fits the " + std::to_string(in.candidates.size()) + " workers left" +
                 (morphMemoryCap() > 0 ? " within the memory cap" : ""));
  const std::vector<size_t>& cuts = target.cuts;
  const MorphPlan mp = planMorph(in, shape, cuts);
  // Spares beyond --workers leave; the others wait for the next change.
  released.clear();
  const size_t keep_spares = static_cast<size_t>(std::max(0, target_ - shape.workers()));
  for (size_t i = keep_spares; i < mp.spares.size(); ++i) released.push_back(mp.spares[i]);
  PipelineMorph m;
  m.live = mp.live;
  m.step = mp.step;
  m.from = pipeline_->shape();
  m.to = shape;
  std::string how;
  if (mp.live) {
    m.meta_source = mp.meta_source;
    m.transfers = mp.transfers;
    m.expected_bytes = mp.bytes_moved;
    m.finishing = mp.finishing;
    char buf[160];
    std::snprintf(buf, sizeof buf, "%zu layers move between workers (about %.1f MiB)", mp.transfers.size(),
                  static_cast<double>(mp.bytes_moved) / 1048576.0);
    how = buf;
    // Members that lost only the last collective of the step the others
    // committed finish it from their buffers (StepCore::prepared()).
    std::string finishing;
    for (int r : mp.finishing)
      finishing += (finishing.empty() ? "" : ", ") + std::to_string(mp.members[static_cast<size_t>(r)]);
    if (!finishing.empty())
      how += "; worker " + finishing + " finishes step " + std::to_string(mp.step - 1) +
             " from its buffer (it lost only the step's last collective)";
  } else {
    // Some layer has no holder at the newest step: every member reloads
    // from the newest checkpoint and the steps since are done again.
    const std::string cdir = checkpointDir(o_, job_);
    const int64_t ck = job_.checkpoint_every > 0 ? newestGoodCheckpoint(cdir) : -1;
    if (ck < 0)
      noWorkerLeft("pipeline cannot morph: " + mp.why_not_live + ", and there is no checkpoint to restore it from");
    m.checkpoint = cdir + "/" + checkpointDirName(ck);
    m.steps_redone = std::max<int64_t>(0, mp.step - ck);
    how = mp.why_not_live + ": every stage reloads the checkpoint of step " + std::to_string(ck) + " and " +
          std::to_string(std::max<int64_t>(0, mp.step - ck)) + " steps are done again";
  }
  // VNs per replica: by measured speed after a straggler re-plan (the
  // placement's replicas), else the planner's, else even.
  std::vector<int64_t> shares = target.vn_shares;
  if (auto measured = pstraggler_.shares(mp.members, shape.stages, job_.virtual_nodes)) shares = *measured;
  const std::vector<VnRange> ranges = shares.size() == static_cast<size_t>(shape.replicas)
                                          ? rangesOf(shares)
                                          : evenRanges(job_.virtual_nodes, shape.replicas);
  const bool schedule_changes = target.schedule != pipeline_->schedule || target.recompute != pipeline_->recompute;
  const MorphShape was = pipeline_->shape();
  pipeline_->stages = shape.stages;
  pipeline_->replicas = shape.replicas;
  pipeline_->cuts = cuts;
  pipeline_->replica_ranges = ranges;
  pipeline_->schedule = target.schedule;
  pipeline_->recompute = target.recompute;
  m.planning_seconds = nowSeconds() - t0;
  m.chosen_by = target.by;
  m.to_cuts = cuts;
  std::string why = target.by == "planner" ? "the planner's choice, predicted " +
                                                 std::to_string(target.predicted_s * 1e3).substr(0, 6) + " ms per step"
                                           : "the rule";
  if (schedule_changes) why += ", schedule " + target.schedule + (target.recompute ? " with recomputation" : "");
  std::printf("morph: pipeline morphs from %d stages x %d replicas to %d x %d (cut: %s; %s); %s\n", was.stages,
              was.replicas, shape.stages, shape.replicas, describeCuts(layer_names_, cuts).c_str(), why.c_str(),
              how.c_str());
  members = mp.members;
  return m;
}

// `morph run` as this job was started, plus --resume of its checkpoint
// folder: what continues the job if the manager is lost.
std::string Manager::resumeCommand() const {
  auto quote = [](const std::string& a) {
    const bool plain = !a.empty() && std::all_of(a.begin(), a.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("/._-=:,+@%", c) != nullptr;
    });
    if (plain) return a;
    std::string q = "'";
    for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  };
  auto abs = [](const std::string& p) { return std::filesystem::absolute(p).lexically_normal().string(); };
  std::vector<std::string> a = {o_.self_exe, "run", abs(o_.job_path), "--workers", std::to_string(o_.workers)};
  if (o_.spawn >= 0 && o_.spawn != o_.workers) a.insert(a.end(), {"--spawn", std::to_string(o_.spawn)});
  if (o_.host != "127.0.0.1") a.insert(a.end(), {"--host", o_.host});
  if (o_.stages > 1) a.insert(a.end(), {"--stages", std::to_string(o_.stages)});
  if (!o_.schedule.empty()) a.insert(a.end(), {"--schedule", o_.schedule});
  if (!o_.plan.empty()) a.insert(a.end(), {"--plan", o_.plan == "auto" ? o_.plan : abs(o_.plan)});
  if (o_.recompute) a.push_back("--recompute");
  if (!o_.resources.empty()) a.insert(a.end(), {"--resources", abs(o_.resources)});
  if (o_.memory_cap_mib > 0) a.insert(a.end(), {"--memory-cap", std::to_string(static_cast<int64_t>(o_.memory_cap_mib))});
  for (const auto& ov : effectiveOverrides(o_)) a.insert(a.end(), {"--set", ov});
  a.insert(a.end(), {"--out", abs(dir_)});
  if (!o_.checkpoint_dir.empty()) a.insert(a.end(), {"--checkpoint-dir", checkpointDir(o_, job_)});
  a.insert(a.end(), {"--resume", checkpointDir(o_, job_)});
  std::string out;
  for (const auto& x : a) out += (out.empty() ? "" : " ") + quote(x);
  return out;
}

// Phase 1: the options and the plan checked before anything starts.
void Manager::checkOptions() {
  setUpPipeline();
  if (!pipelined()) evenRanges(job_.virtual_nodes, target_);  // validates the worker count
  spawned_ = o_.spawn < 0 ? o_.workers : o_.spawn;
  if (spawned_ > o_.workers) throw InputError("--spawn: cannot start more local workers than --workers");
  dir_ = outDir(o_, job_);
  std::filesystem::create_directories(dir_);
  fingerprint_ = runtimeFingerprint(nullptr, &job_.model);  // the data's: from the first worker
  hb_interval_ = o_.heartbeat_interval_s;
  hb_timeout_ = o_.heartbeat_timeout_s;
  if (hb_interval_ >= hb_timeout_)
    throw InputError("--heartbeat-interval " + std::to_string(hb_interval_) + " s must be shorter than --heartbeat-timeout " +
                     std::to_string(hb_timeout_) + " s (a worker would be declared dead between two heartbeats)");
}

// Phase 2: hosts the store, posts the job's keys for the workers (text,
// checkpoint folder and marker, heartbeats, the resume command), starts the
// status page and the local workers.
void Manager::publishJob() {
  hostStore();
  setString(*store_, keys::kJobText, job_text_);
  // Absolute: a worker started in another folder (or on another host that
  // mounts the same files) resolves the job's relative input paths from the
  // job file's folder too (core/job_spec.h).
  setString(*store_, keys::kJobOrigin, std::filesystem::absolute(o_.job_path).lexically_normal().string());
  setString(*store_, keys::kJobOverrides, joinLines(effectiveOverrides(o_)));
  setString(*store_, keys::kJobOut, std::filesystem::absolute(dir_).string());
  if (job_.checkpoint_every > 0) {
    // The folder every checkpoint writer must see: a marker with a token of
    // this run, which each worker reads back before it starts.
    const std::string cdir = checkpointDir(o_, job_);
    std::error_code ec;
    std::filesystem::create_directories(cdir, ec);
    char token[32];
    std::snprintf(token, sizeof token, "%d-%lld", static_cast<int>(getpid()),
                  static_cast<long long>(std::chrono::system_clock::now().time_since_epoch().count()));
    const std::string marker = cdir + "/" + kCheckpointMarker;
    std::ofstream(marker, std::ios::trunc) << token << "\n";
    std::ifstream back(marker);
    std::string seen;
    if (ec || !std::getline(back, seen) || seen != token)
      throw InputError("checkpoint folder " + cdir + ": cannot write " + marker +
                       (ec ? " (" + ec.message() + ")" : std::string()));
    setString(*store_, keys::kJobCkptDir, cdir);
    setString(*store_, keys::kJobCkptMarker, token);
  }
  // A pipeline worker builds only its stage's layers once it is placed.
  setString(*store_, keys::kJobStageLocal, pipelined() ? "1" : "0");
  setString(*store_, keys::kJobResume, o_.resume.empty() ? "" : std::filesystem::absolute(o_.resume).string());
  setString(*store_, keys::kJobHeartbeat, json({{"interval", hb_interval_}, {"timeout", hb_timeout_}}).dump());
  // --quiet: worker 0 prints no progress (data and checkpoint loading) either.
  setString(*store_, keys::kJobQuiet, o_.quiet ? "1" : "0");
  writeWant(0);
  // What a worker prints when it loses the manager (docs/distributed.md).
  setString(*store_, keys::kJobResumeCommand, resumeCommand());
  status_page_ = startStatusPage(o_.status, {"", 0, readToken(token_file_), job_.name, 0,
                                             job_.checkpoint_every > 0 ? checkpointDir(o_, job_) : "", false});
  std::printf("morph: manager on port %d, %d workers (%d local)\n", port_, o_.workers, spawned_);
  if (spawned_ < o_.workers)
    std::printf("morph: waiting for %d more: morph worker --join %s:%d --token-file %s\n", o_.workers - spawned_,
                o_.host == "0.0.0.0" ? "THIS_HOST" : o_.host.c_str(), port_, token_file_.c_str());
  std::fflush(stdout);
  spawn(spawned_);
}

// Phase 3: generation after generation until every member still alive
// posted its result: registrations, requests, deaths, heartbeats and
// metrics are looked at each time a worker writes (or kIdleWait passes).
void Manager::superviseGenerations() {
  const double start = nowSeconds();
  while (true) {
    // Every worker write (registrations, ready, left, metrics, requests)
    // after this count wakes the wait at the end of the loop.
    const int64_t seen = server_->table().writes();
    pollRegistrations();
    pollResizeRequests();
    pollSlowRequests();
    pollChildren();
    pollHeartbeats();
    pollMetrics();
    updateStatus();
    if (gen_ < 0) {
      maybeStart(start);
    } else if (in_transition_) {
      if (transitionComplete()) publish();
    } else {
      watchMembership();
    }
    if (resultsPosted()) return;
    bool anyone = !unregistered_pids_.empty();
    for (auto& [id, w] : workers_) anyone = anyone || w.alive;
    if (!anyone && gen_ >= 0) noWorkerLeft("no worker is left");
    // No polling: the loop sleeps until a worker writes (a dead local
    // worker's peers post "ready" at once) or, for heartbeats, deadlines and
    // child exits, the heartbeat interval (at most kIdleWait). Each store
    // round trip here costs the workers' cores time (a 5 ms loop took 14%
    // of a core next to a 2-core job's worker).
    const auto idle = std::min<std::chrono::milliseconds>(
        kIdleWait, std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(hb_interval_ * 1000))));
    server_->table().waitForWrite(seen, idle);
  }
}

// A running generation: starts a transition when a member posted ready or
// left (a leave, or a failure a survivor saw first), when joiners can grow
// it, or when a resize request shrinks it.
void Manager::watchMembership() {
  // Members bump "events" after posting ready/left: one read instead of
  // two per member.
  const int64_t events = store_->add(keys::kEvents, 0);
  bool posted = false;
  if (events != events_seen_) {
    events_seen_ = events;
    for (int64_t id : members_)
      posted = posted || store_->check({key(gen_, "ready", id)}) || store_->check({key(gen_, "left", id)});
  }
  int joiners = 0;
  for (auto& [id, w] : workers_)
    joiners += w.alive && w.placeable && std::find(members_.begin(), members_.end(), id) == members_.end();
  const int size = static_cast<int>(members_.size());
  if (posted) {
    startTransition("");  // a leave, or a failure a survivor saw first
  } else if (pipelined()) {
    // Grow when the workers at hand make a bigger shape (joiners, or a
    // larger --workers target); extra workers wait as spares.
    if (shouldGrow(size, joiners)) {
      writeWant(gen_ + 1);
      startTransition(resize_seq_ > 0 ? "request" : "join");
    } else if (size > target_) {
      writeWant(gen_ + 1);
      startTransition("request");
    }
  } else if (joiners > 0 && size < target_ && size < job_.virtual_nodes) {
    writeWant(gen_ + 1);
    startTransition(resize_seq_ > 0 ? "request" : "join");
  } else if (size > target_) {
    writeWant(gen_ + 1);
    startTransition("request");
  }
}

// Whether training is over: every step's metrics read and every member
// still alive posted its result of this generation.
bool Manager::resultsPosted() {
  if (!(log_ && next_ == steps_ && gen_ >= 0 && !in_transition_)) return false;
  // Results of every member still alive (one that died after the last
  // step may or may not have posted one).
  std::vector<std::string> keys;
  int posted = 0;
  for (int64_t id : members_) {
    const std::string k = keys::result(id);
    if (workers_[id].alive) keys.push_back(k);
    posted += store_->check({k});
  }
  // Only results of this generation count (a member posts one when its
  // training loop ends; one of an earlier generation is stale).
  bool current = posted > 0 && store_->check(keys);
  for (size_t i = 0; current && i < keys.size(); ++i) {
    const json r = json::parse(getString(*store_, keys[i]), nullptr, false);
    current = r.is_object() && r.value("generation", int64_t{-1}) == gen_;
  }
  return current;
}

// A pipeline job's model hash from each stage's layer hashes
// (core/model_hash.h): no worker needs the whole model for it.
std::string Manager::pipelineHash(const std::map<int, std::string>& stage_hashes) {
  std::vector<std::pair<std::string, std::string>> layers;
  const int P = pipeline_->stages;
  for (int k = 0; k < P; ++k)
    if (!stage_hashes.count(k))
      noWorkerLeft("no worker of pipeline stage " + std::to_string(k) +
                   " reported the end of training (see its error above)");
  for (const auto& [stage, sh] : stage_hashes) {
    size_t a = 0;
    while (a <= sh.size()) {
      const size_t b = std::min(sh.find(',', a), sh.size());
      layers.emplace_back("", sh.substr(a, b - a));
      a = b + 1;
    }
  }
  if (layers.size() != layer_names_.size())
    throw JobError("the stages reported " + std::to_string(layers.size()) + " layer hashes for " +
                   std::to_string(layer_names_.size()) + " layers: a bug in Morph, please report it");
  for (size_t l = 0; l < layers.size(); ++l) layers[l].first = layer_names_[l];
  return layeredHash(layers);
}

// Phase 4: the members' results checked against each other, the workers
// told the job finished, and the summary written.
int Manager::finish() {
  std::string hash;
  int64_t peak = 0, bytes = 0;
  std::vector<json> results;
  json checkpoint_timing;
  std::map<int, std::string> stage_hashes;
  for (int64_t id : members_) {
    if (!store_->check({keys::result(id)})) continue;
    json res = json::parse(getString(*store_, keys::result(id)));
    results.push_back(res);
    // World rank 0 commits every checkpoint: its timing is the job's.
    if (id == members_.front() && res.contains("checkpoint")) checkpoint_timing = res.at("checkpoint");
    if (pipelined()) {
      // Replicas of a stage hold the same layers.
      const std::string sh = res.at("stage_hash").get<std::string>();
      std::string& first = stage_hashes[res.at("stage").get<int>()];
      if (first.empty()) first = sh;
      if (first != sh)
        throw JobError("pipeline replicas disagree on stage " + res.at("stage").dump() + " after the last step (worker " +
                       std::to_string(id) + "): a bug in Morph, please report it");
      peak = std::max(peak, res.at("peak_rss_bytes").get<int64_t>());
      bytes = std::max(bytes, res.at("bytes_reduced").get<int64_t>());
      continue;
    }
    std::string h = res.at("model_hash").get<std::string>();
    if (hash.empty()) hash = h;
    if (h != hash)
      throw JobError("workers disagree on the model after the last step (" + hash + " vs " + h +
                     " on worker " + std::to_string(id) + "): a bug in Morph, please report it");
    peak = std::max(peak, res.at("peak_rss_bytes").get<int64_t>());
    bytes = std::max(bytes, res.at("bytes_reduced").get<int64_t>());
  }
  if (pipelined() && !results.empty()) hash = pipelineHash(stage_hashes);
  setString(*store_, keys::kJobFinished, "1");
  for (auto& [id, w] : workers_)
    if (w.pid > 0 && w.alive) waitpid(w.pid, nullptr, 0);
  json extra = json::object();
  extra["vn_shares"] = vn_shares_;
  if (!checkpoint_timing.is_null()) extra["checkpoint"] = checkpoint_timing;
  // The plan the job ended on (docs/planner.md).
  extra["plan"] = pipelined() ? planSummary()
                              : json{{"stages", 1}, {"replicas", members_.size()}, {"schedule", "-"}, {"recompute", false}};
  if (res_) {
    json types = json::array();
    for (int64_t id : members_) types.push_back(res_->devices.at(static_cast<size_t>(id)).type);
    extra["devices"] = types;
  }
  // All-reduce payload per step of a worker that stayed throughout.
  if (resizes_.empty() && steps_ > first_step_)
    extra["reduce_payload_bytes_per_step"] = static_cast<double>(bytes) / static_cast<double>(steps_ - first_step_);
  if (pipelined()) {
    extra.update(pipelineResults(results));
    if (!o_.trace.empty()) writeTrace();
  }
  writeSummary(dir_, job_, steps_, static_cast<int>(members_.size()), *log_, hash, peak, resizes_, extra);
  std::printf("model_hash: %s\n", hash.c_str());
  return 0;
}

int Manager::run() {
  checkOptions();
  publishJob();
  superviseGenerations();
  return finish();
}

}  // namespace

int runManager(const RunOptions& o, const JobSpec& job, const std::string& job_text) {
  return Manager(o, job, job_text).run();
}

int runResize(const std::string& join, int workers, const std::string& token_file) {
  auto store = connectToManager(join, readToken(token_file), "client", kClientTimeoutS);
  // What the manager would ignore is refused here, where the user sees it.
  const JobSpec job = parseJob(getString(*store, keys::kJobText), getString(*store, keys::kJobOrigin),
                               splitLines(getString(*store, keys::kJobOverrides)));
  if (workers > job.virtual_nodes)
    throw InputError("--workers " + std::to_string(workers) + ": the job at " + join + " has " +
                     std::to_string(job.virtual_nodes) + " VNs (batch.virtual_nodes), so at most " +
                     std::to_string(job.virtual_nodes) + " workers");
  setString(*store, keys::kResizeTarget, std::to_string(workers));
  store->add(keys::kResizeSeq, 1);
  std::printf("asked the job at %s to run on %d workers\n", join.c_str(), workers);
  return 0;
}

int runStatus(const std::string& join, const std::string& token_file) {
  auto store = connectToManager(join, readToken(token_file), "client", kClientTimeoutS);
  store->wait({keys::kStatus}, std::chrono::milliseconds(static_cast<int64_t>(kClientTimeoutS * 1000)));
  std::printf("%s\n", json::parse(getString(*store, keys::kStatus)).dump(2).c_str());
  return 0;
}

}  // namespace morph
