// Which VNs go to which worker: the one home of the rule. A worker (or a
// pipeline replica) runs a contiguous range of the global batch's VNs, in
// rank order; its share is the range's length. Shares come from an even
// split (the default), from speeds (mixed devices, a straggler re-plan:
// each VN to the worker that would finish it first) or from a plan file;
// ranges always come from shares the same way. Any assignment gives the
// same model bits (docs/exact_reduction.md): only who computes which VN
// changes. Pure logic.
#pragma once

#include <cstdint>
#include <vector>

namespace morph {

// VNs [begin, end) of the global batch.
struct VnRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const VnRange& o) const { return begin == o.begin && end == o.end; }
};

// Even shares of `vns` over `parts`: the first vns % parts get one more
// (12 VNs over 5: 3,3,2,2,2).
std::vector<int64_t> evenShares(int64_t vns, int parts);

// Shares of `vns` for workers whose VN takes `seconds[w]`, minimising the
// slowest worker's time max_w share_w * seconds[w]: each VN goes to the
// worker that would finish it first (exact for equal-sized tasks on workers
// of different speeds; ties to the lower index). A worker may get 0; with
// min_each, every worker gets at least that many (the rest as above).
// InputError when vns cannot give every worker min_each.
std::vector<int64_t> weightedShares(int64_t vns, const std::vector<double>& seconds, int64_t min_each = 0);

// A WSP job's virtual workers' shares (docs/wsp.md, "VN shares by device
// speed"): VW r runs on worker slot slots[r], whose device takes
// slot_seconds[slot] per VN (deviceVnSeconds(), plan/resources.h). Empty
// slot_seconds (no resources file): even shares. Otherwise
// weightedShares(vns, ..., 1): every VW at least one VN (a slot past
// slot_seconds, a joiner with a new id, counts as the fastest). The runtime's
// generations and the planner's prediction both call this.
// InputError when vns < slots.size().
std::vector<int64_t> wspShares(int64_t vns, const std::vector<double>& slot_seconds, const std::vector<int64_t>& slots);

// Contiguous ranges of the shares, in order, from VN 0.
std::vector<VnRange> rangesOf(const std::vector<int64_t>& shares);

// Even ranges of `vns` VNs for `workers` workers (the job's default plan).
// InputError naming --workers when a worker would get no VN (workers < 1
// or more workers than VNs).
std::vector<VnRange> evenRanges(int64_t vns, int workers);

}  // namespace morph
