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

template <bool kStore, bool kPair = false, typename T = int64_t>
QuantizeResult quantizeScalar(const float* g, int64_t n, int scale_exp, T* acc, double bound,
                              const float* g2 = nullptr);

// int32 accumulators hold the low 32 bits of the int64 ones: two's
// complement additions modulo 2^32 (unsigned, so no signed overflow).
inline int32_t low32(int64_t v) { return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(v))); }
inline void store(int64_t* at, int64_t q) { *at = q; }
inline void store(int32_t* at, int64_t q) { *at = low32(q); }
inline void accumulate(int64_t* at, int64_t q) { *at += q; }
inline void accumulate(int32_t* at, int64_t q) {
  *at = static_cast<int32_t>(static_cast<uint32_t>(*at) + static_cast<uint32_t>(static_cast<uint64_t>(q)));
}

#define MORPH_AVX2 __attribute__((target("avx2"), always_inline)) inline

// One quantised term per lane of 4 floats: q = round(g * 2^s).
MORPH_AVX2 __m256i quant4(const float* p, __m256d vscale, __m256d vmagic) {
  const __m256d d = _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(p)), vscale);
  return _mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(d, vmagic)), _mm256_castpd_si256(vmagic));
}

// The largest |g| of 8 floats into *vmax (a NaN lane keeps it), NaNs into *vnan.
MORPH_AVX2 void scan8(const float* p, __m256 vabs_mask, __m256* vmax, __m256* vnan) {
  const __m256 v = _mm256_loadu_ps(p);
  *vnan = _mm256_or_ps(*vnan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  *vmax = _mm256_max_ps(_mm256_and_ps(v, vabs_mask), *vmax);
}

template <bool kStore>
MORPH_AVX2 void put4(int64_t* at, __m256i q) {
  __m256i* dst = reinterpret_cast<__m256i*>(at);
  if constexpr (kStore) {
    _mm256_storeu_si256(dst, q);
  } else {
    _mm256_storeu_si256(dst, _mm256_add_epi64(_mm256_loadu_si256(dst), q));
  }
}

// 8 int32 values: the low 32 bits of the int64 lanes of a, then of b.
template <bool kStore>
MORPH_AVX2 void put8(int32_t* at, __m256i a, __m256i b) {
  const __m256i low = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  const __m256i q = _mm256_permute2x128_si256(_mm256_permutevar8x32_epi32(a, low),
                                              _mm256_permutevar8x32_epi32(b, low), 0x20);
  __m256i* dst = reinterpret_cast<__m256i*>(at);
  if constexpr (kStore) {
    _mm256_storeu_si256(dst, q);
  } else {
    _mm256_storeu_si256(dst, _mm256_add_epi32(_mm256_loadu_si256(dst), q));
  }
}

// kStore: acc[i] = q (a segment's first VN of the step: no zeroing pass,
// no read of acc), else acc[i] += q.
// kPair: acc[i] (=|+=) q(g[i]) + q(g2[i]), each term rounded on its own
// (the same integers as two single passes, one pass over acc).
// T = int32_t: the same q, their low 32 bits added modulo 2^32.
template <bool kStore, bool kPair = false, typename T = int64_t>
__attribute__((target("avx2"))) QuantizeResult quantizeAvx2(const float* g, int64_t n, int scale_exp,
                                                            T* acc, double bound,
                                                            const float* g2 = nullptr) {
  const __m256d vscale = _mm256_set1_pd(std::ldexp(1.0, scale_exp));
  const __m256d vmagic = _mm256_set1_pd(kMagic);
  const __m256 vabs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  // The bound is checked once, on the largest |g| (g * 2^s is exact in
  // double, so |g| * 2^s >= bound for some g exactly when it holds for the
  // largest), found in float, 8 lanes at a time; NaNs, which a max skips,
  // are caught by an unordered compare.
  __m256 vmax = _mm256_setzero_ps();
  __m256 vnan = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    scan8(g + i, vabs_mask, &vmax, &vnan);
    __m256i q0 = quant4(g + i, vscale, vmagic), q1 = quant4(g + i + 4, vscale, vmagic);
    if constexpr (kPair) {
      scan8(g2 + i, vabs_mask, &vmax, &vnan);
      q0 = _mm256_add_epi64(q0, quant4(g2 + i, vscale, vmagic));
      q1 = _mm256_add_epi64(q1, quant4(g2 + i + 4, vscale, vmagic));
    }
    if constexpr (sizeof(T) == 8) {
      put4<kStore>(acc + i, q0);
      put4<kStore>(acc + i + 4, q1);
    } else {
      put8<kStore>(acc + i, q0, q1);
    }
  }
  alignas(32) float m[8];
  _mm256_store_ps(m, vmax);
  float max_abs = 0.0f;
  for (float x : m) max_abs = std::fmax(max_abs, x);
  QuantizeResult r;
  const bool nan = _mm256_movemask_ps(vnan) != 0;
  r.nonfinite = nan || std::isinf(max_abs);
  r.overflow = nan || !(std::ldexp(static_cast<double>(max_abs), scale_exp) < bound);
  r.max_abs = max_abs;
  if (i < n) {
    QuantizeResult tail = quantizeScalar<kStore, kPair>(g + i, n - i, scale_exp, acc + i, bound,
                                                        kPair ? g2 + i : nullptr);
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

template <bool kStore, bool kPair, typename T>
QuantizeResult quantizeScalar(const float* g, int64_t n, int scale_exp, T* acc, double bound,
                              const float* g2) {
  const double scale = std::ldexp(1.0, scale_exp);
  double max_scaled = 0.0;
  QuantizeResult r;
  // One term: its rounded value, or false (the step will be redone).
  auto term = [&](float v, int64_t* q) {
    const double d = static_cast<double>(v) * scale;
    const double a = std::fabs(d);
    if (!(a < bound)) {
      r.overflow = true;
      if (std::isfinite(a)) {
        max_scaled = std::fmax(max_scaled, a);
      } else {
        r.nonfinite = true;
      }
      return false;
    }
    if (a > max_scaled) max_scaled = a;
    *q = roundMagic(d);
    return true;
  };
  for (int64_t i = 0; i < n; ++i) {
    int64_t q = 0, q2 = 0;
    bool ok = term(g[i], &q);
    if constexpr (kPair) ok = term(g2[i], &q2) && ok;
    if (!ok) {  // leave acc alone
      if constexpr (kStore) acc[i] = 0;  // (but defined)
      continue;
    }
    if constexpr (kStore) {
      store(acc + i, q + q2);
    } else {
      accumulate(acc + i, q + q2);
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

QuantizeResult quantizePairAdd(const float* g, const float* g2, int64_t n, int scale_exp, int64_t* acc,
                               double bound) {
  if (haveAvx2()) return quantizeAvx2<false, true>(g, n, scale_exp, acc, bound, g2);
  return quantizeScalar<false, true>(g, n, scale_exp, acc, bound, g2);
}

QuantizeResult quantizePairStore(const float* g, const float* g2, int64_t n, int scale_exp, int64_t* acc,
                                 double bound) {
  if (haveAvx2()) return quantizeAvx2<true, true>(g, n, scale_exp, acc, bound, g2);
  return quantizeScalar<true, true>(g, n, scale_exp, acc, bound, g2);
}

QuantizeResult quantizePairAddScalar(const float* g, const float* g2, int64_t n, int scale_exp, int64_t* acc,
                                     double bound) {
  return quantizeScalar<false, true>(g, n, scale_exp, acc, bound, g2);
}

QuantizeResult quantizeAdd(const float* g, int64_t n, int scale_exp, int32_t* acc, double bound) {
  if (haveAvx2()) return quantizeAvx2<false>(g, n, scale_exp, acc, bound);
  return quantizeScalar<false>(g, n, scale_exp, acc, bound);
}

QuantizeResult quantizeStore(const float* g, int64_t n, int scale_exp, int32_t* acc, double bound) {
  if (haveAvx2()) return quantizeAvx2<true>(g, n, scale_exp, acc, bound);
  return quantizeScalar<true>(g, n, scale_exp, acc, bound);
}

QuantizeResult quantizePairAdd(const float* g, const float* g2, int64_t n, int scale_exp, int32_t* acc,
                               double bound) {
  if (haveAvx2()) return quantizeAvx2<false, true>(g, n, scale_exp, acc, bound, g2);
  return quantizeScalar<false, true>(g, n, scale_exp, acc, bound, g2);
}

QuantizeResult quantizePairStore(const float* g, const float* g2, int64_t n, int scale_exp, int32_t* acc,
                                 double bound) {
  if (haveAvx2()) return quantizeAvx2<true, true>(g, n, scale_exp, acc, bound, g2);
  return quantizeScalar<true, true>(g, n, scale_exp, acc, bound, g2);
}

QuantizeResult quantizeAddScalar(const float* g, int64_t n, int scale_exp, int32_t* acc, double bound) {
  return quantizeScalar<false>(g, n, scale_exp, acc, bound);
}

QuantizeResult quantizePairAddScalar(const float* g, const float* g2, int64_t n, int scale_exp, int32_t* acc,
                                     double bound) {
  return quantizeScalar<false, true>(g, n, scale_exp, acc, bound, g2);
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
