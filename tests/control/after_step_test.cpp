#include "control/after_step.h"

#include <gtest/gtest.h>

#include <vector>

namespace morph {
namespace {

// The steps (0-based) after which `pick` says something is due.
template <typename Pick>
std::vector<int64_t> dueSteps(const JobSpec& job, int64_t steps, Pick pick) {
  std::vector<int64_t> out;
  for (int64_t s = 0; s < steps; ++s)
    if (pick(dueAfterStep(job, steps, s))) out.push_back(s);
  return out;
}

TEST(AfterStep, EvaluationAfterEveryIntervalAndAfterTheLastStep) {
  JobSpec job;
  job.eval_every = 4;
  const auto eval = [](const AfterStep& d) { return d.evaluate; };
  EXPECT_EQ(dueSteps(job, 10, eval), (std::vector<int64_t>{3, 7, 9}));
  EXPECT_EQ(dueSteps(job, 8, eval), (std::vector<int64_t>{3, 7}));  // the last step is an interval's: once
  job.eval_every = 0;  // only at the end
  EXPECT_EQ(dueSteps(job, 10, eval), (std::vector<int64_t>{9}));
}

TEST(AfterStep, CheckpointAfterEveryIntervalOnly) {
  JobSpec job;
  job.checkpoint_every = 3;
  const auto ckpt = [](const AfterStep& d) { return d.checkpoint; };
  EXPECT_EQ(dueSteps(job, 10, ckpt), (std::vector<int64_t>{2, 5, 8}));  // not after the last step
  job.checkpoint_every = 0;  // no checkpoints
  EXPECT_TRUE(dueSteps(job, 10, ckpt).empty());
}

}  // namespace
}  // namespace morph
