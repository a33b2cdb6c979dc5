#include "data/sampler.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>

#include "core/error.h"
#include "data/dataset.h"
#include "plan/vn_shares.h"

namespace morph {
namespace {

// Every sample of each epoch is owned by exactly one (step, VN) slot, for
// dataset sizes that are and are not multiples of the global batch.
TEST(GlobalSampler, EverySampleExactlyOncePerEpoch) {
  for (uint64_t seed : {1ull, 2ull, 99ull}) {
    for (auto [n, batch, vns] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
             {96, 32, 4}, {100, 32, 4}, {101, 12, 12}, {50, 50, 5}, {37, 8, 1}}) {
      GlobalSampler s(seed, n, batch, vns);
      const int64_t epochs = 3, positions = epochs * n;
      std::vector<std::vector<int>> seen(epochs, std::vector<int>(n, 0));
      int64_t pos = 0;
      for (int64_t step = 0; pos < positions; ++step)
        for (int64_t v = 0; v < vns; ++v)
          for (int64_t idx : s.vnIndices(step, v)) {
            if (pos < positions) seen[pos / n][idx]++;
            ++pos;
          }
      for (int64_t e = 0; e < epochs; ++e)
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(seen[e][i], 1) << "seed " << seed << " n " << n << " epoch " << e << " sample " << i;
    }
  }
}

TEST(GlobalSampler, DependsOnSeedAndEpochOnly) {
  GlobalSampler a(5, 1000, 64, 8), b(5, 1000, 64, 8), c(6, 1000, 64, 8);
  EXPECT_EQ(a.vnIndices(3, 2), b.vnIndices(3, 2));
  EXPECT_NE(a.vnIndices(3, 2), c.vnIndices(3, 2));
  EXPECT_NE(a.permutation(0), a.permutation(1));
  // The VN count only cuts the same stream differently.
  GlobalSampler d(5, 1000, 64, 4);
  auto x = a.vnIndices(1, 2), y = a.vnIndices(1, 3), z = d.vnIndices(1, 1);
  x.insert(x.end(), y.begin(), y.end());
  EXPECT_EQ(x, z);
}

// Across workers: the union of the workers' VN ranges covers every sample of
// an epoch exactly once, for uneven splits too.
TEST(GlobalSampler, WorkersCoverEpochExactlyOnce) {
  const int64_t n = 96, batch = 24, vns = 12;
  GlobalSampler s(3, n, batch, vns);
  for (int workers = 1; workers <= 5; ++workers) {
    auto plan = evenRanges(vns, workers);
    std::vector<int> seen(n, 0);
    for (int64_t step = 0; step < n / batch; ++step)
      for (const VnRange& r : plan)
        for (int64_t v = r.begin; v < r.end; ++v)
          for (int64_t idx : s.vnIndices(step, v)) seen[idx]++;
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[i], 1) << workers << " workers, sample " << i;
  }
}

class IdxFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("morph_idx_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::vector<unsigned char>& bytes, bool gzip = true) {
    std::string p = (dir_ / name).string();
    if (gzip) {
      gzFile f = gzopen(p.c_str(), "wb");
      gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
      gzclose(f);
    } else {
      FILE* f = std::fopen(p.c_str(), "wb");
      std::fwrite(bytes.data(), 1, bytes.size(), f);
      std::fclose(f);
    }
    return p;
  }
  static std::vector<unsigned char> images(uint32_t n, uint32_t h, uint32_t w, size_t payload) {
    std::vector<unsigned char> b{0, 0, 8, 3};
    for (uint32_t v : {n, h, w})
      for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<unsigned char>(v >> s));
    for (size_t i = 0; i < payload; ++i) b.push_back(static_cast<unsigned char>(i));
    return b;
  }
  std::filesystem::path dir_;
};

void expectMessage(const std::function<void()>& f, const std::string& a, const std::string& b) {
  try {
    f();
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(a), std::string::npos) << m;
    EXPECT_NE(m.find(b), std::string::npos) << m;
  }
}

TEST_F(IdxFiles, ReadsWellFormedFile) {
  auto p = write("ok.gz", images(2, 3, 4, 24));
  torch::Tensor t = readIdxGz(p, 3);
  EXPECT_EQ(t.sizes(), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(t.flatten()[23].item<int>(), 23);
}

TEST_F(IdxFiles, RejectsTruncatedBadMagicTrailingAndCorrupt) {
  auto trunc = write("trunc.gz", images(2, 3, 4, 20));
  expectMessage([&] { readIdxGz(trunc, 3); }, trunc, "truncated");
  auto magic = write("magic.gz", images(2, 3, 4, 24));
  expectMessage([&] { readIdxGz(magic, 1); }, magic, "bad magic");
  auto trailing = write("trailing.gz", images(2, 3, 4, 30));
  expectMessage([&] { readIdxGz(trailing, 3); }, trailing, "trailing");
  // A gzip stream with a damaged body.
  auto good = write("good.gz", images(20, 28, 28, 20 * 28 * 28));
  std::vector<unsigned char> bytes;
  {
    FILE* f = std::fopen(good.c_str(), "rb");
    int c;
    while ((c = std::fgetc(f)) != EOF) bytes.push_back(static_cast<unsigned char>(c));
    std::fclose(f);
  }
  for (size_t i = 20; i < 60 && i < bytes.size(); ++i) bytes[i] ^= 0x5A;
  auto corrupt = write("corrupt.gz", bytes, false);
  expectMessage([&] { readIdxGz(corrupt, 3); }, corrupt, "");
}

TEST(Datasets, SyntheticIsDeterministicAndLabelled) {
  DataSpec spec;
  spec.dataset = "synthetic";
  spec.train_size = 64;
  spec.test_size = 16;
  DataPair a = loadDatasets(spec, 3), b = loadDatasets(spec, 3);
  Batch x = a.train->range(0, 64), y = b.train->range(0, 64);
  EXPECT_TRUE(torch::equal(x.x, y.x));
  EXPECT_TRUE(torch::equal(x.y, y.y));
  EXPECT_EQ(x.x.sizes(), (std::vector<int64_t>{64, 1, 28, 28}));
  EXPECT_GT(x.y.max().item<int64_t>(), x.y.min().item<int64_t>());
}

}  // namespace
}  // namespace morph
