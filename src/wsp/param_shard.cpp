// ParamShard (param_shard.h).
#include "wsp/param_shard.h"

#include <algorithm>
#include <cstring>

#include "comm/communicator.h"
#include "core/error.h"
#include "exec/fixed_point.h"
#include "wsp/own_pushes.h"

namespace morph {

ShardPieces ShardPieces::cut(const std::vector<int64_t>& sizes, int shards, int64_t align) {
  MORPH_CHECK(shards >= 1 && align >= 1, "no shards");
  std::vector<int64_t> start(sizes.size() + 1, 0);
  for (size_t s = 0; s < sizes.size(); ++s) start[s + 1] = start[s] + sizes[s];
  const int64_t total = start.back();
  // The cut points, as positions in the concatenated values (non-decreasing).
  std::vector<int64_t> points;
  for (int r = 1; r < shards; ++r) {
    const int64_t goal = total * r / shards;
    size_t s = 0;
    while (s + 1 < sizes.size() && start[s + 1] <= goal) ++s;
    const int64_t in = goal - start[s];
    int64_t at = (in + align / 2) / align * align;  // the nearest multiple of align
    if (sizes.empty() || at <= 0) at = 0;
    else if (at >= sizes[s]) at = sizes[s];
    points.push_back(sizes.empty() ? 0 : start[s] + at);  // goals grow, so points do
  }
  ShardPieces p;
  for (size_t s = 0; s < sizes.size(); ++s) {
    int64_t from = 0;
    for (int64_t q : points)
      if (q > start[s] + from && q < start[s + 1]) {
        p.segment.push_back(s), p.offset.push_back(from), p.size.push_back(q - start[s] - from);
        from = q - start[s];
      }
    p.segment.push_back(s), p.offset.push_back(from), p.size.push_back(sizes[s] - from);
  }
  p.map.first.push_back(0);
  for (int64_t q : points) {
    size_t i = 0;
    while (i < p.segment.size() && start[p.segment[i]] + p.offset[i] < q) ++i;
    p.map.first.push_back(i);
  }
  p.map.first.push_back(p.segment.size());
  return p;
}

ParamShard::ParamShard(const JobSpec& job, int64_t steps, int vws, const std::vector<StepCore::Segment>& segs,
                       const std::vector<int64_t>& sizes, size_t first, size_t end, const std::vector<int>& scales)
    : job_(job), steps_(steps), vws_(vws) {
  torch::NoGradGuard no_grad;
  for (size_t s = first; s < end; ++s) {
    sizes_.push_back(sizes[s]);
    kinds_.push_back(segs[s].kind);
    momenta_.push_back(segs[s].momentum);
    scales_.push_back(scales[s]);
    values_ += sizes[s];
    torch::Tensor t;
    if (segs[s].state.defined()) {
      t = segs[s].state.detach().clone();
      state_floats_ += t.numel();
      if (segs[s].kind == StepCore::Segment::kParam) {
        t.requires_grad_(true);
        params_.push_back(t);
      }
    }
    state_.push_back(t);
  }
  opt_ = makeOptimizer(job.optim, params_);
  received_.assign(static_cast<size_t>(vws), 0);
}

void ParamShard::packPush(const ScaledValues& sum, size_t first, size_t end, int64_t base, std::vector<int64_t>& out) {
  out.clear();
  for (size_t s = first; s < end; ++s) out.push_back(sum.scales[s]);
  for (size_t s = first; s < end; ++s) {
    int64_t bits;
    std::memcpy(&bits, &sum.maxima[s], sizeof bits);
    out.push_back(bits);
  }
  int64_t off = 0;
  for (size_t s = 0; s < first; ++s) off += sum.sizes[s];
  int64_t n = 0;
  for (size_t s = first; s < end; ++s) n += sum.sizes[s];
  out.insert(out.end(), sum.values.begin() + off, sum.values.begin() + off + n);
  out.push_back(sum.terms);
  out.push_back(base);
}

void ParamShard::push(int vw, int64_t clock, const int64_t* payload) {
  const size_t n = sizes_.size();
  ScaledValues v(sizes_);
  for (size_t s = 0; s < n; ++s) {
    v.scales[s] = static_cast<int>(payload[s]);
    std::memcpy(&v.maxima[s], &payload[n + s], sizeof(double));
  }
  std::copy(payload + 2 * n, payload + 2 * n + values_, v.values.begin());
  v.terms = payload[2 * n + values_];  // minibatches in the wave
  const int64_t base = payload[2 * n + values_ + 1];
  std::lock_guard<std::mutex> l(mu_);
  MORPH_CHECK(clock >= version_, "a push of a clock already applied");
  MORPH_CHECK(base >= 0 && base <= clock, "a push computed on a version past its clock");
  auto& at = pending_[clock];
  MORPH_CHECK(!at.count(vw), "two pushes of one wave from one virtual worker");
  at.emplace(vw, std::move(v));
  bases_[clock][vw] = base;
  int64_t& got = received_.at(static_cast<size_t>(vw));
  got = std::max(got, clock + 1);
  applyReady();
}

void ParamShard::applyReady() {
  while (true) {
    auto it = pending_.find(version_);
    if (it == pending_.end() || static_cast<int>(it->second.size()) < vws_) return;
    if (replay_ && served_[version_] < expected_[version_]) return;
    applyClock(version_);
    pending_.erase(it);
    bases_.erase(version_);
    ++version_;
    if (snapshot_due_ && snapshot_due_(version_)) snapshots_[version_] = snapshot();
    cv_.notify_all();
  }
}

void ParamShard::applyClock(int64_t k) {
  std::vector<const ScaledValues*> parts;
  // The pushes by staleness (ascending): each group's exact sum is applied
  // with its factor (docs/wsp.md, "Stale pushes").
  std::map<int64_t, std::vector<const ScaledValues*>> by_staleness;
  const auto& bases = bases_.at(k);
  for (const auto& [vw, v] : pending_.at(k)) {
    parts.push_back(&v);
    by_staleness[k - bases.at(vw)].push_back(&v);
  }
  // Every push at factor 1 inside the momentum: the one exact sum, as a sync step.
  const bool plain = job_.stale_update == "none" || (by_staleness.size() == 1 && by_staleness.begin()->first == 0);
  std::vector<std::pair<int64_t, ScaledValues>> groups;
  if (!plain)
    for (const auto& [st, ps] : by_staleness) groups.emplace_back(st, sumAll(ps));
  const ScaledValues sum = sumAll(parts);
  const int64_t minibatches = parts.front()->terms;  // every VW's wave k has the same length
  const double B = static_cast<double>(job_.global_batch * job_.targetsPerSample());
  const double V = static_cast<double>(job_.virtual_nodes * minibatches);
  // The optimiser's steps this clock (sync.server_steps): each on the
  // wave's mean gradient, G / (B m); with m = 1 the sum G / B, as before.
  const int64_t m = wspServerSteps(job_, minibatches);
  const double Bm = B * static_cast<double>(m);
  torch::NoGradGuard no_grad;
  // Per parameter segment, what "bypass" applies outside the optimiser.
  std::vector<std::pair<torch::Tensor, torch::Tensor>> outside;
  int64_t off = 0;
  for (size_t s = 0; s < sizes_.size(); ++s) {
    const int64_t n = sizes_[s];
    const int64_t* q = sum.values.data() + off;
    const int64_t at = off;
    off += n;
    switch (kinds_[s]) {
      case StepCore::Segment::kParam: {
        torch::Tensor& g = state_[s].mutable_grad();
        if (!g.defined()) g = torch::empty_like(state_[s]);
        if (plain) {
          dequantize(q, n, sum.scales[s], Bm, g.data_ptr<float>());
          break;
        }
        // Each staleness group's mean-gradient part G / (B (1 + s)), added
        // in ascending staleness into the gradient (per server step: / m)
        // or, bypassed, into `out` (applied once).
        g.zero_();
        torch::Tensor out, part = torch::empty({n});
        for (const auto& [st, grp] : groups) {
          const bool bypass = wspStaleBypass(job_, st);
          dequantize(grp.values.data() + at, n, grp.scales[s], (bypass ? B : Bm) / wspStaleFactor(job_, st),
                     part.data_ptr<float>());
          if (!bypass) {
            g.view({n}).add_(part);
          } else {
            if (!out.defined()) out = torch::zeros({n});
            out.add_(part);
          }
        }
        if (out.defined()) outside.emplace_back(state_[s], out.view_as(state_[s]));
        break;
      }
      case StepCore::Segment::kBnMean:
      case StepCore::Segment::kBnVar: {
        // As VnBatchNorm::commitRunningStats, from the mean of the clock's VN statistics.
        torch::Tensor mean = torch::empty({n});
        dequantize(q, n, sum.scales[s], V, mean.data_ptr<float>());
        state_[s].mul_(1.0 - momenta_[s]).add_(mean, momenta_[s]);
        break;
      }
      case StepCore::Segment::kStats:
        break;
    }
    // The next scales from the clock's exact maxima (GradAccumulator::updateScales).
    if (sum.maxima[s] > 0.0) scales_[s] = scaleFor(sum.maxima[s], job_.headroom_bits, fixedTop(64, 1));
  }
  for (int64_t j = 0; j < m; ++j) opt_->step(learningRate(job_.optim, k * job_.wave + j, steps_));
  const double lr = learningRate(job_.optim, k * job_.wave, steps_);
  for (auto& [w, out] : outside) w.detach().add_(out, -lr);
}

void ParamShard::waitUntil(std::unique_lock<std::mutex>& l, const std::function<bool()>& ready,
                           const std::function<bool()>& stop) {
  if (!stop) {
    cv_.wait(l, ready);
    return;
  }
  while (!cv_.wait_for(l, kStopPoll, ready)) {
    l.unlock();
    const bool give_up = stop();
    l.lock();
    if (give_up && !ready()) throw CommFailure("a parameter-server shard's wait abandoned: the generation was aborted");
  }
}

double ParamShard::predictionCoefficient(const JobSpec& job, int64_t steps, int64_t version, int64_t clock) {
  const OptimSpec& o = job.optim;
  if (o.name != "sgd" || o.momentum <= 0.0 || clock <= version) return 0.0;
  double a = 0.0, mu = o.nesterov ? o.momentum : 1.0;
  for (int64_t k = version; k < clock; ++k) {
    // The missing clocks are full waves (before the VW's own).
    const int64_t m = wspServerSteps(job, std::min(job.wave, steps - k * job.wave));
    for (int64_t j = 0; j < m; ++j) {
      mu *= o.momentum;
      a += learningRate(o, k * job.wave + j, steps) * mu;
    }
  }
  return a;
}

ParamShard::Pulled ParamShard::pull(int64_t at_least, int64_t exactly, const std::function<bool()>& stop,
                                    int64_t clock) {
  std::unique_lock<std::mutex> l(mu_);
  const int64_t want = exactly >= 0 ? exactly : at_least;
  waitUntil(l, [&] { return version_ >= want; }, stop);
  MORPH_CHECK(exactly < 0 || version_ == exactly, "a replayed pull found a version past the logged one");
  Pulled p;
  p.version = version_;
  p.scales = scales_;
  p.state.reserve(static_cast<size_t>(state_floats_));
  const double a = predictionCoefficient(job_, steps_, version_, clock);
  torch::NoGradGuard no_grad;
  size_t param = 0;
  for (size_t s = 0; s < state_.size(); ++s) {
    const torch::Tensor& t = state_[s];
    if (!t.defined()) continue;
    const bool is_param = kinds_[s] == StepCore::Segment::kParam;
    if (a != 0.0 && is_param && version_ > 0) {
      // w - a * buf, in float as the optimiser's own update.
      const torch::Tensor w = t.detach().add(opt_->paramState(param).at(0).second, -a);
      p.state.insert(p.state.end(), w.data_ptr<float>(), w.data_ptr<float>() + w.numel());
    } else {
      p.state.insert(p.state.end(), t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
    }
    if (is_param) ++param;
  }
  if (replay_) {
    ++served_[version_];
    applyReady();
  }
  return p;
}

std::vector<torch::Tensor> ParamShard::optimState() {
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < params_.size(); ++i)
    for (auto& [name, t] : opt_->paramState(i)) {
      MORPH_CHECK(t.scalar_type() == torch::kFloat32 && t.is_contiguous(), "optimiser state " + name + " is not dense float");
      out.push_back(t);
    }
  return out;
}

ParamShard::Snapshot ParamShard::snapshot() const {
  Snapshot s;
  s.version = version_;
  s.optim_steps = opt_->stepCount();
  s.scales = scales_;
  s.state.reserve(static_cast<size_t>(state_floats_));
  for (const torch::Tensor& t : state_)
    if (t.defined()) s.state.insert(s.state.end(), t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
  for (const torch::Tensor& t : const_cast<ParamShard*>(this)->optimState())
    s.optim.insert(s.optim.end(), t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
  return s;
}

void ParamShard::keepSnapshots(std::function<bool(int64_t)> due) {
  std::lock_guard<std::mutex> l(mu_);
  snapshot_due_ = std::move(due);
}

ParamShard::Snapshot ParamShard::takeSnapshot(int64_t version, const std::function<bool()>& stop) {
  std::unique_lock<std::mutex> l(mu_);
  waitUntil(l, [&] { return version_ >= version; }, stop);
  auto it = snapshots_.find(version);
  MORPH_CHECK(it != snapshots_.end(), "no snapshot kept of version " + std::to_string(version));
  Snapshot s = std::move(it->second);
  snapshots_.erase(it);
  return s;
}

void ParamShard::restore(int64_t version, const std::vector<float>& optim, int64_t optim_steps) {
  std::lock_guard<std::mutex> l(mu_);
  MORPH_CHECK(version_ == 0 && pending_.empty(), "a shard restored after it started");
  torch::NoGradGuard no_grad;
  size_t off = 0;
  for (torch::Tensor& t : optimState()) {
    MORPH_CHECK(off + static_cast<size_t>(t.numel()) <= optim.size(), "a restored optimiser state is too short");
    std::copy(optim.begin() + static_cast<std::ptrdiff_t>(off),
              optim.begin() + static_cast<std::ptrdiff_t>(off) + t.numel(), t.data_ptr<float>());
    off += static_cast<size_t>(t.numel());
  }
  MORPH_CHECK_EQ(off, optim.size());
  opt_->setStepCount(optim_steps);
  version_ = version;
  for (int64_t& r : received_) r = version;
}

std::vector<int64_t> ParamShard::received() const {
  std::lock_guard<std::mutex> l(mu_);
  return received_;
}

void ParamShard::expectPulls(std::map<int64_t, int64_t> per_version) {
  std::lock_guard<std::mutex> l(mu_);
  replay_ = true;
  expected_ = std::move(per_version);
}

int64_t ParamShard::version() const {
  std::lock_guard<std::mutex> l(mu_);
  return version_;
}

}  // namespace morph
