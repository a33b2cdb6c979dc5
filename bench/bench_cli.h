// The command lines of the C++ benchmarks: CLI11, as the morph binary's.
// An unknown flag, a missing value or one out of range is an error (exit
// code 2, with CLI11's message), never silently ignored: a bench run with a
// mistyped flag would otherwise print figures of another configuration.
#pragma once

#include "cli/cli11_parse.h"

namespace morph::bench {

// Parses argv into `app`. Returns -1 to go on, else the exit code to
// return from main(): 0 after --help, 2 for bad input.
inline int parseArgs(CLI::App& app, int argc, char** argv) { return parseCli11(app, argc, argv); }

}  // namespace morph::bench
