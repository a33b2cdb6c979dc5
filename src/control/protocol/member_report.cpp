#include "control/protocol/member_report.h"

#include "control/protocol/message.h"

namespace morph {

using json = nlohmann::json;
using namespace message;

namespace {
const char* const kReport = "member report";
}  // namespace

json MemberReport::toJson() const {
  json j = {{"committed", committed}};
  if (!line.is_null()) j["line"] = line;
  if (held) {
    j["held"] = {held->lo, held->hi};
    j["prepared"] = held->prepared;
  }
  return j;
}

MemberReport MemberReport::fromJson(const json& j) {
  MemberReport r;
  r.committed = integer(j, "committed", kReport, 0);
  if (j.contains("line")) {
    r.line = j.at("line");
    integer(r.line, "step", std::string(kReport) + " 'line'", 0);  // the manager files it under its step
  }
  if (j.contains("held")) {
    const std::vector<int64_t> h = integers(j, "held", kReport, 0, 1 << 24);
    if (h.size() != 2 || h[0] > h[1]) throw MessageError(std::string(kReport) + ": 'held' is not [lo, hi) layers");
    r.held = HeldLayers{static_cast<size_t>(h[0]), static_cast<size_t>(h[1]), boolean(j, "prepared", kReport)};
  }
  return r;
}

}  // namespace morph
