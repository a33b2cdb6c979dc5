// The live scheduler's slot accounting (planSlotActions, sched/cluster_live.h):
// shrinks first, a shrinking job keeps its slots until the shrink took
// effect, starts and grows in priority order within the free slots.
#include "sched/cluster_live.h"

#include <gtest/gtest.h>

#include <random>

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

}  // namespace
}  // namespace morph::sched
