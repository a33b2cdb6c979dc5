// Export of trained models (models/export.h; docs/models.md, "Export").
#include "models/export.h"

#include <torch/script.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "ckpt/checkpoint_store.h"
#include "core/error.h"
#include "models/model.h"
#include "models/module_path.h"
#include "models/shape_text.h"

namespace morph {
namespace {

// The checkpoint's trained tensors: (layer, "param/x" | "buffer/x" less its
// kind) -> tensor; optimiser state and the rest are not the model's.
struct Trained {
  std::string layer, name;
  torch::Tensor value;
};

std::vector<Trained> trainedTensors(const CheckpointData& ck) {
  std::vector<Trained> out;
  for (const auto& [layer, tensors] : ck.layers)
    for (const auto& [key, t] : tensors) {
      const size_t slash = key.find('/');
      if (slash == std::string::npos) continue;
      const std::string kind = key.substr(0, slash);
      if (kind == "param" || kind == "buffer") out.push_back({layer, key.substr(slash + 1), t});
    }
  return out;
}

}  // namespace

int64_t exportModel(const JobSpec& job, const std::string& checkpoint, const std::string& out) {
  PosixFileSystem fs;
  CheckpointData ck;
  std::string from = checkpoint;
  if (std::filesystem::exists(std::filesystem::path(checkpoint) / "MANIFEST")) {
    ck = loadCheckpoint(checkpoint, fs);
  } else {
    std::vector<std::string> problems;
    auto newest = loadLatestGood(checkpoint, fs, &problems);
    if (!newest)
      throw InputError(checkpoint + ": no intact checkpoint here" +
                       (problems.empty() ? std::string(" (expected a step-* folder or a folder of them)")
                                         : ": " + problems.front()));
    ck = std::move(*newest);
    from = (std::filesystem::path(checkpoint) / checkpointDirName(ck.step)).string();
  }
  const std::string id = job.name + "/" + job.model.name + "/" + std::to_string(job.seed);
  if (ck.job_id != id)
    throw InputError(from + ": a checkpoint of job '" + ck.job_id + "', not of this job ('" + id +
                     "': job.name/model.name/job.seed)");
  const std::vector<Trained> trained = trainedTensors(ck);
  if (job.model.name == "torchscript") {
    // The user's module with the trained tensors, under their state_dict()
    // names (docs/models.md, "Checkpoints").
    torch::jit::Module root = torch::jit::load(job.model.path);
    torch::NoGradGuard no_grad;
    for (const auto& t : trained) {
      std::vector<std::string> path = splitModulePath(t.name);
      const std::string leaf = path.back();
      path.pop_back();
      torch::jit::Module m = root;
      bool found = true;
      for (const auto& p : path) {
        if (!m.hasattr(p) || !m.attr(p).isModule()) {
          found = false;
          break;
        }
        m = m.attr(p).toModule();
      }
      if (!found || !m.hasattr(leaf) || !m.attr(leaf).isTensor())
        throw InputError(from + ": tensor '" + t.name + "' of layer '" + t.layer + "' is not in " + job.model.path +
                         " (a checkpoint of another module file?)");
      torch::Tensor dst = m.attr(leaf).toTensor();
      if (!dst.sizes().equals(t.value.sizes()) || dst.scalar_type() != t.value.scalar_type())
        throw InputError(from + ": tensor '" + t.name + "' is " + shapeText(t.value.sizes()) +
                         " but " + shapeText(dst.sizes()) + " in " + job.model.path);
      dst.copy_(t.value);
    }
    root.save(out);
  } else {
    c10::Dict<std::string, torch::Tensor> dict;
    for (const auto& t : trained) dict.insert(t.layer + "." + t.name, t.value.contiguous());
    const std::vector<char> bytes = torch::pickle_save(dict);
    std::ofstream f(out, std::ios::binary);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.close();
    if (!f) throw InputError(out + ": cannot write the exported model");
  }
  return ck.step;
}

}  // namespace morph
