// ownPushesMove (own_pushes.h).
#include "wsp/own_pushes.h"

#include "exec/optimizer.h"

namespace morph {

std::vector<float> ownPushesMove(const JobSpec& job, int64_t steps, int64_t version,
                                 const std::vector<const std::vector<float>*>& grads, size_t n) {
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
    const float lr = static_cast<float>(learningRate(o, clock * job.wave, steps));
    for (size_t j = 0; j < n; ++j) {
      const float gj = g ? (*g)[j] : 0.0f;
      buf[j] = mu * buf[j] + gj;
      move[j] += lr * (o.nesterov ? gj + mu * buf[j] : buf[j]);
    }
  }
  return move;
}

}  // namespace morph
