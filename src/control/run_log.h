// A run's outputs as a person and a script read them: metrics.jsonl with
// the progress display (RunLog) and summary.json (writeSummary). Written by
// whoever owns the outputs: the in-process runner or the manager.
#pragma once

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "core/job_spec.h"
#include "core/sys.h"

namespace morph {
namespace detail {

using json = nlohmann::json;

// Steps excluded from the steady-state throughput (allocator and cache warm-up).
inline int64_t warmupSteps(int64_t steps) { return std::min<int64_t>(5, steps / 10); }

// metrics.jsonl and the progress display. Owned by whoever writes the outputs
// (the in-process runner or the manager).
class RunLog {
 public:
  // `append`: a resumed run adds to the metrics of the run it continues.
  RunLog(const std::string& dir, const JobSpec& job, int64_t steps, bool quiet, bool append)
      : job_(job), steps_(steps), quiet_(quiet), tty_(isatty(STDOUT_FILENO) != 0) {
    std::filesystem::create_directories(dir);
    metrics_.open(std::filesystem::path(dir) / "metrics.jsonl", append ? std::ios::app : std::ios::trunc);
    if (!metrics_) throw InputError(dir + ": cannot write metrics.jsonl");
    start_ = nowSeconds();
  }

  // Called with every line record() writes (the status page).
  void setObserver(std::function<void(const json&)> f) { observer_ = std::move(f); }

  void record(const json& line) {
    metrics_ << line.dump() << '\n';
    metrics_.flush();
    if (observer_) observer_(line);
    const int64_t step = line.at("step").get<int64_t>();
    const bool eval = line.contains("test_loss");
    if (first_step_ < 0) first_step_ = step;
    if (step >= first_step_ + warmupSteps(steps_ - first_step_)) {
      steady_samples_ += job_.global_batch;
      steady_seconds_ += line.at("step_seconds").get<double>();
    }
    final_loss_ = line.at("loss").get<double>();
    if (eval) {
      if (line.contains("test_accuracy")) test_accuracy_ = line.at("test_accuracy").get<double>();
      test_loss_ = line.at("test_loss").get<double>();
    }
    if (quiet_) return;
    const bool last = step + 1 == steps_;
    char buf[256];
    if (tty_) {
      const int width = 30;
      int filled = static_cast<int>(width * (step + 1) / steps_);
      double elapsed = nowSeconds() - start_;
      double eta = elapsed / static_cast<double>(step + 1) * static_cast<double>(steps_ - step - 1);
      std::snprintf(buf, sizeof buf, "\r[%-*s] step %lld/%lld  loss %.4f  %.0f samples/s  eta %.0fs ",
                    width, std::string(static_cast<size_t>(filled), '#').c_str(),
                    static_cast<long long>(step + 1), static_cast<long long>(steps_), final_loss_,
                    line.at("samples_per_second").get<double>(), eta);
      std::fputs(buf, stdout);
      if (eval || last) std::fputs("\n", stdout);
    } else if ((step + 1) % job_.log_every == 0 || last || step == 0) {
      std::snprintf(buf, sizeof buf, "step %lld/%lld loss %.4f lr %.5g samples/s %.0f\n",
                    static_cast<long long>(step + 1), static_cast<long long>(steps_), final_loss_,
                    line.at("lr").get<double>(), line.at("samples_per_second").get<double>());
      std::fputs(buf, stdout);
    }
    if (eval) {
      if (job_.regression())
        std::snprintf(buf, sizeof buf, "eval after step %lld: test_loss %.6g\n", static_cast<long long>(step + 1),
                      test_loss_);
      else
        std::snprintf(buf, sizeof buf, "eval after step %lld: test_accuracy %.4f test_loss %.4f\n",
                      static_cast<long long>(step + 1), test_accuracy_, test_loss_);
      std::fputs(buf, stdout);
    }
    std::fflush(stdout);
  }

  double steadySamplesPerSecond() const {
    return steady_seconds_ > 0 ? static_cast<double>(steady_samples_) / steady_seconds_ : 0.0;
  }
  double finalLoss() const { return final_loss_; }
  double testAccuracy() const { return test_accuracy_; }
  double testLoss() const { return test_loss_; }
  double wallSeconds() const { return nowSeconds() - start_; }

 private:
  const JobSpec& job_;
  int64_t steps_;
  bool quiet_, tty_;
  std::ofstream metrics_;
  double start_ = 0, steady_seconds_ = 0, final_loss_ = NAN, test_accuracy_ = NAN, test_loss_ = NAN;
  int64_t steady_samples_ = 0;
  int64_t first_step_ = -1;
  std::function<void(const json&)> observer_;
};

void writeSummary(const std::string& dir, const JobSpec& job, int64_t steps, int workers,
                  const RunLog& log, const std::string& hash, int64_t peak_rss, const json& resizes,
                  const json& extra = json::object());

}  // namespace detail
}  // namespace morph
