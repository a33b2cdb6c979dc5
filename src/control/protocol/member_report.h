// MemberReport: what a member tells the manager when it leaves a
// generation, under gen/<g>/ready/<id> (to regroup) or gen/<g>/left/<id>
// (to exit): the steps it has committed, the metrics line of the last one
// (which stands in when rank 0 lagged a step behind), and in a pipeline the
// layers it holds with that step's state (what a morph may move from it).
// One encoder (toJson, the worker) and one decoder (fromJson, the manager),
// fuzzed (tests/fuzz/member_report_fuzz.cpp). Plain data.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>

namespace morph {

// Layers [lo, hi) a pipeline worker holds at its committed step; `prepared`:
// it also holds the next step computed up to its last collective
// (StepCore::prepared(); docs/pipeline.md, "One step for every stage").
struct HeldLayers {
  size_t lo = 0, hi = 0;
  bool prepared = false;
};

struct MemberReport {
  int64_t committed = 0;      // steps committed (the next step to run)
  // The metrics line of the last step it committed (an object with its
  // "step"); null: none yet.
  nlohmann::json line;
  std::optional<HeldLayers> held;  // pipeline workers

  nlohmann::json toJson() const;
  // MessageError (control/protocol/message.h) naming the field for
  // anything toJson could not have written.
  static MemberReport fromJson(const nlohmann::json& j);
};

}  // namespace morph
