#include "data/dataset.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "core/error.h"
#include "core/npy.h"
#include "data/sampler.h"

namespace morph {

Batch Dataset::range(int64_t begin, int64_t end) const {
  std::vector<int64_t> idx(static_cast<size_t>(end - begin));
  for (int64_t i = begin; i < end; ++i) idx[static_cast<size_t>(i - begin)] = i;
  return gather(idx);
}

ImageDataset::ImageDataset(torch::Tensor images_u8, torch::Tensor labels, double mean,
                           double stddev)
    : images_(std::move(images_u8)),
      labels_(std::move(labels)),
      mean_(static_cast<float>(mean)),
      inv_std_(static_cast<float>(1.0 / stddev)) {
  MORPH_CHECK_EQ(images_.size(0), labels_.size(0));
}

Batch ImageDataset::gather(const int64_t* idx, int64_t n) const {
  const int64_t h = images_.size(1), w = images_.size(2), px = h * w;
  torch::Tensor x = torch::empty({n, 1, h, w}, torch::kFloat32);
  torch::Tensor y = torch::empty({n}, torch::kInt64);
  const uint8_t* src = images_.data_ptr<uint8_t>();
  const int64_t* lab = labels_.data_ptr<int64_t>();
  float* dst = x.data_ptr<float>();
  int64_t* ydst = y.data_ptr<int64_t>();
  const int64_t count = size();
  for (int64_t i = 0; i < n; ++i) {
    MORPH_CHECK(idx[i] >= 0 && idx[i] < count, "sample index out of range");
    const uint8_t* s = src + idx[i] * px;
    float* d = dst + i * px;
    for (int64_t k = 0; k < px; ++k) d[k] = (static_cast<float>(s[k]) * (1.0f / 255.0f) - mean_) * inv_std_;
    ydst[i] = lab[idx[i]];
  }
  return {x, y};
}

NpyDataset::NpyDataset(std::shared_ptr<const NpyMap> x, std::shared_ptr<const NpyMap> y, double mean,
                       double stddev)
    : x_(std::move(x)),
      y_(std::move(y)),
      n_(x_->header().shape[0]),
      per_sample_(x_->header().count() / n_),
      mean_(static_cast<float>(mean)),
      inv_std_(static_cast<float>(1.0 / stddev)) {
  const auto& xs = x_->header().shape;
  MORPH_CHECK_EQ(y_->header().shape[0], n_);
  if (xs.size() == 3) sample_shape_.push_back(1);
  sample_shape_.insert(sample_shape_.end(), xs.begin() + 1, xs.end());
}

Batch NpyDataset::gather(const int64_t* idx, int64_t n) const {
  std::vector<int64_t> shape{n};
  shape.insert(shape.end(), sample_shape_.begin(), sample_shape_.end());
  // Token ids (int64 inputs) stay int64 and are not normalised.
  const bool tokens = x_->header().kind == 'i';
  torch::Tensor x = torch::empty(shape, tokens ? torch::kInt64 : torch::kFloat32);
  // Labels: int64 (n), or (n, T) for token data; regression targets:
  // float32 (n, target shape...).
  const bool float_y = y_->header().kind == 'f';
  std::vector<int64_t> yshape{n};
  yshape.insert(yshape.end(), y_->header().shape.begin() + 1, y_->header().shape.end());
  torch::Tensor y = torch::empty(yshape, float_y ? torch::kFloat32 : torch::kInt64);
  const int64_t ybytes = (n_ > 0 ? y_->header().count() / n_ : 0) * static_cast<int64_t>(y_->header().item_bytes);
  auto* ydst = static_cast<unsigned char*>(y.data_ptr());
  const auto* ysrc = static_cast<const unsigned char*>(y_->data());
  const int64_t px = per_sample_;
  const bool u8 = x_->header().kind == 'u';
  for (int64_t i = 0; i < n; ++i) {
    MORPH_CHECK(idx[i] >= 0 && idx[i] < n_, "sample index out of range");
    std::memcpy(ydst + i * ybytes, ysrc + idx[i] * ybytes, static_cast<size_t>(ybytes));
    if (tokens) {
      std::memcpy(static_cast<unsigned char*>(x.data_ptr()) + i * px * 8,
                  static_cast<const unsigned char*>(x_->data()) + idx[i] * px * 8, static_cast<size_t>(px) * 8);
      continue;
    }
    float* d = x.data_ptr<float>() + i * px;
    if (u8) {
      const uint8_t* s = static_cast<const uint8_t*>(x_->data()) + idx[i] * px;
      for (int64_t k = 0; k < px; ++k) d[k] = (static_cast<float>(s[k]) * (1.0f / 255.0f) - mean_) * inv_std_;
    } else {
      // The payload is 4-byte aligned only if the header length says so: copy bytes.
      std::memcpy(d, static_cast<const unsigned char*>(x_->data()) + idx[i] * px * 4, static_cast<size_t>(px) * 4);
      for (int64_t k = 0; k < px; ++k) d[k] = (d[k] - mean_) * inv_std_;
    }
  }
  return {x, y};
}

namespace {

// Fashion-MNIST's largest file holds 47 MB; the bound keeps the product of
// the dimensions from overflowing (UBSan report in tests/fuzz/idx_fuzz.cpp).
constexpr int64_t kMaxIdxBytes = int64_t(1) << 32;

uint32_t bigEndian32(const unsigned char* b) {
  return (uint32_t(b[0]) << 24) | (uint32_t(b[1]) << 16) | (uint32_t(b[2]) << 8) | uint32_t(b[3]);
}

struct GzFile {
  gzFile f;
  explicit GzFile(const std::string& p) : f(gzopen(p.c_str(), "rb")) {}
  ~GzFile() {
    if (f) gzclose(f);
  }
};

// Reads n bytes of `what`; `offset` of its `whole` bytes came before (messages).
void readExactly(GzFile& gz, void* dst, size_t n, const std::string& path, const char* what, size_t offset = 0,
                 size_t whole = 0) {
  auto* out = static_cast<unsigned char*>(dst);
  size_t done = 0;
  while (done < n) {
    unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - done, 1u << 30));
    int got = gzread(gz.f, out + done, chunk);
    if (got < 0) {
      int err = 0;
      const char* msg = gzerror(gz.f, &err);
      throw InputError(path + ": corrupt gzip data while reading " + what + " (" + msg +
                       "); reinstall the dataset (apt-get install --reinstall dataset-fashion-mnist)");
    }
    if (got == 0)
      throw InputError(path + ": file is truncated: ended after " + std::to_string(offset + done) + " of " +
                       std::to_string(whole ? whole : n) + " bytes of " + what);
    done += static_cast<size_t>(got);
  }
}

}  // namespace

torch::Tensor readIdxGz(const std::string& path, int expected_dims) {
  GzFile gz(path);
  if (!gz.f) throw InputError(path + ": cannot open IDX file");
  unsigned char head[4];
  readExactly(gz, head, 4, path, "the IDX header");
  if (head[0] != 0 || head[1] != 0 || head[2] != 0x08 || head[3] != expected_dims)
    throw InputError(path + ": not an IDX file of unsigned bytes with " +
                     std::to_string(expected_dims) + " dimension(s) (bad magic number)");
  std::vector<int64_t> dims;
  int64_t total = 1;
  for (int d = 0; d < expected_dims; ++d) {
    unsigned char b[4];
    readExactly(gz, b, 4, path, "the IDX header");
    uint32_t v = bigEndian32(b);
    if (v == 0 || v > (1u << 26)) throw InputError(path + ": implausible IDX dimension " + std::to_string(v));
    if (total > kMaxIdxBytes / v)
      throw InputError(path + ": implausible IDX size (more than " + std::to_string(kMaxIdxBytes >> 30) + " GiB)");
    dims.push_back(v);
    total *= v;
  }
  // Read before the tensor is allocated, growing as the bytes come: the
  // header's claim alone allocates nothing (tests/fuzz/idx_fuzz.cpp).
  std::vector<uint8_t> payload;
  const size_t want = static_cast<size_t>(total);
  while (payload.size() < want) {
    const size_t at = payload.size(), chunk = std::min<size_t>(want - at, size_t(16) << 20);
    payload.resize(at + chunk);
    readExactly(gz, payload.data() + at, chunk, path, "the IDX payload", at, want);
  }
  torch::Tensor t = torch::empty(dims, torch::kUInt8);
  std::memcpy(t.data_ptr<uint8_t>(), payload.data(), want);
  unsigned char extra;
  if (gzread(gz.f, &extra, 1) != 0)
    throw InputError(path + ": trailing data after the IDX payload (or corrupt file)");
  return t;
}

namespace {

std::unique_ptr<Dataset> loadFashionSplit(const std::string& dir, const std::string& prefix) {
  namespace fs = std::filesystem;
  std::string ip = (fs::path(dir) / (prefix + "-images-idx3-ubyte.gz")).string();
  std::string lp = (fs::path(dir) / (prefix + "-labels-idx1-ubyte.gz")).string();
  torch::Tensor images = readIdxGz(ip, 3);
  // The models take Fashion-MNIST's 1x28x28 samples (ModelSpec::input), and
  // both splits must have them: a test split of another size would only
  // fail at the first evaluation, hundreds of steps in.
  if (images.size(1) != 28 || images.size(2) != 28)
    throw InputError(ip + ": images are " + std::to_string(images.size(1)) + "x" + std::to_string(images.size(2)) +
                     "; expected 28x28 like Fashion-MNIST's (and the same in both splits: " + prefix +
                     (prefix == "train" ? " is the training split)" : " is the test split)"));
  torch::Tensor labels = readIdxGz(lp, 1).to(torch::kInt64);
  if (images.size(0) != labels.size(0))
    throw InputError(ip + ": holds " + std::to_string(images.size(0)) + " images but " + lp +
                     " holds " + std::to_string(labels.size(0)) + " labels");
  if (labels.max().item<int64_t>() > 9)
    throw InputError(lp + ": label above 9 (Fashion-MNIST has 10 classes)");
  // Fashion-MNIST's training-set pixel mean and standard deviation.
  return std::make_unique<ImageDataset>(images, labels, 0.2860, 0.3530);
}

// Synthetic 28x28 images: each class has a fixed random template; a sample is
// its template plus noise. Learnable, deterministic in (seed, index).
std::unique_ptr<Dataset> makeSynthetic(int64_t n, uint64_t seed, uint64_t split) {
  const int64_t px = 28 * 28, classes = 10;
  SplitMix64 trng(seed * 0x9E3779B97F4A7C15ULL + 12345);
  std::vector<float> templates(static_cast<size_t>(classes * px));
  for (auto& v : templates) v = static_cast<float>(trng.uniform());
  torch::Tensor images = torch::empty({n, 28, 28}, torch::kUInt8);
  torch::Tensor labels = torch::empty({n}, torch::kInt64);
  uint8_t* im = images.data_ptr<uint8_t>();
  int64_t* lb = labels.data_ptr<int64_t>();
  SplitMix64 rng(seed ^ (split * 0xD1B54A32D192ED03ULL) ^ 0xABCDEF);
  for (int64_t i = 0; i < n; ++i) {
    int64_t c = static_cast<int64_t>(rng.below(classes));
    lb[i] = c;
    for (int64_t k = 0; k < px; ++k) {
      double v = 0.6 * templates[static_cast<size_t>(c * px + k)] + 0.4 * rng.uniform();
      im[i * px + k] = static_cast<uint8_t>(v * 255.0);
    }
  }
  return std::make_unique<ImageDataset>(images, labels, 0.5, 0.25);
}

}  // namespace

TextDataset::TextDataset(torch::Tensor bytes, int64_t first_window, int64_t windows, int64_t seq_len)
    : bytes_(std::move(bytes)), first_(first_window), windows_(windows), seq_len_(seq_len) {
  MORPH_CHECK_LE((first_ + windows_) * seq_len_ + 1, bytes_.numel());
}

Batch TextDataset::gather(const int64_t* idx, int64_t n) const {
  torch::Tensor x = torch::empty({n, seq_len_}, torch::kInt64);
  torch::Tensor y = torch::empty({n, seq_len_}, torch::kInt64);
  const uint8_t* src = bytes_.data_ptr<uint8_t>();
  int64_t* xd = x.data_ptr<int64_t>();
  int64_t* yd = y.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    MORPH_CHECK(idx[i] >= 0 && idx[i] < windows_, "sample index out of range");
    const uint8_t* w = src + (first_ + idx[i]) * seq_len_;
    for (int64_t t = 0; t < seq_len_; ++t) {
      xd[i * seq_len_ + t] = w[t];
      yd[i * seq_len_ + t] = w[t + 1];
    }
  }
  return {x, y};
}

DataPair loadFortunes(const std::string& dir, int64_t seq_len) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string ext = e.path().extension().string();
    if (e.is_regular_file() && !e.is_symlink() && ext != ".dat" && ext != ".u8") files.push_back(e.path());
  }
  if (ec) throw InputError(dir + ": cannot list the fortunes folder (" + ec.message() + ")");
  std::sort(files.begin(), files.end());
  std::string text;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) throw InputError(f.string() + ": cannot read");
    text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const int64_t windows = (static_cast<int64_t>(text.size()) - 1) / seq_len;
  if (windows < 20)
    throw InputError(dir + ": " + std::to_string(text.size()) + " bytes of text is too little for data.seq_len = " +
                     std::to_string(seq_len) + " (apt-get install fortunes)");
  torch::Tensor bytes = torch::empty({static_cast<int64_t>(text.size())}, torch::kUInt8);
  std::memcpy(bytes.data_ptr<uint8_t>(), text.data(), text.size());
  const int64_t test = std::max<int64_t>(1, windows / 20);
  DataPair p;
  p.train = std::make_unique<TextDataset>(bytes, 0, windows - test, seq_len);
  p.test = std::make_unique<TextDataset>(bytes, windows - test, test, seq_len);
  return p;
}

DataPair loadDatasets(const DataSpec& spec, uint64_t seed) {
  DataPair p;
  if (spec.dataset == "fashion-mnist") {
    p.train = loadFashionSplit(spec.path, "train");
    p.test = loadFashionSplit(spec.path, "t10k");
  } else if (spec.dataset == "fortunes-char") {
    p = loadFortunes(spec.path, spec.seq_len);
  } else if (spec.dataset == "npy") {
    // The job spec checked shapes, dtypes and label ranges (core/job_spec.cpp).
    auto map = [](const std::string& path) { return std::make_shared<const NpyMap>(path); };
    p.train = std::make_unique<NpyDataset>(map(spec.train_x), map(spec.train_y), spec.mean, spec.std);
    p.test = std::make_unique<NpyDataset>(map(spec.test_x), map(spec.test_y), spec.mean, spec.std);
  } else if (spec.dataset == "synthetic") {
    p.train = makeSynthetic(spec.train_size, seed, 1);
    p.test = makeSynthetic(spec.test_size, seed, 2);
  } else {
    throw InputError("unknown dataset '" + spec.dataset + "'");
  }
  return p;
}

std::string describeData(const DataSpec& spec, const DataPair& p) {
  // One sample's shape as the model sees it (a text window: its length).
  const torch::Tensor x = p.train->gather(std::vector<int64_t>{0}).x;
  std::string shape;
  for (int64_t d = 1; d < x.dim(); ++d) shape += (d > 1 ? "x" : "") + std::to_string(x.size(d));
  const bool text = spec.dataset == "fortunes-char";
  std::string out = spec.dataset;
  if (!spec.path.empty() && spec.dataset != "npy") out += " from " + spec.path;
  out += ": " + std::to_string(p.train->size()) + " train + " + std::to_string(p.test->size()) + " test " +
         (text ? "windows of " + shape + " characters" : "samples of " + shape);
  if (spec.dataset == "npy") {
    uintmax_t bytes = 0;
    for (const std::string* f : {&spec.train_x, &spec.train_y, &spec.test_x, &spec.test_y}) {
      std::error_code ec;
      const uintmax_t n = std::filesystem::file_size(*f, ec);
      if (!ec) bytes += n;
    }
    char buf[64];
    std::snprintf(buf, sizeof buf, ", memory-mapped (%.1f MB in 4 files)", static_cast<double>(bytes) / 1e6);
    out += buf;
  }
  return out;
}

}  // namespace morph
