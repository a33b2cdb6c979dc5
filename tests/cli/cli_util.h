// Helpers of the end-to-end tests: run the `morph` binary, read its hash,
// a fixture with a private temporary folder.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace morph_test {

namespace fs = std::filesystem;

struct Result {
  int code;
  std::string out;  // stdout and stderr
};

inline Result run(const std::string& args) {
  std::string cmd = std::string(MORPH_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

inline std::string lastLineHash(const std::string& out) {
  auto pos = out.rfind("model_hash: ");
  if (pos == std::string::npos) return "";
  std::string rest = out.substr(pos + 12);
  EXPECT_EQ(rest.size(), 17u) << "model_hash must be the last line:\n" << out;
  return rest.substr(0, 16);
}

// A file's bytes ("" when it cannot be read).
inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("morph_cli_" + std::to_string(getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string job(const std::string& body, const std::string& name = "job.toml") {
    std::string p = (dir_ / name).string();
    std::ofstream(p) << body;
    return p;
  }
  std::string out(const std::string& tag) { return (dir_ / tag).string(); }
  fs::path dir_;
};

}  // namespace morph_test
