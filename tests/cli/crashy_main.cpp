// `morph` with a fault-injecting checkpoint file system: the tests' build
// of the command (never shipped). MORPH_TEST_CRASH_IN_CHECKPOINT =
// <step>[:<name>] makes the process die, as a machine losing power would,
// at the first write or rename in that step's scratch directory of a file
// called <name> (default: any layer file; "rename": publishing the
// directory); a write is left half done. Each phase of the checkpoint
// protocol can be hit: "layer-002.bin" (a stage's layer file),
// ".share-000002" (its share record), "extra.bin" or "MANIFEST" (the
// commit), "rename" (publishing). Workers it starts run this binary too.
// It strikes once per checkpoint folder (a marker file there remembers),
// so a job that survives the crash (a pipeline morphs) writes on.
//
// MORPH_TEST_FAULT = POINT:WORKER:ACTION[,...] acts at a control-plane
// fault point (runner.h, setFaultHook) of worker id WORKER: ACTION "exit"
// ends the process at once (exit code 9, as a kill would), "sleep=S" holds
// it there S seconds (a slow evaluation, say), "lose" throws the
// CommFailure of a collective lost on this worker alone. E.g.
// "registered:0:exit", "evaluate:0:sleep=6", "last-sum@150:1:lose" (a
// pipeline step's last world collective, ended everywhere, taken as lost
// by worker 1). The points of a step are ExecutorProbe::atPoint's with the
// step ("compute@25", "reduce@25", "reduced@25", "last-sum@150"), and
// "checkpoint@29" just before a worker snapshots step 29 for its checkpoint.
//
// MORPH_TEST_PIPE_DELAY_MS = MEAN or MEAN:JITTER (ms, >= 0) emulates a slow,
// jittery link for pipeline sends (exec/pipeline.h, LinkEmulation): each
// activation/gradient message is held back MEAN +- JITTER ms on its
// sender, and `simulate` and `plan` count MEAN per message. The benches use
// it where the kernel has no netem (bench/pipeline_bench.py,
// bench/sim_accuracy.py); the shipped `morph` never reads it.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/checkpoint_store.h"
#include "cli/cli.h"
#include "comm/communicator.h"
#include "control/manager/zygote.h"
#include "control/runner.h"
#include "core/error.h"
#include "core/parse_number.h"
#include "exec/pipeline.h"

namespace {

class CrashingFileSystem : public morph::PosixFileSystem {
 public:
  explicit CrashingFileSystem(const std::string& spec) {
    const size_t colon = spec.find(':');
    tag_ = ".tmp-" + morph::checkpointDirName(std::atoll(spec.substr(0, colon).c_str()));
    name_ = colon == std::string::npos ? "layer-" : spec.substr(colon + 1);
  }
  void writeFile(const std::string& path, const std::string& bytes) override {
    const std::string base = path.substr(path.rfind('/') + 1);
    if (path.find(tag_) != std::string::npos && base.rfind(name_, 0) == 0 && strikes(path)) {
      PosixFileSystem::writeFile(path, bytes.substr(0, bytes.size() / 2));
      die(path);
    }
    PosixFileSystem::writeFile(path, bytes);
  }
  void rename(const std::string& from, const std::string& to) override {
    if (name_ == "rename" && from.find(tag_) != std::string::npos && strikes(from)) die(from);
    PosixFileSystem::rename(from, to);
  }

 private:
  // True the first time for a checkpoint folder (`path` lies in one of its
  // scratch directories): a marker file there remembers the crash.
  static bool strikes(const std::string& path) {
    const std::string marker = path.substr(0, path.rfind("/.tmp-")) + "/.test-crashed";
    if (access(marker.c_str(), F_OK) == 0) return false;
    if (FILE* f = std::fopen(marker.c_str(), "w")) std::fclose(f);
    return true;
  }
  [[noreturn]] static void die(const std::string& path) {
    std::fprintf(stderr, "morph: test hook: crashing at %s\n", path.c_str());
    _exit(9);
  }
  std::string tag_, name_;
};

struct Fault {
  std::string point;
  int64_t worker = -1;
  std::string action;
};

std::vector<Fault> parseFaults(const std::string& spec) {
  std::vector<Fault> out;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t a = item.find(':'), b = item.find(':', a == std::string::npos ? a : a + 1);
    if (a == std::string::npos || b == std::string::npos) {
      std::fprintf(stderr, "MORPH_TEST_FAULT: '%s': expected POINT:WORKER:ACTION\n", item.c_str());
      std::exit(2);
    }
    out.push_back({item.substr(0, a), std::atoll(item.substr(a + 1, b - a - 1).c_str()), item.substr(b + 1)});
  }
  return out;
}

// "MEAN" or "MEAN:JITTER" milliseconds; InputError naming the variable otherwise.
morph::LinkEmulation parseLinkDelay(const std::string& spec) {
  const std::string what = "MORPH_TEST_PIPE_DELAY_MS (MEAN[:JITTER] ms)";
  const size_t colon = spec.find(':');
  morph::LinkEmulation e;
  e.delay_ms = morph::parseDoubleOr(spec.substr(0, colon), what, 0.0, 1e6);
  if (colon != std::string::npos) e.jitter_ms = morph::parseDoubleOr(spec.substr(colon + 1), what, 0.0, 1e6);
  return e;
}

}  // namespace

int main(int argc, char** argv) {
  if (const char* spec = std::getenv("MORPH_TEST_PIPE_DELAY_MS")) {
    try {
      morph::setLinkEmulation(parseLinkDelay(spec));
    } catch (const morph::InputError& e) {
      std::fprintf(stderr, "morph: %s\n", e.what());
      return 2;
    }
  }
  if (const char* spec = std::getenv("MORPH_TEST_CRASH_IN_CHECKPOINT")) {
    const std::string s = spec;
    morph::setCheckpointFileSystemFactory([s] { return std::make_unique<CrashingFileSystem>(s); });
  }
  if (const char* spec = std::getenv("MORPH_TEST_FAULT")) {
    morph::setFaultHook([faults = parseFaults(spec)](const std::string& point, int64_t worker) {
      for (const Fault& f : faults) {
        if (f.point != point || f.worker != worker) continue;
        std::fprintf(stderr, "morph: test hook: worker %lld at '%s': %s\n", static_cast<long long>(worker),
                     point.c_str(), f.action.c_str());
        std::fflush(stderr);
        if (f.action == "exit") _exit(9);
        if (f.action == "lose") throw morph::CommFailure("test hook: the collective is lost here");
        if (f.action.rfind("sleep=", 0) == 0)
          std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(f.action.c_str() + 6)));
      }
    });
  }
  // Workers forked by the zygote run morphMain with the hooks above set;
  // this binary starts its workers itself (no front).
  morph::registerMain(argc, argv, [](int n, char** args) { return morph::morphMain(n, args); });
  return morph::morphMain(argc, argv);
}
