// Fixed-point kernels behind exact reduction (docs/exact_reduction.md).
//
// A value g is stored as q = round_half_even(g * 2^s), s a power-of-two scale
// exponent. Every VN's |g * 2^s| must stay below kFixedBound = 2^51 so that the
// double -> int64 conversion can use the magic-number trick on AVX2, and so
// that the sum of up to 2^12 VNs still fits in int64.
#pragma once

#include <cstdint>

namespace morph {

constexpr double kFixedBound = 2251799813685248.0;  // 2^51
// Names the fixed-point format and rounding above; workers of one exact job
// must agree on it (their fingerprints carry it). Change it with them.
constexpr const char* kFixedPointKernel = "int64 q=round_half_even(g*2^s) |g*2^s|<2^51 v1";

struct QuantizeResult {
  double max_abs = 0.0;    // max |g| over the finite inputs (unscaled)
  bool overflow = false;   // some |g * 2^s| >= 2^51 (or a non-finite g)
  bool nonfinite = false;  // some g is Inf or NaN: no scale can help
};

// acc[i] += round(g[i] * 2^scale_exp) for i < n; one fused pass that also
// finds max |g| and checks the bound. When `overflow` is set, acc is garbage.
// Picks AVX2 at run time where the CPU has it; results are bitwise identical.
QuantizeResult quantizeAdd(const float* g, int64_t n, int scale_exp, int64_t* acc);
// The portable reference implementation (also used for the tail).
QuantizeResult quantizeAddScalar(const float* g, int64_t n, int scale_exp, int64_t* acc);
// The same with acc[i] = round(...) (acc is not read): a segment's first
// VN of a step, which so needs no zeroed buffer. Where `overflow` is set,
// acc is garbage here too.
QuantizeResult quantizeStore(const float* g, int64_t n, int scale_exp, int64_t* acc);
QuantizeResult quantizeStoreScalar(const float* g, int64_t n, int scale_exp, int64_t* acc);

// out[i] = float(double(acc[i]) * 2^-scale_exp / divisor).
void dequantize(const int64_t* acc, int64_t n, int scale_exp, double divisor, float* out);

// The scale exponent that maps |g| <= max_abs below 2^(51 - headroom_bits).
int scaleFor(double max_abs, int headroom_bits);

}  // namespace morph
