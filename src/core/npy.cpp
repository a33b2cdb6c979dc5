#include "core/npy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>

#include "core/error.h"

namespace morph {
namespace {

// A payload larger than this is refused (keeps the products below from
// overflowing; 1 TiB is far beyond what one machine trains from).
constexpr int64_t kMaxNpyBytes = int64_t(1) << 40;

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw InputError(path + ": " + what);
}

size_t skipSpace(const std::string& s, size_t i) {
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return i;
}

// Position just after "'key':" in the header dict.
size_t valueOf(const std::string& dict, const std::string& key, const std::string& path) {
  for (const char q : {'\'', '"'}) {
    const std::string k = std::string(1, q) + key + q;
    size_t at = dict.find(k);
    if (at == std::string::npos) continue;
    at = skipSpace(dict, at + k.size());
    if (at < dict.size() && dict[at] == ':') return skipSpace(dict, at + 1);
  }
  bad(path, "not a NumPy .npy file: the header has no '" + key + "'");
}

}  // namespace

int64_t NpyHeader::count() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string NpyHeader::describe() const {
  std::string s = kind == 'u' ? "uint8 (" : kind == 'f' ? "float32 (" : "int64 (";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

NpyHeader parseNpyHeader(const std::string& bytes, const std::string& path) {
  static const char kMagic[] = "\x93NUMPY";
  if (bytes.size() < 10 || bytes.compare(0, 6, kMagic, 6) != 0)
    bad(path, "not a NumPy .npy file (bad magic; write it with numpy.save)");
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t len = 0, start = 0;
  if (major == 1) {
    len = static_cast<unsigned char>(bytes[8]) | (size_t(static_cast<unsigned char>(bytes[9])) << 8);
    start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) bad(path, "truncated .npy header");
    for (int i = 3; i >= 0; --i) len = (len << 8) | static_cast<unsigned char>(bytes[8 + i]);
    start = 12;
  } else {
    bad(path, "unsupported .npy format version " + std::to_string(major));
  }
  if (len > (size_t(1) << 20)) bad(path, "implausible .npy header length " + std::to_string(len));
  if (bytes.size() < start + len) bad(path, "truncated .npy header");
  const std::string dict = bytes.substr(start, len);

  NpyHeader h;
  h.data_offset = start + len;
  size_t at = valueOf(dict, "descr", path);
  if (at >= dict.size() || (dict[at] != '\'' && dict[at] != '"'))
    bad(path, "the .npy header's 'descr' is not a simple dtype (structured arrays are not supported)");
  const size_t end = dict.find(dict[at], at + 1);
  if (end == std::string::npos) bad(path, "unterminated 'descr' in the .npy header");
  const std::string descr = dict.substr(at + 1, end - at - 1);
  if (descr == "|u1" || descr == "<u1") {
    h.kind = 'u', h.item_bytes = 1;
  } else if (descr == "<f4") {
    h.kind = 'f', h.item_bytes = 4;
  } else if (descr == "<i8") {
    h.kind = 'i', h.item_bytes = 8;
  } else {
    bad(path, "dtype '" + descr +
                  "' is not supported (inputs: uint8 or little-endian float32; labels: little-endian int64)");
  }
  at = valueOf(dict, "fortran_order", path);
  if (dict.compare(at, 5, "False") != 0)
    bad(path, "array is in Fortran order; save a C-ordered array (numpy.ascontiguousarray)");
  at = valueOf(dict, "shape", path);
  if (at >= dict.size() || dict[at] != '(') bad(path, "the .npy header's 'shape' is not a tuple");
  ++at;
  int64_t total = static_cast<int64_t>(h.item_bytes);
  for (;;) {
    at = skipSpace(dict, at);
    if (at < dict.size() && dict[at] == ')') break;
    if (at >= dict.size() || !std::isdigit(static_cast<unsigned char>(dict[at])))
      bad(path, "malformed 'shape' in the .npy header");
    int64_t v = 0;
    while (at < dict.size() && std::isdigit(static_cast<unsigned char>(dict[at]))) {
      v = v * 10 + (dict[at++] - '0');
      if (v > kMaxNpyBytes) bad(path, "implausible .npy dimension");
    }
    if (v == 0) bad(path, "array has a zero-length axis (no samples)");
    if (total > kMaxNpyBytes / v) bad(path, "implausible .npy size (over 1 TiB)");
    total *= v;
    h.shape.push_back(v);
    at = skipSpace(dict, at);
    if (at < dict.size() && dict[at] == ',') ++at;
  }
  if (h.shape.empty()) bad(path, "array is a scalar; expected a first axis of samples");
  return h;
}

NpyHeader readNpyHeader(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) bad(path, "cannot open .npy file");
  std::string head(4096, '\0');
  in.read(&head[0], static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  if (head.size() >= 12 && head.compare(0, 6, "\x93NUMPY", 6) == 0) {
    // A long header (version 2/3 allow up to 4 GiB; we accept 1 MiB).
    size_t need = head[6] == 1 ? 10 + (static_cast<unsigned char>(head[8]) | (size_t(static_cast<unsigned char>(head[9])) << 8))
                               : 12 + (static_cast<unsigned char>(head[8]) | (size_t(static_cast<unsigned char>(head[9])) << 8) |
                                       (size_t(static_cast<unsigned char>(head[10])) << 16));
    if (need > head.size() && need <= (size_t(1) << 20) + 12) {
      const size_t had = head.size();
      head.resize(need);
      in.read(&head[had], static_cast<std::streamsize>(need - had));
      head.resize(had + static_cast<size_t>(in.gcount()));
    }
  }
  NpyHeader h = parseNpyHeader(head, path);
  in.close();
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) bad(path, "cannot stat .npy file");
  const uint64_t want = h.data_offset + static_cast<uint64_t>(h.count()) * h.item_bytes;
  const uint64_t got = static_cast<uint64_t>(st.st_size);
  if (got < want)
    bad(path, "file is truncated: " + std::to_string(got) + " bytes, the header " + h.describe() + " needs " +
                  std::to_string(want));
  if (got > want)
    bad(path, "trailing data: " + std::to_string(got) + " bytes, the header " + h.describe() + " needs " +
                  std::to_string(want));
  return h;
}

NpyMap::NpyMap(const std::string& path) : path_(path), header_(readNpyHeader(path)) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) bad(path, std::string("cannot open .npy file (") + std::strerror(errno) + ")");
  length_ = header_.data_offset + static_cast<size_t>(header_.count()) * header_.item_bytes;
  base_ = ::mmap(nullptr, length_, PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (base_ == MAP_FAILED) {
    base_ = nullptr;
    bad(path, std::string("cannot map .npy file (") + std::strerror(err) + ")");
  }
}

NpyMap::~NpyMap() {
  if (base_) ::munmap(base_, length_);
}

std::pair<int64_t, int64_t> npyIntRange(const NpyMap& m) {
  MORPH_CHECK(m.header().kind == 'i', "npyIntRange needs an int64 array");
  const int64_t n = m.header().count();
  const auto* p = static_cast<const unsigned char*>(m.data());
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (int64_t i = 0; i < n; ++i) {
    int64_t v;
    std::memcpy(&v, p + i * 8, 8);  // the payload need not be 8-byte aligned
    lo = std::min(lo, v), hi = std::max(hi, v);
  }
  return {lo, hi};
}

}  // namespace morph
