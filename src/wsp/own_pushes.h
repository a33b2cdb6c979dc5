// Read-my-writes of a WSP virtual worker (docs/wsp.md, "Pulls, the gate,
// and D"): the servers' weights it pulls lack its own pushes that a shard
// has not applied yet, so it adds what the servers' SGD will do with them.
// Pure arithmetic on floats, the same bits for the same inputs (replay).
#pragma once

#include <cstdint>
#include <vector>

#include "core/job_spec.h"

namespace morph {

// A stale push (docs/wsp.md, "Stale pushes"): a push of clock k computed
// on a shard's version v has staleness s = k - v. Its gradient is applied
// with the factor wspStaleFactor (1 for s = 0 or sync.stale_update =
// "none"; 1 / (1 + s)^2 when "bypass_squared" bypasses; else 1 / (1 + s));
// wspStaleBypass says it is applied outside the momentum buffer ("bypass"
// or "bypass_squared", s >= 1, SGD with momentum; otherwise both act as
// "scale").
double wspStaleFactor(const JobSpec& job, int64_t s);
bool wspStaleBypass(const JobSpec& job, int64_t s);

// How many steps the servers' optimiser takes for a clock whose wave has
// `minibatches` (sync.server_steps): "per_minibatch" one per minibatch,
// step j of clock k at lr(k * job.wave + j) on the wave's mean gradient
// (its summed mean gradients / minibatches); "per_clock" one, at
// lr(k * job.wave), on the sum. A bypassed stale part is applied once, at
// lr(k * job.wave), under both.
int64_t wspServerSteps(const JobSpec& job, int64_t minibatches);

// The move of one tensor of `n` values that the servers' optimiser
// (job.optim: SGD, with its momentum and Nesterov; wspServerSteps steps
// per clock of a full wave, in a job of `steps`) makes by clock `version +
// size of grads` from these gradients alone, clock version + i's being
// grads[i] (a mean-gradient part G / B; null: none that clock), at
// staleness stale[i]: with f = wspStaleFactor and m the clock's server
// steps, at each of them buf = mu buf + f g / m, move += lr buf
// (Nesterov: lr (f g / m + mu buf)), from buf = 0; a bypassed push
// (wspStaleBypass) instead adds lr f g to the move once, at the clock's
// first learning rate, and nothing to buf. The weights are then w - move.
// Empty when every entry is null.
std::vector<float> ownPushesMove(const JobSpec& job, int64_t steps, int64_t version,
                                 const std::vector<const std::vector<float>*>& grads,
                                 const std::vector<int64_t>& stale, size_t n);

}  // namespace morph
