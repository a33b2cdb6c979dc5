// The training engine, `morph-engine`: the `morph` front beside it
// (front_main.cpp) execs it, with the same arguments, for every command that
// needs libtorch.
#include <unistd.h>

#include <string>

#include "cli/cli.h"
#include "control/manager/zygote.h"

namespace {

// Workers, calibration peers and cluster jobs start through the front
// beside this binary, so that their command lines read `morph ...` (users'
// `ps`, the tests' `pgrep -f "^$MORPH worker"`); without a front there, this
// binary starts them itself.
const std::string& launcher() {
  static const std::string path = [] {
    char buf[4096];
    const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) return std::string();
    const std::string self(buf, static_cast<size_t>(n));
    const std::string front = self.substr(0, self.rfind('/') + 1) + "morph";
    return ::access(front.c_str(), X_OK) == 0 ? front : self;
  }();
  return path;
}

int engineMain(int argc, char** argv) { return morph::morphMain(argc, argv, launcher()); }

}  // namespace

int main(int argc, char** argv) {
  // A worker forked by `morph run`'s zygote runs engineMain with its own
  // arguments in this process's command-line area.
  morph::registerMain(argc, argv, &engineMain);
  return engineMain(argc, argv);
}
