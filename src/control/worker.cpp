// Worker agent: joins a job's store, waits for a generation that includes
// it, trains its VNs, and regroups when membership changes — without
// restarting and without losing a committed step. Protocol:
// docs/distributed.md ("Generations").
#include <signal.h>

#include <atomic>
#include <csignal>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "comm/communicator.h"
#include "control/internal.h"
#include "control/protocol/generation_plan.h"
#include "control/protocol/generation_want.h"
#include "control/protocol/member_report.h"
#include "control/protocol/message.h"
#include "control/protocol/keys.h"
#include "control/straggler.h"
#include "store/abortable_store.h"
#include "core/memory_estimate.h"
#include "exec/pipeline.h"

namespace morph {

using namespace detail;

namespace {

volatile std::sig_atomic_t g_leave_requested = 0;
void onTerm(int) { g_leave_requested = 1; }
volatile std::sig_atomic_t g_manager_died = 0;  // kManagerDeathSignal: a local worker's manager ended
void onManagerDeath(int) { g_manager_died = 1; }

// A worker that has not reached its manager for this long (or, started by
// it, was told it died) gives the job up: it prints the newest good
// checkpoint and the command that resumes the job, and exits 3. The manager
// is the job's single point of failure (docs/distributed.md).
constexpr double kManagerLostAfterS = 10.0;
// An unplaced worker waits for the next generation's plan this long per
// store round trip (then looks at job/finished, a leave request, a refusal).
constexpr auto kUnplacedWait = std::chrono::milliseconds(250);
// Deadlines of a member waiting in a collective (docs/distributed.md,
// "Deadlines"): after max(kCollectiveFloorS, kCollectiveFactor x the longest
// time it measured between two committed steps) — or elastic.
// collective_timeout — it looks at the members' heartbeats, and waits on
// while every one still beats. Gloo's own timeout is only a ceiling far
// above: max(kGlooCeilingS, kGlooCeilingFactor x the deadline). The
// ceiling also bounds how long a pipeline's send/receive threads and an
// abandoned group's threads stay blocked on a dead peer, so it stays a
// minute by default (raise elastic.collective_timeout for longer pauses).
constexpr double kCollectiveFloorS = 30.0;
constexpr double kCollectiveFactor = 4.0;
constexpr double kGlooCeilingS = 60.0;
constexpr double kGlooCeilingFactor = 2.0;
// A store call of this worker (but waits with their own limit) fails after
// this long without an answer.
constexpr auto kWorkerStoreTimeout = std::chrono::seconds(300);
// After posting its result, a worker waits this long for job/finished.
constexpr auto kFinishedWait = std::chrono::hours(1);
// The heartbeat thread reconnects for at most this long per try after a
// lost connection (the watchdog decides whether the manager is gone).
constexpr double kHeartbeatReconnectS = 1.0;
// The watchdog looks at the last heartbeat that got through this often.
constexpr auto kWatchdogInterval = std::chrono::milliseconds(100);
// A worker with an error in hand waits for a heartbeat to get through
// (polling this often) at most kManagerLostAfterS + kLossGraceS.
constexpr auto kLossPoll = std::chrono::milliseconds(20);
constexpr double kLossGraceS = 2.0;
// A process group's rendezvous looks for its members' keys (and the
// generation's abort flag) this often.
constexpr auto kRendezvousPoll = std::chrono::milliseconds(2);

// Sends this worker's pulse to the manager on a store connection of its own,
// and watches that the manager is still there (kManagerLostAfterS).
class Heartbeat {
 public:
  // Connects as this worker, waiting at most the seconds given.
  using Connect = std::function<c10::intrusive_ptr<StoreClient>(double)>;
  Heartbeat(Connect connect, double connect_timeout_s, int64_t id, double interval_s, std::string join)
      : connect_(std::move(connect)), key_(keys::workerHeartbeat(id)), id_(id), interval_(interval_s),
        join_(std::move(join)) {
    store_ = connect_(connect_timeout_s);
    last_ok_ = nowSeconds();
    thread_ = std::thread([this] { loop(); });
    watchdog_ = std::thread([this] { watch(); });
  }
  ~Heartbeat() {
    stop_ = true;
    thread_.join();
    watchdog_.join();
  }
  // What the loss message names: the checkpoint folder ("" = none) and the
  // manager's resume command.
  void setLossNote(const std::string& ckpt_dir, const std::string& command) {
    std::lock_guard<std::mutex> l(mu_);
    ckpt_dir_ = ckpt_dir;
    command_ = command;
  }
  // Called with an error in hand: returns once a heartbeat gets through
  // after the call (the manager is there: the error is the worker's own),
  // else the watchdog decides in the meantime (and exits the process).
  void waitIfManagerLost() const {
    const double since = nowSeconds();
    while (!stop_ && last_ok_.load() < since && nowSeconds() - since < kManagerLostAfterS + kLossGraceS)
      std::this_thread::sleep_for(kLossPoll);
  }

 private:
  void loop() {
    for (int64_t n = 0; !stop_; ++n) {
      try {
        if (!store_) store_ = connect_(kHeartbeatReconnectS);  // after a lost connection: briefly, the watchdog decides
        setString(*store_, key_, std::to_string(n));
        last_ok_ = nowSeconds();
      } catch (const std::exception&) {
        store_.reset();  // a broken connection stays broken: reconnect next time
      }
      std::this_thread::sleep_for(std::chrono::duration<double>(interval_));
    }
  }
  void watch() {
    while (!stop_) {
      if (g_manager_died) lost("the manager process ended");
      const double silent = nowSeconds() - last_ok_.load();
      if (silent > kManagerLostAfterS) lost("no answer from the manager at " + join_ + " for " +
                                            std::to_string(static_cast<int>(silent)) + " s");
      std::this_thread::sleep_for(kWatchdogInterval);
    }
  }
  [[noreturn]] void lost(const std::string& why) {
    std::string dir, cmd;
    {
      std::lock_guard<std::mutex> l(mu_);
      dir = ckpt_dir_;
      cmd = command_;
    }
    std::string ck = "none (checkpoint.every = 0: the job starts again from step 0)";
    if (!dir.empty()) {
      int64_t step = -1;
      try {
        step = newestGoodCheckpoint(dir);
      } catch (const std::exception&) {
      }
      ck = step >= 0 ? dir + "/" + checkpointDirName(step) + " (step " + std::to_string(step) + ")"
                     : "none yet in " + dir + " (the job starts again from step 0)";
    }
    if (cmd.empty()) cmd = "morph run JOB.toml --resume CHECKPOINT_FOLDER (the job's own options)";
    else if (dir.empty() || ck.rfind("none", 0) == 0) cmd = cmd.substr(0, cmd.rfind(" --resume "));
    std::fprintf(stderr,
                 "morph: worker %lld: lost the manager (%s); the job cannot go on without it. Newest good "
                 "checkpoint: %s. Continue the job with:\n  %s\n",
                 static_cast<long long>(id_), why.c_str(), ck.c_str(), cmd.c_str());
    std::fflush(stderr);
    std::_Exit(3);
  }
  Connect connect_;
  c10::intrusive_ptr<StoreClient> store_;
  std::string key_;
  int64_t id_;
  double interval_;
  std::string join_;
  std::atomic<double> last_ok_{0};
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::string ckpt_dir_, command_;
  std::thread thread_, watchdog_;
};

// Whether a member waiting in a collective should go on waiting: before its
// deadline, yes; after it, while every other member's heartbeat still
// moves (read every heartbeat timeout), yes — it is busy, not dead.
class PeerWatch {
 public:
  PeerWatch(c10::intrusive_ptr<StoreClient> store, std::vector<int64_t> peers, int64_t me, double deadline_s,
            double hb_timeout_s)
      : store_(std::move(store)), peers_(std::move(peers)), me_(me), deadline_(deadline_s), every_(hb_timeout_s) {}
  bool keepWaiting(double waited) {
    if (waited < deadline_) return true;
    const double now = nowSeconds();
    if (now - last_check_ < every_) return true;
    const bool first = last_check_ == 0;
    last_check_ = now;
    for (int64_t p : peers_) {
      if (p == me_) continue;
      const std::string k = keys::workerHeartbeat(p);
      const std::string v = store_->check({k}) ? getString(*store_, k) : std::string();
      std::string& seen = beats_[p];
      if (!first && v == seen) return false;  // silent for a heartbeat timeout: dead
      seen = v;
    }
    if (!first && now - last_note_ > deadline_) {
      last_note_ = now;
      std::fprintf(stderr,
                   "morph: worker %lld: a collective has waited %.0f s (deadline %.0f s); every member still "
                   "heart-beats, so it waits on\n",
                   static_cast<long long>(me_), waited, deadline_);
    }
    return true;
  }

 private:
  c10::intrusive_ptr<StoreClient> store_;
  std::vector<int64_t> peers_;
  int64_t me_;
  double deadline_, every_;
  double last_check_ = 0, last_note_ = 0;
  std::map<int64_t, std::string> beats_;
};

// Every member of a new generation receives the state of `source` (the
// member with the newest committed step): parameters, buffers, optimiser
// state, scale state and the step counter.
void syncState(StepCore& tr, Communicator& comm, int source) {
  if (comm.size() == 1) return;
  std::vector<int64_t> meta = tr.stateMeta();
  torch::Tensor m = torch::tensor(meta, torch::kInt64);
  comm.broadcast(m, source);
  std::vector<torch::Tensor> state = tr.stateTensors();
  std::vector<torch::Tensor> flat;
  for (auto& t : state) {
    MORPH_CHECK(t.scalar_type() == torch::kFloat32, "state tensors are float32");
    flat.push_back(t.detach().reshape({-1}));
  }
  torch::Tensor all = torch::cat(flat);
  comm.broadcast(all, source);
  if (comm.rank() != source) {
    torch::NoGradGuard no_grad;
    int64_t off = 0;
    for (auto& t : state) {
      t.copy_(all.narrow(0, off, t.numel()).view(t.sizes()));
      off += t.numel();
    }
    tr.setStateMeta(std::vector<int64_t>(m.data_ptr<int64_t>(), m.data_ptr<int64_t>() + m.numel()));
  }
}

// Pipeline member `rank` (= replica * stages + stage): forms the stage,
// tied and pipe process groups of the generation (every rank in the same
// order: world, stage, tied, pipe) and hands the trainer its place.
void setUpPipeline(StageExecutor& tr, const PipelineLayout& p, int rank, const VnRange& range,
                   std::vector<std::unique_ptr<Communicator>>& comms,
                   const c10::intrusive_ptr<c10d::Store>& store, const std::string& gkey,
                   const GlooOptions& go) {
  PipelinePlacement pl;
  pl.stages = p.stages;
  pl.replicas = p.replicas;
  pl.stage = rank % pl.stages;
  pl.replica = rank / pl.stages;
  pl.cuts = p.cuts;
  pl.schedule = parseScheduleKind(p.schedule);
  pl.recompute = p.recompute;
  PipelineComms pc;
  pc.world = comms.back().get();
  auto group = [&](const std::string& name, int r, int size) {
    try {
      comms.push_back(makeGlooCommunicator(c10::make_intrusive<c10d::PrefixStore>(gkey + "/" + name, store), r,
                                           size, go));
    } catch (const CommFailure&) {
      throw;
    } catch (const std::exception& e) {
      throw CommFailure("cannot form the " + name + " group of generation " + gkey + ": " + e.what());
    }
    return comms.back().get();
  };
  if (pl.replicas > 1) pc.stage = group("stage/" + std::to_string(pl.stage), pl.replica, pl.replicas);
  if (pl.stages > 1 && tr.sharesWeights() && (pl.stage == 0 || pl.stage == pl.stages - 1))
    pc.tied = group("tied", pl.stage == 0 ? pl.replica : pl.replicas + pl.replica, 2 * pl.replicas);
  pc.pipe = group("pipe/" + std::to_string(pl.replica), pl.stage, pl.stages);
  tr.setTracing(p.trace);
  tr.place(pl, range.begin, range.end, pc);
}

// Joins a pipeline generation as world rank `rank`: places the stage and
// gives its layers their state, from the job seed or the resume checkpoint
// (the first generation), from the workers that hold them (a live morph:
// step counter and scale state broadcast from one member, then layers
// point to point), or from the checkpoint the manager names. Keeps `held`
// true at every point (a failure midway reports only what is still good)
// and returns what it measured for the manager's record of the morph.
// `held` counts layers only (HeldLayers::prepared is the core's).
json enterPipelineGeneration(StageExecutor& ex, const GenerationPlan& plan, int rank,
                             std::vector<std::unique_ptr<Communicator>>& comms,
                             const c10::intrusive_ptr<c10d::Store>& store, const std::string& gkey,
                             const GlooOptions& go, HeldLayers& held, std::string& resume_ckpt, double rendezvous_s) {
  const PipelineLayout& p = *plan.pipeline;
  Communicator& world = *comms.back();
  const VnRange& range = plan.vn_ranges.at(static_cast<size_t>(rank));
  const std::optional<PipelineMorph>& morph = plan.morph;
  json out = {{"rendezvous_seconds", rendezvous_s}, {"move_seconds", 0.0}, {"load_seconds", 0.0}, {"bytes_in", 0}};
  const int P = p.stages;
  const std::vector<size_t>& cuts = p.cuts;
  const HeldLayers next{cuts[static_cast<size_t>(rank % P)], cuts[static_cast<size_t>(rank % P) + 1]};
  auto place = [&] {
    // Layers outside the new range are freed, those inside kept.
    held = {std::max(held.lo, next.lo), std::min(held.hi, next.hi), false};
    if (held.lo >= held.hi) held = {};
    const double t0 = nowSeconds();
    setUpPipeline(ex, p, rank, range, comms, store, gkey, go);
    out["rendezvous_seconds"] = out["rendezvous_seconds"].get<double>() + (nowSeconds() - t0);
  };
  // A step this worker lost only the last collective of (StepCore::
  // prepared()) is finished where the plan says so (planMorph: another
  // member committed it, so every member had its sums), else dropped.
  StepCore& sc = ex.core();
  if (sc.prepared()) {
    const std::vector<int> finishing = morph ? morph->finishing : std::vector<int>();
    if (std::find(finishing.begin(), finishing.end(), rank) != finishing.end()) {
      sc.finishPrepared();
    } else {
      sc.discardPrepared();
    }
  }
  if (!morph) {  // the first generation: every member starts from the same state
    place();
    if (!resume_ckpt.empty()) {
      const double t0 = nowSeconds();
      loadHeldLayers(resume_ckpt, ex);
      out["load_seconds"] = nowSeconds() - t0;
    }
  } else if (morph->live) {
    const int64_t step = morph->step;
    if (ex.core().nextStep() != step) held = {};  // what it holds is of another step
    const double t0 = nowSeconds();
    StepCore& core = ex.core();
    torch::Tensor m = torch::tensor(core.stateMeta(), torch::kInt64);
    world.broadcast(m, morph->meta_source);
    core.setStateMeta(std::vector<int64_t>(m.data_ptr<int64_t>(), m.data_ptr<int64_t>() + m.numel()));
    std::vector<LayerTransfer> transfers;
    for (const MorphTransfer& t : morph->transfers) transfers.push_back({t.layer, t.src, t.dst});
    int64_t bytes = 0;
    std::map<size_t, NamedTensors> got = moveLayers(core, world, transfers, &bytes);
    out["move_seconds"] = nowSeconds() - t0;
    out["bytes_in"] = bytes;
    place();
    ex.importLayers(got);
  } else {
    held = {};  // every layer goes back to the checkpoint's step
    const double t0 = nowSeconds();
    const std::string& ck = morph->checkpoint;
    loadStepFrom(ck, ex);
    place();
    loadHeldLayers(ck, ex);
    out["load_seconds"] = nowSeconds() - t0;
  }
  resume_ckpt.clear();
  held = next;
  return out;
}

// Generation g's plan (control/protocol/generation_plan.h): JobError naming
// the key when it is not one.
GenerationPlan readPlan(c10d::Store& store, int64_t g) {
  const std::string key = keys::genPlan(g);
  try {
    return GenerationPlan::fromJson(json::parse(getString(store, key), nullptr, false));
  } catch (const MessageError& e) {
    throw JobError("the job's store holds a malformed plan under " + key + " (" + e.what() + ")");
  }
}

// Phase 1, registration: the worker's id, pid and address posted, and its
// heartbeat running (the manager watches it from here on).
struct Registration {
  std::string iface;  // this host's address toward the manager (Gloo binds it)
  std::string token;
  c10::intrusive_ptr<StoreClient> store;  // the worker's own connection, registered as `id`
  json hb;                                // {"interval", "timeout"} of the job's heartbeats (seconds)
  int64_t id = -1;
  std::string me;                         // the id as text
  std::unique_ptr<Heartbeat> heartbeat;   // declared after `store`: stops before it closes
};

Registration registerWithManager(const WorkerOptions& o) {
  Registration r;
  auto [host, port] = parseHostPort(o.join, "--join");
  r.iface = localAddressToward(host, port);
  r.token = readToken(o.token_file);
  r.store = connectToManager(o.join, r.token, "worker", o.connect_timeout_s);
  r.store->setTimeout(kWorkerStoreTimeout);

  r.hb = json::parse(getString(*r.store, keys::kJobHeartbeat));
  r.id = r.store->add(keys::kNextWorkerId, 1) - 1;
  r.me = std::to_string(r.id);
  faultPoint("registering", r.id);
  setString(*r.store, keys::workerPid(r.id), std::to_string(getpid()));
  setString(*r.store, keys::workerAddr(r.id), r.iface);
  // Its own connection, as this worker (registered on `store`): the
  // manager watches this worker's heartbeats from here on.
  r.heartbeat = std::make_unique<Heartbeat>(
      [join = o.join, key = morph::store::workerKey(r.token, r.store->sessionNonce()), me = r.me](double t) {
        return connectToManager(join, key, "worker/" + me, t);
      },
      o.connect_timeout_s, r.id, r.hb.at("interval").get<double>(), o.join);
  if (r.store->check({keys::kJobResumeCommand}))
    r.heartbeat->setLossNote("", getString(*r.store, keys::kJobResumeCommand));
  faultPoint("registered", r.id);
  return r;
}

// Phases 2-5 of a registered worker: start-up (job, data, model, resume:
// `ready`), then generation after generation: wait for one that places it,
// join it, train until the job ends or membership changes, and at the end
// post its result. Destroyed before its caller's error handling runs, as
// the locals of one function were.
class WorkerJob {
 public:
  explicit WorkerJob(Registration& reg)
      : reg_(reg), store_(reg.store), id_(reg.id),
        job_(parseJob(getString(*store_, keys::kJobText), getString(*store_, keys::kJobOrigin),
                      splitLines(getString(*store_, keys::kJobOverrides)))),
        leave_groups_at_exit_{comms_} {}

  // Phase 2: everything a worker needs before it can join a generation
  // within milliseconds; posts workers/<id>/ready last.
  void startUp();
  // Phases 3-5; returns the exit code.
  int run();

 private:
  // Where this worker sits in a generation it joined.
  struct Placement {
    int rank = -1, world = 0;
    double slowdown = 1.0;  // its emulated device's (resources file)
    Communicator* comm = nullptr;  // the generation's world group
  };
  // Phase 3: waits for a generation newer than ours into `plan`; false
  // when the worker should exit instead (job finished, leave requested).
  bool waitForGeneration(GenerationPlan& plan);
  // Phase 4a: forms the generation's process groups, receives its state and
  // sets up its checkpoint writer (CommFailure: regroup).
  Placement joinGeneration(const GenerationPlan& plan, int rank);
  // Phase 4b: trains until the last step (false) or a regroup (true).
  bool trainLoop(const Placement& p);
  // Phase 5: posts the result and waits for the job to finish.
  void finish(const Placement& p);
  // Reports the committed step when leaving a generation (ready or left).
  void report(const std::string& what);
  // gen/want (JobError naming the key when malformed).
  GenerationWant readWant();
  // The core's emulated slowdown: its device's (resources file) x `morph
  // slow`'s factor (StepCore::setSlowdown).
  void applySlowdown(double device_slowdown) {
    const double want = device_slowdown * slow_factor_;
    if (want != core_->slowdown()) core_->setSlowdown(want);
  }

  // The test build's faults at a step's points: "compute@12", "reduce@12",
  // "reduced@12", "last-sum@12" (ExecutorProbe::atPoint).
  struct FaultProbe : ExecutorProbe {
    int64_t id = -1;
    void atPoint(const char* point, int64_t step) override {
      faultPoint(std::string(point) + "@" + std::to_string(step), id);
    }
  };

  Registration& reg_;
  c10::intrusive_ptr<StoreClient> store_;
  const int64_t id_;
  FaultProbe fault_probe_;
  // Declaration order is destruction order (reversed): as the locals of the
  // one function this class was split from.
  JobSpec job_;
  // `morph slow`'s factor for this worker, as gen/want last carried it
  // (GenerationWant: read before each step, nothing else polls).
  double slow_factor_ = 1.0;
  std::string ckpt_dir_;
  DataPair data_;
  int64_t steps_ = 0;
  LocalCommunicator none_;
  // The executor: a data-parallel worker's, or a pipeline stage's (placed
  // when its generation forms).
  std::unique_ptr<VnExecutor> vn_ex_;
  std::unique_ptr<StageExecutor> stage_ex_;
  Executor* tr_ = nullptr;
  StepCore* core_ = nullptr;
  std::string resume_ckpt_;  // stage-local: the checkpoint whose layers this worker loads once placed
  std::unique_ptr<FileSystem> fs_;
  std::unique_ptr<CheckpointWriter> ckpt_;
  std::optional<CheckpointKeeper> keeper_;  // counts failed checkpoint writes of `ckpt_`
  double hb_timeout_ = 0;
  double last_commit_ = 0, longest_gap_ = 0;  // between two committed steps here (seconds)
  // Process groups of past generations whose work was abandoned (a
  // CommFailure), and a pipeline's: never destroyed, since their threads
  // may still be blocked on a dead peer until Gloo's own timeout. Those of
  // the current generation start at gen_first_group_.
  std::vector<std::unique_ptr<Communicator>> comms_;
  size_t gen_first_group_ = 0;
  // Data parallelism: the groups of a generation that ended in a regroup
  // with every collective completed; destroyed (their Gloo device thread,
  // sockets and buffers freed) once the next generation's group is in use.
  std::vector<std::unique_ptr<Communicator>> finished_groups_;
  // Nor at exit: a group whose work was abandoned blocks its destructor
  // until Gloo's own timeout (a ceiling of minutes now, see "Deadlines"),
  // and the process ends anyway.
  struct LeaveGroupsAtExit {
    std::vector<std::unique_ptr<Communicator>>& groups;
    ~LeaveGroupsAtExit() {
      for (auto& g : groups) (void)g.release();
    }
  } leave_groups_at_exit_;
  LeaveGroupsAtExit leave_finished_at_exit_{finished_groups_};
  int64_t gen_ = -1;
  json last_line_;  // metrics of the last step this worker committed
  HeldLayers held_;  // pipeline: the layers this worker holds at its committed step
};

void WorkerJob::startUp() {
  struct sigaction sa {};
  sa.sa_handler = onTerm;
  sigaction(SIGTERM, &sa, nullptr);

  if (job_.checkpoint_every > 0) {
    // Checkpoints must land where the manager (and a later --resume) finds
    // them: this worker must see the marker the manager wrote there.
    ckpt_dir_ = getString(*store_, keys::kJobCkptDir);
    if (store_->check({keys::kJobResumeCommand}))
      reg_.heartbeat->setLossNote(ckpt_dir_, getString(*store_, keys::kJobResumeCommand));
    std::ifstream in(ckpt_dir_ + "/" + kCheckpointMarker);
    std::string seen;
    if (!std::getline(in, seen) || seen != getString(*store_, keys::kJobCkptMarker))
      throw InputError("checkpoint folder " + ckpt_dir_ + ": this worker does not see the folder the manager writes (" +
                       std::string(kCheckpointMarker) + " " + (in ? "differs" : "missing") +
                       "); on several hosts the checkpoint folder must be shared (--checkpoint-dir, checkpoint.dir)");
  }
  // A pipeline worker holds no layer until it knows its stage.
  const bool stage_local = getString(*store_, keys::kJobStageLocal) == "1";
  // This machine's memory, before anything is allocated (core/
  // memory_estimate.h): the manager checked only the workers it starts, on
  // its own machine. A data-parallel worker holds the whole model; a
  // pipeline worker's stage is not known yet, so only the dataset counts.
  checkJobFitsMemory(job_, stage_local ? 0.0 : 1.0, 1.0, availableMemoryBytes());
  pinThreads(job_.threads);
  checkBlas(id_ == 0);
  // Progress for a person waiting: worker 0's only (the others load the same).
  const bool progress = id_ == 0 && store_->check({keys::kJobQuiet}) && getString(*store_, keys::kJobQuiet) == "0";
  std::function<void(const std::string&)> say;
  if (progress) say = [](const std::string& line) { std::printf("morph: worker 0: %s\n", line.c_str()), std::fflush(stdout); };
  data_ = loadData(job_, say);
  steps_ = job_.resolveSteps(data_.train->size());

  if (stage_local) stage_ex_ = std::make_unique<StageExecutor>(job_, steps_, *data_.train);
  else vn_ex_ = std::make_unique<VnExecutor>(job_, steps_, *data_.train, none_);
  tr_ = stage_local ? static_cast<Executor*>(stage_ex_.get()) : vn_ex_.get();
  core_ = &tr_->core();
  if (faultHookSet()) {  // the test build: "POINT@STEP" at the step's points (ExecutorProbe::atPoint)
    fault_probe_.id = id_;
    core_->setProbe(&fault_probe_);
  }
  const std::string resume = getString(*store_, keys::kJobResume);
  if (!resume.empty()) {
    if (stage_local) resume_ckpt_ = resumeStepFrom(resume, *tr_, id_ == 0, progress);
    else resumeFrom(resume, *tr_, id_ == 0, progress);
  }
  // Whoever gets here first tells the manager where the job starts and ends
  // (every worker computes the same values; start_step goes first, so
  // whoever sees job/steps finds it).
  auto createOnce = [&](const std::string& key, const std::string& v) {
    store_->compareSet(key, {}, std::vector<uint8_t>(v.begin(), v.end()));
  };
  if (!store_->check({keys::kJobSteps})) {
    createOnce(keys::kJobStartStep, std::to_string(core_->nextStep()));
    createOnce(keys::kJobSteps, std::to_string(steps_));
  }
  fs_ = checkpointFileSystem();
  // What the manager checks this worker against (same build, settings and
  // data as the job's other workers).
  setString(*store_, keys::workerFingerprint(id_), runtimeFingerprint(&data_, &job_.model).dump());
  // Data loaded and model built: from now on this worker can join a
  // generation within milliseconds.
  setString(*store_, keys::workerReady(id_), "1");
  hb_timeout_ = reg_.hb.at("timeout").get<double>();
}

void WorkerJob::report(const std::string& what) {
  MemberReport r;
  r.committed = core_->nextStep();
  r.line = last_line_;
  if (stage_ex_) r.held = HeldLayers{held_.lo, held_.hi, core_->prepared()};
  setString(*store_, keys::genReport(gen_, what, id_), r.toJson().dump());
  store_->add(keys::kEvents, 1);  // wakes the manager's membership check
}

GenerationWant WorkerJob::readWant() {
  const std::string v = getString(*store_, keys::kGenWant);
  try {
    return GenerationWant::decode(v);
  } catch (const MessageError& e) {
    throw JobError("the job's store holds a malformed value under " + keys::kGenWant + " (" + e.what() + ")");
  }
}

bool WorkerJob::waitForGeneration(GenerationPlan& plan) {
  while (true) {
    if (store_->check({keys::kJobFinished})) return false;
    // gen/current is read once: the wait below is for the plan after the
    // one read here. (Read again, a generation published in between would
    // be missed, and the wait would be for the one after it: kUnplacedWait
    // lost in about half of the morphs measured by bench/morph_latency.py.)
    const int64_t cur = store_->check({keys::kGenCurrent}) ? getInt(*store_, keys::kGenCurrent) : -1;
    if (cur > gen_) {
      plan = readPlan(*store_, cur);
      gen_ = cur;
      return true;
    }
    if (g_leave_requested) return false;  // not in a generation: nothing to hand over
    if (store_->check({keys::workerRefused(id_)})) throw InputError(getString(*store_, keys::workerRefused(id_)));
    // Sleeps in the store until the next generation's plan appears (the
    // manager writes it before gen/current), or kUnplacedWait.
    try {
      store_->wait({keys::genPlan(std::max(cur, gen_) + 1)}, kUnplacedWait);
    } catch (const StoreError&) {
      // Timed out (a lost connection fails the next call).
    }
  }
}

WorkerJob::Placement WorkerJob::joinGeneration(const GenerationPlan& plan, int rank) {
  Placement pl;
  pl.rank = rank;
  pl.world = static_cast<int>(plan.members.size());
  const std::string gkey = keys::gen(gen_);
  GlooOptions go;
  go.interface_addr = reg_.iface;
  // Deadlines from what this worker measured (docs/distributed.md, "Deadlines").
  const double deadline = job_.collective_timeout > 0 ? job_.collective_timeout
                                                      : std::max(kCollectiveFloorS, kCollectiveFactor * longest_gap_);
  go.timeout = std::chrono::milliseconds(
      static_cast<int64_t>(1000 * std::max(kGlooCeilingS, kGlooCeilingFactor * deadline)));
  go.should_abort = [store = store_, abort = keys::genAbort(gen_)] { return store->check({abort}); };
  auto peers = std::make_shared<PeerWatch>(store_, plan.members, id_, deadline, hb_timeout_);
  go.keep_waiting = [peers](double waited) { return peers->keepWaiting(waited); };
  const c10::intrusive_ptr<c10d::Store> gstore =
      c10::make_intrusive<store::AbortableStore>(store_, keys::genAbort(gen_), kRendezvousPoll);
  const double rdv0 = nowSeconds();
  gen_first_group_ = comms_.size();
  try {
    comms_.push_back(makeGlooCommunicator(c10::make_intrusive<c10d::PrefixStore>(gkey + "/pg", gstore), rank,
                                          pl.world, go));
  } catch (const std::exception& e) {
    throw CommFailure(std::string("cannot form generation ") + std::to_string(gen_) + ": " + e.what());
  }
  pl.comm = comms_.back().get();
  const VnRange& range = plan.vn_ranges.at(static_cast<size_t>(rank));
  pl.slowdown = plan.slowdownOf(rank);
  applySlowdown(pl.slowdown);
  if (plan.pipeline) {
    const json m = enterPipelineGeneration(*stage_ex_, plan, rank, comms_, gstore, gkey, go, held_, resume_ckpt_,
                                           nowSeconds() - rdv0);
    setString(*store_, keys::genReport(gen_, "morph", id_), m.dump());
  } else {
    vn_ex_->setCommunicator(pl.comm);
    finished_groups_.clear();  // no longer referenced; no work of theirs pending
    syncState(*core_, *pl.comm, plan.source);
    vn_ex_->setVnRange(range.begin, range.end);
  }
  tr_->setSpeedSlot(2 + rank);  // after the two control values of trainLoop (straggler.h)
  if (stage_ex_ && stage_ex_->placement().replica != 0) {
    keeper_.reset();  // a morph moved this worker off a writing replica
    ckpt_.reset();
  }
  if (job_.checkpoint_every > 0 && stage_ex_ && stage_ex_->placement().replica == 0) {
    // Each stage's first replica writes its layers; world rank 0 also
    // commits the checkpoint once every stage's share is durable.
    CheckpointShare share;
    share.attempt = getString(*store_, keys::kJobCkptMarker) + "-g" + std::to_string(gen_);
    share.commit = rank == 0;
    share.total_layers = static_cast<int64_t>(core_->model().size());
    ckpt_ = std::make_unique<CheckpointWriter>(ckpt_dir_, fs_.get(), static_cast<int>(job_.checkpoint_keep), share);
  } else if (rank == 0 && job_.checkpoint_every > 0 && !ckpt_) {
    ckpt_ = std::make_unique<CheckpointWriter>(ckpt_dir_, fs_.get(), static_cast<int>(job_.checkpoint_keep));
  }
  if (ckpt_ && (!keeper_ || keeper_->writer() != ckpt_.get())) {
    keeper_.reset();
    keeper_.emplace(ckpt_.get(), job_);
  }
  return pl;
}

bool WorkerJob::trainLoop(const Placement& p) {
  StepCore& core = *core_;
  while (core.nextStep() < steps_) {
    const GenerationWant want = readWant();
    std::vector<double> control = {static_cast<double>(want.generation), g_leave_requested ? 1.0 : 0.0};
    control.resize(2 + static_cast<size_t>(p.world), 0.0);  // + every member's seconds per VN
    core.setControl(std::move(control));
    slow_factor_ = want.slowdownOf(id_);
    applySlowdown(p.slowdown);
    StepStats st = tr_->step();
    const double committed_at = nowSeconds();
    if (last_commit_ > 0) longest_gap_ = std::max(longest_gap_, committed_at - last_commit_);
    last_commit_ = committed_at;
    // Committed on every member of this generation: all hold the same
    // reduced loss, so any member can stand in for rank 0's line.
    last_line_ = commitLine(job_, st, p.world, gen_);
    const bool eval_due = st.step + 1 == steps_ || (job_.eval_every > 0 && (st.step + 1) % job_.eval_every == 0);
    const bool ckpt_due = job_.checkpoint_every > 0 && (st.step + 1) % job_.checkpoint_every == 0;
    std::string ckerr;
    if (keeper_ && ckpt_due) {
      faultPoint("checkpoint@" + std::to_string(st.step), id_);
      ckerr = keeper_->submit(tr_->exportState());  // copied before it returns
    }
    // A pipeline evaluates on every rank: the test set flows through the stages.
    std::optional<EvalStats> eval;
    if (stage_ex_ && eval_due) eval = tr_->evaluate(*data_.test, job_.eval_batch);
    if (p.rank == 0) {
      if (eval_due) faultPoint("evaluate", id_);
      json line = stepLine(job_, steps_, st, *tr_, *data_.test, p.world, gen_, eval ? &*eval : nullptr);
      if (!ckerr.empty()) line["checkpoint_error"] = ckerr;
      {  // the members' seconds per VN, rank order (the manager watches for stragglers)
        const auto& ctl = core.reducedControl();
        line["vn_seconds"] = std::vector<double>(ctl.begin() + 2, ctl.end());
      }
      setString(*store_, keys::metrics(st.step), line.dump());
    }
    const auto& ctl = core.reducedControl();
    if (ctl[0] > static_cast<double>(gen_) || ctl[1] > 0.0) return true;
  }
  return false;
}

void WorkerJob::finish(const Placement& p) {
  // A pipeline rank reports its stage's layer hashes (replicas of a
  // stage must agree; the manager combines them into the model's).
  json res = {{"model_hash", vn_ex_ ? vn_ex_->hash() : std::string()},
              {"param_bytes", core_->modelBytes()},
              {"peak_param_bytes", core_->peakModelBytes()},
              {"peak_rss_bytes", peakRssBytes()},
              {"bytes_reduced", p.comm->bytesReduced()},
              {"generation", gen_}};
  if (ckpt_) res["checkpoint"] = checkpointTiming(*ckpt_);
  if (stage_ex_) {
    const StageExecutor& st = *stage_ex_;
    res["stage"] = st.placement().stage;
    std::string hashes;
    for (const std::string& h : st.layerHashes()) hashes += (hashes.empty() ? "" : ",") + h;
    res["stage_hash"] = hashes;
    res["replica"] = st.placement().replica;
    json t = json::array();
    for (const StageTiming& s : st.stageTimings()) t.push_back({s.step, s.start, s.end, s.busy});
    res["timings"] = t;
    if (!st.trace().empty()) {
      json ev = json::array();
      for (const TraceEvent& e : st.trace()) ev.push_back({e.name, e.step, e.start, e.end});
      setString(*store_, keys::trace(id_), ev.dump());
    }
  }
  setString(*store_, keys::result(id_), res.dump());
  store_->wait({keys::kJobFinished}, kFinishedWait);
}

int WorkerJob::run() {
  while (true) {
    GenerationPlan plan;
    if (!waitForGeneration(plan)) return 0;
    const int rank = plan.rankOf(id_);
    if (rank < 0) {
      if (plan.releases(id_)) return 0;  // asked to leave (resize down)
      continue;                          // not placed yet: wait for the next one
    }
    try {
      const Placement p = joinGeneration(plan, rank);
      const bool regroup = trainLoop(p);
      if (keeper_) keeper_->flush();
      if (regroup && vn_ex_) {
        // Every collective of this generation completed: its group is
        // destroyed once the executor uses the next one (a group whose
        // work was abandoned stays, see comms_).
        for (size_t i = gen_first_group_; i < comms_.size(); ++i) finished_groups_.push_back(std::move(comms_[i]));
        comms_.resize(gen_first_group_);
      }
      if (regroup) {
        if (g_leave_requested) {
          report("left");
          return 0;
        }
        report("ready");
        continue;
      }
      finish(p);
      return 0;
    } catch (const CommFailure& e) {
      // The step in flight did not commit; report what did and regroup.
      tr_->abandonStep();
      report("ready");
    } catch (const JobError& e) {
      // The job cannot go on (e.g. no checkpoint for checkpoint.max_failures
      // intervals): the manager stops every worker with this message rather
      // than regrouping without this one.
      setString(*store_, keys::workerFatal(id_), e.what());
      throw;
    }
  }
}

}  // namespace

int runWorker(const WorkerOptions& o) {
  std::signal(kManagerDeathSignal, onManagerDeath);
  Registration reg = registerWithManager(o);
  bool ready = false;  // posted workers/<id>/ready: past start-up
  try {
    WorkerJob w(reg);
    w.startUp();
    ready = true;
    return w.run();
  } catch (const std::exception& e) {
    if (!ready) {
      // It cannot start: the manager prints why (and goes on without it).
      try {
        setString(*reg.store, keys::workerStartError(reg.id),
                  json({{"why", e.what()}, {"input", dynamic_cast<const InputError*>(&e) != nullptr}}).dump());
      } catch (const std::exception&) {
      }
    }
    // A store call failing because the manager is gone: the watchdog
    // prints the resume command and exits. Bad input and a job that cannot
    // go on are this worker's own findings (the manager may be gone already
    // because of them).
    if (!dynamic_cast<const InputError*>(&e) && !dynamic_cast<const JobError*>(&e)) reg.heartbeat->waitIfManagerLost();
    throw;
  }
}

}  // namespace morph
