// Options, folders and data of a run (run_setup.h).
#include "control/run_setup.h"

#include <cstdio>
#include <filesystem>

#include "core/sys.h"
#include "data/dataset.h"

namespace morph {
namespace detail {

DataPair loadData(const JobSpec& job, const std::function<void(const std::string&)>& say) {
  const double t0 = nowSeconds();
  DataPair data = loadDatasets(job.data, job.seed);
  if (say) {
    char took[48];
    std::snprintf(took, sizeof took, ", loaded in %.2f s", nowSeconds() - t0);
    say("data: " + describeData(job.data, data) + took);
  }
  return data;
}

std::string outDir(const RunOptions& o, const JobSpec& job) {
  return o.out_dir.empty() ? (std::filesystem::path("runs") / job.name).string() : o.out_dir;
}

std::string checkpointDir(const RunOptions& o, const JobSpec& job) {
  const std::string d = !o.checkpoint_dir.empty() ? o.checkpoint_dir
                        : !job.checkpoint_dir.empty() ? job.checkpoint_dir
                                                      : (std::filesystem::path(outDir(o, job)) / "checkpoints").string();
  return std::filesystem::absolute(d).lexically_normal().string();
}

}  // namespace detail
}  // namespace morph
