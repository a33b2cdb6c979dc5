// What follows a committed step, decided in one place for the in-process
// runner (runner.cpp) and the worker (worker/worker_job.cpp): whether an
// evaluation and a checkpoint are due (pure: no store, no clock), and the
// step's metrics line (docs/job_file.md, "Outputs").
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

#include "core/job_spec.h"
#include "data/dataset.h"
#include "exec/trainer.h"

namespace morph {

struct AfterStep {
  bool evaluate = false;    // after every job.eval_every-th step, and after the last
  bool checkpoint = false;  // after every job.checkpoint_every-th step (0: never)
};

// `step`: the committed step, counted from 0; `steps`: the run's last step + 1.
inline AfterStep dueAfterStep(const JobSpec& job, int64_t steps, int64_t step) {
  const int64_t done = step + 1;
  AfterStep due;
  due.evaluate = done == steps || (job.eval_every > 0 && done % job.eval_every == 0);
  due.checkpoint = job.checkpoint_every > 0 && done % job.checkpoint_every == 0;
  return due;
}

namespace detail {

using json = nlohmann::json;

// The metrics line of a committed step, without evaluation: the same on
// every member (they hold the same reduced values).
json commitLine(const JobSpec& job, const StepStats& st, int workers, int64_t generation);
// The metrics line of a committed step (evaluates when one is due, unless
// `eval` holds that evaluation already).
json stepLine(const JobSpec& job, int64_t steps, const StepStats& st, Executor& tr, const Dataset& test,
              int workers, int64_t generation,
              const EvalStats* eval = nullptr);

}  // namespace detail
}  // namespace morph
