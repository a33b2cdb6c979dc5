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

}  // namespace
}  // namespace morph
