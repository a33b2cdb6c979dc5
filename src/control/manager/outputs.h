// Outputs: what a job run by the manager writes — metrics.jsonl and the
// progress display (RunLog) from the members' metrics lines, the status
// record (`morph status`, the status page), and at the end the members'
// results checked against each other, summary.json (resizes, plan, the
// pipeline's figures and trace) and the model hash. docs/outputs.md.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "control/manager/clock.h"
#include "control/run_log.h"
#include "control/runner.h"
#include "core/job_spec.h"
#include "status/status_server.h"

namespace morph {

namespace store {
class Table;
}
class Generations;
class Membership;
class PipelineMorpher;

class Outputs {
 public:
  Outputs(const RunOptions& o, const JobSpec& job, std::string dir) : o_(o), job_(job), dir_(std::move(dir)) {}

  void setStatusPage(std::unique_ptr<StatusServer> page) { status_page_ = std::move(page); }
  // Reads the committed steps' metrics lines in order (each once: its key
  // is erased from `table`), records them and hands each to `committed`.
  void pollMetrics(c10d::Store& store, store::Table& table,
                   const std::function<void(const nlohmann::json&)>& committed);
  // The status record, at most every kStatusIntervalS.
  void updateStatus(c10d::Store& store, const Clock& clock, const nlohmann::json& generation);
  // Nothing left to recompute: the last step is committed (perhaps not yet
  // read by pollMetrics).
  bool allStepsDone(c10d::Store& store) const;
  // Every step's metrics read.
  bool allStepsRead() const { return log_ && next_ == steps_; }
  int64_t nextStep() const { return next_; }
  // Steps the job has still to commit, as far as the manager has read; -1
  // before it knows the job's step count.
  int64_t stepsLeft() const { return log_ ? std::max<int64_t>(0, steps_ - next_) : -1; }
  // Whether training is over: every step's metrics read and every member
  // still alive posted its result of this generation (Generations::resultsPosted).
  bool resultsPosted(c10d::Store& store, const Generations& g) const;
  int64_t lastCommitted() const { return committed_; }
  // Phase 4: the members' results checked against each other, the workers
  // told the job finished (and waited for), and the summary written.
  int finish(c10d::Store& store, const Generations& g, Membership& m, PipelineMorpher& pm);

 private:
  const RunOptions& o_;
  const JobSpec& job_;
  std::string dir_;
  std::unique_ptr<detail::RunLog> log_;
  int64_t steps_ = -1, next_ = 0, committed_ = -1, first_step_ = 0;
  double last_status_ = 0, last_sps_ = 0;
  std::unique_ptr<StatusServer> status_page_;  // --status (docs/status_page.md)
};

}  // namespace morph
