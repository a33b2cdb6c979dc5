// registerWithManager (registration.h).
#include "control/worker/registration.h"

#include <unistd.h>

#include "comm/communicator.h"
#include "control/fault_seams.h"
#include "control/protocol/keys.h"
#include "control/protocol/worker_label.h"
#include "control/store_access.h"
#include "core/sys.h"

namespace morph {

using json = nlohmann::json;
using namespace detail;

namespace {

// A store call of this worker (but waits with their own limit) fails after
// this long without an answer.
constexpr auto kWorkerStoreTimeout = std::chrono::seconds(300);

}  // namespace

Registration registerWithManager(const WorkerOptions& o) {
  Registration r;
  auto [host, port] = parseHostPort(o.join, "--join");
  r.iface = localAddressToward(host, port);
  r.token = readToken(o.token_file);
  r.store = connectToManager(o.join, r.token, "worker", o.connect_timeout_s);
  r.store->setTimeout(kWorkerStoreTimeout);

  r.hb = json::parse(getString(*r.store, keys::kJobHeartbeat));
  r.id = r.store->add(keys::kNextWorkerId, 1) - 1;
  r.me = std::to_string(r.id);
  faultPoint("registering", r.id);
  // Before the pid: a manager that sees the pid finds the label there too.
  if (!o.label.empty()) setString(*r.store, keys::workerLabel(r.id), WorkerLabel{o.label}.encode());
  setString(*r.store, keys::workerPid(r.id), std::to_string(getpid()));
  setString(*r.store, keys::workerAddr(r.id), r.iface);
  r.probe = std::make_unique<ProbeListener>(r.iface);
  setString(*r.store, keys::workerProbe(r.id), r.probe->address());
  // Its own connection, as this worker (registered on `store`): the
  // manager watches this worker's heartbeats from here on.
  r.heartbeat = std::make_unique<Heartbeat>(
      [join = o.join, key = morph::store::workerKey(r.token, r.store->sessionNonce()), me = r.me](double t) {
        return connectToManager(join, key, "worker/" + me, t);
      },
      o.connect_timeout_s, r.id, r.hb.at("interval").get<double>(), o.join);
  if (r.store->check({keys::kJobResumeCommand}))
    r.heartbeat->setLossNote("", getString(*r.store, keys::kJobResumeCommand));
  faultPoint("registered", r.id);
  return r;
}

}  // namespace morph
