#include "control/protocol/resize_request.h"

#include <algorithm>

#include "control/protocol/message.h"

namespace morph {

using json = nlohmann::json;
using namespace message;

namespace {
const char* const kResize = "ctl/resize_target";
constexpr int64_t kMaxWorkers = 1 << 20;
}  // namespace

std::string ResizeRequest::encode() const {
  if (release.empty()) return std::to_string(workers);
  return json({{"workers", workers}, {"release", release}}).dump();
}

ResizeRequest ResizeRequest::decode(const std::string& value) {
  ResizeRequest r;
  if (!value.empty() && value.size() <= 7 && value.find_first_not_of("0123456789") == std::string::npos) {
    r.workers = static_cast<int>(std::stoll(value));
    if (r.workers < 1) throw MessageError(std::string(kResize) + ": expected at least 1 worker, not " + value);
    return r;
  }
  const json j = json::parse(value, nullptr, false);
  if (!j.is_object())
    throw MessageError(std::string(kResize) + ": expected a worker count or a JSON object, not '" + value.substr(0, 40) +
                       "'");
  r.workers = static_cast<int>(integer(j, "workers", kResize, 1, kMaxWorkers));
  r.release = integers(j, "release", kResize, 0);
  if (r.release.empty() || !std::is_sorted(r.release.begin(), r.release.end()) ||
      std::adjacent_find(r.release.begin(), r.release.end()) != r.release.end())
    throw MessageError(std::string(kResize) + ": 'release' is not a non-empty list of distinct worker ids in ascending order");
  return r;
}

}  // namespace morph
