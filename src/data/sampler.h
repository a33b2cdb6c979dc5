// Global sampler: which samples each virtual node of each step owns.
//
// The training stream is the concatenation of per-epoch permutations of the
// dataset (epoch e's permutation comes from (seed, e) only). Step s covers
// stream positions [s*B, (s+1)*B); VN i of step s owns the slice
// [s*B + i*b, s*B + (i+1)*b) with b = B / V. So every sample is used exactly
// once per epoch, and when N is not a multiple of B the last batch of an
// epoch simply continues into the next epoch's permutation (no sample is
// dropped, no batch is short). A VN's samples never depend on the hardware.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

namespace morph {

// Small, fully specified PRNG (same numbers on every platform, unlike the
// distributions of <random>).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n), unbiased (rejection).
  uint64_t below(uint64_t n) {
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t v;
    do v = next(); while (v >= limit);
    return v % n;
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

// Mixes a few integers into one seed (for per-VN random streams etc.).
uint64_t mixSeed(uint64_t a, uint64_t b, uint64_t c = 0, uint64_t d = 0);

class GlobalSampler {
 public:
  GlobalSampler(uint64_t seed, int64_t dataset_size, int64_t global_batch, int64_t virtual_nodes);

  // Dataset indices of VN `vn` of step `step`, in order. Thread-safe.
  std::vector<int64_t> vnIndices(int64_t step, int64_t vn) const;
  int64_t vnSize() const { return global_batch_ / virtual_nodes_; }

  // Epoch permutation (exposed for tests).
  std::vector<int64_t> permutation(int64_t epoch) const;

 private:
  const std::vector<int64_t>& cachedPermutation(int64_t epoch) const;

  uint64_t seed_;
  int64_t size_, global_batch_, virtual_nodes_;
  mutable std::mutex mu_;
  mutable std::map<int64_t, std::vector<int64_t>> cache_;  // at most two epochs
};

}  // namespace morph
