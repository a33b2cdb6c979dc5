// libFuzzer target: the IDX reader (readIdxGz, src/data/dataset.cpp), the
// format of Fashion-MNIST's files, on arbitrary bytes written to a temporary
// file (the reader takes a path; zlib reads an uncompressed file as is, and
// gzip streams are fuzzed too). The first byte picks 1 (labels) or 3
// (images) dimensions. Bad input must throw InputError; a crash, a sanitizer
// report or another exception type is a bug. Built and run by
// tests/fuzz/run_fuzz.sh.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <torch/torch.h>  // dataset.h relies on it (src/pch.h in the CMake build)

#include "core/error.h"
#include "data/dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir ? dir : "/tmp") + "/morph-idx-fuzz-" + std::to_string(getpid()) + ".gz";
  }();
  if (size < 1) return 0;
  const int dims = (data[0] & 1) ? 3 : 1;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size > 1 && std::fwrite(data + 1, 1, size - 1, f) != size - 1) std::abort();
  std::fclose(f);
  try {
    torch::Tensor t = morph::readIdxGz(path, dims);
    if (t.dim() != dims || t.scalar_type() != torch::kUInt8) __builtin_trap();
  } catch (const morph::InputError&) {
  }
  return 0;
}
