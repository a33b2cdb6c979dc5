// The pipeline morph planner: shapes by the documented rule, placements that
// keep layers where they are, transfers only from holders of the newest
// step, and the checkpoint fallback when a layer has no such holder.
#include "plan/morph_plan.h"

#include <gtest/gtest.h>

namespace morph {
namespace {

TEST(MorphShape, KeepsDepthAndShrinksReplicas) {
  // P = 2 on 4 workers; 3 left: 2 x 1 (one spare); 4 again: 2 x 2.
  EXPECT_EQ(chooseMorphShape(3, 2, 4, 8, 6, nullptr).stages, 2);
  EXPECT_EQ(chooseMorphShape(3, 2, 4, 8, 6, nullptr).replicas, 1);
  EXPECT_EQ(chooseMorphShape(4, 2, 4, 8, 6, nullptr).replicas, 2);
  // Never more than --workers, nor more replicas than VNs.
  EXPECT_EQ(chooseMorphShape(9, 2, 4, 8, 6, nullptr).workers(), 4);
  EXPECT_EQ(chooseMorphShape(8, 2, 8, 3, 6, nullptr).replicas, 3);
}

TEST(MorphShape, FewerWorkersThanStagesGivesTheDeepestThatFits) {
  EXPECT_EQ(chooseMorphShape(2, 3, 3, 8, 6, nullptr).stages, 2);
  EXPECT_EQ(chooseMorphShape(1, 3, 3, 8, 6, nullptr).stages, 1);
  // Memory: only 1 stage fits... 2 stages do not fit means try 1.
  auto fits = [](int p, int) { return p != 2; };
  EXPECT_EQ(chooseMorphShape(2, 3, 3, 8, 6, fits).stages, 1);
  auto never = [](int, int) { return false; };
  EXPECT_EQ(chooseMorphShape(2, 3, 3, 8, 6, never).workers(), 0);
  // At most one stage per layer.
  EXPECT_EQ(chooseMorphShape(5, 8, 8, 8, 3, nullptr).stages, 3);
}

TEST(MorphShape, DepthKeptThatNoLongerFitsGoesDeeper) {
  // 2 x 2 on 4 workers; 3 left. 2 x 1 would hold all 8 VNs per replica,
  // which (say) exceeds the cap; 3 x 1 holds less per stage and fits.
  auto fits = [](int p, int d) { return p >= 3 || d >= 2; };
  const MorphShape s = chooseMorphShape(3, 2, 4, 8, 6, fits);
  EXPECT_EQ(s.stages, 3);
  EXPECT_EQ(s.replicas, 1);
  // 4 workers: 2 x 2 fits as it is.
  EXPECT_EQ(chooseMorphShape(4, 2, 4, 8, 6, fits).replicas, 2);
  // Nothing deeper is possible with 2 workers: no shape.
  EXPECT_EQ(chooseMorphShape(2, 2, 4, 8, 6, [](int, int d) { return d >= 2; }).workers(), 0);
  // The verdict is asked for the replicas the shape would have.
  std::vector<std::pair<int, int>> asked;
  chooseMorphShape(5, 2, 8, 8, 6, [&](int p, int d) { asked.push_back({p, d}); return false; });
  const std::vector<std::pair<int, int>> want{{2, 2}, {3, 1}, {4, 1}, {5, 1}};
  EXPECT_EQ(asked, want);
}

TEST(MorphPlan, SurvivorsKeepTheirStagesAndNothingMoves) {
  // 2 stages x 2 replicas over layers [0,3) [3,6); worker 3 (stage 1 of
  // replica 1) died. Survivors: 0 (stage 0), 1 (stage 1), 2 (stage 0).
  MorphInput in;
  in.stages = 2;
  in.cuts = {0, 3, 6};
  in.target = 4;
  in.virtual_nodes = 8;
  in.layer_bytes = {10, 10, 10, 10, 10, 10};
  in.candidates = {{0, 50, 0, 3}, {1, 50, 3, 6}, {2, 50, 0, 3}};
  const MorphShape shape = chooseMorphShape(3, 2, 4, 8, 6, nullptr);
  const MorphPlan p = planMorph(in, shape, in.cuts);
  ASSERT_TRUE(p.live) << p.why_not_live;
  EXPECT_EQ(p.step, 50);
  EXPECT_EQ(p.members, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(p.spares, (std::vector<int64_t>{2}));
  EXPECT_TRUE(p.transfers.empty());
  EXPECT_EQ(p.bytes_moved, 0);
}

TEST(MorphPlan, JoinerReceivesItsStageFromHolders) {
  // Back to 2 x 2: the joiner 4 takes the stage nobody spare holds.
  MorphInput in;
  in.stages = 2;
  in.cuts = {0, 3, 6};
  in.target = 4;
  in.virtual_nodes = 8;
  in.layer_bytes = {10, 20, 30, 40, 50, 60};
  in.candidates = {{0, 80, 0, 3}, {1, 80, 3, 6}, {2, -1, 0, 0}, {4, -1, 0, 0}};
  const MorphPlan p = planMorph(in, {2, 2}, in.cuts);
  ASSERT_TRUE(p.live) << p.why_not_live;
  ASSERT_EQ(p.members.size(), 4u);
  EXPECT_EQ(p.members[0], 0);
  EXPECT_EQ(p.members[1], 1);
  // Ranks 2 and 3 (replica 1) receive stage 0 from rank 0, stage 1 from rank 1.
  ASSERT_EQ(p.transfers.size(), 6u);
  for (const MorphTransfer& t : p.transfers) {
    EXPECT_EQ(t.src, t.layer < 3 ? 0 : 1);
    EXPECT_EQ(t.dst, t.layer < 3 ? 2 : 3);
  }
  EXPECT_EQ(p.bytes_moved, 210);
  EXPECT_EQ(p.meta_source, 0);
}

TEST(MorphPlan, ShallowerPipelineMovesOnlyWhatChangedOwner) {
  // 3 stages [0,2) [2,4) [4,6) on 4 workers (the last stage has two
  // replicas' worth... here: worker 4 holds the middle stage) to 2 stages
  // [0,3) [3,6) on 3 workers: the first two keep what they hold, and the
  // middle stage's holder is placed where it keeps the most.
  MorphInput in;
  in.stages = 3;
  in.cuts = {0, 2, 4, 6};
  in.target = 6;
  in.virtual_nodes = 8;
  in.layer_bytes = {1, 1, 1, 1, 1, 1};
  in.candidates = {{0, 9, 0, 2}, {2, 9, 4, 6}, {4, 9, 2, 4}};
  const MorphPlan p = planMorph(in, {3, 1}, {0, 2, 4, 6});
  ASSERT_TRUE(p.live) << p.why_not_live;
  EXPECT_EQ(p.members, (std::vector<int64_t>{0, 4, 2}));
  EXPECT_TRUE(p.transfers.empty());
  // Two stages: worker 4 is left over as a spare, and a spare cannot send
  // (it is not in the generation), so layers 2 and 3 have no source.
  const MorphPlan q = planMorph(in, {2, 1}, {0, 3, 6});
  EXPECT_EQ(q.members, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(q.spares, (std::vector<int64_t>{4}));
  EXPECT_FALSE(q.live);
}

TEST(MorphPlan, LostStageWithoutReplicaNeedsTheCheckpoint) {
  MorphInput in;
  in.stages = 3;
  in.cuts = {0, 2, 4, 6};
  in.target = 3;
  in.virtual_nodes = 4;
  in.layer_bytes = {1, 1, 1, 1, 1, 1};
  in.candidates = {{0, 30, 0, 2}, {2, 30, 4, 6}};
  const MorphPlan p = planMorph(in, {2, 1}, {0, 3, 6});
  EXPECT_FALSE(p.live);
  EXPECT_NE(p.why_not_live.find("layer 2"), std::string::npos) << p.why_not_live;
  EXPECT_EQ(p.members.size(), 2u);
}

// Two one-layer stages, one replica; worker 0 holds layer 0 at step
// `ahead`, worker 1 layer 1 at `behind` (prepared for the next step or not).
MorphInput twoStages(int64_t ahead, int64_t behind, bool prepared) {
  MorphInput in;
  in.stages = 2;
  in.cuts = {0, 1, 2};
  in.target = 2;
  in.virtual_nodes = 4;
  in.layer_bytes = {1, 1};
  in.candidates = {{0, ahead, 0, 1}, {1, behind, 1, 2}};
  in.candidates[1].prepared = prepared;
  return in;
}

TEST(MorphPlan, StaleHolderIsNotASource) {
  // Worker 1 committed one step less (its last reduction failed) and has
  // no step prepared: its layers are of step 41, so the job cannot
  // continue from 42 live.
  const MorphInput in = twoStages(42, 41, false);
  EXPECT_FALSE(planMorph(in, {2, 1}, in.cuts).live);
}

TEST(MorphPlan, PreparedHolderFinishesTheStepTheOthersCommitted) {
  // Worker 1 lost only the last collective of step 41 (its sums were done,
  // it is prepared); worker 0 committed that step. Worker 1 can finish it,
  // so its layers count at step 42: live, nothing moves, the step counter
  // from worker 0.
  MorphInput in = twoStages(42, 41, true);
  const MorphPlan p = planMorph(in, {2, 1}, in.cuts);
  ASSERT_TRUE(p.live) << p.why_not_live;
  EXPECT_EQ(p.step, 42);
  EXPECT_TRUE(p.transfers.empty());
  EXPECT_EQ(p.members, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(p.meta_source, 0);
  EXPECT_EQ(p.finishing, (std::vector<int>{1}));
  // Prepared for step 41 but two steps behind: no holder of layer 1 at 43.
  in.candidates[0].step = 43;
  EXPECT_FALSE(planMorph(in, {2, 1}, in.cuts).live);
  // Nobody committed beyond its step: it holds its layers at its own step
  // (the prepared step is dropped), and that is the step the job goes on from.
  in.candidates[0].step = 41;
  const MorphPlan q = planMorph(in, {2, 1}, in.cuts);
  ASSERT_TRUE(q.live) << q.why_not_live;
  EXPECT_EQ(q.step, 41);
  EXPECT_TRUE(q.finishing.empty());
}

TEST(MorphPlan, TiedWeightOwnerGoesToTheLastStage) {
  // Layer 3 uses layer 0's weight; 1 stage to 2: the new last stage needs
  // layer 0 (for the shared weight) besides its own.
  MorphInput in;
  in.stages = 1;
  in.cuts = {0, 4};
  in.target = 2;
  in.virtual_nodes = 4;
  in.layer_bytes = {5, 1, 1, 1};
  in.tied = {{3, 0}};
  in.candidates = {{0, 7, 0, 4}, {5, -1, 0, 0}};
  EXPECT_EQ(layersNeeded({0, 2, 4}, 1, in.tied), (std::vector<size_t>{0, 2, 3}));
  const MorphPlan p = planMorph(in, {2, 1}, {0, 2, 4});
  ASSERT_TRUE(p.live) << p.why_not_live;
  // Worker 0 keeps the last stage (layers 0, 2, 3: 7 bytes it need not
  // move) and sends layers 0 and 1 (6 bytes) to the joiner on stage 0.
  EXPECT_EQ(p.members, (std::vector<int64_t>{5, 0}));
  ASSERT_EQ(p.transfers.size(), 2u);
  EXPECT_EQ(p.transfers[0].layer, 0u);
  EXPECT_EQ(p.transfers[1].layer, 1u);
  EXPECT_EQ(p.bytes_moved, 6);
}

}  // namespace
}  // namespace morph
