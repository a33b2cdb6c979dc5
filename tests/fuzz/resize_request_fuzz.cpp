// libFuzzer target: the decoder of ctl/resize_target (ResizeRequest::decode,
// src/control/protocol/resize_request.h) on arbitrary bytes: the bare worker
// count or the JSON object naming workers to release first. Any client
// with the job's token writes it and the manager parses it, so a bad value
// must throw MessageError (the manager then ignores the request); a crash, a
// sanitizer report or another exception type is a bug. What decodes must
// hold at least 1 worker and distinct ascending ids >= 0, and encode to a
// value that decodes to the same encoding. Built and run by
// tests/fuzz/run_fuzz.sh.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "control/protocol/message.h"
#include "control/protocol/resize_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string value(reinterpret_cast<const char*>(data), size);
  try {
    const morph::ResizeRequest r = morph::ResizeRequest::decode(value);
    if (r.workers < 1) __builtin_trap();
    for (size_t i = 0; i < r.release.size(); ++i)
      if (r.release[i] < 0 || (i > 0 && r.release[i] <= r.release[i - 1])) __builtin_trap();
    const std::string once = r.encode();
    const morph::ResizeRequest again = morph::ResizeRequest::decode(once);
    if (again.encode() != once || again.workers != r.workers || again.release != r.release) __builtin_trap();
  } catch (const morph::MessageError&) {
  }
  return 0;
}
