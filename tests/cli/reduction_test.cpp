// The exact reduction across real worker processes (real c10d/Gloo): a
// model split into several all-reduce buckets, the overflow redo and the
// non-finite stop on more than one worker, and in a pipeline.
#include "cli_util.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/checkpoint_store.h"

namespace {

using namespace morph_test;

// headroom_bits = 0: the gradient maximum may not grow between steps
// without a redo, and it does here (steps 1 and 2 run twice). 12 VNs of 8
// samples.
const char* kRedoJob = R"([job]
name = "redo"
seed = 5
steps = 3
[data]
dataset = "synthetic"
train_size = 300
test_size = 40
[model]
name = "mlp"
hidden = [24]
[batch]
global = 96
virtual_nodes = 12
[optim]
lr = 0.05
momentum = 0.9
[reduce]
headroom_bits = 0
)";

std::vector<int> attemptsOf(const std::string& out_dir) {
  std::vector<int> a;
  std::ifstream m(out_dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(m, line)) {
    auto l = nlohmann::json::parse(line);
    if (l.contains("attempts")) a.push_back(l["attempts"].get<int>());
  }
  return a;
}

// Sets an environment variable for the processes a test starts (`morph run`
// passes it on to its workers) and restores it afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old, had_ = true;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_, old_.c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

// Every parameter tensor in a bucket of its own (MORPH_BUCKET_BYTES = 256;
// the default puts this model in one), buckets started during the last VN's
// backward, and steps redone with buckets already in flight: the same hash
// and the same redos as the single process with the default buckets, on 1 to
// 4 workers (12 VNs: 12, 6+6, 4+4+4, 3+3+3+3) and in a pipeline, over both
// exact wires (MORPH_EXACT_WIRE: Gloo's int64 all-reduce, and the sharded
// sum for every bucket, however small).
TEST_F(Cli, SeveralBucketsAndRedosSameHashOnAnyWorkerCountAndPipeline) {
  const std::string j = job(kRedoJob);
  Result ref = run("run " + j + " --quiet --out " + out("ref"));
  ASSERT_EQ(ref.code, 0) << ref.out;
  const std::string want = lastLineHash(ref.out);
  const std::vector<int> want_attempts = attemptsOf(out("ref"));
  ASSERT_EQ(want_attempts, (std::vector<int>{1, 2, 2}));  // the job does redo
  ScopedEnv small("MORPH_BUCKET_BYTES", "256");
  for (const char* wire : {"allreduce", "sharded"}) {
    ScopedEnv w_env("MORPH_EXACT_WIRE", wire);
    for (int w = std::string(wire) == "sharded" ? 2 : 1; w <= 4; ++w) {
      const std::string o = out(std::string(wire) + "-w" + std::to_string(w));
      Result r = run("run " + j + " --quiet --workers " + std::to_string(w) + " --out " + o);
      ASSERT_EQ(r.code, 0) << r.out;
      EXPECT_EQ(lastLineHash(r.out), want) << w << " workers, " << wire << ":\n" << r.out;
      EXPECT_EQ(attemptsOf(o), want_attempts) << w << " workers, " << wire;
    }
    // The same redos in a pipeline of 2 stages x 2 replicas: each stage's
    // segments reduced among its replicas, the flags over every rank.
    Result p = run("run " + j + " --quiet --stages 2 --workers 4 --out " + out(std::string(wire) + "-p"));
    ASSERT_EQ(p.code, 0) << p.out;
    EXPECT_EQ(lastLineHash(p.out), want) << "2 stages x 2 replicas, " << wire << ":\n" << p.out;
    EXPECT_EQ(attemptsOf(out(std::string(wire) + "-p")), want_attempts) << "2 stages x 2 replicas, " << wire;
  }
}

// A learning rate that blows the model up: a non-finite gradient on any
// worker stops the whole job with exit code 3 at the step where the single
// process stops (step 4), the steps before it committed; on 3 workers with
// each exact wire.
TEST_F(Cli, NonFiniteGradientStopsSeveralWorkers) {
  std::string body = kRedoJob;
  body.replace(body.find("steps = 3"), 9, "steps = 12");
  body.replace(body.find("lr = 0.05"), 9, "lr = 1e6");
  const std::string j = job(body);
  // 3 workers over both exact wires (MORPH_EXACT_WIRE; "auto" keeps this
  // small model on the int64 all-reduce, "sharded" shards every bucket).
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "auto"}, {" --workers 3", "auto"}, {" --workers 3", "sharded"}};
  for (const auto& [workers, wire] : cases) {
    ScopedEnv w_env("MORPH_EXACT_WIRE", wire.c_str());
    const std::string o = out("w" + std::to_string(workers.size()) + wire);
    Result r = run("run " + j + " --quiet" + workers + " --out " + o);
    EXPECT_EQ(r.code, 3) << workers << " " << wire << ":\n" << r.out;
    EXPECT_NE(r.out.find("non-finite gradient (Inf or NaN) at step 4"), std::string::npos) << r.out;
    EXPECT_EQ(attemptsOf(o).size(), 4u) << workers << ": steps 0-3 committed";
  }
  // Float mode on 3 workers reads the flag from the summed buffer (no MAX
  // all-reduce): it stops too, with the steps before the reported one
  // committed (its own step: float sums are another computation).
  const std::string o = out("float3");
  Result r = run("run " + j + " --quiet --workers 3 --set reduce.mode=float --out " + o);
  EXPECT_EQ(r.code, 3) << r.out;
  const std::string key = "non-finite gradient (Inf or NaN) at step ";
  const size_t at = r.out.find(key);
  ASSERT_NE(at, std::string::npos) << r.out;
  const size_t step = std::stoul(r.out.substr(at + key.size()));
  EXPECT_LT(step, 12u) << r.out;
  EXPECT_EQ(attemptsOf(o).size(), step) << r.out;
}

// Float mode (reduce.mode = "float": a float all-reduce, no bitwise
// promise) on several workers and in pipelines against the single float
// process: the loss of every step and the parameters after the last step
// agree up to what float summation in another order can change. Per step,
// every summed value of V VN contributions is within (V - 1) x 2^-24 of
// the sum of their magnitudes whatever the order; a step's update moves
// the parameters by lr x that over the batch, and the next steps carry the
// difference on. Over K steps the test allows a relative difference of
// K x V x 2^-24 x 64 (a 64x margin for the growth through the steps:
// 9.2e-4 for K = 20, V = 12); the differences measured are below 1e-5,
// and a sum that drops one worker's share is off by more than 1e-2 from
// the first step on.
TEST_F(Cli, FloatModeOnSeveralWorkersAndPipelinesMatchesTheFloatProcess) {
  const int K = 20, V = 12;
  std::string body = kRedoJob;
  body.replace(body.find("steps = 3"), 9, "steps = " + std::to_string(K));
  body.replace(body.find("hidden = [24]"), 13, "hidden = [32, 32]");
  body.replace(body.find("headroom_bits = 0"), 17, "mode = \"float\"");
  body += "[checkpoint]\nevery = " + std::to_string(K) + "\n";
  const std::string j = job(body);
  const double tol = K * V * std::ldexp(1.0, -24) * 64;
  auto losses = [](const std::string& dir) {
    std::vector<double> l;
    std::ifstream m(dir + "/metrics.jsonl");
    std::string line;
    while (std::getline(m, line)) l.push_back(nlohmann::json::parse(line).at("loss").get<double>());
    return l;
  };
  auto finalState = [&](const std::string& dir) {
    morph::PosixFileSystem fs;
    return morph::loadCheckpoint(dir + "/checkpoints/" + morph::checkpointDirName(K), fs);
  };
  Result ref = run("run " + j + " --quiet --out " + out("ref"));
  ASSERT_EQ(ref.code, 0) << ref.out;
  const std::vector<double> want_loss = losses(out("ref"));
  ASSERT_EQ(want_loss.size(), static_cast<size_t>(K));
  const morph::CheckpointData want = finalState(out("ref"));
  ASSERT_GE(want.layers.size(), 3u);  // three stages need three layers
  const std::vector<std::string> runs = {"--workers 2", "--workers 3", "--stages 2", "--stages 3",
                                         "--stages 2 --workers 4"};
  for (size_t i = 0; i < runs.size(); ++i) {
    const std::string& how = runs[i];
    const std::string dir = out("run" + std::to_string(i));
    Result r = run("run " + j + " --quiet " + how + " --out " + dir);
    ASSERT_EQ(r.code, 0) << how << ":\n" << r.out;
    const std::vector<double> got_loss = losses(dir);
    ASSERT_EQ(got_loss.size(), want_loss.size()) << how;
    double worst_loss = 0, worst_param = 0;
    for (size_t k = 0; k < want_loss.size(); ++k) {
      const double d = std::abs(got_loss[k] - want_loss[k]) / std::abs(want_loss[k]);
      worst_loss = std::max(worst_loss, d);
      EXPECT_LE(d, tol) << how << ": the loss of step " << k << " is " << got_loss[k] << ", the single process's "
                        << want_loss[k];
    }
    const morph::CheckpointData got = finalState(dir);
    ASSERT_EQ(got.step, want.step) << how;
    ASSERT_EQ(got.layers.size(), want.layers.size()) << how;
    for (size_t l = 0; l < want.layers.size(); ++l) {
      const auto& [name, tensors] = want.layers[l];
      ASSERT_EQ(got.layers[l].first, name) << how;
      ASSERT_EQ(got.layers[l].second.size(), tensors.size()) << how << " " << name;
      for (size_t t = 0; t < tensors.size(); ++t) {
        const auto& [tname, w] = tensors[t];
        if (tname.rfind("param/", 0) != 0) continue;
        const torch::Tensor& g = got.layers[l].second[t].second;
        ASSERT_TRUE(g.sizes().equals(w.sizes())) << how << " " << name << "/" << tname;
        const double scale = w.abs().max().item<double>();
        const double d = (g - w).abs().max().item<double>() / scale;
        worst_param = std::max(worst_param, d);
        EXPECT_LE(d, tol) << how << ": " << name << "/" << tname << " differs by " << d << " of its largest value";
      }
    }
    std::printf("float, %s: largest relative difference from the single float process: loss %.3g, parameters %.3g "
                "(allowed %.3g)\n", how.c_str(), worst_loss, worst_param, tol);
  }
}

// An unknown exact wire is refused before any worker starts: exit 2
// naming the variable and the value.
TEST_F(Cli, UnknownExactWireExitsTwoNamingIt) {
  ScopedEnv w_env("MORPH_EXACT_WIRE", "ring9");
  Result r = run("run " + job(kRedoJob) + " --quiet --workers 2 --out " + out("bad"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("MORPH_EXACT_WIRE: 'ring9' is not one of auto, sharded, allreduce"), std::string::npos) << r.out;
}

}  // namespace
