// The WSP pull log (wsp_log.h).
#include "wsp/wsp_log.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"

namespace morph {

int64_t PullRecord::gap() const {
  return versions.empty() ? 0 : clock - *std::min_element(versions.begin(), versions.end());
}

nlohmann::json PullRecord::toJson() const {
  return {{"vw", vw}, {"pull", pull}, {"clock", clock}, {"versions", versions}, {"gap", gap()}};
}

PullRecord PullRecord::fromJson(const nlohmann::json& j, const std::string& origin) {
  PullRecord r;
  try {
    r.vw = j.at("vw").get<int>();
    r.pull = j.at("pull").get<int64_t>();
    r.clock = j.at("clock").get<int64_t>();
    r.versions = j.at("versions").get<std::vector<int64_t>>();
  } catch (const std::exception& e) {
    throw InputError(origin + ": not a WSP pull record (" + e.what() + "): " + j.dump());
  }
  if (r.vw < 0 || r.pull < 0 || r.clock < 0 || r.versions.empty())
    throw InputError(origin + ": a WSP pull record with a negative or missing field: " + j.dump());
  for (int64_t v : r.versions)
    if (v < 0 || v > r.clock + 1000000) throw InputError(origin + ": a version out of range: " + j.dump());
  return r;
}

nlohmann::json RestoreRecord::toJson() const {
  return {{"restored", {{"generation", generation}, {"clock", clock}, {"checkpoint", checkpoint}}}};
}

std::optional<RestoreRecord> RestoreRecord::fromJson(const nlohmann::json& j, const std::string& origin) {
  if (!j.is_object() || !j.contains("restored")) return std::nullopt;
  RestoreRecord r;
  try {
    const nlohmann::json& x = j.at("restored");
    r.generation = x.at("generation").get<int64_t>();
    r.clock = x.at("clock").get<int64_t>();
    r.checkpoint = x.at("checkpoint").get<std::string>();
  } catch (const std::exception& e) {
    throw InputError(origin + ": not a WSP restore record (" + e.what() + "): " + j.dump());
  }
  if (r.generation < 0 || r.clock < 0) throw InputError(origin + ": a WSP restore record out of range: " + j.dump());
  return r;
}

std::optional<SharesRecord> SharesRecord::fromJson(const nlohmann::json& j, const std::string& origin) {
  if (!j.is_object() || !j.contains("vn_shares")) return std::nullopt;
  SharesRecord r;
  const nlohmann::json& v = j.at("vn_shares");
  if (!v.is_array() || v.empty()) throw InputError(origin + ": not a WSP shares record: " + j.dump());
  for (const nlohmann::json& x : v) {
    if (!x.is_number_integer() || x.get<int64_t>() < 1 || x.get<int64_t>() > (int64_t{1} << 40))
      throw InputError(origin + ": a WSP shares record with a share out of range: " + j.dump());
    r.vn_shares.push_back(x.get<int64_t>());
  }
  return r;
}

void ReplayPlan::checkShares(const std::vector<int64_t>& shares, const std::string& origin) const {
  if (!vn_shares || *vn_shares == shares) return;
  auto text = [](const std::vector<int64_t>& v) {
    std::string t;
    for (int64_t x : v) t += (t.empty() ? "" : "+") + std::to_string(x);
    return t;
  };
  throw InputError(origin + ": the run gave its virtual workers VN shares " + text(*vn_shares) + ", this one gives " +
                   text(shares) + " (replay needs the same mapping: the same resources file, or none; docs/wsp.md)");
}

ReplayPlan ReplayPlan::parse(const std::string& text, const std::string& origin, int vws) {
  ReplayPlan p;
  p.per_shard.resize(static_cast<size_t>(vws));
  std::istringstream in(text);
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) throw InputError(origin + ":" + std::to_string(n) + ": not JSON");
    if (auto rr = RestoreRecord::fromJson(j, origin + ":" + std::to_string(n))) {
      if (p.restored || !p.pulls.empty())
        throw InputError(origin + ":" + std::to_string(n) + ": a restore record must be the log's first line");
      p.restored = *rr;
      continue;
    }
    if (auto sr = SharesRecord::fromJson(j, origin + ":" + std::to_string(n))) {
      if (p.vn_shares || !p.pulls.empty())
        throw InputError(origin + ":" + std::to_string(n) + ": a shares record must come before the pulls, once");
      if (static_cast<int>(sr->vn_shares.size()) != vws)
        throw InputError(origin + ":" + std::to_string(n) + ": shares of " + std::to_string(sr->vn_shares.size()) +
                         " virtual workers, but this run has " + std::to_string(vws) +
                         " (replay needs the same mapping)");
      p.vn_shares = sr->vn_shares;
      continue;
    }
    const PullRecord r = PullRecord::fromJson(j, origin + ":" + std::to_string(n));
    if (r.vw >= vws || static_cast<int>(r.versions.size()) != vws)
      throw InputError(origin + ":" + std::to_string(n) + ": a record of virtual worker " + std::to_string(r.vw) +
                       " with " + std::to_string(r.versions.size()) + " shards, but this run has " +
                       std::to_string(vws) + " virtual workers (replay needs the same mapping)");
    auto& mine = p.pulls[r.vw];
    if (r.pull != static_cast<int64_t>(mine.size()))
      throw InputError(origin + ":" + std::to_string(n) + ": pull " + std::to_string(r.pull) + " of virtual worker " +
                       std::to_string(r.vw) + " out of order (expected " + std::to_string(mine.size()) + ")");
    mine.push_back(r.versions);
    for (size_t s = 0; s < r.versions.size(); ++s) ++p.per_shard[s][r.versions[s]];
  }
  if (static_cast<int>(p.pulls.size()) != vws)
    throw InputError(origin + ": holds pulls of " + std::to_string(p.pulls.size()) + " virtual workers, but this run has " +
                     std::to_string(vws) + " (replay needs the same mapping)");
  return p;
}

}  // namespace morph
