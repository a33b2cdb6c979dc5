// PipelineMorpher: a pipeline job's layout and how it morphs. Before any
// worker starts it validates the plan (cut, replicas, VN shares, worker
// slots, schedule, memory cap, each device's memory) and holds the layout;
// at a membership change it chooses the next shape (the planner's best
// plan with a profile, else the rule) and the layers that move
// (plan/morph_plan.h), and says when waiting workers should grow it. At the
// end: the pipeline's figures for summary.json, its Chrome trace and the
// model hash from the stages' layer hashes. docs/pipeline.md, "Morphing".
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "control/protocol/generation_plan.h"
#include "control/protocol/member_report.h"
#include "control/runner.h"
#include "core/job_spec.h"
#include "data/dataset.h"
#include "exec/schedule.h"
#include "plan/morph_cost.h"
#include "plan/morph_plan.h"
#include "plan/profile.h"
#include "plan/resources.h"

namespace morph {

class PipelineMorpher {
 public:
  PipelineMorpher(const RunOptions& o, const JobSpec& job) : o_(o), job_(job) {}

  // Validates the options' plan for `workers` workers (InputError) and sets
  // up the layout: a pipeline (--stages, a plan file), a plan file's worker
  // slots and VN shares, the resources file.
  void setUp(int workers);
  // The workers generation 0 runs on (a plan file's slots, else --workers).
  int target() const { return target_; }
  bool pipelined() const { return pipeline_.has_value(); }
  const std::optional<PipelineLayout>& layout() const { return pipeline_; }
  // A plan file's worker slot of each world rank of generation 0 (empty: none).
  const std::vector<int>& planWorkers() const { return plan_workers_; }
  // Data parallelism from a plan file: VNs per worker (empty: even).
  const std::vector<int64_t>& dpShares() const { return dp_shares_; }
  const std::optional<Resources>& resources() const { return res_; }
  // A WSP job with a resources file: per worker slot, its device's seconds
  // per VN (deviceVnSeconds(), plan/resources.h), which size the VWs' VN
  // shares (wspShares()); empty otherwise (even shares).
  const std::vector<double>& wspVnSeconds() const { return wsp_vn_seconds_; }

  // Whether the pipeline should grow onto `joiners` waiting workers
  // (checked when their number changes and every elastic.grow_interval
  // seconds while some wait; `now` on the manager's clock). With a profile,
  // the morph's cost over the next K steps (`steps_left`: the job's steps
  // to go, < 0 unknown; plan/morph_cost.h) against K steps of the current
  // plan.
  bool shouldGrow(int size, int joiners, int target_workers, double now, int64_t steps_left = -1);
  // VN shares per replica by measured speed for members in rank order
  // (PipelineStragglerWatch::shares), or none.
  using MeasuredShares =
      std::function<std::optional<std::vector<int64_t>>(const std::vector<int64_t>& members, int stages)>;
  // The next generation after a membership change: its shape, placement
  // and the layers that move from `survivors` (their reports) and the
  // `waiting` workers. Sets `members` (by world rank) and the workers
  // released; NoWorkerLeft when no shape fits or nothing can restore it.
  // With a profile, of the planner's best plans the cheapest over the next
  // K steps (`steps_left` as for shouldGrow()).
  PipelineMorph publishMorph(std::vector<int64_t>& members, const std::vector<int64_t>& survivors,
                             const std::map<int64_t, MemberReport>& reports, const std::vector<int64_t>& waiting,
                             int target_workers, const MeasuredShares& measured, std::vector<int64_t>& released,
                             int64_t steps_left = -1);

  // The pipeline's plan as summary.json names it (docs/planner.md).
  nlohmann::json planSummary() const {
    return {{"stages", pipeline_->stages},
            {"replicas", pipeline_->replicas},
            {"schedule", pipeline_->schedule},
            {"recompute", pipeline_->recompute},
            {"cuts", pipeline_->cuts}};
  }
  // The measured bubble fraction over the steady steps, the formula's, the
  // mean step time and each stage's peak memory, from the members' results.
  nlohmann::json pipelineResults(const std::vector<nlohmann::json>& results, int64_t first_step, int64_t steps);
  // Chrome trace-event JSON of the members' actions (--trace).
  void writeTrace(c10d::Store& store, const std::vector<int64_t>& members);
  // The model hash from each stage's layer hashes (NoWorkerLeft when a
  // stage reported none).
  std::string pipelineHash(const std::map<int, std::string>& stage_hashes);

 private:
  // How a pipeline job runs on `workers` workers: with a profile (--plan
  // auto) of the planner's best plans the one that costs least over the
  // next K steps from the workers `at_hand` (null: the fastest step), else
  // the documented rule.
  struct MorphTarget {
    MorphShape shape;             // {0, 0}: nothing fits
    std::vector<size_t> cuts;
    std::string schedule;
    bool recompute = false;
    std::vector<int64_t> vn_shares;  // per replica; empty: even
    double predicted_s = 0;          // the planner's step time
    std::string by;                  // "planner" or "rule"
    std::optional<MorphCost> cost;   // when chosen by its cost over K steps
    std::string figures;             // that choice's figures, for the morph: lines
  };
  MorphTarget morphTarget(int workers, int target_workers, const MorphCostInput* at_hand = nullptr);
  // The planner's best plans for `workers` workers, fastest step first
  // (cached by worker count; empty: none fits).
  const std::vector<MorphTarget>& plannedTargets(int workers);
  // What a morph's cost is computed from: the workers `holders`, the
  // profile's layer bytes and p2p fit, K from `steps_left`.
  MorphCostInput costInput(std::vector<MorphCandidate> holders, int target_workers, int64_t steps_left) const;
  // The memory cap a morph's shape must fit (--memory-cap, or the smallest
  // device of a resources file); 0: none.
  int64_t morphMemoryCap() const;
  void setUpPipeline();
  void checkDeviceMemory(const std::vector<size_t>& cuts, const ScheduleOptions& so,
                         const std::vector<std::string>& names);

  const RunOptions& o_;
  const JobSpec& job_;
  int target_ = 0;
  std::optional<PipelineLayout> pipeline_;
  std::vector<int> plan_workers_;
  std::vector<int64_t> dp_shares_;
  std::optional<Resources> res_;
  std::vector<double> wsp_vn_seconds_;
  std::vector<std::string> layer_names_;  // pipeline jobs: the model's layers, for its hash
  std::vector<int64_t> layer_bytes_;      // per layer: parameters, buffers and optimiser state
  std::vector<std::pair<size_t, size_t>> tied_layers_;  // (user, owner) of shared weights
  // Pipeline morphs: the profile of --plan auto, the planner's choice by
  // worker count, the rule's memory verdicts by (stages, replicas), and
  // when spares were last considered for growth.
  std::optional<Profile> profile_;
  std::map<int, std::vector<MorphTarget>> planned_;
  std::map<std::pair<int, int>, bool> fits_;
  std::unique_ptr<Dataset> mem_train_;
  int grow_joiners_ = -1;
  double grow_checked_ = 0;
  std::string grow_said_;
};

}  // namespace morph
