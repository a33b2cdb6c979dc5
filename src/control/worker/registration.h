// Phase 1 of a worker: it takes an id in the job's store, posts its pid
// and address, and starts its heartbeat (docs/distributed.md, "Workers").
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "control/runner.h"
#include "control/worker/liveness.h"
#include "control/worker/reachability.h"
#include "store/client.h"

namespace morph {

// Phase 1, registration: the worker's id, pid and address posted, and its
// heartbeat running (the manager watches it from here on).
struct Registration {
  std::string iface;  // this host's address toward the manager (Gloo binds it)
  std::string token;
  c10::intrusive_ptr<StoreClient> store;  // the worker's own connection, registered as `id`
  nlohmann::json hb;                      // {"interval", "timeout"} of the job's heartbeats (seconds)
  int64_t id = -1;
  std::string me;                         // the id as text
  std::unique_ptr<Heartbeat> heartbeat;   // declared after `store`: stops before it closes
  std::unique_ptr<ProbeListener> probe;   // what peers connect to when a collective stalls (workers/<id>/probe)
};

Registration registerWithManager(const WorkerOptions& o);

}  // namespace morph
