#include "plan/vn_shares.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <string>
#include <utility>

#include "core/error.h"

namespace morph {

std::vector<int64_t> evenShares(int64_t vns, int parts) {
  std::vector<int64_t> out;
  for (int d = 0; d < parts; ++d) out.push_back(vns / parts + (d < vns % parts ? 1 : 0));
  return out;
}

std::vector<int64_t> weightedShares(int64_t vns, const std::vector<double>& seconds, int64_t min_each) {
  const int64_t n = static_cast<int64_t>(seconds.size());
  if (min_each < 0 || min_each * n > vns) throw InputError("weightedShares: cannot give every worker " +
                                                           std::to_string(min_each) + " of " + std::to_string(vns) + " VNs");
  std::vector<int64_t> out(seconds.size(), min_each);
  // Min-heap of (finish time of one more VN, worker): the smallest time,
  // then the lowest index, takes the next VN.
  using Slot = std::pair<double, size_t>;
  std::priority_queue<Slot, std::vector<Slot>, std::greater<Slot>> next;
  for (size_t w = 0; w < seconds.size(); ++w) next.push({static_cast<double>(min_each + 1) * seconds[w], w});
  for (int64_t v = min_each * n; v < vns && !next.empty(); ++v) {
    const size_t w = next.top().second;
    next.pop();
    ++out[w];
    next.push({static_cast<double>(out[w] + 1) * seconds[w], w});
  }
  return out;
}

std::vector<int64_t> wspShares(int64_t vns, const std::vector<double>& slot_seconds, const std::vector<int64_t>& slots) {
  const int n = static_cast<int>(slots.size());
  if (n < 1 || vns < n)
    throw InputError("batch.virtual_nodes = " + std::to_string(vns) + " cannot feed " + std::to_string(n) +
                     " virtual workers (each needs at least one VN)");
  if (slot_seconds.empty()) return evenShares(vns, n);
  // A slot past the file's devices (a joiner with a new id) counts as its fastest device.
  const double fastest = *std::min_element(slot_seconds.begin(), slot_seconds.end());
  std::vector<double> s;
  for (int64_t slot : slots)
    s.push_back(slot >= 0 && static_cast<size_t>(slot) < slot_seconds.size() ? slot_seconds[static_cast<size_t>(slot)]
                                                                             : fastest);
  return weightedShares(vns, s, 1);
}

std::vector<VnRange> rangesOf(const std::vector<int64_t>& shares) {
  std::vector<VnRange> out;
  int64_t b = 0;
  for (int64_t n : shares) {
    out.push_back({b, b + n});
    b += n;
  }
  return out;
}

std::vector<VnRange> evenRanges(int64_t vns, int workers) {
  if (workers < 1) throw InputError("--workers: expected at least 1 worker");
  if (workers > vns)
    throw InputError("--workers " + std::to_string(workers) + ": the job has only " + std::to_string(vns) +
                     " virtual nodes (batch.virtual_nodes), so at most that many workers can hold one");
  return rangesOf(evenShares(vns, workers));
}

}  // namespace morph
