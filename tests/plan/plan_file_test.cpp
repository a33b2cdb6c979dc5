// Plan files (src/plan/plan_file.h) read back from disk: what is accepted and
// how a defect is named.
#include "plan/plan_file.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "core/error.h"

namespace morph {
namespace {

const std::vector<std::string> kNames = {"l0", "l1", "l2", "l3", "l4", "l5"};

PlanFile readText(const std::string& text, int64_t virtual_nodes = 8) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("morph-plan-test-" + std::to_string(getpid()) + ".json")).string();
  std::ofstream(path) << text;
  struct Remove {
    std::string p;
    ~Remove() { std::filesystem::remove(p); }
  } remove{path};
  return readPlanFile(path, kNames, virtual_nodes);
}

TEST(PlanFile, ReadsEveryKey) {
  PlanFile p = readText(R"({"stages": [["l0", "l2"], ["l3", "l5"]], "replicas": 2, "schedule": "1f1b",
                            "recompute": true, "vn_shares": [5, 3], "workers": [0, 1, 3, 2]})");
  EXPECT_EQ(p.cuts, (std::vector<size_t>{0, 3, 6}));
  EXPECT_EQ(p.replicas, 2);
  EXPECT_EQ(p.recompute, true);
  EXPECT_EQ(p.vn_shares, (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(p.workers, (std::vector<int>{0, 1, 3, 2}));
}

// A UBSan report in tests/fuzz/plan_file_fuzz.cpp (corpus/plan_file/regress-vn-shares-*):
// huge shares overflowed the sum (undefined behaviour), and four of 2^62
// plus 8 wrapped to exactly the job's 8 VNs and were accepted.
TEST(PlanFile, RejectsSharesLargerThanTheJobsVns) {
  for (const char* text : {R"({"stages": [["l0", "l5"]], "vn_shares": [9223372036854775807, 9223372036854775807]})",
                           R"({"stages": [["l0", "l5"]], "vn_shares": [4611686018427387904, 4611686018427387904,
                               4611686018427387904, 4611686018427387904, 8]})",
                           R"({"stages": [["l0", "l5"]], "vn_shares": [9]})"}) {
    try {
      readText(text);
      ADD_FAILURE() << "accepted " << text;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("vn_shares': every share must be an integer from 1 to 8"),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace morph
