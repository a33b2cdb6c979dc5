// CLI11's parse with Morph's exit codes, shared by the `morph` command line
// (cli/command_line.cpp) and the C++ benchmarks (bench/bench_cli.h).
#pragma once

#include <CLI/CLI.hpp>

namespace morph {

// Parses argv into `app`. Returns -1 to go on, else the exit code to return
// from main(), CLI11's message printed: 0 after --help, 2 for bad input.
inline int parseCli11(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  return -1;
}

}  // namespace morph
