// Where the tests find the binaries of the build and the checkout's files:
// paths relative to the test program's own folder (tests/CMakeLists.txt
// passes them as MORPH_BINARY, MORPH_CRASHY_BINARY, MORPH_SOURCE_DIR), so
// that no absolute path of one checkout is compiled into the tests and
// ccache's objects of one clone serve another.
#pragma once

#include <filesystem>
#include <string>

inline std::string morphTestPath(const char* relative) {
  static const std::filesystem::path dir = std::filesystem::read_symlink("/proc/self/exe").parent_path();
  return (dir / relative).lexically_normal().string();
}
