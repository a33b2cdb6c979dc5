// NumPy .npy files (format versions 1.0-3.0): the header parser and a
// read-only memory map of the payload. No libtorch here: the job spec reads
// headers at validation time, the data component maps the payloads.
// Only what Morph's `dataset = "npy"` accepts is supported: C order,
// little-endian uint8 ('|u1'), float32 ('<f4') and int64 ('<i8').
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace morph {

struct NpyHeader {
  char kind = 0;               // 'u' (uint8), 'f' (float32) or 'i' (int64)
  size_t item_bytes = 0;       // 1, 4 or 8
  std::vector<int64_t> shape;  // first axis = samples
  size_t data_offset = 0;      // bytes before the payload
  int64_t count() const;       // product of the shape
  std::string describe() const;  // e.g. "uint8 (60000, 28, 28)"
};

// Parses the header at the start of `bytes` (the whole file or at least its
// header); `path` names the file in messages. Throws InputError.
NpyHeader parseNpyHeader(const std::string& bytes, const std::string& path);

// Reads and checks the header of `path`, including that the file holds
// exactly the payload the header promises. Throws InputError naming the file.
NpyHeader readNpyHeader(const std::string& path);

// A read-only mapping of a whole .npy file; the pages are shared by every
// process that maps the same file (nothing is copied per worker).
class NpyMap {
 public:
  // Maps `path` and checks its header. Throws InputError naming the file.
  explicit NpyMap(const std::string& path);
  ~NpyMap();
  NpyMap(const NpyMap&) = delete;
  NpyMap& operator=(const NpyMap&) = delete;

  const NpyHeader& header() const { return header_; }
  const void* data() const { return static_cast<const char*>(base_) + header_.data_offset; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  NpyHeader header_;
  void* base_ = nullptr;
  size_t length_ = 0;
};

// The smallest and largest value of an int64 .npy array (labels).
std::pair<int64_t, int64_t> npyIntRange(const NpyMap& m);

}  // namespace morph
