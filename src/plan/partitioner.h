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

}  // namespace morph
