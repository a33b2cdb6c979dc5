// The shipped `morph` binary.
#include "cli/cli.h"

int main(int argc, char** argv) { return morph::morphMain(argc, argv); }
