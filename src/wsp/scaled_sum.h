// Exact sums of fixed-point values quantised at per-tensor scales that may
// differ (docs/wsp.md): a virtual worker's wave sum, whose minibatches keep
// their pulled scales unless a local redo coarsened them, and a server
// shard's sum of one clock's pushes. A value at a finer scale is brought to
// the coarser one by an arithmetic right shift rounding half to even:
// integer arithmetic, so the same inputs give the same bits every time.
#pragma once

#include <cstdint>
#include <vector>

namespace morph {

// round_half_even(x / 2^k) for k >= 0 (k above 62 is taken as 62, where any
// value below 2^62 rounds to 0 or +-1).
int64_t shiftRightHalfEven(int64_t x, int k);

// A run of segments (tensors) of int64 values, each segment with one scale
// (values are g x 2^scale) and the largest |g| summed into it.
struct ScaledValues {
  std::vector<int64_t> sizes;   // per segment
  std::vector<int> scales;      // per segment
  std::vector<double> maxima;   // per segment: max |g| over what was summed
  std::vector<int64_t> values;  // the segments' values, concatenated
  int64_t terms = 0;            // additions since clear()

  explicit ScaledValues(std::vector<int64_t> segment_sizes = {});
  void clear();
  // Adds `vals` (the segments concatenated) quantised at `scl`, of maxima
  // `mx`: each segment is kept at the coarser of its two scales. Not
  // commutative when scales differ (the running sum is shifted): callers
  // add in a fixed order (the wave's minibatch order), or use sumAll.
  void add(const int64_t* vals, const int* scl, const double* mx);
};

// The sum of `parts` (same segment sizes) at each segment's coarsest scale:
// every part is shifted on its own before the integers are added, so the
// result does not depend on the parts' order.
ScaledValues sumAll(const std::vector<const ScaledValues*>& parts);

}  // namespace morph
