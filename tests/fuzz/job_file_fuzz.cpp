// libFuzzer target: the job-file parser (parseJob, src/core/job_spec.cpp) on
// arbitrary text. Input: TOML text, optionally followed by a NUL byte and
// `--set` overrides, one per line ("key.path=value"). Bad input must throw
// InputError; anything else (a crash, a sanitizer report, another exception
// type) is a bug. Built and run by tests/fuzz/run_fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string text = input.substr(0, nul);
  std::vector<std::string> overrides;
  if (nul != std::string::npos) {
    size_t begin = nul + 1;
    while (begin <= input.size()) {
      size_t end = input.find('\n', begin);
      if (end == std::string::npos) end = input.size();
      overrides.push_back(input.substr(begin, end - begin));
      begin = end + 1;
    }
  }
  try {
    morph::JobSpec j = morph::parseJob(text, "fuzz.toml", overrides);
    // What parses must be usable: resolveSteps on a plausible train size.
    try {
      j.resolveSteps(60000);
    } catch (const morph::InputError&) {
    }
  } catch (const morph::InputError&) {
  }
  return 0;
}
