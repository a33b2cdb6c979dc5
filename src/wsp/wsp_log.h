// The WSP pull log, OUT/wsp_log.jsonl (docs/wsp.md, "The log and replay"):
// one record per pull, with the version of every shard it received. A
// record's one encoder and one decoder are here, and the replay plan the
// log gives: each VW's pulls in order, and per shard how many pulls
// received each version.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace morph {

struct PullRecord {
  int vw = 0;
  int64_t pull = 0;   // the VW's pull count, from 0
  int64_t clock = 0;  // its clock (waves pushed) at the pull
  std::vector<int64_t> versions;  // per shard
  int64_t gap() const;  // clock - min(versions)

  nlohmann::json toJson() const;
  // MessageError-free: InputError naming `origin` when malformed.
  static PullRecord fromJson(const nlohmann::json& j, const std::string& origin);
};

// The first line of the log of a run that lost a virtual worker
// (docs/wsp.md, "Checkpoints and lost workers"): the pulls that follow are
// those of generation `generation`, which started from the servers' state
// of `checkpoint` ("" = the job's start) at clock `clock`.
//   {"restored": {"generation": 1, "clock": 16, "checkpoint": "/.../step-000000000016"}}
struct RestoreRecord {
  int64_t generation = 0, clock = 0;
  std::string checkpoint;
  nlohmann::json toJson() const;
  // nullopt when `j` is not one; InputError naming `origin` when malformed.
  static std::optional<RestoreRecord> fromJson(const nlohmann::json& j, const std::string& origin);
};

// The VN shares of the generation whose pulls follow (docs/wsp.md, "The
// log and replay"), first after any restore record:
//   {"vn_shares": [5, 3]}
struct SharesRecord {
  std::vector<int64_t> vn_shares;
  nlohmann::json toJson() const { return {{"vn_shares", vn_shares}}; }
  // nullopt when `j` is not one; InputError naming `origin` when malformed.
  static std::optional<SharesRecord> fromJson(const nlohmann::json& j, const std::string& origin);
};

struct ReplayPlan {
  // The run restored a checkpoint after a lost worker: its replay starts there.
  std::optional<RestoreRecord> restored;
  // The run's VN shares (a log written before they were recorded has none).
  std::optional<std::vector<int64_t>> vn_shares;
  // Per VW, its pulls' versions in order.
  std::map<int, std::vector<std::vector<int64_t>>> pulls;
  // Per shard: version -> the number of pulls that received it.
  std::vector<std::map<int64_t, int64_t>> per_shard;

  // The log's text; InputError naming `origin` (the file) when it is not a
  // log of `vws` virtual workers.
  static ReplayPlan parse(const std::string& text, const std::string& origin, int vws);
  // InputError naming `origin` when the log records other shares than
  // `shares` (what this run gives its VWs): another mapping.
  void checkShares(const std::vector<int64_t>& shares, const std::string& origin) const;
};

}  // namespace morph
