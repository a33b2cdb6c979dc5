#include "exec/fixed_point.h"

#include <immintrin.h>

#include <cmath>
#include <cstring>

namespace morph {
namespace {

constexpr double kMagic = 6755399441055744.0;  // 1.5 * 2^52

inline int64_t roundMagic(double d) {
  // For |d| < 2^51, d + 1.5*2^52 has ulp 1, so the addition rounds d to the
  // nearest integer (ties to even) and the low mantissa bits hold it.
  double r = d + kMagic;
  int64_t bits, magic_bits;
  std::memcpy(&bits, &r, sizeof bits);
  std::memcpy(&magic_bits, &kMagic, sizeof magic_bits);
  return bits - magic_bits;
}

template <bool kStore>
QuantizeResult quantizeScalar(const float* g, int64_t n, int scale_exp, int64_t* acc, double bound);

// kStore: acc[i] = q (a segment's first VN of the step: no zeroing pass,
// no read of acc), else acc[i] += q.
template <bool kStore>
__attribute__((target("avx2"))) QuantizeResult quantizeAvx2(const float* g, int64_t n, int scale_exp,
                                                            int64_t* acc, double bound) {
  const __m256d vscale = _mm256_set1_pd(std::ldexp(1.0, scale_exp));
  const __m256d vbound = _mm256_set1_pd(bound);
  const __m256d vmagic = _mm256_set1_pd(kMagic);
  const __m256i vmagic_i = _mm256_castpd_si256(vmagic);
  const __m256d vabs_mask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7FFFFFFFFFFFFFFFLL));
  __m256d vmax = _mm256_setzero_pd();
  const __m256d vinf = _mm256_set1_pd(INFINITY);
  __m256d vbad = _mm256_setzero_pd();
  __m256d vnonfinite = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    __m256d d = _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(g + i)), vscale);
    __m256d a = _mm256_and_pd(d, vabs_mask);
    // not-less-than, unordered: true for |d| >= bound (or inf) and for NaN.
    vbad = _mm256_or_pd(vbad, _mm256_cmp_pd(a, vbound, _CMP_NLT_UQ));
    vnonfinite = _mm256_or_pd(vnonfinite, _mm256_cmp_pd(a, vinf, _CMP_NLT_UQ));
    vmax = _mm256_max_pd(a, vmax);  // a NaN in `a` yields vmax (flagged above)
    __m256i q = _mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(d, vmagic)), vmagic_i);
    __m256i* dst = reinterpret_cast<__m256i*>(acc + i);
    if constexpr (kStore) {
      _mm256_storeu_si256(dst, q);
    } else {
      _mm256_storeu_si256(dst, _mm256_add_epi64(_mm256_loadu_si256(dst), q));
    }
  }
  alignas(32) double m[4];
  _mm256_store_pd(m, vmax);
  double max_scaled = std::fmax(std::fmax(m[0], m[1]), std::fmax(m[2], m[3]));
  QuantizeResult r;
  r.overflow = _mm256_movemask_pd(vbad) != 0;
  r.nonfinite = _mm256_movemask_pd(vnonfinite) != 0;
  r.max_abs = std::ldexp(max_scaled, -scale_exp);
  if (i < n) {
    QuantizeResult tail = quantizeScalar<kStore>(g + i, n - i, scale_exp, acc + i, bound);
    r.overflow = r.overflow || tail.overflow;
    r.nonfinite = r.nonfinite || tail.nonfinite;
    r.max_abs = std::fmax(r.max_abs, tail.max_abs);
  }
  return r;
}

bool haveAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

template <bool kStore>
QuantizeResult quantizeScalar(const float* g, int64_t n, int scale_exp, int64_t* acc, double bound) {
  const double scale = std::ldexp(1.0, scale_exp);
  double max_scaled = 0.0;
  QuantizeResult r;
  for (int64_t i = 0; i < n; ++i) {
    double d = static_cast<double>(g[i]) * scale;
    double a = std::fabs(d);
    if (!(a < bound)) {  // the step will be redone: leave acc alone
      if constexpr (kStore) acc[i] = 0;  // (but defined)
      r.overflow = true;
      if (std::isfinite(a)) {
        max_scaled = std::fmax(max_scaled, a);
      } else {
        r.nonfinite = true;
      }
      continue;
    }
    if (a > max_scaled) max_scaled = a;
    if constexpr (kStore) {
      acc[i] = roundMagic(d);
    } else {
      acc[i] += roundMagic(d);
    }
  }
  r.max_abs = std::ldexp(max_scaled, -scale_exp);
  return r;
}

}  // namespace

QuantizeResult quantizeAddScalar(const float* g, int64_t n, int scale_exp, int64_t* acc, double bound) {
  return quantizeScalar<false>(g, n, scale_exp, acc, bound);
}

QuantizeResult quantizeStoreScalar(const float* g, int64_t n, int scale_exp, int64_t* acc, double bound) {
  return quantizeScalar<true>(g, n, scale_exp, acc, bound);
}

QuantizeResult quantizeAdd(const float* g, int64_t n, int scale_exp, int64_t* acc, double bound) {
  if (haveAvx2()) return quantizeAvx2<false>(g, n, scale_exp, acc, bound);
  return quantizeScalar<false>(g, n, scale_exp, acc, bound);
}

QuantizeResult quantizeStore(const float* g, int64_t n, int scale_exp, int64_t* acc, double bound) {
  if (haveAvx2()) return quantizeAvx2<true>(g, n, scale_exp, acc, bound);
  return quantizeScalar<true>(g, n, scale_exp, acc, bound);
}

void dequantize(const int64_t* acc, int64_t n, int scale_exp, double divisor, float* out) {
  const double f = std::ldexp(1.0, -scale_exp) / divisor;
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(static_cast<double>(acc[i]) * f);
}

void dequantize(const int32_t* acc, int64_t n, int scale_exp, double divisor, float* out) {
  const double f = std::ldexp(1.0, -scale_exp) / divisor;
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(static_cast<double>(acc[i]) * f);
}

int scaleFor(double max_abs, int headroom_bits, int top) {
  if (!(max_abs > 0.0) || !std::isfinite(max_abs)) return top - headroom_bits;
  int e;
  std::frexp(max_abs, &e);  // max_abs < 2^e
  return top - headroom_bits - e;
}

int fixedTop(int bits, int64_t vns) {
  if (bits == 64) return 51;
  int c = 0;  // ceil(log2 vns)
  while ((int64_t{1} << c) < vns) ++c;
  return 30 - c;
}

double fixedBound(int bits, int64_t vns) {
  if (bits == 64) return kFixedBound;
  return std::ldexp(1.0, fixedTop(bits, vns));
}

void narrowTo32(const int64_t* in, int64_t n, int32_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(in[i])));
}

void widenFrom32(const int32_t* in, int64_t n, int64_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = in[i];
}

void splitLanes(const int64_t* in, int64_t n, int32_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t v = static_cast<uint64_t>(in[i]);
    for (int j = 0; j < 4; ++j) out[4 * i + j] = static_cast<int32_t>((v >> (16 * j)) & 0xFFFFu);
  }
}

void joinLanes(const int32_t* lane_sums, int64_t n, int64_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    uint64_t v = 0;
    for (int j = 0; j < 4; ++j) v += static_cast<uint64_t>(static_cast<uint32_t>(lane_sums[4 * i + j])) << (16 * j);
    out[i] = static_cast<int64_t>(v);
  }
}

}  // namespace morph
