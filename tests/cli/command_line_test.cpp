// The command line shared by the `morph` front and the engine
// (cli/command_line.h): what it parses, and the malloc tunables the front
// gives the engine.
#include "cli/command_line.h"

#include <gtest/gtest.h>

#include "core/error.h"

#include <string>
#include <vector>

namespace {

morph::Invocation parse(std::vector<std::string> args, int* rc = nullptr) {
  args.insert(args.begin(), "morph");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  morph::Invocation inv;
  const int code = morph::parseCommandLine(static_cast<int>(argv.size()), argv.data(), inv);
  if (rc) *rc = code;
  return inv;
}

TEST(CommandLine, ParsesWhatTheFrontDecidesOn) {
  int rc = 0;
  morph::Invocation inv = parse({"run", "j.toml", "--workers", "3", "--steps", "7", "--set", "optim.lr=0.1"}, &rc);
  EXPECT_EQ(rc, -1);
  EXPECT_EQ(inv.command, morph::Invocation::Command::kRun);
  EXPECT_EQ(inv.run.job_path, "j.toml");
  EXPECT_EQ(inv.run.workers, 3);
  EXPECT_EQ(inv.run.steps, 7);
  EXPECT_EQ(inv.run.overrides, std::vector<std::string>{"optim.lr=0.1"});
  inv = parse({"slow", "--join", "h:1", "--worker", "2", "--factor", "4"}, &rc);
  EXPECT_EQ(rc, -1);
  EXPECT_EQ(inv.command, morph::Invocation::Command::kSlow);
  EXPECT_EQ(inv.slow_worker, 2);
  EXPECT_DOUBLE_EQ(inv.slow_factor, 4.0);
  inv = parse({"resize", "--join", "h:1", "--workers", "1", "--release", "0,3"}, &rc);
  EXPECT_EQ(rc, -1);
  EXPECT_EQ(inv.command, morph::Invocation::Command::kResize);
  EXPECT_EQ(inv.resize_workers, 1);
  EXPECT_EQ(inv.resize_release, (std::vector<int64_t>{0, 3}));
  inv = parse({"worker", "--join", "h:1"}, &rc);
  EXPECT_EQ(inv.command, morph::Invocation::Command::kWorker);
  EXPECT_EQ(inv.worker.label, "");
  inv = parse({"worker", "--join", "h:1", "--label", "node-2.rack_a"}, &rc);
  EXPECT_EQ(rc, -1);
  EXPECT_EQ(inv.worker.label, "node-2.rack_a");
  inv = parse({"cluster", "simulate", "t.json", "--slots", "4"}, &rc);
  EXPECT_EQ(inv.command, morph::Invocation::Command::kClusterSimulate);
  parse({"run", "j.toml", "--workers", "0"}, &rc);
  EXPECT_EQ(rc, 2);  // out of range: printed, not run
  parse({"plan", "j.toml", "--profile", "p.json"}, &rc);
  EXPECT_EQ(rc, -1);
}

TEST(CommandLine, ArgumentCombinationsRefusedBeforeAnyWork) {
  EXPECT_THROW(morph::checkArguments(parse({"run", "j.toml", "--spawn", "1"})), std::exception);
  EXPECT_THROW(morph::checkArguments(parse({"run", "j.toml", "--workers", "2", "--heartbeat-interval", "2",
                                            "--heartbeat-timeout", "1"})),
               std::exception);
  EXPECT_THROW(morph::checkArguments(parse({"plan", "j.toml", "--profile", "p.json"})), std::exception);
  EXPECT_NO_THROW(morph::checkArguments(parse({"plan", "j.toml", "--profile", "p.json", "--workers", "2"})));
  EXPECT_NO_THROW(morph::checkArguments(parse({"run", "j.toml", "--workers", "2", "--spawn", "1"})));
  // A worker's label is refused before it joins (exit 2), not by its manager.
  EXPECT_NO_THROW(morph::checkArguments(parse({"worker", "--join", "h:1", "--label", "n1"})));
  for (const std::string& bad : {std::string("n 1"), std::string("n1/fast"), std::string(65, 'n')})
    EXPECT_THROW(morph::checkArguments(parse({"worker", "--join", "h:1", "--label", bad})), morph::InputError) << bad;
}

// The engine's malloc runs on transparent huge pages unless the caller set
// glibc.malloc.hugetlb itself; other tunables are kept.
TEST(CommandLine, HugePageMallocUnlessTheCallerChose) {
  EXPECT_EQ(morph::hugePageTunables(nullptr), "glibc.malloc.hugetlb=1");
  EXPECT_EQ(morph::hugePageTunables(""), "glibc.malloc.hugetlb=1");
  EXPECT_EQ(morph::hugePageTunables("glibc.malloc.arena_max=2"), "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1");
  EXPECT_EQ(morph::hugePageTunables("glibc.malloc.hugetlb=0"), "glibc.malloc.hugetlb=0");
  EXPECT_EQ(morph::hugePageTunables("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2"),
            "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2");
}

}  // namespace
