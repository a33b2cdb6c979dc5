#include "control/protocol/generation_plan.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "control/protocol/message.h"
#include "exec/schedule.h"

namespace morph {

using json = nlohmann::json;
using namespace message;

namespace {

const char* const kPlan = "generation plan";
const char* const kLayout = "generation plan 'pipeline'";
const char* const kMorph = "generation plan 'morph'";

json rangesJson(const std::vector<VnRange>& ranges) {
  json out = json::array();
  for (const VnRange& r : ranges) out.push_back({r.begin, r.end});
  return out;
}

std::vector<VnRange> rangesFrom(const json& j, const char* key, const std::string& what) {
  const auto it = object(j, what).find(key);
  if (it == j.end() || !it->is_array()) throw MessageError(what + ": '" + key + "' is missing or not a list");
  std::vector<VnRange> out;
  for (const json& r : *it) {
    if (!r.is_array() || r.size() != 2) throw MessageError(what + ": '" + key + "' holds " + r.dump().substr(0, 40) + ", not [begin, end]");
    VnRange v{integerValue(r[0], what + " '" + key + "'", 0), integerValue(r[1], what + " '" + key + "'", 0)};
    if (v.begin >= v.end) throw MessageError(what + ": '" + key + "' holds the empty range " + r.dump());
    out.push_back(v);
  }
  return out;
}

json shapeJson(const MorphShape& s) { return {s.stages, s.replicas}; }

MorphShape shapeFrom(const json& j, const char* key, const std::string& what) {
  const std::vector<int64_t> v = integers(j, key, what, 1, 1 << 20);
  if (v.size() != 2) throw MessageError(what + ": '" + key + "' is not [stages, replicas]");
  return {static_cast<int>(v[0]), static_cast<int>(v[1])};
}

std::vector<size_t> cutsFrom(const json& j, const char* key, const std::string& what) {
  const std::vector<int64_t> v = integers(j, key, what, 0, 1 << 24);
  if (v.size() < 2 || v.front() != 0) throw MessageError(what + ": '" + key + "' must run from layer 0 to the last");
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i] <= v[i - 1]) throw MessageError(what + ": '" + key + "' is not strictly increasing");
  return std::vector<size_t>(v.begin(), v.end());
}

double finiteNumber(const json& j, const char* key, const std::string& what) {
  const double x = number(j, key, what);
  if (!std::isfinite(x)) throw MessageError(what + ": '" + key + "' is not finite");
  return x;
}

}  // namespace

std::vector<int64_t> PipelineLayout::replicaShares() const {
  std::vector<int64_t> out;
  for (const VnRange& r : replica_ranges) out.push_back(r.size());
  return out;
}

json PipelineLayout::toJson() const {
  return {{"stages", stages},       {"replicas", replicas}, {"cuts", cuts},
          {"schedule", schedule},   {"recompute", recompute}, {"trace", trace},
          {"replica_ranges", rangesJson(replica_ranges)}};
}

PipelineLayout PipelineLayout::fromJson(const json& j) {
  PipelineLayout p;
  p.stages = static_cast<int>(integer(j, "stages", kLayout, 1, 1 << 20));
  p.replicas = static_cast<int>(integer(j, "replicas", kLayout, 1, 1 << 20));
  p.cuts = cutsFrom(j, "cuts", kLayout);
  if (p.cuts.size() != static_cast<size_t>(p.stages) + 1)
    throw MessageError(std::string(kLayout) + ": " + std::to_string(p.cuts.size()) + " cuts for " +
                       std::to_string(p.stages) + " stages");
  p.schedule = text(j, "schedule", kLayout);
  try {
    parseScheduleKind(p.schedule);
  } catch (const InputError& e) {
    throw MessageError(std::string(kLayout) + ": " + e.what());
  }
  p.recompute = boolean(j, "recompute", kLayout);
  p.trace = boolean(j, "trace", kLayout);
  p.replica_ranges = rangesFrom(j, "replica_ranges", kLayout);
  if (p.replica_ranges.size() != static_cast<size_t>(p.replicas))
    throw MessageError(std::string(kLayout) + ": " + std::to_string(p.replica_ranges.size()) + " replica ranges for " +
                       std::to_string(p.replicas) + " replicas");
  return p;
}

json PipelineMorph::toJson() const {
  json j = {{"live", live},
            {"step", step},
            {"from_shape", shapeJson(from)},
            {"to_shape", shapeJson(to)},
            {"to_cuts", to_cuts},
            {"chosen_by", chosen_by},
            {"planning_seconds", planning_seconds}};
  if (live) {
    json tr = json::array();
    for (const MorphTransfer& t : transfers) tr.push_back({t.layer, t.src, t.dst});
    j["meta_source"] = meta_source;
    j["transfers"] = tr;
    j["expected_bytes"] = expected_bytes;
    j["finishing"] = finishing;
  } else {
    j["checkpoint"] = checkpoint;
    j["steps_redone"] = steps_redone;
  }
  return j;
}

PipelineMorph PipelineMorph::fromJson(const json& j, size_t members) {
  PipelineMorph m;
  const int64_t last_rank = static_cast<int64_t>(members) - 1;
  m.live = boolean(j, "live", kMorph);
  m.step = integer(j, "step", kMorph, -1);
  m.from = shapeFrom(j, "from_shape", kMorph);
  m.to = shapeFrom(j, "to_shape", kMorph);
  m.to_cuts = cutsFrom(j, "to_cuts", kMorph);
  m.chosen_by = text(j, "chosen_by", kMorph);
  m.planning_seconds = finiteNumber(j, "planning_seconds", kMorph);
  if (m.live) {
    m.meta_source = static_cast<int>(integer(j, "meta_source", kMorph, 0, last_rank));
    const auto it = j.find("transfers");
    if (it == j.end() || !it->is_array()) throw MessageError(std::string(kMorph) + ": 'transfers' is missing or not a list");
    for (const json& t : *it) {
      if (!t.is_array() || t.size() != 3)
        throw MessageError(std::string(kMorph) + ": a transfer is not [layer, source rank, destination rank]");
      const std::string what = std::string(kMorph) + " 'transfers'";
      m.transfers.push_back({static_cast<size_t>(integerValue(t[0], what, 0, 1 << 24)),
                             static_cast<int>(integerValue(t[1], what, 0, last_rank)),
                             static_cast<int>(integerValue(t[2], what, 0, last_rank))});
    }
    m.expected_bytes = integer(j, "expected_bytes", kMorph, 0);
    for (int64_t r : integers(j, "finishing", kMorph, 0, last_rank)) m.finishing.push_back(static_cast<int>(r));
  } else {
    m.checkpoint = text(j, "checkpoint", kMorph);
    m.steps_redone = integer(j, "steps_redone", kMorph, 0);
  }
  return m;
}

int GenerationPlan::rankOf(int64_t id) const {
  const auto it = std::find(members.begin(), members.end(), id);
  return it == members.end() ? -1 : static_cast<int>(it - members.begin());
}

bool GenerationPlan::releases(int64_t id) const {
  return std::find(released.begin(), released.end(), id) != released.end();
}

std::vector<int64_t> GenerationPlan::shares() const {
  std::vector<int64_t> out;
  for (const VnRange& r : vn_ranges) out.push_back(r.size());
  return out;
}

json GenerationPlan::toJson() const {
  json j = {{"generation", generation},
            {"members", members},
            {"released", released},
            {"source", source},
            {"vn_ranges", rangesJson(vn_ranges)}};
  if (pipeline) j["pipeline"] = pipeline->toJson();
  if (morph) j["morph"] = morph->toJson();
  if (!slowdown.empty()) j["slowdown"] = slowdown;
  return j;
}

GenerationPlan GenerationPlan::fromJson(const json& j) {
  GenerationPlan p;
  p.generation = integer(j, "generation", kPlan, 0);
  p.members = integers(j, "members", kPlan, 0);
  if (p.members.empty()) throw MessageError(std::string(kPlan) + ": no members");
  if (std::set<int64_t>(p.members.begin(), p.members.end()).size() != p.members.size())
    throw MessageError(std::string(kPlan) + ": a worker is listed twice in 'members'");
  p.released = integers(j, "released", kPlan, 0);
  const int64_t last_rank = static_cast<int64_t>(p.members.size()) - 1;
  p.source = static_cast<int>(integer(j, "source", kPlan, 0, last_rank));
  p.vn_ranges = rangesFrom(j, "vn_ranges", kPlan);
  if (p.vn_ranges.size() != p.members.size())
    throw MessageError(std::string(kPlan) + ": " + std::to_string(p.vn_ranges.size()) + " VN ranges for " +
                       std::to_string(p.members.size()) + " members");
  if (j.contains("pipeline")) {
    p.pipeline = PipelineLayout::fromJson(j.at("pipeline"));
    if (static_cast<size_t>(p.pipeline->stages) * static_cast<size_t>(p.pipeline->replicas) != p.members.size())
      throw MessageError(std::string(kPlan) + ": a pipeline of " + std::to_string(p.pipeline->stages) + " x " +
                         std::to_string(p.pipeline->replicas) + " for " + std::to_string(p.members.size()) +
                         " members");
  }
  if (j.contains("morph")) {
    if (!p.pipeline) throw MessageError(std::string(kPlan) + ": 'morph' without 'pipeline'");
    p.morph = PipelineMorph::fromJson(j.at("morph"), p.members.size());
  }
  if (j.contains("slowdown")) {
    const json& s = j.at("slowdown");
    if (!s.is_array() || s.size() != p.members.size())
      throw MessageError(std::string(kPlan) + ": 'slowdown' is not one factor per member");
    for (const json& f : s) {
      if (!f.is_number() || !std::isfinite(f.get<double>()) || f.get<double>() < 1.0)
        throw MessageError(std::string(kPlan) + ": 'slowdown' holds " + f.dump().substr(0, 40) + ", not a factor >= 1");
      p.slowdown.push_back(f.get<double>());
    }
  }
  return p;
}

}  // namespace morph
