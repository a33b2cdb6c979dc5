// Heartbeat and PeerWatch (liveness.h).
#include "control/worker/liveness.h"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "control/checkpoints.h"
#include "control/protocol/keys.h"
#include "control/protocol/reach_report.h"
#include "control/worker/reachability.h"
#include "control/store_access.h"
#include "core/sys.h"

namespace morph {

using namespace detail;

namespace {

volatile std::sig_atomic_t g_manager_died = 0;  // kManagerDeathSignal: a local worker's manager ended
void onManagerDeath(int) { g_manager_died = 1; }

// A worker that has not reached its manager for this long (or, started by
// it, was told it died) gives the job up: it prints the newest good
// checkpoint and the command that resumes the job, and exits 3. The manager
// is the job's single point of failure (docs/distributed.md).
constexpr double kManagerLostAfterS = 10.0;
// The heartbeat thread reconnects for at most this long per try after a
// lost connection (the watchdog decides whether the manager is gone).
constexpr double kHeartbeatReconnectS = 1.0;
// The watchdog looks at the last heartbeat that got through this often.
constexpr auto kWatchdogInterval = std::chrono::milliseconds(100);
// A worker with an error in hand waits for a heartbeat to get through
// (polling this often) at most kManagerLostAfterS + kLossGraceS.
constexpr auto kLossPoll = std::chrono::milliseconds(20);
constexpr double kLossGraceS = 2.0;

}  // namespace

void installManagerDeathHandler() { std::signal(kManagerDeathSignal, onManagerDeath); }

Heartbeat::Heartbeat(Connect connect, double connect_timeout_s, int64_t id, double interval_s, std::string join)
    : connect_(std::move(connect)), key_(keys::workerHeartbeat(id)), id_(id), interval_(interval_s),
      join_(std::move(join)) {
  store_ = connect_(connect_timeout_s);
  last_ok_ = nowSeconds();
  thread_ = std::thread([this] { loop(); });
  watchdog_ = std::thread([this] { watch(); });
}

Heartbeat::~Heartbeat() {
  stop_ = true;
  thread_.join();
  watchdog_.join();
}

void Heartbeat::setLossNote(const std::string& ckpt_dir, const std::string& command) {
  std::lock_guard<std::mutex> l(mu_);
  ckpt_dir_ = ckpt_dir;
  command_ = command;
}

void Heartbeat::waitIfManagerLost() const {
  const double since = nowSeconds();
  while (!stop_ && last_ok_.load() < since && nowSeconds() - since < kManagerLostAfterS + kLossGraceS)
    std::this_thread::sleep_for(kLossPoll);
}

void Heartbeat::loop() {
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

void Heartbeat::watch() {
  while (!stop_) {
    if (g_manager_died) lost("the manager process ended");
    const double silent = nowSeconds() - last_ok_.load();
    if (silent > kManagerLostAfterS) lost("no answer from the manager at " + join_ + " for " +
                                          std::to_string(static_cast<int>(silent)) + " s");
    std::this_thread::sleep_for(kWatchdogInterval);
  }
}

void Heartbeat::lost(const std::string& why) {
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

bool PeerWatch::keepWaiting(double waited) {
  double now = nowSeconds();
  // Probes start before the deadline: a peer that refuses or ignores a
  // connect is cut off, not busy (the kernel answers for a busy process).
  if (waited >= std::min(deadline_, kProbeAfterS) && now - last_probe_ >= kProbeEveryS) {
    last_probe_ = now;
    probe(/*refused_counts=*/false);  // a refusal may be a death: heartbeats tell, after the deadline
    now = nowSeconds();
  }
  if (waited < deadline_) return true;
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
  // Every peer still heart-beats: one that refuses connects is cut off
  // (a firewall that rejects), not dead.
  probe(/*refused_counts=*/true);
  if (!first && now - last_note_ > deadline_) {
    last_note_ = now;
    std::fprintf(stderr,
                 "morph: worker %lld: a collective has waited %.0f s (deadline %.0f s); every member still "
                 "heart-beats, so it waits on\n",
                 static_cast<long long>(me_), waited, deadline_);
  }
  return true;
}

void PeerWatch::probe(bool refused_counts) {
  const std::vector<int64_t> cut = unreachablePeers(*store_, peers_, me_, refused_counts);
  if (cut == reported_) return;
  reported_ = cut;
  setString(*store_, keys::workerReach(me_), ReachReport{gen_, cut}.toJson().dump());
  if (cut.empty()) return;
  std::string ids;
  for (int64_t p : cut) ids += (ids.empty() ? "" : ", ") + std::to_string(p);
  std::fprintf(stderr,
               "morph: worker %lld cannot connect to worker(s) %s, which still heart-beat: a network partition? "
               "(told the manager)\n",
               static_cast<long long>(me_), ids.c_str());
}

std::vector<int64_t> unreachablePeers(StoreClient& store, const std::vector<int64_t>& members, int64_t me,
                                      bool refused_counts) {
  std::vector<int64_t> ids, cut;
  std::vector<std::string> addrs;
  for (int64_t p : members) {
    if (p == me) continue;
    const std::string k = keys::workerProbe(p);
    ids.push_back(p);
    addrs.push_back(store.check({k}) ? getString(store, k) : std::string());  // none: unreachable
  }
  for (size_t i : unreachable(addrs, refused_counts)) cut.push_back(ids[i]);
  std::sort(cut.begin(), cut.end());
  return cut;
}

}  // namespace morph
