// TorchScript models: a module saved from Python with torch.jit.save, cut
// into Morph's layers at cut points of its inlined forward graph
// (models/graph.h; docs/models.md).
//
// Each layer is a segment of that graph, run by the TorchScript
// interpreter on the module object with the graph executor's optimisations
// off: no fusion, no autodiff subgraphs, no re-optimisation after a few
// profiled runs, so a VN computes the same bits as eager PyTorch would, on
// its first run and its thousandth, on any worker. The parameters and
// buffers a segment reads are registered as the layer's own (the same
// tensors, under their module paths), so everything that walks them (exact
// reduction, optimiser, checkpoints, model hash, hollowing and moving
// pipeline layers) works on the tensors the scripted code reads. Dropout in
// scripted code draws from the default generator, which LayerList reseeds
// before each layer from (seed, step, VN, layer). Batch norms at any depth
// are rewritten to morph::vn_batch_norm, whose statistics a VnBatchNorm
// over the module's own tensors hands to the executor.
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>
#include <torch/script.h>

#include <map>

#include "core/error.h"
#include "core/npy.h"
#include "models/graph.h"
#include "models/model.h"
#include "models/shape_text.h"

namespace morph {
namespace {

std::string firstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

// An error's first line; for one the TorchScript interpreter re-raises
// (whose first line only says that an operation failed), the original
// error's line at the end ("RuntimeError: index out of range in self").
std::string errorText(const std::exception& e) {
  const auto* c = dynamic_cast<const c10::Error*>(&e);
  const std::string text = c ? c->what_without_backtrace() : e.what();
  const std::string first = firstLine(text);
  if (first.rfind("The following operation failed in the TorchScript interpreter", 0) != 0) return first;
  const size_t end = text.find_last_not_of("\n ");
  if (end == std::string::npos) return first;
  const size_t begin = text.rfind('\n', end);
  const std::string last = text.substr(begin == std::string::npos ? 0 : begin + 1, end + 1 - (begin == std::string::npos ? 0 : begin + 1));
  return last.find("Error: ") != std::string::npos ? last : first;
}

// One segment of the module's forward. Its tensors are registered under
// their module paths (a parameter "layer1.0.conv1.weight" of layer
// "layer1.0" is the submodule layer1, its submodule 0, ...), a batch
// norm's as a VnBatchNorm at the batch norm's path.
class GraphLayer : public Layer {
 public:
  GraphLayer(torch::jit::Module root, const GraphSegment& seg)
      : root_(std::move(root)), fn_(std::make_unique<torch::jit::GraphFunction>("morph_layer", seg.graph, nullptr)) {
    std::map<std::vector<std::string>, const GraphBatchNorm*> bns;
    for (const auto& b : seg.batch_norms) {
      bns[b.module_path] = &b;
      stats_.push_back(torch::zeros({b.weight.size(0)}));
      stats_.push_back(torch::zeros({b.weight.size(0)}));
    }
    std::map<std::vector<std::string>, torch::nn::Module*> nodes{{{}, this}};
    std::function<torch::nn::Module*(const std::vector<std::string>&)> node =
        [&](const std::vector<std::string>& path) -> torch::nn::Module* {
      auto it = nodes.find(path);
      if (it != nodes.end()) return it->second;
      std::vector<std::string> parent(path.begin(), path.end() - 1);
      torch::nn::Module* up = node(parent);
      std::shared_ptr<torch::nn::Module> m;
      if (auto b = bns.find(path); b != bns.end()) {
        const GraphBatchNorm& bn = *b->second;
        const size_t k = static_cast<size_t>(b->second - seg.batch_norms.data());
        m = std::make_shared<VnBatchNorm>(bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.momentum, bn.eps,
                                          stats_[2 * k], stats_[2 * k + 1]);
      } else {
        m = std::make_shared<torch::nn::Module>();
      }
      up->register_module(path.back(), m);
      return nodes[path] = m.get();
    };
    for (const auto& t : seg.tensors) {
      if (bns.count(t.module_path)) {
        node(t.module_path);  // the VnBatchNorm holds weight, bias and running statistics
        continue;              // num_batches_tracked is not Morph's (docs/models.md)
      }
      torch::nn::Module* m = node(t.module_path);
      if (t.parameter)
        m->register_parameter(t.name, t.value);
      else
        m->register_buffer(t.name, t.value);
    }
    // A weight an earlier layer owns: a leaf of its own on the owner's
    // storage (the executor adds its gradient into the owner's).
    for (const auto& t : seg.tied) {
      tied_.emplace_back(t.value.detach().requires_grad_(true), t.value);
    }
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    // Off for good (the setting may be per thread: set where forward runs).
    if (torch::jit::getGraphExecutorOptimize()) torch::jit::setGraphExecutorOptimize(false);
    torch::jit::Stack stack;
    stack.reserve(2 + stats_.size() + tied_.size());
    stack.emplace_back(root_._ivalue());
    stack.emplace_back(x);
    for (const auto& t : stats_) stack.emplace_back(t);
    for (const auto& t : tied_) stack.emplace_back(t.first);
    fn_->run(stack);
    return stack.back().toTensor();
  }
  std::vector<std::pair<torch::Tensor, torch::Tensor>> tiedLeaves() override { return tied_; }
  void train(bool on) override {
    Layer::train(on);
    root_.train(on);  // the scripted code reads `self.training` (dropout, batch norm)
  }

 private:
  torch::jit::Module root_;
  std::unique_ptr<torch::jit::GraphFunction> fn_;
  std::vector<torch::Tensor> stats_;  // per batch norm: mean, unbiased variance
  std::vector<std::pair<torch::Tensor, torch::Tensor>> tied_;  // (alias, owner) per shared weight
};

}  // namespace

std::shared_ptr<LayerList> buildTorchScriptModel(const ModelSpec& spec, const std::vector<char>* held) {
  const std::string& path = spec.path;
  torch::jit::Module root;
  try {
    root = torch::jit::load(path);
  } catch (const std::exception& e) {
    throw InputError(path + ": not a TorchScript module file (torch.jit.load: " + errorText(e) +
                     "); save one from Python with torch.jit.save(torch.jit.script(module), path)");
  }
  if (root.named_parameters(true).size() == 0) throw InputError(path + ": the module has no parameters to train");
  ModelGraph graph(root, path);
  const std::vector<GraphSegment> segments =
      graph.segments(spec.cuts.empty() ? graph.defaultCuts() : graph.cutsAt(spec.cuts));
  auto model = std::make_shared<LayerList>();
  std::map<std::string, std::string> layer_of;  // tensor -> the layer that reads it
  for (const auto& seg : segments) {
    for (const auto& t : seg.tensors) {
      auto [it, fresh] = layer_of.emplace(t.fullName(), seg.name);
      if (!fresh && it->second != seg.name)
        throw InputError(path + ": '" + t.fullName() + "' is read by the layers '" + it->second + "' and '" +
                         seg.name + "'; Morph's TorchScript layers do not share tensors yet (choose model.cuts that "
                         "keep its readers in one layer)");
    }
    auto layer = std::make_shared<GraphLayer>(root, seg);
    for (const auto& p : layer->named_parameters(true))
      if (p.value().scalar_type() != torch::kFloat32)
        throw InputError(path + ": parameter '" + p.key() + "' is " + std::string(c10::toString(p.value().scalar_type())) +
                         "; Morph trains float32 parameters (call module.float() before saving)");
    model->add(seg.name, layer);
    const size_t l = model->size() - 1;
    if (held && (l >= held->size() || !(*held)[l])) model->hollow(l);
  }
  model->train();
  return model;
}

void checkModel(const JobSpec& job) {
  const ModelSpec& spec = job.model;
  if (spec.name != "torchscript") return;
  const std::string& path = spec.path;
  auto model = buildTorchScriptModel(spec, nullptr);
  model->eval();
  torch::NoGradGuard no_grad;
  const int64_t b = 2;
  std::vector<int64_t> shape{b};
  shape.insert(shape.end(), spec.input.begin(), spec.input.end());
  torch::manual_seed(0x5eed);
  torch::Tensor x = torch::randn(shape);
  std::string input_note = " (a batch of the data's samples)";
  if (job.data.dataset == "npy" && readNpyHeader(job.data.train_x).kind == 'i') {
    // Token ids: the first training sample, and one of the largest id in
    // either split (an embedding too small for the data fails here).
    int64_t top = 0;
    for (const std::string* f : {&job.data.train_x, &job.data.test_x}) {
      NpyMap m(*f);
      if (m.header().count() > 0) top = std::max(top, npyIntRange(m).second);
    }
    x = torch::full(shape, top, torch::kInt64);
    NpyMap m(job.data.train_x);
    if (m.header().shape[0] > 0) std::memcpy(x.data_ptr<int64_t>(), m.data(), static_cast<size_t>(x.size(1)) * 8);
    input_note = " (token ids: the first training sample and one of the largest id, " + std::to_string(top) + ")";
  }
  torch::Tensor out = x;
  for (size_t l = 0; l < model->size(); ++l) {
    const torch::Tensor in = out;
    try {
      out = model->layer(l).forward(in);
    } catch (const std::exception& e) {
      throw InputError(path + ": the layer '" + model->layerName(l) + "' fails on an input of shape " +
                       shapeText(in.sizes()) + (l == 0 ? input_note : "") + ": " + errorText(e));
    }
  }
  if (out.scalar_type() != torch::kFloat32)
    throw InputError(path + ": the output is " + std::string(c10::toString(out.scalar_type())) + "; expected float32");
  // The layers in order are the module's forward (a check of the cuts).
  {
    torch::jit::Module root = torch::jit::load(path);
    root.eval();
    torch::Tensor whole;
    try {
      torch::jit::setGraphExecutorOptimize(false);
      whole = root.forward({x}).toTensor();
    } catch (const std::exception& e) {
      throw InputError(path + ": the module's forward fails on an input of shape " +
                       shapeText(x.sizes()) + ": " + errorText(e));
    }
    if (!whole.sizes().equals(out.sizes()) || !torch::allclose(whole, out, 1e-4, 1e-5))
      throw InternalError(path + ": the module's forward gives an output of shape " +
                          shapeText(whole.sizes()) + " that its layers in order do not (" +
                          shapeText(out.sizes()) + "): a bug in Morph's graph cuts");
  }
  // The output must fit the loss.
  if (job.regression()) {
    int64_t per_sample = 1;
    std::string target;
    for (int64_t v : spec.target) per_sample *= v, target += ", " + std::to_string(v);
    if (out.dim() < 1 || out.size(0) != b || out.numel() != b * per_sample)
      throw InputError(path + ": the output of shape " + shapeText(out.sizes()) + " for " + std::to_string(b) +
                       " samples does not fit the mse loss: the targets (" + job.data.train_y + ") are (" +
                       std::to_string(b) + target + ")");
  } else if (!spec.target.empty()) {
    // Token labels (b, T): a class per position.
    if (out.dim() != 3 || out.size(0) != b || out.size(1) != spec.target[0] || out.size(2) < spec.classes)
      throw InputError(path + ": the output of shape " + shapeText(out.sizes()) + " for " + std::to_string(b) +
                       " samples does not fit the cross_entropy loss over token labels (" + job.data.train_y +
                       "): expected (" + std::to_string(b) + ", " + std::to_string(spec.target[0]) +
                       ", classes) with classes >= " + std::to_string(spec.classes) + " (the labels 0.." +
                       std::to_string(spec.classes - 1) + ")");
  } else if (out.dim() != 2 || out.size(0) != b || out.size(1) < spec.classes) {
    throw InputError(path + ": the output of shape " + shapeText(out.sizes()) + " for " + std::to_string(b) +
                     " samples does not fit the cross_entropy loss: expected (" + std::to_string(b) +
                     ", classes) with classes >= " + std::to_string(spec.classes) + " (the data's labels 0.." +
                     std::to_string(spec.classes - 1) + ")");
  }
}

}  // namespace morph
