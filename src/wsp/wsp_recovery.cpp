// WSP checkpoint and regroup rules (wsp_recovery.h).
#include "wsp/wsp_recovery.h"

#include <algorithm>

namespace morph {

bool wspCheckpointDue(int64_t version, int64_t wave, int64_t every, int64_t steps) {
  if (every <= 0 || version < 1 || wave < 1) return false;
  const int64_t done = std::min(version * wave, steps), before = std::min((version - 1) * wave, steps);
  return done > before && done / every > before / every;
}

LostWork lostWork(const std::vector<int64_t>& pushed, int64_t restored) {
  LostWork w;
  w.restored = restored;
  w.end = restored;
  for (int64_t p : pushed) {
    w.end = std::max(w.end, p);
    w.pushes += std::max<int64_t>(0, p - restored);
  }
  return w;
}

std::vector<int64_t> mergePushed(const std::vector<std::vector<int64_t>>& reports, size_t vws) {
  std::vector<int64_t> out(vws, 0);
  for (const auto& r : reports)
    for (size_t v = 0; v < std::min(vws, r.size()); ++v) out[v] = std::max(out[v], r[v]);
  return out;
}

}  // namespace morph
