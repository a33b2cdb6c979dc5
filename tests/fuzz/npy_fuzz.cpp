// libFuzzer target: the .npy reader (src/core/npy.cpp) on arbitrary bytes:
// the header parser on them directly, and the file checks and memory map on
// them written to a temporary file. Bad input must throw InputError; a
// crash, a sanitizer report or another exception type is a bug. Built and
// run by tests/fuzz/run_fuzz.sh.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "core/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir ? dir : "/tmp") + "/morph-npy-fuzz-" + std::to_string(getpid()) + ".npy";
  }();
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    const morph::NpyHeader h = morph::parseNpyHeader(bytes, "fuzz");
    if (h.shape.empty() || h.data_offset > bytes.size()) __builtin_trap();
  } catch (const morph::InputError&) {
  }
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  try {
    morph::NpyMap m(path);
    // Every byte the header promises is readable.
    const auto* p = static_cast<const unsigned char*>(m.data());
    const size_t n = static_cast<size_t>(m.header().count()) * m.header().item_bytes;
    unsigned sum = 0;
    for (size_t i = 0; i < n; ++i) sum += p[i];
    if (m.header().kind == 'i') (void)morph::npyIntRange(m);
    (void)sum;
  } catch (const morph::InputError&) {
  }
  return 0;
}
