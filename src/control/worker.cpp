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
#include "control/store_keys.h"
#include "control/straggler.h"
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
    while (!stop_ && last_ok_.load() < since && nowSeconds() - since < kManagerLostAfterS + 2)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

 private:
  void loop() {
    for (int64_t n = 0; !stop_; ++n) {
      try {
        if (!store_) store_ = connect_(1.0);  // after a lost connection: briefly, the watchdog decides
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
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
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

// The store as a generation's process groups see it: a wait for keys
// (Gloo's rendezvous waits for every member's address) also ends, with
// CommFailure, once the manager aborts the generation. A member that died
// before publishing its address would otherwise hold the others for the
// store's whole timeout.
class GenerationStore : public c10d::Store {
 public:
  GenerationStore(c10::intrusive_ptr<StoreClient> inner, std::string abort_key)
      : c10d::Store(inner->getTimeout()), inner_(std::move(inner)), abort_(std::move(abort_key)) {}
  void set(const std::string& key, const std::vector<uint8_t>& value) override { inner_->set(key, value); }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    return inner_->compareSet(key, expected, desired);
  }
  std::vector<uint8_t> get(const std::string& key) override {
    waitFor({key}, timeout_);
    return inner_->get(key);
  }
  int64_t add(const std::string& key, int64_t value) override { return inner_->add(key, value); }
  bool deleteKey(const std::string& key) override { return inner_->deleteKey(key); }
  bool check(const std::vector<std::string>& keys) override { return inner_->check(keys); }
  int64_t getNumKeys() override { return inner_->getNumKeys(); }
  void wait(const std::vector<std::string>& keys) override { waitFor(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    waitFor(keys, timeout);
  }

 private:
  void waitFor(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!inner_->check(keys)) {
      if (inner_->check({abort_})) throw CommFailure("the generation was aborted while its members met");
      if (timeout.count() > 0 && std::chrono::steady_clock::now() > deadline)
        throw CommFailure("a member of the generation did not show up within " +
                          std::to_string(timeout.count() / 1000) + " s");
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  c10::intrusive_ptr<StoreClient> inner_;
  std::string abort_;
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
void setUpPipeline(StageExecutor& tr, const json& p, int rank, const json& range,
                   std::vector<std::unique_ptr<Communicator>>& comms,
                   const c10::intrusive_ptr<c10d::Store>& store, const std::string& gkey,
                   const GlooOptions& go) {
  PipelinePlacement pl;
  pl.stages = p.at("stages").get<int>();
  pl.replicas = p.at("replicas").get<int>();
  pl.stage = rank % pl.stages;
  pl.replica = rank / pl.stages;
  pl.cuts = p.at("cuts").get<std::vector<size_t>>();
  pl.schedule = parseScheduleKind(p.at("schedule").get<std::string>());
  pl.recompute = p.at("recompute").get<bool>();
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
  tr.setTracing(p.value("trace", false));
  tr.place(pl, range.at(0).get<int64_t>(), range.at(1).get<int64_t>(), pc);
}

// The layers a pipeline worker holds with the state of its committed step,
// [lo, hi): what the manager may move from it when the pipeline morphs.
struct HeldRange {
  size_t lo = 0, hi = 0;
};

// Joins a pipeline generation as world rank `rank`: places the stage and
// gives its layers their state, from the job seed or the resume checkpoint
// (the first generation), from the workers that hold them (a live morph:
// step counter and scale state broadcast from one member, then layers
// point to point), or from the checkpoint the manager names. Keeps `held`
// true at every point (a failure midway reports only what is still good)
// and returns what it measured for the manager's record of the morph.
json enterPipelineGeneration(StageExecutor& ex, const json& plan, int rank, std::vector<std::unique_ptr<Communicator>>& comms,
                             const c10::intrusive_ptr<c10d::Store>& store, const std::string& gkey,
                             const GlooOptions& go, HeldRange& held, std::string& resume_ckpt, double rendezvous_s) {
  const json& p = plan.at("pipeline");
  Communicator& world = *comms.back();
  const json& range = plan.at("vn_ranges").at(rank);
  const json morph = plan.value("morph", json());
  json out = {{"rendezvous_seconds", rendezvous_s}, {"move_seconds", 0.0}, {"load_seconds", 0.0}, {"bytes_in", 0}};
  const int P = p.at("stages").get<int>();
  const std::vector<size_t> cuts = p.at("cuts").get<std::vector<size_t>>();
  const HeldRange next{cuts[static_cast<size_t>(rank % P)], cuts[static_cast<size_t>(rank % P) + 1]};
  auto place = [&] {
    // Layers outside the new range are freed, those inside kept.
    held = {std::max(held.lo, next.lo), std::min(held.hi, next.hi)};
    if (held.lo >= held.hi) held = {};
    const double t0 = nowSeconds();
    setUpPipeline(ex, p, rank, range, comms, store, gkey, go);
    out["rendezvous_seconds"] = out["rendezvous_seconds"].get<double>() + (nowSeconds() - t0);
  };
  if (morph.is_null()) {  // the first generation: every member starts from the same state
    place();
    if (!resume_ckpt.empty()) {
      const double t0 = nowSeconds();
      loadHeldLayers(resume_ckpt, ex);
      out["load_seconds"] = nowSeconds() - t0;
    }
  } else if (morph.at("live").get<bool>()) {
    const int64_t step = morph.at("step").get<int64_t>();
    if (ex.core().nextStep() != step) held = {};  // what it holds is of another step
    const double t0 = nowSeconds();
    StepCore& core = ex.core();
    torch::Tensor m = torch::tensor(core.stateMeta(), torch::kInt64);
    world.broadcast(m, morph.at("meta_source").get<int>());
    core.setStateMeta(std::vector<int64_t>(m.data_ptr<int64_t>(), m.data_ptr<int64_t>() + m.numel()));
    std::vector<LayerTransfer> transfers;
    for (const auto& t : morph.at("transfers"))
      transfers.push_back({t.at(0).get<size_t>(), t.at(1).get<int>(), t.at(2).get<int>()});
    int64_t bytes = 0;
    std::map<size_t, NamedTensors> got = moveLayers(core, world, transfers, &bytes);
    out["move_seconds"] = nowSeconds() - t0;
    out["bytes_in"] = bytes;
    place();
    ex.importLayers(got);
  } else {
    held = {};  // every layer goes back to the checkpoint's step
    const double t0 = nowSeconds();
    const std::string ck = morph.at("checkpoint").get<std::string>();
    loadStepFrom(ck, ex);
    place();
    loadHeldLayers(ck, ex);
    out["load_seconds"] = nowSeconds() - t0;
  }
  resume_ckpt.clear();
  held = next;
  return out;
}

}  // namespace

int runWorker(const WorkerOptions& o) {
  std::signal(kManagerDeathSignal, onManagerDeath);
  auto [host, port] = parseHostPort(o.join, "--join");
  const std::string iface = localAddressToward(host, port);
  const std::string token = readToken(o.token_file);
  auto store = connectToManager(o.join, token, "worker", o.connect_timeout_s);
  store->setTimeout(std::chrono::seconds(300));

  json hb = json::parse(getString(*store, keys::kJobHeartbeat));
  const int64_t id = store->add(keys::kNextWorkerId, 1) - 1;
  const std::string me = std::to_string(id);
  faultPoint("registering", id);
  setString(*store, keys::workerPid(id), std::to_string(getpid()));
  setString(*store, keys::workerAddr(id), iface);
  // Its own connection, as this worker (registered on `store`): the
  // manager watches this worker's heartbeats from here on.
  Heartbeat heartbeat(
      [join = o.join, key = morph::store::workerKey(token, store->sessionNonce()), me](double t) {
        return connectToManager(join, key, "worker/" + me, t);
      },
      o.connect_timeout_s, id, hb.at("interval").get<double>(), o.join);
  if (store->check({keys::kJobResumeCommand})) heartbeat.setLossNote("", getString(*store, keys::kJobResumeCommand));
  faultPoint("registered", id);
  bool ready = false;  // posted workers/<id>/ready: past start-up
  try {
    JobSpec job = parseJob(getString(*store, keys::kJobText), getString(*store, keys::kJobOrigin),
                           splitLines(getString(*store, keys::kJobOverrides)));
    // `morph slow` (straggler.h): polled on a connection of its own.
    SlowdownKnob knob(connectToManager(o.join, morph::store::workerKey(token, store->sessionNonce()), "worker/" + me,
                                       o.connect_timeout_s),
                      id);
    struct sigaction sa {};
    sa.sa_handler = onTerm;
    sigaction(SIGTERM, &sa, nullptr);

    std::string ckpt_dir;
    if (job.checkpoint_every > 0) {
      // Checkpoints must land where the manager (and a later --resume) finds
      // them: this worker must see the marker the manager wrote there.
      ckpt_dir = getString(*store, keys::kJobCkptDir);
      if (store->check({keys::kJobResumeCommand})) heartbeat.setLossNote(ckpt_dir, getString(*store, keys::kJobResumeCommand));
      std::ifstream in(ckpt_dir + "/" + kCheckpointMarker);
      std::string seen;
      if (!std::getline(in, seen) || seen != getString(*store, keys::kJobCkptMarker))
        throw InputError("checkpoint folder " + ckpt_dir + ": this worker does not see the folder the manager writes (" +
                         std::string(kCheckpointMarker) + " " + (in ? "differs" : "missing") +
                         "); on several hosts the checkpoint folder must be shared (--checkpoint-dir, checkpoint.dir)");
    }
    pinThreads(job.threads);
    checkBlas(id == 0);
    // Progress for a person waiting: worker 0's only (the others load the same).
    const bool progress = id == 0 && store->check({keys::kJobQuiet}) && getString(*store, keys::kJobQuiet) == "0";
    std::function<void(const std::string&)> say;
    if (progress) say = [](const std::string& line) { std::printf("morph: worker 0: %s\n", line.c_str()), std::fflush(stdout); };
    DataPair data = loadData(job, say);
    const int64_t steps = job.resolveSteps(data.train->size());

    LocalCommunicator none;
    // A pipeline worker holds no layer until it knows its stage.
    const bool stage_local = getString(*store, keys::kJobStageLocal) == "1";
    // The executor: a data-parallel worker's, or a pipeline stage's (placed
    // when its generation forms).
    std::unique_ptr<VnExecutor> vn_ex;
    std::unique_ptr<StageExecutor> stage_ex;
    if (stage_local) stage_ex = std::make_unique<StageExecutor>(job, steps, *data.train);
    else vn_ex = std::make_unique<VnExecutor>(job, steps, *data.train, none);
    Executor& tr = stage_local ? static_cast<Executor&>(*stage_ex) : *vn_ex;
    StepCore& core = tr.core();
    const std::string resume = getString(*store, keys::kJobResume);
    std::string resume_ckpt;  // stage-local: the checkpoint whose layers this worker loads once placed
    if (!resume.empty()) {
      if (stage_local) resume_ckpt = resumeStepFrom(resume, tr, id == 0, progress);
      else resumeFrom(resume, tr, id == 0, progress);
    }
    // Whoever gets here first tells the manager where the job starts and ends
    // (every worker computes the same values; start_step goes first, so
    // whoever sees job/steps finds it).
    auto createOnce = [&](const std::string& key, const std::string& v) {
      store->compareSet(key, {}, std::vector<uint8_t>(v.begin(), v.end()));
    };
    if (!store->check({keys::kJobSteps})) {
      createOnce(keys::kJobStartStep, std::to_string(core.nextStep()));
      createOnce(keys::kJobSteps, std::to_string(steps));
    }
    auto fs = checkpointFileSystem();
    std::unique_ptr<CheckpointWriter> ckpt;
    std::optional<CheckpointKeeper> keeper;  // counts failed checkpoint writes of `ckpt`
    // What the manager checks this worker against (same build, settings and
    // data as the job's other workers).
    setString(*store, keys::workerFingerprint(id), runtimeFingerprint(&data, &job.model).dump());
    // Data loaded and model built: from now on this worker can join a
    // generation within milliseconds.
    setString(*store, keys::workerReady(id), "1");
    ready = true;
    const double hb_timeout = hb.at("timeout").get<double>();
    double last_commit = 0, longest_gap = 0;  // between two committed steps here (seconds)
    // Process groups of past generations: never destroyed, since their threads
    // may still be blocked on a dead peer until Gloo's own timeout.
    std::vector<std::unique_ptr<Communicator>> comms;
    // Nor at exit: a group whose work was abandoned blocks its destructor
    // until Gloo's own timeout (a ceiling of minutes now, see "Deadlines"),
    // and the process ends anyway.
    struct LeaveGroupsAtExit {
      std::vector<std::unique_ptr<Communicator>>& groups;
      ~LeaveGroupsAtExit() {
        for (auto& g : groups) (void)g.release();
      }
    } leave_groups_at_exit{comms};

    int64_t gen = -1;
    json last_line;  // metrics of the last step this worker committed
    HeldRange held;  // pipeline: the layers this worker holds at its committed step
    // Reports the committed step when leaving a generation (ready or left).
    auto report = [&](const std::string& what) {
      if (!last_line.is_null()) setString(*store, keys::genReport(gen, "line", id), last_line.dump());
      if (stage_ex) setString(*store, keys::genReport(gen, "held", id), std::to_string(held.lo) + "," + std::to_string(held.hi));
      setString(*store, keys::genReport(gen, what, id), std::to_string(core.nextStep()));
      store->add(keys::kEvents, 1);  // wakes the manager's membership check
    };
    while (true) {
      // Wait for a generation newer than ours.
      json plan;
      while (true) {
        if (store->check({keys::kJobFinished})) return 0;
        if (store->check({keys::kGenCurrent})) {
          int64_t g = getInt(*store, keys::kGenCurrent);
          if (g > gen) {
            plan = json::parse(getString(*store, keys::genPlan(g)));
            gen = g;
            break;
          }
        }
        if (g_leave_requested) return 0;  // not in a generation: nothing to hand over
        if (store->check({keys::workerRefused(id)})) throw InputError(getString(*store, keys::workerRefused(id)));
        // Sleeps in the store until the next generation's plan appears (the
        // manager writes it before gen/current), or kUnplacedWait.
        const int64_t cur = store->check({keys::kGenCurrent}) ? getInt(*store, keys::kGenCurrent) : -1;
        try {
          store->wait({keys::genPlan(std::max(cur, gen) + 1)}, kUnplacedWait);
        } catch (const StoreError&) {
          // Timed out (a lost connection fails the next call).
        }
      }
      const auto& members = plan.at("members");
      int rank = -1;
      for (size_t r = 0; r < members.size(); ++r)
        if (members[r].get<int64_t>() == id) rank = static_cast<int>(r);
      if (rank < 0) {
        for (const auto& r : plan.at("released"))
          if (r.get<int64_t>() == id) return 0;  // asked to leave (resize down)
        continue;                                // not placed yet: wait for the next one
      }
      const int world = static_cast<int>(members.size());
      const std::string gkey = keys::gen(gen);
      GlooOptions go;
      go.interface_addr = iface;
      // Deadlines from what this worker measured (docs/distributed.md, "Deadlines").
      const double deadline = job.collective_timeout > 0 ? job.collective_timeout
                                                         : std::max(kCollectiveFloorS, kCollectiveFactor * longest_gap);
      go.timeout = std::chrono::milliseconds(
          static_cast<int64_t>(1000 * std::max(kGlooCeilingS, kGlooCeilingFactor * deadline)));
      go.should_abort = [&store, gkey] { return store->check({gkey + "/abort"}); };
      auto peers = std::make_shared<PeerWatch>(store, members.get<std::vector<int64_t>>(), id, deadline, hb_timeout);
      go.keep_waiting = [peers](double waited) { return peers->keepWaiting(waited); };
      const c10::intrusive_ptr<c10d::Store> gstore = c10::make_intrusive<GenerationStore>(store, gkey + "/abort");
      try {
        const double rdv0 = nowSeconds();
        try {
          comms.push_back(makeGlooCommunicator(c10::make_intrusive<c10d::PrefixStore>(gkey + "/pg", gstore),
                                               rank, world, go));
        } catch (const std::exception& e) {
          throw CommFailure(std::string("cannot form generation ") + std::to_string(gen) + ": " + e.what());
        }
        Communicator& comm = *comms.back();
        auto range = plan.at("vn_ranges").at(rank);
        const double device_slowdown = plan.contains("slowdown") ? plan.at("slowdown").at(rank).get<double>() : 1.0;
        knob.apply(core, device_slowdown);
        if (plan.contains("pipeline")) {
          const json m = enterPipelineGeneration(*stage_ex, plan, rank, comms, gstore, gkey, go, held, resume_ckpt,
                                                 nowSeconds() - rdv0);
          setString(*store, gkey + "/morph/" + me, m.dump());
        } else {
          vn_ex->setCommunicator(&comm);
          syncState(core, comm, plan.at("source").get<int>());
          vn_ex->setVnRange(range.at(0).get<int64_t>(), range.at(1).get<int64_t>());
        }
        tr.setSpeedSlot(2 + rank);  // after the two control values below (straggler.h)
        if (stage_ex && stage_ex->placement().replica != 0) {
          keeper.reset();  // a morph moved this worker off a writing replica
          ckpt.reset();
        }
        if (job.checkpoint_every > 0 && stage_ex && stage_ex->placement().replica == 0) {
          // Each stage's first replica writes its layers; world rank 0 also
          // commits the checkpoint once every stage's share is durable.
          CheckpointShare share;
          share.attempt = getString(*store, keys::kJobCkptMarker) + "-g" + std::to_string(gen);
          share.commit = rank == 0;
          share.total_layers = static_cast<int64_t>(core.model().size());
          ckpt = std::make_unique<CheckpointWriter>(ckpt_dir, fs.get(), static_cast<int>(job.checkpoint_keep), share);
        } else if (rank == 0 && job.checkpoint_every > 0 && !ckpt) {
          ckpt = std::make_unique<CheckpointWriter>(ckpt_dir, fs.get(), static_cast<int>(job.checkpoint_keep));
        }
        if (ckpt && (!keeper || keeper->writer() != ckpt.get())) {
          keeper.reset();
          keeper.emplace(ckpt.get(), job);
        }
        bool regroup = false;
        while (core.nextStep() < steps && !regroup) {
          const double want = static_cast<double>(getInt(*store, keys::kGenWant));
          std::vector<double> control = {want, g_leave_requested ? 1.0 : 0.0};
          control.resize(2 + static_cast<size_t>(world), 0.0);  // + every member's seconds per VN
          core.setControl(std::move(control));
          knob.apply(core, device_slowdown);
          StepStats st = tr.step();
          const double committed_at = nowSeconds();
          if (last_commit > 0) longest_gap = std::max(longest_gap, committed_at - last_commit);
          last_commit = committed_at;
          // Committed on every member of this generation: all hold the same
          // reduced loss, so any member can stand in for rank 0's line.
          last_line = commitLine(job, st, world, gen);
          const bool eval_due = st.step + 1 == steps || (job.eval_every > 0 && (st.step + 1) % job.eval_every == 0);
          const bool ckpt_due = job.checkpoint_every > 0 && (st.step + 1) % job.checkpoint_every == 0;
          std::string ckerr;
          if (keeper && ckpt_due) ckerr = keeper->submit(tr.exportState());  // copied before it returns
          // A pipeline evaluates on every rank: the test set flows through the stages.
          std::optional<EvalStats> eval;
          if (stage_ex && eval_due) eval = tr.evaluate(*data.test, job.eval_batch);
          if (rank == 0) {
            if (eval_due) faultPoint("evaluate", id);
            json line = stepLine(job, steps, st, tr, *data.test, world, gen, eval ? &*eval : nullptr);
            if (!ckerr.empty()) line["checkpoint_error"] = ckerr;
            {  // the members' seconds per VN, rank order (the manager watches for stragglers)
              const auto& ctl = core.reducedControl();
              line["vn_seconds"] = std::vector<double>(ctl.begin() + 2, ctl.end());
            }
            setString(*store, keys::metrics(st.step), line.dump());
          }
          const auto& ctl = core.reducedControl();
          regroup = ctl[0] > static_cast<double>(gen) || ctl[1] > 0.0;
        }
        if (keeper) keeper->flush();
        if (regroup) {
          if (g_leave_requested) {
            report("left");
            return 0;
          }
          report("ready");
          continue;
        }
        // A pipeline rank reports its stage's layer hashes (replicas of a
        // stage must agree; the manager combines them into the model's).
        json res = {{"model_hash", vn_ex ? vn_ex->hash() : std::string()},
                    {"param_bytes", core.modelBytes()},
                    {"peak_param_bytes", core.peakModelBytes()},
                    {"peak_rss_bytes", peakRssBytes()},
                    {"bytes_reduced", comm.bytesReduced()},
                    {"generation", gen}};
        if (ckpt) res["checkpoint"] = checkpointTiming(*ckpt);
        if (stage_ex) {
          const StageExecutor& st = *stage_ex;
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
            setString(*store, keys::trace(id), ev.dump());
          }
        }
        setString(*store, keys::result(id), res.dump());
        store->wait({keys::kJobFinished}, std::chrono::hours(1));
        return 0;
      } catch (const CommFailure& e) {
        // The step in flight did not commit; report what did and regroup.
        tr.abandonStep();
        report("ready");
      } catch (const JobError& e) {
        // The job cannot go on (e.g. no checkpoint for checkpoint.max_failures
        // intervals): the manager stops every worker with this message rather
        // than regrouping without this one.
        setString(*store, keys::workerFatal(id), e.what());
        throw;
      }
    }
  } catch (const std::exception& e) {
    if (!ready) {
      // It cannot start: the manager prints why (and goes on without it).
      try {
        setString(*store, keys::workerStartError(id),
                  json({{"why", e.what()}, {"input", dynamic_cast<const InputError*>(&e) != nullptr}}).dump());
      } catch (const std::exception&) {
      }
    }
    // A store call failing because the manager is gone: the watchdog
    // prints the resume command and exits. Bad input and a job that cannot
    // go on are this worker's own findings (the manager may be gone already
    // because of them).
    if (!dynamic_cast<const InputError*>(&e) && !dynamic_cast<const JobError*>(&e)) heartbeat.waitIfManagerLost();
    throw;
  }
}

}  // namespace morph
