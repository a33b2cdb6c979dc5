#include "ckpt/checkpoint_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <set>
#include <thread>
#include <torch/torch.h>

#include "core/error.h"

// Tensor bytes are stored as they lie in memory; the format says
// little-endian, so a big-endian port would have to byte-swap them.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "checkpoint tensor files are little-endian; add byte swapping for this host");

namespace morph {
namespace {

constexpr char kTensorMagic[8] = {'M', 'R', 'P', 'H', 'T', 'N', 'S', '1'};
constexpr uint32_t kTensorFileVersion = 1;
constexpr int kManifestVersion = 1;
constexpr const char* kManifestFormat = "morph-checkpoint";
constexpr const char* kManifestName = "MANIFEST";
constexpr const char* kExtraName = "extra.bin";
constexpr const char* kShareFormat = "morph-checkpoint-share";
constexpr const char* kChecksumPrefix = "xxh64 ";
constexpr int64_t kMaxStep = 999999999999;  // 12 decimal digits
constexpr uint32_t kMaxDims = 64;  // far above any real tensor; bounds untrusted input
// Smallest encoding of one tensor entry: name length, dtype, ndim, byte count.
constexpr size_t kMinEntryBytes = 4 + 1 + 4 + 8;

// --- dtypes --------------------------------------------------------------

struct DtypeEntry {
  uint8_t code;
  torch::ScalarType type;
};
// Codes are part of the on-disk format (docs/checkpoint_format.md): never
// renumber, only append.
const DtypeEntry kDtypes[] = {
    {1, torch::kFloat32}, {2, torch::kFloat64}, {3, torch::kInt64},   {4, torch::kInt32},
    {5, torch::kUInt8},   {6, torch::kInt16},   {7, torch::kInt8},    {8, torch::kBool},
    {9, torch::kFloat16}, {10, torch::kBFloat16},
};

std::optional<uint8_t> codeOf(torch::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.code;
  return std::nullopt;
}

std::optional<torch::ScalarType> typeOf(uint8_t code) {
  for (const auto& d : kDtypes)
    if (d.code == code) return d.type;
  return std::nullopt;
}

// --- little-endian integers ------------------------------------------------

void putU8(std::string& out, uint8_t v) { out.push_back(static_cast<char>(v)); }
void putU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void putU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t getLe(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

// Bounds-checked cursor over [pos, end) of an untrusted byte string.
class ByteReader {
 public:
  ByteReader(const std::string& bytes, size_t pos, size_t end, const std::string& what)
      : bytes_(bytes), pos_(pos), end_(end), what_(what) {}

  const char* take(size_t n, const char* field) {
    if (n > end_ - pos_)
      throw InputError(what_ + ": truncated: " + field + " needs " + std::to_string(n) +
                       " bytes at offset " + std::to_string(pos_) + ", " +
                       std::to_string(end_ - pos_) + " left");
    const char* p = bytes_.data() + pos_;
    pos_ += n;
    return p;
  }
  uint8_t u8(const char* field) { return static_cast<uint8_t>(getLe(take(1, field), 1)); }
  uint32_t u32(const char* field) { return static_cast<uint32_t>(getLe(take(4, field), 4)); }
  uint64_t u64(const char* field) { return getLe(take(8, field), 8); }
  size_t left() const { return end_ - pos_; }

 private:
  const std::string& bytes_;
  size_t pos_, end_;
  const std::string& what_;
};

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::optional<uint64_t> parseHex64(const std::string& s) {
  if (s.size() != 16) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return std::nullopt;
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  return v;
}

uint64_t xxh64(const char* p, size_t n) { return static_cast<uint64_t>(XXH64(p, n, 0)); }

// --- paths -----------------------------------------------------------------

std::string joinPath(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (a.back() == '/') return a + b;
  return a + "/" + b;
}

std::string baseName(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The step of "step-<12 digits>", nullopt for any other name.
std::optional<int64_t> parseStepDirName(const std::string& name) {
  const std::string prefix = "step-";
  if (name.size() != prefix.size() + 12 || name.compare(0, prefix.size(), prefix) != 0)
    return std::nullopt;
  int64_t step = 0;
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

std::string layerFileName(size_t index) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "layer-%03zu.bin", index);
  return buf;
}

// A manifest may only name plain files inside its own directory.
bool isSafeFileName(const std::string& name) {
  if (name.empty() || name[0] == '.') return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'))
      return false;
  return true;
}

// --- validation of what callers hand us ------------------------------------

void validateTensor(const torch::Tensor& t, const std::string& what) {
  if (!t.defined()) throw InputError(what + ": undefined tensor");
  if (t.layout() != torch::kStrided)
    throw InputError(what + ": only dense (strided) tensors can be checkpointed");
  if (t.is_meta()) throw InputError(what + ": meta tensors hold no data");
  if (!codeOf(t.scalar_type()))
    throw InputError(what + ": dtype " + std::string(c10::toString(t.scalar_type())) +
                     " is not supported by the checkpoint format");
}

void validateNamed(const NamedTensors& tensors, const std::string& what) {
  std::set<std::string> seen;
  for (const auto& [name, t] : tensors) {
    if (!seen.insert(name).second)
      throw InputError(what + ": duplicate tensor name '" + name + "'");
    validateTensor(t, what + ": tensor '" + name + "'");
  }
}

void validateData(const CheckpointData& data) {
  if (data.step < 0 || data.step > kMaxStep)
    throw InputError("checkpoint step " + std::to_string(data.step) + " is outside [0, " +
                     std::to_string(kMaxStep) + "]");
  for (size_t i = 0; i < data.layers.size(); ++i)
    validateNamed(data.layers[i].second, "checkpoint layer " + std::to_string(i) + " ('" +
                                             data.layers[i].first + "')");
  validateNamed(data.extra, "checkpoint extra state");
}

// --- manifest ----------------------------------------------------------------

struct FileEntry {
  std::string file;
  uint64_t bytes = 0;
  uint64_t xxh64 = 0;
};

struct Manifest {
  int64_t step = 0;
  std::string job_id;
  nlohmann::json meta;
  std::vector<std::pair<std::string, FileEntry>> layers;  // layer name, its file
  FileEntry extra;
};

nlohmann::json fileEntryJson(const std::string& file, const std::string& bytes) {
  return {{"file", file},
          {"bytes", static_cast<uint64_t>(bytes.size())},
          {"xxh64", hex64(xxh64(bytes.data(), bytes.size()))}};
}

// MANIFEST = pretty JSON text ending in '\n', then "xxh64 <16 hex>\n" over
// every byte before that line.
std::string encodeManifest(const nlohmann::json& j) {
  std::string body;
  try {
    body = j.dump(2) + "\n";
  } catch (const nlohmann::json::exception& e) {
    throw InputError(std::string("checkpoint job_id/meta cannot be stored as JSON: ") + e.what());
  }
  return body + kChecksumPrefix + hex64(xxh64(body.data(), body.size())) + "\n";
}

FileEntry parseFileEntry(const nlohmann::json& j, const std::string& what) {
  FileEntry e;
  e.file = j.at("file").get<std::string>();
  if (!isSafeFileName(e.file))
    throw InputError(what + ": file name '" + e.file + "' is not a plain file name");
  e.bytes = j.at("bytes").get<uint64_t>();
  auto h = parseHex64(j.at("xxh64").get<std::string>());
  if (!h) throw InputError(what + ": xxh64 is not 16 lowercase hex digits");
  e.xxh64 = *h;
  return e;
}

// A FileSystem error retyped as bad input, naming `path` once.
std::string readFailure(const std::string& path, const std::exception& e) {
  std::string msg = e.what();
  return msg.rfind(path, 0) == 0 ? msg : path + ": cannot read: " + msg;
}

// The JSON text of a file in manifest form (JSON, then a checksum line
// over it), verified; InputError naming `path` otherwise.
std::string checkedJsonText(const std::string& bytes, const std::string& path) {
  // The checksum line: the last line, "xxh64 " + 16 hex digits.
  const size_t line_len = std::strlen(kChecksumPrefix) + 16 + 1;
  if (bytes.size() < line_len || bytes.back() != '\n' ||
      (bytes.size() > line_len && bytes[bytes.size() - line_len - 1] != '\n') ||
      bytes.compare(bytes.size() - line_len, std::strlen(kChecksumPrefix), kChecksumPrefix) != 0)
    throw InputError(path + ": truncated or damaged (no checksum line at the end; " +
                     std::to_string(bytes.size()) + " bytes)");
  const size_t body_len = bytes.size() - line_len;
  auto stored = parseHex64(bytes.substr(body_len + std::strlen(kChecksumPrefix), 16));
  if (!stored) throw InputError(path + ": damaged checksum line");
  const uint64_t actual = xxh64(bytes.data(), body_len);
  if (*stored != actual)
    throw InputError(path + ": checksum mismatch (stored " + hex64(*stored) + ", content " +
                     hex64(actual) + ")");
  return bytes.substr(0, body_len);
}

Manifest readManifest(const std::string& checkpoint_dir, FileSystem& fs) {
  const std::string path = joinPath(checkpoint_dir, kManifestName);
  std::string bytes;
  try {
    bytes = fs.readFile(path);
  } catch (const std::exception& e) {
    throw InputError(readFailure(path, e));
  }
  const std::string text = checkedJsonText(bytes, path);

  Manifest m;
  try {
    nlohmann::json j = nlohmann::json::parse(text);
    if (j.at("format").get<std::string>() != kManifestFormat)
      throw InputError(path + ": not a Morph checkpoint manifest (format '" +
                       j.at("format").get<std::string>() + "')");
    const int version = j.at("version").get<int>();
    if (version != kManifestVersion)
      throw InputError(path + ": manifest version " + std::to_string(version) +
                       " is not supported (this build reads version " +
                       std::to_string(kManifestVersion) + ")");
    m.step = j.at("step").get<int64_t>();
    m.job_id = j.at("job_id").get<std::string>();
    m.meta = j.at("meta");
    std::set<std::string> files;
    for (const auto& l : j.at("layers")) {
      m.layers.emplace_back(l.at("name").get<std::string>(), parseFileEntry(l, path));
      files.insert(m.layers.back().second.file);
    }
    m.extra = parseFileEntry(j.at("extra"), path);
    files.insert(m.extra.file);
    if (files.size() != m.layers.size() + 1 || files.count(kManifestName))
      throw InputError(path + ": file names are not distinct");
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path + ": malformed manifest: " + e.what());
  }
  if (auto dir_step = parseStepDirName(baseName(checkpoint_dir)); dir_step && *dir_step != m.step)
    throw InputError(path + ": manifest step " + std::to_string(m.step) +
                     " disagrees with the directory name");
  return m;
}

// The bytes of a file the manifest lists, checked against its size and checksum.
std::string readListedFile(const std::string& checkpoint_dir, const FileEntry& e, FileSystem& fs) {
  const std::string path = joinPath(checkpoint_dir, e.file);
  std::string bytes;
  try {
    bytes = fs.readFile(path);
  } catch (const std::exception& e) {
    throw InputError(readFailure(path, e));
  }
  if (bytes.size() != e.bytes)
    throw InputError(path + ": size mismatch (" + std::to_string(bytes.size()) +
                     " bytes, manifest says " + std::to_string(e.bytes) + ")");
  const uint64_t h = xxh64(bytes.data(), bytes.size());
  if (h != e.xxh64)
    throw InputError(path + ": checksum mismatch (manifest xxh64 " + hex64(e.xxh64) + ", file " +
                     hex64(h) + ")");
  return bytes;
}

NamedTensors readTensorFile(const std::string& checkpoint_dir, const FileEntry& e, FileSystem& fs) {
  return decodeTensorFile(readListedFile(checkpoint_dir, e, fs), joinPath(checkpoint_dir, e.file));
}

CheckpointData loadRange(const std::string& checkpoint_dir, FileSystem& fs, const Manifest& m,
                         size_t first, size_t end) {
  CheckpointData d;
  d.step = m.step;
  d.job_id = m.job_id;
  d.meta = m.meta;
  d.first_layer = static_cast<int64_t>(first);
  for (size_t i = first; i < end; ++i)
    d.layers.emplace_back(m.layers[i].first, readTensorFile(checkpoint_dir, m.layers[i].second, fs));
  d.extra = readTensorFile(checkpoint_dir, m.extra, fs);
  return d;
}

// The step of a scratch name ".tmp-step-<12 digits>-<attempt>", or nullopt.
std::optional<int64_t> scratchStep(const std::string& name) {
  const std::string prefix = ".tmp-";
  if (name.rfind(prefix, 0) != 0 || name.size() < prefix.size() + 18 || name[prefix.size() + 17] != '-')
    return std::nullopt;
  return parseStepDirName(name.substr(prefix.size(), 17));
}

// Removes leftovers of interrupted writes of steps <= `step` (scratch
// directories of later steps may be other writers' work in progress) and
// all but the `keep` newest checkpoints with step <= `step`.
void prune(const std::string& dir, int64_t step, int keep, FileSystem& fs) {
  std::vector<int64_t> older;
  for (const std::string& name : fs.listDir(dir)) {
    const auto scratch = scratchStep(name);
    if ((scratch && *scratch <= step) || name.rfind(".trash-step-", 0) == 0) {
      fs.removeAll(joinPath(dir, name));
    } else if (auto s = parseStepDirName(name); s && *s <= step) {
      older.push_back(*s);
    }
  }
  std::sort(older.rbegin(), older.rend());
  for (size_t i = static_cast<size_t>(keep); i < older.size(); ++i)
    fs.removeAll(joinPath(dir, checkpointDirName(older[i])));
}

std::string scratchDir(const std::string& dir, int64_t step, const std::string& attempt) {
  return joinPath(dir, ".tmp-" + checkpointDirName(step) + "-" + attempt);
}

std::string shareFileName(int64_t first_layer) {
  char buf[32];
  std::snprintf(buf, sizeof buf, ".share-%06lld", static_cast<long long>(first_layer));
  return buf;
}

void validateShare(const CheckpointData& data, const CheckpointShare& share) {
  validateData(data);
  if (share.attempt.empty() || !std::all_of(share.attempt.begin(), share.attempt.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
      }))
    throw InputError("checkpoint attempt '" + share.attempt + "' must be [A-Za-z0-9_-]+");
  if (data.first_layer < 0) throw InputError("checkpoint share starts at layer " + std::to_string(data.first_layer));
}

// Moves the finished scratch directory `tmp` to DIR/step-<n> (replacing an
// existing one), makes that durable and prunes.
std::string publish(const std::string& dir, const std::string& tmp, int64_t step, int keep, FileSystem& fs) {
  const std::string name = checkpointDirName(step);
  const std::string final_path = joinPath(dir, name);
  // rename(2) cannot replace a non-empty directory, so an existing
  // checkpoint of the same step is first moved aside.
  const std::vector<int64_t> existing = listCheckpointSteps(dir, fs);
  const bool replace = std::find(existing.begin(), existing.end(), step) != existing.end();
  const std::string trash = joinPath(dir, ".trash-" + name + "-" + std::to_string(static_cast<long long>(::getpid())));
  if (replace) {
    fs.removeAll(trash);
    fs.rename(final_path, trash);
  }
  try {
    fs.rename(tmp, final_path);
  } catch (...) {
    try {
      if (replace) fs.rename(trash, final_path);
    } catch (...) {
      // Leftovers are removed by the next successful write.
    }
    throw;
  }
  fs.syncDir(dir);
  if (replace) fs.removeAll(trash);
  prune(dir, step, keep, fs);
  return final_path;
}

[[noreturn]] void throwIo(const std::string& what) {
  throw JobError(what + ": " + std::strerror(errno));
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Closes now so that a close error (possible on network filesystems) is seen.
  int release() {
    int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

}  // namespace

// --- PosixFileSystem ----------------------------------------------------------

void PosixFileSystem::writeFile(const std::string& path, const std::string& bytes) {
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) throwIo(path + ": cannot create");
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throwIo(path + ": write failed");
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd.get()) != 0) throwIo(path + ": fsync failed");
  if (fd.release() != 0) throwIo(path + ": close failed");
}

std::string PosixFileSystem::readFile(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throwIo(path + ": cannot open");
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throwIo(path + ": cannot stat");
  std::string out;
  out.reserve(static_cast<size_t>(std::max<off_t>(st.st_size, 0)));
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      throwIo(path + ": read failed");
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

void PosixFileSystem::rename(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) throwIo("rename " + from + " -> " + to);
}

void PosixFileSystem::removeAll(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) throw JobError(path + ": cannot remove: " + ec.message());
}

std::vector<std::string> PosixFileSystem::listDir(const std::string& path) {
  std::error_code ec;
  std::vector<std::string> names;
  std::filesystem::directory_iterator it(path, ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory) return names;
    throw JobError(path + ": cannot list: " + ec.message());
  }
  for (const auto& entry : it) names.push_back(entry.path().filename().string());
  return names;
}

void PosixFileSystem::makeDir(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) throw JobError(path + ": cannot create directory: " + ec.message());
  if (!std::filesystem::is_directory(path, ec))
    throw JobError(path + ": exists and is not a directory");
}

void PosixFileSystem::syncDir(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) throwIo(path + ": cannot open directory");
  if (::fsync(fd.get()) != 0) throwIo(path + ": fsync of directory failed");
}

// --- tensor files ---------------------------------------------------------------

std::string encodeTensorFile(const NamedTensors& tensors) {
  validateNamed(tensors, "tensor file");
  if (tensors.size() > UINT32_MAX) throw InputError("tensor file: too many tensors");
  std::string out(kTensorMagic, sizeof kTensorMagic);
  putU32(out, kTensorFileVersion);
  putU32(out, static_cast<uint32_t>(tensors.size()));
  for (const auto& [name, t] : tensors) {
    if (name.size() > UINT32_MAX) throw InputError("tensor file: name too long");
    const torch::Tensor c = t.detach().to(torch::kCPU).contiguous();
    putU32(out, static_cast<uint32_t>(name.size()));
    out += name;
    putU8(out, *codeOf(c.scalar_type()));
    putU32(out, static_cast<uint32_t>(c.dim()));
    for (int64_t d : c.sizes()) putU64(out, static_cast<uint64_t>(d));
    const uint64_t nbytes = static_cast<uint64_t>(c.numel()) * c.element_size();
    putU64(out, nbytes);
    if (nbytes > 0) out.append(static_cast<const char*>(c.data_ptr()), nbytes);
  }
  putU64(out, xxh64(out.data(), out.size()));
  return out;
}

NamedTensors decodeTensorFile(const std::string& bytes, const std::string& what) {
  const size_t header = sizeof kTensorMagic + 4 + 4;
  if (bytes.size() < sizeof kTensorMagic ||
      std::memcmp(bytes.data(), kTensorMagic, sizeof kTensorMagic) != 0)
    throw InputError(what + ": not a Morph tensor file (bad magic)");
  if (bytes.size() < header + 8)
    throw InputError(what + ": truncated (" + std::to_string(bytes.size()) + " bytes)");
  const size_t body = bytes.size() - 8;
  const uint64_t stored = getLe(bytes.data() + body, 8);
  const uint64_t actual = xxh64(bytes.data(), body);
  if (stored != actual)
    throw InputError(what + ": trailer checksum mismatch (stored " + hex64(stored) + ", content " +
                     hex64(actual) + "); the file is truncated or damaged");

  ByteReader r(bytes, sizeof kTensorMagic, body, what);
  const uint32_t version = r.u32("version");
  if (version != kTensorFileVersion)
    throw InputError(what + ": tensor file version " + std::to_string(version) +
                     " is not supported (this build reads version " +
                     std::to_string(kTensorFileVersion) + ")");
  const uint32_t count = r.u32("tensor count");
  if (count > r.left() / kMinEntryBytes)
    throw InputError(what + ": tensor count " + std::to_string(count) + " exceeds the file size");

  NamedTensors out;
  out.reserve(count);
  std::set<std::string> seen;
  for (uint32_t i = 0; i < count; ++i) {
    const uint32_t name_len = r.u32("name length");
    std::string name(r.take(name_len, "name"), name_len);
    const std::string where = what + ": tensor '" + name + "'";
    if (!seen.insert(name).second) throw InputError(where + ": duplicate name");
    const uint8_t code = r.u8("dtype");
    const auto type = typeOf(code);
    if (!type) throw InputError(where + ": unknown dtype code " + std::to_string(code));
    const uint32_t ndim = r.u32("ndim");
    if (ndim > kMaxDims) throw InputError(where + ": " + std::to_string(ndim) + " dimensions");
    std::vector<int64_t> dims(ndim);
    int64_t numel = 1;
    for (auto& d : dims) {
      d = static_cast<int64_t>(r.u64("dim"));
      if (d < 0 || __builtin_mul_overflow(numel, d, &numel))
        throw InputError(where + ": invalid shape");
    }
    const uint64_t nbytes = r.u64("byte count");
    const uint64_t elem = c10::elementSize(*type);
    if (static_cast<uint64_t>(numel) > UINT64_MAX / elem || nbytes != static_cast<uint64_t>(numel) * elem)
      throw InputError(where + ": byte count " + std::to_string(nbytes) +
                       " disagrees with its shape and dtype");
    const char* data = r.take(nbytes, "tensor data");
    torch::Tensor t = torch::empty(dims, torch::TensorOptions().dtype(*type));
    if (nbytes > 0) std::memcpy(t.data_ptr(), data, nbytes);
    if (*type == torch::kBool) {
      // Any byte other than 0 or 1 would be an invalid bool in memory.
      for (uint64_t b = 0; b < nbytes; ++b)
        if (static_cast<unsigned char>(data[b]) > 1)
          throw InputError(where + ": bool element is neither 0 nor 1");
    }
    out.emplace_back(std::move(name), std::move(t));
  }
  if (r.left() != 0)
    throw InputError(what + ": " + std::to_string(r.left()) + " unexpected bytes after the last tensor");
  return out;
}

// --- checkpoints --------------------------------------------------------------------

std::string checkpointDirName(int64_t step) {
  MORPH_CHECK(step >= 0 && step <= kMaxStep, "step " + std::to_string(step));
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%012lld", static_cast<long long>(step));
  return buf;
}

std::vector<int64_t> listCheckpointSteps(const std::string& dir, FileSystem& fs) {
  std::vector<int64_t> steps;
  for (const std::string& name : fs.listDir(dir))
    if (auto s = parseStepDirName(name)) steps.push_back(*s);
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

void writeCheckpointShare(const std::string& dir, const CheckpointData& data, FileSystem& fs,
                          const CheckpointShare& share) {
  validateShare(data, share);
  const std::string tmp = scratchDir(dir, data.step, share.attempt);
  fs.makeDir(tmp);
  nlohmann::json layers = nlohmann::json::array();
  for (size_t i = 0; i < data.layers.size(); ++i) {
    const std::string file = layerFileName(static_cast<size_t>(data.first_layer) + i);
    const std::string bytes = encodeTensorFile(data.layers[i].second);
    fs.writeFile(joinPath(tmp, file), bytes);
    nlohmann::json entry = fileEntryJson(file, bytes);
    entry["name"] = data.layers[i].first;
    layers.push_back(std::move(entry));
  }
  // The record goes last: a share without one is not there yet. Nothing
  // follows it (the committer may publish the directory at once); the
  // committer's fsync of the directory makes every name in it durable.
  const nlohmann::json record = {{"format", kShareFormat}, {"step", data.step},
                                 {"job_id", data.job_id},  {"first_layer", data.first_layer},
                                 {"layers", std::move(layers)}};
  fs.writeFile(joinPath(tmp, shareFileName(data.first_layer)), encodeManifest(record));
}

void reportShareFailure(const std::string& dir, const CheckpointData& data, FileSystem& fs,
                        const CheckpointShare& share, const std::string& what) {
  char name[32];
  std::snprintf(name, sizeof name, ".failed-%06lld", static_cast<long long>(data.first_layer));
  fs.writeFile(joinPath(scratchDir(dir, data.step, share.attempt), name), what);
}

std::string commitCheckpoint(const std::string& dir, const CheckpointData& data, FileSystem& fs, int keep,
                             const CheckpointShare& share, const std::function<bool()>& cancelled) {
  if (keep < 1) throw InputError("checkpoint keep must be at least 1, got " + std::to_string(keep));
  validateShare(data, share);
  const std::string tmp = scratchDir(dir, data.step, share.attempt);
  const size_t total = static_cast<size_t>(std::max<int64_t>(share.total_layers, 0));
  // Phase two starts only once every layer's file is durable: the share
  // records, each written after its layer files, must cover [0, total).
  std::vector<nlohmann::json> entries;
  std::vector<std::string> records;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(share.wait_seconds);
  for (;;) {
    entries.assign(total, nlohmann::json());
    records.clear();
    size_t covered = 0;
    for (const std::string& name : fs.listDir(tmp)) {
      if (name.rfind(".failed-", 0) == 0) {
        std::string why;
        try {
          why = fs.readFile(joinPath(tmp, name));
        } catch (const std::exception&) {
        }
        throw JobError("another writer's share failed: " + why);
      }
      if (name.rfind(".share-", 0) != 0) continue;
      const std::string path = joinPath(tmp, name);
      nlohmann::json rec;
      try {
        rec = nlohmann::json::parse(checkedJsonText(fs.readFile(path), path));
      } catch (const std::exception&) {
        continue;  // still being written
      }
      if (rec.value("format", "") != kShareFormat || rec.value("step", int64_t{-1}) != data.step ||
          rec.value("job_id", "") != data.job_id)
        throw JobError(path + ": a share of another checkpoint in this attempt's scratch directory");
      const int64_t first = rec.at("first_layer").get<int64_t>();
      const auto& ls = rec.at("layers");
      for (size_t i = 0; i < ls.size(); ++i) {
        const size_t l = static_cast<size_t>(first) + i;
        if (first < 0 || l >= total || !entries[l].is_null())
          throw JobError(path + ": layer " + std::to_string(l) + " is outside the checkpoint's " +
                         std::to_string(total) + " layers or written twice");
        entries[l] = ls[i];
        ++covered;
      }
      records.push_back(path);
    }
    if (covered == total) break;
    if ((cancelled && cancelled()) || std::chrono::steady_clock::now() > deadline)
      throw JobError("checkpoint of step " + std::to_string(data.step) + ": only " + std::to_string(covered) +
                     " of " + std::to_string(total) + " layers were written (a stage's writer did not finish)");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::string extra = encodeTensorFile(data.extra);
  fs.writeFile(joinPath(tmp, kExtraName), extra);
  const nlohmann::json manifest = {
      {"format", kManifestFormat}, {"version", kManifestVersion},
      {"step", data.step},         {"job_id", data.job_id},
      {"meta", data.meta},         {"layers", entries},
      {"extra", fileEntryJson(kExtraName, extra)},
  };
  // The manifest goes last: a directory without one is never trusted.
  fs.writeFile(joinPath(tmp, kManifestName), encodeManifest(manifest));
  for (const std::string& r : records) fs.removeAll(r);  // scratch: the manifest lists every file
  fs.syncDir(tmp);
  return publish(dir, tmp, data.step, keep, fs);
}

std::string writeCheckpoint(const std::string& dir, const CheckpointData& data, FileSystem& fs,
                            int keep) {
  if (keep < 1) throw InputError("checkpoint keep must be at least 1, got " + std::to_string(keep));
  if (data.first_layer != 0) throw InputError("a whole checkpoint starts at layer 0");
  // One writer holding every layer: a share of all of them, committed.
  CheckpointShare share;
  share.attempt = std::to_string(static_cast<long long>(::getpid()));
  share.commit = true;
  share.total_layers = static_cast<int64_t>(data.layers.size());
  validateShare(data, share);
  const std::string tmp = scratchDir(dir, data.step, share.attempt);
  fs.makeDir(dir);
  fs.removeAll(tmp);  // our own earlier, failed attempt at this step
  try {
    writeCheckpointShare(dir, data, fs, share);
    return commitCheckpoint(dir, data, fs, keep, share, nullptr);
  } catch (...) {
    try {
      fs.removeAll(tmp);
    } catch (...) {
      // The next successful write removes the leftover; the first error matters.
    }
    throw;
  }
}

CheckpointData loadCheckpoint(const std::string& checkpoint_dir, FileSystem& fs) {
  const Manifest m = readManifest(checkpoint_dir, fs);
  return loadRange(checkpoint_dir, fs, m, 0, m.layers.size());
}

CheckpointData loadLayers(const std::string& checkpoint_dir, FileSystem& fs, int64_t first_layer,
                          int64_t last_layer) {
  const Manifest m = readManifest(checkpoint_dir, fs);
  const int64_t count = static_cast<int64_t>(m.layers.size());
  if (first_layer < 0 || first_layer > last_layer + 1 || last_layer >= count)
    throw InputError(checkpoint_dir + ": layer range [" + std::to_string(first_layer) + ", " +
                     std::to_string(last_layer) + "] is not within the checkpoint's " +
                     std::to_string(count) + " layers");
  return loadRange(checkpoint_dir, fs, m, static_cast<size_t>(first_layer),
                   static_cast<size_t>(last_layer) + 1);
}

int64_t checkpointLayerCount(const std::string& checkpoint_dir, FileSystem& fs) {
  return static_cast<int64_t>(readManifest(checkpoint_dir, fs).layers.size());
}

std::optional<CheckpointData> loadLatestGood(const std::string& dir, FileSystem& fs,
                                             std::vector<std::string>* problems) {
  for (int64_t step : listCheckpointSteps(dir, fs)) {
    try {
      return loadCheckpoint(joinPath(dir, checkpointDirName(step)), fs);
    } catch (const InputError& e) {
      if (problems) problems->push_back(e.what());
    }
  }
  return std::nullopt;
}

std::optional<std::string> newestIntactCheckpoint(const std::string& dir, FileSystem& fs,
                                                  std::vector<std::string>* problems) {
  for (int64_t step : listCheckpointSteps(dir, fs)) {
    const std::string path = joinPath(dir, checkpointDirName(step));
    try {
      const Manifest m = readManifest(path, fs);
      for (const auto& [name, e] : m.layers) readListedFile(path, e, fs);
      readListedFile(path, m.extra, fs);
      return path;
    } catch (const InputError& e) {
      if (problems) problems->push_back(e.what());
    }
  }
  return std::nullopt;
}

CheckpointData snapshotCheckpoint(const CheckpointData& data) {
  validateData(data);
  torch::NoGradGuard no_grad;
  auto copy = [](const NamedTensors& in) {
    NamedTensors out;
    out.reserve(in.size());
    for (const auto& [name, t] : in) {
      torch::Tensor c =
          torch::empty(t.sizes(), torch::TensorOptions().dtype(t.scalar_type()).device(torch::kCPU));
      c.copy_(t.detach());
      out.emplace_back(name, std::move(c));
    }
    return out;
  };
  CheckpointData s;
  s.step = data.step;
  s.job_id = data.job_id;
  s.meta = data.meta;
  s.first_layer = data.first_layer;
  s.layers.reserve(data.layers.size());
  for (const auto& [name, tensors] : data.layers) s.layers.emplace_back(name, copy(tensors));
  s.extra = copy(data.extra);
  return s;
}

// --- CheckpointWriter ---------------------------------------------------------------

CheckpointWriter::CheckpointWriter(std::string dir, FileSystem* fs, int keep,
                                   std::optional<CheckpointShare> share)
    : dir_(std::move(dir)), fs_(fs), keep_(keep), share_(std::move(share)) {
  MORPH_CHECK(fs != nullptr, "CheckpointWriter needs a FileSystem");
  if (keep < 1) throw InputError("checkpoint keep must be at least 1, got " + std::to_string(keep));
  thread_ = std::thread([this] { run(); });
}

CheckpointWriter::~CheckpointWriter() {
  cancel_ = true;  // a commit still waiting for other shares gives up
  {
    std::unique_lock<std::mutex> lock(mu_);
    waitIdleLocked(lock);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (!failure_.empty()) std::cerr << "morph: warning: " << failure_ << "\n";
}

void CheckpointWriter::waitIdleLocked(std::unique_lock<std::mutex>& lock) {
  cv_.wait(lock, [this] { return !busy_; });
}

void CheckpointWriter::rethrowFailureLocked() {
  if (failure_.empty()) return;
  std::string msg = std::move(failure_);
  failure_.clear();
  throw JobError(msg);
}

void CheckpointWriter::submit(const CheckpointData& data) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    waitIdleLocked(lock);
    rethrowFailureLocked();
    busy_ = true;  // keeps flush() and other submits waiting while we copy
  }
  std::optional<CheckpointData> snapshot;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    snapshot = snapshotCheckpoint(data);
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
    }
    cv_.notify_all();
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ = std::move(snapshot);
    pending_snapshot_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  cv_.notify_all();
}

void CheckpointWriter::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  waitIdleLocked(lock);
  rethrowFailureLocked();
}

CheckpointWriter::Timing CheckpointWriter::timing() const {
  std::lock_guard<std::mutex> lock(mu_);
  return timing_;
}

int64_t CheckpointWriter::lastDurableStep() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_durable_step_;
}

void CheckpointWriter::run() {
  for (;;) {
    std::optional<CheckpointData> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || pending_.has_value(); });
      if (!pending_) return;
      job = std::move(pending_);
      pending_.reset();
    }
    const int64_t step = job->step;
    const auto t0 = std::chrono::steady_clock::now();
    std::string failure;
    try {
      if (!share_) {
        writeCheckpoint(dir_, *job, *fs_, keep_);
      } else {
        try {
          writeCheckpointShare(dir_, *job, *fs_, *share_);
        } catch (const std::exception& e) {
          // Tell the committer at once rather than let it wait out its
          // deadline (best effort: a full disk may refuse this too).
          try {
            reportShareFailure(dir_, *job, *fs_, *share_, e.what());
          } catch (...) {
          }
          throw;
        }
        if (share_->commit) commitCheckpoint(dir_, *job, *fs_, keep_, *share_, [this] { return cancel_.load(); });
      }
    } catch (const std::exception& e) {
      failure = "checkpoint of step " + std::to_string(step) + " in " + dir_ + " failed: " + e.what();
    } catch (...) {
      failure = "checkpoint of step " + std::to_string(step) + " in " + dir_ +
                " failed with an unknown exception";
    }
    job.reset();  // free the snapshot before the next submit may copy another
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (failure.empty()) {
        last_durable_step_ = step;
        ++timing_.writes;
        timing_.snapshot_seconds += pending_snapshot_s_;
        timing_.write_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      } else {
        failure_ = std::move(failure);
      }
      busy_ = false;
    }
    cv_.notify_all();
  }
}

}  // namespace morph
