// The planner (memory caps, pruning, infeasible pools) and the profile
// format (round trip, refusals naming the file and the key).
#include "plan/planner.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "core/error.h"

namespace morph {
namespace {

Profile randomProfile(std::mt19937& rng, size_t layers) {
  std::uniform_real_distribution<double> t(0.001, 0.02);
  std::uniform_int_distribution<int64_t> sz(1 << 12, 1 << 22);
  Profile p;
  p.host_cores = 64;
  p.fingerprint.reduce_mode = "exact";
  p.runtime_bytes = 64 << 20;
  p.input_bytes = 1 << 16;
  for (size_t l = 0; l < layers; ++l) {
    LayerCost c;
    c.name = "l" + std::to_string(l);
    c.forward_s = c.forward_nograd_s = c.recompute_s = t(rng);
    c.backward_s = 2 * c.forward_s;
    c.output_bytes = sz(rng);
    c.params = sz(rng) / 4;
    c.param_bytes = 4 * c.params;
    c.optimizer_bytes = 8 * c.params;
    c.activation_bytes = sz(rng) * 4;
    p.layers.push_back(c);
    p.fingerprint.layers.push_back(c.name);
  }
  p.p2p = LinearFit{5e-5, 1e-9, {}};
  p.allreduce_exact[2] = LinearFit{1e-4, 2e-9, {}};
  p.allreduce_float[2] = LinearFit{1e-4, 1e-9, {}};
  p.allreduce_max[2] = LinearFit{5e-5, 0, {}};
  p.optimizer_s_per_param = 1e-9;
  return p;
}

TEST(Planner, NeverReturnsAPlanOverTheMemoryCap) {
  std::mt19937 rng(7);
  int capped = 0, refused = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const Profile p = randomProfile(rng, 2 + static_cast<size_t>(trial % 7));
    PlanRequest rq;
    rq.workers = 1 + trial % 6;
    rq.virtual_nodes = 4 + trial % 9;
    rq.top_k = 50;
    // From hopeless to roomy, around the single-worker footprint.
    const int64_t whole = simulate(p, {1, 1, {}, ScheduleKind::k1F1B, false, {rq.virtual_nodes}, {}}).stages[0].peak_bytes;
    rq.memory_cap_bytes = static_cast<int64_t>(static_cast<double>(whole) * (0.3 + 0.1 * (trial % 10)));
    try {
      const PlanOutcome out = planJob(p, rq);
      ASSERT_FALSE(out.plans.empty());
      for (const PlanChoice& c : out.plans) {
        EXPECT_LE(c.plan.stages * c.plan.replicas, rq.workers);
        for (const StageSim& s : c.sim.stages) EXPECT_LE(s.peak_bytes, rq.memory_cap_bytes);
        int64_t vns = 0;
        for (int64_t s : c.plan.vn_shares) vns += s;
        EXPECT_EQ(vns, rq.virtual_nodes);
      }
      for (size_t i = 1; i < out.plans.size(); ++i)
        EXPECT_LE(out.plans[i - 1].sim.step_seconds, out.plans[i].sim.step_seconds);
      ++capped;
    } catch (const InputError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("MiB over the cap"), std::string::npos) << msg;
      EXPECT_TRUE(msg.find("stage") != std::string::npos || msg.find("one worker holding") != std::string::npos)
          << msg;
      ++refused;
    }
  }
  EXPECT_GT(capped, 10);
  EXPECT_GT(refused, 5);
}

TEST(Planner, PruningKeepsTheBestPlan) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    const Profile p = randomProfile(rng, 3 + static_cast<size_t>(trial % 6));
    PlanRequest rq;
    rq.workers = 2 + trial % 7;
    rq.virtual_nodes = 8;
    rq.top_k = 1;
    const PlanOutcome pruned = planJob(p, rq);
    rq.top_k = 1 << 20;  // never full: every candidate is simulated
    const PlanOutcome all = planJob(p, rq);
    EXPECT_EQ(all.simulated, all.candidates);
    EXPECT_LE(pruned.simulated, all.simulated);
    EXPECT_DOUBLE_EQ(pruned.plans.front().sim.step_seconds, all.plans.front().sim.step_seconds);
  }
}

TEST(Planner, CutsByCostNotByLayerCount) {
  // One heavy layer among light ones: an equal-count split of 4 layers in
  // 2 stages puts the heavy layer with another; the planner isolates it.
  std::mt19937 rng(3);
  Profile p = randomProfile(rng, 4);
  for (auto& l : p.layers) l.forward_s = l.forward_nograd_s = l.recompute_s = 0.01, l.backward_s = 0.02;
  p.layers[0].forward_s = 0.05, p.layers[0].backward_s = 0.1;
  PlanRequest rq;
  rq.workers = 2;
  rq.virtual_nodes = 16;
  rq.max_stages = 2;
  rq.top_k = 50;
  const PlanOutcome out = planJob(p, rq);
  bool saw = false;
  for (const PlanChoice& c : out.plans)
    if (c.plan.stages == 2) {
      EXPECT_EQ(c.plan.cuts, (std::vector<size_t>{0, 1, 4}));
      saw = true;
    }
  EXPECT_TRUE(saw);
}

TEST(Planner, NamesTheLayerThatFitsNowhere) {
  std::mt19937 rng(5);
  Profile p = randomProfile(rng, 3);
  p.layers[1].params = int64_t{1} << 28;  // 1 GiB of parameters
  p.layers[1].param_bytes = 4 * p.layers[1].params;
  PlanRequest rq;
  rq.workers = 3;
  rq.virtual_nodes = 6;
  rq.memory_cap_bytes = int64_t{512} << 20;
  try {
    planJob(p, rq);
    FAIL() << "a 1 GiB layer cannot fit 512 MiB";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("layer l1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("MiB over the cap"), std::string::npos) << msg;
  }
}

Profile sampleProfile() {
  std::mt19937 rng(1);
  Profile p = randomProfile(rng, 3);
  p.layers[2].tied_params = 12;
  p.layers[2].tied_owner = 0;
  p.fingerprint.model = "mlp hidden=8 dropout=0";
  p.fingerprint.dataset = "synthetic";
  p.fingerprint.vn_size = 8;
  p.fingerprint.optimizer = "sgd";
  p.fingerprint.cpu = "cpu";
  p.fingerprint.blas = "openblas";
  p.fingerprint.torch = "1.13";
  p.p2p.samples = {{1000, 1e-4}, {4000, 2e-4}};
  return p;
}

TEST(Profile, RoundTripsThroughJson) {
  const Profile p = sampleProfile();
  const Profile q = profileFromJson(profileToJson(p), "p.json");
  EXPECT_EQ(profileToJson(q), profileToJson(p));
  EXPECT_EQ(q.layers[2].tied_owner, 0);
  EXPECT_TRUE(fingerprintDifferences(p.fingerprint, q.fingerprint).empty());
}

TEST(Profile, RefusesBadFilesNamingTheKey) {
  auto refusal = [](const std::string& text) {
    try {
      profileFromJson(text, "prof.json");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string good = profileToJson(sampleProfile());
  EXPECT_NE(refusal("{not json").find("prof.json: not a profile"), std::string::npos);
  EXPECT_NE(refusal(good.substr(0, good.size() / 2)).find("prof.json"), std::string::npos);
  auto edit = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  EXPECT_NE(refusal(edit("\"version\": 1", "\"version\": 9")).find("key 'version': profile version 9"),
            std::string::npos);
  EXPECT_NE(refusal(edit("\"backward_s\"", "\"backwards\"")).find("key 'layers[0].backward_s': missing"),
            std::string::npos);
  EXPECT_NE(refusal(edit("\"host_cores\": 64", "\"host_cores\": \"two\"")).find("key 'host_cores'"),
            std::string::npos);
  EXPECT_NE(refusal(edit("\"tied_owner\": 0", "\"tied_owner\": 7")).find("layers[2].tied_owner"),
            std::string::npos);
}

TEST(Profile, MismatchNamesEachDifference) {
  const Profile p = sampleProfile();
  Fingerprint job = p.fingerprint;
  EXPECT_NO_THROW(checkProfileMatches(p, job, "prof.json"));
  job.vn_size = 16;
  job.reduce_mode = "float";
  try {
    checkProfileMatches(p, job, "prof.json");
    FAIL();
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("prof.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find("vn_size: profile 8, job 16"), std::string::npos) << msg;
    EXPECT_NE(msg.find("reduce_mode: profile 'exact', job 'float'"), std::string::npos) << msg;
  }
}

TEST(Profile, FitsALineThroughSamples) {
  const LinearFit f = fitLine({{0, 1.0}, {10, 2.0}, {20, 3.0}});
  EXPECT_NEAR(f.latency_s, 1.0, 1e-12);
  EXPECT_NEAR(f.seconds_per_byte, 0.1, 1e-12);
  EXPECT_NEAR(f.at(30), 4.0, 1e-12);
}

}  // namespace
}  // namespace morph
