// `morph`, the front users run: libtorch-free, so what needs no training
// engine answers at once instead of after libtorch's start (about 0.7 CPU-s
// on this project's machines): --help, bad arguments, the client commands
// (`status`, `slow`, `resize`), a `run` whose job file is refused and a
// `worker` whose address or token is. Every
// other command is handed, with the same arguments and process, to the
// engine beside this binary (`morph-engine`, main.cpp), which parses them
// again and runs them.
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <csignal>
#include <cstring>
#include <string>

#include "cli/command_line.h"
#include "control/client_commands.h"
#include "control/job_address.h"
#include "control/run_setup.h"
#include "core/error.h"
#include "core/job_spec.h"

namespace {

// Replaces this process with the engine, its malloc on transparent huge
// pages (command_line.h, hugePageTunables); returns only by throwing.
[[noreturn]] void execEngine(char** argv) {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw morph::JobError(std::string("cannot find this binary (/proc/self/exe): ") + std::strerror(errno));
  const std::string self(buf, static_cast<size_t>(n));
  const std::string engine = self.substr(0, self.rfind('/') + 1) + "morph-engine";
  ::setenv("GLIBC_TUNABLES", morph::hugePageTunables(std::getenv("GLIBC_TUNABLES")).c_str(), 1);
  ::execv(engine.c_str(), argv);
  throw morph::JobError("cannot start the training engine " + engine + ": " + std::strerror(errno) +
                        " (it is built and installed beside `morph`)");
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);  // as the engine (cli.cpp): a client's store may go away mid-write
  morph::Invocation inv;
  const int rc = morph::parseCommandLine(argc, argv, inv);
  if (rc >= 0) return rc;
  return morph::exitCodeOf([&]() -> int {
    using C = morph::Invocation::Command;
    morph::checkArguments(inv);
    switch (inv.command) {
      case C::kResize: return morph::runResize(inv.ctl_join, inv.resize_workers, inv.ctl_token_file, inv.resize_release);
      case C::kStatus: return morph::runStatus(inv.ctl_join, inv.ctl_token_file);
      case C::kSlow: return morph::runSlow(inv.ctl_join, inv.slow_worker, inv.slow_factor, inv.ctl_token_file);
      case C::kRun:
        // The engine's first step too (runJob): a refused job file costs no
        // libtorch start.
        morph::loadJobFile(inv.run.job_path, morph::detail::effectiveOverrides(inv.run));
        break;
      case C::kWorker:
        // The engine's first checks (registerWithManager), short of
        // connecting: the address and the token.
        morph::detail::parseHostPort(inv.worker.join, "--join");
        morph::detail::readToken(inv.worker.token_file);
        break;
      default:
        break;
    }
    std::fflush(stdout);
    execEngine(argv);
  });
}
