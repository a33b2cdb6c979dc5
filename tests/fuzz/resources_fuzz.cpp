// libFuzzer target: the resources file (parseResources, src/plan/resources.cpp)
// on arbitrary text. Bad input must throw InputError; a crash, a sanitizer
// report or another exception type is a bug. Built and run by
// tests/fuzz/run_fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "plan/resources.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    morph::Resources r = morph::parseResources(std::string(reinterpret_cast<const char*>(data), size),
                                               "fuzz-resources.toml");
    // The contract of a parsed file: every device's type exists.
    for (size_t slot = 0; slot < r.devices.size(); ++slot) r.typeOf(slot);
  } catch (const morph::InputError&) {
  }
  return 0;
}
