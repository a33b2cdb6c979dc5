// The manager's entry point (manager.cpp): `morph run --workers N` hosts the
// job's store and coordinates its workers until the job ends.
#pragma once

#include <string>

#include "control/runner.h"
#include "core/job_spec.h"

namespace morph {

// `job_text` is the job file's text as validated into `job`. Returns the
// process exit code (0, 2 or 3).
int runManager(const RunOptions& o, const JobSpec& job, const std::string& job_text);

}  // namespace morph
