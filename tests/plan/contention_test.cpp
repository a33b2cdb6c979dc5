// The co-located contention model (Profile::host_contention): the
// simulator on a synthetic host, and the fit, against figures computed by
// hand.
#include "plan/contention.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "hand_profiles.h"

namespace morph {
namespace {

// Layers of f = 1, b = 2 (3 s a VN per layer), free communication, a host
// of 64 cores.
Profile uniform(size_t layers) {
  return handProfile(layers, [](size_t, LayerCost& c) {
    c.forward_s = c.forward_nograd_s = 1;
    c.backward_s = 2;
  });
}

// One layer per stage, one replica of M VNs, 1F1B.
PlanSpec pipeline(int P, int64_t M) {
  PlanSpec s;
  s.stages = P;
  for (int k = 0; k <= P; ++k) s.cuts.push_back(static_cast<size_t>(k));
  s.vn_shares = {M};
  return s;
}

HostContention model(std::map<int, double> factors, double pipeline_step_s) {
  HostContention h;
  h.factors = std::move(factors);
  h.pipeline_step_s = pipeline_step_s;
  h.measured_on = "by hand";
  return h;
}

TEST(HostContention, FactorByProcessCount) {
  const HostContention h = model({{1, 1.0}, {2, 1.2}, {4, 1.5}}, 0);
  EXPECT_DOUBLE_EQ(h.factor(0), 1.0);
  EXPECT_DOUBLE_EQ(h.factor(1), 1.0);
  EXPECT_DOUBLE_EQ(h.factor(2), 1.2);
  EXPECT_DOUBLE_EQ(h.factor(3), 1.2);  // between two counts: the lower one's
  EXPECT_DOUBLE_EQ(h.factor(4), 1.5);
  EXPECT_DOUBLE_EQ(h.factor(64), 1.5);  // above the largest measured: its factor
  // Without the model: the older one, compute_contention for every process
  // of a plan of two or more, wherever it runs.
  Profile p = uniform(2);
  p.compute_contention = 1.3;
  EXPECT_DOUBLE_EQ(p.computeFactor(1, 1), 1.0);
  EXPECT_DOUBLE_EQ(p.computeFactor(1, 2), 1.3);
  EXPECT_DOUBLE_EQ(p.pipelineStepSeconds(), 0.0);
  p.host_contention = h;
  EXPECT_DOUBLE_EQ(p.computeFactor(1, 2), 1.0);
  EXPECT_DOUBLE_EQ(p.computeFactor(2, 2), 1.2);
}

TEST(HostContention, SimulatorChargesEachProcessItsHostsFactor) {
  Profile prof = uniform(2);
  prof.host_cores = 2;
  prof.compute_contention = 1.5;  // the older model: ignored once host_contention is there
  prof.host_contention = model({{1, 1.0}, {2, 1.5}}, 0.25);
  // Two stages on one host, each computing 1.5x: f = 1.5, b = 3. Rank 0
  // F0 [0,1.5] F1 [1.5,3]; rank 1 F0 [1.5,3] B0 [3,6] F1 [6,7.5] B1
  // [7.5,10.5]; rank 0 B0 [6,9] B1 [10.5,13.5]. Free collectives, no
  // optimiser: the step is 13.5 plus the pipeline's 0.25.
  SimResult r = simulate(prof, pipeline(2, 2));
  EXPECT_DOUBLE_EQ(r.schedule_seconds, 13.5);
  EXPECT_DOUBLE_EQ(r.stages[1].busy_s, 9.0);
  EXPECT_DOUBLE_EQ(r.step_seconds, 13.75);
  // Each stage alone on its host: factor 1, (M + P - 1) x 3 = 9.
  SimOptions two_hosts;
  two_hosts.rank_host = {0, 1};
  EXPECT_DOUBLE_EQ(simulate(prof, pipeline(2, 2), two_hosts).step_seconds, 9.25);
  // The older model charges every process of the plan, on any host.
  Profile old = prof;
  old.host_contention = HostContention{};
  EXPECT_DOUBLE_EQ(simulate(old, pipeline(2, 2), two_hosts).step_seconds, 13.5);

  // Three stages on a host of one core, M = 2: the schedule alone takes
  // (M + P - 1) x 4.5 = 18, but the host computes 3 x 2 x 4.5 = 27 s on
  // one core (3 processes take the factor of 2, the largest measured).
  Profile three = uniform(3);
  three.host_cores = 1;
  three.host_contention = model({{1, 1.0}, {2, 1.5}}, 0.25);
  EXPECT_DOUBLE_EQ(simulate(three, pipeline(3, 2)).schedule_seconds, 27.0);
  EXPECT_DOUBLE_EQ(simulate(three, pipeline(3, 2)).step_seconds, 27.25);
  three.host_cores = 64;
  EXPECT_DOUBLE_EQ(simulate(three, pipeline(3, 2)).schedule_seconds, 18.0);

  // Data parallelism: two workers, a VN each, 6 x 1.5 = 9; no pipeline
  // term. One process (no --workers) computes at factor 1: 2 VNs, 12.
  PlanSpec dp;
  dp.replicas = 2;
  dp.vn_shares = {1, 1};
  EXPECT_DOUBLE_EQ(simulate(prof, dp).step_seconds, 9.0);
  dp.replicas = 1;
  dp.vn_shares = {2};
  SimOptions alone;
  alone.in_process = true;
  EXPECT_DOUBLE_EQ(simulate(prof, dp, alone).step_seconds, 12.0);
}

TEST(HostContention, FitIsRelativeToTheProfilesOwnFigures) {
  // The profile gives each stage 2 VNs x 3 s = 6 s a step, 12 together.
  // The run measured 8 + 10 = 18: factor 1.5. With it the simulator says
  // 13.5 (SimulatorChargesEachProcessItsHostsFactor); the run's step was
  // 14: 0.5 s a step beyond.
  const Profile prof = uniform(2);
  ColocatedRun run;
  run.plan = pipeline(2, 2);
  run.stage_busy_s = {8.0, 10.0};
  run.step_seconds = 14.0;
  run.label = "2-stage 1f1b";
  HostContention h = fitHostContention(prof, run, {});
  ASSERT_EQ(h.factors.size(), 2u);
  EXPECT_DOUBLE_EQ(h.factors.at(1), 1.0);
  EXPECT_DOUBLE_EQ(h.factors.at(2), 1.5);
  EXPECT_DOUBLE_EQ(h.pipeline_step_s, 0.5);
  EXPECT_EQ(h.measured_on, "2-stage 1f1b");
  // The fitted model predicts the run it was fitted to.
  Profile fitted = prof;
  fitted.host_contention = h;
  EXPECT_DOUBLE_EQ(simulate(fitted, run.plan).step_seconds, 14.0);
  // The profile's older factor plays no part: the fit starts from 1.
  Profile other = prof;
  other.compute_contention = 1.4;
  EXPECT_DOUBLE_EQ(fitHostContention(other, run, {}).factors.at(2), 1.5);
  // Faster than the simulator: no negative terms (factor 1, 0 s).
  run.stage_busy_s = {5.0, 5.0};
  run.step_seconds = 8.0;
  h = fitHostContention(prof, run, {});
  EXPECT_DOUBLE_EQ(h.factors.at(2), 1.0);
  EXPECT_DOUBLE_EQ(h.pipeline_step_s, 0.0);
  // Runs that do not fit.
  run.stage_busy_s = {5.0};
  EXPECT_THROW(fitHostContention(prof, run, {}), InputError);
  run.stage_busy_s = {5.0, 5.0};
  run.step_seconds = 0;
  EXPECT_THROW(fitHostContention(prof, run, {}), InputError);
  run.step_seconds = 8.0;
  run.plan = pipeline(1, 2);
  EXPECT_THROW(fitHostContention(prof, run, {}), InputError);
}

// Several runs: per process count the median of its runs' factors, and
// the median step beyond the simulator's with those factors.
TEST(HostContention, SeveralRunsTakeTheMedianPerProcessCount) {
  const Profile prof = uniform(3);  // a host of 64 cores: no cores bound
  // 2 stages of 1 and 2 layers, M = 2, at factor f: rank 0 F0 [0,f] F1
  // [f,2f]; rank 1 F0 [f,3f] B0 [3f,7f] F1 [7f,9f] B1 [9f,13f]; rank 0 B0
  // [7f,9f] B1 [13f,15f]: a step of 15f; busy 6 + 12 = 18 at f = 1.
  auto two = [](double busy0, double busy1, double step) {
    ColocatedRun r;
    r.plan.stages = 2;
    r.plan.cuts = {0, 1, 3};
    r.plan.vn_shares = {2};
    r.stage_busy_s = {busy0, busy1};
    r.step_seconds = step;
    r.label = "2-stage";
    return r;
  };
  // 2-stage runs of factors 1.5, 2.5 (an odd machine state) and 1.25:
  // the median 1.5 (a step of 22.5).
  ColocatedRun three;
  three.plan = pipeline(3, 2);  // 6 s a stage at factor 1, 18 together
  three.stage_busy_s = {7.0, 7.0, 8.0};  // 22 / 18
  three.step_seconds = 20.0;
  three.label = "3-stage";
  const std::vector<ColocatedRun> runs{two(9, 18, 23.0), three, two(15, 30, 29.0), two(7.5, 15, 22.7)};
  const HostContention h = fitHostContention(prof, runs, {});
  ASSERT_EQ(h.factors.size(), 3u);
  EXPECT_DOUBLE_EQ(h.factors.at(1), 1.0);
  EXPECT_DOUBLE_EQ(h.factors.at(2), 1.5);
  EXPECT_DOUBLE_EQ(h.factors.at(3), 22.0 / 18.0);
  // The 3-stage step at 22/18: (M + P - 1) x 3 x 22/18 = 14.667. Beyond
  // the simulator: 23 - 22.5 = 0.5, 20 - 14.667 = 5.333, 29 - 22.5 = 6.5,
  // 22.7 - 22.5 = 0.2: the median of four, (0.5 + 5.333) / 2.
  const double three_step = 4 * 3 * 22.0 / 18.0;
  EXPECT_NEAR(h.pipeline_step_s, (0.5 + (20.0 - three_step)) / 2, 1e-12);
  EXPECT_EQ(h.measured_on, "2-stage; 3-stage; 2-stage; 2-stage");
  // One run: as fitted alone.
  const HostContention one = fitHostContention(prof, two(9, 18, 23.0), {});
  EXPECT_DOUBLE_EQ(one.factors.at(2), 1.5);
  EXPECT_NEAR(one.pipeline_step_s, 0.5, 1e-12);
  EXPECT_EQ(one.factors.count(3), 0u);
  EXPECT_THROW(fitHostContention(prof, std::vector<ColocatedRun>{}, {}), InputError);
}

// Data-parallel workers all compute at once: on a host of 2 cores, 3 of
// them share the cores (c/k each: the cores bound) and pay their busy
// factor; a 3-stage pipeline on the same host, its stages rarely busy
// together, keeps the per-process-count factor.
TEST(HostContention, DataParallelWorkersAllBusyTakeTheBusyFactor) {
  HostContention h = model({{1, 1.0}, {2, 1.2}, {3, 1.1}}, 0.25);
  h.busy_factors = {{3, 1.5}};
  EXPECT_DOUBLE_EQ(h.busyFactor(1), 1.0);
  EXPECT_DOUBLE_EQ(h.busyFactor(2), 1.2);  // no entry at or below 2: factors'
  EXPECT_DOUBLE_EQ(h.busyFactor(3), 1.5);
  EXPECT_DOUBLE_EQ(h.busyFactor(8), 1.5);  // above the largest: its
  Profile one = uniform(1);  // 3 s a VN
  one.host_cores = 2;
  one.host_contention = h;
  // 3 workers, shares 3 + 3 + 2: 8 VNs x 3 s x 1.5 over 2 cores = 18 s
  // (a worker alone would take 3 x 3 x 1.5 = 13.5); free collectives, no
  // optimiser, no pipeline term.
  PlanSpec dp;
  dp.replicas = 3;
  dp.vn_shares = {3, 3, 2};
  EXPECT_DOUBLE_EQ(simulate(one, dp).step_seconds, 18.0);
  // With the per-process-count factor 1.1: 8 x 3 x 1.1 / 2 = 13.2.
  Profile counts = one;
  counts.host_contention.busy_factors.clear();
  EXPECT_NEAR(simulate(counts, dp).step_seconds, 13.2, 1e-12);
  // A busy factor below the pipelines' is taken as theirs.
  Profile below = one;
  below.host_contention.busy_factors = {{3, 1.05}};
  EXPECT_NEAR(simulate(below, dp).step_seconds, 13.2, 1e-12);
  // 2 workers of a VN each: factor(2) = 1.2, 3.6 s; 4 workers of 2 VNs
  // each: 1.5 (above the largest), 8 x 3 x 1.5 / 2 = 18.
  dp.replicas = 2;
  dp.vn_shares = {1, 1};
  EXPECT_NEAR(simulate(one, dp).step_seconds, 3.6, 1e-12);
  dp.replicas = 4;
  dp.vn_shares = {2, 2, 2, 2};
  EXPECT_DOUBLE_EQ(simulate(one, dp).step_seconds, 18.0);
  // A 3-stage pipeline, M = 2, on the same host: each stage 3 x 1.1 = 3.3
  // a VN, (M + P - 1) x 3.3 = 13.2 (its 19.8 s of compute over 2 cores is
  // less), plus 0.25: the busy factor plays no part.
  Profile three = uniform(3);
  three.host_cores = 2;
  three.host_contention = h;
  EXPECT_NEAR(simulate(three, pipeline(3, 2)).step_seconds, 13.45, 1e-12);
  three.host_contention.busy_factors.clear();
  EXPECT_NEAR(simulate(three, pipeline(3, 2)).step_seconds, 13.45, 1e-12);
}

// The fit: a data-parallel run's step gives its busy factor; the
// pipeline runs give the per-count factors and the step beyond.
TEST(HostContention, FitsTheBusyFactorFromADataParallelRun) {
  Profile prof = uniform(2);  // 6 s a VN through both layers
  prof.host_cores = 2;
  // 3 data-parallel workers, shares 3 + 3 + 2, at factor x: 8 x 6 x x / 2
  // = 24x (a worker alone 18x). A measured 36 s: x = 1.5.
  ColocatedRun dp;
  dp.plan.replicas = 3;
  dp.plan.cuts = {0, 2};
  dp.plan.vn_shares = {3, 3, 2};
  dp.step_seconds = 36.0;
  dp.label = "3 data-parallel workers";
  // The 2-stage run of FitIsRelativeToTheProfilesOwnFigures (18 s of
  // compute where the profile gives 12: 1.5; the simulator then says 13.5,
  // its 12 s over 2 cores being less; the step took 14: 0.5 beyond).
  ColocatedRun pipe;
  pipe.plan = pipeline(2, 2);
  pipe.stage_busy_s = {8.0, 10.0};
  pipe.step_seconds = 14.0;
  pipe.label = "2-stage";
  HostContention h = fitHostContention(prof, std::vector<ColocatedRun>{pipe, dp}, {});
  ASSERT_EQ(h.factors.size(), 2u);
  EXPECT_NEAR(h.factors.at(2), 1.5, 1e-12);
  ASSERT_EQ(h.busy_factors.size(), 1u);
  EXPECT_NEAR(h.busy_factors.at(3), 1.5, 1e-9);
  EXPECT_NEAR(h.pipeline_step_s, 0.5, 1e-12);  // from the pipeline run only
  EXPECT_EQ(h.measured_on, "2-stage; 3 data-parallel workers");
  // The fitted model predicts the run it was fitted to.
  Profile fitted = prof;
  fitted.host_contention = h;
  EXPECT_NEAR(simulate(fitted, dp.plan).step_seconds, 36.0, 1e-8);
  // Runs of 48, 36 and 72 s (x = 2, 1.5 and 3): the median 2 (not the
  // mean, 2.17).
  dp.step_seconds = 48.0;
  ColocatedRun dp2 = dp, dp3 = dp;
  dp2.step_seconds = 36.0;
  dp3.step_seconds = 72.0;
  h = fitHostContention(prof, std::vector<ColocatedRun>{pipe, dp, dp2, dp3}, {});
  EXPECT_NEAR(h.busy_factors.at(3), 2.0, 1e-9);
  // Faster than the simulator at factor 1: 1.
  dp.step_seconds = 20.0;
  EXPECT_DOUBLE_EQ(fitHostContention(prof, std::vector<ColocatedRun>{pipe, dp}, {}).busy_factors.at(3), 1.0);
  // A data-parallel run alone fits nothing.
  EXPECT_THROW(fitHostContention(prof, std::vector<ColocatedRun>{dp}, {}), InputError);
}

// The layers move to the median of the whole-model times taken over the
// calibration; the quantisation inside each backward is per value and
// stays.
TEST(HostContention, WholeModelMedianRescalesTheLayersButNotTheQuantisation) {
  EXPECT_DOUBLE_EQ(wholeModelSeconds({7.0, 6.0, 9.0, 6.5, 100.0}), 7.0);  // one odd timing moves nothing
  EXPECT_DOUBLE_EQ(wholeModelSeconds({4.0, 1.0, 3.0, 2.0}), 2.5);
  EXPECT_THROW(wholeModelSeconds({}), InputError);
  Profile p = handProfile(2, [](size_t l, LayerCost& c) {
    c.forward_s = 1.0 + static_cast<double>(l);
    c.forward_nograd_s = 0.8;
    c.recompute_s = 1.1;
    c.tied_params = l == 1 ? 5 : 0;
  });
  p.quantize_s_per_value = 0.01;
  p.layers[0].backward_s = 2.0 + 0.01 * 10;  // 10 parameters
  p.layers[1].backward_s = 3.0 + 0.01 * 15;  // 10 + 5 tied
  rescaleLayerCompute(p, 1.5);
  EXPECT_DOUBLE_EQ(p.layers[0].forward_s, 1.5);
  EXPECT_DOUBLE_EQ(p.layers[1].forward_s, 3.0);
  EXPECT_DOUBLE_EQ(p.layers[0].forward_nograd_s, 1.2);
  EXPECT_NEAR(p.layers[1].recompute_s, 1.65, 1e-12);
  EXPECT_NEAR(p.layers[0].backward_s, 3.0 + 0.1, 1e-12);
  EXPECT_NEAR(p.layers[1].backward_s, 4.5 + 0.15, 1e-12);
  EXPECT_THROW(rescaleLayerCompute(p, 0.0), InputError);
}

TEST(HostContention, RoundTripsThroughTheProfileAndRefusesBadFactors) {
  Profile p = uniform(2);
  p.host_contention = model({{1, 1.0}, {2, 1.25}}, 0.004);
  const std::string text = profileToJson(p);
  const Profile q = profileFromJson(text, "p.json");
  EXPECT_DOUBLE_EQ(q.host_contention.factor(2), 1.25);
  EXPECT_DOUBLE_EQ(q.host_contention.pipeline_step_s, 0.004);
  EXPECT_EQ(q.host_contention.measured_on, "by hand");
  EXPECT_EQ(profileToJson(q), text);
  EXPECT_TRUE(q.host_contention.busy_factors.empty());  // not written when not measured
  Profile b = p;
  b.host_contention.busy_factors = {{3, 1.4}};
  const std::string busy_text = profileToJson(b);
  EXPECT_DOUBLE_EQ(profileFromJson(busy_text, "p.json").host_contention.busyFactor(3), 1.4);
  EXPECT_EQ(profileToJson(profileFromJson(busy_text, "p.json")), busy_text);
  {
    std::string bad = busy_text;
    const std::string from = "\"3\": 1.4";
    const size_t at = bad.find(from);
    ASSERT_NE(at, std::string::npos);
    try {
      profileFromJson(bad.replace(at, from.size(), "\"3\": 0.5"), "p.json");
      ADD_FAILURE() << "a busy factor below 1 was taken";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("key 'host_contention.busy_factors.3': expected a factor >= 1"),
                std::string::npos)
          << e.what();
    }
  }
  // Without the key: the older model.
  EXPECT_FALSE(profileFromJson(profileToJson(uniform(2)), "p.json").host_contention.measured());
  auto refusal = [&](const std::string& from, const std::string& to) {
    std::string s = text;
    const size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    try {
      profileFromJson(s.replace(at, from.size(), to), "p.json");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(refusal("\"2\": 1.25", "\"2\": 0.9").find("key 'host_contention.factors.2': expected a factor >= 1"),
            std::string::npos);
  EXPECT_NE(refusal("\"1\": 1.0", "\"1\": 1.1").find("key 'host_contention.factors.1'"), std::string::npos);
  EXPECT_NE(refusal("\"2\": 1.25", "\"two\": 1.25").find("key 'host_contention.factors.two'"), std::string::npos);
  EXPECT_NE(refusal("\"pipeline_step_s\"", "\"pipeline_step\"").find("key 'host_contention.pipeline_step_s'"),
            std::string::npos);
}

}  // namespace
}  // namespace morph
