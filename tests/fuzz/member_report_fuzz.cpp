// libFuzzer target: a member's report decoder (MemberReport::fromJson,
// src/control/protocol/member_report.h) on arbitrary bytes parsed as JSON.
// Bad input must throw MessageError; a crash, a sanitizer report or another
// exception type is a bug. What decodes must hold a sane layer range and
// encode to a report that decodes to the same encoding. Built and run by
// tests/fuzz/run_fuzz.sh.
#include <cstddef>
#include <cstdint>

#include "control/protocol/member_report.h"
#include "control/protocol/message.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  try {
    const morph::MemberReport r = morph::MemberReport::fromJson(j);
    if (r.committed < 0 || (r.held && r.held->lo > r.held->hi)) __builtin_trap();
    if (!r.line.is_null() && !r.line.contains("step")) __builtin_trap();
    const nlohmann::json once = r.toJson();
    if (morph::MemberReport::fromJson(once).toJson() != once) __builtin_trap();
  } catch (const morph::MessageError&) {
  }
  return 0;
}
