// Process-level facts and settings: thread pinning, BLAS detection, memory.
#pragma once

#include <cstdint>
#include <string>

namespace morph {

// Pins intra-op, inter-op, OpenMP and OpenBLAS threads to `threads`.
// Call early, before any tensor work.
void pinThreads(int threads);

// Name of the BLAS the process calls ("openblas ..." or "reference"); warns on
// stderr once when it is the slow reference BLAS.
std::string checkBlas(bool warn);

// Peak resident set size of this process, in bytes.
int64_t peakRssBytes();

// Wall-clock seconds since an arbitrary epoch (steady clock).
double nowSeconds();

}  // namespace morph
