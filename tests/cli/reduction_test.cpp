// The exact reduction across real worker processes (real c10d/Gloo): a
// model split into several all-reduce buckets, the overflow redo and the
// non-finite stop on more than one worker, and in a pipeline.
#include "cli_util.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

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

// An unknown exact wire is refused before any worker starts: exit 2
// naming the variable and the value.
TEST_F(Cli, UnknownExactWireExitsTwoNamingIt) {
  ScopedEnv w_env("MORPH_EXACT_WIRE", "ring9");
  Result r = run("run " + job(kRedoJob) + " --quiet --workers 2 --out " + out("bad"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("MORPH_EXACT_WIRE: 'ring9' is not one of auto, sharded, allreduce"), std::string::npos) << r.out;
}

}  // namespace
