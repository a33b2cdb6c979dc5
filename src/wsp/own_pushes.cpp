// ownPushesMove (own_pushes.h).
#include "wsp/own_pushes.h"

#include "core/error.h"
#include "exec/optimizer.h"

#include <algorithm>

namespace morph {

double wspStaleFactor(const JobSpec& job, int64_t s) {
  if (s <= 0 || job.stale_update == "none") return 1.0;
  const double f = 1.0 / static_cast<double>(1 + s);
  return job.stale_update == "bypass_squared" && wspStaleBypass(job, s) ? f * f : f;
}

bool wspStaleBypass(const JobSpec& job, int64_t s) {
  return s >= 1 && (job.stale_update == "bypass" || job.stale_update == "bypass_squared") && job.optim.name == "sgd" &&
         job.optim.momentum > 0.0;
}

int64_t wspServerSteps(const JobSpec& job, int64_t minibatches) {
  return job.server_steps == "per_clock" ? 1 : std::max<int64_t>(1, minibatches);
}

std::vector<float> ownPushesMove(const JobSpec& job, int64_t steps, int64_t version,
                                 const std::vector<const std::vector<float>*>& grads,
                                 const std::vector<int64_t>& stale, size_t n) {
  MORPH_CHECK_EQ(stale.size(), grads.size());
  const OptimSpec& o = job.optim;
  const float mu = static_cast<float>(o.momentum);
  std::vector<float> buf, move;
  for (size_t i = 0; i < grads.size(); ++i) {
    const std::vector<float>* g = grads[i];
    if (move.empty()) {
      if (!g) continue;  // nothing of its own before its first push here
      buf.assign(n, 0.0f);
      move.assign(n, 0.0f);
    }
    const int64_t clock = version + static_cast<int64_t>(i);
    // Own pushes are of waves before the VW's current one: full waves.
    const int64_t m = wspServerSteps(job, std::min(job.wave, steps - clock * job.wave));
    const float f = static_cast<float>(g ? wspStaleFactor(job, stale[i]) : 1.0);
    const bool bypass = g && wspStaleBypass(job, stale[i]);
    const float per = g && !bypass ? f / static_cast<float>(m) : 0.0f;
    for (int64_t k = 0; k < m; ++k) {
      const float lr = static_cast<float>(learningRate(o, clock * job.wave + k, steps));
      for (size_t j = 0; j < n; ++j) {
        const float gj = per * (g ? (*g)[j] : 0.0f);
        if (bypass && k == 0) move[j] += lr * f * (*g)[j];
        buf[j] = mu * buf[j] + gj;
        move[j] += lr * (o.nesterov ? gj + mu * buf[j] : buf[j]);
      }
    }
  }
  return move;
}

}  // namespace morph
