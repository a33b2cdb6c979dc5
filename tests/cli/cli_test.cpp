// End-to-end tests of the `morph` binary: real processes, real c10d/Gloo.
#include "cli_util.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace {

using namespace morph_test;

const char* kJob = R"([job]
name = "cli"
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
global = 36
virtual_nodes = 12
[optim]
lr = 0.05
momentum = 0.9
clip_norm = 5.0
)";

// kJob reading Fashion-MNIST from `path`.
std::string fashionJob(const std::string& path) {
  std::string body = kJob;
  const std::string synthetic = "dataset = \"synthetic\"\ntrain_size = 300\ntest_size = 40";
  body.replace(body.find(synthetic), synthetic.size(), "dataset = \"fashion-mnist\"\npath = \"" + path + "\"");
  return body;
}



TEST_F(Cli, RunWritesOutputsAndIsRepeatable) {
  std::string j = job(kJob);
  Result a = run("run " + j + " --out " + out("a"));
  ASSERT_EQ(a.code, 0) << a.out;
  Result b = run("run " + j + " --out " + out("b"));
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_EQ(lastLineHash(a.out), lastLineHash(b.out));
  nlohmann::json s = nlohmann::json::parse(std::ifstream(out("a") + "/summary.json"));
  EXPECT_EQ(s["model_hash"], lastLineHash(a.out));
  EXPECT_EQ(s["steps"], 3);
  EXPECT_EQ(s["virtual_nodes"], 12);
  EXPECT_EQ(s["reduce_mode"], "exact");
  for (const char* k : {"global_batch", "workers", "stages", "test_accuracy", "test_loss", "final_loss",
                        "samples_per_second", "wall_seconds", "peak_rss_bytes", "resizes"})
    EXPECT_TRUE(s.contains(k)) << k;
  std::ifstream m(out("a") + "/metrics.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(m, line)) {
    auto l = nlohmann::json::parse(line);
    EXPECT_EQ(l["step"], lines);
    for (const char* k : {"loss", "lr", "samples_per_second", "workers", "generation"})
      EXPECT_TRUE(l.contains(k)) << k;
    ++lines;
  }
  EXPECT_EQ(lines, 3);
}

// The central promise: the number of workers changes only speed. 12 VNs
// over 1..4 workers (uneven splits at 5 VNs... and 3+3+3+3 etc.), compared
// with the single-process engine.
TEST_F(Cli, HashIdenticalForAnyWorkerCount) {
  std::string mlp = job(kJob, "mlp.toml");
  std::string cnn_body = kJob;
  cnn_body.replace(cnn_body.find("name = \"mlp\"\nhidden = [24]"), 26,
                   "name = \"cnn\"\nchannels = [4, 8]\nfc = 16");
  std::string cnn = job(cnn_body, "cnn.toml");
  for (const std::string& j : {mlp, cnn}) {
    Result ref = run("run " + j + " --quiet --out " + out("ref"));
    ASSERT_EQ(ref.code, 0) << ref.out;
    const std::string want = lastLineHash(ref.out);
    ASSERT_EQ(want.size(), 16u);
    for (int w = 1; w <= 4; ++w) {
      Result r = run("run " + j + " --quiet --workers " + std::to_string(w) + " --out " +
                     out("w" + std::to_string(w)));
      ASSERT_EQ(r.code, 0) << r.out;
      EXPECT_EQ(lastLineHash(r.out), want) << j << " with " << w << " workers:\n" << r.out;
    }
  }
}

// The same for the character-level transformer on the fortunes corpus.
TEST_F(Cli, GptMiniHashIdenticalForAnyWorkerCount) {
  std::string j = job(R"([job]
seed = 2
steps = 3
[data]
dataset = "fortunes-char"
seq_len = 16
[model]
name = "gpt-mini"
layers = 1
dim = 16
heads = 2
dropout = 0.1
[batch]
global = 24
virtual_nodes = 6
[optim]
name = "adamw"
lr = 0.003
clip_norm = 1.0
[eval]
batch = 512
)", "gpt.toml");
  Result ref = run("run " + j + " --quiet --out " + out("ref"));
  ASSERT_EQ(ref.code, 0) << ref.out;
  for (int w = 2; w <= 3; ++w) {
    Result r = run("run " + j + " --quiet --workers " + std::to_string(w) + " --out " + out("w" + std::to_string(w)));
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(lastLineHash(r.out), lastLineHash(ref.out)) << w << " workers";
  }
  nlohmann::json s = nlohmann::json::parse(std::ifstream(out("ref") + "/summary.json"));
  EXPECT_GT(s["test_loss"].get<double>(), 0.0);
}

TEST_F(Cli, FloatModeRunsOnSeveralWorkers) {
  std::string j = job(kJob);
  Result r = run("run " + j + " --quiet --workers 2 --set reduce.mode=float --out " + out("f"));
  ASSERT_EQ(r.code, 0) << r.out;
  nlohmann::json s = nlohmann::json::parse(std::ifstream(out("f") + "/summary.json"));
  EXPECT_EQ(s["reduce_mode"], "float");
  EXPECT_EQ(s["workers"], 2);
}

// `morph` is a front without libtorch (src/cli/front_main.cpp): it answers
// by itself what needs no training engine and execs `morph-engine`, the
// binary beside it, for everything else. A copy of the front alone in a
// folder shows which is which: what it answers alone is what the build's
// pair answers, byte for byte; what trains fails naming the missing engine.
TEST_F(Cli, FrontAnswersWithoutTheEngineAndHandsTheRestOver) {
  const fs::path alone = dir_ / "front-alone";
  fs::create_directories(alone);
  fs::copy_file(MORPH_BINARY, alone / "morph");
  const std::string front = (alone / "morph").string();
  auto shell = [](const std::string& cmd) {
    FILE* p = popen(("env -u MORPH_TOKEN " + cmd + " 2>&1").c_str(), "r");
    std::string out;
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    const int status = pclose(p);
    return Result{WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
  };
  const Result ldd = shell("ldd " + front);
  EXPECT_EQ(ldd.code, 0) << ldd.out;
  EXPECT_EQ(ldd.out.find("libtorch"), std::string::npos) << ldd.out;
  EXPECT_EQ(ldd.out.find("libc10"), std::string::npos) << ldd.out;

  const std::string good = job(kJob);
  const std::string unknown = job(std::string(kJob) + "[eval]\neverry = 3\n", "unknown.toml");
  const std::vector<std::pair<std::string, int>> answered = {
      {"--help", 0},
      {"run", 2},                                       // no job file
      {"run " + unknown, 2},                            // a refused job file
      {"run " + good + " --workers 2 --heartbeat-interval 2 --heartbeat-timeout 1", 2},
      {"worker --join nonsense", 2},
      {"worker --join 127.0.0.1:1", 2},                 // no token
      {"status --join 127.0.0.1:1", 2},                 // the client commands: no token
      {"resize --join 127.0.0.1:1 --workers 2", 2},
      {"slow --join 127.0.0.1:1 --worker 0 --factor 2", 2},
  };
  for (const auto& [args, code] : answered) {
    Result a = shell(front + " " + args);
    const Result pair = shell(std::string(MORPH_BINARY) + " " + args);
    for (size_t at; (at = a.out.find(front)) != std::string::npos;) a.out.replace(at, front.size(), MORPH_BINARY);
    EXPECT_EQ(a.code, code) << args << "\n" << a.out;
    EXPECT_EQ(a.code, pair.code) << args;
    EXPECT_EQ(a.out, pair.out) << args;
  }
  const Result train = shell(front + " run " + good + " --steps 1 --quiet");
  EXPECT_EQ(train.code, 3) << train.out;
  EXPECT_NE(train.out.find("cannot start the training engine " + (alone / "morph-engine").string()), std::string::npos)
      << train.out;
}

TEST_F(Cli, BadInputExitsTwoNamingTheProblem) {
  struct Case {
    std::string args, expect;
  };
  std::string good = job(kJob);
  std::string unknown = job(std::string(kJob) + "[eval]\neverry = 3\n", "unknown.toml");
  std::string badtype = job(std::string(kJob) + "[eval]\nevery = \"often\"\n", "badtype.toml");
  std::vector<Case> cases = {
      {"run " + unknown, "eval.everry"},
      {"run " + badtype, "eval.every"},
      {"run " + good + " --set batch.virtual_nodes=7", "batch.virtual_nodes"},
      {"run " + (dir_ / "missing.toml").string(), "missing.toml"},
      {"run " + good + " --set model.name=cnn", "model.hidden"},
      {"run " + job(fashionJob("/nope"), "nope.toml"), "/nope/train-images-idx3-ubyte.gz"},
      {"run " + good + " --workers 13", "--workers 13"},
      {"run " + good + " --workers x", "--workers"},
      {"worker --join nonsense", "HOST:PORT"},
      {"worker --join 127.0.0.1:12abc", "HOST:PORT"},
      {"worker --join 127.0.0.1:70000", "HOST:PORT"},
      {"run " + good + " --workers 2 --heartbeat-interval 2 --heartbeat-timeout 1", "--heartbeat-interval"},
      {"worker --join 127.0.0.1:1 --connect-timeout 1", "missing job token"},
      {"worker --join 127.0.0.1:1 --connect-timeout 1 --token-file " + good, "cannot reach the manager"},
  };
  for (const auto& c : cases) {
    Result r = run(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << c.args << "\n" << r.out;
  }
}

// Issue 13, "bad values everywhere": sizes that cannot fit this machine,
// numbers with trailing garbage, impossible resize targets, IDX images of
// the wrong shape. Each exits 2 before any work, naming the key, flag or file.
TEST_F(Cli, ImpossibleValuesExitTwoNamingTheKey) {
  struct Case {
    std::string args, expect;
  };
  const std::string good = job(kJob) + " --out " + out("bad");
  const std::string resize = "resize --join 127.0.0.1:1 --token-file " + job(kJob) + " --workers ";
  std::vector<Case> cases = {
      // 1M x 1M weights: terabytes, on any machine.
      {"run " + good + " --set 'model.hidden=[1048576, 1048576]'", "model.hidden: the job needs at least"},
      {"run " + good + " --workers 2 --set 'model.hidden=[1048576, 1048576]'", "available (MemAvailable"},
      // 12 local workers x 74 GiB of synthetic images.
      {"run " + good + " --workers 12 --set data.train_size=100000000", "data.train_size"},
      {"run " + good + " --set data.train_size=1e8", "data.train_size"},
      {"run " + good + " --set data.train_size=-1", "data.train_size"},
      {"run " + good + " --steps 12abc", "--steps"},
      {"run " + good + " --workers 2 --heartbeat-interval 1 --heartbeat-timeout 1", "--heartbeat-interval"},
      {"run " + good + " --heartbeat-interval 3 --heartbeat-timeout 2", "--heartbeat-interval"},
      {"run " + good + " --heartbeat-interval 1x", "--heartbeat-interval"},
      {resize + "0", "--workers"},
      {resize + "-3", "--workers"},
      {resize + "x", "--workers"},
      {resize + "12abc", "--workers"},
      {resize + "5000", "--workers"},
      {"calibrate " + job(kJob) + " --set 'model.hidden=[1048576, 1048576]'", "model.hidden"},
  };
  for (const auto& c : cases) {
    Result r = run(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << c.args << "\n" << r.out;
  }
  // Environment settings are numbers too.
  setenv("MORPH_BUCKET_BYTES", "25M", 1);
  Result r = run("run " + job(kJob) + " --quiet --out " + out("env"));
  unsetenv("MORPH_BUCKET_BYTES");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("MORPH_BUCKET_BYTES '25M'"), std::string::npos) << r.out;
}

TEST_F(Cli, FashionImagesOfAnotherShapeExitTwoNamingTheFile) {
  fs::create_directories(dir_ / "fm");
  auto idx = [&](const std::string& file, std::vector<uint32_t> dims, size_t payload) {
    std::string h = {0, 0, 8, static_cast<char>(dims.size())};
    for (uint32_t d : dims)
      for (int s = 24; s >= 0; s -= 8) h += static_cast<char>(d >> s);
    std::ofstream((dir_ / "fm" / file).string(), std::ios::binary) << h << std::string(payload, '\x01');
  };
  idx("train-images-idx3-ubyte.gz", {64, 28, 28}, 64 * 28 * 28);
  idx("train-labels-idx1-ubyte.gz", {64}, 64);
  idx("t10k-images-idx3-ubyte.gz", {16, 32, 32}, 16 * 32 * 32);  // not the training split's 28x28
  idx("t10k-labels-idx1-ubyte.gz", {16}, 16);
  Result r = run("run " + job(fashionJob((dir_ / "fm").string())) + " --out " + out("fm"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("t10k-images-idx3-ubyte.gz: images are 32x32; expected 28x28"), std::string::npos) << r.out;
}

TEST_F(Cli, CorruptDataFileExitsTwo) {
  fs::create_directories(dir_ / "fm");
  for (const char* f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) {
    fs::copy_file(fs::path("/usr/share/datasets/fashion-mnist") / f, dir_ / "fm" / f);
  }
  // Truncate the training images to half.
  fs::resize_file(dir_ / "fm" / "train-images-idx3-ubyte.gz",
                  fs::file_size(dir_ / "fm" / "train-images-idx3-ubyte.gz") / 2);
  std::string j = job(fashionJob((dir_ / "fm").string()));
  for (std::string workers : {"", " --workers 3"}) {
    const std::string args = "run " + j + workers + " --out " + out("c");
    Result r = workers.empty() ? run(args) : runToFile(args, (dir_ / "c.log").string());
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find("train-images-idx3-ubyte.gz"), std::string::npos) << r.out;
    // Failing workers take the job down cleanly: no orphans left behind
    // (this job's workers: they join its manager's port).
    if (workers.empty()) continue;
    const auto at = r.out.find("manager on port ");
    ASSERT_NE(at, std::string::npos) << r.out;
    const std::string port = std::to_string(std::stoi(r.out.substr(at + 16)));
    EXPECT_EQ(workersOfPort(port), 0) << "orphan worker processes remain";
  }
}

}  // namespace

namespace {

std::string checkpointJob() {
  std::string body = kJob;
  body.replace(body.find("steps = 3"), 9, "steps = 6");
  return body + "[checkpoint]\nevery = 2\nkeep = 3\n";
}

// Kill the job while it writes the checkpoint of step 6 (half a layer file on
// disk); resume from the newest intact one on another worker count: the same
// model as the uninterrupted run.
TEST_F(Cli, CrashDuringCheckpointThenResumeOnOtherWorkerCounts) {
  std::string j = job(checkpointJob());
  Result ref = run("run " + j + " --quiet --out " + out("ref"));
  ASSERT_EQ(ref.code, 0) << ref.out;
  const std::string want = lastLineHash(ref.out);

  // The hook is set in the environment of this one command.
  std::string env_cmd = "env MORPH_TEST_CRASH_IN_CHECKPOINT=6 " + std::string(MORPH_CRASHY_BINARY) + " run " + j +
                        " --quiet --out " + out("crash") + " > /dev/null 2>&1";
  int status = std::system(env_cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 9) << "the test hook should have killed the run";
  const std::string ckdir = out("crash") + "/checkpoints";
  ASSERT_TRUE(fs::exists(ckdir + "/step-000000000004"));
  EXPECT_FALSE(fs::exists(ckdir + "/step-000000000006"));

  for (std::string workers : {"", " --workers 2", " --workers 3"}) {
    Result r = run("run " + j + " --quiet --resume " + ckdir + workers + " --out " + out("resumed"));
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("resuming from"), std::string::npos) << r.out;
    EXPECT_EQ(lastLineHash(r.out), want) << "resumed with" << workers << "\n" << r.out;
  }
  // A key that changes the model is refused, naming it; evaluation may change.
  Result r = run("run " + j + " --quiet --resume " + ckdir + " --set optim.lr=0.2 --out " + out("changed"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("optim.lr (checkpoint 0.05, now 0.2)"), std::string::npos) << r.out;
  r = run("run " + j + " --quiet --resume " + ckdir + " --set eval.every=1 --set log.every=1 --out " + out("evals"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(lastLineHash(r.out), want) << r.out;
}

// A flipped byte in the newest checkpoint is detected; the previous one is
// used and the final model is still the same.
TEST_F(Cli, CorruptNewestCheckpointFallsBackToPrevious) {
  std::string j = job(checkpointJob());
  Result ref = run("run " + j + " --quiet --out " + out("ref"));
  ASSERT_EQ(ref.code, 0) << ref.out;
  const std::string ckdir = out("ref") + "/checkpoints";
  const fs::path victim = fs::path(ckdir) / "step-000000000006" / "layer-001.bin";
  ASSERT_TRUE(fs::exists(victim));
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(100);
    char c;
    f.get(c);
    f.seekp(100);
    f.put(static_cast<char>(c ^ 0x10));
  }
  Result r = run("run " + j + " --quiet --resume " + ckdir + " --out " + out("resumed"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("layer-001.bin"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step-000000000004"), std::string::npos) << r.out;
  EXPECT_EQ(lastLineHash(r.out), lastLineHash(ref.out));
  // Nothing intact at all: exit code 2 naming the folder.
  Result none = run("run " + j + " --quiet --resume " + out("nothing") + " --out " + out("x"));
  EXPECT_EQ(none.code, 2) << none.out;
  EXPECT_NE(none.out.find(out("nothing")), std::string::npos) << none.out;
}

}  // namespace
