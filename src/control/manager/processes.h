// The manager's local worker processes, behind an interface: the only code
// of the manager that forks, kills or waits for a process. Tests of the
// manager's decisions use a fake (tests/control/manager_logic_test.cpp).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>

namespace morph {

class WorkerProcesses {
 public:
  struct Exit {
    pid_t pid = -1;
    int status = 0;  // as waitpid reports it
  };
  virtual ~WorkerProcesses() = default;
  // Starts a `morph worker` that joins this job; returns its pid.
  virtual pid_t start() = 0;
  // SIGKILL.
  virtual void kill(pid_t pid) = 0;
  // A child that ended, without waiting; none when no child has.
  virtual std::optional<Exit> reap() = 0;
  // Waits until `pid` ends; waitAll: until every child has.
  virtual void wait(pid_t pid) = 0;
  virtual void waitAll() = 0;
  // The job is over and every live worker was waited for: ends what only
  // served to start workers (the zygote) and reaps children that already
  // exited, without waiting for any other (one that still runs ends with
  // the manager, by its death signal).
  virtual void retire() {}
  // How many of the started processes were forked by the worker zygote
  // (control/manager/zygote.h) rather than exec'd.
  virtual int forked() const { return 0; }
};

// Real processes: `self_exe worker --join JOIN --token-file TOKEN_FILE`,
// each killed by the kernel when the manager dies (PR_SET_PDEATHSIG with
// kManagerDeathSignal: the worker then names the resume command). Forked by
// the worker zygote when it runs (control/manager/zygote.h), else exec'd;
// waitAll and retire end the zygote first.
class LocalProcesses : public WorkerProcesses {
 public:
  LocalProcesses(std::string self_exe, std::string join, std::string token_file)
      : self_exe_(std::move(self_exe)), join_(std::move(join)), token_file_(std::move(token_file)) {}
  pid_t start() override;
  void kill(pid_t pid) override;
  std::optional<Exit> reap() override;
  void wait(pid_t pid) override;
  void waitAll() override;
  void retire() override;
  int forked() const override { return forked_; }

 private:
  std::string self_exe_, join_, token_file_;
  int forked_ = 0;
};

}  // namespace morph
