// Models as ordered lists of named layers. A layer is the unit a pipeline
// stage is cut at: stage k runs a contiguous range of layers. Layers that
// normalise with batch statistics expose them so that the executor can
// update running statistics once per step from the exact mean over VNs.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/job_spec.h"

namespace morph {

class Layer : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;
  // Parameters this layer uses but another layer owns (a tied output head):
  // pairs of (alias, owner). The alias is a leaf of its own that shares the
  // owner's storage, so the two uses' gradients arrive separately (each is
  // quantised on its own, as they must be when the layers sit on different
  // pipeline stages) and the executor adds both into the owner's gradient.
  virtual std::vector<std::pair<torch::Tensor, torch::Tensor>> tiedLeaves() { return {}; }
};

// Batch norm whose training-mode forward normalises with the VN's own batch
// statistics and records them instead of updating the running statistics;
// commitRunningStats() then applies one update per step.
class VnBatchNorm : public Layer {
 public:
  VnBatchNorm(int64_t channels, double momentum = 0.1, double eps = 1e-5);
  // A scripted module's batch norm (models/graph.h, GraphBatchNorm): the
  // same tensors, registered here so that the executor reduces them; the
  // segment's graph normalises and writes each training forward's statistics
  // into `mean` and `var`, which lastMean() and lastVar() then return.
  VnBatchNorm(torch::Tensor weight, torch::Tensor bias, torch::Tensor running_mean, torch::Tensor running_var,
              double momentum, double eps, torch::Tensor mean, torch::Tensor var);
  torch::Tensor forward(const torch::Tensor& x) override;  // x is (b, C, ...)

  // Statistics of the last training forward: (C) mean and (C) unbiased var.
  const torch::Tensor& lastMean() const { return last_mean_; }
  const torch::Tensor& lastVar() const { return last_var_; }
  // running = (1 - m) running + m * stat, with the step's mean statistics.
  void commitRunningStats(const torch::Tensor& mean, const torch::Tensor& var);
  int64_t channels() const { return channels_; }
  // The live running statistics and the update's momentum (WSP's servers
  // apply commitRunningStats' formula to their own copies, docs/wsp.md).
  const torch::Tensor& runningMean() const { return running_mean_; }
  const torch::Tensor& runningVar() const { return running_var_; }
  double momentum() const { return momentum_; }

 private:
  int64_t channels_;
  double momentum_, eps_;
  torch::Tensor weight_, bias_, running_mean_, running_var_;
  torch::Tensor last_mean_, last_var_;
};

class LayerList : public torch::nn::Module {
 public:
  void add(const std::string& name, std::shared_ptr<Layer> layer);
  torch::Tensor forward(torch::Tensor x) { return forwardRange(std::move(x), 0, size()); }
  // Runs layers [begin, end).
  torch::Tensor forwardRange(torch::Tensor x, size_t begin, size_t end);
  // The same in training: reseeds the default generator before each layer i
  // from (vn_seed, i), so a layer's random draws (dropout) do not depend on
  // where a pipeline stage starts, or on whether the forward is a recompute.
  torch::Tensor forwardRange(torch::Tensor x, size_t begin, size_t end, uint64_t vn_seed);
  size_t size() const { return layers_.size(); }
  const std::string& layerName(size_t i) const { return names_[i]; }
  Layer& layer(size_t i) { return *layers_[i]; }
  // Batch-norm layers in layer order (their statistics are reduced per step).
  std::vector<VnBatchNorm*> batchNorms();
  // Frees layer i's parameters and buffers (each becomes an empty tensor,
  // the same tensor object): a layer another pipeline stage holds.
  void hollow(size_t i);
  bool isHollow(size_t i) const { return hollow_[i] != 0; }
  void markHeld(size_t i) { hollow_[i] = 0; }  // its tensors were given storage again
  void markHollow(size_t i) { hollow_[i] = 1; }  // its tensors were freed by the caller
  // The shape of every parameter of parameters(), as built (also of
  // hollow layers).
  std::vector<std::vector<int64_t>> parameterShapes() const;

 private:
  std::vector<std::string> names_;
  std::vector<std::shared_ptr<Layer>> layers_;
  std::vector<std::vector<std::vector<int64_t>>> shapes_;  // per layer, per parameter
  std::vector<char> hollow_;
};

// Builds the job's model with parameters initialised from `seed`. Layer
// l's initial weights depend on (seed, l) only. With `held`, every layer l
// that is not held (l >= held->size() or !held[l]) is hollowed as soon as
// it is built, so memory peaks at the held layers plus one other: what a
// pipeline stage builds.
std::shared_ptr<LayerList> buildModel(const ModelSpec& spec, uint64_t seed,
                                      const std::vector<char>* held = nullptr);

// model.name = "torchscript" (models/torchscript.cpp; docs/models.md): the
// module file's forward, cut into layers at its cut points (models/graph.h:
// the default cuts, or model.cuts); their weights are the file's (the seed
// does not re-initialise them). Batch norms at any depth keep per-VN
// statistics (a VnBatchNorm over the module's tensors). InputError naming
// the file for a file that is not TorchScript, a forward that does not take
// and return one tensor, a module without parameters, a shared weight, a
// non-float32 parameter, a batch norm Morph cannot rewrite or a model.cuts
// entry that is not a cut point.
std::shared_ptr<LayerList> buildTorchScriptModel(const ModelSpec& spec, const std::vector<char>* held);

// Before a job starts: for a TorchScript model, one forward (evaluation
// mode) of a batch of two samples of the data's shape through the layers
// checks that every layer runs, that the module's own forward gives the
// same output, and that the output fits the loss. InputError naming the file and the problem. Nothing for
// the built-in models.
void checkModel(const JobSpec& job);

}  // namespace morph
