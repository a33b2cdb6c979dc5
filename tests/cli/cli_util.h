// Helpers of the end-to-end tests: run the `morph` binary, read its hash,
// a fixture with a private temporary folder.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "test_paths.h"

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

// The hash on the output's last line, "model_hash: <16 hex digits>". Any
// other ending fails the calling test (two runs that print no hash must
// never compare equal).
inline std::string lastLineHash(const std::string& out) {
  const auto pos = out.rfind("model_hash: ");
  const std::string rest = pos == std::string::npos ? std::string() : out.substr(pos + 12);
  const bool hex16 = rest.size() == 17 && rest.back() == '\n' &&
                     rest.find_first_not_of("0123456789abcdef") == 16;
  if (!hex16) {
    ADD_FAILURE() << "the output does not end with 'model_hash: <16 hex digits>':\n" << out;
    return "no hash (" + std::to_string(out.size()) + " bytes of output)";
  }
  return rest.substr(0, 16);
}

// Worker processes of the job whose manager listens on `port` (they join
// it: "morph worker --join 127.0.0.1:PORT --token-file ...").
inline int workersOfPort(const std::string& port) {
  const std::string cmd = "pgrep -f 'morph worke[r] --join 127[.]0[.]0[.]1:" + port + "( |$)' | wc -l";
  FILE* p = popen(cmd.c_str(), "r");
  char buf[64] = {0};
  const size_t n = fread(buf, 1, sizeof buf - 1, p);
  pclose(p);
  EXPECT_GT(n, 0u) << cmd;
  return std::atoi(buf);
}

// A file's bytes ("" when it cannot be read).
inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// As run(), with the output written to the file `log`: it returns when the
// command ends, not when the last process that inherited its output ends
// (run()'s pipe would wait for orphaned workers, hiding them).
inline Result runToFile(const std::string& args, const std::string& log) {
  const int status = std::system((std::string(MORPH_BINARY) + " " + args + " > '" + log + "' 2>&1").c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), slurp(log)};
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
