// The metrics line of a committed step (after_step.h).
#include "control/after_step.h"

#include <chrono>

namespace morph {
namespace detail {

json commitLine(const JobSpec& job, const StepStats& st, int workers, int64_t generation) {
  json line = {{"step", st.step},
               {"loss", st.loss},
               {"lr", st.lr},
               {"samples_per_second", static_cast<double>(job.global_batch) / st.seconds},
               {"workers", workers},
               {"generation", generation},
               {"train_accuracy", st.train_accuracy},
               {"grad_norm", st.grad_norm},
               {"attempts", st.attempts},
               {"step_seconds", st.seconds},
               {"reduce_seconds", st.reduce_seconds},
               {"reduced_bytes", st.reduced_bytes},
               // When the step committed (wall clock): the time between two
               // lines is everything a step costs, between-step work included.
               {"unix_time", std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()}};
  if (job.regression()) line.erase("train_accuracy");  // mse: no classes to be right about
  return line;
}

json stepLine(const JobSpec& job, int64_t steps, const StepStats& st, Executor& tr, const Dataset& test,
              int workers, int64_t generation, const EvalStats* eval) {
  json line = commitLine(job, st, workers, generation);
  if (dueAfterStep(job, steps, st.step).evaluate) {
    EvalStats e = eval ? *eval : tr.evaluate(test, job.eval_batch);
    if (!job.regression()) line["test_accuracy"] = e.accuracy;
    line["test_loss"] = e.loss;
    line["eval_seconds"] = e.seconds;
  }
  return line;
}

}  // namespace detail
}  // namespace morph
