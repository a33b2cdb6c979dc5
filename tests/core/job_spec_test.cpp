#include "core/job_spec.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "data/dataset.h"

namespace morph {
namespace {

const char* kValid = R"(
[job]
name = "t"
seed = 7
steps = 10
[data]
dataset = "synthetic"
train_size = 100
[model]
name = "mlp"
hidden = [16]
[batch]
global = 32
virtual_nodes = 4
[optim]
name = "adamw"
lr = 0.001
)";

// Expects parsing to fail with a message containing every fragment.
void expectInputError(const std::string& text, std::vector<std::string> fragments,
                      std::vector<std::string> overrides = {}) {
  try {
    parseJob(text, "job.toml", overrides);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    std::string msg = e.what();
    for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << msg << " lacks " << f;
  }
}

TEST(JobSpec, ParsesValidJobWithDefaults) {
  JobSpec j = parseJob(kValid, "job.toml");
  EXPECT_EQ(j.name, "t");
  EXPECT_EQ(j.seed, 7u);
  EXPECT_EQ(j.steps, 10);
  EXPECT_EQ(j.data.train_size, 100);
  EXPECT_EQ(j.model.hidden, std::vector<int64_t>{16});
  EXPECT_EQ(j.vnSize(), 8);
  EXPECT_EQ(j.optim.name, "adamw");
  EXPECT_DOUBLE_EQ(j.optim.lr, 0.001);
  EXPECT_EQ(j.reduce_mode, ReduceMode::kExact);
  EXPECT_EQ(j.threads, 1);
}

TEST(JobSpec, StragglerKeysHaveDefaultsAndBounds) {
  JobSpec j = parseJob(kValid, "job.toml");
  EXPECT_DOUBLE_EQ(j.straggler_factor, 2.0);
  EXPECT_EQ(j.straggler_steps, 10);
  EXPECT_TRUE(j.straggler_replan);
  j = parseJob(kValid, "job.toml",
               {"elastic.straggler_factor=3", "elastic.straggler_steps=2", "elastic.straggler_replan=false"});
  EXPECT_DOUBLE_EQ(j.straggler_factor, 3.0);
  EXPECT_EQ(j.straggler_steps, 2);
  EXPECT_FALSE(j.straggler_replan);
  expectInputError(kValid, {"elastic.straggler_factor", "> 1"}, {"elastic.straggler_factor=1"});
  expectInputError(kValid, {"elastic.straggler_factor", "got 0.5"}, {"elastic.straggler_factor=0.5"});
  expectInputError(kValid, {"elastic.straggler_steps", "got 0"}, {"elastic.straggler_steps=0"});
  expectInputError(kValid, {"elastic.straggler_replan", "expected a boolean"}, {"elastic.straggler_replan=2"});
  EXPECT_DOUBLE_EQ(parseJob(kValid, "job.toml").grow_interval, 5.0);
  EXPECT_DOUBLE_EQ(parseJob(kValid, "job.toml", {"elastic.grow_interval=0.5"}).grow_interval, 0.5);
  expectInputError(kValid, {"elastic.grow_interval", "got -1"}, {"elastic.grow_interval=-1"});
}

// [sync] (docs/wsp.md): sync by default; the wsp keys' bad values exit 2
// naming the key (the worker count is checked by `morph run`: wsp_test.sh).
TEST(JobSpec, SyncKeysDefaultAndBounds) {
  JobSpec j = parseJob(kValid, "job.toml");
  EXPECT_EQ(j.sync_mode, SyncMode::kSync);
  EXPECT_EQ(j.staleness, 0);
  EXPECT_EQ(j.wave, 1);
  j = parseJob(kValid, "job.toml", {"sync.mode=wsp", "sync.staleness=4", "sync.wave=3", "optim.name=sgd"});
  EXPECT_EQ(j.sync_mode, SyncMode::kWsp);
  EXPECT_EQ(j.staleness, 4);
  EXPECT_EQ(j.wave, 3);
  EXPECT_EQ(j.stale_update, "bypass");
  EXPECT_EQ(parseJob(kValid, "job.toml", {"sync.mode=wsp", "sync.stale_update=scale"}).stale_update, "scale");
  EXPECT_EQ(parseJob(kValid, "job.toml", {"sync.mode=wsp", "sync.stale_update=bypass_squared"}).stale_update,
            "bypass_squared");
  expectInputError(kValid, {"job.toml", "sync.stale_update", "got \"half\""}, {"sync.mode=wsp", "sync.stale_update=half"});
  expectInputError(kValid, {"sync.stale_update", "only to sync.mode = \"wsp\""}, {"sync.stale_update=none"});
  EXPECT_EQ(parseJob(kValid, "job.toml", {"sync.mode=wsp"}).local_step, "own");
  EXPECT_EQ(parseJob(kValid, "job.toml", {"sync.mode=wsp", "sync.local_step=share"}).local_step, "share");
  expectInputError(kValid, {"job.toml", "sync.local_step", "got \"full\""}, {"sync.mode=wsp", "sync.local_step=full"});
  expectInputError(kValid, {"sync.local_step", "only to sync.mode = \"wsp\""}, {"sync.local_step=own"});
  expectInputError(kValid, {"job.toml", "sync.staleness", "got -1"}, {"sync.mode=wsp", "sync.staleness=-1"});
  expectInputError(kValid, {"sync.wave", "got 0"}, {"sync.mode=wsp", "sync.wave=0"});
  // 4 VNs x 1025 minibatches is more than the 4096 terms an exact sum holds.
  expectInputError(kValid, {"sync.wave", "at most 1024", "got 1025"}, {"sync.mode=wsp", "sync.wave=1025"});
  expectInputError(kValid, {"sync.mode", "\"wsp\"", "got \"async\""}, {"sync.mode=async"});
  expectInputError(kValid, {"sync.staleness", "only to sync.mode = \"wsp\""}, {"sync.staleness=2"});
  expectInputError(kValid, {"sync.wave", "only to sync.mode = \"wsp\""}, {"sync.mode=sync", "sync.wave=2"});
  expectInputError(kValid, {"reduce.mode", "exact"}, {"sync.mode=wsp", "reduce.mode=float"});
  expectInputError(kValid, {"reduce.bits", "64"}, {"sync.mode=wsp", "reduce.bits=32"});
  expectInputError(kValid, {"optim.clip_norm"}, {"sync.mode=wsp", "optim.clip_norm=1.0"});
}

TEST(JobSpec, RejectsUnknownKeyNamingFileAndKey) {
  expectInputError(std::string(kValid) + "[reduce]\nmodee = \"exact\"\n", {"job.toml", "reduce.modee", "unknown key"});
}

TEST(JobSpec, RejectsWrongType) {
  expectInputError(R"([job]
steps = "ten"
[data]
dataset = "synthetic"
[model]
name = "mlp"
[batch]
global = 32
)",
                   {"job.toml", "job.steps", "expected an integer", "a string"});
}

// Sizes are integers in range: 1e8 is a float in TOML, and a negative or
// zero size is refused, each naming the key (issue 13).
TEST(JobSpec, RejectsNonIntegerAndOutOfRangeSizes) {
  expectInputError(kValid, {"job.toml", "data.train_size", "expected an integer", "100000000"},
                   {"data.train_size=1e8"});
  expectInputError(kValid, {"data.train_size", "expected an integer in [1, 100000000], got -5"},
                   {"data.train_size=-5"});
  expectInputError(kValid, {"data.test_size", "got 0"}, {"data.test_size=0"});
  expectInputError(kValid, {"batch.global", "expected an integer", "32.5"}, {"batch.global=32.5"});
  expectInputError(kValid, {"model.hidden", "element 1 is the number 1.5"}, {"model.hidden=[16, 1.5]"});
  expectInputError(kValid, {"model.hidden", "element 0 is -16"}, {"model.hidden=[-16]"});
  expectInputError(kValid, {"job.steps", "expected an integer"}, {"job.steps=\"12abc\""});
  expectInputError(kValid, {"optim.lr", "expected a number"}, {"optim.lr=\"0.1x\""});
}

TEST(JobSpec, RejectsVnCountNotDividingGlobalBatch) {
  expectInputError(kValid, {"batch.virtual_nodes", "divisor of batch.global = 32", "got 5"},
                   {"batch.virtual_nodes=5"});
}

TEST(JobSpec, RejectsMissingDataset) {
  expectInputError(R"([job]
steps = 1
[data]
dataset = "fashion-mnist"
path = "/nonexistent/fmnist"
[model]
name = "cnn"
[batch]
global = 8
)",
                   {"data.path", "/nonexistent/fmnist/train-images-idx3-ubyte.gz", "missing"});
}

TEST(JobSpec, RejectsBadChoiceAndMissingRequired) {
  expectInputError(kValid, {"model.name", "\"mlp\", \"cnn\"", "\"resnet\""}, {"model.name=resnet"});
  expectInputError("[job]\nsteps = 1\n[data]\ndataset = \"synthetic\"\n[model]\nname = \"mlp\"\n",
                   {"batch.global", "missing"});
  expectInputError("[job\n", {"job.toml:1", "not valid TOML"});
}

TEST(JobSpec, RequiresExactlyOneOfStepsAndEpochs) {
  std::string both = kValid;
  both.replace(both.find("steps = 10"), 10, "steps = 10\nepochs = 2");
  expectInputError(both, {"job.epochs", "exactly one"});
  std::string neither = kValid;
  neither.replace(neither.find("steps = 10"), 10, "");
  expectInputError(neither, {"job.steps", "exactly one"});
  // An override of one replaces the other.
  JobSpec j = parseJob(kValid, "job.toml", {"job.epochs=2"});
  EXPECT_EQ(j.steps, 0);
  EXPECT_DOUBLE_EQ(j.epochs, 2.0);
  EXPECT_EQ(j.resolveSteps(100), 6);  // floor(2 * 100 / 32)
}

TEST(JobSpec, RejectsKeysOfAnotherModelOrDataset) {
  expectInputError(kValid, {"model.hidden", "applies only to model.name = \"mlp\""}, {"model.name=cnn"});
  expectInputError(kValid, {"model.fc", "applies only to model.name = \"cnn\""}, {"model.fc=3"});
  expectInputError(kValid, {"data.train_size", "synthetic"},
                   {"data.dataset=fashion-mnist", "data.path=/usr/share/datasets/fashion-mnist"});
}

TEST(JobSpec, TorchScriptPathIsRelativeToTheJobFileAndItsKeysAreItsOwn) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("morph-ts-spec-" + std::to_string(::getpid()));
  fs::create_directories(dir / "jobs");
  std::ofstream(dir / "jobs" / "m.pt") << "bytes";
  const std::string origin = (dir / "jobs" / "job.toml").string();
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> o = {"model.name=torchscript", "model.path=m.pt"};
    o.insert(o.end(), extra.begin(), extra.end());
    return o;
  };
  // kValid's model.hidden belongs to mlp: drop it by replacing the [model] table.
  std::string text = kValid;
  text.replace(text.find("hidden = [16]\n"), 14, "");
  JobSpec j = parseJob(text, origin, with({}));
  EXPECT_EQ(j.model.path, (dir / "jobs" / "m.pt").string());
  EXPECT_EQ(j.model.loss, "cross_entropy");
  EXPECT_EQ(j.model.digest.size(), 16u);
  EXPECT_EQ(j.targetsPerSample(), 1);
  try {
    parseJob(text, origin, with({"model.path=other.pt"}));
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find((dir / "jobs" / "other.pt").string() + " is missing"), std::string::npos) << e.what();
  }
  try {
    parseJob(text, origin, with({"model.loss=mse"}));
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("\"mse\" needs float32 targets"), std::string::npos) << e.what();
  }
  try {
    parseJob(text, origin, with({"model.dropout=0.1"}));
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("dropout is the module's own"), std::string::npos) << e.what();
  }
  expectInputError(kValid, {"model.loss", "applies only to model.name = \"torchscript\""}, {"model.loss=mse"});
  // model.cuts: module paths, read as they are (the model checks them).
  EXPECT_TRUE(j.model.cuts.empty());
  EXPECT_EQ(parseJob(text, origin, with({"model.cuts=[\"layer2\", \"layer3.1\"]"})).model.cuts,
            (std::vector<std::string>{"layer2", "layer3.1"}));
  for (const char* bad : {"model.cuts=[]", "model.cuts=[\"\"]", "model.cuts=[1]", "model.cuts=\"layer2\""}) {
    try {
      parseJob(text, origin, with({bad}));
      FAIL() << bad << " accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("key 'model.cuts'"), std::string::npos) << e.what();
    }
  }
  expectInputError(kValid, {"model.cuts", "applies only to model.name = \"torchscript\""}, {"model.cuts=[\"a\"]"});
  fs::remove_all(dir);
}

// A NumPy v1 file: `descr` ("|u1", "<i8"), `shape`, `bytes` of payload.
void writeNpy(const std::filesystem::path& path, const std::string& descr, const std::string& shape,
              const std::string& bytes) {
  std::string head = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  head += std::string(63 - (10 + head.size()) % 64, ' ') + "\n";
  std::ofstream out(path, std::ios::binary);
  out << "\x93NUMPY" << '\x01' << '\x00' << static_cast<char>(head.size() & 0xff)
      << static_cast<char>(head.size() >> 8) << head << bytes;
}

TEST(JobSpec, InputPathsAreRelativeToTheJobFilesFolder) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("morph-paths-spec-" + std::to_string(::getpid()));
  fs::create_directories(dir / "jobs" / "data");
  writeNpy(dir / "jobs" / "data" / "x.npy", "|u1", "(4, 2, 2)", std::string(16, '\x07'));
  std::string labels;
  for (int64_t v : {0, 1, 1, 0}) labels.append(reinterpret_cast<const char*>(&v), sizeof v);
  writeNpy(dir / "jobs" / "data" / "y.npy", "<i8", "(4,)", labels);
  const std::string origin = (dir / "jobs" / "job.toml").string();
  const std::string abs_y = (dir / "jobs" / "data" / "y.npy").string();
  const std::vector<std::string> npy = {"data.dataset=npy", "data.train_x=data/x.npy", "data.train_y=" + abs_y,
                                        "data.test_x=./data/../data/x.npy", "data.test_y=data/y.npy"};
  std::string text = kValid;
  text.replace(text.find("train_size = 100\n"), 17, "");
  const JobSpec j = parseJob(text, origin, npy);
  EXPECT_EQ(j.data.train_x, (dir / "jobs" / "data" / "x.npy").string());
  EXPECT_EQ(j.data.train_y, abs_y);  // absolute: as given
  EXPECT_EQ(j.data.test_x, (dir / "jobs" / "data" / "x.npy").string());
  EXPECT_EQ(j.data.test_y, abs_y);
  EXPECT_EQ(j.data.train_size, 4);
  EXPECT_EQ(j.model.classes, 2);
  // A dataset folder too.
  try {
    parseJob(text, origin, {"data.dataset=fashion-mnist", "data.path=fm"});
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find((dir / "jobs" / "fm" / "train-images").string()), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// Token data (docs/models.md): int64 ids (N, T) with int64 labels (N, T),
// a loss term per position; a batch keeps the ids as int64.
TEST(JobSpec, TokenDataHasALabelPerPosition) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("morph-tokens-spec-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "m.pt") << "bytes";
  auto ids = [](std::vector<int64_t> v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
  };
  writeNpy(dir / "x.npy", "<i8", "(4, 3)", ids({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
  writeNpy(dir / "y.npy", "<i8", "(4, 3)", ids({2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}));
  writeNpy(dir / "y1.npy", "<i8", "(4,)", ids({0, 1, 0, 1}));
  writeNpy(dir / "neg.npy", "<i8", "(4, 3)", ids({1, 2, 3, 4, 5, 6, 7, 8, -9, 10, 11, 12}));
  std::string text = kValid;
  text.replace(text.find("train_size = 100\n"), 17, "");
  text.replace(text.find("hidden = [16]\n"), 14, "");
  const std::string origin = (dir / "job.toml").string();
  auto with = [&](const std::string& x, const std::string& y, const std::string& model = "torchscript") {
    std::vector<std::string> o = {"data.dataset=npy", "data.train_x=" + x, "data.train_y=" + y, "data.test_x=x.npy",
                                  "data.test_y=y.npy", "model.name=" + model};
    if (model == "torchscript") o.push_back("model.path=m.pt");
    return o;
  };
  const JobSpec j = parseJob(text, origin, with("x.npy", "y.npy"));
  EXPECT_EQ(j.model.input, (std::vector<int64_t>{3}));
  EXPECT_EQ(j.model.target, (std::vector<int64_t>{3}));
  EXPECT_EQ(j.model.classes, 14);
  EXPECT_EQ(j.targetsPerSample(), 3);  // the loss is the mean over every position
  const DataPair p = loadDatasets(j.data, j.seed);
  const Batch b = p.train->gather(std::vector<int64_t>{2, 0});
  EXPECT_TRUE(torch::equal(b.x, torch::tensor({7, 8, 9, 1, 2, 3}, torch::kInt64).view({2, 3})));
  EXPECT_TRUE(torch::equal(b.y, torch::tensor({8, 9, 10, 2, 3, 4}, torch::kInt64).view({2, 3})));
  auto refused = [&](const std::vector<std::string>& o, const std::vector<std::string>& fragments) {
    try {
      parseJob(text, origin, o);
      FAIL() << "expected an InputError";
    } catch (const InputError& e) {
      for (const auto& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
    }
  };
  // Values (uint8, float32) are still normalised floats with one label per
  // sample, or float32 targets of their shape.
  writeNpy(dir / "u8.npy", "|u1", "(4, 1, 2)", std::string("\x00\xff\x33\x66\x99\xcc\x11\x22", 8));
  writeNpy(dir / "f32.npy", "<f4", "(4, 2)", std::string(reinterpret_cast<const char*>(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}.data()), 32));
  auto values = [&](const std::string& x, const std::string& y, const std::string& loss) {
    return std::vector<std::string>{"data.dataset=npy", "data.train_x=" + x, "data.train_y=" + y, "data.test_x=" + x,
                                    "data.test_y=" + y, "model.name=torchscript", "model.path=m.pt",
                                    "model.loss=" + loss, "data.mean=0.5", "data.std=2"};
  };
  const JobSpec u = parseJob(text, origin, values("u8.npy", "y1.npy", "cross_entropy"));
  EXPECT_TRUE(u.model.target.empty());
  EXPECT_EQ(u.targetsPerSample(), 1);
  const Batch ub = loadDatasets(u.data, u.seed).train->gather(std::vector<int64_t>{1, 3});
  EXPECT_EQ(ub.x.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(ub.y, torch::tensor({1, 1}, torch::kInt64)));
  const float want_u8[] = {0x33, 0x66, 0x11, 0x22};
  for (int k = 0; k < 4; ++k)
    EXPECT_EQ(ub.x.flatten()[k].item<float>(), (want_u8[k] * (1.0f / 255.0f) - 0.5f) * 0.5f) << k;
  const JobSpec f = parseJob(text, origin, values("f32.npy", "f32.npy", "mse"));
  EXPECT_EQ(f.targetsPerSample(), 2);
  const Batch fb = loadDatasets(f.data, f.seed).train->gather(std::vector<int64_t>{2});
  EXPECT_TRUE(torch::equal(fb.y, torch::tensor({5.0f, 6.0f}).view({1, 2})));
  EXPECT_TRUE(torch::equal(fb.x, torch::tensor({2.25f, 2.75f}).view({1, 2})));
  refused(with("x.npy", "y1.npy"), {(dir / "y1.npy").string(), "expected int64 labels of the same shape"});
  refused(with("neg.npy", "y.npy"), {(dir / "neg.npy").string(), "negative token id -9"});
  refused(with("x.npy", "y.npy", "mlp"), {"model.name", "needs model.name = \"torchscript\""});
  fs::remove_all(dir);
}

TEST(JobSpec, GptMiniNeedsTextAndValidHeads) {
  expectInputError(kValid, {"model.name", "fortunes-char"}, {"model.name=gpt-mini"});
  const std::string text = R"([job]
steps = 1
[data]
dataset = "fortunes-char"
[model]
name = "gpt-mini"
dim = 30
heads = 4
[batch]
global = 8
)";
  expectInputError(text, {"model.heads", "divisor of model.dim = 30"});
  JobSpec j = parseJob(text, "job.toml", {"model.dim=32", "data.seq_len=8"});
  EXPECT_EQ(j.model.seq_len, 8);
  EXPECT_EQ(j.targetsPerSample(), 8);
  expectInputError(text, {"data.path", "/nope", "apt-get install fortunes"}, {"model.dim=32", "data.path=/nope"});
}

TEST(JobSpec, OverridesApplyBeforeValidation) {
  JobSpec j = parseJob(kValid, "job.toml", {"batch.global=64", "reduce.mode=float", "model.hidden=[8, 8]"});
  EXPECT_EQ(j.global_batch, 64);
  EXPECT_EQ(j.reduce_mode, ReduceMode::kFloat);
  EXPECT_EQ(j.model.hidden, (std::vector<int64_t>{8, 8}));
  expectInputError(kValid, {"--set", "key=value"}, {"batch.global"});
  expectInputError(kValid, {"batch.global", "expected an integer"}, {"batch.global=big"});
}

}  // namespace
}  // namespace morph
