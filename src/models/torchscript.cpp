// TorchScript models: a module saved from Python with torch.jit.save, whose
// ordered top-level children become Morph's layers (docs/models.md).
//
// Each child runs through the TorchScript interpreter with the graph
// executor's optimisations off: no fusion, no autodiff subgraphs, no
// re-optimisation after a few profiled runs, so a VN computes the same bits
// as eager PyTorch would, on its first run and its thousandth, on any
// worker. The child's parameters and buffers are registered as this
// library's module's own (the same tensors, under the child's names), so
// everything that walks them (exact reduction, optimiser, checkpoints,
// model hash, hollowing and moving pipeline layers) works on the tensors
// the scripted code reads. Dropout in scripted code draws from the default
// generator, which LayerList reseeds before each layer from (seed, step,
// VN, layer). Batch norm needs Morph's per-VN statistics: a top-level
// BatchNorm child is replaced by a VnBatchNorm carrying its state; one
// nested inside a child cannot be, and the model is refused.
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>
#include <torch/script.h>

#include <map>

#include "core/error.h"
#include "models/model.h"

namespace morph {
namespace {

std::string firstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

std::string errorText(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return firstLine(c->what_without_backtrace());
  return firstLine(e.what());
}

// "__torch__.torch.nn.modules.batchnorm.___torch_mangle_3.BatchNorm2d" ->
// "BatchNorm2d" when the class is one of torch.nn's batch norms, else "".
std::string batchNormKind(const torch::jit::Module& m) {
  const auto name = m.type()->name();
  if (!name) return "";
  const std::string q = name->qualifiedName();
  const std::string base = q.substr(q.rfind('.') + 1);
  if (q.find("torch.nn.modules.batchnorm.") == std::string::npos) return "";
  if (base == "BatchNorm1d" || base == "BatchNorm2d" || base == "BatchNorm3d" || base == "SyncBatchNorm") return base;
  return "";
}

std::string shapeOf(const torch::Tensor& t) {
  std::string s;
  for (int64_t v : t.sizes()) s += (s.empty() ? "" : ", ") + std::to_string(v);
  return "(" + s + (t.dim() == 1 ? ",)" : ")");
}

// The parameters and buffers of a scripted submodule, as a plain module:
// the same tensors (not copies), its children mirrored under their names.
class JitMirror : public torch::nn::Module {
 public:
  explicit JitMirror(const torch::jit::Module& m) {
    for (const auto& p : m.named_parameters(/*recurse=*/false)) register_parameter(p.name, p.value);
    for (const auto& b : m.named_buffers(/*recurse=*/false)) register_buffer(b.name, b.value);
    for (const auto& c : m.named_children()) register_module(c.name, std::make_shared<JitMirror>(c.value));
  }
};

// One top-level child. Its parameters, in the order the module declares
// them, are this layer's (the names are the child's own: "conv.weight").
class TorchScriptLayer : public Layer {
 public:
  explicit TorchScriptLayer(torch::jit::Module m) : module_(std::move(m)) {
    for (const auto& p : module_.named_parameters(false)) register_parameter(p.name, p.value);
    for (const auto& b : module_.named_buffers(false)) register_buffer(b.name, b.value);
    for (const auto& c : module_.named_children()) register_module(c.name, std::make_shared<JitMirror>(c.value));
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    // Off for good (the setting may be per thread: set where forward runs).
    if (torch::jit::getGraphExecutorOptimize()) torch::jit::setGraphExecutorOptimize(false);
    return module_.forward({x}).toTensor();
  }
  void train(bool on) override {
    Layer::train(on);
    module_.train(on);  // the scripted code reads `self.training` (dropout)
  }

 private:
  torch::jit::Module module_;
};

// An attribute, or a constant (torch.nn's batch norms declare eps,
// momentum, affine and track_running_stats in __constants__, which
// scripting bakes into the class); None when it has neither.
c10::IValue valueOf(const torch::jit::Module& m, const std::string& name) {
  if (m.hasattr(name)) return m.attr(name);
  if (m.type()->hasConstant(name)) return m.type()->getConstant(name);
  return c10::IValue();
}

double doubleAttr(const torch::jit::Module& m, const char* name) {
  const c10::IValue v = valueOf(m, name);
  return v.isDouble() ? v.toDouble() : -1.0;
}

bool boolAttr(const torch::jit::Module& m, const char* name) {
  const c10::IValue v = valueOf(m, name);
  return v.isBool() && v.toBool();
}

// A top-level batch norm child as a VnBatchNorm with its weight, bias,
// running statistics, momentum and eps.
std::shared_ptr<Layer> vnBatchNormOf(const torch::jit::Module& m, const std::string& name, const std::string& path,
                                     const std::string& kind) {
  auto refuse = [&](const std::string& why) {
    throw InputError(path + ": batch norm '" + name + "' (" + kind + ") " + why);
  };
  const double momentum = doubleAttr(m, "momentum"), eps = doubleAttr(m, "eps");
  if (momentum < 0) refuse("has momentum=None (a cumulative average); Morph needs a momentum such as 0.1");
  if (eps < 0) refuse("has no eps");
  if (!boolAttr(m, "affine")) refuse("has affine=False; Morph's batch norm is affine");
  if (!boolAttr(m, "track_running_stats")) refuse("has track_running_stats=False; Morph keeps running statistics");
  for (const char* t : {"weight", "bias", "running_mean", "running_var"})
    if (!m.hasattr(t) || !m.attr(t).isTensor()) refuse(std::string("has no tensor '") + t + "'");
  const torch::Tensor w = m.attr("weight").toTensor(), b = m.attr("bias").toTensor();
  const torch::Tensor rm = m.attr("running_mean").toTensor(), rv = m.attr("running_var").toTensor();
  for (const auto& t : {w, b, rm, rv})
    if (t.scalar_type() != torch::kFloat32 || t.dim() != 1 || t.size(0) != w.size(0))
      refuse("holds tensors that are not float32 vectors of its channel count");
  auto bn = std::make_shared<VnBatchNorm>(w.size(0), momentum, eps);
  torch::NoGradGuard no_grad;
  auto params = bn->named_parameters(false);
  auto buffers = bn->named_buffers(false);
  params["weight"].copy_(w);
  params["bias"].copy_(b);
  buffers["running_mean"].copy_(rm);
  buffers["running_var"].copy_(rv);
  return bn;
}

// Refuses a child holding a batch norm below it, in a submodule or called
// as a function: its statistics would be the VN's but its running
// statistics would be updated per VN inside the scripted code.
void refuseNestedBatchNorm(const torch::jit::Module& child, const std::string& name, const std::string& path) {
  for (const auto& sub : child.named_modules()) {
    if (sub.name.empty()) continue;
    const std::string kind = batchNormKind(sub.value);
    if (!kind.empty())
      throw InputError(path + ": batch norm '" + name + "." + sub.name + "' (" + kind +
                       ") is nested inside the top-level child '" + name +
                       "'; Morph keeps per-VN batch-norm statistics only for top-level children: make it a top-level "
                       "child of the module (its forward then runs it between the children before and after it)");
  }
  if (!child.find_method("forward")) return;
  auto graph = child.get_method("forward").graph()->copy();
  torch::jit::Inline(*graph);
  for (const torch::jit::Node* n : graph->nodes())
    if (n->kind() == c10::Symbol::fromQualString("aten::batch_norm") ||
        n->kind() == c10::Symbol::fromQualString("aten::native_batch_norm"))
      throw InputError(path + ": the top-level child '" + name +
                       "' calls batch norm as a function; Morph keeps per-VN batch-norm statistics only for "
                       "top-level nn.BatchNorm children: make it one");
}

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
  const auto children = root.named_children();
  if (children.size() == 0)
    throw InputError(path + ": the module has no children; Morph's layers are the module's top-level children "
                            "(e.g. an nn.Sequential, or submodules assigned in __init__ in the order they run)");
  for (const auto& p : root.named_parameters(false))
    throw InputError(path + ": parameter '" + p.name +
                     "' belongs to the module itself, outside its children; move it into a child");
  for (const auto& b : root.named_buffers(false))
    throw InputError(path + ": buffer '" + b.name + "' belongs to the module itself, outside its children; move it into a child");
  auto model = std::make_shared<LayerList>();
  // Every parameter once: a weight two children share (tied in Python)
  // would be updated twice.
  std::map<const void*, std::string> owner;
  for (const auto& c : children)
    for (const auto& p : c.value.named_parameters(true)) {
      const std::string name = c.name + "." + p.name;
      auto [it, fresh] = owner.emplace(p.value.unsafeGetTensorImpl(), name);
      if (!fresh)
        throw InputError(path + ": parameter '" + name + "' is the same tensor as '" + it->second +
                         "' (a shared weight); Morph's TorchScript models do not share weights between or within children");
    }
  for (const auto& c : children) {
    const std::string kind = batchNormKind(c.value);
    std::shared_ptr<Layer> layer;
    if (!kind.empty()) {
      layer = vnBatchNormOf(c.value, c.name, path, kind);
    } else {
      refuseNestedBatchNorm(c.value, c.name, path);
      if (!c.value.find_method("forward"))
        throw InputError(path + ": the top-level child '" + c.name + "' has no forward method");
      layer = std::make_shared<TorchScriptLayer>(c.value);
    }
    for (const auto& p : layer->named_parameters(true))
      if (p.value().scalar_type() != torch::kFloat32)
        throw InputError(path + ": parameter '" + c.name + "." + p.key() + "' is " +
                         std::string(c10::toString(p.value().scalar_type())) +
                         "; Morph trains float32 parameters (call module.float() before saving)");
    model->add(c.name, layer);
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
  const torch::Tensor x = torch::randn(shape);
  torch::Tensor out = x;
  for (size_t l = 0; l < model->size(); ++l) {
    const torch::Tensor in = out;
    try {
      out = model->layer(l).forward(in);
    } catch (const std::exception& e) {
      throw InputError(path + ": the top-level child '" + model->layerName(l) + "' fails on an input of shape " +
                       shapeOf(in) + (l == 0 ? " (a batch of the data's samples)" : "") + ": " + errorText(e));
    }
  }
  if (out.scalar_type() != torch::kFloat32)
    throw InputError(path + ": the output is " + std::string(c10::toString(out.scalar_type())) + "; expected float32");
  // Morph runs the children in order; the module's own forward must be that.
  {
    torch::jit::Module root = torch::jit::load(path);
    root.eval();
    torch::Tensor whole;
    try {
      torch::jit::setGraphExecutorOptimize(false);
      whole = root.forward({x}).toTensor();
    } catch (const std::exception& e) {
      throw InputError(path + ": the module's forward fails on an input of shape " + shapeOf(x) + ": " + errorText(e));
    }
    if (!whole.sizes().equals(out.sizes()) || !torch::allclose(whole, out, 1e-4, 1e-5))
      throw InputError(path + ": the module's forward is not its top-level children applied in order (output " +
                       shapeOf(whole) + " vs " + shapeOf(out) +
                       " from the children); Morph trains the children in order: move any computation between "
                       "them into a child (e.g. nn.Flatten)");
  }
  // The output must fit the loss.
  if (job.regression()) {
    int64_t per_sample = 1;
    std::string target;
    for (int64_t v : spec.target) per_sample *= v, target += ", " + std::to_string(v);
    if (out.dim() < 1 || out.size(0) != b || out.numel() != b * per_sample)
      throw InputError(path + ": the output of shape " + shapeOf(out) + " for " + std::to_string(b) +
                       " samples does not fit the mse loss: the targets (" + job.data.train_y + ") are (" +
                       std::to_string(b) + target + ")");
  } else if (out.dim() != 2 || out.size(0) != b || out.size(1) < spec.classes) {
    throw InputError(path + ": the output of shape " + shapeOf(out) + " for " + std::to_string(b) +
                     " samples does not fit the cross_entropy loss: expected (" + std::to_string(b) +
                     ", classes) with classes >= " + std::to_string(spec.classes) + " (the data's labels 0.." +
                     std::to_string(spec.classes - 1) + ")");
  }
}

}  // namespace morph
