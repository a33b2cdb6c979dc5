#include "plan/plan_file.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace morph {

using json = nlohmann::json;

PlanFile readPlanFile(const std::string& path, const std::vector<std::string>& names, int64_t virtual_nodes) {
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot read the plan file");
  json j;
  try {
    j = json::parse(in);
  } catch (const std::exception& e) {
    throw InputError(path + ": not JSON (" + e.what() + ")");
  }
  const std::string expect = "expected {\"stages\": [[\"first layer\", \"last layer\"], ...]}";
  if (!j.is_object() || !j.contains("stages") || !j["stages"].is_array() || j["stages"].empty())
    throw InputError(path + ": key 'stages': " + expect);
  auto find = [&](const json& name, const std::string& key) {
    if (!name.is_string()) throw InputError(path + ": key '" + key + "': expected a layer name");
    for (size_t l = 0; l < names.size(); ++l)
      if (names[l] == name.get<std::string>()) return l;
    std::string all;
    for (size_t l = 0; l < names.size(); ++l) all += (l ? ", " : "") + names[l];
    throw InputError(path + ": key '" + key + "': no layer '" + name.get<std::string>() + "' (the model's: " + all +
                     ")");
  };
  PlanFile pf;
  pf.cuts = {0};
  for (size_t k = 0; k < j["stages"].size(); ++k) {
    const auto& st = j["stages"][k];
    const std::string key = "stages[" + std::to_string(k) + "]";
    if (!st.is_array() || st.size() != 2) throw InputError(path + ": key '" + key + "': " + expect);
    const size_t a = find(st[0], key + "[0]"), b = find(st[1], key + "[1]");
    if (a != pf.cuts.back())
      throw InputError(path + ": key '" + key + "': stage " + std::to_string(k) + " starts at '" + names[a] +
                       "', expected '" + (pf.cuts.back() < names.size() ? names[pf.cuts.back()] : std::string("(end)")) +
                       "' (stages must cover the layers in order)");
    if (b < a) throw InputError(path + ": key '" + key + "': last layer before first");
    pf.cuts.push_back(b + 1);
  }
  if (pf.cuts.back() != names.size())
    throw InputError(path + ": key 'stages': the stages end at '" + names[pf.cuts.back() - 1] +
                     "', not at the model's last layer '" + names.back() + "'");
  if (j.contains("replicas")) {
    if (!j["replicas"].is_number_integer() || j["replicas"].get<int64_t>() < 1 || j["replicas"].get<int64_t>() > 4096)
      throw InputError(path + ": key 'replicas': expected an integer 1..4096");
    pf.replicas = j["replicas"].get<int>();
  }
  if (j.contains("schedule")) {
    if (!j["schedule"].is_string()) throw InputError(path + ": key 'schedule': expected gpipe, 1f1b or varuna");
    try {
      pf.schedule = parseScheduleKind(j["schedule"].get<std::string>());
    } catch (const InputError& e) {
      throw InputError(path + ": key 'schedule': " + e.what());
    }
  }
  if (j.contains("recompute")) {
    if (!j["recompute"].is_boolean()) throw InputError(path + ": key 'recompute': expected true or false");
    pf.recompute = j["recompute"].get<bool>();
  }
  if (j.contains("vn_shares")) {
    const json& v = j["vn_shares"];
    if (!v.is_array() || v.empty()) throw InputError(path + ": key 'vn_shares': expected a list of VN counts");
    int64_t sum = 0;
    for (const json& s : v) {
      // Bounded by the job's VNs so that the sum cannot overflow (a wrapped
      // sum could equal virtual_nodes; UBSan report in tests/fuzz/plan_file_fuzz.cpp).
      if (!s.is_number_integer() || s.get<int64_t>() < 1 || s.get<int64_t>() > virtual_nodes)
        throw InputError(path + ": key 'vn_shares': every share must be an integer from 1 to " +
                         std::to_string(virtual_nodes) + " (batch.virtual_nodes)");
      pf.vn_shares.push_back(s.get<int64_t>());
      sum += s.get<int64_t>();
    }
    if (sum != virtual_nodes)
      throw InputError(path + ": key 'vn_shares': the shares add up to " + std::to_string(sum) +
                       " VNs, the job has batch.virtual_nodes = " + std::to_string(virtual_nodes));
    const int d = pf.replicas.value_or(static_cast<int>(pf.vn_shares.size()));
    if (static_cast<int>(pf.vn_shares.size()) != d)
      throw InputError(path + ": key 'vn_shares': " + std::to_string(pf.vn_shares.size()) + " shares for " +
                       std::to_string(d) + " replicas");
    pf.replicas = d;
  }
  if (j.contains("workers")) {
    const json& w = j["workers"];
    const size_t want = static_cast<size_t>(pf.stages() * pf.replicas.value_or(1));
    if (!w.is_array() || w.size() != want)
      throw InputError(path + ": key 'workers': expected " + std::to_string(want) +
                       " worker slots (one per stage and replica)");
    for (const json& x : w) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= 4096)
        throw InputError(path + ": key 'workers': expected worker slots 0..4095");
      if (std::find(pf.workers.begin(), pf.workers.end(), x.get<int>()) != pf.workers.end())
        throw InputError(path + ": key 'workers': slot " + x.dump() + " is listed twice");
      pf.workers.push_back(x.get<int>());
    }
  }
  return pf;
}

void writePlanFile(const std::string& path, const PlanSpec& plan, const std::vector<std::string>& names,
                   const std::string& notes_json) {
  json j = notes_json.empty() ? json::object() : json::parse(notes_json);
  json stages = json::array();
  for (int k = 0; k < plan.stages; ++k)
    stages.push_back({names[plan.cuts[static_cast<size_t>(k)]], names[plan.cuts[static_cast<size_t>(k) + 1] - 1]});
  j["stages"] = stages;
  j["replicas"] = plan.replicas;
  if (plan.stages > 1) {  // one stage has no schedule
    j["schedule"] = toString(plan.schedule);
    j["recompute"] = plan.recompute;
  }
  j["vn_shares"] = plan.vn_shares;
  if (!plan.workers.empty()) j["workers"] = plan.workers;
  const std::filesystem::path target(path);
  if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path());
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump(2) << '\n';
    out.flush();
    if (!out) throw InputError(path + ": cannot write the plan file");
  }
  std::filesystem::rename(tmp, target);
}

std::string describeCuts(const std::vector<std::string>& names, const std::vector<size_t>& cuts) {
  std::string out;
  for (size_t k = 0; k + 1 < cuts.size(); ++k) {
    if (k) out += " | ";
    out += names[cuts[k]];
    if (cuts[k + 1] - cuts[k] > 1) out += ".." + names[cuts[k + 1] - 1];
  }
  return out;
}

}  // namespace morph
