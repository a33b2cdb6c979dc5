// Worker agent: joins a job's store, waits for a generation that includes
// it, trains its VNs, and regroups when membership changes — without
// restarting and without losing a committed step. Protocol:
// docs/distributed.md ("Generations"). Its parts: registration (phase 1),
// WorkerJob (phases 2-5), generation_entry (the state a member receives),
// liveness (heartbeat, the manager watchdog, peers' heartbeats).
#include <exception>
#include <optional>

#include "control/protocol/keys.h"
#include "control/store_access.h"
#include "control/worker/liveness.h"
#include "control/worker/registration.h"
#include "control/worker/worker_job.h"
#include "core/error.h"

namespace morph {

using namespace detail;

int runWorker(const WorkerOptions& o) {
  installManagerDeathHandler();
  Registration reg = registerWithManager(o);
  bool ready = false;  // posted workers/<id>/ready: past start-up
  // Outside the try: the job (executors, data, prefetch and checkpoint
  // threads, buffers an abandoned collective may still write) stays as it
  // was while the watchdog decides whether the manager is gone; that exit
  // runs no destructor. Unwinding it first, a CI run (2026-12-05) aborted
  // with a corrupted heap between the manager's death and the watchdog.
  std::optional<WorkerJob> w;
  try {
    w.emplace(reg);
    w->startUp();
    ready = true;
    return w->run();
  } catch (const std::exception& e) {
    if (!ready) {
      // It cannot start: the manager prints why (and goes on without it).
      try {
        setString(*reg.store, keys::workerStartError(reg.id),
                  json({{"why", e.what()}, {"input", dynamic_cast<const InputError*>(&e) != nullptr}}).dump());
      } catch (const std::exception&) {
      }
    }
    // A store call failing because the manager is gone: the watchdog
    // prints the resume command and exits. Bad input and a job that cannot
    // go on are this worker's own findings (the manager may be gone already
    // because of them).
    if (!dynamic_cast<const InputError*>(&e) && !dynamic_cast<const JobError*>(&e)) reg.heartbeat->waitIfManagerLost();
    throw;
  }
}

}  // namespace morph
