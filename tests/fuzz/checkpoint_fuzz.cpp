// libFuzzer target: the checkpoint reader (src/ckpt/checkpoint_store.h): the
// tensor-file decoder and the MANIFEST, read from an in-memory FileSystem.
// Input: one flag byte, two layer-range bytes, then the MANIFEST's JSON text,
// a NUL byte, and the bytes of a tensor file that every file the manifest
// lists reads as. Checksums are what a fuzzer cannot forge, so flags ask the
// harness to fix them (the manifest's checksum line always; the tensor
// file's trailer; each listed entry's bytes and xxh64) and the decoders
// behind them are reached. Bad input must throw InputError; a crash, a
// sanitizer report or another exception type is a bug.
// Built and run by tests/fuzz/run_fuzz.sh.
#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "ckpt/checkpoint_store.h"
#include "core/error.h"

namespace {

const char* kRoot = "ck";
const char* kDir = "ck/step-000000000007";

// A checkpoint folder in memory: MANIFEST, and every other name under it
// reads as `payload`. Writes are not expected (the readers never write).
class MemFileSystem : public morph::FileSystem {
 public:
  MemFileSystem(std::string manifest, std::string payload)
      : manifest_(std::move(manifest)), payload_(std::move(payload)) {}
  void writeFile(const std::string&, const std::string&) override { __builtin_trap(); }
  std::string readFile(const std::string& path) override {
    if (path == std::string(kDir) + "/MANIFEST") return manifest_;
    if (path.rfind(std::string(kDir) + "/", 0) == 0) return payload_;
    throw morph::JobError(path + ": no such file");
  }
  void rename(const std::string&, const std::string&) override { __builtin_trap(); }
  void removeAll(const std::string&) override { __builtin_trap(); }
  std::vector<std::string> listDir(const std::string& path) override {
    if (path == kRoot) return {"step-000000000007"};
    if (path == kDir) return {"MANIFEST"};
    return {};
  }
  void makeDir(const std::string&) override { __builtin_trap(); }
  void syncDir(const std::string&) override { __builtin_trap(); }

 private:
  std::string manifest_, payload_;
};

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const uint8_t flags = data[0];
  const int64_t first = data[1] % 8, last = static_cast<int64_t>(data[2] % 8) - 1;
  const std::string rest(reinterpret_cast<const char*>(data + 3), size - 3);
  const size_t nul = rest.find('\0');
  std::string json_text = rest.substr(0, nul);
  std::string payload = nul == std::string::npos ? std::string() : rest.substr(nul + 1);

  if ((flags & 4) && payload.size() >= 8) {  // a valid tensor-file trailer
    const uint64_t h = XXH64(payload.data(), payload.size() - 8, 0);
    for (int i = 0; i < 8; ++i) payload[payload.size() - 8 + i] = static_cast<char>(h >> (8 * i));
  }
  if (flags & 8) {  // listed files of the right size and checksum
    try {
      nlohmann::json j = nlohmann::json::parse(json_text);
      auto fix = [&](nlohmann::json& e) {
        if (!e.is_object()) return;
        e["bytes"] = payload.size();
        e["xxh64"] = hex64(XXH64(payload.data(), payload.size(), 0));
      };
      if (j.is_object() && j.contains("layers") && j["layers"].is_array())
        for (auto& l : j["layers"]) fix(l);
      if (j.is_object() && j.contains("extra")) fix(j["extra"]);
      json_text = j.dump(1) + "\n";
    } catch (const nlohmann::json::exception&) {
    }
  }
  const std::string manifest = json_text + "xxh64 " + hex64(XXH64(json_text.data(), json_text.size(), 0)) + "\n";

  MemFileSystem fs(manifest, payload);
  std::vector<std::string> problems;
  try {
    switch (flags & 3) {
      case 0:
        morph::decodeTensorFile(payload, "fuzz.bin");
        break;
      case 1:
        morph::checkpointLayerCount(kDir, fs);
        break;
      case 2:
        morph::loadLayers(kDir, fs, first, last);
        break;
      case 3: {
        // Both report a bad checkpoint in `problems` and return nullopt. What
        // decodes in full is intact (the converse need not hold).
        const bool good = morph::loadLatestGood(kRoot, fs, &problems).has_value();
        const bool intact = morph::newestIntactCheckpoint(kRoot, fs, &problems).has_value();
        if (good && !intact) __builtin_trap();
        break;
      }
    }
  } catch (const morph::InputError&) {
  }
  return 0;
}
