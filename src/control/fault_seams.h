// The test seams of runner.h as the control plane calls them: the file
// system checkpoint writers write through, and the named fault points of a
// worker. The shipped binary installs neither (tests/cli/crashy_main.cpp does).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ckpt/checkpoint_store.h"

namespace morph {
namespace detail {

// The installed factory's file system, else the real one.
std::unique_ptr<FileSystem> checkpointFileSystem();
// The fault seam (runner.h): calls the installed hook, if any.
void faultPoint(const std::string& point, int64_t worker);
// Whether a fault hook is installed (the tests' build).
bool faultHookSet();

}  // namespace detail
}  // namespace morph
