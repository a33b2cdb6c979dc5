// Datasets: Fashion-MNIST from its IDX .gz files, and a synthetic
// classification set for fast tests. A dataset is an indexable, immutable
// collection; which samples a VN sees is the sampler's business, never the
// dataset's.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/job_spec.h"

namespace morph {

struct Batch {
  torch::Tensor x;  // (b, C, H, W) float32, normalised
  torch::Tensor y;  // (b) int64 class labels
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Copies the samples `idx` (in that order) into a fresh batch.
  virtual Batch gather(const int64_t* idx, int64_t n) const = 0;
  Batch gather(const std::vector<int64_t>& idx) const {
    return gather(idx.data(), static_cast<int64_t>(idx.size()));
  }
  // All samples [begin, end) in order (evaluation).
  Batch range(int64_t begin, int64_t end) const;
};

// Images stored as uint8 (N, H, W), converted per batch.
class ImageDataset : public Dataset {
 public:
  ImageDataset(torch::Tensor images_u8, torch::Tensor labels, double mean, double stddev);
  int64_t size() const override { return labels_.size(0); }
  Batch gather(const int64_t* idx, int64_t n) const override;
  const torch::Tensor& images() const { return images_; }
  const torch::Tensor& labels() const { return labels_; }

 private:
  torch::Tensor images_;  // (N, H, W) uint8
  torch::Tensor labels_;  // (N) int64
  float mean_, inv_std_;
};

// Reads one IDX file (gzip-compressed); `expected_dims` is 3 for images and
// 1 for labels. Throws InputError naming the file on any inconsistency.
torch::Tensor readIdxGz(const std::string& path, int expected_dims);

struct DataPair {
  std::unique_ptr<Dataset> train, test;
};

// Loads the job's dataset (train and test split). Throws InputError.
DataPair loadDatasets(const DataSpec& spec, uint64_t seed);

}  // namespace morph
