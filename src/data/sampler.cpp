#include "data/sampler.h"

#include "core/error.h"

namespace morph {

uint64_t mixSeed(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  SplitMix64 r(a);
  uint64_t h = r.next();
  for (uint64_t v : {b, c, d}) {
    SplitMix64 s(h ^ (v * 0xD6E8FEB86659FD93ULL));
    h = s.next();
  }
  return h;
}

GlobalSampler::GlobalSampler(uint64_t seed, int64_t dataset_size, int64_t global_batch,
                             int64_t virtual_nodes)
    : seed_(seed), size_(dataset_size), global_batch_(global_batch), virtual_nodes_(virtual_nodes) {
  MORPH_CHECK(size_ > 0 && global_batch_ > 0 && virtual_nodes_ > 0, "bad sampler sizes");
  MORPH_CHECK_EQ(global_batch_ % virtual_nodes_, 0);
}

std::vector<int64_t> GlobalSampler::permutation(int64_t epoch) const {
  std::vector<int64_t> p(static_cast<size_t>(size_));
  for (int64_t i = 0; i < size_; ++i) p[static_cast<size_t>(i)] = i;
  SplitMix64 rng(mixSeed(seed_, 0x5A3B1E, static_cast<uint64_t>(epoch)));
  for (int64_t i = size_ - 1; i > 0; --i) {  // Fisher-Yates
    int64_t j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i + 1)));
    std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(j)]);
  }
  return p;
}

const std::vector<int64_t>& GlobalSampler::cachedPermutation(int64_t epoch) const {
  auto it = cache_.find(epoch);
  if (it != cache_.end()) return it->second;
  while (cache_.size() >= 2) cache_.erase(cache_.begin());
  return cache_.emplace(epoch, permutation(epoch)).first->second;
}

std::vector<int64_t> GlobalSampler::vnIndices(int64_t step, int64_t vn) const {
  MORPH_CHECK(vn >= 0 && vn < virtual_nodes_, "VN out of range");
  const int64_t b = vnSize();
  const int64_t start = step * global_batch_ + vn * b;
  std::vector<int64_t> out(static_cast<size_t>(b));
  std::lock_guard<std::mutex> lock(mu_);
  for (int64_t k = 0; k < b; ++k) {
    int64_t pos = start + k;
    out[static_cast<size_t>(k)] = cachedPermutation(pos / size_)[static_cast<size_t>(pos % size_)];
  }
  return out;
}

}  // namespace morph
