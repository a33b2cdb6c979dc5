#include "control/protocol/job_key_policy.h"

#include <algorithm>
#include <iterator>
#include <vector>

#include "control/protocol/keys.h"

namespace morph {

using store::Op;
using store::Role;

namespace {

bool isDigits(const std::string& s) {
  return !s.empty() && s.size() <= 18 && s.find_first_not_of("0123456789") == std::string::npos;
}

// "a/b/c" -> {"a", "b", "c"}
std::vector<std::string> splitKey(const std::string& k) {
  std::vector<std::string> parts;
  size_t a = 0;
  while (true) {
    const size_t b = k.find('/', a);
    parts.push_back(k.substr(a, b == std::string::npos ? std::string::npos : b - a));
    if (b == std::string::npos) return parts;
    a = b + 1;
  }
}

bool startsWith(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

template <size_t N>
bool oneOf(const std::string& s, const char* const (&names)[N]) {
  return std::find(std::begin(names), std::end(names), s) != std::end(names);
}

// gen/<g>/<rest>: the parts after gen/<g>, or none when `key` is not a
// generation's key.
std::vector<std::string> generationParts(const std::string& key) {
  if (!startsWith(key, keys::kGenPrefix)) return {};
  std::vector<std::string> p = splitKey(key.substr(keys::kGenPrefix.size()));
  if (p.size() < 2 || !isDigits(p[0])) return {};
  p.erase(p.begin());
  return p;
}

}  // namespace

std::string JobKeyPolicy::registrationKey() const { return keys::kNextWorkerId; }

bool JobKeyPolicy::wakes(const std::string& key) const {
  const std::string& hb = keys::kHeartbeatSuffix;
  return !(startsWith(key, keys::kWorkersPrefix) && key.size() > hb.size() &&
           key.compare(key.size() - hb.size(), hb.size(), hb) == 0);
}

std::string JobKeyPolicy::refusal(const Role& role, Op op, const std::string& key, int64_t delta) const {
  if (role.kind == Role::kManager) return "";
  if (role.kind == Role::kClient) {
    if ((key == keys::kResizeTarget && op == Op::kSet) || (key == keys::kResizeSeq && op == Op::kAdd)) return "";
    if (startsWith(key, keys::kSlowPrefix) && isDigits(key.substr(keys::kSlowPrefix.size())) && op == Op::kSet)
      return "";
    return "a client may write only " + keys::kResizeTarget + ", " + keys::kResizeSeq + " and " + keys::kSlowPrefix +
           "<id>";
  }
  if (role.worker < 0) {
    if (key == keys::kNextWorkerId && op == Op::kAdd && delta == 1) return "";
    return "a worker must register (add 1 to " + keys::kNextWorkerId + ") before it writes";
  }
  const int64_t me = role.worker;
  if (startsWith(key, keys::workerPrefix(me))) return "";
  if (key == keys::result(me) || key == keys::trace(me)) return "";
  if (startsWith(key, keys::kMetricsPrefix) && isDigits(key.substr(keys::kMetricsPrefix.size())) && op == Op::kSet)
    return "";
  if (key == keys::kEvents && op == Op::kAdd) return "";
  // The job's first and last step: whichever worker gets there first
  // creates them (compareSet from empty; a later one changes nothing), so a
  // job whose worker 0 died still starts. Worker 0 may also set them.
  if ((key == keys::kJobSteps || key == keys::kJobStartStep) &&
      (op == Op::kCompareSet || (me == 0 && op == Op::kSet)))
    return "";
  // Its own reports of a generation, and Gloo's rendezvous of its groups.
  const std::vector<std::string> g = generationParts(key);
  if (g.size() == 2 && oneOf(g[0], keys::kMemberReports) && g[1] == std::to_string(me)) return "";
  if (g.size() >= 2 && oneOf(g[0], keys::kGenGroups)) return "";
  return "worker " + std::to_string(me) + " may not write this key (only its own keys: docs/store_protocol.md)";
}

}  // namespace morph
