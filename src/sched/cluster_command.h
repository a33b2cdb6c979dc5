// `morph cluster simulate` and `morph cluster generate` (docs/cluster.md):
// the command-line side of the cluster simulator. No libtorch: the one
// dependency on the planner (a trace job given as a job file and a
// profile) comes in as a resolver.
#pragma once

#include <string>

#include "sched/cluster_sim.h"

namespace morph::sched {

struct ClusterSimulateOptions {
  std::string trace;
  int slots = 0;  // 0: the slot types' counts
  std::string resources;         // the file the slot types came from (messages)
  std::vector<SlotType> types;   // the slots' device types; empty: one type
  std::string policy = "morph";
  double resize_seconds = 0.6;
  double start_seconds = 0;
  bool json = false;
  int table_rows = 40;  // rows of the allocation table in the text output
  ProfileResolver resolve;
};
int runClusterSimulate(const ClusterSimulateOptions& options);

struct ClusterGenerateOptions {
  TraceGenOptions gen;
  std::string out;  // empty: standard output
};
int runClusterGenerate(const ClusterGenerateOptions& options);

}  // namespace morph::sched
