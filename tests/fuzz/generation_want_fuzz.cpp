// libFuzzer target: the decoder of gen/want (GenerationWant::decode,
// src/control/protocol/generation_want.h) on arbitrary bytes: the bare
// generation number or the JSON object with `morph slow` factors. The key
// policy lets only the manager write gen/want, but every member parses it
// before each step, so a bad value must throw MessageError; a crash, a
// sanitizer report or another exception type is a bug. What decodes must
// hold a generation >= 0, worker ids >= 0 and factors from 1 to 1000, and
// encode to a value that decodes to the same encoding. Built and run by
// tests/fuzz/run_fuzz.sh.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "control/protocol/generation_want.h"
#include "control/protocol/message.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string value(reinterpret_cast<const char*>(data), size);
  try {
    const morph::GenerationWant w = morph::GenerationWant::decode(value);
    if (w.generation < 0) __builtin_trap();
    for (const auto& [id, f] : w.slowdown)
      if (id < 0 || !std::isfinite(f) || f < 1.0 || f > 1000.0 || w.slowdownOf(id) != f) __builtin_trap();
    const std::string once = w.encode();
    const morph::GenerationWant again = morph::GenerationWant::decode(once);
    if (again.encode() != once || again.generation != w.generation || again.slowdown != w.slowdown)
      __builtin_trap();
  } catch (const morph::MessageError&) {
  }
  return 0;
}
