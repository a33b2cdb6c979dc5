// The live scheduler's slot accounting (planSlotActions, sched/cluster_live.h):
// shrinks first, a shrinking job keeps its slots until the shrink took
// effect, starts and grows in priority order within the free slots.
#include "sched/cluster_live.h"

#include <gtest/gtest.h>

#include <random>

#include "core/error.h"

namespace morph::sched {
namespace {

SlotState queued(int64_t id, int priority, int desired) {
  SlotState s;
  s.id = id;
  s.priority = priority;
  s.desired = desired;
  return s;
}

SlotState running(int64_t id, int priority, int target, int held, int desired, bool ready = true) {
  SlotState s = queued(id, priority, desired);
  s.running = true;
  s.target = target;
  s.held = held;
  s.ready = ready;
  return s;
}

TEST(LivePlan, AShrinkingJobKeepsItsSlotsUntilTheShrinkTookEffect) {
  // j0 runs on 2 of 3 slots; the policy wants it on 1 and j1 on 2.
  std::vector<SlotState> s{running(0, 1, 2, 2, 1), queued(1, 5, 2)};
  auto a = planSlotActions(s, 3);
  ASSERT_EQ(a.size(), 1u);  // the shrink only: j1 would need a slot j0 still holds
  EXPECT_EQ(a[0].kind, SlotAction::kShrink);
  EXPECT_EQ(a[0].job, 0u);
  EXPECT_EQ(a[0].workers, 1);
  // Asked (target 1) but still on 2 workers (held 2), the resize done: still no start.
  s = {running(0, 1, 1, 2, 1), queued(1, 5, 2)};
  EXPECT_TRUE(planSlotActions(s, 3).empty());
  // Its metrics and processes show 1 worker (held 1): j1 starts.
  s = {running(0, 1, 1, 1, 1), queued(1, 5, 2)};
  a = planSlotActions(s, 3);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, SlotAction::kStart);
  EXPECT_EQ(a[0].job, 1u);
  EXPECT_EQ(s[1].held, 2);
}

TEST(LivePlan, StartsAndGrowsGoInPriorityOrderWithinTheFreeSlots) {
  // 4 slots, j0 holds 1 and wants 3; queued j1 (priority 1) and j2 (priority 10) want 2 each.
  std::vector<SlotState> s{running(0, 5, 1, 1, 3), queued(1, 1, 2), queued(2, 10, 2)};
  auto a = planSlotActions(s, 4);
  ASSERT_EQ(a.size(), 1u);  // j2 first (2 of the 3 free), then j0 needs 2 more: no; j1 needs 2: no
  EXPECT_EQ(a[0].kind, SlotAction::kStart);
  EXPECT_EQ(a[0].job, 2u);
  // A queued job that does not fit does not block a smaller one behind it.
  s = {queued(0, 10, 3), queued(1, 1, 1)};
  a = planSlotActions(s, 2);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].job, 1u);
}

TEST(LivePlan, NothingIsAskedOfAJobThatIsNotReady) {
  // Port unknown, or a resize under way: no shrink, no grow; its slots count.
  std::vector<SlotState> s{running(0, 1, 3, 3, 1, false), queued(1, 1, 1)};
  EXPECT_TRUE(planSlotActions(s, 3).empty());
  s = {running(0, 1, 1, 1, 3, false)};
  EXPECT_TRUE(planSlotActions(s, 3).empty());
}

TEST(LivePlan, HeldSlotsNeverExceedTheSlotsOnRandomStates) {
  std::mt19937_64 rng(29);
  for (int round = 0; round < 2000; ++round) {
    const int slots = 1 + int(rng() % 8);
    std::vector<SlotState> s;
    int held = 0;
    for (int i = 0; i < 6; ++i) {
      const int desired = int(rng() % (slots + 1));
      if (rng() % 2 && held < slots) {
        const int target = 1 + int(rng() % (slots - held));
        const int h = target + int(rng() % (slots - held - target + 1));
        held += h;
        s.push_back(running(i, 1 + int(rng() % 10), target, h, std::max(1, desired), rng() % 4 != 0));
      } else {
        s.push_back(queued(i, 1 + int(rng() % 10), desired));
      }
    }
    const std::vector<SlotState> before = s;
    const auto actions = planSlotActions(s, slots);
    int after = 0;
    for (const auto& x : s) after += x.held;
    EXPECT_LE(after, slots);
    for (const auto& a : actions) {
      const SlotState& b = before[a.job];
      EXPECT_TRUE(b.ready);
      if (a.kind == SlotAction::kShrink) {
        EXPECT_TRUE(b.running && a.workers < b.target && s[a.job].held == b.held);
      } else if (a.kind == SlotAction::kStart) {
        EXPECT_TRUE(!b.running && a.workers == b.desired);
      } else {
        EXPECT_TRUE(b.running && a.workers > b.target);
      }
    }
  }
}

// Slot types: a fast type (slowdown 1) and a slow one (1.5), `fast` and
// `slow` slots of each.
std::vector<SlotType> fastSlow(int fast, int slow) {
  return {SlotType{"fast", 1.0, fast, 0}, SlotType{"slow", 1.5, slow, 0}};
}

SlotState typed(SlotState s, std::vector<int> held_types, std::vector<int> desired_types) {
  s.held_types = std::move(held_types);
  s.desired_types = std::move(desired_types);
  return s;
}

TEST(LivePlan, AJobOnASlowSlotMovesToAFastOneThatFreedUp) {
  // j0 runs on the slow slot; the fast one is free and the policy wants j0
  // there at the same count: a move, one slot more held in between.
  std::vector<SlotState> s{typed(running(0, 1, 1, 1, 1), {0, 1}, {1, 0})};
  auto a = planSlotActions(s, 2, fastSlow(1, 1));
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, SlotAction::kMove);
  EXPECT_EQ(a[0].workers, 1);
  EXPECT_EQ(a[0].types, std::vector<int>{0});    // onto the fast slot
  EXPECT_EQ(a[0].release, std::vector<int>{1});  // off the slow one
  EXPECT_EQ(s[0].held, 2);
  EXPECT_EQ(s[0].held_types, (std::vector<int>{1, 1}));
  // While the fast slot is held by another job: nothing to do.
  s = {typed(running(0, 1, 1, 1, 1), {0, 1}, {1, 0}), typed(running(1, 1, 1, 1, 1), {1, 0}, {1, 0})};
  EXPECT_TRUE(planSlotActions(s, 2, fastSlow(1, 1)).empty());
  // A move under way (not ready) or a job already on its types: nothing.
  s = {typed(running(0, 1, 1, 2, 1, false), {1, 1}, {1, 0})};
  EXPECT_TRUE(planSlotActions(s, 2, fastSlow(1, 1)).empty());
  s = {typed(running(0, 1, 1, 1, 1), {1, 0}, {1, 0})};
  EXPECT_TRUE(planSlotActions(s, 2, fastSlow(1, 1)).empty());
  // A job already on all its VNs' workers cannot hold one more in between: no move.
  s = {typed(running(0, 1, 1, 1, 1), {0, 1}, {1, 0})};
  s[0].can_move = false;
  EXPECT_TRUE(planSlotActions(s, 2, fastSlow(1, 1)).empty());
  // Untyped, the same counts ask for nothing.
  s = {running(0, 1, 1, 1, 1)};
  EXPECT_TRUE(planSlotActions(s, 2).empty());
}

TEST(LivePlan, AMoveGoesOneSlotAtATimeAndWaitsForFreeSlotsInPriorityOrder) {
  // j0 (priority 1) holds 2 slow slots and wants 2 fast ones, 2 fast free:
  // one slot moves now (the next once this move has taken effect).
  std::vector<SlotState> s{typed(running(0, 1, 2, 2, 2), {0, 2}, {2, 0})};
  auto a = planSlotActions(s, 4, fastSlow(2, 2));
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, SlotAction::kMove);
  EXPECT_EQ(a[0].workers, 2);
  // A queued job of higher priority that wants both fast slots starts
  // first, and j0's move waits for a free fast slot.
  s = {typed(running(0, 1, 2, 2, 2), {0, 2}, {2, 0}), typed(queued(1, 10, 2), {}, {2, 0})};
  a = planSlotActions(s, 4, fastSlow(2, 2));
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, SlotAction::kStart);
  EXPECT_EQ(a[0].job, 1u);
  EXPECT_EQ(a[0].types, (std::vector<int>{0, 0}));
  EXPECT_EQ(s[1].held_types, (std::vector<int>{2, 0}));
}

TEST(LivePlan, TypedShrinksGiveBackTheTypesThePolicyLetGoSlowestFirst) {
  // j0 holds a fast and a slow slot; the policy keeps it on the fast one.
  std::vector<SlotState> s{typed(running(0, 1, 2, 2, 1), {1, 1}, {1, 0})};
  auto a = planSlotActions(s, 2, fastSlow(1, 1));
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, SlotAction::kShrink);
  EXPECT_EQ(a[0].release, std::vector<int>{1});
  // ... or on the slow one (it gives the fast slot to another job).
  s = {typed(running(0, 1, 2, 2, 1), {1, 1}, {0, 1})};
  a = planSlotActions(s, 2, fastSlow(1, 1));
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].release, std::vector<int>{0});
  // No types asked: its slowest goes.
  s = {typed(running(0, 1, 3, 3, 1), {2, 1}, {})};
  a = planSlotActions(s, 3, fastSlow(2, 1));
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].release, (std::vector<int>{1, 0}));
  // Not while an earlier shrink still holds its slots.
  s = {typed(running(0, 1, 2, 3, 1), {2, 1}, {1, 0})};
  EXPECT_TRUE(planSlotActions(s, 3, fastSlow(2, 1)).empty());
}

TEST(LivePlan, TypedStartsAndGrowsTakeTheAskedTypesThenTheFastestFree) {
  // 2 fast, 2 slow, all free. j0 asks for 1 slow: it gets the slow one.
  std::vector<SlotState> s{typed(queued(0, 1, 1), {}, {0, 1})};
  auto a = planSlotActions(s, 4, fastSlow(2, 2));
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].types, std::vector<int>{1});
  // Asked for 2 fast while 1 fast is free: the fast one, then a slow one, fastest first.
  s = {typed(running(0, 1, 1, 1, 1), {1, 0}, {1, 0}), typed(queued(1, 1, 2), {}, {2, 0})};
  a = planSlotActions(s, 4, fastSlow(2, 2));
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].types, (std::vector<int>{0, 1}));
  // A grow appends only the new slots' types.
  s = {typed(running(0, 1, 1, 1, 3), {0, 1}, {2, 1})};
  a = planSlotActions(s, 4, fastSlow(2, 2));
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, SlotAction::kGrow);
  EXPECT_EQ(a[0].types, (std::vector<int>{0, 0}));
  EXPECT_EQ(s[0].held_types, (std::vector<int>{2, 1}));
}

TEST(LivePlan, HeldSlotsOfEachTypeNeverExceedItsCountOnRandomStates) {
  std::mt19937_64 rng(2929);
  for (int round = 0; round < 3000; ++round) {
    const std::vector<SlotType> types = fastSlow(1 + int(rng() % 4), 1 + int(rng() % 4));
    const int slots = types[0].count + types[1].count;
    std::vector<int> left{types[0].count, types[1].count};
    std::vector<SlotState> s;
    for (int i = 0; i < 5; ++i) {
      std::vector<int> want{int(rng() % (types[0].count + 1)), int(rng() % (types[1].count + 1))};
      if (want[0] + want[1] == 0) want[0] = 1;
      const int desired = want[0] + want[1];
      std::vector<int> have{int(rng() % (left[0] + 1)), int(rng() % (left[1] + 1))};
      if (rng() % 2 && have[0] + have[1] > 0) {
        left[0] -= have[0];
        left[1] -= have[1];
        const int h = have[0] + have[1];
        const int target = rng() % 3 == 0 ? 1 + int(rng() % h) : h;
        s.push_back(typed(running(i, 1 + int(rng() % 10), target, h, desired, rng() % 4 != 0), have, want));
      } else {
        s.push_back(typed(queued(i, 1 + int(rng() % 10), desired), {}, want));
      }
    }
    const std::vector<SlotState> before = s;
    const auto actions = planSlotActions(s, slots, types);
    std::vector<int> per_type(2, 0);
    int held = 0;
    for (const auto& x : s) {
      held += x.held;
      ASSERT_EQ(x.held_types.size(), 2u);
      EXPECT_EQ(x.held_types[0] + x.held_types[1], x.held);
      per_type[0] += x.held_types[0];
      per_type[1] += x.held_types[1];
    }
    EXPECT_LE(held, slots);
    EXPECT_LE(per_type[0], types[0].count);
    EXPECT_LE(per_type[1], types[1].count);
    for (const auto& a : actions) {
      const SlotState& b = before[a.job];
      EXPECT_TRUE(b.ready);
      if (a.kind == SlotAction::kShrink) {
        EXPECT_EQ(int(a.release.size()), b.target - a.workers);
        for (int t : a.release) EXPECT_GT(b.held_types[size_t(t)], 0);
      } else if (a.kind == SlotAction::kMove) {
        EXPECT_TRUE(b.running && a.workers == b.target && b.desired == b.target);
        ASSERT_EQ(a.types.size(), 1u);
        ASSERT_EQ(a.release.size(), 1u);
        EXPECT_NE(a.types[0], a.release[0]);
        EXPECT_EQ(s[a.job].held, b.held + 1);
      } else {
        EXPECT_EQ(int(a.types.size()), a.kind == SlotAction::kStart ? a.workers : a.workers - b.held);
      }
    }
  }
}

// Slot types under Slurm: a node per device's host, of one type, checked
// against the allocation's nodes (exit 2 naming the file and the device).
TEST(SlurmNodes, OneTypePerNodeOfTheAllocation) {
  const std::vector<SlotType> types = {{"fast", 1.0, 2}, {"slow", 1.5, 1}};
  const std::vector<std::string> allocation = {"n1", "n2", "n3"};
  const std::vector<SlurmNode> nodes =
      slurmNodes({{"slow", "n2"}, {"fast", "n1"}, {"fast", "n1"}}, types, allocation, "r.toml");
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[0].name, "n2");
  EXPECT_EQ(nodes[0].type, 1);
  EXPECT_EQ(nodes[0].slots, 1);
  EXPECT_EQ(nodes[1].name, "n1");
  EXPECT_EQ(nodes[1].type, 0);
  EXPECT_EQ(nodes[1].slots, 2);
  auto message = [&](const std::vector<std::pair<std::string, std::string>>& devices) {
    try {
      slurmNodes(devices, types, allocation, "r.toml");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({{"fast", "local"}}).find("r.toml: devices[0] (host \"local\"): with --slurm, host must name a node "
                                              "of the allocation (n1, n2, n3)"),
            std::string::npos)
      << message({{"fast", "local"}});
  EXPECT_NE(message({{"fast", "n1"}, {"slow", "n9"}}).find("devices[1] (host \"n9\")"), std::string::npos);
  EXPECT_NE(message({{"fast", "n1"}, {"slow", "n1"}}).find("node n1 already has devices of type \"fast\""),
            std::string::npos)
      << message({{"fast", "n1"}, {"slow", "n1"}});
  EXPECT_NE(message({{"gpu", "n1"}}).find("type \"gpu\" is not one of the slot types"), std::string::npos);
  // More devices on a node than the allocation's tasks there.
  EXPECT_EQ(slurmNodes({{"fast", "n1"}, {"fast", "n1"}}, types, allocation, "r.toml", {2, 1, 1})[0].slots, 2);
  std::string over = "no error";
  try {
    slurmNodes({{"fast", "n1"}, {"slow", "n2"}, {"slow", "n2"}}, types, allocation, "r.toml", {2, 1, 1});
  } catch (const InputError& e) {
    over = e.what();
  }
  EXPECT_NE(over.find("r.toml: node n2 has 2 devices, but the allocation gives it 1 task(s)"), std::string::npos)
      << over;
}

TEST(SlurmNodes, TasksPerNodeAsSlurmWritesThem) {
  EXPECT_EQ(slurmTasksPerNode("1(x2)", 2), (std::vector<int>{1, 1}));
  EXPECT_EQ(slurmTasksPerNode("2(x3),1", 4), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(slurmTasksPerNode("2,1", 2), (std::vector<int>{2, 1}));
  EXPECT_THROW(slurmTasksPerNode("2(x3)", 2), InputError);
  EXPECT_THROW(slurmTasksPerNode("1", 2), InputError);
  EXPECT_THROW(slurmTasksPerNode("two", 1), InputError);
}

TEST(SlurmNodes, ANewWorkerStepGoesWhereItsTypeHasTheMostFreeSlots) {
  const std::vector<SlurmNode> nodes = {{"n1", 0, 2}, {"n2", 1, 1}, {"n3", 0, 2}, {"n4", 1, 3}};
  EXPECT_EQ(pickNode(nodes, {0, 0, 0, 0}, 0), 0);  // a tie: the first listed
  EXPECT_EQ(pickNode(nodes, {1, 0, 0, 0}, 0), 2);
  EXPECT_EQ(pickNode(nodes, {1, 0, 1, 0}, 0), 0);
  EXPECT_EQ(pickNode(nodes, {0, 0, 0, 0}, 1), 3);
  EXPECT_EQ(pickNode(nodes, {0, 0, 0, 3}, 1), 1);
  EXPECT_EQ(pickNode(nodes, {2, 0, 2, 0}, 0), 0);  // none free: still a node of the type (its step waits)
  EXPECT_EQ(pickNode(nodes, {}, 1), 3);
  EXPECT_EQ(pickNode(nodes, {0, 0, 0, 0}, 2), -1);
  // Picked in turn, the steps of each type spread over its nodes' slots.
  std::vector<int> used(nodes.size(), 0);
  for (int k = 0; k < 4; ++k) ++used[size_t(pickNode(nodes, used, 1))];
  EXPECT_EQ(used, (std::vector<int>{0, 1, 0, 3}));
}

}  // namespace
}  // namespace morph::sched
