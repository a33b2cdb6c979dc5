// The control-plane store's keys (docs/distributed.md, "Store keys"), built
// in one place instead of spelled by hand where they are read and written.
// Who may write each is the store server's policy (store_server.cpp).
#pragma once

#include <cstdint>
#include <string>

namespace morph {
namespace keys {

// The job, written by the manager (job/steps, job/start_step: by the first
// worker to get there).
inline const std::string kJobText = "job/text", kJobOrigin = "job/origin", kJobOverrides = "job/overrides",
                         kJobOut = "job/out", kJobResume = "job/resume", kJobHeartbeat = "job/heartbeat",
                         kJobCkptDir = "job/ckpt_dir", kJobCkptMarker = "job/ckpt_marker",
                         kJobStageLocal = "job/stage_local", kJobResumeCommand = "job/resume_command",
                         kJobSteps = "job/steps", kJobStartStep = "job/start_step", kJobFinished = "job/finished",
                         kJobQuiet = "job/quiet";
// Membership.
inline const std::string kNextWorkerId = "workers/next_id", kEvents = "events", kGenCurrent = "gen/current",
                         kGenWant = "gen/want", kStatus = "status";
// Requests of `morph resize`.
inline const std::string kResizeTarget = "ctl/resize_target", kResizeSeq = "ctl/resize_seq";

// A worker's own keys: workers/<id>/<what>.
inline std::string worker(int64_t id, const char* what) { return "workers/" + std::to_string(id) + "/" + what; }
inline std::string workerPid(int64_t id) { return worker(id, "pid"); }
inline std::string workerAddr(int64_t id) { return worker(id, "addr"); }
inline std::string workerHeartbeat(int64_t id) { return worker(id, "hb"); }
inline std::string workerReady(int64_t id) { return worker(id, "ready"); }
inline std::string workerFingerprint(int64_t id) { return worker(id, "fingerprint"); }
inline std::string workerRefused(int64_t id) { return worker(id, "refused"); }
inline std::string workerFatal(int64_t id) { return worker(id, "fatal"); }
inline std::string workerStartError(int64_t id) { return worker(id, "start_error"); }
// Every key of worker `id` starts with this.
inline std::string workerPrefix(int64_t id) { return worker(id, ""); }

// Generation g: gen/<g>, its plan and abort flag, and each member's reports
// gen/<g>/<what>/<id> (what: ready, left, line, held, morph).
inline std::string gen(int64_t g) { return "gen/" + std::to_string(g); }
// Every key of generation g (its process groups' too) starts with this.
inline std::string genPrefix(int64_t g) { return gen(g) + "/"; }
inline std::string genPlan(int64_t g) { return gen(g) + "/plan"; }
inline std::string genAbort(int64_t g) { return gen(g) + "/abort"; }
inline std::string genReport(int64_t g, const std::string& what, int64_t id) {
  return gen(g) + "/" + what + "/" + std::to_string(id);
}

inline std::string metrics(int64_t step) { return "metrics/" + std::to_string(step); }
inline std::string result(int64_t id) { return "result/" + std::to_string(id); }
inline std::string trace(int64_t id) { return "trace/" + std::to_string(id); }

}  // namespace keys
}  // namespace morph
