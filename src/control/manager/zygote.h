// The worker zygote: a copy of `morph run` forked before it starts any
// thread, which starts the manager's local workers by fork instead of exec.
//
// Why: an exec'd `morph worker` spends about 0.6 s of CPU before its main()
// (libtorch's static initialisers and page faults), once per local worker
// and once more per worker a resize starts. A fork of a process that has
// done that work costs milliseconds (docs/performance.md, "Build and test
// time"). MORPH_ZYGOTE=0 turns it off (every worker is exec'd, as before).
//
// Contract:
//  - A forked worker runs main() with the worker's arguments (`morph worker
//    --join HOST:PORT --token-file FILE`), exactly as an exec'd one would:
//    same command line in /proc (so `ps` and `pgrep -f` see `morph worker
//    --join ...`), same exit code, an empty signal mask, and
//    kManagerDeathSignal when the manager ends.
//  - It is a child of the manager, not of the zygote: the manager is a
//    child subreaper and the zygote double-forks, so waitpid() in the
//    manager reaps workers as before.
//  - When the zygote cannot start a worker (never started, more than one
//    thread at start, the arguments do not fit the command-line area), the
//    caller execs instead.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace morph {

using MainFunction = int (*)(int, char**);

// Called once, first thing in main(): the process's argument area (the
// command line a forked worker rewrites) and the main() it runs.
void registerMain(int argc, char** argv, MainFunction main_fn);

class WorkerZygote {
 public:
  // Forks the zygote now. Call while the process runs one thread (before
  // any tensor work, store server or status page); does nothing when
  // registerMain was not called, when more than one thread runs, or when
  // MORPH_ZYGOTE=0. Makes this process a child subreaper.
  static void start();
  // The running zygote, or null.
  static WorkerZygote* get();
  // Starts main(args) in a forked process; returns its pid (a child of this
  // process), or -1 when the caller must exec instead.
  pid_t spawn(const std::vector<std::string>& args);
  // The zygote's pid (the manager's waitpid(-1) also returns it); -1 once
  // reaped.
  pid_t pid() const { return pid_; }
  // The manager reaped the zygote (it died): stop() must not wait for its
  // pid, which the kernel may give to another process.
  void reaped() { pid_ = -1; }
  // Ends the zygote and reaps it (before waiting for every child).
  void stop();

 private:
  WorkerZygote(pid_t pid, int fd) : pid_(pid), fd_(fd) {}
  pid_t pid_;
  int fd_;
};

}  // namespace morph
