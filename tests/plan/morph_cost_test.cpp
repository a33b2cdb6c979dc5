// What a morph to a candidate plan costs over the next K steps: the bytes
// its layers move (profile figures, the p2p fit, ranks in parallel), the
// steps it redoes from a checkpoint, and K steps of its step time; figures
// computed by hand (docs/planner.md, "Morph choices: what a morph moves").
#include "plan/morph_cost.h"

#include <gtest/gtest.h>

#include <cmath>

namespace morph {
namespace {

// 4 layers of 100 MB each to move (40 MB parameters, 40 MB optimiser
// state, 20 MB buffers), over a link of 100 MB/s without latency: moving a
// layer takes 1 s (plus 8e-8 s for its 8-byte length message).
Profile fourLayerProfile() {
  Profile p;
  p.layers.resize(4);
  for (LayerCost& l : p.layers) l.param_bytes = 40'000'000, l.optimizer_bytes = 40'000'000, l.buffer_bytes = 20'000'000;
  p.p2p.latency_s = 0;
  p.p2p.seconds_per_byte = 1e-8;
  return p;
}
constexpr double kLayerS = 1.0 + 8e-8;

MorphCostInput twoStagesAndAJoiner(const Profile& p, int64_t horizon) {
  // 2 stages x 1 replica cut {0, 2, 4}: worker 0 holds layers [0, 2),
  // worker 1 [2, 4), both at step 50; worker 2 joins holding nothing.
  MorphCostInput in;
  in.morph.stages = 2;
  in.morph.cuts = {0, 2, 4};
  in.morph.target = 3;
  in.morph.virtual_nodes = 12;
  in.morph.layer_bytes = layerMoveBytes(p);
  in.morph.candidates = {{0, 50, 0, 2}, {1, 50, 2, 4}, {2, -1, 0, 0}};
  in.p2p = p.p2p;
  in.horizon = horizon;
  return in;
}

TEST(MorphCost, LayerBytesArePartsOfTheProfile) {
  const std::vector<int64_t> want(4, 100'000'000);
  EXPECT_EQ(layerMoveBytes(fourLayerProfile()), want);
}

TEST(MorphCost, HorizonIsTheStepsLeftAtMostTheCap) {
  EXPECT_EQ(morphHorizon(-1), kMorphHorizonSteps);
  EXPECT_EQ(morphHorizon(30), 30);
  EXPECT_EQ(morphHorizon(kMorphHorizonSteps + 400), kMorphHorizonSteps);
  EXPECT_EQ(morphHorizon(0), 1);
}

TEST(MorphCost, MoveSecondsCountTwoMessagesPerLayerRanksInParallel) {
  // 0.5 ms latency, 1 GB/s. Layer 0 (1 MB) 0 -> 1, layer 1 (2 MB) 0 -> 2,
  // layer 2 (3 MB) 3 -> 2. Rank 0 sends 2 layers: 4 x 0.5 ms + (16 B + 3 MB)
  // / 1 GB/s = 5.000016 ms; rank 2 receives 2: 2 ms + (16 B + 5 MB) =
  // 7.000016 ms, the slowest; rank 3 sends one: 4.000008 ms.
  LinearFit p2p;
  p2p.latency_s = 0.5e-3;
  p2p.seconds_per_byte = 1e-9;
  const std::vector<int64_t> bytes{1'000'000, 2'000'000, 3'000'000};
  const std::vector<MorphTransfer> tr{{0, 0, 1}, {1, 0, 2}, {2, 3, 2}};
  EXPECT_NEAR(moveSeconds(tr, bytes, p2p), 7.000016e-3, 1e-12);
  EXPECT_EQ(moveSeconds({}, bytes, p2p), 0.0);
}

TEST(MorphCost, FastestStepLosesWhenItsMoveIsNotRepaidWithinK) {
  // The planner's two best plans for 3 workers, fastest step first:
  //  - data parallelism, 1 x 3 (0.90 s a step): workers 0 and 1 keep their
  //    places and need each other's 2 layers, the joiner all 4; each layer
  //    has one holder, so workers 0 and 1 send 4 layers each and the joiner
  //    receives 4: 8 layers, 800 MB, moved in 4 s.
  //  - 3 stages x 1, cut {0, 1, 2, 4} (0.95 s): worker 1 keeps [2, 4),
  //    worker 0 keeps [0, 1), the joiner receives layer 1: 100 MB, 1 s.
  // Over K steps: 4 + 0.90 K against 1 + 0.95 K; equal at K = 60.
  const Profile p = fourLayerProfile();
  for (int64_t K : {10, 100}) {
    SCOPED_TRACE("K = " + std::to_string(K));
    const MorphCostInput in = twoStagesAndAJoiner(p, K);
    const MorphCost dp = morphCost(in, {1, 3}, {0, 4}, 0.90);
    const MorphCost pipe = morphCost(in, {3, 1}, {0, 1, 2, 4}, 0.95);
    EXPECT_TRUE(dp.live);
    EXPECT_EQ(dp.bytes_moved, 800'000'000);
    EXPECT_EQ(dp.transfers, 8u);
    EXPECT_NEAR(dp.move_seconds, 4 * kLayerS, 1e-9);
    EXPECT_NEAR(dp.total_seconds, 4 * kLayerS + 0.90 * static_cast<double>(K), 1e-9);
    EXPECT_EQ(pipe.bytes_moved, 100'000'000);
    EXPECT_NEAR(pipe.move_seconds, kLayerS, 1e-9);
    EXPECT_NEAR(pipe.total_seconds, kLayerS + 0.95 * static_cast<double>(K), 1e-9);
    // K = 10: 13 s against 10.5 s, the pipeline; K = 100: 94 s against
    // 96 s, data parallelism.
    EXPECT_EQ(cheapestMorph({dp, pipe}), K == 10 ? 1u : 0u);
  }
  // Around the crossing (K = 60: a tie goes to the planner's first).
  EXPECT_EQ(cheapestMorph({morphCost(twoStagesAndAJoiner(p, 59), {1, 3}, {0, 4}, 0.90),
                           morphCost(twoStagesAndAJoiner(p, 59), {3, 1}, {0, 1, 2, 4}, 0.95)}),
            1u);
  EXPECT_EQ(cheapestMorph({morphCost(twoStagesAndAJoiner(p, 61), {1, 3}, {0, 4}, 0.90),
                           morphCost(twoStagesAndAJoiner(p, 61), {3, 1}, {0, 1, 2, 4}, 0.95)}),
            0u);
}

TEST(MorphCost, GrowingPaysOnlyWhenKStepsRepayTheMove) {
  // The pipeline runs at 1.00 s a step; the joiner's best morph (above) at
  // K = 10 is 3 x 1: 10.5 s against 0.97 x 10 x 1.00 = 9.7 s: stay (its step
  // alone, 0.95 < 0.97, would have grown). K = 100: data parallelism, 94 s
  // against 97 s: grow.
  const Profile p = fourLayerProfile();
  const MorphCost k10 = morphCost(twoStagesAndAJoiner(p, 10), {3, 1}, {0, 1, 2, 4}, 0.95);
  EXPECT_FALSE(morphPays(k10, 1.00, 0.97));
  const MorphCost k100 = morphCost(twoStagesAndAJoiner(p, 100), {1, 3}, {0, 4}, 0.90);
  EXPECT_TRUE(morphPays(k100, 1.00, 0.97));
  // What a steady pipeline holds is what twoStagesAndAJoiner() spells out.
  const std::vector<MorphCandidate> held = steadyHolders(2, 1, {0, 2, 4}, 1);
  ASSERT_EQ(held.size(), 3u);
  EXPECT_EQ(held[0].held_lo, 0u);
  EXPECT_EQ(held[0].held_hi, 2u);
  EXPECT_EQ(held[1].held_lo, 2u);
  EXPECT_EQ(held[1].held_hi, 4u);
  EXPECT_EQ(held[1].step, held[0].step);
  EXPECT_EQ(held[2].step, -1);
  MorphCostInput steady = twoStagesAndAJoiner(p, 100);
  steady.morph.candidates = held;
  EXPECT_NEAR(morphCost(steady, {1, 3}, {0, 4}, 0.90).total_seconds, k100.total_seconds, 1e-9);
}

TEST(MorphCost, RedoneStepsCountWhereASpareHoldsTheOnlyCopy) {
  // 3 stages x 1 cut {0, 1, 2, 4}, all at step 50: worker 0 holds [0, 1),
  // 1 holds [1, 2), 2 holds [2, 4). A 2 x 1 plan cut {0, 2, 4} (0.5 s a
  // step) places worker 2 on [2, 4) and worker 0 on [0, 2), and leaves
  // worker 1, layer 1's only holder, a spare: not live, every member
  // reloads the checkpoint of step 40 and 10 steps are done again: 10 x 0.5
  // + K x 0.5 = 10 s at K = 10. Keeping 3 x 1 (0.6 s) moves nothing: 6 s.
  const Profile p = fourLayerProfile();
  MorphCostInput in;
  in.morph.stages = 3;
  in.morph.cuts = {0, 1, 2, 4};
  in.morph.target = 3;
  in.morph.virtual_nodes = 12;
  in.morph.layer_bytes = layerMoveBytes(p);
  in.morph.candidates = {{0, 50, 0, 1}, {1, 50, 1, 2}, {2, 50, 2, 4}};
  in.p2p = p.p2p;
  in.horizon = 10;
  int asked = 0;
  in.checkpoint_step = [&] { ++asked; return int64_t{40}; };
  const MorphCost two = morphCost(in, {2, 1}, {0, 2, 4}, 0.5);
  const MorphCost three = morphCost(in, {3, 1}, {0, 1, 2, 4}, 0.6);
  EXPECT_EQ(asked, 1);  // only for the candidate that is not live
  EXPECT_FALSE(two.live);
  EXPECT_TRUE(two.feasible);
  EXPECT_EQ(two.steps_redone, 10);
  EXPECT_NEAR(two.redo_seconds, 5.0, 1e-12);
  EXPECT_NEAR(two.total_seconds, 10.0, 1e-12);
  EXPECT_TRUE(three.live);
  EXPECT_EQ(three.transfers, 0u);
  EXPECT_NEAR(three.total_seconds, 6.0, 1e-12);
  EXPECT_EQ(cheapestMorph({two, three}), 1u);
  // Without a checkpoint the 2 x 1 morph cannot happen at all.
  in.checkpoint_step = [] { return int64_t{-1}; };
  const MorphCost none = morphCost(in, {2, 1}, {0, 2, 4}, 0.5);
  EXPECT_FALSE(none.feasible);
  EXPECT_TRUE(std::isinf(none.total_seconds));
  EXPECT_FALSE(morphPays(none, 100.0, 0.97));
  in.checkpoint_step = nullptr;
  EXPECT_FALSE(morphCost(in, {2, 1}, {0, 2, 4}, 0.5).feasible);
}

}  // namespace
}  // namespace morph
