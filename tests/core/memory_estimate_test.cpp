// The memory estimate that refuses jobs too large for the machine before
// anything is allocated (core/memory_estimate.h).
#include "core/memory_estimate.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "models/model.h"
#include "test_paths.h"

namespace morph {
namespace {

const char* kMlp = R"(
[job]
name = "m"
steps = 10
[data]
dataset = "synthetic"
train_size = 100
[model]
name = "mlp"
hidden = [16, 8]
[batch]
global = 32
virtual_nodes = 4
)";

double builtParameters(const ModelSpec& spec) {
  double n = 0;
  for (const auto& p : buildModel(spec, 1)->parameters()) n += static_cast<double>(p.numel());
  return n;
}

std::string refusal(const JobSpec& j, double models, double datas, int64_t available) {
  try {
    checkJobFitsMemory(j, models, datas, available);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(not refused)";
}

TEST(MemoryEstimate, CountsTheParametersBuildModelMakes) {
  JobSpec mlp = parseJob(kMlp, "m.toml");
  EXPECT_EQ(estimateJobMemory(mlp).parameters, builtParameters(mlp.model));
  std::string cnn_text = kMlp;
  cnn_text.replace(cnn_text.find("name = \"mlp\"\nhidden = [16, 8]"), 29, "name = \"cnn\"\nchannels = [3, 5]\nfc = 7");
  JobSpec cnn = parseJob(cnn_text, "c.toml");
  EXPECT_EQ(estimateJobMemory(cnn).parameters, builtParameters(cnn.model));
  EXPECT_GT(estimateJobMemory(cnn).model_bytes, 16 * estimateJobMemory(cnn).parameters);  // + batch-norm buffers
  if (std::filesystem::is_directory("/usr/share/games/fortunes")) {
    JobSpec gpt = parseJob(R"(
[job]
steps = 1
[data]
dataset = "fortunes-char"
seq_len = 16
[model]
name = "gpt-mini"
dim = 32
layers = 2
heads = 4
[batch]
global = 8
)", "g.toml");
    EXPECT_EQ(estimateJobMemory(gpt).parameters, builtParameters(gpt.model));
    EXPECT_GT(estimateJobMemory(gpt).data_bytes, 0);
  }
}

TEST(MemoryEstimate, BytesPerParameterFollowTheEngine) {
  // value 4 + gradient 4 + int64 accumulator 8
  EXPECT_EQ(estimateJobMemory(parseJob(kMlp, "m.toml")).bytes_per_parameter, 16);
  // + momentum 4
  EXPECT_EQ(estimateJobMemory(parseJob(kMlp, "m.toml", {"optim.momentum=0.9"})).bytes_per_parameter, 20);
  // reduce.bits = 32: int32 accumulator 4 (it is also the wire)
  EXPECT_EQ(estimateJobMemory(parseJob(kMlp, "m.toml", {"reduce.bits=32"})).bytes_per_parameter, 12);
  // float accumulator 4, adamw 8, checkpoint snapshot of value and state 12
  EXPECT_EQ(estimateJobMemory(parseJob(kMlp, "m.toml", {"reduce.mode=float", "optim.name=adamw", "checkpoint.every=5"}))
                .bytes_per_parameter,
            4 + 4 + 4 + 8 + 12);
  // Synthetic data: 28x28 bytes and an int64 label per sample of both splits.
  EXPECT_EQ(estimateJobMemory(parseJob(kMlp, "m.toml")).data_bytes, (100 + 1024) * (784 + 8));
}

TEST(MemoryEstimate, RefusesWhatCannotFitNamingTheKey) {
  // hidden = [1048576]: 8.3e8 parameters, 12.4 GiB at 16 bytes each.
  const int64_t k8GiB = int64_t{8} << 30, k16GiB = int64_t{16} << 30;
  JobSpec wide = parseJob(kMlp, "wide.toml", {"model.hidden=[1048576]"});
  EXPECT_EQ(refusal(wide, 1, 1, k16GiB), "(not refused)");
  std::string msg = refusal(wide, 1, 1, k8GiB);
  for (const char* f : {"wide.toml", "model.hidden", "needs at least 12.4 GiB", "8.0 GiB available",
                        "8.336e+08 parameters x 16 bytes"})
    EXPECT_NE(msg.find(f), std::string::npos) << msg << " lacks " << f;
  JobSpec big_data = parseJob(kMlp, "data.toml", {"data.train_size=100000000"});
  msg = refusal(big_data, 1, 1, k16GiB);
  EXPECT_NE(msg.find("data.train_size"), std::string::npos) << msg;
  EXPECT_NE(msg.find("73.8 GiB"), std::string::npos) << msg;
  // Per local worker process: 4 copies of a 3 GiB model do not fit 8 GiB.
  JobSpec mid = parseJob(kMlp, "mid.toml", {"model.hidden=[262144]"});
  EXPECT_EQ(refusal(mid, 1, 1, int64_t{8} << 30), "(not refused)");
  msg = refusal(mid, 4, 4, int64_t{8} << 30);
  EXPECT_NE(msg.find("start fewer workers"), std::string::npos) << msg;
  // Unknown available memory refuses nothing.
  EXPECT_EQ(refusal(wide, 1, 1, -1), "(not refused)");
}

TEST(MemoryEstimate, ShippedExamplesFitInAGibibyte) {
  // Each example with the folder of the Debian package its data comes from
  // (scripts/install-deps.sh installs both).
  const std::pair<const char*, const char*> examples[] = {{"fmnist-mlp.toml", "/usr/share/datasets/fashion-mnist"},
                                                           {"fmnist-cnn.toml", "/usr/share/datasets/fashion-mnist"},
                                                           {"fortunes-gpt.toml", "/usr/share/games/fortunes"}};
  for (const auto& [e, data] : examples) {
    if (!std::filesystem::exists(data)) GTEST_SKIP() << data << " is not installed here";
    // Any other refusal (a broken example file) fails the test.
    const JobSpec j = loadJobFile(std::string(MORPH_SOURCE_DIR) + "/examples/" + e);
    const MemoryEstimate m = estimateJobMemory(j);
    EXPECT_LT(m.model_bytes + m.data_bytes, double(int64_t{1} << 30)) << e;
    EXPECT_EQ(refusal(j, 1, 1, int64_t{1} << 30), "(not refused)") << e;
  }
}

TEST(MemoryEstimate, AvailableMemoryIsRead) {
  const int64_t a = availableMemoryBytes();
  if (!std::filesystem::exists("/proc/meminfo")) GTEST_SKIP();
  EXPECT_GT(a, int64_t{1} << 20);
}

}  // namespace
}  // namespace morph
