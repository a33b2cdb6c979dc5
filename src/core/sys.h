// Process-level facts and settings: thread pinning, BLAS detection, memory.
#pragma once

#include <cstdint>
#include <string>

namespace morph {

// Pins intra-op, inter-op, OpenMP and OpenBLAS threads to `threads`.
// Call early, before any tensor work.
void pinThreads(int threads);

// Keeps glibc from returning large freed blocks to the kernel: otherwise
// every VN's gradient buffers (megabytes) are mmapped, page-faulted and
// unmapped again on every VN, and throughput was bimodal from run to run
// (docs/performance.md, "Choices that differ"). Call first in main().
void tuneAllocator();

// Name of the BLAS the process calls ("openblas ..." or "reference"); warns on
// stderr once when it is the slow reference BLAS.
std::string checkBlas(bool warn);

// Peak resident set size of this process, in bytes.
int64_t peakRssBytes();
// Current resident set size of this process, in bytes (0 if unknown).
int64_t currentRssBytes();

// Bytes the C allocator has handed out and not taken back (heap and
// mmapped blocks): the difference around a forward pass is what it keeps.
int64_t allocatorBytesInUse();

// Wall-clock seconds since an arbitrary epoch (steady clock).
double nowSeconds();

}  // namespace morph
