// The IDX reader (readIdxGz) on files that are not what they claim.
#include "data/dataset.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "core/error.h"

namespace morph {
namespace {

// Writes `bytes` (uncompressed: zlib reads a plain file as is) and reads it back.
torch::Tensor readIdxBytes(const std::string& bytes, int dims) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("morph-idx-test-" + std::to_string(getpid()))).string();
  std::ofstream(path, std::ios::binary) << bytes;
  struct Remove {
    std::string p;
    ~Remove() { std::filesystem::remove(p); }
  } remove{path};
  return readIdxGz(path, dims);
}

std::string header(std::vector<uint32_t> dims) {
  std::string h = {0, 0, 8, static_cast<char>(dims.size())};
  for (uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) h += static_cast<char>(d >> s);
  return h;
}

std::string inputErrorOf(const std::string& bytes, int dims) {
  try {
    readIdxBytes(bytes, dims);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

TEST(Dataset, ReadsAnIdxFile) {
  torch::Tensor t = readIdxBytes(header({2, 1, 3}) + std::string("\x01\x02\x03\x04\x05\x06", 6), 3);
  EXPECT_EQ(t.sizes(), (std::vector<int64_t>{2, 1, 3}));
  EXPECT_EQ(t[1][0][2].item<uint8_t>(), 6);
}

// A UBSan report in tests/fuzz/idx_fuzz.cpp (corpus/idx/regress-*): three dimensions of
// 2^26 overflowed their int64 product, and a header alone made the reader
// allocate what it claimed before reading a byte.
TEST(Dataset, RejectsIdxHeadersThatClaimTooMuch) {
  EXPECT_NE(inputErrorOf(header({1u << 26, 1u << 26, 1u << 26}), 3).find("implausible IDX size"),
            std::string::npos);
  const std::string msg = inputErrorOf(header({1u << 26, 4, 4}) + std::string(64, '\0'), 3);
  EXPECT_NE(msg.find("truncated: ended after 64 of 1073741824 bytes of the IDX payload"), std::string::npos) << msg;
}

// A Fashion-MNIST folder of crafted IDX files (uncompressed: zlib reads
// them as they are) whose images are `train` and `test` pixels square.
std::string craftFashion(const std::string& name, uint32_t train, uint32_t test) {
  const auto dir = std::filesystem::temp_directory_path() / (name + "-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  auto images = [&](const char* file, uint32_t side) {
    std::ofstream(dir / file, std::ios::binary) << header({2, side, side}) << std::string(2 * side * side, '\x10');
  };
  images("train-images-idx3-ubyte.gz", train);
  images("t10k-images-idx3-ubyte.gz", test);
  for (const char* f : {"train-labels-idx1-ubyte.gz", "t10k-labels-idx1-ubyte.gz"})
    std::ofstream(dir / f, std::ios::binary) << header({2}) << std::string("\x01\x02", 2);
  return dir.string();
}

std::string loadError(const std::string& dir) {
  DataSpec spec;
  spec.dataset = "fashion-mnist";
  spec.path = dir;
  try {
    loadDatasets(spec, 1);
  } catch (const InputError& e) {
    std::filesystem::remove_all(dir);
    return e.what();
  }
  std::filesystem::remove_all(dir);
  return "(no InputError)";
}

TEST(Dataset, FashionImagesMustBe28x28InBothSplits) {
  std::string msg = loadError(craftFashion("morph-fm-ok", 28, 28));
  EXPECT_EQ(msg, "(no InputError)");
  msg = loadError(craftFashion("morph-fm-train", 32, 32));
  EXPECT_NE(msg.find("train-images-idx3-ubyte.gz: images are 32x32; expected 28x28"), std::string::npos) << msg;
  msg = loadError(craftFashion("morph-fm-test", 28, 14));
  EXPECT_NE(msg.find("t10k-images-idx3-ubyte.gz: images are 14x14; expected 28x28"), std::string::npos) << msg;
  EXPECT_NE(msg.find("test split"), std::string::npos) << msg;
}


}  // namespace
}  // namespace morph
