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
// `bound` (at most 2^51): the bound on |g * 2^s| (fixedBound(bits, vns)).
QuantizeResult quantizeAdd(const float* g, int64_t n, int scale_exp, int64_t* acc, double bound = kFixedBound);
// The portable reference implementation (also used for the tail).
QuantizeResult quantizeAddScalar(const float* g, int64_t n, int scale_exp, int64_t* acc,
                                 double bound = kFixedBound);
// The same with acc[i] = round(...) (acc is not read): a segment's first
// VN of a step, which so needs no zeroed buffer. Where `overflow` is set,
// acc is garbage here too.
QuantizeResult quantizeStore(const float* g, int64_t n, int scale_exp, int64_t* acc, double bound = kFixedBound);
QuantizeResult quantizeStoreScalar(const float* g, int64_t n, int scale_exp, int64_t* acc,
                                   double bound = kFixedBound);

// acc[i] (+)= round(g[i] * 2^s) + round(g2[i] * 2^s): two VNs' terms, each
// rounded on its own as quantizeAdd() would, in one pass over acc (the
// int64 buffer is the memory traffic of exact accumulation). The result
// flags cover both inputs.
QuantizeResult quantizePairAdd(const float* g, const float* g2, int64_t n, int scale_exp, int64_t* acc,
                               double bound = kFixedBound);
QuantizeResult quantizePairStore(const float* g, const float* g2, int64_t n, int scale_exp, int64_t* acc,
                                 double bound = kFixedBound);
QuantizeResult quantizePairAddScalar(const float* g, const float* g2, int64_t n, int scale_exp, int64_t* acc,
                                     double bound = kFixedBound);

// The same kernels into an int32 accumulator (reduce.bits = 32, whose
// bound makes every partial sum of a step fit in int32): each term's q is
// the one above, and acc[i] gets the low 32 bits of what the int64 kernel
// would hold (additions modulo 2^32), so narrowTo32 of the int64 kernel's
// sums gives these bits, on any input.
QuantizeResult quantizeAdd(const float* g, int64_t n, int scale_exp, int32_t* acc, double bound);
QuantizeResult quantizeStore(const float* g, int64_t n, int scale_exp, int32_t* acc, double bound);
QuantizeResult quantizePairAdd(const float* g, const float* g2, int64_t n, int scale_exp, int32_t* acc,
                               double bound);
QuantizeResult quantizePairStore(const float* g, const float* g2, int64_t n, int scale_exp, int32_t* acc,
                                 double bound);
QuantizeResult quantizeAddScalar(const float* g, int64_t n, int scale_exp, int32_t* acc, double bound);
QuantizeResult quantizePairAddScalar(const float* g, const float* g2, int64_t n, int scale_exp, int32_t* acc,
                                     double bound);

// out[i] = float(double(acc[i]) * 2^-scale_exp / divisor).
void dequantize(const int64_t* acc, int64_t n, int scale_exp, double divisor, float* out);
void dequantize(const int32_t* acc, int64_t n, int scale_exp, double divisor, float* out);

// The scale exponent that maps |g| <= max_abs below 2^(top - headroom_bits)
// (top = fixedTop(bits, vns)).
int scaleFor(double max_abs, int headroom_bits, int top = 51);

// The 32-bit format (reduce.bits = 32, docs/exact_reduction.md): with V
// quantised terms per summed value in a step (VNs x contributions per VN)
// and c = ceil(log2 V), each term's |g * 2^s| stays below 2^(30 - c), so
// each rounded term is at most 2^(30 - c) in magnitude and any sum of up to
// V of them (every partial sum of the step, on any mapping) at most
// 2^30 < 2^31: it fits in int32. 64 bits: 2^51, as above.
int fixedTop(int bits, int64_t vns);        // 51, or 30 - c
double fixedBound(int bits, int64_t vns);   // 2^top

// out[i] = int32(in[i]) (values that fit; others wrap): what the int32
// kernels above must hold, given the int64 kernels' sums (their test's
// reference).
void narrowTo32(const int64_t* in, int64_t n, int32_t* out);
// Any int64 values carried exactly in int32 sums: 4 lanes of 16 bits each
// (out[4i + j] = bits 16j..16j+15 of in[i], as a non-negative int32). The
// lane sums of up to 2^15 summands fit in int32, and joinLanes adds them
// back with their carries: the int64 sum modulo 2^64, as an int64 SUM.
void splitLanes(const int64_t* in, int64_t n, int32_t* out);
void joinLanes(const int32_t* lane_sums, int64_t n, int64_t* out);

}  // namespace morph
