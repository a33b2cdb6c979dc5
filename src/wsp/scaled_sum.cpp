// Scaled fixed-point sums (scaled_sum.h).
#include "wsp/scaled_sum.h"

#include <algorithm>

#include "core/error.h"

namespace morph {

int64_t shiftRightHalfEven(int64_t x, int k) {
  if (k <= 0) return x;
  k = std::min(k, 62);
  const int64_t q = x >> k;  // floor
  const int64_t r = x - q * (int64_t{1} << k);
  const int64_t half = int64_t{1} << (k - 1);
  return (r > half || (r == half && (q & 1))) ? q + 1 : q;
}

ScaledValues::ScaledValues(std::vector<int64_t> segment_sizes) : sizes(std::move(segment_sizes)) {
  int64_t n = 0;
  for (int64_t s : sizes) n += s;
  scales.assign(sizes.size(), 0);
  maxima.assign(sizes.size(), 0.0);
  values.assign(static_cast<size_t>(n), 0);
}

void ScaledValues::clear() {
  std::fill(values.begin(), values.end(), 0);
  std::fill(maxima.begin(), maxima.end(), 0.0);
  terms = 0;
}

void ScaledValues::add(const int64_t* vals, const int* scl, const double* mx) {
  int64_t off = 0;
  for (size_t s = 0; s < sizes.size(); ++s) {
    const int64_t n = sizes[s];
    int64_t* dst = values.data() + off;
    const int64_t* src = vals + off;
    if (terms == 0) {
      std::copy(src, src + n, dst);
      scales[s] = scl[s];
    } else {
      const int common = std::min(scales[s], scl[s]);
      const int shift_dst = scales[s] - common, shift_src = scl[s] - common;
      for (int64_t i = 0; i < n; ++i)
        dst[i] = shiftRightHalfEven(dst[i], shift_dst) + shiftRightHalfEven(src[i], shift_src);
      scales[s] = common;
    }
    maxima[s] = std::max(terms == 0 ? 0.0 : maxima[s], mx[s]);
    off += n;
  }
  ++terms;
}

ScaledValues sumAll(const std::vector<const ScaledValues*>& parts) {
  MORPH_CHECK(!parts.empty(), "a sum of no parts");
  ScaledValues out(parts.front()->sizes);
  int64_t off = 0;
  for (size_t s = 0; s < out.sizes.size(); ++s) {
    int common = parts.front()->scales[s];
    for (const ScaledValues* p : parts) {
      MORPH_CHECK(p->sizes == out.sizes, "parts of a sum differ in layout");
      common = std::min(common, p->scales[s]);
      out.maxima[s] = std::max(out.maxima[s], p->maxima[s]);
    }
    out.scales[s] = common;
    int64_t* dst = out.values.data() + off;
    for (const ScaledValues* p : parts) {
      const int shift = p->scales[s] - common;
      const int64_t* src = p->values.data() + off;
      for (int64_t i = 0; i < out.sizes[s]; ++i) dst[i] += shiftRightHalfEven(src[i], shift);
    }
    off += out.sizes[s];
  }
  for (const ScaledValues* p : parts) out.terms += p->terms;
  return out;
}

}  // namespace morph
