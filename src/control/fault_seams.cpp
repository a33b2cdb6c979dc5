// The test seams (fault_seams.h, runner.h).
#include "control/fault_seams.h"

#include "control/runner.h"

namespace morph {
namespace detail {

namespace {
FileSystemFactory& fileSystemFactory() {
  static FileSystemFactory f;
  return f;
}
FaultHook& faultHook() {
  static FaultHook f;
  return f;
}
}  // namespace

void faultPoint(const std::string& point, int64_t worker) {
  if (faultHook()) faultHook()(point, worker);
}

bool faultHookSet() { return static_cast<bool>(faultHook()); }

std::unique_ptr<FileSystem> checkpointFileSystem() {
  if (fileSystemFactory()) return fileSystemFactory()();
  return std::make_unique<PosixFileSystem>();
}

}  // namespace detail

void setCheckpointFileSystemFactory(FileSystemFactory factory) { detail::fileSystemFactory() = std::move(factory); }
void setFaultHook(FaultHook hook) { detail::faultHook() = std::move(hook); }

}  // namespace morph
