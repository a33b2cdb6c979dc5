#include "control/protocol/reach_report.h"

#include <algorithm>

#include "control/protocol/message.h"

namespace morph {

using json = nlohmann::json;
using namespace message;

namespace {
const char* const kReach = "reach report";
}  // namespace

json ReachReport::toJson() const { return {{"generation", generation}, {"unreachable", unreachable}}; }

ReachReport ReachReport::fromJson(const json& j) {
  ReachReport r;
  r.generation = integer(j, "generation", kReach, 0);
  r.unreachable = integers(j, "unreachable", kReach, 0);
  if (!std::is_sorted(r.unreachable.begin(), r.unreachable.end()) ||
      std::adjacent_find(r.unreachable.begin(), r.unreachable.end()) != r.unreachable.end())
    throw MessageError(std::string(kReach) + ": 'unreachable' is not a list of distinct worker ids in ascending order");
  return r;
}

}  // namespace morph
