// What a run's options and job file resolve to before any work: the
// effective overrides, the output and checkpoint folders, and the job's
// data (loaded once per process, with the progress line).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "control/runner.h"
#include "core/job_spec.h"

namespace morph {

// data/dataset.h (not included: the command line, built without the
// precompiled libtorch header, includes this file).
struct DataPair;
namespace detail {

// Loads the job's dataset; with `say`, reports what it holds and how long
// loading took in one line ("data: ...", docs/job_file.md, "Progress").
DataPair loadData(const JobSpec& job, const std::function<void(const std::string&)>& say = nullptr);
// --set overrides plus --steps (an override of job.steps replaces job.epochs).
// Inline: the libtorch-free `morph` front checks a job file with them too.
inline std::vector<std::string> effectiveOverrides(const RunOptions& o) {
  std::vector<std::string> ov = o.overrides;
  if (o.steps > 0) ov.push_back("job.steps=" + std::to_string(o.steps));
  return ov;
}
std::string outDir(const RunOptions& o, const JobSpec& job);
// Where checkpoints go, absolute: --checkpoint-dir, else checkpoint.dir,
// else OUT/checkpoints.
std::string checkpointDir(const RunOptions& o, const JobSpec& job);

}  // namespace detail
}  // namespace morph
