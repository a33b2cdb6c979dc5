// The planner's commands end to end: calibrate a job, plan it, run the plan
// (`--plan auto` and plan files with uneven VN shares) against the
// single-process hash, and refuse bad profiles and impossible caps.
#include "cli_util.h"

#include <map>

namespace {

using namespace morph_test;

// gpt-mini: a tied head across the first and last stage, dropout, AdamW.
const char* kGpt = R"([job]
name = "plan-gpt"
seed = 3
steps = 3
[data]
dataset = "fortunes-char"
seq_len = 16
[model]
name = "gpt-mini"
layers = 2
dim = 16
heads = 2
dropout = 0.1
[batch]
global = 24
virtual_nodes = 6
[optim]
name = "adamw"
lr = 0.003
[eval]
batch = 512
)";

// kGpt with another global batch and VN count.
std::string gptWith(int global, int vns) {
  std::string body = kGpt;
  body.replace(body.find("global = 24"), 11, "global = " + std::to_string(global));
  body.replace(body.find("virtual_nodes = 6"), 17, "virtual_nodes = " + std::to_string(vns));
  return body;
}

// A resources file: `count` fast and `count` slow devices of 4 GiB; `slow`
// is the slow type's speed key.
std::string fastAndSlow(const std::string& slow, int count) {
  const std::string n = "count = " + std::to_string(count) + "\n";
  return "[types.fast]\nmemory_mib = 4096\n[types.slow]\nmemory_mib = 4096\n" + slow +
         "\n[[devices]]\ntype = \"fast\"\n" + n + "[[devices]]\ntype = \"slow\"\n" + n;
}

class PlannerCli : public Cli {
 protected:
  static void SetUpTestSuite() {
    suite_dir_ = fs::temp_directory_path() / ("morph_planner_cli_" + std::to_string(getpid()));
    fs::create_directories(suite_dir_);
  }
  static void TearDownTestSuite() {
    fs::remove_all(suite_dir_);
    profiles_.clear();
  }
  // --plan auto keeps profiles in this test's own cache (not the user's).
  void SetUp() override {
    Cli::SetUp();
    setenv("MORPH_CACHE", out("cache").c_str(), 1);
  }
  void TearDown() override {
    unsetenv("MORPH_CACHE");
    Cli::TearDown();
  }
  // A profile of job file `j`: calibrated once per suite for each job text
  // (a profile depends on the job alone), in the suite's folder.
  std::string profile(const std::string& j) {
    const std::string text = slurp(j);
    const auto known = profiles_.find(text);
    if (known != profiles_.end()) return known->second;
    const std::string p = (suite_dir_ / ("profile-" + std::to_string(profiles_.size()) + ".json")).string();
    const Result r = run("calibrate " + j + " --budget 0.3 --quiet --out " + p);
    EXPECT_EQ(r.code, 0) << r.out;
    profiles_[text] = p;
    return p;
  }
  static inline fs::path suite_dir_;
  static inline std::map<std::string, std::string> profiles_;  // job text -> profile file
  std::string reference(const std::string& j) {
    const Result r = run("run " + j + " --quiet --out " + out("ref"));
    EXPECT_EQ(r.code, 0) << r.out;
    return lastLineHash(r.out);
  }
};

TEST_F(PlannerCli, PlanAutoRunsTheChosenPlanWithTheReferenceHash) {
  const std::string j = job(kGpt);
  const std::string ref = reference(j);
  ASSERT_EQ(ref.size(), 16u);
  // First run: no profile anywhere, so it calibrates, plans for 3 workers
  // and runs the plan; the second finds the profile in the run folder.
  for (int attempt = 0; attempt < 2; ++attempt) {
    const Result r = run("run " + j + " --plan auto --workers 3 --quiet --out " + out("auto"));
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("--plan auto chose"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(attempt == 0 ? "calibrat" : "using the profile"), std::string::npos) << r.out;
    EXPECT_EQ(lastLineHash(r.out), ref) << r.out;
    EXPECT_TRUE(fs::exists(out("auto") + "/plan.json"));
  }
  // A new run folder finds the profile in the cache.
  const Result r = run("run " + j + " --plan auto --workers 2 --quiet --out " + out("auto2"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("using the profile " + out("cache")), std::string::npos) << r.out;
  EXPECT_EQ(lastLineHash(r.out), ref);
}

TEST_F(PlannerCli, PlanFilesFromThePlannerAndUnevenSharesKeepTheHash) {
  const std::string j = job(kGpt);
  const std::string ref = reference(j);
  const std::string p = profile(j);
  // The planner's own file, for 2 workers, run as written.
  Result r = run("plan " + j + " --profile " + p + " --workers 2 --out " + out("plan.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(out("plan.json"));
  const nlohmann::json plan = nlohmann::json::parse(in);
  const int workers = static_cast<int>(plan.at("stages").size()) * plan.at("replicas").get<int>();
  r = run("run " + j + " --plan " + out("plan.json") + " --workers " + std::to_string(workers) + " --quiet --out " +
          out("planned"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(lastLineHash(r.out), ref);
  // Data parallelism with uneven shares (5 + 1 of 6 VNs), and a 2-stage
  // pipeline whose replicas take 4 and 2.
  std::ofstream(out("dp.json")) << R"({"stages": [["embed", "head"]], "replicas": 2, "vn_shares": [5, 1]})";
  r = run("run " + j + " --plan " + out("dp.json") + " --workers 2 --out " + out("dp"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("=[0,5)"), std::string::npos) << r.out;
  EXPECT_EQ(lastLineHash(r.out), ref);
  std::ofstream(out("pp.json")) << R"({"stages": [["embed", "block1"], ["block2", "head"]], "replicas": 2,
      "schedule": "varuna", "recompute": true, "vn_shares": [4, 2]})";
  r = run("run " + j + " --plan " + out("pp.json") + " --workers 4 --quiet --out " + out("pp"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(lastLineHash(r.out), ref);
}

TEST_F(PlannerCli, SimulateAndPlanPrintWhatTheContractSays) {
  const std::string j = job(kGpt);
  const std::string p = profile(j);
  Result r = run("simulate " + j + " --profile " + p + " --stages 2 --workers 2 --schedule varuna --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto sim = nlohmann::json::parse(r.out);
  EXPECT_GT(sim.at("step_seconds").get<double>(), 0.0);
  ASSERT_EQ(sim.at("stages").size(), 2u);
  for (const auto& s : sim.at("stages")) {
    EXPECT_GE(s.at("bubble").get<double>(), 0.0);
    EXPECT_GT(s.at("busy_seconds").get<double>(), 0.0);
    EXPECT_GT(s.at("peak_bytes").get<int64_t>(), 0);
  }
  r = run("plan " + j + " --profile " + p + " --workers 4 --top 3 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto plans = nlohmann::json::parse(r.out);
  EXPECT_GE(plans.at("planning_seconds").get<double>(), 0.0);
  ASSERT_FALSE(plans.at("plans").empty());
  double prev = 0;
  for (const auto& pl : plans.at("plans")) {
    for (const char* k : {"stages", "replicas", "schedule", "recompute", "cuts", "vn_shares", "step_seconds", "peak_bytes"})
      EXPECT_TRUE(pl.contains(k)) << k;
    EXPECT_LE(pl.at("stages").get<int>() * pl.at("replicas").get<int>(), 4);
    EXPECT_GE(pl.at("step_seconds").get<double>(), prev);
    prev = pl.at("step_seconds").get<double>();
  }
}

TEST_F(PlannerCli, BadProfilesAndImpossibleCapsExitTwoNamingTheProblem) {
  const std::string j = job(kGpt);
  const std::string p = profile(j);
  std::ifstream in(p);
  std::stringstream text;
  text << in.rdbuf();
  const std::string good = text.str();
  auto expectRefused = [&](const std::string& args, const std::string& what) {
    const Result r = run(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
    EXPECT_NE(r.out.find(what), std::string::npos) << args << "\n" << r.out;
  };
  // Corrupt: not JSON, and truncated.
  std::ofstream(out("corrupt.json")) << "{\"format\": \"morph-prof";
  expectRefused("plan " + j + " --profile " + out("corrupt.json") + " --workers 2", "corrupt.json: not a profile");
  // A key missing.
  std::string missing = good;
  missing.replace(missing.find("\"step_overhead_s\""), 17, "\"step_overheads\"");
  std::ofstream(out("missing.json")) << missing;
  expectRefused("simulate " + j + " --profile " + out("missing.json"), "key 'step_overhead_s': missing");
  // Foreign: calibrated for another VN size and model (stale after an edit).
  expectRefused("plan " + j + " --profile " + p + " --workers 2 --set batch.virtual_nodes=3",
                "vn_size: profile 4, job 8");
  expectRefused("simulate " + j + " --profile " + p + " --set model.dim=32", "model: profile");
  // No cut fits the cap: refused naming the stage and the shortfall.
  expectRefused("plan " + j + " --profile " + p + " --workers 2 --memory-cap 8", "MiB over the cap");
  expectRefused("run " + j + " --plan auto --workers 2 --memory-cap 8 --out " + out("capped"), "MiB over the cap");
  EXPECT_FALSE(fs::exists(out("capped") + "/metrics.jsonl"));
  // Plan files whose shares, replicas or worker slots do not fit the job.
  std::ofstream(out("sum.json")) << R"({"stages": [["embed", "head"]], "replicas": 2, "vn_shares": [4, 1]})";
  expectRefused("run " + j + " --plan " + out("sum.json") + " --workers 2 --out " + out("x"),
                "key 'vn_shares': the shares add up to 5 VNs, the job has batch.virtual_nodes = 6");
  std::ofstream(out("rep.json")) << R"({"stages": [["embed", "head"]], "replicas": 3})";
  expectRefused("run " + j + " --plan " + out("rep.json") + " --workers 2 --out " + out("x"), "key 'replicas'");
  std::ofstream(out("slots.json")) << R"({"stages": [["embed", "head"]], "replicas": 2, "workers": [1, 1]})";
  expectRefused("run " + j + " --plan " + out("slots.json") + " --workers 2 --out " + out("x"),
                "key 'workers': slot 1 is listed twice");
}

// Heterogeneous devices: a worker twice as slow (emulated) gets fewer VNs
// (9 VNs as 6 + 3), a pipeline over a fast and a slow device is ordered and
// cut for them; the model is the single-process one either way.
TEST_F(PlannerCli, ResourcesGiveSpeedWeightedSharesAndTheReferenceHash) {
  const std::string j = job(gptWith(18, 9));
  const std::string ref = reference(j);
  std::ofstream(out("res.toml")) << fastAndSlow("slowdown = 2.0", 1);
  // Data parallel with the planner's shares (the plan is made for these
  // devices). The profile it plans with is this machine's, edited so that
  // compute dominates (every layer 200x longer, cores that do not
  // contend): then two replicas sharing the VNs by speed beat a two-stage
  // pipeline whatever this machine measured, and the shares are checked
  // on every machine.
  {
    std::ifstream pin(profile(j));
    nlohmann::json prof = nlohmann::json::parse(pin);
    for (auto& l : prof.at("layers"))
      for (const char* k : {"forward_s", "backward_s", "recompute_s", "forward_nograd_s"}) l[k] = l.at(k).get<double>() * 200;
    prof["compute_contention"] = 1.0;
    prof.erase("host_contention");  // the co-located model's factor too
    prof["host_cores"] = 16;
    fs::create_directories(out("het"));
    std::ofstream(out("het") + "/profile.json") << prof.dump();
  }
  Result r = run("run " + j + " --resources " + out("res.toml") + " --plan auto --set batch.global=18 --out " +
                 out("het"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("using the profile " + out("het")), std::string::npos) << r.out;
  EXPECT_EQ(lastLineHash(r.out), ref) << r.out;
  std::ifstream sin(out("het") + "/summary.json");
  const auto summary = nlohmann::json::parse(sin);
  ASSERT_TRUE(summary.contains("plan")) << r.out;
  EXPECT_EQ(summary.at("plan").at("stages").get<int>(), 1) << r.out;
  EXPECT_EQ(summary.at("plan").at("replicas").get<int>(), 2) << r.out;
  EXPECT_EQ(summary.at("vn_shares"), nlohmann::json::parse("[6, 3]")) << r.out;
  // The same shares written by hand, on the same devices.
  std::ofstream(out("dp.json")) << R"({"stages": [["embed", "head"]], "replicas": 2, "vn_shares": [6, 3]})";
  r = run("run " + j + " --resources " + out("res.toml") + " --plan " + out("dp.json") + " --out " + out("dp"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("=[0,6)"), std::string::npos) << r.out;
  EXPECT_EQ(lastLineHash(r.out), ref);
  // A two-device pipeline whose order the planner chose (slow device first).
  std::ofstream(out("pp.json")) << R"({"stages": [["embed", "block1"], ["block2", "head"]], "replicas": 1,
      "workers": [1, 0]})";
  r = run("run " + j + " --resources " + out("res.toml") + " --plan " + out("pp.json") + " --quiet --out " + out("pp"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(lastLineHash(r.out), ref);
  // Refused: a device count that is not the worker count, a device too small.
  r = run("run " + j + " --resources " + out("res.toml") + " --workers 3 --out " + out("bad"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("lists 2 devices, but --workers is 3"), std::string::npos) << r.out;
  std::ofstream(out("tiny.toml")) << "[types.t]\nmemory_mib = 8\n[[devices]]\ntype = \"t\"\ncount = 2\n";
  r = run("run " + j + " --resources " + out("tiny.toml") + " --out " + out("tiny"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("worker slot 0 (type t, 8 MiB) cannot hold the model"), std::string::npos) << r.out;
  r = run("plan " + j + " --profile " + profile(j) + " --resources " + out("tiny.toml"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("the tightest is worker slot"), std::string::npos) << r.out;
}

// Virtual workers: two groups of a fast and a slow device, each in its own
// order, with uneven shares, give the single-process model; `morph plan
// --resources` compares HetPipe's allocation policies with its own choice.
TEST_F(PlannerCli, GroupsOfMixedDevicesKeepTheHashAndPoliciesAreCompared) {
  const std::string j = job(gptWith(36, 9));
  const std::string ref = reference(j);
  std::ofstream(out("res.toml")) << fastAndSlow("slowdown = 2.0", 2);
  // Group 0: fast slot 0 then slow slot 2; group 1: slow slot 3 then fast
  // slot 1. 5 and 4 VNs.
  std::ofstream(out("groups.json")) << R"({"stages": [["embed", "block1"], ["block2", "head"]], "replicas": 2,
      "schedule": "1f1b", "vn_shares": [5, 4], "workers": [0, 2, 3, 1]})";
  Result r = run("run " + j + " --resources " + out("res.toml") + " --plan " + out("groups.json") + " --quiet --out " +
                 out("groups"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(lastLineHash(r.out), ref) << r.out;
  // The comparison table: every policy, and the planner's row last.
  r = run("plan " + j + " --profile " + profile(j) + " --resources " + out("res.toml"));
  ASSERT_EQ(r.code, 0) << r.out;
  const size_t table = r.out.find("allocation policies");
  ASSERT_NE(table, std::string::npos) << r.out;
  for (const char* row : {"\nNP ", "\nED ", "\nHD ", "\nplanner "})
    EXPECT_NE(r.out.find(row, table), std::string::npos) << row << "\n" << r.out;
  r = run("plan " + j + " --profile " + profile(j) + " --resources " + out("res.toml") + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto doc = nlohmann::json::parse(r.out);
  ASSERT_EQ(doc.at("allocations").size(), 4u);
  // One host, so NP is one group of all four devices; ED pairs a fast and
  // a slow device: two groups of two.
  const auto& np = doc.at("allocations").at(0);
  EXPECT_EQ(np.at("policy"), "NP");
  EXPECT_EQ(np.at("plan").at("replicas"), 1);
  EXPECT_EQ(np.at("plan").at("stages"), 4);
  const auto& ed = doc.at("allocations").at(1);
  EXPECT_EQ(ed.at("policy"), "ED");
  EXPECT_EQ(ed.at("plan").at("replicas"), 2);
  EXPECT_EQ(ed.at("plan").at("stages"), 2);
  // The planner's plan is never predicted slower than a policy's.
  const double mine = doc.at("allocations").at(3).at("plan").at("step_seconds").get<double>();
  for (const auto& row : doc.at("allocations"))
    if (row.contains("plan")) {
      EXPECT_LE(mine, row.at("plan").at("step_seconds").get<double>() * (1 + 1e-12)) << row.dump();
    }
}

// Real mixed hardware: a type's per-layer costs come from a profile
// measured on it (here: this machine's profile with every compute time
// tripled).
TEST_F(PlannerCli, ATypesOwnProfileSetsItsSpeed) {
  const std::string j = job(gptWith(36, 9));
  const std::string p = profile(j);
  std::ifstream in(p);
  nlohmann::json slow = nlohmann::json::parse(in);
  for (auto& layer : slow.at("layers"))
    for (const char* k : {"forward_s", "forward_nograd_s", "backward_s", "recompute_s"})
      layer[k] = layer.at(k).get<double>() * 3;
  slow["fingerprint"]["host"]["cpu"] = "a slower machine";
  std::ofstream(out("slow.json")) << slow.dump();
  std::ofstream(out("res.toml")) << fastAndSlow("profile = \"slow.json\"", 1);
  Result r = run("plan " + j + " --profile " + p + " --resources " + out("res.toml") + " --json --top 50");
  ASSERT_EQ(r.code, 0) << r.out;
  bool found = false;
  const auto doc = nlohmann::json::parse(r.out);
  for (const auto& plan : doc.at("plans"))
    if (plan.at("stages") == 1 && plan.at("replicas") == 2) {
      // 9 VNs on a device and one 3x slower: 7 + 2 (max(7, 6) beats 6 + 3's max(6, 9)).
      EXPECT_EQ(plan.at("vn_shares"), nlohmann::json::parse("[7, 2]")) << plan.dump();
      found = true;
    }
  EXPECT_TRUE(found) << r.out;
  // The type is planned with that profile's own per-layer costs, and the
  // output says so.
  EXPECT_NE(doc.at("device_types").at("slow").get<std::string>().find("per-layer costs of its own profile"),
            std::string::npos) << r.out;
  EXPECT_EQ(doc.at("device_types").at("fast"), "the job's profile") << r.out;
  r = run("plan " + j + " --profile " + p + " --resources " + out("res.toml"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("device type slow: compute from per-layer costs of its own profile"), std::string::npos)
      << r.out;
  // A profile of other layers is refused, naming the type's key and the layers.
  const nlohmann::json good = slow;
  slow["fingerprint"]["layers"][0] = "another_layer";
  slow["layers"][0]["name"] = "another_layer";
  std::ofstream(out("slow.json")) << slow.dump();
  r = run("plan " + j + " --profile " + p + " --resources " + out("res.toml"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("key 'types.slow.profile'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("layers: profile 'another_layer"), std::string::npos) << r.out;
  slow = good;
  // A profile of another job is refused, naming the type's key.
  slow["fingerprint"]["vn_size"] = 99;
  std::ofstream(out("slow.json")) << slow.dump();
  r = run("plan " + j + " --profile " + p + " --resources " + out("res.toml"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("key 'types.slow.profile'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("vn_size"), std::string::npos) << r.out;
}

// The emulated link delay belongs to the test harness (morph_crashy's
// MORPH_TEST_PIPE_DELAY_MS, exec/pipeline.h's LinkEmulation): the harness's
// `simulate` counts it on every pipeline message, the shipped binary does
// not read it (nor the MORPH_PIPE_DELAY_MS it once read), and a bad value
// is refused naming the variable.
TEST_F(PlannerCli, EmulatedLinkDelayIsTheHarnessesOnly) {
  const std::string j = job(kGpt);
  const std::string p = profile(j);
  const std::string args = " simulate " + j + " --profile " + p + " --stages 2 --workers 2 --json 2>&1";
  auto shell = [](const std::string& cmd) {
    FILE* f = popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
    const int status = pclose(f);
    return Result{WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
  };
  auto step = [&](const std::string& cmd) {
    const Result r = shell(cmd);
    EXPECT_EQ(r.code, 0) << cmd << "\n" << r.out;
    return r.code == 0 ? nlohmann::json::parse(r.out).at("step_seconds").get<double>() : -1.0;
  };
  const std::string crashy = MORPH_CRASHY_BINARY;
  const double plain = step(crashy + args);
  const double delayed = step("MORPH_TEST_PIPE_DELAY_MS=50:10 " + crashy + args);
  const double shipped = step("MORPH_TEST_PIPE_DELAY_MS=50 MORPH_PIPE_DELAY_MS=50 " + std::string(MORPH_BINARY) + args);
  // 2 stages: at least one activation and one gradient message of a step
  // lie on its critical path, 50 ms each.
  EXPECT_GE(delayed, plain + 0.1);
  EXPECT_DOUBLE_EQ(shipped, plain);
  const Result bad = shell("MORPH_TEST_PIPE_DELAY_MS=5ms " + crashy + args);
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("MORPH_TEST_PIPE_DELAY_MS (MEAN[:JITTER] ms) '5ms'"), std::string::npos) << bad.out;
}

}  // namespace
