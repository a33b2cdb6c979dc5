// The `morph` command line in the training engine, as a function, so that
// the engine binary (main.cpp) and the tests' fault-injecting build of it
// (tests/cli/crashy_main.cpp) run the same code. The `morph` users run is a
// libtorch-free front (front_main.cpp) that answers what needs no libtorch
// itself and hands every other command to the engine.
#pragma once

#include <string>

namespace morph {

// Parses the arguments, runs the subcommand and returns the exit code (0
// success, 2 bad input, 3 the job could not go on). self_exe: the binary
// that starts workers, calibration peers and cluster jobs ("": this
// process's own executable).
int morphMain(int argc, char** argv, const std::string& self_exe = "");

}  // namespace morph
