#include "control/manager/membership.h"

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>

#include "control/fingerprint.h"
#include "control/protocol/keys.h"
#include "control/protocol/message.h"
#include "control/protocol/worker_label.h"
#include "control/store_access.h"
#include "core/error.h"
#include "store/table.h"

namespace morph {

using namespace detail;

void Membership::spawn(int count) {
  for (int i = 0; i < count; ++i) unregistered_pids_.insert(procs_.start());
}

void Membership::pollRegistrations(c10d::Store& store, const Clock& clock) {
  const int64_t n = store.add(keys::kNextWorkerId, 0);
  const double now = clock.now();
  for (int64_t id = 0; id < n; ++id) {
    if (workers_.count(id)) continue;
    const std::string k = keys::workerPid(id);
    if (!store.check({k})) {
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
    const std::string pid_text = getString(store, k);
    pid_t pid = static_cast<pid_t>(parseStoreInt(k, pid_text));
    if (unregistered_pids_.erase(pid)) w.pid = pid;
    w.hb_time = now;  // watched by heartbeat from now on
    if (store.check({keys::workerLabel(id)})) {  // posted before the pid
      try {
        w.label = WorkerLabel::decode(getString(store, keys::workerLabel(id))).text;
      } catch (const MessageError& e) {  // only a worker that bypassed `--label`'s check writes one
        std::fprintf(stderr, "morph: worker %lld: label ignored: %s\n", static_cast<long long>(id), e.what());
      }
    }
    workers_[id] = w;
  }
  bool local_alive = !unregistered_pids_.empty();
  for (auto& [id, w] : workers_) local_alive = local_alive || (w.alive && w.pid > 0);
  for (auto& [id, w] : workers_) {
    if (!w.alive || w.placeable) continue;
    if (store.check({keys::workerStartError(id)})) {
      // It could not start (bad data, resume folder, checkpoint folder...)
      // and said why before exiting.
      const json e = json::parse(getString(store, keys::workerStartError(id)), nullptr, false);
      const std::string why = e.is_object() ? e.value("why", std::string("?")) : std::string("?");
      w.alive = false;
      if (w.pid > 0) procs_.kill(w.pid);
      startFailed(id, why, e.is_object() && e.value("input", false));
      continue;
    }
    if (!store.check({keys::workerReady(id)})) continue;
    // The data every worker must match is a local worker's (it reads this
    // host's files) when there are any: a remote worker waits for it.
    if (!fingerprint_.contains("data") && o_.spawned > 0 && local_alive && w.pid <= 0) continue;
    w.placeable = true;
    admit(store, id, w);
  }
}

void Membership::startFailed(int64_t id, const std::string& why, bool input) {
  const std::string who = id >= 0 ? "worker " + std::to_string(id) : std::string("a local worker");
  std::fprintf(stderr, "morph: %s could not start: %s\n", who.c_str(), why.c_str());
  std::fflush(stderr);
  if (started_) return;  // a joiner: the job goes on as it is
  start_failures_.push_back(who + ": " + why);
  start_failures_input_ = start_failures_input_ && input;
}

// A worker that loaded its data posts its fingerprint: in an exact job it
// must match this build, these settings and the first worker's data, or it
// is refused (it exits 2 with the reason); the job goes on without it.
void Membership::admit(c10d::Store& store, int64_t id, WorkerInfo& w) {
  const json got = store.check({keys::workerFingerprint(id)})
                       ? json::parse(getString(store, keys::workerFingerprint(id)), nullptr, false)
                       : json();
  if (!fingerprint_.contains("data") && got.is_object() && got.contains("data")) fingerprint_["data"] = got.at("data");
  const std::vector<std::string> diff = fingerprintDifferences(fingerprint_, got.is_object() ? got : json::object());
  if (diff.empty()) return;
  std::string why;
  for (const auto& d : diff) why += (why.empty() ? "" : "; ") + d;
  if (!o_.exact) {
    std::fprintf(stderr, "morph: warning: worker %lld differs from this job's (float mode, admitted): %s\n",
                 static_cast<long long>(id), why.c_str());
    return;
  }
  std::fprintf(stderr, "morph: refusing worker %lld: it differs from this job's: %s\n", static_cast<long long>(id),
               why.c_str());
  setString(store, keys::workerRefused(id),
            "this worker differs from the job's (exact mode needs the same on every worker): " + why);
  // Unlike a worker that cannot start, a refused one leaves its slot open:
  // generation 0 waits for a matching worker (kStartDeadlineS).
  w.placeable = false;
  w.alive = false;
}

Membership::Dead Membership::markDead(c10d::Store& store, int64_t id, const std::string& why) {
  WorkerInfo& w = workers_[id];
  if (!w.alive) return Dead::kAlready;
  w.alive = false;
  if (w.pid > 0) procs_.kill(w.pid);
  // A worker that found the job cannot go on said why before it exited.
  const std::string fatal = keys::workerFatal(id);
  if (store.check({fatal})) throw NoWorkerLeft("worker " + std::to_string(id) + ": " + getString(store, fatal));
  if (!w.placeable) {
    // Never ready: a start-up failure (its own reason, if it posted one).
    const std::string se = keys::workerStartError(id);
    const json e = store.check({se}) ? json::parse(getString(store, se), nullptr, false) : json();
    startFailed(id, e.is_object() ? e.value("why", why) : why, e.is_object() && e.value("input", false));
    return Dead::kNeverReady;
  }
  return Dead::kPlaceable;
}

std::vector<Membership::Death> Membership::pollChildren(c10d::Store& store, int64_t gen) {
  std::vector<Death> deaths;
  while (const auto ended = procs_.reap()) {
    const pid_t pid = ended->pid;
    const int status = ended->status;
    const bool bad_input = WIFEXITED(status) && WEXITSTATUS(status) == 2;
    int64_t id = -1;
    for (auto& [wid, w] : workers_)
      if (w.pid == pid) id = wid;
    const bool unregistered = unregistered_pids_.erase(pid) > 0;
    if (bad_input) {
      killAll();
      procs_.waitAll();
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
    if (gen >= 0 && store.check({keys::genReport(gen, "left", id)})) {
      workers_[id].alive = false;  // left gracefully; the transition handles it
    } else {
      deaths.push_back({id, WIFEXITED(status) ? "exited with code " + std::to_string(WEXITSTATUS(status))
                                              : "was killed by signal " + std::to_string(WTERMSIG(status))});
    }
  }
  return deaths;
}

std::vector<Membership::Death> Membership::pollHeartbeats(c10d::Store& store, const Clock& clock, int64_t gen) {
  std::vector<Death> deaths;
  const double now = clock.now();
  if (now - last_hb_poll_ < o_.hb_interval) return deaths;
  last_hb_poll_ = now;
  for (auto& [id, w] : workers_) {
    if (!w.alive) continue;
    const std::string k = keys::workerHeartbeat(id);
    if (store.check({k})) {
      std::string v = getString(store, k);
      if (v != w.hb) {
        w.hb = v;
        w.hb_time = now;
        continue;
      }
    }
    if (now - w.hb_time > o_.hb_timeout) {
      // A worker that left gracefully stops its heartbeat too.
      if (gen >= 0 && store.check({keys::genReport(gen, "left", id)})) {
        w.alive = false;
      } else {
        deaths.push_back({id, "missed its heartbeats for " + std::to_string(now - w.hb_time) + " s"});
      }
    }
  }
  return deaths;
}

void Membership::killAll() {
  for (auto& [id, w] : workers_)
    if (w.pid > 0 && w.alive) procs_.kill(w.pid);
  for (pid_t p : unregistered_pids_) procs_.kill(p);
}

void Membership::waitLocal() {
  for (auto& [id, w] : workers_)
    if (w.pid > 0 && w.alive) procs_.wait(w.pid);
  procs_.retire();
}

void Membership::forgetDeparted(store::Table& table, c10d::Store& store) {
  std::set<int64_t> gone;
  for (auto& [id, w] : workers_) {
    if (w.alive || forgotten_.count(id)) continue;
    if (gone_before_.count(id)) {
      table.erasePrefix(keys::workerPrefix(id));
      store.deleteKey(keys::slow(id));  // `morph slow`'s request for a departed worker
      forgotten_.insert(id);
    } else {
      gone.insert(id);
    }
  }
  gone_before_ = std::move(gone);
}

int Membership::aliveOrStarting() const {
  int alive = static_cast<int>(unregistered_pids_.size());
  for (auto& [id, w] : workers_) alive += w.alive;
  return alive;
}

bool Membership::anyone() const {
  bool anyone = !unregistered_pids_.empty();
  for (auto& [id, w] : workers_) anyone = anyone || w.alive;
  return anyone;
}

std::vector<int64_t> Membership::waiting(const std::vector<int64_t>& members) const {
  std::vector<int64_t> out;
  for (auto& [id, w] : workers_)
    if (w.alive && w.placeable && std::find(members.begin(), members.end(), id) == members.end()) out.push_back(id);
  return out;
}

}  // namespace morph
