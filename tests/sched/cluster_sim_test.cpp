// The cluster simulator and traces (sched/cluster_sim.h): hand-computed
// runs, the work each job did re-integrated from the allocation table,
// trace errors, and the seeded generator.
#include "sched/cluster_sim.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "core/error.h"

namespace morph::sched {
namespace {

TraceJob tjob(const std::string& name, double arrival, int priority, int demand, int64_t steps,
              std::map<int, double> table) {
  TraceJob j;
  j.name = name;
  j.arrival = arrival;
  j.priority = priority;
  j.demand = demand;
  j.steps = steps;
  j.speed = Speed(std::move(table));
  return j;
}

// VirtualFlow's example in time: A demands 2 (100 steps at 1 step/s on 2),
// B demands 8 (800 steps, linear: 8 s per step on one worker).
Trace example() {
  std::map<int, double> b;
  for (int k = 1; k <= 8; ++k) b[k] = 8.0 / k;
  return Trace{{tjob("A", 0, 1, 2, 100, {{1, 2.0}, {2, 1.0}}), tjob("B", 0, 1, 8, 800, b)}};
}

ClusterSimResult sim(const Trace& t, const std::string& policy, int slots, double resize) {
  SimConfig c;
  c.slots = slots;
  c.policy.resize_seconds = resize;
  return simulateCluster(t, *makePolicy(policy, c.policy), c);
}

TEST(ClusterSim, VirtualFlowExampleByHand) {
  // fifo: A on 2 for 100 s, B waits, then 800 s on 8.
  ClusterSimResult f = sim(example(), "fifo", 8, 10);
  EXPECT_DOUBLE_EQ(f.jobs[0].end, 100);
  EXPECT_DOUBLE_EQ(f.jobs[1].start, 100);
  EXPECT_DOUBLE_EQ(f.jobs[1].end, 900);
  EXPECT_DOUBLE_EQ(f.makespan_s, 900);
  EXPECT_DOUBLE_EQ(f.mean_jct_s, 500);
  EXPECT_DOUBLE_EQ(f.median_jct_s, 500);
  EXPECT_DOUBLE_EQ(f.mean_queue_s, 50);
  EXPECT_NEAR(f.utilisation, (2 * 100 + 8 * 800) / (8.0 * 900), 1e-12);
  EXPECT_EQ(f.resizes, 0);
  // wfs: B on 4 beside A (50 steps by t = 100), then 8 after a 10 s pause:
  // 750 steps more from t = 110.
  ClusterSimResult w = sim(example(), "wfs", 8, 10);
  EXPECT_DOUBLE_EQ(w.jobs[1].start, 0);
  EXPECT_NEAR(w.jobs[1].end, 860, 1e-9);
  EXPECT_EQ(w.jobs[1].resizes, 1);
  EXPECT_EQ(w.jobs[1].max_workers, 8);
  EXPECT_NEAR(w.utilisation, (2 * 100 + 4 * 100 + 8 * 760) / (8.0 * 860), 1e-12);
  // morph: B on 6 (75 steps by t = 100), then 8: 725 more from t = 110.
  ClusterSimResult m = sim(example(), "morph", 8, 10);
  EXPECT_NEAR(m.jobs[1].end, 835, 1e-9);
  EXPECT_EQ(m.jobs[1].resizes, 1);
  EXPECT_NEAR(m.mean_jct_s, (100 + 835) / 2.0, 1e-9);
  ASSERT_EQ(m.rows.size(), 3u);  // t = 0: 2 and 6; t = 100: B to 8; t = 835: none
  EXPECT_EQ(m.rows[0].workers, (std::vector<int>{2, 6}));
  EXPECT_EQ(m.rows[1].workers, (std::vector<int>{0, 8}));
  EXPECT_EQ(m.rows[2].workers, (std::vector<int>{0, 0}));
}

TEST(ClusterSim, StartUpDelaysTheFirstStep) {
  SimConfig c;
  c.slots = 8;
  c.start_seconds = 5;
  const ClusterSimResult f = simulateCluster(example(), *makePolicy("fifo"), c);
  EXPECT_DOUBLE_EQ(f.jobs[0].end, 105);   // 5 s start-up, then 100 s
  EXPECT_DOUBLE_EQ(f.jobs[1].start, 105);
  EXPECT_DOUBLE_EQ(f.jobs[1].end, 910);
}

// Re-integrates each job's steps from the allocation table (its rate on
// each row's workers over the row's span, less the pause after a resize)
// and checks it equals the job's steps: the simulator's bookkeeping of
// progress against a reading of its own output.
void checkWorkConserved(const Trace& t, const ClusterSimResult& r, double resize) {
  const size_t n = t.jobs.size();
  std::vector<double> done(n, 0), paused_until(n, -1);
  std::vector<int> prev(n, 0);
  for (size_t k = 0; k < r.rows.size(); ++k) {
    const AllocationRow& row = r.rows[k];
    int used = 0;
    for (size_t i = 0; i < n; ++i) {
      used += row.workers[i];
      if (prev[i] > 0 && row.workers[i] > 0 && row.workers[i] != prev[i]) paused_until[i] = row.time + resize;
    }
    EXPECT_LE(used, r.slots);
    if (k + 1 < r.rows.size()) {
      const double t1 = r.rows[k + 1].time;
      for (size_t i = 0; i < n; ++i) {
        const double ran = t1 - std::max(row.time, paused_until[i]);
        if (row.workers[i] > 0 && ran > 0) done[i] += t.jobs[i].speed.stepsPerSecond(row.workers[i]) * ran;
      }
    }
    prev = row.workers;
  }
  for (size_t i = 0; i < n; ++i) {
    EXPECT_NEAR(done[i], double(t.jobs[i].steps), 1e-6 * double(t.jobs[i].steps)) << r.policy << " " << t.jobs[i].name;
    EXPECT_GE(r.jobs[i].start, r.jobs[i].arrival);
    EXPECT_GT(r.jobs[i].end, r.jobs[i].start);
  }
}

TEST(ClusterSim, EveryPolicyDoesEachJobsWorkWithinTheSlots) {
  TraceGenOptions g;
  g.jobs = 40;
  g.seed = 7;
  const Trace t = generateTrace(g);
  for (double resize : {0.0, 30.0})
    for (const auto& name : policyNames()) {
      const ClusterSimResult r = sim(t, name, 8, resize);
      checkWorkConserved(t, r, resize);
      EXPECT_GT(r.utilisation, 0);
      EXPECT_LE(r.utilisation, 1 + 1e-9);
      EXPECT_GE(r.decisions, 40);  // at least one per arrival time
      if (name == "fifo") {
        EXPECT_EQ(r.resizes, 0);
      }
    }
}

TEST(ClusterSim, TraceErrorsNameTheFileTheJobAndTheKey) {
  auto error = [](const std::string& text) {
    try {
      traceFromJson(text, "t.json");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string ok = R"("arrival": 0, "priority": 1, "demand": 2, "steps": 10, "step_seconds": {"1": 1})";
  EXPECT_EQ(traceFromJson(R"({"jobs": [{"name": "a", )" + ok + "}]}", "t.json").jobs.size(), 1u);
  EXPECT_NE(error("[1,2").find("t.json: not JSON"), std::string::npos);
  EXPECT_NE(error(R"({"jobs": []})").find("at least one job"), std::string::npos);
  // A number beyond a double (tests/fuzz/corpus/cluster_trace/regress-number-overflow.json
  // ended the process: nlohmann's out_of_range was not caught).
  EXPECT_NE(error(R"({"jobs": [{"name": "a", "arrival": 1e3300}]})").find("t.json: not JSON"), std::string::npos);
  // A step time whose rate is not finite (1 / 1e-320).
  EXPECT_NE(error(R"({"jobs": [{"name": "a", "arrival": 0, "priority": 1, "demand": 1, "steps": 1, "step_seconds": {"1": 1e-320}}]})")
                .find("expected seconds > 0"),
            std::string::npos);
  EXPECT_NE(error(R"({"jobs": [{"name": "a", "arrival": 0, "priority": 1, "steps": 10, "step_seconds": {"1": 1}}]})")
                .find("t.json: jobs[0] (a): missing \"demand\""),
            std::string::npos);
  EXPECT_NE(error(R"({"jobs": [{"name": "a", "arrival": 0, "priority": 0, "demand": 2, "steps": 10, "step_seconds": {"1": 1}}]})")
                .find("jobs[0] (a).priority: expected an integer priority >= 1, got 0"),
            std::string::npos);
  EXPECT_NE(error(R"({"jobs": [{"name": "a", "arrival": 0, "priority": 1, "demand": 2.5, "steps": 10, "step_seconds": {"1": 1}}]})")
                .find(".demand: expected an integer"),
            std::string::npos);
  EXPECT_NE(error(R"({"jobs": [{"name": "a", "arrival": -1, "priority": 1, "demand": 2, "steps": 10, "step_seconds": {"1": 1}}]})")
                .find(".arrival: expected seconds >= 0"),
            std::string::npos);
  EXPECT_NE(error(R"({"jobs": [{"name": "a", "arrival": 0, "priority": 1, "demand": 2, "steps": 10, "step_seconds": {"x": 1}}]})")
                .find("step_seconds: key \"x\" is not a worker count"),
            std::string::npos);
  EXPECT_NE(error(R"({"jobs": [{"name": "a", "arrival": 0, "priority": 1, "demand": 2, "steps": 10, "step_seconds": {"2": 0}}]})")
                .find("step_seconds[\"2\"]: expected seconds > 0"),
            std::string::npos);
  EXPECT_NE(error(R"({"jobs": [{"name": "a", "arrival": 0, "priority": 1, "demand": 2, "steps": 10}]})")
                .find("expected either \"step_seconds\""),
            std::string::npos);
  EXPECT_NE(error(R"({"jobs": [{"name": "a", "arrival": 0, "priority": 1, "demand": 2, "steps": 10, "job": "j.toml", "profile": "p.json"}]})")
                .find("cannot be resolved"),
            std::string::npos);
  EXPECT_NE(error(R"({"jobs": [{"name": "a", )" + ok + R"(}, {"name": "a", )" + ok + "}]}").find("jobs[1] (a): name \"a\" appears twice"),
            std::string::npos);
  // A demand above the slots is the simulation's to refuse (it knows the slots).
  const Trace t = traceFromJson(R"({"jobs": [{"name": "a", )" + ok + "}]}", "t.json");
  try {
    sim(t, "wfs", 1, 0);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("jobs[0] (a): demand 2 is above the 1 slots"), std::string::npos);
  }
}

TEST(ClusterSim, JobFilesGoThroughTheResolverRelativeToTheTrace) {
  std::string seen_job, seen_profile;
  int seen_max = 0;
  size_t seen_types = 0;
  const ProfileResolver resolve = [&](const std::string& j, const std::string& p, int max,
                                      const std::vector<SlotType>& types) {
    seen_job = j, seen_profile = p, seen_max = max, seen_types = types.size();
    return Speed({{1, 2.0}, {2, 1.5}}, {{{1, 1}, 1.2}});
  };
  SlotType fast, slow;
  fast.name = "fast", fast.count = 1;
  slow.name = "slow", slow.slowdown = 2, slow.count = 1;
  const Trace t = traceFromJson(
      R"({"jobs": [{"name": "a", "arrival": 0, "priority": 1, "demand": 2, "steps": 10, "job": "j.toml", "profile": "/abs/p.json"}]})",
      "dir/t.json", resolve, {fast, slow});
  EXPECT_EQ(seen_job, "dir/j.toml");
  EXPECT_EQ(seen_profile, "/abs/p.json");
  EXPECT_EQ(seen_max, 2);
  EXPECT_EQ(seen_types, 2u);
  EXPECT_DOUBLE_EQ(t.jobs[0].speed.stepsPerSecond(2), 1 / 1.5);
  EXPECT_DOUBLE_EQ(t.jobs[0].speed.stepsPerSecond({1, 1}, {fast, slow}), 1 / 1.2);
}

// Slot types in the simulator, worked by hand. A (priority 10) and B
// (priority 1) arrive at 0, 100 steps each, linear (2 steps/s on 2 slots of
// slowdown 1), demand 2; 2 fast slots (slowdown 1) and 2 slow (2); no
// resize or start-up cost.
//  - morph: A on the fast pair (2 steps/s) ends at 50; B on the slow pair
//    (1 step/s) has 50 left then, moves to the fast pair (2 steps/s) and
//    ends at 75. Mean JCT 62.5 s, whichever type is listed first.
//  - fifo (types unknown to it) with the slow slots listed first: A on the
//    slow pair ends at 100, B on the fast pair at 50. Mean 75 s.
TEST(ClusterSim, SlotTypesByHand) {
  Trace t;
  for (int i = 0; i < 2; ++i) {
    TraceJob j;
    j.name = i == 0 ? "A" : "B";
    j.priority = i == 0 ? 10 : 1;
    j.demand = 2;
    j.steps = 100;
    j.speed = Speed({{1, 1.0}, {2, 0.5}});
    t.jobs.push_back(j);
  }
  SlotType fast, slow;
  fast.name = "fast", fast.count = 2;
  slow.name = "slow", slow.slowdown = 2, slow.count = 2;
  SimConfig cfg;
  cfg.slots = 4;
  cfg.policy.resize_seconds = 0;
  for (const auto& types : {std::vector<SlotType>{fast, slow}, std::vector<SlotType>{slow, fast}}) {
    cfg.types = types;
    const ClusterSimResult m = simulateCluster(t, *makePolicy("morph", cfg.policy), cfg);
    EXPECT_NEAR(m.jobs[0].end, 50, 1e-9) << types[0].name;
    EXPECT_NEAR(m.jobs[1].end, 75, 1e-9) << types[0].name;
    EXPECT_EQ(m.jobs[1].resizes, 1);
    EXPECT_NEAR(m.mean_jct_s, 62.5, 1e-9);
    ASSERT_FALSE(m.rows.empty());
    EXPECT_EQ(m.rows.front().by_type.size(), 2u);
  }
  cfg.types = {slow, fast};
  const ClusterSimResult f = simulateCluster(t, *makePolicy("fifo", cfg.policy), cfg);
  EXPECT_NEAR(f.jobs[0].end, 100, 1e-9);
  EXPECT_NEAR(f.jobs[1].end, 50, 1e-9);
  EXPECT_NEAR(f.mean_jct_s, 75, 1e-9);
  cfg.types = {fast};  // counts that do not add up to the slots
  EXPECT_THROW(simulateCluster(t, *makePolicy("morph", cfg.policy), cfg), InputError);
}

TEST(ClusterSim, GeneratorIsSeededAndDrawsTheIssuesDistributions) {
  TraceGenOptions g;
  g.jobs = 2000;
  g.seed = 3;
  const Trace a = generateTrace(g);
  EXPECT_EQ(traceToJson(a), traceToJson(generateTrace(g)));
  g.seed = 4;
  EXPECT_NE(traceToJson(a), traceToJson(generateTrace(g)));
  std::set<int> prios, demands;
  for (size_t i = 0; i < a.jobs.size(); ++i) {
    const TraceJob& j = a.jobs[i];
    prios.insert(j.priority);
    demands.insert(j.demand);
    if (i > 0) {
      EXPECT_GE(j.arrival, a.jobs[i - 1].arrival);
    }
    const auto& tab = j.speed.table();
    ASSERT_EQ(int(tab.size()), j.demand);
    for (int k = 2; k <= j.demand; ++k) {
      EXPECT_LE(tab.at(k), tab.at(k - 1));          // never slower with more workers
      EXPECT_GE(tab.at(k), tab.at(1) / k - 1e-6);   // never better than linear
    }
  }
  EXPECT_EQ(prios, (std::set<int>{1, 5, 10}));
  EXPECT_EQ(demands, (std::set<int>{1, 2, 4, 8}));
  // Poisson at 12 per hour: mean gap 300 s (2000 gaps: within 10%).
  const double mean_gap = a.jobs.back().arrival / double(a.jobs.size() - 1);
  EXPECT_NEAR(mean_gap, 300, 30);
  // A generated trace reads back as written.
  const Trace back = traceFromJson(traceToJson(a), "gen.json");
  EXPECT_EQ(traceToJson(back), traceToJson(a));
}

}  // namespace
}  // namespace morph::sched
