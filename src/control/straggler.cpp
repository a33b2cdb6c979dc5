#include "control/straggler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "plan/simulator.h"
#include "plan/vn_shares.h"

namespace morph {

namespace {
constexpr double kMinGain = 0.9;  // a re-plan must cut the predicted compute to this fraction or less
}  // namespace

double predictedCompute(const std::vector<int64_t>& shares, const std::vector<double>& seconds_per_vn) {
  double worst = 0;
  for (size_t r = 0; r < shares.size() && r < seconds_per_vn.size(); ++r)
    worst = std::max(worst, static_cast<double>(shares[r]) * seconds_per_vn[r]);
  return worst;
}

std::string StragglerEvent::describe() const {
  char buf[512];
  std::string sh;
  const char* unit = by_replica ? "replica " : "w";
  for (size_t r = 0; r < shares.size(); ++r)
    sh += (r ? " " : "") + std::string(unit) + std::to_string(members[r]) + "=" + std::to_string(shares[r]);
  std::snprintf(buf, sizeof buf,
                "worker %lld takes %.2fx its expected time per VN (%.3f ms, expected %.3f ms); %s %s "
                "(predicted compute per step %.3f -> %.3f ms)",
                static_cast<long long>(worker), ratio, seconds_per_vn * 1e3, expected_seconds * 1e3,
                drop ? "dropping it, VN shares" : (changes ? "VN shares by measured speed" : "keeping the plan"),
                sh.c_str(), predicted_now * 1e3, predicted_after * 1e3);
  return buf;
}

void StragglerWatch::newGeneration(const std::vector<int64_t>& members, const std::vector<int64_t>& shares,
                                   const std::vector<double>& device_slowdown) {
  members_ = members;
  shares_ = shares;
  for (size_t r = 0; r < members.size(); ++r) {
    auto [it, fresh] = w_.try_emplace(members[r]);
    if (fresh && r < device_slowdown.size()) it->second.expected = device_slowdown[r];
    it->second.streak = 0;
  }
  skip_ = true;
}

double StragglerWatch::base(const std::vector<int64_t>& ids) const {
  std::vector<double> v;
  for (int64_t id : ids) {
    auto it = w_.find(id);
    if (it != w_.end() && it->second.est > 0) v.push_back(it->second.est / it->second.expected);
  }
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  // The median. Of an even count's two middle values, the one nearer the
  // last base: with two workers either may have changed, and the one that
  // did not still measures what the group measured before.
  const double lo = v[(v.size() - 1) / 2], hi = v[v.size() / 2];
  if (!(last_base_ > 0)) return lo;
  return std::abs(std::log(hi / last_base_)) < std::abs(std::log(lo / last_base_)) ? hi : lo;
}

double StragglerWatch::secondsOf(int64_t id, double b) const {
  auto it = w_.find(id);
  if (it == w_.end()) return b;
  return it->second.est > 0 ? it->second.est : b * it->second.expected;
}

std::optional<double> StragglerWatch::estimate(int64_t id) const {
  auto it = w_.find(id);
  if (it == w_.end() || it->second.est <= 0) return std::nullopt;
  return it->second.est;
}

std::optional<StragglerEvent> StragglerWatch::observe(const std::vector<double>& vn_seconds) {
  if (vn_seconds.size() != members_.size()) return std::nullopt;
  if (skip_) {  // the generation's first step
    skip_ = false;
    return std::nullopt;
  }
  // This step's base: the median of figure / expected (a machine-wide
  // change moves every worker's figure, not one worker's deviation).
  std::vector<double> step_norm;
  for (size_t r = 0; r < members_.size(); ++r) {
    const double x = vn_seconds[r];
    if (!(x > 0) || !std::isfinite(x)) continue;
    Worker& w = w_[members_[r]];
    w.recent.push_back(x);
    if (static_cast<int64_t>(w.recent.size()) > o_.steps) w.recent.erase(w.recent.begin());
    std::vector<double> v = w.recent;
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    w.est = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    step_norm.push_back(x / w.expected);
  }
  if (members_.size() < 2 || step_norm.size() < 2) return std::nullopt;  // no peer to compare with
  const double b = base(members_);
  if (!(b > 0)) return std::nullopt;
  last_base_ = b;
  std::sort(step_norm.begin(), step_norm.end());
  const double lo = step_norm[(step_norm.size() - 1) / 2], hi = step_norm[step_norm.size() / 2];
  const double sb = std::abs(std::log(hi / b)) < std::abs(std::log(lo / b)) ? hi : lo;
  if (cooldown_ > 0) {  // right after a re-plan: settle first
    --cooldown_;
    return std::nullopt;
  }
  // A worker deviates at a step when that step's own figure is off by the
  // factor. Its streak counts such steps and gives one back at a step
  // within the factor (Worker::streak): a single slow step (a hiccup)
  // makes no flag, and a single fast one on shared, noisy cores (another
  // worker's spike raises the step's base) does not restart a slow
  // worker's window.
  int64_t worst = -1;
  double worst_dev = 0;
  for (size_t r = 0; r < members_.size(); ++r) {
    Worker& w = w_[members_[r]];
    const double x = vn_seconds[r];
    if (!(x > 0) || !std::isfinite(x) || !(w.est > 0)) continue;
    const double dev = x / (w.expected * sb);
    const int dir = dev > o_.factor ? 1 : (dev < 1.0 / o_.factor ? -1 : 0);
    if (dir == 0) {
      w.streak = std::max<int64_t>(0, w.streak - 1);
    } else if (dir == w.dir) {
      ++w.streak;
    } else {
      w.streak = 1;
      w.dir = dir;
    }
    const double off = std::abs(std::log(w.est / (w.expected * b)));
    if (w.streak >= o_.steps && (worst < 0 || off > worst_dev)) {
      worst = members_[r];
      worst_dev = off;
    }
  }
  if (worst < 0) return std::nullopt;

  StragglerEvent e;
  const Worker& w = w_[worst];
  e.worker = worst;
  e.seconds_per_vn = w.est;
  e.expected_seconds = w.expected * b;
  e.ratio = w.est / e.expected_seconds;
  int64_t vns = 0;
  for (int64_t s : shares_) vns += s;
  std::vector<double> sec;
  for (int64_t id : members_) sec.push_back(secondsOf(id, b));
  e.predicted_now = predictedCompute(shares_, sec);
  e.members = members_;
  e.shares = weightedShares(vns, sec, 1);
  e.predicted_after = predictedCompute(e.shares, sec);
  if (e.ratio > 1 && vns >= static_cast<int64_t>(members_.size()) - 1) {
    // Without it: is the step predicted faster?
    std::vector<int64_t> rest;
    std::vector<double> rest_sec;
    for (size_t r = 0; r < members_.size(); ++r)
      if (members_[r] != worst) rest.push_back(members_[r]), rest_sec.push_back(sec[r]);
    const std::vector<int64_t> rest_shares = weightedShares(vns, rest_sec, 1);
    const double without = predictedCompute(rest_shares, rest_sec);
    if (without < e.predicted_after) {
      e.drop = true;
      e.members = rest;
      e.shares = rest_shares;
      e.predicted_after = without;
    }
  }
  // Worth a new generation only when it saves a tenth of the compute.
  e.changes = e.drop || (e.shares != shares_ && e.predicted_after <= kMinGain * e.predicted_now);
  return e;
}

void StragglerWatch::accept(const StragglerEvent&) {
  cooldown_ = o_.steps;
  const double b = base(members_);
  for (int64_t id : members_) {
    Worker& w = w_[id];
    w.streak = 0;
    if (w.est > 0 && b > 0) w.expected = w.est / b;
  }
}

std::optional<std::vector<int64_t>> StragglerWatch::shares(const std::vector<int64_t>& members, int64_t vns) const {
  if (!engaged_ || members.empty() || vns < static_cast<int64_t>(members.size())) return std::nullopt;
  double b = base(members);
  if (!(b > 0)) b = base(members_);
  if (!(b > 0)) return std::nullopt;
  std::vector<double> sec;
  for (int64_t id : members) sec.push_back(secondsOf(id, b));
  return weightedShares(vns, sec, 1);
}

void StragglerWatch::orderForDrop(std::vector<int64_t>& candidates) {
  if (dropping_.empty()) return;
  std::stable_partition(candidates.begin(), candidates.end(), [&](int64_t id) {
    return std::find(dropping_.begin(), dropping_.end(), id) == dropping_.end();
  });
  for (int64_t id : dropping_) w_.erase(id);
  dropping_.clear();
}

void PipelineStragglerWatch::newGeneration(const std::vector<int64_t>& members, int stages,
                                           const std::vector<size_t>& cuts, const std::vector<int64_t>& replica_shares) {
  if (stages != stages_ || cuts != cuts_) {
    stage_.assign(static_cast<size_t>(stages), StragglerWatch(o_));
    engaged_ = false;
  }
  stages_ = stages;
  cuts_ = cuts;
  members_ = members;
  shares_ = replica_shares;
  flagged_stage_ = -1;
  for (int k = 0; k < stages; ++k) {
    std::vector<int64_t> ids;
    for (size_t r = static_cast<size_t>(k); r < members.size(); r += static_cast<size_t>(stages)) ids.push_back(members[r]);
    stage_[static_cast<size_t>(k)].newGeneration(ids, replica_shares, {});
  }
}

double PipelineStragglerWatch::secondsOf(int64_t id) const {
  for (const StragglerWatch& w : stage_)
    if (auto e = w.estimate(id)) return *e;
  return 0;
}

std::vector<double> PipelineStragglerWatch::replicaSeconds(const std::vector<int64_t>& members, int stages) const {
  std::vector<double> sec;
  for (size_t b = 0; b + static_cast<size_t>(stages) <= members.size(); b += static_cast<size_t>(stages)) {
    double worst = 0;
    for (size_t k = 0; k < static_cast<size_t>(stages); ++k) {
      const double x = secondsOf(members[b + k]);
      if (!(x > 0)) return {};
      worst = std::max(worst, x);
    }
    sec.push_back(worst);
  }
  return sec;
}

std::optional<StragglerEvent> PipelineStragglerWatch::observe(const std::vector<double>& vn_seconds) {
  if (vn_seconds.size() != members_.size() || stages_ < 1) return std::nullopt;
  std::optional<StragglerEvent> found;
  for (int k = 0; k < stages_; ++k) {
    std::vector<double> sub;
    for (size_t r = static_cast<size_t>(k); r < vn_seconds.size(); r += static_cast<size_t>(stages_)) sub.push_back(vn_seconds[r]);
    auto e = stage_[static_cast<size_t>(k)].observe(sub);
    if (e && !found) {
      flagged_stage_ = k;
      flagged_ = *e;
      found = e;
    }
  }
  if (!found) return std::nullopt;
  StragglerEvent e;
  e.by_replica = true;
  e.worker = found->worker;
  e.ratio = found->ratio;
  e.seconds_per_vn = found->seconds_per_vn;
  e.expected_seconds = found->expected_seconds;
  const std::vector<double> sec = replicaSeconds(members_, stages_);
  for (size_t r = 0; r < shares_.size(); ++r) e.members.push_back(static_cast<int64_t>(r));
  e.shares = shares_;
  e.changes = false;
  if (sec.size() == shares_.size()) {
    int64_t vns = 0;
    for (int64_t n : shares_) vns += n;
    e.predicted_now = predictedCompute(shares_, sec);
    e.shares = weightedShares(vns, sec, 1);
    e.predicted_after = predictedCompute(e.shares, sec);
    e.changes = e.shares != shares_ && e.predicted_after <= kMinGain * e.predicted_now;
  }
  return e;
}

void PipelineStragglerWatch::accept(const StragglerEvent&) {
  if (flagged_stage_ >= 0) stage_[static_cast<size_t>(flagged_stage_)].accept(flagged_);
  flagged_stage_ = -1;
}

std::optional<std::vector<int64_t>> PipelineStragglerWatch::shares(const std::vector<int64_t>& members, int stages,
                                                                 int64_t vns) const {
  if (!engaged_ || stages != stages_) return std::nullopt;
  const std::vector<double> sec = replicaSeconds(members, stages);
  if (sec.empty() || vns < static_cast<int64_t>(sec.size())) return std::nullopt;
  return weightedShares(vns, sec, 1);
}

}  // namespace morph
