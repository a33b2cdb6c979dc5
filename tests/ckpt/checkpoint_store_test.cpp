#include "ckpt/checkpoint_store.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <stdexcept>

#include "core/error.h"

namespace morph {
namespace {

namespace fs = std::filesystem;

// Wraps the real filesystem and simulates a process that dies mid-write
// (leveldb fault_injection_test style): once the byte budget is spent, the
// write in progress reaches the disk only up to the budget, and this and
// every later call throws, as nothing runs after a crash. Also records reads.
class FaultyFileSystem : public FileSystem {
 public:
  // The next `bytes` bytes are written in full; the write that would exceed
  // them is cut short and "crashes".
  void crashAfterBytes(uint64_t bytes) { budget_ = bytes; }
  void crashAtRename() { crash_at_rename_ = true; }
  // A fresh process: no crash pending, no fault armed.
  void heal() {
    crashed_ = crash_at_rename_ = false;
    budget_ = std::numeric_limits<uint64_t>::max();
  }
  uint64_t bytesWritten() const { return written_; }
  const std::vector<std::string>& reads() const { return reads_; }
  void clearReads() { reads_.clear(); }

  void writeFile(const std::string& path, const std::string& bytes) override {
    alive();
    if (bytes.size() > budget_) {
      base_.writeFile(path, bytes.substr(0, budget_));  // the torn tail never arrives
      written_ += budget_;
      budget_ = 0;
      crash();
    }
    base_.writeFile(path, bytes);
    written_ += bytes.size();
    budget_ -= bytes.size();
  }
  std::string readFile(const std::string& path) override {
    alive();
    reads_.push_back(fs::path(path).filename().string());
    return base_.readFile(path);
  }
  void rename(const std::string& from, const std::string& to) override {
    alive();
    if (crash_at_rename_) crash();
    base_.rename(from, to);
  }
  void removeAll(const std::string& path) override {
    alive();
    base_.removeAll(path);
  }
  std::vector<std::string> listDir(const std::string& path) override {
    alive();
    return base_.listDir(path);
  }
  void makeDir(const std::string& path) override {
    alive();
    base_.makeDir(path);
  }
  void syncDir(const std::string& path) override {
    alive();
    base_.syncDir(path);
  }

 private:
  void alive() const {
    if (crashed_) throw std::runtime_error("injected crash: process is dead");
  }
  [[noreturn]] void crash() {
    crashed_ = true;
    throw std::runtime_error("injected crash");
  }

  PosixFileSystem base_;
  uint64_t budget_ = std::numeric_limits<uint64_t>::max();
  uint64_t written_ = 0;
  bool crashed_ = false;
  bool crash_at_rename_ = false;
  std::vector<std::string> reads_;
};

std::string readRaw(const fs::path& p) { return PosixFileSystem().readFile(p.string()); }
void writeRaw(const fs::path& p, const std::string& b) { PosixFileSystem().writeFile(p.string(), b); }

std::vector<std::string> sortedEntries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Several dtypes and shapes, including a 0-dim scalar, an empty tensor, a
// non-contiguous view and a NaN with a payload (only bytes can compare it).
CheckpointData makeData(int64_t step, int64_t layers = 3) {
  torch::manual_seed(static_cast<uint64_t>(step) * 7919 + 1);
  CheckpointData d;
  d.step = step;
  d.job_id = "job-3f2a";
  d.meta = {{"epoch", step / 10}, {"scales", {12, -3, 40}}, {"sampler", {{"pos", step * 64}}},
            {"lr", 0.1}};
  for (int64_t i = 0; i < layers; ++i) {
    NamedTensors t;
    t.emplace_back("weight", torch::randn({4, 3}));
    t.emplace_back("weight.exp_avg", torch::randn({4, 3}, torch::kFloat64));
    t.emplace_back("count", torch::randint(-1000, 1000, {5}, torch::kInt64));
    t.emplace_back("idx", torch::randint(-50, 50, {2, 2, 2}, torch::kInt32));
    t.emplace_back("bytes", torch::randint(0, 256, {7}, torch::kUInt8));
    t.emplace_back("scalar", torch::tensor(3.25 + static_cast<double>(i), torch::kFloat64));
    t.emplace_back("empty", torch::empty({0, 4}));
    t.emplace_back("transposed", torch::randn({3, 5}).t());
    t.emplace_back("mask", torch::randn({6}) > 0);
    t.emplace_back("half", torch::randn({3}).to(torch::kFloat16));
    t.emplace_back("bf16", torch::randn({3}).to(torch::kBFloat16));
    d.layers.emplace_back("layer" + std::to_string(i), std::move(t));
  }
  uint32_t nan_bits = 0x7fc01234u;  // quiet NaN with a payload
  float nan;
  std::memcpy(&nan, &nan_bits, sizeof nan);
  d.extra.emplace_back("rng_state", torch::randint(0, 256, {16}, torch::kUInt8));
  d.extra.emplace_back("odd_values", torch::tensor({nan, -0.0f, 1e-45f}));
  return d;
}

void expectSameTensors(const NamedTensors& a, const NamedTensors& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(a[i].first);
    EXPECT_EQ(a[i].first, b[i].first);
    const torch::Tensor x = a[i].second.contiguous();
    const torch::Tensor y = b[i].second;
    ASSERT_EQ(x.scalar_type(), y.scalar_type());
    ASSERT_EQ(x.sizes(), y.sizes());
    EXPECT_TRUE(y.is_contiguous());
    const bool has_nan = x.is_floating_point() && x.isnan().any().item<bool>();
    if (!has_nan) {
      EXPECT_TRUE(torch::equal(x, y));
    }
    const size_t n = static_cast<size_t>(x.numel()) * x.element_size();
    if (n > 0) {
      EXPECT_EQ(0, std::memcmp(x.data_ptr(), y.data_ptr(), n));
    }
  }
}

void expectSameData(const CheckpointData& a, const CheckpointData& b) {
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.job_id, b.job_id);
  EXPECT_EQ(a.meta, b.meta);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t i = 0; i < a.layers.size(); ++i) {
    EXPECT_EQ(a.layers[i].first, b.layers[i].first);
    expectSameTensors(a.layers[i].second, b.layers[i].second);
  }
  expectSameTensors(a.extra, b.extra);
}

class CheckpointStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "morph-ckpt-XXXXXX").string();
    ASSERT_NE(nullptr, ::mkdtemp(tmpl.data()));
    root_ = tmpl;
    dir_ = (root_ / "ckpts").string();
  }
  void TearDown() override { fs::remove_all(root_); }

  fs::path stepDir(int64_t step) const { return fs::path(dir_) / checkpointDirName(step); }

  fs::path root_;
  std::string dir_;
  PosixFileSystem posix_;
};

TEST(TensorFile, LayoutMatchesTheDocumentedGrammar) {
  const std::string b = encodeTensorFile({{"w", torch::tensor({1.5f, -2.0f})}});
  std::string expect("MRPHTNS1", 8);
  auto u32 = [&](uint32_t v) { expect.append(reinterpret_cast<const char*>(&v), 4); };
  auto u64 = [&](uint64_t v) { expect.append(reinterpret_cast<const char*>(&v), 8); };
  u32(1);                   // version
  u32(1);                   // tensor count
  u32(1);                   // name length
  expect += "w";
  expect.push_back('\x01');  // dtype float32
  u32(1);                   // ndim
  u64(2);                   // dims
  u64(8);                   // byte count
  const float vals[2] = {1.5f, -2.0f};
  expect.append(reinterpret_cast<const char*>(vals), 8);
  u64(XXH64(expect.data(), expect.size(), 0));
  EXPECT_EQ(b, expect);
}

TEST(TensorFile, EveryTruncationAndEveryFlippedByteIsRejected) {
  const std::string good = encodeTensorFile(makeData(1, 1).layers[0].second);
  expectSameTensors(makeData(1, 1).layers[0].second, decodeTensorFile(good, "t.bin"));
  for (size_t n = 0; n < good.size(); ++n)
    EXPECT_THROW(decodeTensorFile(good.substr(0, n), "t.bin"), InputError) << "length " << n;
  for (size_t i = 0; i < good.size(); i += 3) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x10);
    EXPECT_THROW(decodeTensorFile(bad, "t.bin"), InputError) << "byte " << i;
  }
}

TEST(TensorFile, RejectsWhatTheFormatCannotHold) {
  EXPECT_THROW(encodeTensorFile({{"c", torch::zeros({2}, torch::kComplexFloat)}}), InputError);
  EXPECT_THROW(encodeTensorFile({{"a", torch::zeros({2})}, {"a", torch::zeros({2})}}), InputError);
  EXPECT_THROW(encodeTensorFile({{"u", torch::Tensor()}}), InputError);
}

TEST_F(CheckpointStoreTest, RoundTripIsBitwise) {
  const CheckpointData d = makeData(42);
  const std::string path = writeCheckpoint(dir_, d, posix_, 3);
  EXPECT_EQ(path, stepDir(42).string());
  EXPECT_EQ(sortedEntries(stepDir(42)),
            (std::vector<std::string>{"MANIFEST", "extra.bin", "layer-000.bin", "layer-001.bin",
                                      "layer-002.bin"}));
  expectSameData(d, loadCheckpoint(path, posix_));

  std::vector<std::string> problems;
  auto latest = loadLatestGood(dir_, posix_, &problems);
  ASSERT_TRUE(latest.has_value());
  expectSameData(d, *latest);
  EXPECT_TRUE(problems.empty());

  // The manifest's JSON part is plain JSON (its last line is the checksum).
  std::string manifest = readRaw(stepDir(42) / "MANIFEST");
  manifest.erase(manifest.rfind("xxh64 "));
  const auto j = nlohmann::json::parse(manifest);
  EXPECT_EQ(j.at("step"), 42);
  EXPECT_EQ(j.at("layers").at(1).at("file"), "layer-001.bin");
  EXPECT_EQ(j.at("layers").at(1).at("bytes"), fs::file_size(stepDir(42) / "layer-001.bin"));
}

TEST_F(CheckpointStoreTest, NoCheckpointsIsNotAnError) {
  std::vector<std::string> problems;
  EXPECT_FALSE(loadLatestGood(dir_, posix_, &problems).has_value());
  EXPECT_TRUE(problems.empty());
}

TEST_F(CheckpointStoreTest, BadInputIsRejectedBeforeTouchingDisk) {
  CheckpointData d = makeData(1, 1);
  d.step = -1;
  EXPECT_THROW(writeCheckpoint(dir_, d, posix_, 2), InputError);
  d.step = 1;
  EXPECT_THROW(writeCheckpoint(dir_, d, posix_, 0), InputError);
  d.layers[0].second.emplace_back("weight", torch::zeros({1}));  // duplicate name
  EXPECT_THROW(writeCheckpoint(dir_, d, posix_, 2), InputError);
  EXPECT_FALSE(fs::exists(dir_));
}

TEST_F(CheckpointStoreTest, KeepsTheLastNAndDeletesOlder) {
  for (int64_t step : {10, 20, 30, 40}) writeCheckpoint(dir_, makeData(step, 1), posix_, 2);
  EXPECT_EQ(sortedEntries(dir_),
            (std::vector<std::string>{"step-000000000030", "step-000000000040"}));
  EXPECT_EQ(listCheckpointSteps(dir_, posix_), (std::vector<int64_t>{40, 30}));
  // Unrelated files in the directory are left alone.
  writeRaw(fs::path(dir_) / "notes.txt", "hi");
  writeCheckpoint(dir_, makeData(50, 1), posix_, 1);
  EXPECT_EQ(sortedEntries(dir_), (std::vector<std::string>{"notes.txt", "step-000000000050"}));
}

TEST_F(CheckpointStoreTest, RewritingAStepReplacesIt) {
  CheckpointData d = makeData(10, 1);
  writeCheckpoint(dir_, d, posix_, 2);
  d.meta["epoch"] = 99;
  writeCheckpoint(dir_, d, posix_, 2);
  EXPECT_EQ(sortedEntries(dir_), (std::vector<std::string>{"step-000000000010"}));
  EXPECT_EQ(loadCheckpoint(stepDir(10).string(), posix_).meta.at("epoch"), 99);
}

TEST_F(CheckpointStoreTest, RetentionNeverTouchesLaterSteps) {
  // A run resumed from step 50 keeps a stale step-60 from the abandoned run
  // and must not delete the checkpoint it has just written.
  writeCheckpoint(dir_, makeData(60, 1), posix_, 1);
  writeCheckpoint(dir_, makeData(40, 1), posix_, 1);
  writeCheckpoint(dir_, makeData(50, 1), posix_, 1);
  EXPECT_EQ(sortedEntries(dir_),
            (std::vector<std::string>{"step-000000000050", "step-000000000060"}));
}

TEST_F(CheckpointStoreTest, CrashMidWriteLeavesThePreviousCheckpoint) {
  const CheckpointData good = makeData(10);
  writeCheckpoint(dir_, good, posix_, 3);

  // Bytes one full write of step 20 takes, measured in a scratch directory.
  FaultyFileSystem faulty;
  const CheckpointData next = makeData(20);
  writeCheckpoint((root_ / "scratch").string(), next, faulty, 3);
  const uint64_t total = faulty.bytesWritten();
  ASSERT_GT(total, 1000u);

  std::vector<uint64_t> crash_points = {0, 1, 8, 20, total / 2, total - 1};
  for (uint64_t b = 3; b < total; b += 97) crash_points.push_back(b);
  for (uint64_t crash_at : crash_points) {
    SCOPED_TRACE("crash after " + std::to_string(crash_at) + " of " + std::to_string(total) + " bytes");
    faulty.heal();
    faulty.crashAfterBytes(crash_at);
    EXPECT_THROW(writeCheckpoint(dir_, next, faulty, 3), std::runtime_error);
    EXPECT_FALSE(fs::exists(stepDir(20)));
    std::vector<std::string> problems;
    auto latest = loadLatestGood(dir_, posix_, &problems);
    ASSERT_TRUE(latest.has_value());
    EXPECT_EQ(latest->step, 10);
    EXPECT_TRUE(problems.empty());
  }
  // The dead process left its temporary directory behind; it is not a
  // checkpoint, and the next successful write clears it away.
  EXPECT_TRUE(fs::exists(fs::path(dir_) / (".tmp-step-000000000020-" + std::to_string(::getpid()))));

  faulty.heal();
  faulty.crashAtRename();
  EXPECT_THROW(writeCheckpoint(dir_, next, faulty, 3), std::runtime_error);
  EXPECT_FALSE(fs::exists(stepDir(20)));
  EXPECT_EQ(loadLatestGood(dir_, posix_, nullptr)->step, 10);

  faulty.heal();
  writeCheckpoint(dir_, next, faulty, 3);
  EXPECT_EQ(sortedEntries(dir_),
            (std::vector<std::string>{"step-000000000010", "step-000000000020"}));
  expectSameData(next, *loadLatestGood(dir_, posix_, nullptr));
}

class CorruptionTest : public CheckpointStoreTest {
 protected:
  void SetUp() override {
    CheckpointStoreTest::SetUp();
    writeCheckpoint(dir_, makeData(40), posix_, 3);
    writeCheckpoint(dir_, makeData(50), posix_, 3);
  }
  // Asserts that loading falls back to step 40 with one problem that
  // mentions all of `needles`.
  void expectFallback(const std::vector<std::string>& needles) {
    std::vector<std::string> problems;
    auto latest = loadLatestGood(dir_, posix_, &problems);
    ASSERT_TRUE(latest.has_value());
    expectSameData(makeData(40), *latest);
    ASSERT_EQ(problems.size(), 1u);
    for (const auto& n : needles) EXPECT_NE(problems[0].find(n), std::string::npos) << problems[0];
  }
};

TEST_F(CorruptionTest, FlippedByteInALayerFile) {
  const fs::path f = stepDir(50) / "layer-001.bin";
  std::string b = readRaw(f);
  b[b.size() / 2] = static_cast<char>(b[b.size() / 2] ^ 0x01);
  writeRaw(f, b);
  expectFallback({"step-000000000050/layer-001.bin", "checksum mismatch"});
}

TEST_F(CorruptionTest, TruncatedManifest) {
  const fs::path f = stepDir(50) / "MANIFEST";
  const std::string b = readRaw(f);
  writeRaw(f, b.substr(0, b.size() / 2));
  expectFallback({"step-000000000050/MANIFEST", "truncated"});
}

TEST_F(CorruptionTest, EditedManifestThatIsStillValidJson) {
  const fs::path f = stepDir(50) / "MANIFEST";
  std::string b = readRaw(f);
  const size_t at = b.find("\"epoch\": 5");
  ASSERT_NE(at, std::string::npos);
  b[at + 9] = '6';
  writeRaw(f, b);
  expectFallback({"step-000000000050/MANIFEST", "checksum mismatch"});
}

TEST_F(CorruptionTest, GrownExtraFile) {
  const fs::path f = stepDir(50) / "extra.bin";
  writeRaw(f, readRaw(f) + "x");
  expectFallback({"step-000000000050/extra.bin", "size mismatch"});
}

TEST_F(CorruptionTest, MissingLayerFile) {
  fs::remove(stepDir(50) / "layer-002.bin");
  expectFallback({"step-000000000050/layer-002.bin", "cannot open"});
}

TEST_F(CorruptionTest, AllBadGivesNothingAndOneProblemEach) {
  fs::remove(stepDir(50) / "MANIFEST");
  fs::remove(stepDir(40) / "extra.bin");
  std::vector<std::string> problems;
  EXPECT_FALSE(loadLatestGood(dir_, posix_, &problems).has_value());
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_NE(problems[0].find("step-000000000050/MANIFEST"), std::string::npos) << problems[0];
  EXPECT_NE(problems[1].find("step-000000000040/extra.bin"), std::string::npos) << problems[1];
  EXPECT_THROW(loadCheckpoint(stepDir(40).string(), posix_), InputError);
}

TEST_F(CheckpointStoreTest, LoadLayersReadsOnlyTheRange) {
  const CheckpointData d = makeData(7, 5);
  writeCheckpoint(dir_, d, posix_, 1);
  // Damage the layers outside the range: they must not even be opened.
  writeRaw(stepDir(7) / "layer-000.bin", "garbage");
  fs::remove(stepDir(7) / "layer-004.bin");

  FaultyFileSystem recording;
  EXPECT_EQ(checkpointLayerCount(stepDir(7).string(), recording), 5);
  recording.clearReads();
  const CheckpointData part = loadLayers(stepDir(7).string(), recording, 1, 3);
  EXPECT_EQ(recording.reads(), (std::vector<std::string>{"MANIFEST", "layer-001.bin", "layer-002.bin",
                                                         "layer-003.bin", "extra.bin"}));
  EXPECT_EQ(part.step, 7);
  EXPECT_EQ(part.meta, d.meta);
  ASSERT_EQ(part.layers.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(part.layers[i].first, d.layers[i + 1].first);
    expectSameTensors(d.layers[i + 1].second, part.layers[i].second);
  }
  expectSameTensors(d.extra, part.extra);

  EXPECT_EQ(loadLayers(stepDir(7).string(), posix_, 2, 2).layers.at(0).first, "layer2");
  EXPECT_THROW(loadLayers(stepDir(7).string(), posix_, 3, 5), InputError);
  EXPECT_THROW(loadLayers(stepDir(7).string(), posix_, 3, 1), InputError);
  EXPECT_THROW(loadLayers(stepDir(7).string(), posix_, 0, 1), InputError);  // layer 0 is damaged
  // An empty range: the step and meta only, no layer file opened.
  recording.clearReads();
  const CheckpointData none = loadLayers(stepDir(7).string(), recording, 2, 1);
  EXPECT_TRUE(none.layers.empty());
  EXPECT_EQ(none.meta, d.meta);
  EXPECT_EQ(recording.reads(), (std::vector<std::string>{"MANIFEST", "extra.bin"}));
}

// The layers [first, end) of `d` as one writer's share.
CheckpointData shareOf(const CheckpointData& d, size_t first, size_t end) {
  CheckpointData s;
  s.step = d.step;
  s.job_id = d.job_id;
  s.meta = d.meta;
  s.extra = d.extra;
  s.first_layer = static_cast<int64_t>(first);
  s.layers.assign(d.layers.begin() + static_cast<std::ptrdiff_t>(first), d.layers.begin() + static_cast<std::ptrdiff_t>(end));
  return s;
}

// Three writers (pipeline stages) each write their layers; the committer
// publishes the checkpoint only once every share is durable.
void writeInShares(const std::string& dir, const CheckpointData& d, FileSystem& fs, double wait = 5.0) {
  CheckpointShare share;
  share.attempt = "tok-g0";
  share.total_layers = static_cast<int64_t>(d.layers.size());
  share.wait_seconds = wait;
  writeCheckpointShare(dir, shareOf(d, 2, 4), fs, share);
  writeCheckpointShare(dir, shareOf(d, 4, 5), fs, share);
  share.commit = true;
  writeCheckpointShare(dir, shareOf(d, 0, 2), fs, share);
  commitCheckpoint(dir, shareOf(d, 0, 2), fs, 3, share, nullptr);
}

TEST_F(CheckpointStoreTest, SharesOfSeveralWritersMakeOneCheckpoint) {
  const CheckpointData d = makeData(30, 5);
  CheckpointShare share;
  share.attempt = "tok-g0";
  share.commit = true;
  share.total_layers = 5;
  share.wait_seconds = 0.2;
  // Only the committer's share: nothing is published.
  writeCheckpointShare(dir_, shareOf(d, 0, 2), posix_, share);
  EXPECT_THROW(commitCheckpoint(dir_, shareOf(d, 0, 2), posix_, 3, share, nullptr), JobError);
  EXPECT_FALSE(fs::exists(stepDir(30)));
  // A cancelled commit gives up at once, whatever the deadline.
  share.wait_seconds = 600;
  EXPECT_THROW(commitCheckpoint(dir_, shareOf(d, 0, 2), posix_, 3, share, [] { return true; }), JobError);

  writeInShares(dir_, d, posix_);
  expectSameData(d, *loadLatestGood(dir_, posix_, nullptr));
  EXPECT_EQ(sortedEntries(dir_), (std::vector<std::string>{"step-000000000030"}));  // scratch removed
  EXPECT_EQ(*newestIntactCheckpoint(dir_, posix_, nullptr), stepDir(30).string());

  // A writer whose share failed says so: the commit gives up at once.
  const std::string dir3 = (root_ / "failed").string();
  share.wait_seconds = 600;
  writeCheckpointShare(dir3, shareOf(d, 0, 2), posix_, share);
  reportShareFailure(dir3, shareOf(d, 2, 4), posix_, share, "disk full");
  try {
    commitCheckpoint(dir3, shareOf(d, 0, 2), posix_, 3, share, nullptr);
    ADD_FAILURE() << "committed without a share";
  } catch (const JobError& e) {
    EXPECT_NE(std::string(e.what()).find("disk full"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(listCheckpointSteps(dir3, posix_).empty());

  // A share record naming a layer twice is refused, not published.
  const std::string dir2 = (root_ / "twice").string();
  share.wait_seconds = 5;
  writeCheckpointShare(dir2, shareOf(d, 1, 3), posix_, share);
  writeCheckpointShare(dir2, shareOf(d, 0, 2), posix_, share);
  EXPECT_THROW(commitCheckpoint(dir2, shareOf(d, 0, 2), posix_, 3, share, nullptr), JobError);
  EXPECT_TRUE(listCheckpointSteps(dir2, posix_).empty());
}

TEST_F(CheckpointStoreTest, CrashAtAnyPointOfASharedWriteLeavesOldOrNew) {
  const CheckpointData old = makeData(10, 5), next = makeData(20, 5);
  writeInShares(dir_, old, posix_);
  FaultyFileSystem faulty;
  writeInShares((root_ / "scratch").string(), next, faulty);
  const uint64_t total = faulty.bytesWritten();
  // Before, between and after the stages' files, in the share records, in
  // extra.bin and the manifest: the old checkpoint stays the newest.
  for (uint64_t crash_at = 0; crash_at < total; crash_at += std::max<uint64_t>(1, total / 60)) {
    SCOPED_TRACE("crash after " + std::to_string(crash_at) + " of " + std::to_string(total) + " bytes");
    faulty.heal();
    faulty.crashAfterBytes(crash_at);
    EXPECT_THROW(writeInShares(dir_, next, faulty, 0.05), std::exception);
    EXPECT_FALSE(fs::exists(stepDir(20)));
    EXPECT_EQ(*newestIntactCheckpoint(dir_, posix_, nullptr), stepDir(10).string());
    fs::remove_all(fs::path(dir_) / ".tmp-step-000000000020-tok-g0");  // a restarted job's attempt differs
  }
  faulty.heal();
  faulty.crashAtRename();  // every file durable, not yet published
  EXPECT_THROW(writeInShares(dir_, next, faulty), std::exception);
  EXPECT_FALSE(fs::exists(stepDir(20)));
  expectSameData(old, *loadLatestGood(dir_, posix_, nullptr));
  faulty.heal();
  writeInShares(dir_, next, faulty);
  expectSameData(next, *loadLatestGood(dir_, posix_, nullptr));
  EXPECT_EQ(sortedEntries(dir_), (std::vector<std::string>{"step-000000000010", "step-000000000020"}));
}

TEST_F(CheckpointStoreTest, WriterSnapshotsAtSubmit) {
  CheckpointData d = makeData(5, 2);
  const CheckpointData expected = snapshotCheckpoint(d);
  {
    CheckpointWriter writer(dir_, &posix_, 2);
    writer.submit(d);
    // Training goes on at once: in-place updates must not reach the checkpoint.
    for (auto& [name, t] : d.layers[0].second) t.zero_();
    d.extra[0].second.fill_(1);
    writer.flush();
    EXPECT_EQ(writer.lastDurableStep(), 5);
    expectSameData(expected, *loadLatestGood(dir_, posix_, nullptr));

    for (int64_t step = 6; step <= 9; ++step) {
      d.step = step;
      writer.submit(d);
    }
    // The destructor flushes step 9.
  }
  EXPECT_EQ(listCheckpointSteps(dir_, posix_), (std::vector<int64_t>{9, 8}));
  EXPECT_EQ(loadLatestGood(dir_, posix_, nullptr)->step, 9);
}

TEST_F(CheckpointStoreTest, WriterErrorSurfacesOnFlushOnce) {
  FaultyFileSystem faulty;
  CheckpointWriter writer(dir_, &faulty, 2);
  writer.submit(makeData(1, 1));
  writer.flush();
  EXPECT_EQ(writer.lastDurableStep(), 1);

  faulty.crashAfterBytes(100);
  writer.submit(makeData(2, 1));  // returns before the write fails
  try {
    writer.flush();
    ADD_FAILURE() << "flush did not report the failed write";
  } catch (const JobError& e) {
    EXPECT_NE(std::string(e.what()).find("step 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("injected crash"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(writer.flush());  // reported once
  EXPECT_EQ(writer.lastDurableStep(), 1);

  faulty.heal();
  writer.submit(makeData(3, 1));
  writer.flush();
  EXPECT_EQ(writer.lastDurableStep(), 3);
  EXPECT_EQ(loadLatestGood(dir_, posix_, nullptr)->step, 3);
}

TEST_F(CheckpointStoreTest, WriterErrorSurfacesOnNextSubmit) {
  FaultyFileSystem faulty;
  faulty.crashAfterBytes(0);
  CheckpointWriter writer(dir_, &faulty, 2);
  writer.submit(makeData(1, 1));
  EXPECT_THROW(writer.submit(makeData(2, 1)), JobError);
  EXPECT_EQ(writer.lastDurableStep(), -1);
}

TEST_F(CheckpointStoreTest, WriterRejectsBadInputAtSubmit) {
  CheckpointWriter writer(dir_, &posix_, 2);
  CheckpointData d = makeData(1, 1);
  d.extra.emplace_back("c", torch::zeros({2}, torch::kComplexFloat));
  EXPECT_THROW(writer.submit(d), InputError);
  EXPECT_NO_THROW(writer.flush());
  EXPECT_THROW(CheckpointWriter(dir_, &posix_, 0), InputError);
}

}  // namespace
}  // namespace morph
