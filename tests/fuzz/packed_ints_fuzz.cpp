// libFuzzer target: a WSP push's unpacking (unpackInts, src/wsp/packed_ints.h)
// on arbitrary bytes, as a shard's server thread meets them from a peer.
// The first two bytes give the value count (little endian), the rest is the
// packing. Bad input must throw InternalError; a crash, a sanitizer report
// or another exception type is a bug. What unpacks must pack again to at
// most as many bytes (the packing uses each block's least width) and
// unpack to the same values. Built and run by tests/fuzz/run_fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "wsp/packed_ints.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int64_t n = data[0] | (int64_t{data[1]} << 8);
  const int64_t bytes = static_cast<int64_t>(size) - 2;
  std::vector<int64_t> v(static_cast<size_t>(n));
  try {
    morph::unpackInts(data + 2, bytes, v.data(), n);
  } catch (const morph::InternalError&) {
    return 0;
  }
  std::vector<uint8_t> again;
  morph::packInts(v.data(), n, again);
  if (static_cast<int64_t>(again.size()) > bytes || bytes > morph::packedBytesAtMost(n)) __builtin_trap();
  std::vector<int64_t> back(static_cast<size_t>(n));
  morph::unpackInts(again.data(), static_cast<int64_t>(again.size()), back.data(), n);
  if (back != v) __builtin_trap();
  return 0;
}
