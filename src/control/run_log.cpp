// writeSummary (run_log.h).
#include "control/run_log.h"

namespace morph {
namespace detail {

void writeSummary(const std::string& dir, const JobSpec& job, int64_t steps, int workers,
                  const RunLog& log, const std::string& hash, int64_t peak_rss, const json& resizes,
                  const json& extra) {
  json s = {{"model_hash", hash},
            {"job", job.name},
            {"steps", steps},
            {"global_batch", job.global_batch},
            {"virtual_nodes", job.virtual_nodes},
            {"workers", workers},
            {"stages", 1},
            {"reduce_mode", toString(job.reduce_mode)},
            {"reduce_bits", job.reduce_bits},
            {"final_loss", log.finalLoss()},
            {"test_accuracy", log.testAccuracy()},
            {"test_loss", log.testLoss()},
            {"samples_per_second", log.steadySamplesPerSecond()},
            {"wall_seconds", log.wallSeconds()},
            {"peak_rss_bytes", peak_rss},
            {"resizes", resizes}};
  if (job.regression()) s.erase("test_accuracy");
  s.update(extra);
  std::string tmp = (std::filesystem::path(dir) / "summary.json.tmp").string();
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << s.dump(2) << '\n';
    if (!out) throw JobError(dir + ": cannot write summary.json");
  }
  std::filesystem::rename(tmp, std::filesystem::path(dir) / "summary.json");
}

}  // namespace detail
}  // namespace morph
