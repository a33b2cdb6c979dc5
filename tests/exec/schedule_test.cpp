#include "exec/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"

namespace morph {
namespace {

using AK = ActionKind;

ScheduleOptions opts(ScheduleKind kind, int p, int64_t m, bool recompute = false) {
  ScheduleOptions o;
  o.kind = kind;
  o.stages = p;
  o.micro_batches = m;
  o.recompute = recompute;
  return o;
}

size_t indexOf(const std::vector<Action>& list, Action a) {
  auto it = std::find(list.begin(), list.end(), a);
  EXPECT_NE(it, list.end()) << toString(a);
  return static_cast<size_t>(it - list.begin());
}

// The InputError message of validateSchedule, or "" if it passed.
std::string rejection(const Schedule& s, const ScheduleOptions& o, int64_t max_live = 0) {
  try {
    validateSchedule(s, o, max_live);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

const ScheduleKind kKinds[] = {ScheduleKind::kGpipe, ScheduleKind::k1F1B, ScheduleKind::kVaruna};

TEST(Schedule, EveryKindStagesMicroBatchesAndRecomputeValidates) {
  for (ScheduleKind kind : kKinds)
    for (int p : {1, 2, 3, 4})
      for (int64_t m : {1, 2, 4, 8})
        for (bool rec : {false, true}) {
          SCOPED_TRACE(toString(kind) + " P=" + std::to_string(p) + " M=" + std::to_string(m) +
                       " recompute=" + std::to_string(rec));
          const auto o = opts(kind, p, m, rec);
          const Schedule s = makeSchedule(o);
          ASSERT_EQ(s.size(), static_cast<size_t>(p));
          EXPECT_NO_THROW(validateSchedule(s, o));
          // Each rank's count of actions: F + B per VN, plus communication
          // and recomputation where the stage has them.
          for (int k = 0; k < p; ++k) {
            const bool first = k == 0, last = k == p - 1;
            const int64_t per_vn = 2 + (first ? 0 : 2) + (last ? 0 : 2) + (rec && !last ? 1 : 0);
            EXPECT_EQ(static_cast<int64_t>(s[k].size()), per_vn * m) << "rank " << k;
          }
          // The tightest live bound for the kind is accepted.
          int64_t peak = 0;
          for (const auto& r : s) peak = std::max(peak, peakLiveActivations(r));
          EXPECT_NO_THROW(validateSchedule(s, o, peak));
        }
}

TEST(Schedule, PeakLiveActivations) {
  for (int p : {1, 2, 3, 4})
    for (int64_t m : {1, 2, 4, 8})
      for (bool rec : {false, true}) {
        const Schedule gpipe = makeSchedule(opts(ScheduleKind::kGpipe, p, m, rec));
        const Schedule f1b1 = makeSchedule(opts(ScheduleKind::k1F1B, p, m, rec));
        const Schedule varuna = makeSchedule(opts(ScheduleKind::kVaruna, p, m, rec));
        for (int k = 0; k < p; ++k) {
          EXPECT_EQ(peakLiveActivations(gpipe[k]), m) << "P=" << p << " M=" << m << " k=" << k;
          EXPECT_EQ(peakLiveActivations(f1b1[k]), std::min<int64_t>(p - k, m))
              << "P=" << p << " M=" << m << " k=" << k;
          EXPECT_EQ(peakLiveActivations(varuna[k]), std::min<int64_t>(p - k, m))
              << "P=" << p << " M=" << m << " k=" << k;
        }
      }
}

TEST(Schedule, OneFOneBOrderOnRankZero) {
  // P=3, M=4, rank 0: two warm-up forwards, then F/B alternating, then drain.
  const Schedule s = makeSchedule(opts(ScheduleKind::k1F1B, 3, 4));
  std::vector<Action> compute;
  for (const auto& a : s[0])
    if (a.kind == AK::kForward || a.kind == AK::kBackward) compute.push_back(a);
  const std::vector<Action> want = {{AK::kForward, 0},  {AK::kForward, 1},  {AK::kForward, 2},
                                    {AK::kBackward, 0}, {AK::kForward, 3},  {AK::kBackward, 1},
                                    {AK::kBackward, 2}, {AK::kBackward, 3}};
  EXPECT_EQ(compute, want);
}

TEST(Schedule, GpipeRunsBackwardsInReverseOrder) {
  const Schedule s = makeSchedule(opts(ScheduleKind::kGpipe, 2, 3));
  const std::vector<Action> want = {{AK::kForward, 0},  {AK::kSendAct, 0},  {AK::kForward, 1},
                                    {AK::kSendAct, 1},  {AK::kForward, 2},  {AK::kSendAct, 2},
                                    {AK::kRecvGrad, 2}, {AK::kBackward, 2}, {AK::kRecvGrad, 1},
                                    {AK::kBackward, 1}, {AK::kRecvGrad, 0}, {AK::kBackward, 0}};
  EXPECT_EQ(s[0], want);
}

TEST(Schedule, RecomputePlacement) {
  for (ScheduleKind kind : kKinds) {
    const Schedule s = makeSchedule(opts(kind, 3, 4, true));
    for (size_t k = 0; k < s.size(); ++k) {
      const auto& list = s[k];
      for (int64_t vn = 0; vn < 4; ++vn) {
        const size_t b = indexOf(list, {AK::kBackward, vn});
        if (k + 1 == s.size()) {
          EXPECT_EQ(std::count(list.begin(), list.end(), Action{AK::kRecompute, vn}), 0);
          continue;
        }
        // Varuna recomputes before the wait for the gradient (overlapping
        // it); GPipe and 1F1B after the gradient arrives.
        const std::vector<Action> want =
            kind == ScheduleKind::kVaruna
                ? std::vector<Action>{{AK::kRecompute, vn}, {AK::kRecvGrad, vn}, {AK::kBackward, vn}}
                : std::vector<Action>{{AK::kRecvGrad, vn}, {AK::kRecompute, vn}, {AK::kBackward, vn}};
        ASSERT_GE(b, 2u);
        EXPECT_EQ(std::vector<Action>(list.begin() + static_cast<long>(b) - 2,
                                      list.begin() + static_cast<long>(b) + 1),
                  want)
            << toString(kind) << " rank " << k << " vn " << vn;
      }
    }
  }
}

TEST(Schedule, VarunaLastStageRunsBackwardRightAfterForward) {
  for (int p : {1, 2, 4})
    for (int64_t m : {1, 4, 8})
      for (bool rec : {false, true}) {
        const Schedule s = makeSchedule(opts(ScheduleKind::kVaruna, p, m, rec));
        const auto& last = s.back();
        int64_t forwards = 0;
        for (size_t i = 0; i < last.size(); ++i) {
          EXPECT_NE(last[i].kind, AK::kRecompute);
          if (last[i].kind != AK::kForward) continue;
          EXPECT_EQ(last[i].vn, forwards);  // VNs in order
          ++forwards;
          ASSERT_LT(i + 1, last.size());
          EXPECT_EQ(last[i + 1], (Action{AK::kBackward, last[i].vn}));
        }
        EXPECT_EQ(forwards, m);
        EXPECT_EQ(peakLiveActivations(last), 1);
      }
}

TEST(Schedule, RejectsBackwardBeforeItsForward) {
  const auto o = opts(ScheduleKind::k1F1B, 2, 4);
  Schedule s = makeSchedule(o);
  // Last rank: recv act 0, forward 0, backward 0, ... -> backward first.
  std::swap(s[1][1], s[1][2]);
  EXPECT_EQ(rejection(s, o),
            "pipeline schedule: rank 1, action 1 (backward vn 0): no forward of vn 0 before it");
}

TEST(Schedule, RejectsForwardWithoutItsRecv) {
  const auto o = opts(ScheduleKind::kGpipe, 3, 4);
  Schedule s = makeSchedule(o);
  auto& r2 = s[2];
  r2.erase(r2.begin() + static_cast<long>(indexOf(r2, {AK::kRecvAct, 2})));
  const size_t f = indexOf(r2, {AK::kForward, 2});
  const std::string msg = rejection(s, o);
  EXPECT_NE(msg.find("rank 2, action " + std::to_string(f) + " (forward vn 2)"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("no recv activation of vn 2 before it"), std::string::npos) << msg;
}

TEST(Schedule, RejectsBackwardWithoutItsRecvGrad) {
  const auto o = opts(ScheduleKind::k1F1B, 3, 4);
  Schedule s = makeSchedule(o);
  auto& r1 = s[1];
  r1.erase(r1.begin() + static_cast<long>(indexOf(r1, {AK::kRecvGrad, 3})));
  const size_t b = indexOf(r1, {AK::kBackward, 3});
  const std::string msg = rejection(s, o);
  EXPECT_NE(msg.find("rank 1, action " + std::to_string(b) + " (backward vn 3)"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("no recv grad of vn 3"), std::string::npos) << msg;
}

TEST(Schedule, RejectsBackwardWithoutItsRecompute) {
  const auto o = opts(ScheduleKind::kVaruna, 2, 2, true);
  Schedule s = makeSchedule(o);
  auto& r0 = s[0];
  r0.erase(r0.begin() + static_cast<long>(indexOf(r0, {AK::kRecompute, 1})));
  const size_t b = indexOf(r0, {AK::kBackward, 1});
  const std::string msg = rejection(s, o);
  EXPECT_NE(msg.find("rank 0, action " + std::to_string(b) + " (backward vn 1)"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("no recompute of vn 1"), std::string::npos) << msg;

  // The last stage never recomputes, and nobody does when it is off.
  Schedule t = makeSchedule(o);
  t[1].insert(t[1].begin() + 2, Action{AK::kRecompute, 0});
  EXPECT_NE(rejection(t, o).find("rank 1, action 2 (recompute vn 0): the last stage never"),
            std::string::npos)
      << rejection(t, o);
  const auto off = opts(ScheduleKind::kVaruna, 2, 2, false);
  EXPECT_NE(rejection(makeSchedule(o), off).find("recomputation is off"), std::string::npos);
}

TEST(Schedule, RejectsMismatchedSendOrder) {
  const auto o = opts(ScheduleKind::kGpipe, 2, 4);
  Schedule s = makeSchedule(o);
  // Rank 0 forwards (and sends) vn 2 before vn 1; rank 1 still expects 0,1,2,3.
  auto& r0 = s[0];
  std::swap_ranges(r0.begin() + 2, r0.begin() + 4, r0.begin() + 4);
  ASSERT_EQ(r0[2], (Action{AK::kForward, 2}));
  const std::string msg = rejection(s, o);
  // Rank 1 (the last): recv act 0, forward 0, recv act 1, ...
  EXPECT_NE(msg.find("rank 1, action 2 (recv activation vn 1)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("vn 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("in order"), std::string::npos) << msg;
}

TEST(Schedule, RejectsMismatchedGradOrder) {
  const auto o = opts(ScheduleKind::kGpipe, 2, 2);
  Schedule s = makeSchedule(o);
  // Rank 0 receives grads as 1, 0 (GPipe order); make it expect 0 first.
  auto& r0 = s[0];
  const size_t g1 = indexOf(r0, {AK::kRecvGrad, 1}), g0 = indexOf(r0, {AK::kRecvGrad, 0});
  std::swap_ranges(r0.begin() + static_cast<long>(g1), r0.begin() + static_cast<long>(g1) + 2,
                   r0.begin() + static_cast<long>(g0));
  const std::string msg = rejection(s, o);
  EXPECT_NE(msg.find("rank 0, action " + std::to_string(g1) + " (recv grad vn 0)"),
            std::string::npos)
      << msg;
}

TEST(Schedule, RejectsDuplicatedAndMissingVns) {
  const auto o = opts(ScheduleKind::kGpipe, 1, 4);
  Schedule s = makeSchedule(o);
  s[0][2] = Action{AK::kForward, 1};  // forward vn 2 -> a second forward of vn 1
  EXPECT_EQ(rejection(s, o),
            "pipeline schedule: rank 0, action 2 (forward vn 1): duplicated: vn 1 already has a "
            "forward at action 1");

  Schedule t = makeSchedule(o);
  t[0].erase(std::remove_if(t[0].begin(), t[0].end(), [](const Action& a) { return a.vn == 3; }),
             t[0].end());
  EXPECT_NE(rejection(t, o).find("rank 0: missing forward vn 3"), std::string::npos)
      << rejection(t, o);

  Schedule u = makeSchedule(o);
  u[0][0].vn = 4;  // outside 0..M-1
  EXPECT_NE(rejection(u, o).find("rank 0, action 0 (forward vn 4): vn outside 0..3"),
            std::string::npos)
      << rejection(u, o);
}

TEST(Schedule, RejectsMisplacedCommunicationAndWrongStageCount) {
  const auto o = opts(ScheduleKind::k1F1B, 2, 1);
  Schedule s = makeSchedule(o);
  s[1].push_back({AK::kSendAct, 0});
  EXPECT_NE(rejection(s, o).find("rank 1, action 4 (send activation vn 0): the last rank has no"),
            std::string::npos)
      << rejection(s, o);
  Schedule t = makeSchedule(o);
  t.pop_back();
  EXPECT_NE(rejection(t, o).find("1 rank lists for 2 stages"), std::string::npos);
  EXPECT_THROW(makeSchedule(opts(ScheduleKind::k1F1B, 0, 1)), InputError);
  EXPECT_THROW(makeSchedule(opts(ScheduleKind::k1F1B, 2, 0)), InputError);
}

TEST(Schedule, RejectsDeadlockNamingStuckRanks) {
  const auto o = opts(ScheduleKind::k1F1B, 2, 1);
  Schedule s = makeSchedule(o);
  // Rank 0: forward 0, send act 0, recv grad 0, backward 0 -> wait for the
  // gradient before sending the activation it depends on.
  ASSERT_EQ(s[0][1], (Action{AK::kSendAct, 0}));
  std::swap(s[0][1], s[0][2]);
  const std::string msg = rejection(s, o);
  EXPECT_NE(msg.find("deadlock"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 0, action 1 (recv grad vn 0)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 1, action 0 (recv activation vn 0)"), std::string::npos) << msg;

  // A 3-stage one with every channel in order: rank 0 waits for grad 0
  // before forwarding vn 1, but in 1F1B rank 1 forwards vn 1 before its
  // backward of vn 0, and rank 2 then waits for vn 1 too.
  const auto o3 = opts(ScheduleKind::k1F1B, 3, 4);
  Schedule d = makeSchedule(o3);
  auto& r0 = d[0];
  const size_t g0 = indexOf(r0, {AK::kRecvGrad, 0});
  ASSERT_EQ(r0[2], (Action{AK::kForward, 1}));
  const Action moved = r0[g0];
  r0.erase(r0.begin() + static_cast<long>(g0));
  r0.insert(r0.begin() + 2, moved);
  const std::string msg3 = rejection(d, o3);
  EXPECT_NE(msg3.find("deadlock"), std::string::npos) << msg3;
  EXPECT_NE(msg3.find("rank 0, action 2 (recv grad vn 0)"), std::string::npos) << msg3;
  EXPECT_NE(msg3.find("rank 1, action 3 (recv activation vn 1)"), std::string::npos) << msg3;
  EXPECT_NE(msg3.find("rank 2, action 4 (recv activation vn 1)"), std::string::npos) << msg3;
}

TEST(Schedule, RejectsTooManyLiveActivations) {
  const auto o = opts(ScheduleKind::kGpipe, 2, 4);
  const Schedule s = makeSchedule(o);
  // Rank 0: F0 S0 F1 S1 F2 ... -> the third forward (action 4) breaks a bound of 2.
  const std::string msg = rejection(s, o, 2);
  EXPECT_NE(msg.find("rank 0, action 4 (forward vn 2): 3 activations stashed at once"),
            std::string::npos)
      << msg;
  EXPECT_EQ(rejection(makeSchedule(opts(ScheduleKind::k1F1B, 2, 4)), o, 2), "");
}

TEST(Schedule, StashedVnsAgreesWithTheGenerator) {
  for (ScheduleKind kind : kKinds)
    for (int p = 1; p <= 6; ++p)
      for (int64_t m = 1; m <= 12; ++m)
        for (bool rc : {false, true}) {
          const auto o = opts(kind, p, m, rc);
          const Schedule s = makeSchedule(o);
          for (int k = 0; k < p; ++k)
            EXPECT_EQ(stashedVns(o, k), peakLiveActivations(s[static_cast<size_t>(k)]))
                << toString(kind) << " P=" << p << " M=" << m << " rc=" << rc << " rank " << k;
        }
}

TEST(Schedule, CanSwap) {
  const Schedule s = makeSchedule(opts(ScheduleKind::kVaruna, 2, 4));
  const auto& r0 = s[0];
  // F0 S0 F1 S1 RG0 B0 F2 S2 RG1 B1 F3 S3 RG2 B2 RG3 B3
  ASSERT_EQ(r0[4], (Action{AK::kRecvGrad, 0}));
  ASSERT_EQ(r0[6], (Action{AK::kForward, 2}));
  EXPECT_TRUE(canSwap(r0, 4, 6));   // a ready forward ahead of a waiting backward
  EXPECT_TRUE(canSwap(r0, 3, 6));   // past another VN's send
  EXPECT_TRUE(canSwap(r0, 5, 5));   // no move
  EXPECT_FALSE(canSwap(r0, 4, 5));  // backward 0 before its gradient
  EXPECT_FALSE(canSwap(r0, 6, 7));  // send 2 before forward 2
  EXPECT_FALSE(canSwap(r0, 4, 8));  // recv grad 1 before recv grad 0: channel order
  EXPECT_TRUE(canSwap(r0, 0, 2));   // rank 0 may forward vn 1 first; sends keep their order
  EXPECT_THROW(canSwap(r0, 6, 4), InternalError);

  // The opportunistic move keeps the schedule valid.
  const auto o = opts(ScheduleKind::kVaruna, 2, 4);
  Schedule moved = s;
  const Action f2 = moved[0][6];
  moved[0].erase(moved[0].begin() + 6);
  moved[0].insert(moved[0].begin() + 4, f2);
  EXPECT_EQ(rejection(moved, o), "");
  EXPECT_EQ(peakLiveActivations(moved[0]), 3);  // the price: one more live VN
}

// Rank k's list as the stage executor runs it when every gradient is late:
// at each receive of a gradient it takes every move opportunisticMove()
// offers (activations have always arrived), then the gradient comes.
std::vector<Action> runWithLateGradients(std::vector<Action> acts, int64_t max_stashed) {
  for (size_t i = 0; i < acts.size(); ++i) {
    if (acts[i].kind != AK::kRecvGrad) continue;
    for (size_t j; (j = opportunisticMove(acts, i, [](const Action& c) { return c.kind == AK::kRecvAct; },
                                         max_stashed)) != i;
         ++i)
      std::rotate(acts.begin() + static_cast<long>(i), acts.begin() + static_cast<long>(j),
                  acts.begin() + static_cast<long>(j) + 1);
  }
  return acts;
}

// The most VNs whose recomputed activations are held at once (recompute
// done, backward not yet).
int64_t peakRecomputed(const std::vector<Action>& list) {
  int64_t live = 0, peak = 0;
  for (const Action& a : list) {
    if (a.kind == AK::kRecompute) peak = std::max(peak, ++live);
    if (a.kind == AK::kBackward && live > 0) --live;
  }
  return peak;
}

TEST(Schedule, VarunaMovesNeverHoldMoreThanTheRunStashBound) {
  // P=2, M=4, recomputation, rank 0 (runStashBound 3): F0 S0 F1 S1 RC0 RG0
  // B0 F2 S2 RC1 RG1 ... With gradient 0 late, forward 2 and its send move
  // ahead (3 stashed); then neither forward 3 (a 4th stashed VN) nor the
  // recompute of vn 1 (while vn 0's recomputed activations wait for their
  // backward) may.
  const auto o = opts(ScheduleKind::kVaruna, 2, 4, true);
  ASSERT_EQ(runStashBound(o, 0), 3);
  ASSERT_EQ(runStashBound(o, 1), 1);
  const std::vector<Action> moved = runWithLateGradients(makeSchedule(o)[0], runStashBound(o, 0));
  const std::vector<Action> want_head = {{AK::kForward, 0},   {AK::kSendAct, 0},   {AK::kForward, 1},
                                         {AK::kSendAct, 1},   {AK::kRecompute, 0}, {AK::kForward, 2},
                                         {AK::kSendAct, 2},   {AK::kRecvGrad, 0},  {AK::kBackward, 0}};
  ASSERT_GE(moved.size(), want_head.size());
  for (size_t i = 0; i < want_head.size(); ++i)
    EXPECT_EQ(moved[i], want_head[i]) << "action " << i << ": " << toString(moved[i]);
  EXPECT_LE(peakRecomputed(moved), 1);
  EXPECT_LE(peakLiveActivations(moved), 3);

  // Every shape: the run-time stash stays within runStashBound() (which the
  // memory estimates count) and reaches it where a gradient wait leaves room
  // for a forward; never two recomputed VNs.
  int reached = 0;
  for (int p = 2; p <= 5; ++p)
    for (int64_t m = 1; m <= 10; ++m)
      for (bool rc : {false, true}) {
        const auto v = opts(ScheduleKind::kVaruna, p, m, rc);
        const Schedule s = makeSchedule(v);
        for (int k = 0; k < p; ++k) {
          const auto run = runWithLateGradients(s[static_cast<size_t>(k)], runStashBound(v, k));
          EXPECT_LE(peakLiveActivations(run), runStashBound(v, k)) << "P=" << p << " M=" << m << " rank " << k;
          EXPECT_LE(peakRecomputed(run), 1) << "P=" << p << " M=" << m << " rank " << k;
          reached += peakLiveActivations(run) == runStashBound(v, k) && runStashBound(v, k) > stashedVns(v, k);
        }
      }
  EXPECT_GT(reached, 50);
  // The other schedules never move: the bound is the static one.
  for (ScheduleKind kind : {ScheduleKind::kGpipe, ScheduleKind::k1F1B})
    for (int k = 0; k < 3; ++k) EXPECT_EQ(runStashBound(opts(kind, 3, 8), k), stashedVns(opts(kind, 3, 8), k));
}

TEST(Schedule, CanSwapMovesNeverBreakRankOrChannelRules) {
  // Random moves allowed by canSwap keep every per-rank and channel rule;
  // only a deadlock (which the executor avoids by moving only ready actions)
  // can remain.
  std::mt19937_64 rng(1234);
  int accepted = 0, deadlocks = 0;
  for (ScheduleKind kind : kKinds)
    for (bool rec : {false, true})
      for (int trial = 0; trial < 40; ++trial) {
        const auto o = opts(kind, 3, 4, rec);
        Schedule s = makeSchedule(o);
        for (int move = 0; move < 5; ++move) {
          auto& list = s[rng() % s.size()];
          const size_t j = rng() % list.size();
          const size_t i = j - (rng() % (j + 1));
          if (!canSwap(list, i, j)) continue;
          const Action a = list[j];
          list.erase(list.begin() + static_cast<long>(j));
          list.insert(list.begin() + static_cast<long>(i), a);
          ++accepted;
        }
        const std::string msg = rejection(s, o);
        if (!msg.empty()) {
          EXPECT_NE(msg.find("deadlock"), std::string::npos) << msg;
          ++deadlocks;
        }
      }
  EXPECT_GT(accepted, 100);
  EXPECT_LT(deadlocks, 24);  // seeded: most random moves stay deadlock-free
}

TEST(Schedule, Names) {
  EXPECT_EQ(toString(Action{AK::kForward, 3}), "forward vn 3");
  EXPECT_EQ(toString(Action{AK::kRecvGrad, 0}), "recv grad vn 0");
  EXPECT_EQ(toString(Action{AK::kSendAct, 1}), "send activation vn 1");
  for (ScheduleKind kind : kKinds) EXPECT_EQ(parseScheduleKind(toString(kind)), kind);
  EXPECT_THROW(parseScheduleKind("pipedream"), InputError);
}

}  // namespace
}  // namespace morph
