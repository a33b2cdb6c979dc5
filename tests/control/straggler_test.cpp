#include "control/straggler.h"

#include <gtest/gtest.h>

namespace morph {
namespace {

// Feeds `steps` steps of the same seconds per VN; returns the first event.
std::optional<StragglerEvent> feed(StragglerWatch& w, const std::vector<double>& sec, int steps) {
  for (int i = 0; i < steps; ++i)
    if (auto e = w.observe(sec)) return e;
  return std::nullopt;
}

TEST(StragglerWatch, FlagsAWorkerSlowForTheWindowAndSharesByMeasuredSpeed) {
  StragglerWatch w({1.5, 5, true});
  w.newGeneration({0, 1, 2}, {4, 4, 4}, {});
  EXPECT_FALSE(feed(w, {1e-3, 1e-3, 1e-3}, 20));  // steady: nothing
  // Worker 1 becomes 4x slower: every step's own figure is off by more than
  // 1.5x, so the fifth step in a row reports it, not earlier.
  EXPECT_FALSE(feed(w, {1e-3, 4e-3, 1e-3}, 4));
  auto e = w.observe({1e-3, 4e-3, 1e-3});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->worker, 1);
  EXPECT_NEAR(e->ratio, 4.0, 1e-9);  // the median of its last 5 figures
  EXPECT_TRUE(e->changes);
  // 12 VNs on speeds 1, ~4, 1: each VN to whoever finishes it first; one VN
  // for the slow worker keeps the step at 6 units, as dropping it would,
  // so it stays (dropping only when strictly faster).
  EXPECT_FALSE(e->drop);
  EXPECT_EQ(e->shares, (std::vector<int64_t>{6, 1, 5}));
  EXPECT_NEAR(e->predicted_now, 4 * e->seconds_per_vn, 1e-12);
  EXPECT_NEAR(e->predicted_after, 6e-3, 1e-4);
  // Accepted: its measured speed is now the expected one; no repeat.
  w.accept(*e);
  EXPECT_FALSE(feed(w, {1e-3, 4e-3, 1e-3}, 20));
  // Not engaged: the manager's own shares apply.
  EXPECT_FALSE(w.shares({0, 1, 2}, 12));
  w.engage();
  EXPECT_EQ(*w.shares({0, 1, 2}, 12), (std::vector<int64_t>{6, 1, 5}));
}

TEST(StragglerWatch, IsolatedHiccupsNeverFlagAndOneNoisyStepDelaysAFlagByTwo) {
  StragglerWatch w({2.0, 4, true});
  w.newGeneration({0, 1, 2}, {4, 4, 4}, {});
  EXPECT_FALSE(feed(w, {1e-3, 1e-3, 1e-3}, 10));
  // Worker 1 hiccups at every other step: each slow step is taken back by
  // the next one, so 40 steps make no flag.
  for (int i = 0; i < 40; ++i) EXPECT_FALSE(w.observe({1e-3, i % 2 ? 1e-3 : 4e-3, 1e-3})) << i;
  // Now it is 4x slower for good. After 3 slow steps, worker 2 spikes for
  // one step: that step's median rises to 2.5e-3 and worker 1's figure is
  // within 2x of it (the step counts as not slow: 3 -> 2). Two more slow
  // steps reach 4, where restarting the count would need four.
  EXPECT_FALSE(feed(w, {1e-3, 4e-3, 1e-3}, 3));
  EXPECT_FALSE(w.observe({1e-3, 4e-3, 2.5e-3}));
  EXPECT_FALSE(w.observe({1e-3, 4e-3, 1e-3}));
  auto e = w.observe({1e-3, 4e-3, 1e-3});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->worker, 1);
  EXPECT_GT(e->ratio, 2.0);
  EXPECT_TRUE(e->changes);
}

TEST(StragglerWatch, DropsAWorkerWhenTheStepIsFasterWithoutIt) {
  // 4 VNs on 3 workers, one 10x slower: every worker needs a VN when kept
  // (2 units for the fast ones, 10 for it); without it 2 + 2 = 2 units.
  StragglerWatch w({1.5, 3, true});
  w.newGeneration({5, 6, 7}, {2, 1, 1}, {});
  feed(w, {1e-3, 1e-3, 1e-3}, 3);
  auto e = feed(w, {1e-3, 1e-3, 1e-2}, 10);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->worker, 7);
  EXPECT_TRUE(e->drop);
  EXPECT_EQ(e->members, (std::vector<int64_t>{5, 6}));
  EXPECT_EQ(e->shares, (std::vector<int64_t>{2, 2}));
  EXPECT_NEAR(e->predicted_after, 2e-3, 1e-12);
  // The manager releases the dropped worker: last among the candidates.
  w.drop(7);
  std::vector<int64_t> cand = {7, 5, 6};
  w.orderForDrop(cand);
  EXPECT_EQ(cand, (std::vector<int64_t>{5, 6, 7}));
}

TEST(StragglerWatch, ARecoveredWorkerIsFlaggedAsFasterAndGetsItsShareBack) {
  StragglerWatch w({1.5, 2, true});
  w.newGeneration({0, 1}, {3, 3}, {});
  feed(w, {1e-3, 1e-3}, 2);
  auto e = feed(w, {1e-3, 3e-3}, 5);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->shares, (std::vector<int64_t>{5, 1}));
  w.accept(*e);
  w.engage();
  w.newGeneration({0, 1}, e->shares, {});
  e = feed(w, {1e-3, 1e-3}, 5);  // back to full speed
  ASSERT_TRUE(e);
  EXPECT_EQ(e->worker, 1);
  EXPECT_LT(e->ratio, 0.5);
  EXPECT_EQ(e->shares, (std::vector<int64_t>{3, 3}));
}

TEST(StragglerWatch, ExpectsADeviceTypesSlowdownAndSkipsEachGenerationsFirstStep) {
  StragglerWatch w({1.5, 1, true});
  // Worker 1 is a device twice as slow (resources file): 2x is expected.
  w.newGeneration({0, 1}, {2, 2}, {1.0, 2.0});
  EXPECT_FALSE(w.observe({1e-3, 9e-3}));  // the generation's first step: not counted
  EXPECT_FALSE(feed(w, {1e-3, 2e-3}, 10));
  auto e = w.observe({1e-3, 8e-3});
  ASSERT_TRUE(e);
  EXPECT_NEAR(e->ratio, 4.0, 1e-9);
  EXPECT_NEAR(e->expected_seconds, 2e-3, 1e-12);
  // Unknown figures (0) and a lone worker never flag anything.
  StragglerWatch lone({1.5, 1, true});
  lone.newGeneration({3}, {4}, {});
  EXPECT_FALSE(feed(lone, {1.0}, 5));
  StragglerWatch gaps({1.5, 1, true});
  gaps.newGeneration({0, 1}, {2, 2}, {});
  EXPECT_FALSE(feed(gaps, {1e-3, 0.0}, 5));
}

TEST(StragglerWatch, KeepsThePlanWhenNoShareWouldChange) {
  // 3 VNs on 3 workers: each keeps its one VN, and the step is no faster
  // without the slow one (2 units either way), so nothing changes.
  StragglerWatch w({1.5, 2, true});
  w.newGeneration({0, 1, 2}, {1, 1, 1}, {});
  auto e = feed(w, {1e-3, 2e-3, 1e-3}, 4);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->worker, 1);
  EXPECT_FALSE(e->drop);
  EXPECT_FALSE(e->changes);
}

TEST(PipelineStragglerWatch, ASlowStageWorkerGivesItsReplicaFewerVns) {
  // 2 stages x 2 replicas, ranks 0..3 = workers 10, 11, 12, 13 (rank =
  // replica * 2 + stage); 8 VNs, 4 per replica. Stage 1 costs 2 ms per VN.
  PipelineStragglerWatch w({1.5, 3, true});
  w.newGeneration({10, 11, 12, 13}, 2, {0, 2, 4}, {4, 4});
  auto feedP = [&](const std::vector<double>& sec, int steps) -> std::optional<StragglerEvent> {
    for (int i = 0; i < steps; ++i)
      if (auto e = w.observe(sec)) return e;
    return std::nullopt;
  };
  // Stages differ in cost, but each matches its peer: nothing.
  EXPECT_FALSE(feedP({1e-3, 2e-3, 1e-3, 2e-3}, 10));
  // Worker 13 (stage 1 of replica 1) becomes 4x slower: flagged after 3 steps.
  auto e = feedP({1e-3, 2e-3, 1e-3, 8e-3}, 3);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->worker, 13);
  EXPECT_TRUE(e->by_replica);
  EXPECT_FALSE(e->drop);
  ASSERT_EQ(e->shares.size(), 2u);
  EXPECT_EQ(e->shares[0] + e->shares[1], 8);
  EXPECT_GT(e->shares[0], e->shares[1]);
  EXPECT_TRUE(e->changes);
  EXPECT_LT(e->predicted_after, e->predicted_now);
  // Before engage(), a new generation keeps its own shares; after, the
  // measured speeds decide, for whatever replica the workers end up in.
  EXPECT_FALSE(w.shares({10, 11, 12, 13}, 2, 8));
  w.accept(*e);
  w.engage();
  auto sh = w.shares({12, 13, 10, 11}, 2, 8);
  ASSERT_TRUE(sh);
  EXPECT_LT((*sh)[0], (*sh)[1]);
  // A lone replica has no peers: nothing is ever flagged.
  PipelineStragglerWatch lone({1.5, 1, true});
  lone.newGeneration({1, 2}, 2, {0, 1, 2}, {8});
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(lone.observe({1e-3, i > 1 ? 9e-3 : 1e-3}));
}

}  // namespace
}  // namespace morph
