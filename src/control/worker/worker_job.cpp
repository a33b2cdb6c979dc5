// WorkerJob (worker_job.h).
#include "control/worker/worker_job.h"

#include <csignal>
#include <fstream>
#include <functional>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "control/after_step.h"
#include "control/checkpoints.h"
#include "control/fault_seams.h"
#include "control/fingerprint.h"
#include "control/protocol/keys.h"
#include "control/protocol/message.h"
#include "control/protocol/reach_report.h"
#include "control/run_setup.h"
#include "control/store_access.h"
#include "control/worker/generation_entry.h"
#include "control/worker/liveness.h"
#include "core/error.h"
#include "core/memory_estimate.h"
#include "core/sys.h"
#include "store/abortable_store.h"
#include "wsp/wsp_worker.h"

namespace morph {

using namespace detail;

namespace {

volatile std::sig_atomic_t g_leave_requested = 0;
void onTerm(int) { g_leave_requested = 1; }

// An unplaced worker waits for the next generation's plan this long per
// store round trip (then looks at job/finished, a leave request, a refusal).
constexpr auto kUnplacedWait = std::chrono::milliseconds(250);
// A worker set aside for a partition probes the members this often.
constexpr double kAsideProbeEveryS = 1.0;
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
// After posting its result, a worker waits this long for job/finished.
constexpr auto kFinishedWait = std::chrono::hours(1);
// A process group's rendezvous looks for its members' keys (and the
// generation's abort flag) this often.
constexpr auto kRendezvousPoll = std::chrono::milliseconds(2);

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

}  // namespace

WorkerJob::WorkerJob(Registration& reg)
    : reg_(reg), store_(reg.store), id_(reg.id),
      job_(parseJob(getString(*store_, keys::kJobText), getString(*store_, keys::kJobOrigin),
                    splitLines(getString(*store_, keys::kJobOverrides)))),
      leave_groups_at_exit_{comms_} {}

void WorkerJob::FaultProbe::atPoint(const char* point, int64_t step) {
  faultPoint(std::string(point) + "@" + std::to_string(step), id);
}

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
  // A replay of a run that lost a worker starts where its last generation did.
  if (job_.sync_mode == SyncMode::kWsp && vn_ex_) replayStart();
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
  if (job_.sync_mode == SyncMode::kWsp && vn_ex_) wsp_start_ = snapshotCheckpoint(tr_->exportState());
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
    probeWhileAside(cur);
    // Sleeps in the store until the next generation's plan appears (the
    // manager writes it before gen/current), or kUnplacedWait.
    try {
      store_->wait({keys::genPlan(std::max(cur, gen_) + 1)}, kUnplacedWait);
    } catch (const StoreError&) {
      // Timed out (a lost connection fails the next call).
    }
  }
}

// A worker the manager set aside for a partition (its last ReachReport
// named peers, or is older than the current generation) probes the
// current generation's members every kAsideProbeEveryS and reports
// what it finds; once the list is empty, the manager admits it again
// (docs/distributed.md, "Partitions").
void WorkerJob::probeWhileAside(int64_t cur) {
  const double now = nowSeconds();
  if (cur < 0 || now - last_aside_probe_ < kAsideProbeEveryS) return;
  const std::string k = keys::workerReach(id_);
  if (!store_->check({k})) return;  // never reported a partition
  const ReachReport mine = ReachReport::fromJson(json::parse(getString(*store_, k), nullptr, false));
  if (mine.unreachable.empty() && mine.generation >= cur) return;  // said already
  last_aside_probe_ = now;
  const ReachReport now_seen{cur, unreachablePeers(*store_, readPlan(*store_, cur).members, id_, /*refused_counts=*/true)};
  if (now_seen.unreachable == mine.unreachable && now_seen.generation == mine.generation) return;
  setString(*store_, k, now_seen.toJson().dump());
  if (now_seen.unreachable.empty())
    std::fprintf(stderr, "morph: worker %lld reaches every member of generation %lld again\n",
                 static_cast<long long>(id_), static_cast<long long>(cur));
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
  auto peers = std::make_shared<PeerWatch>(store_, plan.members, id_, gen_, deadline, hb_timeout_);
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

void WorkerJob::restoreWsp() {
  const std::string key = keys::genWspRestore(gen_);
  if (!store_->check({key})) return;  // the job's first generation
  const int64_t step = getInt(*store_, key);
  PosixFileSystem fs;
  if (step < 0) tr_->importState(*wsp_start_);
  else tr_->importState(loadCheckpoint(ckpt_dir_ + "/" + checkpointDirName(step), fs));
}

void WorkerJob::replayStart() {
  if (!store_->check({keys::kJobWspReplay})) return;
  const std::string text = getString(*store_, keys::kJobWspReplay);
  const std::optional<RestoreRecord> r =
      RestoreRecord::fromJson(json::parse(text.substr(0, text.find('\n')), nullptr, false), "--replay");
  if (!r || r->checkpoint.empty()) return;
  PosixFileSystem fs;
  const CheckpointData ck = loadCheckpoint(r->checkpoint, fs);
  if (!ck.meta.contains("wsp") || ck.meta.at("wsp").value("clock", int64_t{-1}) != r->clock)
    throw InputError("--replay: " + r->checkpoint + " is not the WSP checkpoint of clock " + std::to_string(r->clock) +
                     " that the replayed run restored");
  tr_->importState(ck);
}

bool WorkerJob::trainWsp(const Placement& p) {
  if (!vn_ex_ || !wsp_start_) throw JobError("a WSP job (sync.mode = \"wsp\") runs data-parallel workers only");
  std::optional<ReplayPlan> replay;
  if (store_->check({keys::kJobWspReplay})) {
    const std::string text = getString(*store_, keys::kJobWspReplay);
    if (!text.empty()) replay = ReplayPlan::parse(text, "--replay", p.world);
  }
  restoreWsp();
  if (core_->nextStep() % job_.wave != 0 && core_->nextStep() != steps_)
    throw InputError("a WSP job resumes at a clock (a multiple of sync.wave = " + std::to_string(job_.wave) +
                     " steps); this checkpoint is of step " + std::to_string(core_->nextStep()));
  core_->setControl({});
  tr_->setSpeedSlot(-1);  // no straggler re-plans: WSP is how this job absorbs slow workers
  WspWorker::CheckpointSink sink;
  if (keeper_)  // rank 0 writes the servers' checkpoints (docs/wsp.md)
    sink = [this](const CheckpointData& d) {
      faultPoint("checkpoint@" + std::to_string(d.step - 1), id_);
      keeper_->submit(d);  // copied before it returns; a failure is reported (stderr) and counted
    };
  auto w = std::make_unique<WspWorker>(job_, steps_, *vn_ex_, *p.comm, replay ? &*replay : nullptr, sink);
  try {
    w->run([&](const StepStats& st) {
      last_line_ = commitLine(job_, st, p.world, gen_);
      if (p.rank != 0) return;
      // Rank 0's own minibatches (its loss; evaluations of its local weights,
      // the last one of the final model).
      json line = stepLine(job_, steps_, st, *tr_, *data_.test, p.world, gen_);
      setString(*store_, keys::metrics(st.step), line.dump());
    });
  } catch (const CommFailure&) {
    // What this member knew of the generation's pushes (its clock, and the
    // waves of each VW its shard received): the manager reports what the
    // regroup loses. Rank 0's checkpoint in flight lands first, so that
    // the manager chooses among settled ones.
    setString(*store_, keys::genReport(gen_, "wsp", id_),
              json({{"rank", p.rank}, {"clock", w->clock()}, {"received", w->received()}}).dump());
    if (keeper_) keeper_->flush();
    abandoned_wsp_.push_back(w.release());
    throw;
  }
  wsp_result_ = w->result();
  return false;
}

bool WorkerJob::trainLoop(const Placement& p) {
  if (job_.sync_mode == SyncMode::kWsp) return trainWsp(p);
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
    const AfterStep due = dueAfterStep(job_, steps_, st.step);
    std::string ckerr;
    if (keeper_ && due.checkpoint) {
      faultPoint("checkpoint@" + std::to_string(st.step), id_);
      ckerr = keeper_->submit(tr_->exportState());  // copied before it returns
    }
    // A pipeline evaluates on every rank: the test set flows through the stages.
    std::optional<EvalStats> eval;
    if (stage_ex_ && due.evaluate) eval = tr_->evaluate(*data_.test, job_.eval_batch);
    if (p.rank == 0) {
      if (due.evaluate) faultPoint("evaluate", id_);
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
  if (!wsp_result_.is_null()) res["wsp"] = wsp_result_;
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

}  // namespace morph
