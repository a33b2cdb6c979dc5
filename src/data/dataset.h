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
  torch::Tensor x;  // images: (b, C, H, W) float32, normalised; text: (b, T) int64 bytes
  torch::Tensor y;  // images: (b) int64 class labels; text: (b, T) int64 next bytes
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

class NpyMap;

// Samples memory-mapped from .npy files (dataset = "npy"): inputs uint8 or
// float32 of shape (N, ...), or int64 token ids (N, T) (a batch's x is then
// int64 (b, T) as stored, its y the int64 (b, T) labels), labels int64 (N) or float32 regression
// targets (N, ...) (loss = "mse"; a batch's y keeps their shape and dtype). A batch's x is float32,
// (b, C, H, W) when a sample is (H, W) (then C = 1), else (b, sample
// shape...), normalised as x' = (x * scale - mean) / std with scale 1/255
// for uint8 (the same arithmetic as ImageDataset) and 1 for float32.
class NpyDataset : public Dataset {
 public:
  NpyDataset(std::shared_ptr<const NpyMap> x, std::shared_ptr<const NpyMap> y, double mean, double stddev);
  int64_t size() const override { return n_; }
  Batch gather(const int64_t* idx, int64_t n) const override;

 private:
  std::shared_ptr<const NpyMap> x_, y_;  // the mappings live as long as the dataset
  std::vector<int64_t> sample_shape_;    // as the model sees it
  int64_t n_, per_sample_;
  float mean_, inv_std_;
};

struct DataPair {
  std::unique_ptr<Dataset> train, test;
};

// Character-level text: sample i is the window of T+1 bytes starting at
// byte i*T of the corpus; x is its first T bytes, y the T bytes after each.
class TextDataset : public Dataset {
 public:
  TextDataset(torch::Tensor bytes, int64_t first_window, int64_t windows, int64_t seq_len);
  int64_t size() const override { return windows_; }
  Batch gather(const int64_t* idx, int64_t n) const override;

 private:
  torch::Tensor bytes_;  // (N) uint8, the whole corpus (shared by both splits)
  int64_t first_, windows_, seq_len_;
};

// The fortunes corpus: every text file of `dir` (not the .dat/.u8 indexes),
// in name order, concatenated. The last 5% of windows are the test split.
DataPair loadFortunes(const std::string& dir, int64_t seq_len);

// Reads one IDX file (gzip-compressed); `expected_dims` is 3 for images and
// 1 for labels. Throws InputError naming the file on any inconsistency.
torch::Tensor readIdxGz(const std::string& path, int expected_dims);

// Loads the job's dataset (train and test split). Throws InputError.
DataPair loadDatasets(const DataSpec& spec, uint64_t seed);

// One line for a person waiting: what `p` (loaded from `spec`) holds, e.g.
// "npy: 60000 train + 10000 test samples of 1x28x28, memory-mapped
// (54.9 MB in 4 files)".
std::string describeData(const DataSpec& spec, const DataPair& p);

}  // namespace morph
