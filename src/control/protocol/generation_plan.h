// GenerationPlan: the manager's message to the workers under gen/<g>/plan
// (docs/distributed.md, "Store keys"): who the members of generation g
// are, in rank order, which VNs each runs, whom the manager releases, which
// member's state the others receive, and for a pipeline job its layout and
// how it morphs from the previous generation. One encoder (toJson, the
// manager) and one decoder (fromJson, the worker), fuzzed
// (tests/fuzz/generation_plan_fuzz.cpp). Plain data: no store, no clock.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "plan/morph_plan.h"
#include "plan/vn_shares.h"

namespace morph {

// How a pipeline job runs: P stages cut at `cuts` (P + 1 layer
// boundaries), D replicas, each with its VNs; world rank r runs stage
// r mod P of replica r div P.
struct PipelineLayout {
  int stages = 1, replicas = 1;
  std::vector<size_t> cuts;
  std::string schedule;  // gpipe | 1f1b | varuna
  bool recompute = false;
  bool trace = false;  // record every rank's actions (--trace)
  std::vector<VnRange> replica_ranges;

  MorphShape shape() const { return {stages, replicas}; }
  std::vector<int64_t> replicaShares() const;
  nlohmann::json toJson() const;
  static PipelineLayout fromJson(const nlohmann::json& j);
};

// How a pipeline's state reaches its next generation (plan/morph_plan.h):
// live, from the members holding each layer at `step`, or from a
// checkpoint when some layer has no holder.
struct PipelineMorph {
  bool live = true;
  int64_t step = -1;  // the step the generation starts from
  MorphShape from, to;
  std::vector<size_t> to_cuts;
  std::string chosen_by;  // "planner" or "rule"
  double planning_seconds = 0;
  // Live: the rank whose step counter and scale state the others take, the
  // layers that move (ranks of the new generation), their bytes, and the
  // ranks that finish step - 1 from a prepared buffer first.
  int meta_source = 0;
  std::vector<MorphTransfer> transfers;
  int64_t expected_bytes = 0;
  std::vector<int> finishing;
  // Not live: the checkpoint folder every member loads, and the steps done
  // again since it.
  std::string checkpoint;
  int64_t steps_redone = 0;

  nlohmann::json toJson() const;
  static PipelineMorph fromJson(const nlohmann::json& j, size_t members);
};

struct GenerationPlan {
  int64_t generation = 0;
  std::vector<int64_t> members;   // worker ids by world rank
  std::vector<int64_t> released;  // workers that exit on reading it
  int source = 0;                 // the rank whose state every member receives
  std::vector<VnRange> vn_ranges;  // per rank
  std::optional<PipelineLayout> pipeline;
  std::optional<PipelineMorph> morph;  // a pipeline's later generations
  std::vector<double> slowdown;        // per rank: its emulated device's (resources file); empty: none

  // The rank of worker `id`, or -1 when it is not a member.
  int rankOf(int64_t id) const;
  bool releases(int64_t id) const;
  std::vector<int64_t> shares() const;  // VNs per rank
  double slowdownOf(int rank) const { return slowdown.empty() ? 1.0 : slowdown.at(static_cast<size_t>(rank)); }

  nlohmann::json toJson() const;
  // Throws MessageError (control/protocol/message.h) naming the field for
  // anything that is not a plan toJson could have written: missing or
  // mistyped fields, a rank or range out of bounds, lists whose lengths
  // disagree.
  static GenerationPlan fromJson(const nlohmann::json& j);
};

}  // namespace morph
