// libFuzzer target: the plan file (readPlanFile, src/plan/plan_file.cpp) on
// arbitrary bytes, written to a temporary file since the reader takes a path.
// The model has the layers l0..l5 and 8 virtual nodes. Bad input must throw
// InputError; a crash, a sanitizer report or another exception type is a bug.
// What is accepted must be consistent: cuts strictly increasing from 0 to 6.
// Built and run by tests/fuzz/run_fuzz.sh.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "plan/plan_file.h"

namespace {

std::string tempPath() {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/morph-plan-fuzz-" + std::to_string(getpid()) + ".json";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = tempPath();
  static const std::vector<std::string> names = {"l0", "l1", "l2", "l3", "l4", "l5"};
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  try {
    morph::PlanFile p = morph::readPlanFile(path, names, 8);
    if (p.cuts.size() < 2 || p.cuts.front() != 0 || p.cuts.back() != names.size()) __builtin_trap();
    for (size_t i = 1; i < p.cuts.size(); ++i)
      if (p.cuts[i] <= p.cuts[i - 1]) __builtin_trap();
  } catch (const morph::InputError&) {
  }
  return 0;
}
