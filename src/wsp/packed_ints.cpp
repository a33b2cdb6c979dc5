// Packing a push's integers (packed_ints.h).
#include "wsp/packed_ints.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace morph {

namespace {
uint64_t zigzag(int64_t x) { return (static_cast<uint64_t>(x) << 1) ^ static_cast<uint64_t>(x >> 63); }
int64_t unzigzag(uint64_t u) { return static_cast<int64_t>((u >> 1) ^ (~(u & 1) + 1)); }
uint64_t lowBits(int w) { return w >= 64 ? ~uint64_t{0} : (uint64_t{1} << w) - 1; }
int bitWidth(uint64_t u) { return u == 0 ? 0 : 64 - __builtin_clzll(u); }
}  // namespace

int64_t packedBytesAtMost(int64_t n) { return (n + kPackBlock - 1) / kPackBlock + 8 * n; }

void packInts(const int64_t* v, int64_t n, std::vector<uint8_t>& out) {
  uint64_t u[kPackBlock];
  for (int64_t b = 0; b < n; b += kPackBlock) {
    const int64_t m = std::min(kPackBlock, n - b);
    uint64_t any = 0;
    for (int64_t i = 0; i < m; ++i) any |= u[i] = zigzag(v[b + i]);
    const int w = bitWidth(any);
    out.push_back(static_cast<uint8_t>(w));
    // acc holds fewer than 8 pending bits between values; at most 56 are
    // added at once, so it never holds more than 63.
    uint64_t acc = 0;
    int nbits = 0;
    for (int64_t i = 0; i < m; ++i) {
      uint64_t x = u[i];
      for (int left = w; left > 0;) {
        const int take = std::min(left, 56);
        acc |= (x & lowBits(take)) << nbits;
        nbits += take;
        x = take < 64 ? x >> take : 0;
        left -= take;
        for (; nbits >= 8; nbits -= 8, acc >>= 8) out.push_back(static_cast<uint8_t>(acc));
      }
    }
    if (nbits > 0) out.push_back(static_cast<uint8_t>(acc));
  }
}

void unpackInts(const uint8_t* in, int64_t bytes, int64_t* v, int64_t n) {
  int64_t pos = 0;
  auto bad = [&](const std::string& what) {
    throw InternalError("a packed push is malformed: " + what + " (" + std::to_string(bytes) + " bytes for " +
                         std::to_string(n) + " values)");
  };
  for (int64_t b = 0; b < n; b += kPackBlock) {
    const int64_t m = std::min(kPackBlock, n - b);
    if (pos >= bytes) bad("it ends before block " + std::to_string(b / kPackBlock));
    const int w = in[pos++];
    if (w > 64) bad("a block of width " + std::to_string(w));
    if (pos + (m * w + 7) / 8 > bytes) bad("it ends inside block " + std::to_string(b / kPackBlock));
    uint64_t acc = 0;
    int nbits = 0;
    for (int64_t i = 0; i < m; ++i) {
      uint64_t x = 0;
      for (int shift = 0; shift < w;) {
        const int take = std::min(w - shift, 56);
        for (; nbits < take; nbits += 8) acc |= static_cast<uint64_t>(in[pos++]) << nbits;
        x |= (acc & lowBits(take)) << shift;
        acc = take < 64 ? acc >> take : 0;
        nbits -= take;
        shift += take;
      }
      v[b + i] = unzigzag(x);
    }
    if (acc != 0) bad("padding bits that are not zero");
  }
  if (pos != bytes) bad(std::to_string(bytes - pos) + " bytes left over");
}

}  // namespace morph
