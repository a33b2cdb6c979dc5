// A cut per virtual worker (issue 30, HetPipe): each group's own cut
// against brute force, the shared cut against brute force, the blocks a
// layer's gradient is summed in, and the planner's comparison on a pool
// where a cut per group wins by a figure computed by hand.
#include "plan/group_cut.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <random>

#include "core/error.h"
#include "hand_profiles.h"
#include "plan/planner.h"
#include "plan/resources.h"
#include "plan/simulator.h"

namespace morph {
namespace {

// Every cut of L layers into P non-empty stages.
void everyCut(size_t L, size_t P, const std::function<void(const std::vector<size_t>&)>& f) {
  std::vector<size_t> cuts{0};
  std::function<void()> go = [&] {
    if (cuts.size() == P) {
      cuts.push_back(L);
      f(cuts);
      cuts.pop_back();
      return;
    }
    for (size_t j = cuts.back() + 1; j + (P - cuts.size()) <= L; ++j) {
      cuts.push_back(j);
      go();
      cuts.pop_back();
    }
  };
  go();
}

TEST(GroupCut, EachGroupsCutAndTheSharedCutMatchBruteForce) {
  std::mt19937 rng(30);
  std::uniform_real_distribution<double> u(0.5, 3.0);
  int differ = 0, trials = 0, no_shared = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const size_t L = 2 + static_cast<size_t>(trial % 6);
    const size_t P = 2 + static_cast<size_t>(trial % 3);
    if (P > L) continue;
    ++trials;
    const int T = 2 + trial % 2, G = 2 + trial % 3;
    // Per type, its own per-layer costs (types differ layer by layer).
    std::vector<std::vector<double>> cost(static_cast<size_t>(T), std::vector<double>(L));
    for (auto& c : cost)
      for (auto& x : c) x = std::round(u(rng) * 4) / 4;
    std::vector<int64_t> bytes(L), caps(static_cast<size_t>(T));
    for (auto& b : bytes) b = static_cast<int64_t>(u(rng) * 100);
    for (auto& c : caps) c = trial % 4 == 0 ? static_cast<int64_t>(u(rng) * 250) : 0;
    DeviceStageFns fns{[&](size_t i, size_t j, int t) {
                         double c = 0;
                         for (size_t l = i; l < j; ++l) c += cost[static_cast<size_t>(t)][l];
                         return c;
                       },
                       [&](size_t i, size_t j, int r) {
                         int64_t b = 10 * r;
                         for (size_t l = i; l < j; ++l) b += bytes[l];
                         return b;
                       },
                       caps, nullptr};
    std::vector<std::vector<int>> groups(static_cast<size_t>(G));
    for (auto& g : groups)
      for (size_t k = 0; k < P; ++k) g.push_back(static_cast<int>(rng() % static_cast<unsigned>(T)));
    // A stage's time on the k-th device of a group; nullopt: over its cap.
    auto stage = [&](const std::vector<size_t>& c, size_t k, int t) -> std::optional<double> {
      const int64_t cap = caps[static_cast<size_t>(t)];
      if (cap > 0 && fns.bytes(c[k], c[k + 1], static_cast<int>(P - k)) > cap) return std::nullopt;
      return fns.seconds(c[k], c[k + 1], t);
    };
    const auto got = perGroupPipelines(L, groups, fns);
    ASSERT_EQ(got.size(), groups.size());
    std::vector<size_t> first_cut;
    bool cuts_differ = false;
    for (size_t d = 0; d < groups.size(); ++d) {
      // Every order of the group's devices and every cut.
      double best = 1e30;
      std::vector<int> order = groups[d];
      std::sort(order.begin(), order.end());
      do {
        everyCut(L, P, [&](const std::vector<size_t>& c) {
          double m = 0;
          for (size_t k = 0; k < P; ++k) {
            const auto s = stage(c, k, order[k]);
            if (!s) return;
            m = std::max(m, *s);
          }
          best = std::min(best, m);
        });
      } while (std::next_permutation(order.begin(), order.end()));
      if (best >= 1e30) {
        EXPECT_FALSE(got[d].has_value()) << "trial " << trial << " group " << d;
        continue;
      }
      ASSERT_TRUE(got[d].has_value()) << "trial " << trial << " group " << d;
      EXPECT_DOUBLE_EQ(got[d]->cut.bottleneck_s, best) << "trial " << trial << " group " << d;
      // Its order and cut achieve it.
      double m = 0;
      for (size_t k = 0; k < P; ++k) {
        const auto s = stage(got[d]->cut.cuts, k, got[d]->order[k]);
        ASSERT_TRUE(s.has_value());
        m = std::max(m, *s);
      }
      EXPECT_DOUBLE_EQ(m, best);
      if (d == 0) first_cut = got[d]->cut.cuts;
      else cuts_differ = cuts_differ || got[d]->cut.cuts != first_cut;
    }
    differ += cuts_differ;
    // One cut for all groups, each in the order given: every cut tried.
    double shared = 1e30;
    everyCut(L, P, [&](const std::vector<size_t>& c) {
      double m = 0;
      for (const auto& g : groups)
        for (size_t k = 0; k < P; ++k) {
          const auto s = stage(c, k, g[k]);
          if (!s) return;
          m = std::max(m, *s);
        }
      shared = std::min(shared, m);
    });
    const auto sc = sharedCut(L, groups, fns);
    if (shared >= 1e30) {
      EXPECT_FALSE(sc.has_value()) << "trial " << trial;
      ++no_shared;
      continue;
    }
    ASSERT_TRUE(sc.has_value()) << "trial " << trial;
    EXPECT_DOUBLE_EQ(sc->bottleneck_s, shared) << "trial " << trial;
    // A cut per group is never slower than the shared one (each group at
    // its best order at least as good as the one given).
    for (const auto& g : got) {
      if (g) {
        EXPECT_LE(g->cut.bottleneck_s, shared);
      }
    }
  }
  EXPECT_GT(trials, 150);
  EXPECT_GT(differ, 30);  // the groups' own cuts differ often: the comparison is not empty
  EXPECT_GT(no_shared, 0);
}

TEST(GroupCut, ReduceBlocksAreTheCommonRefinement) {
  // Group 0 cut 2|2, group 1 cut 1|3: layer 0 is on stage 0 of both,
  // layer 1 on stage 0 of group 0 and stage 1 of group 1, layers 2-3 on
  // stage 1 of both.
  const auto b = reduceBlocks({{0, 2, 4}, {0, 1, 4}});
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].first, 0u);
  EXPECT_EQ(b[0].end, 1u);
  EXPECT_EQ(b[0].stage, (std::vector<int>{0, 0}));
  EXPECT_EQ(b[1].first, 1u);
  EXPECT_EQ(b[1].end, 2u);
  EXPECT_EQ(b[1].stage, (std::vector<int>{0, 1}));
  EXPECT_EQ(b[2].first, 2u);
  EXPECT_EQ(b[2].end, 4u);
  EXPECT_EQ(b[2].stage, (std::vector<int>{1, 1}));
  // The same cut everywhere: one block per stage.
  EXPECT_EQ(reduceBlocks({{0, 3, 5, 9}, {0, 3, 5, 9}}).size(), 3u);
  EXPECT_THROW(reduceBlocks({{0, 2, 4}, {0, 1, 2, 4}}), InputError);
}

// Layer l takes totals[l] per VN (forward t/3, backward 2t/3).
Profile totalsProfile(const std::vector<double>& totals) {
  return handProfile(totals.size(), [&](size_t l, LayerCost& c) {
    c.forward_s = c.forward_nograd_s = c.recompute_s = totals[l] / 3;
    c.backward_s = 2 * totals[l] / 3;
  });
}

// The simulator: a plan whose groups all run the same cut predicts what the
// shared cut does.
TEST(GroupCut, TheSameCutPerGroupSimulatesAsTheSharedCut) {
  Profile p = totalsProfile({1, 2, 1, 3, 1});
  p.allreduce_exact[2] = LinearFit{1e-3, 1e-6, {}};
  p.allreduce_max[2] = LinearFit{1e-4, 0, {}};
  p.optimizer_s_per_param = 1e-4;
  for (ScheduleKind kind : {ScheduleKind::kGpipe, ScheduleKind::k1F1B, ScheduleKind::kVaruna}) {
    PlanSpec shared;
    shared.stages = 3;
    shared.replicas = 2;
    shared.cuts = {0, 2, 4, 5};
    shared.schedule = kind;
    shared.vn_shares = {5, 3};
    shared.slowdown = {1, 1, 1, 2, 1.5, 1};
    PlanSpec same = shared;
    same.group_cuts = {shared.cuts, shared.cuts};
    const SimResult a = simulate(p, shared), b = simulate(p, same);
    EXPECT_NEAR(a.step_seconds, b.step_seconds, 1e-12) << toString(kind);
    EXPECT_NEAR(a.schedule_seconds, b.schedule_seconds, 1e-12) << toString(kind);
    // Another cut for group 1 changes its compute, not group 0's.
    PlanSpec other = same;
    other.group_cuts[1] = {0, 1, 3, 5};
    EXPECT_NE(simulate(p, other).schedule_seconds, a.schedule_seconds) << toString(kind);
  }
}

// Two groups of two devices: type a takes the profile's 1, 1, 1, 1 per
// layer and VN, type b 3, 1, 1, 1 (slow at the first layer). Group [a a]
// is best cut 2|2 (2 per VN on each stage), group [b b] 1|3 (3 on each).
// One cut for both: 2|2 gives [a a] 2 and [b b] 4 (3 + 1 | 1 + 1), 1|3
// gives 3 on both. 10 VNs by speed: the shared 2|2 takes 7 + 3 (14 and 12),
// 1|3 takes 5 + 5 (15); a cut per group takes 6 + 4 (12 and 12).
// Simulated (1F1B, free communication; uniform stages take (M + P - 1)
// (f + b)): per group max(7 x 2, 5 x 3) = 15; shared 2|2 [a a] 8 x 2 = 16
// (and [b b] less: its first stage of 4 per VN, 3 VNs, about 12.7).
TEST(GroupCut, PlannerReportsACutPerGroupBeatingTheSharedCut) {
  const Profile job = totalsProfile({1, 1, 1, 1});
  PlanRequest rq = handRequest(4, 10);
  rq.top_k = 10;
  rq.sim.device_costs = std::make_shared<const std::vector<DeviceCosts>>(
      std::vector<DeviceCosts>{deviceCostsOf(totalsProfile({3, 1, 1, 1}), "b.json")});
  rq.slot_slowdown = {1.0, 1.0, 1.0, 1.0};
  rq.slot_costs = {-1, -1, 0, 0};  // slots 0, 1 of type a, 2, 3 of type b
  rq.slot_host = {0, 0, 1, 1};     // NP: [a a] [b b]
  const PlanOutcome out = planJob(job, rq);
  for (const PlanChoice& c : out.plans) EXPECT_TRUE(c.plan.group_cuts.empty());  // morph run runs shared cuts only
  ASSERT_TRUE(out.group_cuts.has_value());
  const GroupCutComparison& g = *out.group_cuts;
  EXPECT_EQ(g.per_group.plan.stages, 2);
  EXPECT_EQ(g.per_group.plan.workers, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(g.per_group.plan.group_cuts, (std::vector<std::vector<size_t>>{{0, 2, 4}, {0, 1, 4}}));
  EXPECT_EQ(g.per_group.plan.vn_shares, (std::vector<int64_t>{6, 4}));
  EXPECT_NEAR(g.per_group.sim.schedule_seconds, 15.0, 1e-9);
  ASSERT_TRUE(g.shared.has_value());
  EXPECT_EQ(g.shared->plan.cuts, (std::vector<size_t>{0, 2, 4}));
  EXPECT_TRUE(g.shared->plan.group_cuts.empty());
  EXPECT_EQ(g.shared->plan.vn_shares, (std::vector<int64_t>{7, 3}));
  EXPECT_NEAR(g.shared->sim.schedule_seconds, 16.0, 1e-9);
  EXPECT_LT(g.per_group.sim.step_seconds, g.shared->sim.step_seconds);

  // Without the comparison: the same plans, no report.
  PlanRequest off = rq;
  off.compare_group_cuts = false;
  const PlanOutcome plain = planJob(job, off);
  EXPECT_FALSE(plain.group_cuts.has_value());
  ASSERT_EQ(plain.plans.size(), out.plans.size());
  for (size_t i = 0; i < out.plans.size(); ++i) EXPECT_EQ(plain.plans[i].sim.step_seconds, out.plans[i].sim.step_seconds);

  // Alike devices: every group's own cut is the shared one, nothing to report.
  PlanRequest alike = rq;
  alike.sim.device_costs.reset();
  alike.slot_costs.clear();
  EXPECT_FALSE(planJob(job, alike).group_cuts.has_value());
}

}  // namespace
}  // namespace morph
