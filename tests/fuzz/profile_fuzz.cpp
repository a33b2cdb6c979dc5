// libFuzzer target: the calibration profile (profileFromJson,
// src/plan/profile.cpp) on arbitrary text. Bad input must throw InputError; a
// crash, a sanitizer report or another exception type is a bug. What parses
// must write back and parse again. Built and run by tests/fuzz/run_fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "plan/profile.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    morph::Profile p =
        morph::profileFromJson(std::string(reinterpret_cast<const char*>(data), size), "fuzz-profile.json");
    morph::profileFromJson(morph::profileToJson(p), "fuzz-profile.json (written back)");
  } catch (const morph::InputError&) {
  }
  return 0;
}
