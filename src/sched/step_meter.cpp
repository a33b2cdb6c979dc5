// A job's measured step time and the calibrated speed (step_meter.h).
#include "sched/step_meter.h"

#include <cstdlib>

namespace morph::sched {

void StepMeter::observe(int64_t step, double time, int workers) {
  if (workers < 1 || step <= last_step_) return;
  if (workers != workers_) {
    if (workers_ > 0 && last_step_ > first_step_) {
      Span& s = closed_[workers_];
      s.seconds += last_time_ - first_time_;
      s.steps += last_step_ - first_step_;
    }
    workers_ = workers;
    first_step_ = step;
    first_time_ = time;
  }
  last_step_ = step;
  last_time_ = time;
}

std::map<int, double> StepMeter::table(int64_t min_steps) const {
  std::map<int, Span> all = closed_;
  if (workers_ > 0 && last_step_ > first_step_) {
    Span& s = all[workers_];
    s.seconds += last_time_ - first_time_;
    s.steps += last_step_ - first_step_;
  }
  std::map<int, double> out;
  for (const auto& [k, s] : all)
    if (s.steps >= min_steps && s.steps > 0 && s.seconds > 0) out[k] = s.seconds / double(s.steps);
  return out;
}

Speed calibratedSpeed(const Speed* planned, const std::map<int, double>& measured, int max_workers) {
  if (measured.empty()) return planned ? *planned : Speed();
  auto base = [&](int k) {  // planned seconds per step on k workers (linear: 1/k)
    return 1.0 / (planned ? planned->stepsPerSecond(k) : double(k));
  };
  std::map<int, double> table;
  for (int k = 1; k <= max_workers; ++k) {
    const auto it = measured.find(k);
    if (it != measured.end()) {
      table[k] = it->second;
      continue;
    }
    auto near = measured.begin();  // the nearest measured count, the smaller on a tie
    for (auto m = measured.begin(); m != measured.end(); ++m)
      if (std::abs(m->first - k) < std::abs(near->first - k)) near = m;
    table[k] = base(k) * near->second / base(near->first);
  }
  for (const auto& [k, s] : measured)
    if (k > max_workers) table[k] = s;
  return Speed(std::move(table));
}

}  // namespace morph::sched
