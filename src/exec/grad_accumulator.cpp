#include "exec/grad_accumulator.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "exec/fixed_point.h"

namespace morph {

namespace {
// Step 0 has no previous maximum; assume |g| < 2^4. A larger first gradient
// costs one redo of step 0, the same on every mapping.
constexpr double kInitialMaxGuess = 16.0;
}  // namespace

GradAccumulator::GradAccumulator(std::vector<int64_t> segment_sizes, ReduceMode mode, int headroom_bits, int bits,
                                 int64_t terms)
    : sizes_(std::move(segment_sizes)),
      mode_(mode),
      headroom_bits_(headroom_bits),
      bits_(bits),
      terms_(terms),
      top_(fixedTop(bits, terms)),
      bound_(fixedBound(bits, terms)) {
  MORPH_CHECK(bits == 64 || bits == 32, "reduce.bits is 32 or 64");
  for (int64_t s : sizes_) {
    offsets_.push_back(total_);
    total_ += s;
  }
  scales_.assign(sizes_.size(), scaleFor(kInitialMaxGuess, headroom_bits_, top_));
  next_scales_ = scales_;
  // The buffer itself is allocated by the first beginStep(): a pipeline
  // stage replaces the whole-model accumulator before it is used.
  max_.assign(sizes_.size(), 0.0);
  fresh_.assign(sizes_.size(), 1);
  float_run_.assign(sizes_.size(), -1);
  float_divisor_.assign(sizes_.size(), 0.0);
}

int64_t GradAccumulator::bufferBytes() const {
  return mode_ == ReduceMode::kExact && bits_ == 64 ? total_ * 8 : total_ * 4;
}

int64_t* GradAccumulator::exactBuffer() {
  MORPH_CHECK(mode_ == ReduceMode::kExact && bits_ == 64, "exactBuffer: the 64-bit exact format");
  settle();
  return exact_.data();
}

int32_t* GradAccumulator::exact32Buffer() {
  MORPH_CHECK(mode_ == ReduceMode::kExact && bits_ == 32, "exact32Buffer: the 32-bit exact format");
  settle();
  return exact32_.data();
}

void GradAccumulator::beginStep() {
  scales_ = next_scales_;
  tail_ = tail_next_;
  // No zeroing pass over the segments: each is fresh (logically zero)
  // until its first add() of the step stores instead of adding.
  const size_t len = static_cast<size_t>(total_ + tail_);
  if (mode_ == ReduceMode::kExact && bits_ == 32) {
    exact32_.resize(static_cast<size_t>(total_ + 4 * tail_));
    std::fill(exact32_.begin() + total_, exact32_.end(), int32_t{0});
    tail64_.assign(static_cast<size_t>(tail_), int64_t{0});
  } else if (mode_ == ReduceMode::kExact) {
    exact_.resize(len);
    std::fill(exact_.begin() + total_, exact_.end(), int64_t{0});
  } else {
    float_.resize(len);
    std::fill(float_.begin() + total_, float_.end(), 0.0f);
  }
  std::fill(fresh_.begin(), fresh_.end(), 1);
  std::fill(max_.begin(), max_.end(), 0.0);
  std::fill(float_run_.begin(), float_run_.end(), -1);
  overflow_ = nonfinite_ = false;
}

void GradAccumulator::add(size_t seg, const float* values) {
  MORPH_CHECK_LT(seg, sizes_.size());
  const int64_t n = sizes_[seg], off = offsets_[seg];
  const bool first = fresh_[seg];
  fresh_[seg] = 0;
  if (mode_ == ReduceMode::kExact) {
    QuantizeResult r;
    if (bits_ == 32) {
      r = first ? quantizeStore(values, n, scales_[seg], exact32_.data() + off, bound_)
                : quantizeAdd(values, n, scales_[seg], exact32_.data() + off, bound_);
    } else {
      r = first ? quantizeStore(values, n, scales_[seg], exact_.data() + off, bound_)
                : quantizeAdd(values, n, scales_[seg], exact_.data() + off, bound_);
    }
    max_[seg] = std::max(max_[seg], r.max_abs);
    overflow_ = overflow_ || r.overflow;
    nonfinite_ = nonfinite_ || r.nonfinite;
  } else if (first) {
    std::memcpy(float_.data() + off, values, static_cast<size_t>(n) * sizeof(float));
  } else {
    // A vectorisable add; Inf and NaN propagate into the sum, which
    // flagsAndMax() checks once per step.
    float* acc = float_.data() + off;
    for (int64_t i = 0; i < n; ++i) acc[i] += values[i];
  }
}

void GradAccumulator::addPair(size_t seg, const float* a, const float* b) {
  MORPH_CHECK_LT(seg, sizes_.size());
  MORPH_CHECK(mode_ == ReduceMode::kExact, "addPair: exact mode");
  const int64_t n = sizes_[seg], off = offsets_[seg];
  const bool first = fresh_[seg];
  fresh_[seg] = 0;
  QuantizeResult r;
  if (bits_ == 32) {
    r = first ? quantizePairStore(a, b, n, scales_[seg], exact32_.data() + off, bound_)
              : quantizePairAdd(a, b, n, scales_[seg], exact32_.data() + off, bound_);
  } else {
    r = first ? quantizePairStore(a, b, n, scales_[seg], exact_.data() + off, bound_)
              : quantizePairAdd(a, b, n, scales_[seg], exact_.data() + off, bound_);
  }
  max_[seg] = std::max(max_[seg], r.max_abs);
  overflow_ = overflow_ || r.overflow;
  nonfinite_ = nonfinite_ || r.nonfinite;
}

void GradAccumulator::settle() {
  for (size_t seg = 0; seg < sizes_.size(); ++seg) {
    if (!fresh_[seg]) continue;
    const size_t off = static_cast<size_t>(offsets_[seg]), n = static_cast<size_t>(sizes_[seg]);
    if (mode_ == ReduceMode::kExact && bits_ == 32) std::fill_n(exact32_.begin() + off, n, int32_t{0});
    else if (mode_ == ReduceMode::kExact) std::fill_n(exact_.begin() + off, n, int64_t{0});
    else std::fill_n(float_.begin() + off, n, 0.0f);
    fresh_[seg] = 0;
  }
}

std::vector<double> GradAccumulator::flagsAndMax() const {
  bool nonfinite = nonfinite_;
  if (mode_ == ReduceMode::kFloat) {
    auto scan = [this](int64_t begin, int64_t end) {
      uint32_t all_ones = 0;  // exponent bits all set <=> Inf or NaN
      const float* v = float_.data();
      for (int64_t i = begin; i < end; ++i) {
        uint32_t bits;
        std::memcpy(&bits, v + i, sizeof bits);
        all_ones |= ((bits >> 23) & 0xFFu) == 0xFFu;
      }
      return all_ones != 0;
    };
    for (size_t seg = 0; seg < sizes_.size(); ++seg)
      if (!fresh_[seg]) nonfinite = nonfinite || scan(offsets_[seg], offsets_[seg] + sizes_[seg]);
    nonfinite = nonfinite || scan(total_, total_ + tail_);
  }
  std::vector<double> f;
  f.reserve(2 + max_.size());
  f.push_back(overflow_ ? 1.0 : 0.0);
  f.push_back(nonfinite ? 1.0 : 0.0);
  f.insert(f.end(), max_.begin(), max_.end());
  return f;
}

void GradAccumulator::updateScales(const std::vector<double>& reduced) {
  MORPH_CHECK_EQ(reduced.size(), 2 + scales_.size());
  if (mode_ != ReduceMode::kExact) return;
  for (size_t s = 0; s < scales_.size(); ++s)
    if (reduced[2 + s] > 0.0) next_scales_[s] = scaleFor(reduced[2 + s], headroom_bits_, top_);
}

void GradAccumulator::read(size_t seg, double divisor, float* out) const {
  const int64_t n = sizes_[seg], off = offsets_[seg];
  if (mode_ == ReduceMode::kExact && float_run_[seg] >= 0)
    MORPH_CHECK(divisor == float_divisor_[seg], "a sharded sum's floats read with another divisor");
  if (fresh_[seg]) {
    std::fill_n(out, n, 0.0f);
  } else if (mode_ == ReduceMode::kExact && float_run_[seg] >= 0) {
    // The run's floats start at its first value's memory (4 bytes each).
    const char* floats = bits_ == 32 ? reinterpret_cast<const char*>(exact32_.data() + float_run_[seg])
                                     : reinterpret_cast<const char*>(exact_.data() + float_run_[seg]);
    std::memcpy(out, floats + 4 * (off - float_run_[seg]), static_cast<size_t>(n) * 4);
  } else if (mode_ == ReduceMode::kExact && bits_ == 32) {
    dequantize(exact32_.data() + off, n, scales_[seg], divisor, out);
  } else if (mode_ == ReduceMode::kExact) {
    dequantize(exact_.data() + off, n, scales_[seg], divisor, out);
  } else {
    const float inv = static_cast<float>(1.0 / divisor);
    for (int64_t i = 0; i < n; ++i) out[i] = float_[static_cast<size_t>(off + i)] * inv;
  }
}

void GradAccumulator::dequantizeRange(size_t first, size_t end, const std::vector<double>& divisors, int64_t begin,
                                      const int64_t* sums, int64_t len, float* out) const {
  MORPH_CHECK_EQ(divisors.size(), end - first);
  for (size_t seg = first; seg < end; ++seg) {
    const int64_t lo = std::max(begin, offsets_[seg]), hi = std::min(begin + len, offsets_[seg] + sizes_[seg]);
    if (lo < hi) dequantize(sums + (lo - begin), hi - lo, scales_[seg], divisors[seg - first], out + (lo - begin));
  }
}

void GradAccumulator::dequantizeRange(size_t first, size_t end, const std::vector<double>& divisors, int64_t begin,
                                      const int32_t* sums, int64_t len, float* out) const {
  MORPH_CHECK_EQ(divisors.size(), end - first);
  for (size_t seg = first; seg < end; ++seg) {
    const int64_t lo = std::max(begin, offsets_[seg]), hi = std::min(begin + len, offsets_[seg] + sizes_[seg]);
    if (lo < hi) dequantize(sums + (lo - begin), hi - lo, scales_[seg], divisors[seg - first], out + (lo - begin));
  }
}

void GradAccumulator::markFloats(size_t first, size_t end, const std::vector<double>& divisors) {
  MORPH_CHECK(mode_ == ReduceMode::kExact && divisors.size() == end - first, "markFloats: an exact run");
  for (size_t seg = first; seg < end; ++seg) {
    float_run_[seg] = offsets_[first];
    float_divisor_[seg] = divisors[seg - first];
  }
}

double GradAccumulator::readScalar(size_t seg, int64_t i) const {
  const size_t k = static_cast<size_t>(offsets_[seg] + i);
  MORPH_CHECK(float_run_[seg] < 0, "readScalar of a sharded sum's floats");
  if (fresh_[seg]) return 0.0;
  if (mode_ == ReduceMode::kExact && bits_ == 32) return std::ldexp(static_cast<double>(exact32_[k]), -scales_[seg]);
  if (mode_ == ReduceMode::kExact) return std::ldexp(static_cast<double>(exact_[k]), -scales_[seg]);
  return float_[k];
}

}  // namespace morph
