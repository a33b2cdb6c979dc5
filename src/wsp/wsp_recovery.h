// The rules of a WSP job's checkpoints and lost workers (docs/wsp.md,
// "Checkpoints and lost workers"), as pure functions: which clocks are
// checkpointed, and what a regroup lost. No I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace morph {

// Whether the servers' state at version `version` (every push of waves
// 0 .. version - 1 applied; min(version x wave, steps) steps done) is
// checkpointed: the first version at or past each multiple of `every`
// steps (every > 0). With wave = 1, the steps a sync job checkpoints.
bool wspCheckpointDue(int64_t version, int64_t wave, int64_t every, int64_t steps);

// What a regroup that restores version `restored` loses, from `pushed`:
// per virtual worker of the lost generation, how many of its waves reached
// a parameter server (its clock). Clocks [restored, end) are lost, and
// `pushes`: every push of a wave >= restored.
struct LostWork {
  int64_t restored = 0, end = 0, pushes = 0;
};
LostWork lostWork(const std::vector<int64_t>& pushed, int64_t restored);

// Merges what members report about the lost generation's VWs (each report:
// per VW, the waves it knows of; shorter reports count as 0): the largest.
std::vector<int64_t> mergePushed(const std::vector<std::vector<int64_t>>& reports, size_t vws);

}  // namespace morph
