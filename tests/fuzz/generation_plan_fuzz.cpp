// libFuzzer target: the generation plan's decoder (GenerationPlan::fromJson,
// src/control/protocol/generation_plan.h) on arbitrary bytes parsed as
// JSON. Bad input must throw MessageError; a crash, a sanitizer report or
// another exception type is a bug. What decodes must be consistent (ranks
// and ranges within the members) and encode to a plan that decodes to the
// same encoding. Built and run by tests/fuzz/run_fuzz.sh.
#include <cstddef>
#include <cstdint>

#include "control/protocol/generation_plan.h"
#include "control/protocol/message.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  try {
    const morph::GenerationPlan p = morph::GenerationPlan::fromJson(j);
    if (p.members.empty() || p.vn_ranges.size() != p.members.size()) __builtin_trap();
    if (p.source < 0 || static_cast<size_t>(p.source) >= p.members.size()) __builtin_trap();
    for (int64_t id : p.members)
      if (p.members[static_cast<size_t>(p.rankOf(id))] != id) __builtin_trap();
    if (p.morph)
      for (const morph::MorphTransfer& t : p.morph->transfers)
        if (t.src < 0 || t.dst < 0 || static_cast<size_t>(t.src) >= p.members.size() ||
            static_cast<size_t>(t.dst) >= p.members.size())
          __builtin_trap();
    const nlohmann::json once = p.toJson();
    if (morph::GenerationPlan::fromJson(once).toJson() != once) __builtin_trap();
  } catch (const morph::MessageError&) {
  }
  return 0;
}
