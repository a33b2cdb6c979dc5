// The shipped `morph` binary.
#include "cli/cli.h"
#include "control/manager/zygote.h"

int main(int argc, char** argv) {
  // A worker forked by `morph run`'s zygote runs morphMain with its own
  // arguments in this process's command-line area.
  morph::registerMain(argc, argv, &morph::morphMain);
  return morph::morphMain(argc, argv);
}
