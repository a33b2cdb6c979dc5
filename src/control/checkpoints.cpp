// Resuming, keeping and timing checkpoints (checkpoints.h).
#include "control/checkpoints.h"

#include <cstdio>
#include <filesystem>
#include <optional>

#include "core/error.h"
#include "core/sys.h"

namespace morph {
namespace detail {

namespace {

// Bytes of the files of one checkpoint folder (0 when unreadable).
double folderMegabytes(const std::string& path) {
  uintmax_t bytes = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(path, ec)) {
    std::error_code fec;
    if (e.is_regular_file(fec)) bytes += e.file_size(fec);
  }
  return static_cast<double>(bytes) / 1e6;
}

// Before a resume reads `dir`: which checkpoint it tries first and its size.
void sayLoading(const std::string& dir, FileSystem& fs) {
  const std::vector<int64_t> steps = listCheckpointSteps(dir, fs);
  if (steps.empty()) return;
  const std::string path = (std::filesystem::path(dir) / checkpointDirName(steps.front())).string();
  std::printf("morph: loading checkpoint %s (%.1f MB) ...\n", path.c_str(), folderMegabytes(path));
  std::fflush(stdout);
}

}  // namespace

// Loads the newest good checkpoint of `dir` into `tr`; reports rejected ones.
void resumeFrom(const std::string& dir, Executor& tr, bool report, bool progress) {
  PosixFileSystem fs;
  const double t0 = nowSeconds();
  if (progress) sayLoading(dir, fs);
  std::vector<std::string> problems;
  std::optional<CheckpointData> ck = loadLatestGood(dir, fs, &problems);
  if (report)
    for (const auto& p : problems) std::fprintf(stderr, "morph: warning: skipping damaged checkpoint: %s\n", p.c_str());
  if (!ck) throw InputError("--resume " + dir + ": no intact checkpoint in this folder");
  tr.importState(*ck);
  if (report) {
    const std::string path = (std::filesystem::path(dir) / checkpointDirName(ck->step)).string();
    std::printf("morph: resuming from %s at step %lld (%.1f MB loaded in %.2f s)\n", path.c_str(),
                static_cast<long long>(ck->step), folderMegabytes(path), nowSeconds() - t0);
    std::fflush(stdout);
  }
}

void CheckpointKeeper::failed(const std::string& what) {
  ++failures_;
  if (failures_ >= max_)
    throw JobError(what + "; no checkpoint succeeded for " + std::to_string(failures_) +
                   " intervals in a row (checkpoint.max_failures = " + std::to_string(max_) + ")");
  std::fprintf(stderr, "morph: warning: %s; training goes on, the next interval writes again (%lld of %lld failures in a row)\n",
               what.c_str(), static_cast<long long>(failures_), static_cast<long long>(max_));
}

std::string CheckpointKeeper::submit(const CheckpointData& data) {
  if (w_->lastDurableStep() > last_ok_) {
    last_ok_ = w_->lastDurableStep();
    failures_ = 0;
  }
  try {
    w_->submit(data);
    return "";
  } catch (const JobError& e) {
    // The previous write failed (reported once, now); this one is submitted.
    const std::string what = e.what();
    failed(what);
    w_->submit(data);
    return what;
  }
}

std::string CheckpointKeeper::flush() {
  try {
    w_->flush();
    return "";
  } catch (const JobError& e) {
    const std::string what = e.what();
    failed(what);
    return what;
  }
}

json checkpointTiming(const CheckpointWriter& w) {
  const CheckpointWriter::Timing t = w.timing();
  const double n = static_cast<double>(std::max<int64_t>(t.writes, 1));
  return {{"writes", t.writes}, {"snapshot_seconds", t.snapshot_seconds / n}, {"write_seconds", t.write_seconds / n}};
}

std::string resumeStepFrom(const std::string& dir, Executor& tr, bool report, bool progress) {
  PosixFileSystem fs;
  const double t0 = nowSeconds();
  if (progress) sayLoading(dir, fs);
  std::vector<std::string> problems;
  const std::optional<std::string> path = newestIntactCheckpoint(dir, fs, &problems);
  if (report)
    for (const auto& p : problems) std::fprintf(stderr, "morph: warning: skipping damaged checkpoint: %s\n", p.c_str());
  if (!path) throw InputError("--resume " + dir + ": no intact checkpoint in this folder");
  const int64_t step = loadStepFrom(*path, tr);
  // Every file was read and verified; each stage loads its layers once placed.
  if (report) {
    std::printf("morph: resuming from %s at step %lld (%.1f MB verified in %.2f s)\n", path->c_str(),
                static_cast<long long>(step), folderMegabytes(*path), nowSeconds() - t0);
    std::fflush(stdout);
  }
  return *path;
}

int64_t loadStepFrom(const std::string& checkpoint, Executor& tr) {
  PosixFileSystem fs;
  const CheckpointData meta = loadLayers(checkpoint, fs, 0, -1);
  tr.importState(meta, /*partial=*/true);
  return meta.step;
}

void loadHeldLayers(const std::string& checkpoint, Executor& tr) {
  PosixFileSystem fs;
  const std::vector<size_t> held = tr.core().heldLayers();
  for (size_t i = 0; i < held.size();) {
    size_t j = i;
    while (j + 1 < held.size() && held[j + 1] == held[j] + 1) ++j;
    tr.importState(loadLayers(checkpoint, fs, static_cast<int64_t>(held[i]), static_cast<int64_t>(held[j])),
                   /*partial=*/true);
    i = j + 1;
  }
}

int64_t newestGoodCheckpoint(const std::string& dir) {
  PosixFileSystem fs;
  std::vector<std::string> problems;
  auto ck = loadLatestGood(dir, fs, &problems);
  return ck ? ck->step : -1;
}

int64_t newestGoodCheckpointAtMost(const std::string& dir, int64_t at_most) {
  PosixFileSystem fs;
  for (int64_t step : listCheckpointSteps(dir, fs)) {
    if (step > at_most) continue;
    try {
      loadCheckpoint((std::filesystem::path(dir) / checkpointDirName(step)).string(), fs);
      return step;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "morph: warning: skipping damaged checkpoint: %s\n", e.what());
    }
  }
  return -1;
}

}  // namespace detail
}  // namespace morph
