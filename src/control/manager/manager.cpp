// Manager: hosts the job's store (store/server.h) and coordinates its
// collaborators, which decide from the store and a Clock:
//  - Membership: registrations, heartbeats, deaths, start failures;
//  - Generations: when to regroup and into what (GenerationPlan);
//  - PipelineMorpher: a pipeline's layout and how it morphs;
//  - Outputs: metrics, status, summary;
//  - WorkerProcesses: the local worker processes (the only code that
//    forks, kills or waits).
// It never trains and never touches tensors. Protocol: docs/distributed.md.
#include <arpa/inet.h>
#include <netdb.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstring>
#include <fstream>

#include "control/checkpoints.h"
#include "control/fingerprint.h"
#include "control/manager/clock.h"
#include "control/manager/generations.h"
#include "control/manager/manager.h"
#include "control/manager/membership.h"
#include "control/manager/outputs.h"
#include "control/manager/pipeline_morph.h"
#include "control/manager/processes.h"
#include "control/protocol/job_key_policy.h"
#include "control/protocol/keys.h"
#include "control/run_setup.h"
#include "control/store_access.h"
#include "core/error.h"
#include "core/job_spec.h"
#include "status/status_server.h"
#include "store/local_store.h"
#include "store/server.h"

namespace morph {

using namespace detail;

namespace {

// The manager's loop sleeps until a worker writes to the store (heartbeats
// aside) or this long passes: deadlines, heartbeats and local children's
// exits are looked at on this clock (docs/distributed.md, "Deadlines").
constexpr auto kIdleWait = std::chrono::milliseconds(100);
// A store call of the manager's own (a read that waits for its key) fails
// after this long.
constexpr auto kManagerStoreTimeout = std::chrono::seconds(60);

class Manager {
 public:
  Manager(const RunOptions& o, const JobSpec& job, const std::string& job_text)
      : o_(o), job_(job), job_text_(job_text), pipeline_(o, job) {}
  // Phases: checkOptions, publishJob, superviseGenerations, finish.
  int run();

 private:
  void checkOptions();
  void hostStore();
  void publishJob();
  void superviseGenerations();
  // A worker died: Membership's record, then Generations' regroup.
  void markDead(int64_t id, const std::string& why);
  // The job cannot go on: JobError naming the last committed step and the
  // newest good checkpoint, every local worker stopped.
  [[noreturn]] void noWorkerLeft(const std::string& why);
  std::string resumeCommand() const;

  const RunOptions& o_;
  const JobSpec& job_;
  const std::string& job_text_;
  std::string dir_;
  SystemClock clock_;
  std::unique_ptr<store::StoreServer> server_;
  c10::intrusive_ptr<c10d::Store> store_;  // the manager's own view of the store (store::LocalStore)
  int port_ = 0;
  std::string token_file_;  // OUT/token: what local workers prove
  std::string join_host_;   // how local workers reach the store
  double hb_interval_ = 0, hb_timeout_ = 0;  // --heartbeat-interval, --heartbeat-timeout (seconds)
  json fingerprint_;  // what every worker of an exact job must match (runtimeFingerprint)
  int spawned_ = 0;   // local workers started at the beginning (--spawn, default --workers)
  PipelineMorpher pipeline_;
  std::unique_ptr<WorkerProcesses> processes_;
  std::unique_ptr<Membership> membership_;
  std::unique_ptr<Generations> generations_;
  std::unique_ptr<Outputs> outputs_;
};

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
  pipeline_.setUp(o_.workers);
  if (!pipeline_.pipelined()) evenRanges(job_.virtual_nodes, pipeline_.target());  // validates the worker count
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
  processes_ = std::make_unique<LocalProcesses>(o_.self_exe, join_host_ + ":" + std::to_string(port_), token_file_);
  membership_ = std::make_unique<Membership>(
      *processes_, Membership::Options{hb_interval_, hb_timeout_, job_.reduce_mode == ReduceMode::kExact, spawned_},
      fingerprint_);
  generations_ = std::make_unique<Generations>(o_, job_, *membership_, pipeline_, server_->table());
  outputs_ = std::make_unique<Outputs>(o_, job_, dir_);
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
  setString(*store_, keys::kJobStageLocal, pipeline_.pipelined() ? "1" : "0");
  setString(*store_, keys::kJobResume, o_.resume.empty() ? "" : std::filesystem::absolute(o_.resume).string());
  setString(*store_, keys::kJobWspReplay, o_.replay_text);
  setString(*store_, keys::kJobHeartbeat, json({{"interval", hb_interval_}, {"timeout", hb_timeout_}}).dump());
  // --quiet: worker 0 prints no progress (data and checkpoint loading) either.
  setString(*store_, keys::kJobQuiet, o_.quiet ? "1" : "0");
  generations_->writeWant(*store_, 0);
  // What a worker prints when it loses the manager (docs/distributed.md).
  setString(*store_, keys::kJobResumeCommand, resumeCommand());
  outputs_->setStatusPage(startStatusPage(o_.status, {"", 0, readToken(token_file_), job_.name, 0,
                                                      job_.checkpoint_every > 0 ? checkpointDir(o_, job_) : "",
                                                      false}));
  std::printf("morph: manager on port %d, %d workers (%d local)\n", port_, o_.workers, spawned_);
  if (spawned_ < o_.workers)
    std::printf("morph: waiting for %d more: morph worker --join %s:%d --token-file %s\n", o_.workers - spawned_,
                o_.host == "0.0.0.0" ? "THIS_HOST" : o_.host.c_str(), port_, token_file_.c_str());
  std::fflush(stdout);
  membership_->spawn(spawned_);
  if (spawned_ > 0)
    std::printf("morph: started %d local workers (%d forked from the worker zygote)\n", spawned_, processes_->forked());
  std::fflush(stdout);
}

int Manager::run() {
  checkOptions();
  publishJob();
  try {
    superviseGenerations();
    return outputs_->finish(*store_, *generations_, *membership_, pipeline_);
  } catch (const NoWorkerLeft& e) {
    noWorkerLeft(e.what());
  }
}

void Manager::noWorkerLeft(const std::string& why) {
  const std::string cdir = checkpointDir(o_, job_);
  const int64_t ck = newestGoodCheckpoint(cdir);
  std::string ckmsg = ck >= 0 ? cdir + "/" + checkpointDirName(ck) + " (resume with --resume " + cdir + ")" : "none";
  membership_->killAll();
  throw JobError(why + "; the last committed step is " + std::to_string(outputs_->lastCommitted()) +
                 ", the newest good checkpoint " + ckmsg);
}

void Manager::markDead(int64_t id, const std::string& why) {
  const bool all_steps_done = outputs_->allStepsDone(*store_);
  if (membership_->markDead(*store_, id, why) == Membership::Dead::kPlaceable)
    generations_->onDeath(*store_, clock_, id, why, all_steps_done);
}

// Phase 3: generation after generation until every member still alive
// posted its result: registrations, requests, deaths, heartbeats and
// metrics are looked at each time a worker writes (or kIdleWait passes).
void Manager::superviseGenerations() {
  c10d::Store& store = *store_;
  Generations& g = *generations_;
  Membership& m = *membership_;
  const double start = clock_.now();
  while (true) {
    // Every worker write (registrations, ready, left, metrics, requests)
    // after this count wakes the wait at the end of the loop.
    const int64_t seen = server_->table().writes();
    m.pollRegistrations(store, clock_);
    m.spawn(g.pollResizeRequests(store));
    g.pollSlowRequests(store);
    g.watchPartitions(store, clock_);
    for (const auto& d : m.pollChildren(store, g.current())) markDead(d.id, d.why);
    for (const auto& d : m.pollHeartbeats(store, clock_, g.current())) markDead(d.id, d.why);
    outputs_->pollMetrics(store, server_->table(), [&](const json& line) { g.onCommitted(store, clock_, line); });
    outputs_->updateStatus(store, clock_, g.status());
    if (g.current() < 0) {
      g.maybeStart(store, clock_, start);
    } else if (g.inTransition()) {
      const Generations::Answered a = g.transitionComplete(store, clock_);
      for (const auto& d : a.stuck) markDead(d.id, d.why);
      if (a.complete) g.publish(store, outputs_->nextStep(), outputs_->stepsLeft());
    } else {
      g.watchMembership(store, clock_, outputs_->allStepsDone(store), outputs_->stepsLeft());
    }
    if (outputs_->resultsPosted(store, g)) return;
    if (!m.anyone() && g.current() >= 0) throw NoWorkerLeft("no worker is left");
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

}  // namespace

int runManager(const RunOptions& o, const JobSpec& job, const std::string& job_text) {
  return Manager(o, job, job_text).run();
}

}  // namespace morph
