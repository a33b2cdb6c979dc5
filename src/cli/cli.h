// The `morph` command line as a function, so that the shipped binary and
// the tests' fault-injecting build of it (tests/cli/crashy_main.cpp) run the
// same code.
#pragma once

namespace morph {

// Parses the arguments, runs the subcommand and returns the exit code (0
// success, 2 bad input, 3 the job could not go on).
int morphMain(int argc, char** argv);

}  // namespace morph
