#include "control/manager/outputs.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>

#include "control/manager/generations.h"
#include "control/manager/membership.h"
#include "control/manager/pipeline_morph.h"
#include "control/protocol/keys.h"
#include "control/store_access.h"
#include "core/error.h"
#include "store/table.h"

#include "wsp/wsp_log.h"

namespace morph {

using namespace detail;

namespace {
// A WSP job's log, OUT/wsp_log.jsonl (docs/wsp.md): every member's pull
// records, by virtual worker then pull, after the restore record of a run
// that lost a worker (null: none) and the shares of the generation they
// are from; returns summary.json's "wsp" (with, by virtual worker, where
// its wall clock went and the values its shard holds; and the bytes the
// pushes sent, packed, beside 8 a value).
json writeWspLog(const std::string& dir, const std::vector<json>& results, const json& restored,
                 const std::vector<int64_t>& shares) {
  std::vector<json> recs;
  std::map<int, json> seconds, shard_values;
  int64_t pushes = 0, pulls = 0, gap = 0, push_bytes = 0, push_unpacked = 0;
  for (const json& r : results) {
    if (!r.contains("wsp")) continue;
    const json& w = r.at("wsp");
    pushes += w.at("pushes").get<int64_t>();
    pulls += w.at("pulls").get<int64_t>();
    gap = std::max(gap, w.at("max_clock_gap").get<int64_t>());
    push_bytes += w.value("push_bytes", int64_t{0});
    push_unpacked += w.value("push_unpacked_bytes", int64_t{0});
    for (const json& rec : w.at("records")) recs.push_back(rec);
    if (w.contains("seconds")) seconds[w.at("vw").get<int>()] = w.at("seconds");
    if (w.contains("shard_values")) shard_values[w.at("vw").get<int>()] = w.at("shard_values");
  }
  std::sort(recs.begin(), recs.end(), [](const json& a, const json& b) {
    return std::make_pair(a.at("vw").get<int>(), a.at("pull").get<int64_t>()) <
           std::make_pair(b.at("vw").get<int>(), b.at("pull").get<int64_t>());
  });
  std::ofstream out(dir + "/wsp_log.jsonl");
  if (!restored.is_null()) out << restored.dump() << "\n";
  out << SharesRecord{shares}.toJson().dump() << "\n";
  for (const json& rec : recs) out << rec.dump() << "\n";
  if (!out) throw JobError("cannot write " + dir + "/wsp_log.jsonl");
  json vw_seconds = json::array(), values = json::array();
  for (auto& [vw, x] : seconds) vw_seconds.push_back(x);
  for (auto& [vw, x] : shard_values) values.push_back(x);
  return {{"max_clock_gap", gap},       {"pushes", pushes},           {"pulls", pulls},
          {"vw_seconds", vw_seconds}, {"shard_values", values},
          {"push_bytes", push_bytes}, {"push_unpacked_bytes", push_unpacked}};
}

// The status record (`morph status`, the status page) is rewritten at most
// this often.
constexpr double kStatusIntervalS = 0.5;
}  // namespace

void Outputs::pollMetrics(c10d::Store& store, store::Table& table,
                          const std::function<void(const json&)>& committed) {
  if (!log_ && store.check({keys::kJobSteps})) {
    steps_ = getInt(store, keys::kJobSteps);
    next_ = first_step_ = getInt(store, keys::kJobStartStep);
    log_ = std::make_unique<RunLog>(dir_, job_, steps_, o_.quiet, !o_.resume.empty());
    if (status_page_) {
      status_page_->setSteps(steps_);
      log_->setObserver([s = status_page_.get()](const json& l) { s->record(l); });
    }
  }
  while (log_ && next_ < steps_ && store.check({keys::metrics(next_)})) {
    json line = json::parse(getString(store, keys::metrics(next_)));
    log_->record(line);
    committed(line);
    last_sps_ = line.at("samples_per_second").get<double>();
    table.erase(keys::metrics(next_));  // read once: the store stays bounded
    committed_ = next_++;
    std::fflush(stdout);
  }
}

void Outputs::updateStatus(c10d::Store& store, const Clock& clock, const json& generation) {
  const double now = clock.now();
  if (now - last_status_ < kStatusIntervalS) return;
  last_status_ = now;
  json s = generation;
  s["next_step"] = next_;
  s["steps"] = steps_;
  s["samples_per_second"] = last_sps_;
  s["store_keys"] = store.getNumKeys();
  setString(store, keys::kStatus, s.dump());
  if (status_page_) status_page_->setStatus(s);
}

bool Outputs::allStepsDone(c10d::Store& store) const {
  return log_ && (next_ >= steps_ || store.check({keys::metrics(steps_ - 1)}));
}

int Outputs::finish(c10d::Store& store, const Generations& g, Membership& m, PipelineMorpher& pm) {
  std::string hash;
  int64_t peak = 0, bytes = 0;
  std::vector<json> results;
  json checkpoint_timing;
  std::map<int, std::string> stage_hashes;
  for (int64_t id : g.members()) {
    if (!store.check({keys::result(id)})) continue;
    json res = json::parse(getString(store, keys::result(id)));
    results.push_back(res);
    // World rank 0 commits every checkpoint: its timing is the job's.
    if (id == g.members().front() && res.contains("checkpoint")) checkpoint_timing = res.at("checkpoint");
    if (pm.pipelined()) {
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
  if (pm.pipelined() && !results.empty()) hash = pm.pipelineHash(stage_hashes);
  json wsp;
  if (job_.sync_mode == SyncMode::kWsp) {
    // The last regroup's restore (docs/wsp.md), or the one a replay started from.
    json restored = g.wspRestore();
    if (restored.is_null() && !o_.replay_text.empty()) {
      const std::string first = o_.replay_text.substr(0, o_.replay_text.find('\n'));
      if (auto r = RestoreRecord::fromJson(json::parse(first, nullptr, false), "--replay")) restored = r->toJson();
    }
    wsp = writeWspLog(dir_, results, restored, g.vnShares());
  }
  setString(store, keys::kJobFinished, "1");
  m.waitLocal();
  json extra = json::object();
  extra["vn_shares"] = g.vnShares();
  if (!checkpoint_timing.is_null()) extra["checkpoint"] = checkpoint_timing;
  // The plan the job ended on (docs/planner.md).
  extra["plan"] = pm.pipelined() ? pm.planSummary()
                              : json{{"stages", 1}, {"replicas", g.members().size()}, {"schedule", "-"}, {"recompute", false}};
  if (pm.resources()) {
    json types = json::array();
    // A worker that joined later than the listed devices has none (its
    // speed is this machine's, or what `morph slow` set).
    for (int64_t id : g.members())
      types.push_back(static_cast<size_t>(id) < pm.resources()->devices.size()
                          ? json(pm.resources()->devices[static_cast<size_t>(id)].type)
                          : json(nullptr));
    extra["devices"] = types;
  }
  // All-reduce payload per step of a worker that stayed throughout.
  if (g.resizes().empty() && steps_ > first_step_)
    extra["reduce_payload_bytes_per_step"] = static_cast<double>(bytes) / static_cast<double>(steps_ - first_step_);
  if (!wsp.is_null()) extra["wsp"] = wsp;
  if (pm.pipelined()) {
    extra.update(pm.pipelineResults(results, first_step_, steps_));
    if (!o_.trace.empty()) pm.writeTrace(store, g.members());
  }
  writeSummary(dir_, job_, steps_, static_cast<int>(g.members().size()), *log_, hash, peak, g.resizes(), extra);
  std::printf("model_hash: %s\n", hash.c_str());
  return 0;
}

// Whether training is over: every step's metrics read and every member
// still alive posted its result of this generation.
bool Outputs::resultsPosted(c10d::Store& store, const Generations& g) const {
  return allStepsRead() && g.resultsPosted(store);
}

}  // namespace morph
