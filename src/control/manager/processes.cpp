#include "control/manager/processes.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include "control/manager/zygote.h"
#include "control/store_access.h"
#include "core/error.h"

namespace morph {

pid_t LocalProcesses::start() {
  if (WorkerZygote* z = WorkerZygote::get()) {
    const pid_t pid = z->spawn({self_exe_, "worker", "--join", join_, "--token-file", token_file_});
    if (pid > 0) {
      ++forked_;
      return pid;
    }
  }
  pid_t pid = fork();
  if (pid < 0) throw JobError("cannot start a worker process");
  if (pid == 0) {
    // No orphans if the manager dies: the worker names the newest good
    // checkpoint and the resume command, and exits (worker/liveness.cpp).
    prctl(PR_SET_PDEATHSIG, detail::kManagerDeathSignal);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execl(self_exe_.c_str(), self_exe_.c_str(), "worker", "--join", join_.c_str(), "--token-file",
          token_file_.c_str(), static_cast<char*>(nullptr));
    std::perror("morph: exec worker");
    _exit(3);
  }
  return pid;
}

void LocalProcesses::kill(pid_t pid) { ::kill(pid, SIGKILL); }

std::optional<WorkerProcesses::Exit> LocalProcesses::reap() {
  for (;;) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return std::nullopt;
    WorkerZygote* z = WorkerZygote::get();
    if (z != nullptr && pid == z->pid()) {  // not a worker (killed with the manager's group, say)
      z->reaped();
      continue;
    }
    return Exit{pid, status};
  }
}

void LocalProcesses::wait(pid_t pid) { waitpid(pid, nullptr, 0); }

void LocalProcesses::retire() {
  if (WorkerZygote* z = WorkerZygote::get()) z->stop();
  while (waitpid(-1, nullptr, WNOHANG) > 0) {
  }
}

void LocalProcesses::waitAll() {
  if (WorkerZygote* z = WorkerZygote::get()) z->stop();
  while (waitpid(-1, nullptr, 0) > 0) {
  }
}

}  // namespace morph
