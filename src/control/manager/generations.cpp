#include "control/manager/generations.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "control/checkpoints.h"
#include "control/protocol/keys.h"
#include "control/run_setup.h"
#include "control/protocol/member_report.h"
#include "control/protocol/message.h"
#include "control/protocol/resize_request.h"
#include "control/store_access.h"
#include "core/error.h"
#include "core/job_spec.h"
#include "plan/vn_shares.h"
#include "store/table.h"
#include "wsp/wsp_log.h"
#include "wsp/wsp_recovery.h"

namespace morph {

using json = nlohmann::json;
using namespace detail;

Generations::Generations(const RunOptions& o, const JobSpec& job, Membership& membership, PipelineMorpher& pipeline,
                         store::Table& table)
    : o_(o), job_(job), m_(membership), pm_(pipeline), table_(table), target_(pipeline.target()),
      straggler_({job.straggler_factor, job.straggler_steps, job.straggler_replan}),
      pstraggler_({job.straggler_factor, job.straggler_steps, job.straggler_replan}) {}

bool Generations::isMember(int64_t id) const {
  return std::find(members_.begin(), members_.end(), id) != members_.end();
}

void Generations::onDeath(c10d::Store& store, const Clock& clock, int64_t id, const std::string& why,
                          bool all_steps_done) {
  if (!isMember(id) || all_steps_done) return;
  std::fprintf(stderr, "morph: worker %lld %s\n", static_cast<long long>(id), why.c_str());
  // Survivors blocked on the dead peer bail out of their collectives.
  setString(store, keys::genAbort(gen_), "1");
  if (!in_transition_) startTransition(clock, "failure");
}

void Generations::onCommitted(c10d::Store& store, const Clock& clock, const json& line) {
  if (line.contains("unix_time")) {
    // Everything between two commits: steps, evaluations, snapshots.
    const double t = line.at("unix_time").get<double>();
    if (last_commit_unix_ > 0) longest_gap_ = std::max(longest_gap_, t - last_commit_unix_);
    last_commit_unix_ = t;
  }
  watchStragglers(store, clock, line);
  if (pending_gen_ >= 0 && line.at("generation").get<int64_t>() >= pending_gen_) {
    pending_resize_["seconds"] = clock.now() - pending_since_;
    if (pending_resize_.contains("to_shape")) {
      // What the members measured entering the generation: the slowest
      // member's rendezvous, state movement and checkpoint load, and every
      // byte received.
      double rdv = 0, move = 0, load = 0;
      int64_t bytes = 0;
      for (int64_t id : members_) {
        const std::string k = keys::genReport(pending_gen_, "morph", id);
        if (!store.check({k})) continue;
        const json m = json::parse(getString(store, k), nullptr, false);
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
}

json Generations::status() const {
  int alive = 0;
  json labels = json::object();  // live workers' `morph worker --label`, by id
  for (auto& [id, w] : m_.workers()) {
    alive += w.alive;
    if (w.alive && !w.label.empty()) labels[std::to_string(id)] = w.label;
  }
  return {{"generation", gen_},   {"members", members_},          {"workers", members_.size()},
          {"alive", alive},       {"target_workers", target_},    {"in_transition", in_transition_},
          {"resizes", resizes_},  {"vn_shares", vn_shares_},      {"labels", labels}};
}

// Generation 0 waits for target_ workers, less those that could not start:
// a job whose other workers can start goes on without the failed ones (a
// replacement may join later, as any joiner does); a job none of whose
// workers can start stops (exit 2 when each failed on bad input, else 3).
void Generations::maybeStart(c10d::Store& store, const Clock& clock, double since) {
  int placeable = 0, pending = static_cast<int>(m_.unregistered() + m_.unannounced());
  if (pm_.planWorkers().empty()) {
    for (auto& [id, w] : m_.workers()) {
      placeable += w.alive && w.placeable;
      pending += w.alive && !w.placeable;
    }
  } else {  // the plan's own slots
    for (int slot : pm_.planWorkers()) {
      auto it = m_.workers().find(slot);
      placeable += it != m_.workers().end() && it->second.alive && it->second.placeable;
    }
  }
  const int failed = static_cast<int>(m_.startFailures().size());
  // A plan file's slots and a pipeline's shape need exactly their workers.
  const bool exact = !pm_.planWorkers().empty() || pm_.pipelined();
  const int want = exact ? target_ : std::max(1, target_ - failed);
  if (placeable >= want) {
    if (placeable < target_)
      std::printf("morph: starting with %d of %d workers (%d could not start; others may join later)\n", placeable,
                  target_, failed);
    publish(store, 0);
    return;
  }
  const std::string why = m_.startFailures().empty() ? std::string() : " (" + [&] {
    std::string t;
    for (const auto& f : m_.startFailures()) t += (t.empty() ? "" : "; ") + f;
    return t;
  }() + ")";
  if (placeable == 0 && pending == 0 && failed > 0 && failed >= target_) {
    m_.killAll();
    if (m_.startFailuresAllInput()) throw InputError("no worker could start" + why);
    throw JobError("no worker could start" + why);
  }
  if (failed > 0 && exact && pending == 0 && o_.spawn == o_.workers) {
    m_.killAll();
    const std::string msg = "the plan needs " + std::to_string(target_) + " workers and only " +
                            std::to_string(placeable) + " could start" + why;
    if (m_.startFailuresAllInput()) throw InputError(msg);
    throw JobError(msg);
  }
  if (clock.now() - since > kStartDeadlineS) {
    if (placeable > 0 && !exact) {
      std::printf("morph: starting with %d of %d workers: the others were not ready within %d s\n", placeable,
                  target_, static_cast<int>(kStartDeadlineS));
      publish(store, 0);
      return;
    }
    m_.killAll();
    throw JobError("workers did not start within " + std::to_string(static_cast<int>(kStartDeadlineS)) + " s" + why);
  }
}

int Generations::pollResizeRequests(c10d::Store& store) {
  const int64_t seq = store.add(keys::kResizeSeq, 0);
  if (seq == resize_seq_) return 0;
  resize_seq_ = seq;
  const std::string asked = getString(store, keys::kResizeTarget);
  ResizeRequest r;
  try {
    r = ResizeRequest::decode(asked);
  } catch (const MessageError& e) {
    std::fprintf(stderr, "morph: ignoring resize request: %s\n", e.what());
    return 0;
  }
  const int want = r.workers;
  if (want > job_.virtual_nodes) {
    std::fprintf(stderr, "morph: ignoring resize to %d workers (1..%lld)\n", want,
                 static_cast<long long>(job_.virtual_nodes));
    return 0;
  }
  std::string named;
  for (int64_t id : r.release) named += (named.empty() ? ", releasing worker(s) " : ", ") + std::to_string(id);
  std::printf("morph: resize requested: %d -> %d workers%s\n", target_, want, named.c_str());
  std::fflush(stdout);
  const int alive = m_.aliveOrStarting();
  target_ = want;
  release_first_ = r.release;
  return want > alive ? want - alive : 0;
}

void Generations::pollSlowRequests(c10d::Store& store) {
  std::map<int64_t, double> slow;
  for (auto& [id, w] : m_.workers()) {
    if (!w.alive) continue;
    const std::string k = keys::slow(id);
    if (!store.check({k})) continue;
    const std::string v = getString(store, k);
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
  for (auto it = slow_seen_.begin(); it != slow_seen_.end();)  // departed workers
    it = m_.workers().count(it->first) && m_.workers().at(it->first).alive ? std::next(it) : slow_seen_.erase(it);
  if (slow == want_.slowdown) return;
  want_.slowdown = std::move(slow);
  writeWant(store, want_.generation);
}

void Generations::writeWant(c10d::Store& store, int64_t g) {
  want_.generation = g;
  setString(store, keys::kGenWant, want_.encode());
}

// Stragglers (straggler.h): rank 0's line carries every member's seconds
// per VN; a worker off its expected speed by elastic.straggler_factor for
// elastic.straggler_steps steps (net) is re-planned around at the next
// step boundary: VN shares by measured speed, or released when the step is
// predicted faster without it. Data-parallel jobs only.
void Generations::watchStragglers(c10d::Store& store, const Clock& clock, const json& line) {
  if (in_transition_ || gen_ < 0 || !line.contains("vn_seconds") || line.at("generation").get<int64_t>() != gen_)
    return;
  const auto vs = line.at("vn_seconds").get<std::vector<double>>();
  const auto e = pm_.pipelined() ? pstraggler_.observe(vs) : straggler_.observe(vs);
  if (!e) return;
  if (pm_.pipelined()) pstraggler_.accept(*e);
  else straggler_.accept(*e);
  const bool act = job_.straggler_replan && e->changes;
  std::printf("morph: straggler at step %lld: %s%s\n", static_cast<long long>(line.at("step").get<int64_t>()),
              e->describe().c_str(),
              !job_.straggler_replan ? " (not re-planning: elastic.straggler_replan = false)"
                                     : (e->changes ? "" : " (the plan stays)"));
  std::fflush(stdout);
  if (!act) return;
  if (pm_.pipelined()) pstraggler_.engage();
  else straggler_.engage();
  if (e->drop) {
    straggler_.drop(e->worker);
    target_ = static_cast<int>(members_.size()) - 1;
  }
  straggler_note_ = {{"worker", e->worker}, {"ratio", e->ratio}, {"dropped", e->drop}, {"detected_step", line.at("step")}};
  writeWant(store, gen_ + 1);
  startTransition(clock, "straggler");
}

void Generations::startTransition(const Clock& clock, const std::string& cause) {
  in_transition_ = true;
  transition_cause_ = cause;
  transition_start_ = clock.now();
  transition_unix_ = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Every member of the current generation has died, left, or reported its
// committed step (ready).
Generations::Answered Generations::transitionComplete(c10d::Store& store, const Clock& clock) {
  Answered a;
  for (int64_t id : members_) {
    if (!m_[id].alive || partitions_.aside(id)) continue;
    if (store.check({keys::genReport(gen_, "ready", id)}) || store.check({keys::genReport(gen_, "left", id)})) continue;
    // Its heartbeats are watched (pollHeartbeats declares it dead once they
    // stop); one still heart-beating is busy (a long evaluation, step or
    // checkpoint snapshot), so it is waited for and reported, never killed.
    const double now = clock.now();
    const double deadline = regroupDeadline();
    if (now - transition_start_ > kStuckFactor * deadline) {
      char why[160];
      std::snprintf(why, sizeof why, "has not answered the generation change for %.0f s (%.0f x the deadline); "
                    "declared dead although it heart-beats", now - transition_start_, kStuckFactor);
      a.stuck.push_back({id, why});
      continue;
    }
    if (now - transition_start_ > deadline && now - m_[id].warned > deadline) {
      m_[id].warned = now;
      std::fprintf(stderr,
                   "morph: worker %lld has not answered the generation change for %.0f s but still heart-beats: "
                   "waiting for it (deadline %.0f s = max(%.0f, %.0f x the longest %.3f s between two steps))\n",
                   static_cast<long long>(id), now - transition_start_, deadline, kRegroupFloorS, kDeadlineFactor,
                   longest_gap_);
    }
    return a;
  }
  a.complete = true;  // once the stuck are declared dead
  return a;
}

namespace {

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

}  // namespace

GenerationPlan Generations::publish(c10d::Store& store, int64_t next_step, int64_t steps_left) {
  const int64_t g = gen_ + 1;
  std::vector<int64_t> survivors;
  int64_t best = -1;
  std::map<int64_t, MemberReport> reports;
  bool someone_left = false;
  for (int64_t id : members_) {
    if (store.check({keys::genReport(gen_, "left", id)})) {
      someone_left = true;
      m_[id].alive = false;  // it exits on its own
    }
    // One set aside for a partition is not a survivor: it rejoins later.
    if (!m_[id].alive || partitions_.aside(id) || !store.check({keys::genReport(gen_, "ready", id)})) continue;
    const MemberReport& r = reports[id] = readReport(store, keys::genReport(gen_, "ready", id));
    survivors.push_back(id);
    best = std::max(best, r.committed);
  }
  if (gen_ >= 0 && survivors.empty()) throw NoWorkerLeft("no worker is left");
  // Rank 0 may have lagged one step behind the others (its reduction of
  // that step failed, theirs completed): take that step's line from a
  // member that committed it.
  for (int64_t id : survivors) {
    const json& line = reports.at(id).line;
    if (line.is_null()) continue;
    const int64_t step = line.at("step").get<int64_t>();
    const std::string mk = keys::metrics(step);
    if (step >= next_step && !store.check({mk})) setString(store, mk, line.dump());  // (older ones were read)
  }
  std::vector<int64_t> candidates = survivors;
  const std::vector<int64_t> waiting = joiners();
  candidates.insert(candidates.end(), waiting.begin(), waiting.end());
  // `morph resize --release`: the named workers go last, so that a shrink
  // releases them before any other (a pipeline's morph places its own).
  if (!release_first_.empty()) {
    std::stable_partition(candidates.begin(), candidates.end(), [&](int64_t id) {
      return std::find(release_first_.begin(), release_first_.end(), id) == release_first_.end();
    });
    release_first_.clear();
  }
  straggler_.orderForDrop(candidates);  // a straggler being dropped is released
  // The first generation of a pipeline runs exactly its plan's workers;
  // later ones are placed by publishMorph().
  const size_t size = pm_.pipelined() && gen_ < 0
                          ? static_cast<size_t>(target_)
                          : std::min<size_t>({candidates.size(), static_cast<size_t>(target_),
                                              static_cast<size_t>(job_.virtual_nodes)});
  if (gen_ < 0 && !pm_.planWorkers().empty()) {
    // The first generation runs the plan's devices: world rank r on worker
    // slot planWorkers()[r]; the others are released.
    std::vector<int64_t> ordered;
    for (int slot : pm_.planWorkers()) ordered.push_back(slot);
    for (int64_t id : candidates)
      if (std::find(ordered.begin(), ordered.end(), id) == ordered.end()) ordered.push_back(id);
    candidates = ordered;
  }
  GenerationPlan plan;
  plan.generation = g;
  plan.members.assign(candidates.begin(), candidates.begin() + static_cast<std::ptrdiff_t>(size));
  plan.released.assign(candidates.begin() + static_cast<std::ptrdiff_t>(size), candidates.end());
  if (pm_.pipelined() && gen_ >= 0) {
    auto measured = [this](const std::vector<int64_t>& ids, int stages) {
      return pstraggler_.shares(ids, stages, job_.virtual_nodes);
    };
    plan.morph =
        pm_.publishMorph(plan.members, survivors, reports, waiting, target_, measured, plan.released, steps_left);
  }
  const std::vector<int64_t>& next = plan.members;
  for (size_t r = 0; r < next.size(); ++r)
    if (reports.count(next[r]) && reports.at(next[r]).committed == best) {
      plan.source = static_cast<int>(r);
      break;
    }
  if (pm_.pipelined()) {
    plan.pipeline = pm_.layout();
    for (size_t r = 0; r < next.size(); ++r)
      plan.vn_ranges.push_back(pm_.layout()->replica_ranges.at(r / static_cast<size_t>(pm_.layout()->stages)));
  } else if (job_.sync_mode == SyncMode::kWsp) {
    // Even, or by the members' devices' speeds (docs/wsp.md, "VN shares by device speed").
    plan.vn_ranges = rangesOf(wspShares(job_.virtual_nodes, pm_.wspVnSeconds(), next));
  } else if (auto measured = straggler_.shares(next, job_.virtual_nodes)) {
    plan.vn_ranges = rangesOf(*measured);  // shares by measured speed, once a straggler was re-planned around
  } else if (pm_.dpShares().size() == next.size()) {
    plan.vn_ranges = rangesOf(pm_.dpShares());
  } else {
    plan.vn_ranges = evenRanges(job_.virtual_nodes, static_cast<int>(next.size()));
  }
  vn_shares_ = plan.shares();
  if (const auto& res = pm_.resources()) {
    // Emulated devices: each member idles per its device's slowdown.
    for (int64_t id : next)
      plan.slowdown.push_back(static_cast<size_t>(id) < res->devices.size() ? res->typeOf(static_cast<size_t>(id)).slowdown
                                                                            : 1.0);
  }
  if (pm_.pipelined()) {
    pstraggler_.newGeneration(next, pm_.layout()->stages, pm_.layout()->cuts, pm_.layout()->replicaShares());
  } else {
    straggler_.newGeneration(next, vn_shares_, plan.slowdown);
  }
  json wsp_note;  // before the plan: a member reads it once placed
  if (job_.sync_mode == SyncMode::kWsp && gen_ >= 0) wsp_note = restoreWsp(store, g);
  setString(store, keys::genPlan(g), plan.toJson().dump());
  setString(store, keys::kGenCurrent, std::to_string(g));
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
    if (!wsp_note.is_null()) pending_resize_["wsp"] = wsp_note;
    if (cause == "straggler") {
      pending_resize_.update(straggler_note_);
      pending_resize_["vn_shares"] = vn_shares_;
    }
    pending_gen_ = g;
    pending_since_ = transition_start_;
  }
  for (int64_t id : plan.released) m_[id].alive = false;  // they exit on reading the plan
  std::fflush(stdout);
  members_ = next;
  gen_ = g;
  in_transition_ = false;
  transition_cause_.clear();
  m_.setStarted();
  forgetPast(store);
  return plan;
}

json Generations::restoreWsp(c10d::Store& store, int64_t g) {
  // What the lost generation's members knew: each its clock, and the waves
  // of every VW (rank) its shard received.
  const size_t vws = members_.size();
  std::vector<std::vector<int64_t>> known;
  for (size_t r = 0; r < vws; ++r) {
    const std::string k = keys::genReport(gen_, "wsp", members_[r]);
    if (!store.check({k})) continue;
    const json j = json::parse(getString(store, k), nullptr, false);
    if (!j.is_object() || !j.contains("received") || !j.at("received").is_array()) continue;
    std::vector<int64_t> v;
    for (const json& x : j.at("received"))
      if (x.is_number_integer()) v.push_back(x.get<int64_t>());
    v.resize(vws, 0);
    if (j.contains("clock") && j.at("clock").is_number_integer()) v[r] = std::max(v[r], j.at("clock").get<int64_t>());
    known.push_back(v);
  }
  const std::vector<int64_t> pushed = mergePushed(known, vws);
  int64_t reached = 0;
  for (int64_t p : pushed) reached = std::max(reached, p);
  // A checkpoint past every clock pushed is another run's.
  const std::string dir = checkpointDir(o_, job_);
  const int64_t step = job_.checkpoint_every > 0 ? newestGoodCheckpointAtMost(dir, reached * job_.wave) : -1;
  const int64_t start = store.check({keys::kJobStartStep}) ? getInt(store, keys::kJobStartStep) : 0;
  const int64_t from = step >= 0 ? step : start;
  const LostWork lost = lostWork(pushed, (from + job_.wave - 1) / job_.wave);
  setString(store, keys::genWspRestore(g), std::to_string(step));
  const std::string what = step >= 0 ? (std::filesystem::absolute(dir) / checkpointDirName(step)).lexically_normal().string()
                                     : std::string("the job's start");
  std::printf("morph: WSP: generation %lld restores the servers' state of %s (clock %lld, step %lld); "
              "clocks %lld..%lld lost, %lld pushes\n",
              static_cast<long long>(g), what.c_str(), static_cast<long long>(lost.restored),
              static_cast<long long>(from), static_cast<long long>(lost.restored), static_cast<long long>(lost.end - 1),
              static_cast<long long>(lost.pushes));
  std::fflush(stdout);
  wsp_restore_ = RestoreRecord{g, lost.restored, step >= 0 ? what : ""}.toJson();
  return {{"restored_clock", lost.restored}, {"restored_step", from}, {"checkpoint", step >= 0 ? what : ""},
          {"lost_clocks", {lost.restored, lost.end}}, {"pushes_lost", lost.pushes}, {"pushed", pushed}};
}

// The store stays bounded however long the job runs and however often it
// regroups (docs/distributed.md, "Store keys"): the keys of generation
// gen_ - 2 (every member left it before gen_ - 1 formed; one generation
// more is kept for a member still on its way out) and of the workers that
// were already gone at the previous generation change (one that exits
// after a leave or release may still write its heartbeat in between).
void Generations::forgetPast(c10d::Store& store) {
  if (gen_ >= 2) table_.erasePrefix(keys::genPrefix(gen_ - 2));
  m_.forgetDeparted(table_, store);
}

// A running generation: starts a transition when a member posted ready or
// left (a leave, or a failure a survivor saw first), when joiners can grow
// it, or when a resize request shrinks it.
void Generations::watchMembership(c10d::Store& store, const Clock& clock, bool all_steps_done, int64_t steps_left) {
  // Members bump "events" after posting ready/left: one read instead of
  // two per member.
  const int64_t events = store.add(keys::kEvents, 0);
  bool posted = false;
  if (events != events_seen_) {
    events_seen_ = events;
    for (int64_t id : members_)
      posted = posted || store.check({keys::genReport(gen_, "ready", id)}) ||
               store.check({keys::genReport(gen_, "left", id)});
  }
  const int joiners = static_cast<int>(this->joiners().size());
  const int size = static_cast<int>(members_.size());
  if (posted) {
    startTransition(clock, "");  // a leave, or a failure a survivor saw first
  } else if (all_steps_done) {
    return;  // the members finish; a joiner or resize request comes too late
  } else if (pm_.pipelined()) {
    // Grow when the workers at hand make a bigger shape (joiners, or a
    // larger --workers target); extra workers wait as spares.
    if (pm_.shouldGrow(size, joiners, target_, clock.now(), steps_left)) {
      writeWant(store, gen_ + 1);
      startTransition(clock, resize_seq_ > 0 ? "request" : "join");
    } else if (size > target_) {
      writeWant(store, gen_ + 1);
      startTransition(clock, "request");
    }
  } else if (joiners > 0 && size < target_ && size < job_.virtual_nodes) {
    writeWant(store, gen_ + 1);
    startTransition(clock, resize_seq_ > 0 ? "request" : "join");
  } else if (size > target_) {
    writeWant(store, gen_ + 1);
    startTransition(clock, "request");
  }
}

bool Generations::resultsPosted(c10d::Store& store) const {
  if (gen_ < 0) return false;
  // Results of every member still alive (one that died after the last
  // step may or may not have posted one).
  std::vector<std::string> keys;
  int posted = 0;
  for (int64_t id : members_) {
    const std::string k = keys::result(id);
    if (m_.workers().count(id) && m_.workers().at(id).alive) keys.push_back(k);
    posted += store.check({k});
  }
  // Only results of this generation count (a member posts one when its
  // training loop ends; one of an earlier generation is stale).
  bool current = posted > 0 && store.check(keys);
  for (size_t i = 0; current && i < keys.size(); ++i) {
    const json r = json::parse(getString(store, keys[i]), nullptr, false);
    current = r.is_object() && r.value("generation", int64_t{-1}) == gen_;
  }
  return current;
}

std::vector<int64_t> Generations::joiners() const {
  std::vector<int64_t> w = m_.waiting(members_);
  w.erase(std::remove_if(w.begin(), w.end(), [this](int64_t id) { return partitions_.aside(id); }), w.end());
  return w;
}

void Generations::watchPartitions(c10d::Store& store, const Clock& clock) {
  if (gen_ < 0) return;
  for (int64_t id : partitions_.readmit(store, gen_)) {
    std::printf("morph: worker %lld reaches every member of generation %lld again: it may rejoin\n",
                static_cast<long long>(id), static_cast<long long>(gen_));
    std::fflush(stdout);
  }
  std::map<int64_t, double> speed;  // VNs per second, where measured (ties between equal groups)
  for (int64_t id : members_)
    if (const auto e = straggler_.estimate(id)) speed[id] = 1.0 / *e;
  const auto split = partitions_.poll(store, gen_, members_, speed, clock.now());
  if (!split) return;
  auto list = [](const std::vector<int64_t>& ids) {
    std::string t;
    for (int64_t id : ids) t += (t.empty() ? "" : ", ") + std::to_string(id);
    return t;
  };
  std::fprintf(stderr,
               "morph: partition in generation %lld (%s): going on with worker(s) %s; worker(s) %s set aside until "
               "they reach the group again\n",
               static_cast<long long>(gen_), split->describe.c_str(), list(split->keep).c_str(),
               list(split->aside).c_str());
  // Every member leaves its collectives (the kept ones regroup at once).
  setString(store, keys::genAbort(gen_), "1");
  if (!in_transition_) startTransition(clock, "partition");
  else transition_cause_ = "partition";
}

}  // namespace morph
