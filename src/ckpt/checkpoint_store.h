// Continuous checkpoint store: durable, verifiable snapshots of the training
// state, written in the background while training goes on.
//
// A checkpoint is the directory DIR/step-<12-digit step>/ holding a MANIFEST,
// one tensor file per layer (so a pipeline stage can load just its contiguous
// layer range) and one file for the non-layer state. The grammar of every
// file is specified in docs/checkpoint_format.md.
//
// Guarantees:
//  - A checkpoint directory appears under its final name only once every
//    byte of it is on disk (write to DIR/.tmp-step-<n>-<pid>/, fsync each
//    file and the directory, rename, fsync DIR). A crash at any point leaves
//    either the complete new checkpoint or none, never a partial step-* dir.
//  - Every byte read back is verified (manifest checksum, per-file size and
//    xxh64, per-file trailer) before it is trusted; loadLatestGood() falls
//    back to older checkpoints and says why each newer one was rejected.
//
// What this component must never do: decide what goes into a checkpoint (the
// caller hands it tensors and an opaque `meta`), touch the model, or silently
// drop a failed write. All disk access goes through the FileSystem seam so
// crash and torn-write tests can inject faults.
//
// Concurrency contract: at most one writer (CheckpointStore write or
// CheckpointWriter) per directory at a time; readers may run at any time and
// only ever see complete step-* directories.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <cstdint>
#include <exception>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace morph {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// One snapshot of the training state. Tensors must be dense (strided) and of
// a dtype listed in docs/checkpoint_format.md; they are stored contiguous, on
// the CPU, without autograd history. Tensor names must be unique within a
// layer (and within `extra`); layer names are free-form labels.
struct CheckpointData {
  int64_t step = 0;  // 0 <= step <= 999999999999 (12 decimal digits)
  std::string job_id;  // opaque identity of the job (e.g. its spec hash)
  nlohmann::json meta;  // opaque: scale state, epoch, RNG/sampler position...
  std::vector<std::pair<std::string, NamedTensors>> layers;  // in layer order
  int64_t first_layer = 0;  // layers[0]'s index in the model (a stage's share, a partial load)
  NamedTensors extra;  // non-layer state
};

// How one of several writers (pipeline stages) takes part in a checkpoint.
// Each writes its layers (CheckpointData::first_layer onwards) into the
// scratch directory DIR/.tmp-step-<n>-<attempt>/, then a share record
// listing them; the committer also waits until the share records cover
// every layer, then writes extra.bin and MANIFEST and publishes the
// directory. docs/checkpoint_format.md, "Writing protocol".
struct CheckpointShare {
  std::string attempt;       // the same on every writer of one checkpoint; [A-Za-z0-9_-]+
  bool commit = false;       // this writer commits (exactly one per checkpoint)
  int64_t total_layers = 0;  // committer: layers of the whole checkpoint
  double wait_seconds = 600.0;  // committer: how long to wait for the other shares
};

// The narrow filesystem seam. Paths are plain strings ('/'-separated). Every
// method throws (morph::JobError from PosixFileSystem) on failure, naming the
// path and the OS error.
class FileSystem {
 public:
  virtual ~FileSystem() = default;
  // Creates or truncates `path`, writes all of `bytes` and fsyncs the file
  // before returning. Not atomic: callers write into a temporary directory.
  virtual void writeFile(const std::string& path, const std::string& bytes) = 0;
  virtual std::string readFile(const std::string& path) = 0;
  // POSIX rename(2): atomic; `to` must not be a non-empty directory.
  virtual void rename(const std::string& from, const std::string& to) = 0;
  // Removes a file or a directory tree; a missing path is not an error.
  virtual void removeAll(const std::string& path) = 0;
  // Names (not paths) of the entries of directory `path`, without "." and
  // "..", in no particular order; empty if `path` does not exist.
  virtual std::vector<std::string> listDir(const std::string& path) = 0;
  // Creates directory `path` and any missing parents; existing ones are fine.
  virtual void makeDir(const std::string& path) = 0;
  // fsyncs directory `path`, making renames and creations in it durable.
  virtual void syncDir(const std::string& path) = 0;
};

class PosixFileSystem : public FileSystem {
 public:
  void writeFile(const std::string& path, const std::string& bytes) override;
  std::string readFile(const std::string& path) override;
  void rename(const std::string& from, const std::string& to) override;
  void removeAll(const std::string& path) override;
  std::vector<std::string> listDir(const std::string& path) override;
  void makeDir(const std::string& path) override;
  void syncDir(const std::string& path) override;
};

// --- Tensor files (docs/checkpoint_format.md, "Tensor file") -------------

// Serialises named tensors into one tensor file image, trailer included.
// Throws InputError for an unsupported dtype or layout or a duplicate name.
std::string encodeTensorFile(const NamedTensors& tensors);
// Parses and verifies a tensor file image; `what` names it in errors. The
// result owns its memory (CPU, contiguous). Throws InputError on any defect
// (bad magic or version, truncation, trailer mismatch, bad dtype or shape).
NamedTensors decodeTensorFile(const std::string& bytes, const std::string& what);

// --- Checkpoints ------------------------------------------------------------

// "step-000000000042".
std::string checkpointDirName(int64_t step);

// Steps of the step-* directories in `dir`, newest first (whether valid or not).
std::vector<int64_t> listCheckpointSteps(const std::string& dir, FileSystem& fs);

// Writes `data` as DIR/step-<n> atomically and durably (see the header
// comment), replacing an existing step-<n>. Then keeps the `keep` newest
// checkpoints with step <= n, deletes older ones, and removes leftovers of
// interrupted writes. Checkpoints with step > n (an abandoned later run) are
// left alone. Returns the checkpoint's path. Throws InputError for bad `data`
// or keep < 1, and whatever `fs` throws (the previous checkpoints stay intact).
std::string writeCheckpoint(const std::string& dir, const CheckpointData& data, FileSystem& fs,
                            int keep);

// Phase one of a checkpoint written by several writers: `data.layers` go
// into the shared scratch directory as layer files, then a share record
// (.share-<first layer>) names them with their sizes and checksums. Every
// file is fsynced before the next is written; the record is the last thing
// this writer touches (the committer may publish the directory as soon as
// it is complete). Throws InputError for bad `data`, JobError for I/O.
void writeCheckpointShare(const std::string& dir, const CheckpointData& data, FileSystem& fs,
                          const CheckpointShare& share);
// A writer whose share failed leaves `what` in the scratch directory
// (.failed-<first layer>), so that the committer gives up at once instead of
// waiting out its deadline. Throws what `fs` throws.
void reportShareFailure(const std::string& dir, const CheckpointData& data, FileSystem& fs,
                        const CheckpointShare& share, const std::string& what);
// Phase two, by the committer after its own share: waits (polling) until
// the share records cover layers [0, total_layers) without gaps or overlap,
// then writes extra.bin and MANIFEST (listing every layer file), fsyncs,
// publishes step-<n> and prunes like writeCheckpoint. Nothing is published
// if a share is missing: JobError after share.wait_seconds, or as soon as
// `cancelled()` (may be empty) returns true. Returns the checkpoint's path.
std::string commitCheckpoint(const std::string& dir, const CheckpointData& data, FileSystem& fs, int keep,
                             const CheckpointShare& share, const std::function<bool()>& cancelled);

// Reads and verifies the whole checkpoint at `checkpoint_dir` (a step-*
// directory). Throws InputError naming the file and the defect.
CheckpointData loadCheckpoint(const std::string& checkpoint_dir, FileSystem& fs);

// Like loadCheckpoint() but reads only layers [first_layer, last_layer]
// (inclusive, 0-based, in layer order) plus the non-layer state; the other
// layer files are not opened. result.layers[0] is layer `first_layer`
// (result.first_layer). last_layer = first_layer - 1 reads no layer (the
// manifest's step, job and meta only).
CheckpointData loadLayers(const std::string& checkpoint_dir, FileSystem& fs, int64_t first_layer,
                          int64_t last_layer);

// Number of layers of the checkpoint at `checkpoint_dir` (reads the manifest).
int64_t checkpointLayerCount(const std::string& checkpoint_dir, FileSystem& fs);

// The newest checkpoint in `dir` that passes every check, or nullopt if none
// does (or `dir` does not exist). For each newer checkpoint that was rejected,
// appends a line to `*problems` (if non-null) naming the file and the defect,
// e.g. "DIR/step-000000000050/layer-003.bin: checksum mismatch ...". The
// caller decides whether the job_id matches its job.
std::optional<CheckpointData> loadLatestGood(const std::string& dir, FileSystem& fs,
                                             std::vector<std::string>* problems);

// The newest checkpoint in `dir` whose manifest and every file pass their
// checks (files are read and checksummed one at a time, not decoded, so
// memory stays at one file), or nullopt. Problems as for loadLatestGood.
// Workers that each load only their own layers agree on it this way.
std::optional<std::string> newestIntactCheckpoint(const std::string& dir, FileSystem& fs,
                                                  std::vector<std::string>* problems);

// Deep copy of `data` with every tensor detached, moved to the CPU and made
// contiguous: a snapshot the caller's later in-place updates cannot reach.
// Validates like writeCheckpoint (throws InputError).
CheckpointData snapshotCheckpoint(const CheckpointData& data);

// --- Background writer -------------------------------------------------------

// Writes checkpoints on its own thread so that training continues while the
// bytes go to disk.
//
// At most one write is in flight: submit() first waits for the previous
// write to finish (so memory holds at most one snapshot besides the live
// model), then snapshots `data` (snapshotCheckpoint) and returns; the caller
// may modify its tensors as soon as submit() returns.
//
// A background failure is never lost: it is stored and thrown as JobError by
// the next submit() or flush() (once; the writer stays usable afterwards, so
// a later checkpoint may succeed). The destructor flushes and, since it may
// not throw, prints an unreported failure to stderr.
//
// submit() and flush() are meant to be called from one thread (the trainer).
class CheckpointWriter {
 public:
  // `*fs` must remain live while this writer exists. Throws InputError if
  // keep < 1. With `share`, this writer is one of several (a pipeline
  // stage): it writes its layers as a share, and commits the checkpoint if
  // share->commit.
  CheckpointWriter(std::string dir, FileSystem* fs, int keep,
                   std::optional<CheckpointShare> share = std::nullopt);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  void submit(const CheckpointData& data);
  // Waits until the submitted checkpoint (if any) is on disk.
  void flush();
  // Step of the newest checkpoint this writer made durable, -1 if none.
  int64_t lastDurableStep() const;
  // Durable checkpoints so far and the seconds they took in total: copying
  // in submit(), and writing (for a committer: until published).
  struct Timing {
    int64_t writes = 0;
    double snapshot_seconds = 0, write_seconds = 0;
  };
  Timing timing() const;

 private:
  void run();
  void waitIdleLocked(std::unique_lock<std::mutex>& lock);
  void rethrowFailureLocked();

  const std::string dir_;
  FileSystem* const fs_;
  const int keep_;
  const std::optional<CheckpointShare> share_;
  std::atomic<bool> cancel_{false};  // the destructor: stop waiting for other shares

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<CheckpointData> pending_;  // handed to the thread
  bool busy_ = false;  // a submit is snapshotting, or a write is pending/running
  bool stop_ = false;
  std::string failure_;  // unreported background failure, empty if none
  int64_t last_durable_step_ = -1;
  Timing timing_;
  double pending_snapshot_s_ = 0;  // of the checkpoint handed to the thread
  std::thread thread_;  // started in the constructor body, joined by the destructor
};

}  // namespace morph
