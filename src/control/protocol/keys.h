// Every key of the control-plane store (docs/distributed.md, "Store keys"),
// built in one place instead of spelled by hand where they are read and
// written. Who may write each is the job's key policy (key_policy.h),
// written with these names.
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
                         kJobQuiet = "job/quiet", kJobWspReplay = "job/wsp_replay";
// Membership.
inline const std::string kNextWorkerId = "workers/next_id", kEvents = "events", kGenCurrent = "gen/current",
                         kGenWant = "gen/want";
// The manager's status record (`morph status`, the status page).
inline const std::string kStatus = "status";
// Requests of `morph resize`.
inline const std::string kResizeTarget = "ctl/resize_target", kResizeSeq = "ctl/resize_seq";
// `morph slow`: the slowdown factor worker `id` is asked to emulate.
inline const std::string kSlowPrefix = "ctl/slow/";
inline std::string slow(int64_t id) { return kSlowPrefix + std::to_string(id); }

// A worker's own keys: workers/<id>/<what>.
inline const std::string kWorkersPrefix = "workers/";
inline std::string worker(int64_t id, const char* what) { return kWorkersPrefix + std::to_string(id) + "/" + what; }
inline std::string workerPid(int64_t id) { return worker(id, "pid"); }
inline std::string workerAddr(int64_t id) { return worker(id, "addr"); }
inline std::string workerHeartbeat(int64_t id) { return worker(id, "hb"); }
inline std::string workerReady(int64_t id) { return worker(id, "ready"); }
inline std::string workerFingerprint(int64_t id) { return worker(id, "fingerprint"); }
inline std::string workerRefused(int64_t id) { return worker(id, "refused"); }
inline std::string workerFatal(int64_t id) { return worker(id, "fatal"); }
inline std::string workerStartError(int64_t id) { return worker(id, "start_error"); }
// `morph worker --label`: the label it was started with (a WorkerLabel),
// posted before its pid.
inline std::string workerLabel(int64_t id) { return worker(id, "label"); }
// Partitions (docs/distributed.md, "Partitions"): the address a worker's
// peers probe it on ("ip:port"), and which of them it cannot reach (a
// ReachReport).
inline std::string workerProbe(int64_t id) { return worker(id, "probe"); }
inline std::string workerReach(int64_t id) { return worker(id, "reach"); }
// Every key of worker `id` starts with this.
inline std::string workerPrefix(int64_t id) { return worker(id, ""); }
// The last part of a heartbeat key (workers/<id>/hb).
inline const std::string kHeartbeatSuffix = "/hb";

// Generation g: gen/<g>, its plan and abort flag, and each member's reports
// gen/<g>/<what>/<id> (kMemberReports).
inline const std::string kGenPrefix = "gen/";
inline std::string gen(int64_t g) { return kGenPrefix + std::to_string(g); }
// Every key of generation g (its process groups' too) starts with this.
inline std::string genPrefix(int64_t g) { return gen(g) + "/"; }
inline std::string genPlan(int64_t g) { return gen(g) + "/plan"; }
inline std::string genAbort(int64_t g) { return gen(g) + "/abort"; }
// A WSP generation after a lost one: the step of the checkpoint whose
// servers' state every member restores, -1 for the job's start (docs/wsp.md).
inline std::string genWspRestore(int64_t g) { return gen(g) + "/wsp_restore"; }
inline std::string genReport(int64_t g, const std::string& what, int64_t id) {
  return gen(g) + "/" + what + "/" + std::to_string(id);
}
// What a member reports under gen/<g>/<what>/<id>: leaving the generation
// (ready: to regroup; left: to exit; a MemberReport), what entering it
// took (morph), and a WSP member's pushes known when it was lost (wsp).
inline const char* const kMemberReports[] = {"ready", "left", "morph", "wsp"};
// The process groups of generation g meet under gen/<g>/<group>/... (Gloo's
// rendezvous): the world group, a pipeline's stage, tied and pipe groups.
inline const char* const kGenGroups[] = {"pg", "stage", "tied", "pipe"};

inline const std::string kMetricsPrefix = "metrics/", kResultPrefix = "result/", kTracePrefix = "trace/";
inline std::string metrics(int64_t step) { return kMetricsPrefix + std::to_string(step); }
inline std::string result(int64_t id) { return kResultPrefix + std::to_string(id); }
inline std::string trace(int64_t id) { return kTracePrefix + std::to_string(id); }

// Calibration's own store (`morph calibrate` and its peer process; open
// policy): the sizes to measure, the job, the peer's store round trip and
// the probe it times it with; its process group meets under calib/pg.
inline const std::string kCalibSizes = "calib/sizes", kCalibJob = "calib/job", kCalibStoreRtt = "calib/store_rtt",
                         kCalibProbe = "calib/probe", kCalibGroup = "calib/pg";

}  // namespace keys
}  // namespace morph
