// ReachReport: which peers a worker cannot reach, under workers/<id>/reach
// (docs/distributed.md, "Partitions"). A member whose collective has not
// progressed past its deadline probes every member of its generation
// (a TCP connect to the peer's probe address, workers/<id>/probe) and
// writes the ones that did not answer; a worker the manager set aside for a
// partition writes an empty list once it reaches every member of the
// current generation again. One encoder (the worker) and one decoder (the
// manager), fuzzed (tests/fuzz/reach_report_fuzz.cpp). Plain data.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

namespace morph {

struct ReachReport {
  int64_t generation = 0;             // the generation whose members were probed
  std::vector<int64_t> unreachable;   // worker ids that did not answer, ascending

  nlohmann::json toJson() const;
  // MessageError (control/protocol/message.h) naming the field for
  // anything toJson could not have written.
  static ReachReport fromJson(const nlohmann::json& j);
};

}  // namespace morph
