// libFuzzer target: the store protocol's decoders (src/store/protocol.h)
// on arbitrary bytes. They must throw ProtocolError or return; never crash,
// read out of bounds or allocate beyond the input. Built and run by
// tests/fuzz/run_fuzz.sh (clang, -fsanitize=fuzzer,address,undefined).
#include <cstddef>
#include <cstdint>

#include "store/protocol.h"

using namespace morph::store;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto quietly = [](auto&& f) {
    try {
      f();
    } catch (const ProtocolError&) {
    }
  };
  quietly([&] {
    Request r = decodeRequest(data, size);
    // What decodes must encode back to the same bytes.
    std::vector<uint8_t> again = encodeRequest(r);
    if (again.size() != size || !std::equal(again.begin(), again.end(), data)) __builtin_trap();
  });
  quietly([&] { decodeAuth(data, size); });
  quietly([&] { decodeHello(data, size); });
  quietly([&] { decodeVerdict(data, size); });
  if (size > 0)
    quietly([&] { decodeReply(static_cast<Op>(1 + data[0] % 8), data + 1, size - 1); });
  return 0;
}
