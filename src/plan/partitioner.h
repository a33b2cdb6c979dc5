// Partitioner: where to cut an ordered list of L layers into P contiguous,
// non-empty stages so that the slowest stage is as fast as possible while
// every stage fits a memory cap. An exact dynamic program (no heuristics,
// no equal-count split): O(max_stages * L^2) evaluations of the cost
// callbacks, and one run answers every P from 1 to max_stages at once.
//
// Stages are described by their layer range [i, j) and by r, their position
// counted from the end of the pipeline (r = 1 is the last stage, r = P the
// first). The first stage is the one with i == 0, the last the one with
// j == L, so a cost may depend on both without knowing P. Memory may depend
// on r (1F1B stashes min(r, M) VNs on the r-th stage from the end); time may
// not (it is per VN). Pure logic: no tensors, no I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace morph {

struct StageCostFns {
  // Seconds per VN of the stage [i, j): its compute and its sends, as the
  // caller models them. Must be finite and >= 0.
  std::function<double(size_t i, size_t j)> seconds;
  // Peak bytes of the stage [i, j) placed r-th from the end. >= 0.
  std::function<int64_t(size_t i, size_t j, int r)> bytes;
  // Optional: a cheap bound, <= seconds(i, j) and nondecreasing in j, that
  // lets the DP stop widening a stage once it cannot win (same answer).
  std::function<double(size_t i, size_t j)> seconds_lb;
};

struct StageCut {
  std::vector<size_t> cuts;      // P + 1 boundaries, cuts[0] = 0, cuts[P] = L
  double bottleneck_s = 0;       // max over stages of seconds()
  std::vector<int64_t> bytes;    // per stage, bytes(cuts[k], cuts[k+1], P - k)
};

// For each P in 1..max_stages (index P - 1): the cut minimising the slowest
// stage among the cuts whose every stage has bytes <= cap (cap <= 0: no
// cap), or nullopt when no cut into P stages fits (or P > layers). Ties
// are broken deterministically: the same inputs give the same cut.
std::vector<std::optional<StageCut>> minMaxCuts(size_t layers, int max_stages, const StageCostFns& fns,
                                                int64_t cap);

// For a P that cannot fit: the cut into P stages whose largest stage (in
// bytes) is smallest, so that a message can name the stage that does not
// fit and by how much. nullopt when P > layers or P < 1.
std::optional<StageCut> minPeakBytesCut(size_t layers, int stages, const StageCostFns& fns);

// Heterogeneous pipelines (one virtual worker of mixed devices): stage k
// runs on the device at position k of an order, so its time depends on the
// device's type and its memory must fit that device.
struct DeviceStageFns {
  // Seconds per VN of the stage [i, j) on a device of type `type`.
  std::function<double(size_t i, size_t j, int type)> seconds;
  // Peak bytes of the stage [i, j) placed r-th from the end.
  std::function<int64_t(size_t i, size_t j, int r)> bytes;
  std::vector<int64_t> caps;  // per type; <= 0: none
  // Optional, as StageCostFns::seconds_lb, per type.
  std::function<double(size_t i, size_t j, int type)> seconds_lb;
};

struct DevicePipeline {
  std::vector<int> order;  // type of the device running stage k
  StageCut cut;
};

// The order of the given devices (their types, one entry per device) and
// the cut with the fastest slowest stage, every stage within its device's
// cap: the exact DP above for each distinct order. Devices of one type are
// interchangeable, so only distinct type sequences are tried (a multiset's
// permutations, not all P!). nullopt when no order and cut fit.
// With all_orders = false, only the order given is tried (the planner's
// fallback when a pool has too many distinct orders to try them all).
std::optional<DevicePipeline> bestDevicePipeline(size_t layers, std::vector<int> device_types,
                                                 const DeviceStageFns& fns, bool all_orders = true);

}  // namespace morph
