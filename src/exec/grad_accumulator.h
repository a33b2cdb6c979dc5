// GradAccumulator: the one buffer into which a worker adds every VN's
// gradient (and every other quantity that is summed over VNs: batch-norm
// statistics, loss). Its memory is constant in the number of VNs.
//
// Exact mode: an int64 fixed-point buffer (int32 with reduce.bits = 32),
// one power-of-two scale per segment (tensor) that all workers agree on
// before the step; integer addition makes the sum independent of the order
// and placement of VNs. Float mode: a float buffer (fast, not bitwise
// reproducible across mappings).
//
// Per step: beginStep(); add() for each VN and segment; the caller reduces
// flagsAndMax() with MAX and the buffer with SUM across workers; then
// updateScales() with the reduced maxima (they take effect at the next
// beginStep()); if the reduced overflow flag is set the step is redone, else
// read() gives the summed values.
#pragma once

#include <cstdint>
#include <vector>

#include "core/job_spec.h"

namespace morph {

class GradAccumulator {
 public:
  // bits (reduce.bits) and terms (the most quantised terms a summed value
  // has over a step: VNs x contributions per VN, 2 for a tied weight) set
  // the exact mode's bound: 64, or 32 (every sum of up to `terms` terms fits
  // in int32, so the buffer is int32: exact32Buffer(), which is also the
  // wire of StepCore::startSum32).
  GradAccumulator(std::vector<int64_t> segment_sizes, ReduceMode mode, int headroom_bits, int bits = 64,
                  int64_t terms = 1);

  void beginStep();
  // Adds one VN's values of segment `seg` (segmentSize(seg) floats). The
  // first add() of a segment in a step stores (beginStep() leaves the
  // segments as they were, each "fresh": logically zero, which read(),
  // readScalar() and flagsAndMax() honour).
  void add(size_t seg, const float* values);
  // Exact mode: two VNs' values of segment `seg` at once, the same as
  // add(seg, a) then add(seg, b) (each term rounded on its own, integer
  // sums), in one pass over the buffer.
  void addPair(size_t seg, const float* a, const float* b);
  // Zeroes the segments no add() has touched this step, so that the buffer
  // itself holds the sums' terms; the non-const buffer accessors (the
  // collectives' way in) do it first.
  void settle();

  // [overflow, nonfinite, max|g| of segment 0, 1, ...], to be maximised over
  // workers (a MAX all-reduce, or gathered: VnExecutor::writeSlots).
  std::vector<double> flagsAndMax() const;
  static bool overflowOf(const std::vector<double>& f) { return f[0] != 0.0; }
  static bool nonfiniteOf(const std::vector<double>& f) { return f[1] != 0.0; }
  // Next scales from the globally reduced flagsAndMax(); segments whose max
  // is zero keep their scale.
  void updateScales(const std::vector<double>& reduced_flags_and_max);

  // The summed values of a segment divided by `divisor`, as floats.
  void read(size_t seg, double divisor, float* out) const;
  // Sharded exact sums (comm/communicator.h, startShardedSum) of the run
  // of segments [first, end): the values [begin, begin + len) of the buffer
  // (offsets from the buffer's start, within the run) turned into floats
  // from their sums `sums`, each segment's divided by
  // divisors[seg - first]: the floats read() would give.
  void dequantizeRange(size_t first, size_t end, const std::vector<double>& divisors, int64_t begin,
                       const int64_t* sums, int64_t len, float* out) const;
  void dequantizeRange(size_t first, size_t end, const std::vector<double>& divisors, int64_t begin,
                       const int32_t* sums, int64_t len, float* out) const;
  // The run's sums are (once its sum is done) floats in place of its
  // integers, already divided: read() copies them and checks the divisor.
  // Until the next beginStep().
  void markFloats(size_t first, size_t end, const std::vector<double>& divisors);
  double readScalar(size_t seg, int64_t i) const;  // one summed value, unscaled

  ReduceMode mode() const { return mode_; }
  int bits() const { return bits_; }
  int64_t terms() const { return terms_; }
  size_t segments() const { return sizes_.size(); }
  int64_t segmentSize(size_t seg) const { return sizes_[seg]; }
  const std::vector<int64_t>& segmentSizes() const { return sizes_; }
  int64_t segmentOffset(size_t seg) const { return offsets_[seg]; }
  int64_t totalElements() const { return total_; }
  // The 64-bit format's buffer (bits() == 64).
  int64_t* exactBuffer();
  // The 32-bit format's (bits() == 32): the segments' int32 values, then
  // 4 x tailSize() int32 for the wire's 16-bit lanes of the tail's int64
  // values (StepCore::startSum32; zeroed by beginStep()).
  int32_t* exact32Buffer();
  float* floatBuffer() {
    settle();
    return float_.data();
  }
  // `n` more values (float or int64; int64 in both exact formats) after
  // the segments from the next beginStep() on, zeroed by it and summed with the
  // bucket of the last segment (StepCore::startSum). Each worker writes its
  // values into its own slots there, and the others' are 0, so the sum
  // gathers every worker's exactly (VnExecutor: the flags, maxima and
  // control values, with no MAX all-reduce of their own).
  void setTail(int64_t n) { tail_next_ = n; }
  int64_t tailSize() const { return tail_; }  // in effect since the last beginStep()
  float* floatTail() { return float_.data() + total_; }
  const float* floatTail() const { return float_.data() + total_; }
  int64_t* exactTail() { return bits_ == 32 ? tail64_.data() : exact_.data() + total_; }
  const int64_t* exactTail() const { return bits_ == 32 ? tail64_.data() : exact_.data() + total_; }
  int64_t bufferBytes() const;

  // Scale state for the next step: part of the training state (checkpointed
  // and migrated).
  const std::vector<int>& scales() const { return next_scales_; }
  // The scales the current step's values are quantised with (until the next
  // beginStep(); WSP pushes them with the sums, docs/wsp.md).
  const std::vector<int>& usedScales() const { return scales_; }
  void setScales(std::vector<int> s) { scales_ = next_scales_ = std::move(s); }

 private:
  std::vector<int64_t> sizes_, offsets_;
  int64_t total_ = 0;
  int64_t tail_ = 0, tail_next_ = 0;  // values after the segments (setTail)
  ReduceMode mode_;
  int headroom_bits_;
  int bits_;
  int64_t terms_;
  int top_;        // fixedTop(bits_, terms_)
  double bound_;   // fixedBound(bits_, terms_)
  std::vector<int> scales_;       // in use by the current attempt
  std::vector<int> next_scales_;  // from the last updateScales()
  std::vector<int64_t> exact_;   // exact mode, 64 bits: segments, then the tail
  std::vector<int32_t> exact32_; // 32 bits: segments, then the tail's lanes
  std::vector<int64_t> tail64_;  // 32 bits: the tail
  std::vector<float> float_;
  std::vector<double> max_;
  std::vector<char> fresh_;  // per segment: no add() yet this step (logically zero)
  // Per segment, for runs marked by markFloats(): the run's first value
  // (where its floats start) and the divisor applied; -1 otherwise.
  std::vector<int64_t> float_run_;
  std::vector<double> float_divisor_;
  bool overflow_ = false, nonfinite_ = false;
};

}  // namespace morph
