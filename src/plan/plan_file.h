// Plan files: how `morph run --plan FILE` is told where to cut a model and,
// optionally, how wide to run it and with which schedule. `morph plan
// --out` writes the full form; a hand-written file may give `stages` only.
// Format (docs/pipeline.md, "Plan files"):
//   {"stages": [["first layer", "last layer"], ...],      required
//    "replicas": D, "schedule": "1f1b", "recompute": false, optional
//    "vn_shares": [VNs of replica 0, ...],                  optional
//    "workers": [worker slot of world rank 0, ...]}         optional (devices)
// Other keys (the planner's predictions) are kept for people and ignored.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "plan/simulator.h"

namespace morph {

struct PlanFile {
  std::vector<size_t> cuts;  // stages + 1 layer boundaries
  std::optional<int> replicas;
  std::optional<ScheduleKind> schedule;
  std::optional<bool> recompute;
  std::vector<int64_t> vn_shares;  // empty: even shares
  std::vector<int> workers;        // worker slot per world rank; empty: rank r on slot r
  int stages() const { return static_cast<int>(cuts.size()) - 1; }
};

// InputError naming the file, the key (`stages[1][0]`, `vn_shares`) and what
// was expected. `virtual_nodes` checks that vn_shares add up to the job's.
PlanFile readPlanFile(const std::string& path, const std::vector<std::string>& layer_names,
                      int64_t virtual_nodes);

// Writes `plan` (atomically) with `notes` (a JSON object text, may be
// empty) merged in: predicted times, the profile it came from.
void writePlanFile(const std::string& path, const PlanSpec& plan, const std::vector<std::string>& layer_names,
                   const std::string& notes_json);

// "conv1..fc | head" (for logs and messages).
std::string describeCuts(const std::vector<std::string>& layer_names, const std::vector<size_t>& cuts);

}  // namespace morph
