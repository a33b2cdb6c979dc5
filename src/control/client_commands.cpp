// runResize, runStatus, runSlow (client_commands.h): no libtorch here, so
// the `morph` front runs them without loading it (cli/front_main.cpp).
#include "control/client_commands.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "control/protocol/keys.h"
#include "control/protocol/resize_request.h"
#include "control/job_address.h"
#include "core/error.h"
#include "core/job_spec.h"

namespace morph {

using json = nlohmann::json;
using namespace detail;

namespace {

// The client commands give up on reaching the manager, and `morph status`
// on its first status record, after this long.
constexpr double kClientTimeoutS = 5.0;
constexpr std::chrono::milliseconds kClientWait{static_cast<int64_t>(kClientTimeoutS * 1000)};

std::string getString(StoreConnection& store, const std::string& key) { return text(store.get(key, kClientWait)); }
void setString(StoreConnection& store, const std::string& key, const std::string& value) {
  store.set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

}  // namespace

int runResize(const std::string& join, int workers, const std::string& token_file, std::vector<int64_t> release) {
  std::sort(release.begin(), release.end());
  if (std::adjacent_find(release.begin(), release.end()) != release.end())
    throw InputError("--release: a worker id is listed twice");
  for (int64_t id : release)
    if (id < 0) throw InputError("--release " + std::to_string(id) + ": expected a worker id (>= 0)");
  auto store = dialManager(join, readToken(token_file), "client", kClientTimeoutS);
  // What the manager would ignore is refused here, where the user sees it.
  const JobSpec job = parseJob(getString(*store, keys::kJobText), getString(*store, keys::kJobOrigin),
                               splitLines(getString(*store, keys::kJobOverrides)));
  if (workers > job.virtual_nodes)
    throw InputError("--workers " + std::to_string(workers) + ": the job at " + join + " has " +
                     std::to_string(job.virtual_nodes) + " VNs (batch.virtual_nodes), so at most " +
                     std::to_string(job.virtual_nodes) + " workers");
  std::string named;
  for (int64_t id : release) {
    if (!store->check({keys::workerPid(id)}))
      throw InputError("--release " + std::to_string(id) + ": the job at " + join +
                       " has no such worker (ids: morph status --join " + join + ")");
    named += (named.empty() ? ", releasing worker(s) " : ", ") + std::to_string(id);
  }
  setString(*store, keys::kResizeTarget, ResizeRequest{workers, release}.encode());
  store->add(keys::kResizeSeq, 1);
  std::printf("asked the job at %s to run on %d workers%s\n", join.c_str(), workers, named.c_str());
  return 0;
}

int runStatus(const std::string& join, const std::string& token_file) {
  auto store = dialManager(join, readToken(token_file), "client", kClientTimeoutS);
  store->wait({keys::kStatus}, kClientWait);
  std::printf("%s\n", json::parse(getString(*store, keys::kStatus)).dump(2).c_str());
  return 0;
}

int runSlow(const std::string& join, int64_t worker, double factor, const std::string& token_file) {
  if (!std::isfinite(factor) || factor < 1.0 || factor > 1000.0)
    throw InputError("--factor " + std::to_string(factor) + ": expected a slowdown from 1 (this machine's speed) to 1000");
  if (worker < 0) throw InputError("--worker " + std::to_string(worker) + ": expected a worker id (>= 0)");
  auto store = dialManager(join, readToken(token_file), "client", kClientTimeoutS);
  const std::string id = std::to_string(worker);
  if (!store->check({keys::workerPid(worker)}))
    throw InputError("--worker " + id + ": the job at " + join + " has no such worker (ids: morph status --join " +
                     join + ")");
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", factor);
  setString(*store, keys::slow(worker), buf);
  std::string note;
  if (store->check({keys::kStatus})) {
    const auto s = json::parse(getString(*store, keys::kStatus), nullptr, false);
    if (s.is_object() && s.contains("members")) {
      bool member = false;
      for (const auto& m : s.at("members")) member = member || (m.is_number_integer() && m.get<int64_t>() == worker);
      if (!member) note = " (not a member of the current generation: it applies it once placed)";
    }
  }
  std::printf("asked worker %s of the job at %s to run %g times slower%s\n", id.c_str(), join.c_str(), factor,
              note.c_str());
  return 0;
}

}  // namespace morph
