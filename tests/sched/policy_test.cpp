// Cluster policies (sched/policy.h) on hand-made situations with known
// answers, and the invariants every policy keeps on random ones.
#include "sched/policy.h"

#include <gtest/gtest.h>

#include <random>

#include "core/error.h"

namespace morph::sched {
namespace {

JobState job(int64_t id, int priority, int demand, double arrival, double remaining = 100, int allocated = 0,
             const Speed* speed = nullptr) {
  JobState j;
  j.id = id;
  j.priority = priority;
  j.demand = demand;
  j.arrival = arrival;
  j.remaining_steps = remaining;
  j.allocated = allocated;
  j.speed = speed;
  return j;
}

std::vector<int> run(const std::string& policy, const ClusterView& v, PolicyOptions o = {}) {
  return makePolicy(policy, o)->allocate(v);
}

// VirtualFlow's example: A demands 2, B demands 8, 8 slots.
TEST(ClusterPolicy, VirtualFlowExampleFifoIdlesElasticRunsBoth) {
  ClusterView v;
  v.slots = 8;
  v.jobs = {job(0, 1, 2, 0.0), job(1, 1, 8, 1.0)};
  EXPECT_EQ(run("fifo", v), (std::vector<int>{2, 0}));   // 6 slots idle
  EXPECT_EQ(run("wfs", v), (std::vector<int>{2, 4}));    // shares 2 and 6; 6 rounds to 4
  EXPECT_EQ(run("morph", v), (std::vector<int>{2, 6}));  // any integer: nothing idle
  // The same once A runs: fifo still leaves B waiting.
  v.jobs[0].allocated = 2;
  EXPECT_EQ(run("fifo", v), (std::vector<int>{2, 0}));
  EXPECT_EQ(run("wfs", v), (std::vector<int>{2, 4}));
  EXPECT_EQ(run("morph", v), (std::vector<int>{2, 6}));
}

TEST(ClusterPolicy, FifoBlocksBehindAJobThatDoesNotFit) {
  ClusterView v;
  v.slots = 8;
  v.jobs = {job(0, 1, 6, 0.0, 100, 6), job(1, 10, 4, 2.0), job(2, 1, 1, 1.0)};
  // The priority-10 job waits for 4 slots; the small one may not overtake it.
  EXPECT_EQ(run("fifo", v), (std::vector<int>{6, 0, 0}));
  v.jobs[0].allocated = 0;  // once the big one is gone (queued again here): priority order
  v.jobs[0].demand = 3;
  EXPECT_EQ(run("fifo", v), (std::vector<int>{3, 4, 1}));
}

TEST(ClusterPolicy, WfsWaterFillsByPriorityThenPowersOfTwoThenLeftoverByPriority) {
  ClusterView v;
  v.slots = 8;
  v.jobs = {job(0, 10, 8, 0.0), job(1, 5, 8, 1.0), job(2, 1, 8, 2.0)};
  const std::vector<double> share = waterFill(v);
  ASSERT_EQ(share.size(), 3u);
  EXPECT_DOUBLE_EQ(share[0], 5.0);
  EXPECT_DOUBLE_EQ(share[1], 2.5);
  EXPECT_DOUBLE_EQ(share[2], 0.5);
  // 5 -> 4, 2.5 -> 2, 0.5 -> 0; the 2 left over cannot double the first
  // job (4 more) but double the second.
  EXPECT_EQ(run("wfs", v), (std::vector<int>{4, 4, 0}));

  // A demand below the share caps it and the rest is filled again.
  v.jobs = {job(0, 10, 1, 0.0), job(1, 1, 8, 1.0), job(2, 1, 8, 2.0)};
  EXPECT_EQ(waterFill(v), (std::vector<double>{1.0, 3.5, 3.5}));
  EXPECT_EQ(run("wfs", v), (std::vector<int>{1, 4, 2}));  // 3.5 -> 2 each; 3 left: the earlier grows to 4
}

TEST(ClusterPolicy, ElasticPoliciesNeverSuspendARunningJob) {
  ClusterView v;
  v.slots = 4;
  for (int i = 0; i < 4; ++i) v.jobs.push_back(job(i, 1, 4, i, 100, 1));
  v.jobs.push_back(job(9, 10, 4, 10.0));  // a high-priority arrival finds every slot taken
  EXPECT_EQ(run("wfs", v), (std::vector<int>{1, 1, 1, 1, 0}));
  EXPECT_EQ(run("morph", v), (std::vector<int>{1, 1, 1, 1, 0}));
  const std::vector<double> share = waterFill(v);
  for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(share[i], 1.0);
}

TEST(ClusterPolicy, MorphGivesSlotsWhereTheySpeedUpMost) {
  // Same priority and work left; S scales poorly, L linearly.
  const Speed s({{1, 1.0}, {2, 0.6}, {4, 0.45}});
  const Speed l({{1, 1.0}, {2, 0.5}, {4, 0.25}});
  ClusterView v;
  v.slots = 4;
  v.jobs = {job(0, 1, 4, 0.0, 100, 0, &s), job(1, 1, 4, 1.0, 100, 0, &l)};
  EXPECT_EQ(run("morph", v), (std::vector<int>{1, 3}));
  EXPECT_EQ(run("wfs", v), (std::vector<int>{2, 2}));  // wfs assumes both linear
}

TEST(ClusterPolicy, MorphWeighsPriorityAndWorkLeft) {
  // A job's weight is priority / steps left squared (docs/cluster.md, "morph").
  ClusterView v;
  v.slots = 4;
  v.jobs = {job(0, 1, 4, 0.0), job(1, 4, 4, 1.0)};
  EXPECT_EQ(run("morph", v), (std::vector<int>{0, 4}));
  // Half the work left balances four times lower priority; the tie goes to
  // priority order.
  v.jobs[0].remaining_steps = 50;
  EXPECT_EQ(run("morph", v), (std::vector<int>{0, 4}));
  v.jobs[0].remaining_steps = 40;  // now the low-priority job is nearer its end
  EXPECT_EQ(run("morph", v), (std::vector<int>{4, 0}));
}

TEST(ClusterPolicy, MorphStartsALongNarrowJobEarly) {
  // 8 slots; L demands 2 (linear: r steps take r / 2 s on 2 slots); six
  // short jobs demand 8 with 100 steps each (12.5 s on 8, 100
  // slot-seconds). The work left is r + 600 slot-seconds, (r + 600) / 8 s
  // over the slots; L is critical when r / 2 >= 0.8 of that, r >= 150:
  // served last it would run alone on 2 slots with 6 idle, so it gets its 2
  // first and the nearest short job the other 6.
  ClusterView v;
  v.slots = 8;
  v.jobs = {job(0, 1, 2, 0.0, 1000)};
  for (int i = 1; i <= 6; ++i) v.jobs.push_back(job(i, 1, 8, double(i)));
  const std::vector<int> early{2, 6, 0, 0, 0, 0, 0}, last{0, 8, 0, 0, 0, 0, 0};
  EXPECT_EQ(run("morph", v), early);
  v.jobs[0].remaining_steps = 200;
  EXPECT_EQ(run("morph", v), early);
  // Not critical at 120 steps (60 s < 0.8 x 90 s): shortest first, L waits.
  v.jobs[0].remaining_steps = 120;
  EXPECT_EQ(run("morph", v), last);
  // A long job that fills the cluster alone idles nothing when served
  // last: shortest first as before (3000 steps: 375 s on 8, past 0.8 x 450 s).
  v.jobs[0].remaining_steps = 3000;
  v.jobs[0].demand = 8;
  EXPECT_EQ(run("morph", v), last);
}

TEST(ClusterPolicy, MorphGrowsOnlyWhenTheGainPaysForTheResize) {
  ClusterView v;
  v.slots = 4;
  // A runs on 2 of 4 slots with 1000 steps left at 2 steps/s (500 s to go).
  v.jobs = {job(0, 1, 4, 0.0, 1000, 2)};
  EXPECT_EQ(run("morph", v, PolicyOptions{0.6}), (std::vector<int>{4}));
  // A resize that costs more than half the horizon: 4 * (500 - 400) < 2 * 500.
  EXPECT_EQ(run("morph", v, PolicyOptions{400}), (std::vector<int>{2}));
  // Starting a queued job costs no resize: it is started whatever the cost.
  v.jobs.push_back(job(1, 1, 2, 1.0, 10));
  EXPECT_EQ(run("morph", v, PolicyOptions{400}), (std::vector<int>{2, 2}));
}

TEST(ClusterPolicy, SpeedInterpolatesTheRateAndRejectsBadTables) {
  const Speed s({{1, 2.0}, {4, 0.5}});
  EXPECT_DOUBLE_EQ(s.stepsPerSecond(0), 0.0);
  EXPECT_DOUBLE_EQ(s.stepsPerSecond(1), 0.5);
  EXPECT_DOUBLE_EQ(s.stepsPerSecond(2), 1.0);
  EXPECT_DOUBLE_EQ(s.stepsPerSecond(4), 2.0);
  EXPECT_DOUBLE_EQ(s.stepsPerSecond(8), 2.0);  // nothing measured above 4: no gain assumed
  const Speed only2({{2, 1.0}});
  EXPECT_DOUBLE_EQ(only2.stepsPerSecond(1), 0.5);
  EXPECT_THROW(Speed(std::map<int, double>{}), InputError);
  EXPECT_THROW(Speed({{0, 1.0}}), InputError);
  EXPECT_THROW(Speed({{1, -1.0}}), InputError);
  EXPECT_THROW(Speed({{1, std::nan("")}}), InputError);
}

// Slot types (a resources file's device types). Each job's rate on an
// allocation: its table's rate on the slot count over the largest slowdown
// among its slots (even VN shares: the slowest device bounds the step),
// unless its speed lists that allocation (the planner's).
SlotType slotType(const std::string& name, double slowdown, int count) {
  SlotType t;
  t.name = name;
  t.slowdown = slowdown;
  t.count = count;
  return t;
}

// Both listing orders of 2 fast (slowdown 1) and 2 slow (slowdown 2) slots,
// so that a placement that ignores the types cannot pass by the order.
std::vector<std::vector<SlotType>> fastAndSlow(int fast, int slow) {
  return {{slotType("fast", 1, fast), slotType("slow", 2, slow)}, {slotType("slow", 2, slow), slotType("fast", 1, fast)}};
}

// Slots per type in the order fast, slow, whatever the view's order.
std::vector<std::vector<int>> fastSlow(const ClusterView& v, const TypedTargets& a) {
  std::vector<std::vector<int>> out;
  const bool fast_first = v.types[0].name == "fast";
  for (const auto& x : a) out.push_back(fast_first ? x : std::vector<int>{x[1], x[0]});
  return out;
}

TypedTargets runTyped(const std::string& policy, const ClusterView& v, PolicyOptions o = {}) {
  return makePolicy(policy, o)->allocateTyped(v);
}

// A (priority 10) and B (priority 1), both linear, demand 2, 100 steps
// left; 2 fast + 2 slow slots. Progress (priority x steps/s / steps left):
//   A fast-fast, B slow-slow: 10 x 2/100 + 1 x 1/100 = 0.21
//   A fast-slow, B fast-slow: 10 x 1/100 + 1 x 1/100 = 0.11
//   A slow-slow, B fast-fast: 10 x 1/100 + 1 x 2/100 = 0.12
TEST(ClusterPolicyTypes, MorphGivesTheFastSlotsToTheHigherPriority) {
  for (const auto& types : fastAndSlow(2, 2)) {
    ClusterView v;
    v.slots = 4;
    v.types = types;
    v.jobs = {job(0, 10, 2, 0.0), job(1, 1, 2, 1.0)};
    EXPECT_EQ(fastSlow(v, runTyped("morph", v)), (std::vector<std::vector<int>>{{2, 0}, {0, 2}}))
        << "types listed " << types[0].name << " first";
    EXPECT_EQ(run("morph", v), (std::vector<int>{2, 2}));
  }
  // fifo and wfs know no types: they place in listing order, so with the
  // slow slots listed first the priority-10 job gets them.
  ClusterView v;
  v.slots = 4;
  v.types = fastAndSlow(2, 2)[1];
  v.jobs = {job(0, 10, 2, 0.0), job(1, 1, 2, 1.0)};
  EXPECT_EQ(fastSlow(v, runTyped("fifo", v)), (std::vector<std::vector<int>>{{0, 2}, {2, 0}}));
  EXPECT_EQ(fastSlow(v, runTyped("wfs", v)), (std::vector<std::vector<int>>{{0, 2}, {2, 0}}));
}

// Equal priority and work left; A scales poorly (1.2x on 2 workers), B
// linearly, both demand 2; 2 fast + 2 slow slots. Steps/s, summed:
//   A slow-slow 1.2/2 = 0.6, B fast-fast 2    -> 2.6 (the answer)
//   A fast-fast 1.2,         B slow-slow 2/2  -> 2.2
//   A fast,                  B fast (slow idle) -> 2.0 (greedy on one slot at a time stops here)
//   A fast-slow 1.2/2,       B fast-slow 2/2  -> 1.6
TEST(ClusterPolicyTypes, MorphPutsTheJobThatScalesOnTheFastSlots) {
  const Speed a({{1, 1.0}, {2, 1.0 / 1.2}});
  for (const auto& types : fastAndSlow(2, 2)) {
    ClusterView v;
    v.slots = 4;
    v.types = types;
    v.jobs = {job(0, 1, 2, 0.0, 100, 0, &a), job(1, 1, 2, 1.0)};
    EXPECT_EQ(fastSlow(v, runTyped("morph", v)), (std::vector<std::vector<int>>{{0, 2}, {2, 0}}))
        << "types listed " << types[0].name << " first";
  }
}

// One linear job of demand 3 on 2 fast + 1 slow: fast-fast gives 2 steps/s,
// fast-fast-slow 3/2 = 1.5: the slow slot would slow it down, so it stays
// free, and a second (queued, lower-priority) job gets it.
TEST(ClusterPolicyTypes, MorphKeepsASlowSlotOffAJobItWouldSlowDown) {
  for (const auto& types : fastAndSlow(2, 1)) {
    ClusterView v;
    v.slots = 3;
    v.types = types;
    v.jobs = {job(0, 10, 3, 0.0)};
    EXPECT_EQ(fastSlow(v, runTyped("morph", v)), (std::vector<std::vector<int>>{{2, 0}}));
    v.jobs.push_back(job(1, 1, 1, 1.0));
    EXPECT_EQ(fastSlow(v, runTyped("morph", v)), (std::vector<std::vector<int>>{{2, 0}, {0, 1}}));
  }
}

// A speed that lists an allocation (the planner's, with VN shares weighted
// by speed) overrides the slowest-device rule: on 1 fast + 1 slow a step
// takes 0.6 s instead of 1 s, so the job takes both slots; without that
// entry both slots run as slowly as one fast one and the tie goes to
// fewer slots.
TEST(ClusterPolicyTypes, APlannedTableByTypeOverridesTheSlowestDeviceRule) {
  const Speed plain({{1, 1.0}, {2, 0.5}});
  const Speed planned({{1, 1.0}, {2, 0.5}}, {{{1, 1}, 0.6}});
  const std::vector<SlotType> types{slotType("fast", 1, 1), slotType("slow", 2, 1)};
  EXPECT_DOUBLE_EQ(plain.stepsPerSecond({1, 1}, types), 1.0);
  EXPECT_DOUBLE_EQ(planned.stepsPerSecond({1, 1}, types), 1.0 / 0.6);
  EXPECT_DOUBLE_EQ(planned.stepsPerSecond({0, 1}, types), 0.5);  // not listed: the rule
  ClusterView v;
  v.slots = 2;
  v.types = types;
  v.jobs = {job(0, 1, 2, 0.0, 100, 0, &plain)};
  EXPECT_EQ(runTyped("morph", v), (TypedTargets{{1, 0}}));
  v.jobs = {job(0, 1, 2, 0.0, 100, 0, &planned)};
  EXPECT_EQ(runTyped("morph", v), (TypedTargets{{1, 1}}));
  EXPECT_THROW(Speed({{1, 1.0}}, {{{0, 0}, 1.0}}), InputError);
  EXPECT_THROW(Speed({{1, 1.0}}, {{{1, 0}, -1.0}}), InputError);
}

// A running job on the 2 slow slots while 2 fast ones are free: moving to
// them is a resize (a pause), made only when the gain pays for it.
TEST(ClusterPolicyTypes, MorphMovesToFasterSlotsOnlyWhenTheGainPaysForTheResize) {
  ClusterView v;
  v.slots = 4;
  v.types = fastAndSlow(2, 2)[0];
  // 1000 steps left at 1 step/s on slow-slow: 1000 s to go.
  JobState j = job(0, 1, 2, 0.0, 1000, 2);
  j.held = {0, 2};
  v.jobs = {j};
  EXPECT_EQ(runTyped("morph", v, PolicyOptions{0.6}), (TypedTargets{{2, 0}}));
  EXPECT_EQ(runTyped("morph", v, PolicyOptions{600}), (TypedTargets{{0, 2}}));  // 2 x 400 < 1 x 1000
}

// Random typed situations: every policy's targets by type sum to its
// totals, stay within each type's count and the demands, and never
// suspend a running job.
TEST(ClusterPolicyTypes, InvariantsOnRandomTypedSituations) {
  std::mt19937_64 rng(291);
  const int prios[] = {1, 5, 10};
  std::vector<Speed> speeds;
  for (int i = 0; i < 8; ++i) {
    std::map<int, double> t;
    const double f = std::uniform_real_distribution<double>(0, 0.3)(rng);
    for (int k = 1; k <= 12; ++k) t[k] = f + (1 - f) / k;
    speeds.emplace_back(t);
  }
  for (int round = 0; round < 300; ++round) {
    ClusterView v;
    const int nt = std::uniform_int_distribution<int>(1, 3)(rng);
    for (int t = 0; t < nt; ++t) {
      v.types.push_back(slotType("t" + std::to_string(t), 1 + double(rng() % 4),
                                 std::uniform_int_distribution<int>(round % 7 == 0 ? 20 : 1, round % 7 == 0 ? 40 : 5)(rng)));
      v.slots += v.types.back().count;
    }
    std::vector<int> free;
    for (const auto& t : v.types) free.push_back(t.count);
    const int n = std::uniform_int_distribution<int>(1, 8)(rng);
    for (int i = 0; i < n; ++i) {
      JobState j = job(i, prios[rng() % 3], std::uniform_int_distribution<int>(1, std::min(v.slots, 12))(rng),
                       double(rng() % 100), 1 + double(rng() % 1000), 0, &speeds[rng() % speeds.size()]);
      j.held.assign(size_t(nt), 0);
      if (rng() % 2)
        for (int t = 0; t < nt; ++t) {
          const int take = std::min(free[size_t(t)], int(rng() % 3));
          if (j.allocated + take > j.demand) break;
          j.held[size_t(t)] += take;
          j.allocated += take;
          free[size_t(t)] -= take;
        }
      v.jobs.push_back(j);
    }
    for (const auto& name : policyNames()) {
      const TypedTargets a = runTyped(name, v);
      const std::vector<int> totals = run(name, v);
      ASSERT_EQ(a.size(), v.jobs.size());
      std::vector<int> used(size_t(nt), 0);
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_EQ(a[i].size(), size_t(nt));
        int sum = 0;
        for (int t = 0; t < nt; ++t) {
          EXPECT_GE(a[i][size_t(t)], 0);
          used[size_t(t)] += a[i][size_t(t)];
          sum += a[i][size_t(t)];
        }
        EXPECT_EQ(sum, totals[i]) << name;
        EXPECT_LE(sum, v.jobs[i].demand) << name;
        if (v.jobs[i].allocated > 0) {
          EXPECT_GT(sum, 0) << name << " suspended job " << i;
        }
      }
      for (int t = 0; t < nt; ++t) EXPECT_LE(used[size_t(t)], v.types[size_t(t)].count) << name;
    }
  }
}

TEST(ClusterPolicy, UnknownPolicyNamesTheChoices) {
  try {
    makePolicy("lifo");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("'lifo'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("fifo, wfs or morph"), std::string::npos);
  }
}

// Random situations: every policy stays within the slots and demands, never
// suspends a running job; fifo never resizes; wfs's shares below a demand
// are powers of two.
TEST(ClusterPolicy, InvariantsOnRandomSituations) {
  std::mt19937_64 rng(29);
  const int prios[] = {1, 5, 10};
  std::vector<Speed> speeds;
  for (int i = 0; i < 16; ++i) {
    std::map<int, double> t;
    const double f = std::uniform_real_distribution<double>(0, 0.3)(rng);
    for (int k = 1; k <= 16; ++k) t[k] = f + (1 - f) / k;
    speeds.emplace_back(t);
  }
  for (int round = 0; round < 500; ++round) {
    ClusterView v;
    v.slots = std::uniform_int_distribution<int>(1, 16)(rng);
    int free = v.slots;
    const int n = std::uniform_int_distribution<int>(1, 10)(rng);
    for (int i = 0; i < n; ++i) {
      JobState j = job(i, prios[rng() % 3], std::uniform_int_distribution<int>(1, v.slots)(rng), double(rng() % 100),
                       1 + double(rng() % 1000), 0, &speeds[rng() % speeds.size()]);
      if (free > 0 && rng() % 2) {
        j.allocated = std::uniform_int_distribution<int>(1, std::min(free, j.demand))(rng);
        free -= j.allocated;
      }
      v.jobs.push_back(j);
    }
    for (const auto& name : policyNames()) {
      const std::vector<int> a = run(name, v);
      ASSERT_EQ(a.size(), v.jobs.size());
      int sum = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        sum += a[i];
        EXPECT_GE(a[i], 0);
        EXPECT_LE(a[i], v.jobs[i].demand) << name;
        if (v.jobs[i].allocated > 0) {
          EXPECT_GT(a[i], 0) << name << " suspended job " << i;
        }
        if (name == "fifo") {
          if (v.jobs[i].allocated > 0) {
            EXPECT_EQ(a[i], v.jobs[i].allocated);
          } else {
            EXPECT_TRUE(a[i] == 0 || a[i] == v.jobs[i].demand);
          }
        }
        if (name == "wfs" && a[i] < v.jobs[i].demand) {
          EXPECT_EQ(a[i] & (a[i] - 1), 0) << a[i];
        }
      }
      EXPECT_LE(sum, v.slots) << name;
    }
  }
}

}  // namespace
}  // namespace morph::sched
