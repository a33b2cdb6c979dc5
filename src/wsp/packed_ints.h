// The wire format of a WSP push's integers (docs/wsp.md, "A push on the
// wire"): lossless, so the shards sum exactly the integers a VW computed.
// The values go in blocks of kPackBlock: a byte with the block's bit width
// w (0..64), then each value zigzag-coded (0, -1, 1, -2, ... -> 0, 1, 2,
// 3, ...) in w bits, least significant bit first, the block padded with
// zero bits to a whole byte. Many of a wave sum's values are exactly zero
// (a ReLU's zero inputs) and the rest far below the fixed-point bound, so
// the CNN's packs to about half its 8 bytes a value. No libtorch.
#pragma once

#include <cstdint>
#include <vector>

namespace morph {

constexpr int64_t kPackBlock = 32;

// The most bytes packInts writes for n values (every block 64 bits wide).
int64_t packedBytesAtMost(int64_t n);
// Appends v[0..n) packed to `out`.
void packInts(const int64_t* v, int64_t n, std::vector<uint8_t>& out);
// Unpacks n values from in[0..bytes) into v. Throws InternalError unless
// `bytes` is exactly n values' packing (a width above 64, bytes missing or
// left over, padding bits that are not zero).
void unpackInts(const uint8_t* in, int64_t bytes, int64_t* v, int64_t n);

}  // namespace morph
