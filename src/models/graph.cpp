// The graph analysis of TorchScript models (models/graph.h, docs/models.md).
#include "models/graph.h"

#include <torch/csrc/jit/ir/alias_analysis.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/passes/inliner.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "models/module_path.h"

namespace morph {

using torch::jit::Node;
using torch::jit::Value;

std::string GraphTensor::fullName() const {
  std::string s;
  for (const auto& p : module_path) s += p + ".";
  return s + name;
}

namespace {

std::string join(const std::vector<std::string>& parts, size_t n = SIZE_MAX) {
  std::string s;
  for (size_t i = 0; i < std::min(n, parts.size()); ++i) s += (i ? "." : "") + parts[i];
  return s;
}

// nn.Sequential, nn.ModuleList, nn.ModuleDict: modules whose forward only
// calls their elements in turn (scripted classes carry a mangled name:
// "__torch__.torch.nn.modules.container.___torch_mangle_3.Sequential").
bool isContainer(const torch::jit::Module& m) {
  const auto name = m.type()->name();
  if (!name) return false;
  const std::string q = name->qualifiedName();
  if (q.find("torch.nn.modules.container.") == std::string::npos) return false;
  const std::string base = q.substr(q.rfind('.') + 1);
  return base == "Sequential" || base == "ModuleList" || base == "ModuleDict";
}

c10::optional<torch::jit::Module> moduleAt(const torch::jit::Module& root, const std::vector<std::string>& path,
                                           size_t n) {
  torch::jit::Module m = root;
  for (size_t i = 0; i < std::min(n, path.size()); ++i) {
    if (!m.hasattr(path[i])) return c10::nullopt;
    const c10::IValue v = m.attr(path[i]);
    if (!v.isModule()) return c10::nullopt;
    m = v.toModule();
  }
  return m;
}

bool staticKind(const Node* n) {
  static const std::set<std::string> kinds = {"prim::Constant", "prim::GetAttr", "prim::ListConstruct",
                                              "prim::TupleConstruct", "aten::__not__", "aten::__is__",
                                              "aten::__isnot__"};
  return n->blocks().empty() && kinds.count(n->kind().toQualString()) != 0;
}

bool isTensor(const Value* v) { return v->type()->kind() == c10::TypeKind::TensorType; }

// "__torch__.torch.nn.modules.batchnorm.___torch_mangle_3.BatchNorm2d" ->
// "BatchNorm2d"; a module of another class -> its class name.
std::string className(const torch::jit::Module& m) {
  const auto name = m.type()->name();
  if (!name) return "module";
  const std::string q = name->qualifiedName();
  return q.substr(q.rfind('.') + 1);
}

// morph::vn_batch_norm: aten::batch_norm whose training-mode forward
// normalises with the batch's own statistics and writes them (the mean and
// the unbiased variance, exactly as batch_norm's running-statistics update
// computes them) into stat_mean and stat_var instead of updating the
// running statistics; in evaluation mode, aten::batch_norm itself.
torch::Tensor vnBatchNormOp(const torch::Tensor& input, const c10::optional<torch::Tensor>& weight,
                            const c10::optional<torch::Tensor>& bias, const c10::optional<torch::Tensor>& running_mean,
                            const c10::optional<torch::Tensor>& running_var, bool training, double momentum,
                            double eps, bool cudnn_enabled, const torch::Tensor& stat_mean,
                            const torch::Tensor& stat_var) {
  if (!training) return at::batch_norm(input, weight, bias, running_mean, running_var, false, momentum, eps, cudnn_enabled);
  // momentum 1: "running" = 1 * stat + 0 * 0, the statistic itself. Fresh
  // tensors: batch_norm's backward keeps them, and the next VN's forward may
  // run before this VN's backward (a pipeline).
  torch::Tensor mean = torch::zeros_like(stat_mean), var = torch::zeros_like(stat_var);
  torch::Tensor y = at::batch_norm(input, weight, bias, mean, var, true, 1.0, eps, cudnn_enabled);
  torch::NoGradGuard no_grad;
  stat_mean.copy_(mean);
  stat_var.copy_(var);
  return y;
}

TORCH_LIBRARY(morph, m) {
  m.def("vn_batch_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean, Tensor? running_var, "
        "bool training, float momentum, float eps, bool cudnn_enabled, Tensor stat_mean, Tensor stat_var) -> Tensor",
        vnBatchNormOp);
}

// The GetAttr chain from the graph's `self` to v: {"layer1", "0", "conv1",
// "weight"}, or empty when v is not read from `self` that way.
std::vector<std::string> attrChain(const Value* v, const Value* self) {
  std::vector<std::string> out;
  while (v != self) {
    const Node* n = v->node();
    if (n->kind() != c10::prim::GetAttr) return {};
    out.push_back(n->s(c10::attr::name));
    v = n->input(0);
  }
  std::reverse(out.begin(), out.end());
  return out;
}

// The module path of a module value: the GetAttr chain from `self`
// ({} for self itself), or nullopt when it is not read from self that way.
c10::optional<std::vector<std::string>> modulePathOf(const Value* v, const Value* self) {
  if (v == self) return std::vector<std::string>{};
  std::vector<std::string> chain = attrChain(v, self);
  if (chain.empty()) return c10::nullopt;
  return chain;
}

}  // namespace

// Inlines every call of forward, recording the module path each node
// computes in: a method call runs in the module it is called on (its
// GetAttr chain from self), a function call where it is called.
void ModelGraph::inlineAll() {
  const Value* self = graph_->inputs()[0];
  std::function<void(torch::jit::Block*, const std::vector<std::string>&)> mark =
      [&](torch::jit::Block* b, const std::vector<std::string>& path) {
        for (Node* n : b->nodes()) {
          where_[n] = path;
          for (torch::jit::Block* sub : n->blocks()) mark(sub, path);
        }
      };
  mark(graph_->block(), {});
  std::function<Node*(torch::jit::Block*)> findCall = [&](torch::jit::Block* b) -> Node* {
    for (Node* n : b->nodes()) {
      if (n->kind() == c10::prim::CallMethod || n->kind() == c10::prim::CallFunction) return n;
      for (torch::jit::Block* sub : n->blocks())
        if (Node* c = findCall(sub)) return c;
    }
    return nullptr;
  };
  while (Node* call = findCall(graph_->block())) {
    std::vector<std::string> path = where_.at(call);
    torch::jit::GraphFunction* fn = nullptr;
    if (call->kind() == c10::prim::CallMethod) {
      const auto cls = call->input(0)->type()->cast<c10::ClassType>();
      if (cls) fn = torch::jit::tryToGraphFunction(cls->getMethod(call->s(c10::attr::name)));
      if (auto p = modulePathOf(call->input(0), self)) path = *p;
    } else if (const auto f = call->input(0)->type()->cast<c10::FunctionType>()) {
      fn = torch::jit::tryToGraphFunction(*f->function());
      if (fn) call->removeInput(0);  // the function itself (as torch's Inline does)
    }
    if (!fn)
      throw InputError(file_ + ": forward calls " + std::string(call->kind().toQualString()) +
                       " on something that is not TorchScript code Morph can inline");
    Node* before = call->prev();
    Node* after = call->next();
    torch::jit::Block* block = call->owningBlock();
    // The callee's own graph, never its optimised one (which depends on the
    // graph executor setting of the moment).
    torch::jit::inlineCallTo(call, fn, /*inline_optimized_graph=*/false);
    where_.erase(call);
    for (Node* n = before->next(); n != after && n != block->return_node(); n = n->next()) {
      where_[n] = path;
      for (torch::jit::Block* sub : n->blocks()) mark(sub, path);
    }
  }
}

ModelGraph::ModelGraph(torch::jit::Module root, std::string file) : root_(std::move(root)), file_(std::move(file)) {
  if (!root_.find_method("forward")) throw InputError(file_ + ": the module has no forward method");
  graph_ = root_.get_method("forward").graph()->copy();
  inlineAll();
  const size_t inputs = graph_->inputs().size() - 1;  // less `self`
  if (inputs != 1 || !isTensor(graph_->inputs()[1]))
    throw InputError(file_ + ": forward takes " + std::to_string(inputs) + " input" + (inputs == 1 ? "" : "s") +
                     (inputs == 1 ? " of type " + graph_->inputs()[1]->type()->repr_str() : "") +
                     "; Morph feeds the model one tensor (a batch of samples): forward(self, x: Tensor) -> Tensor");
  if (graph_->outputs().size() != 1 || !isTensor(graph_->outputs()[0]))
    throw InputError(file_ + ": forward returns " + graph_->outputs()[0]->type()->repr_str() +
                     "; Morph needs one tensor (the model's output) from forward");
  std::unordered_map<const Node*, size_t> pos;
  for (Node* n : graph_->nodes()) {
    pos[n] = nodes_.size();
    nodes_.push_back(n);
  }
  const size_t n = nodes_.size();
  // Values that only read the module (constants, attributes, lists of them):
  // every segment that reads one makes its own.
  std::unordered_set<const Value*> statics{graph_->inputs()[0]};
  compute_.assign(n, 1);
  for (size_t p = 0; p < n; ++p) {
    const Node* node = nodes_[p];
    if (!staticKind(node)) continue;
    bool all = true;
    for (const Value* in : node->inputs()) all = all && statics.count(in);
    if (!all) continue;
    for (const Value* out : node->outputs()) statics.insert(out);
    compute_[p] = 0;
  }
  // Liveness of the other values: from their definition to their last use
  // (a use inside a block counts at the block's top-level node).
  auto topOf = [&](const Node* user) -> size_t {
    while (user->owningBlock() != graph_->block()) user = user->owningBlock()->owningNode();
    if (user == graph_->return_node()) return n;
    return pos.at(user);
  };
  live_.assign(n + 1, {});
  auto track = [&](const Value* v, size_t first) {
    if (statics.count(v)) return;
    size_t last = first;  // unused: live nowhere
    bool used = false;
    for (const auto& use : v->uses()) {
      last = std::max(last, topOf(use.user));
      used = true;
    }
    if (!used) return;
    for (size_t q = first; q <= last; ++q) live_[q].push_back(v);
  };
  track(graph_->inputs()[1], 0);
  for (size_t p = 0; p < n; ++p)
    for (const Value* out : nodes_[p]->outputs()) track(out, p + 1);
  statics_ = std::move(statics);
  // Module paths and units.
  paths_.resize(n);
  units_.resize(n);
  boxed_.assign(n, 0);
  const bool root_container = isContainer(root_);
  for (size_t p = 0; p < n; ++p) {
    if (!compute_[p]) continue;
    paths_[p] = where_.at(nodes_[p]);
    const auto& path = paths_[p];
    if (path.empty()) continue;  // the module's own forward
    size_t k = 1;
    while (k < path.size()) {
      auto m = moduleAt(root_, path, k);
      if (!m || !isContainer(*m)) break;
      ++k;
    }
    units_[p].assign(path.begin(), path.begin() + k);
    boxed_[p] = k > 1 || root_container;
  }
  for (size_t p = 0; p < n; ++p) {
    if (!compute_[p]) continue;
    for (size_t k = 1; k <= paths_[p].size(); ++k) {
      auto [it, fresh] = spans_.emplace(join(paths_[p], k), std::make_pair(p, p));
      if (!fresh) it->second.second = p;
    }
  }
  size_t computed = 0;
  for (size_t p = 0; p < n; ++p) {
    if (!compute_[p]) continue;
    if (computed++ > 0 && live_[p].size() == 1 && isTensor(live_[p][0])) cut_points_.push_back(p);
  }
}

namespace {

// Whether at most one of a and b runs: they lie in different blocks of one
// prim::If.
bool exclusive(const Node* a, const Node* b) {
  std::vector<const torch::jit::Block*> up;  // a's blocks, innermost first
  for (const torch::jit::Block* x = a->owningBlock(); x; x = x->owningNode() ? x->owningNode()->owningBlock() : nullptr)
    up.push_back(x);
  const torch::jit::Block* child_b = nullptr;  // the block below the common one on b's side
  const torch::jit::Block* x = b->owningBlock();
  while (std::find(up.begin(), up.end(), x) == up.end()) {
    child_b = x;
    x = x->owningNode()->owningBlock();
  }
  const auto at = std::find(up.begin(), up.end(), x);
  if (at == up.begin() || !child_b) return false;  // one of them is in the common block itself
  const torch::jit::Block* child_a = *(at - 1);
  return child_a->owningNode() == child_b->owningNode() && child_a != child_b &&
         child_a->owningNode()->kind() == c10::prim::If;
}

}  // namespace

// Every aten::batch_norm of the segment becomes morph::vn_batch_norm,
// writing a training forward's statistics into two more graph inputs.
void ModelGraph::rewriteBatchNorms(GraphSegment& seg, const std::shared_ptr<torch::jit::Graph>& g) const {
  const Value* self = g->inputs()[0];
  std::vector<Node*> found;
  std::function<void(torch::jit::Block*)> walk = [&](torch::jit::Block* b) {
    for (Node* node : b->nodes()) {
      for (torch::jit::Block* sub : node->blocks()) walk(sub);
      if (node->kind() == c10::aten::batch_norm) found.push_back(node);
    }
  };
  walk(g->block());
  std::map<std::string, std::pair<Node*, size_t>> seen;  // module path -> first node, index
  for (Node* bn : found) {
    std::vector<std::string> caller = attrChain(bn->input(1), self);
    if (!caller.empty()) caller.pop_back();
    auto refuse = [&](const std::string& who, const std::string& why) {
      throw InputError(file_ + ": batch norm " + who + " " + why);
    };
    std::vector<std::string> mean_chain = attrChain(bn->input(3), self);
    const std::string called = "called in '" + (caller.empty() ? std::string("forward") : join(caller)) + "'";
    if (!caller.empty()) {  // nn.BatchNorm(track_running_stats=False) passes None in training
      auto owner = moduleAt(root_, caller, caller.size());
      if (owner && owner->type()->hasConstant("track_running_stats") &&
          owner->type()->getConstant("track_running_stats") == c10::IValue(false))
        refuse("'" + join(caller) + "' (" + className(*owner) + ")",
               "has track_running_stats=False; Morph keeps running statistics");
    }
    if (bn->input(3)->type()->kind() == c10::TypeKind::NoneType)
      refuse(called, "has no running statistics (track_running_stats=False); Morph keeps running statistics");
    if (mean_chain.empty() || mean_chain.back() != "running_mean")
      refuse(called, "reads running statistics that are not the running_mean buffer of a module; Morph rewrites "
                     "nn.BatchNorm1d/2d/3d modules and F.batch_norm calls on such a module's buffers");
    mean_chain.pop_back();
    const std::string path = join(mean_chain);
    auto m = moduleAt(root_, mean_chain, mean_chain.size());
    if (!m) refuse(called, "reads running statistics Morph cannot find in the module");
    const std::string who = "'" + path + "' (" + className(*m) + ")";
    // The same module in both branches of an if (torchvision's
    // InvertedResidual with and without its skip) is one batch norm; one
    // that runs twice is refused.
    if (auto it = seen.find(path); it != seen.end()) {
      if (!exclusive(it->second.first, bn))
        refuse(who, "runs twice in forward; Morph keeps one set of statistics per batch norm");
      const size_t k = it->second.second;
      std::vector<Value*> args(bn->inputs().begin(), bn->inputs().end());
      args.push_back(g->inputs()[2 + 2 * k]);
      args.push_back(g->inputs()[3 + 2 * k]);
      torch::jit::WithInsertPoint guard(bn);
      Node* op = g->insertNode(g->create(c10::Symbol::fromQualString("morph::vn_batch_norm"), args, 1));
      op->output()->setType(bn->output()->type());
      bn->output()->replaceAllUsesWith(op->output());
      bn->destroy();
      continue;
    }
    seen[path] = {bn, seg.batch_norms.size()};
    std::vector<std::string> var_chain = attrChain(bn->input(4), self);
    if (var_chain.empty() || var_chain.back() != "running_var" ||
        !std::equal(mean_chain.begin(), mean_chain.end(), var_chain.begin()) || var_chain.size() != mean_chain.size() + 1)
      refuse(who, "reads its running variance from somewhere else than its running_var buffer");
    const c10::optional<c10::IValue> momentum = torch::jit::toIValue(bn->input(6));
    if (!momentum || !momentum->isDouble())
      refuse(who, "has momentum=None (a cumulative average); Morph needs a momentum such as 0.1");
    const c10::optional<c10::IValue> eps = torch::jit::toIValue(bn->input(7));
    if (!eps || !eps->isDouble()) refuse(who, "has an eps that is not a constant number");
    GraphBatchNorm b;
    b.module_path = mean_chain;
    b.momentum = momentum->toDouble();
    b.eps = eps->toDouble();
    b.running_mean = m->attr("running_mean").toTensor();
    b.running_var = m->attr("running_var").toTensor();
    for (int i : {1, 2}) {
      std::vector<std::string> chain = attrChain(bn->input(i), self);
      if (bn->input(i)->type()->kind() == c10::TypeKind::NoneType || chain.size() != mean_chain.size() + 1 ||
          !std::equal(mean_chain.begin(), mean_chain.end(), chain.begin()) || !m->hasattr(chain.back()) ||
          !m->attr(chain.back()).isTensor())
        refuse(who, "has no weight and bias of its own (affine=False); Morph's batch norm is affine");
      (i == 1 ? b.weight : b.bias) = m->attr(chain.back()).toTensor();
    }
    for (const auto& t : {b.weight, b.bias, b.running_mean, b.running_var})
      if (t.scalar_type() != torch::kFloat32 || t.dim() != 1 || t.size(0) != b.weight.size(0))
        refuse(who, "holds tensors that are not float32 vectors of its channel count");
    const size_t k = seg.batch_norms.size();
    Value* mean = g->addInput("bn_mean_" + std::to_string(k));
    Value* var = g->addInput("bn_var_" + std::to_string(k));
    mean->setType(c10::TensorType::get());
    var->setType(c10::TensorType::get());
    std::vector<Value*> args(bn->inputs().begin(), bn->inputs().end());
    args.push_back(mean);
    args.push_back(var);
    torch::jit::WithInsertPoint guard(bn);
    Node* op = g->insertNode(g->create(c10::Symbol::fromQualString("morph::vn_batch_norm"), args, 1));
    op->output()->setType(bn->output()->type());
    bn->output()->replaceAllUsesWith(op->output());
    bn->destroy();
    seen[path].first = op;  // where it is, for exclusive()
    seg.batch_norms.push_back(std::move(b));
  }
}

bool ModelGraph::isStatic(const Value* v) const { return statics_.count(v) != 0; }

std::vector<size_t> ModelGraph::defaultCuts() const {
  std::vector<size_t> out;
  size_t prev = SIZE_MAX;
  for (size_t p = 0; p < nodes_.size(); ++p) {
    if (!compute_[p]) continue;
    if (prev != SIZE_MAX && units_[p] != units_[prev] && (boxed_[p] || boxed_[prev]) &&
        std::binary_search(cut_points_.begin(), cut_points_.end(), p))
      out.push_back(p);
    prev = p;
  }
  return out;
}

std::string ModelGraph::liveAt(size_t p) const {
  std::string s;
  for (const Value* v : live_[p]) s += (s.empty() ? "%" : ", %") + v->debugName() + " (" + v->type()->repr_str() + ")";
  return s;
}

std::vector<size_t> ModelGraph::cutsAt(const std::vector<std::string>& paths) const {
  std::vector<size_t> out;
  const std::string key = file_ + ": key 'model.cuts': ";
  for (const std::string& path : paths) {
    const std::vector<std::string> want = splitModulePath(path);
    size_t at = SIZE_MAX, first = SIZE_MAX;
    for (size_t p = 0; p < nodes_.size() && at == SIZE_MAX; ++p) {
      if (!compute_[p]) continue;
      if (first == SIZE_MAX) first = p;
      const auto& have = paths_[p];
      if (have.size() >= want.size() && std::equal(want.begin(), want.end(), have.begin())) at = p;
    }
    if (at == SIZE_MAX)
      throw InputError(key + "'" + path + "' names no module whose computation runs in forward (module paths " +
                       "are the names of state_dict() less the tensor's name, e.g. 'layer1.0')");
    if (at == first) throw InputError(key + "'" + path + "' is where forward starts; a cut there cuts nothing");
    if (!std::binary_search(cut_points_.begin(), cut_points_.end(), at))
      throw InputError(key + "'" + path + "' is not a cut point: where it starts, " +
                       std::to_string(live_[at].size()) + " values are live (" + liveAt(at) +
                       "), and a cut passes exactly one tensor from layer to layer");
    if (std::find(out.begin(), out.end(), at) != out.end())
      throw InputError(key + "'" + path + "' cuts where another entry already cuts");
    out.push_back(at);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A node's label in a segment [begin, end): the shortest prefix of its
// module path whose computation lies entirely inside the segment ("forward"
// for the module's own code). The segment is named by its first node's label
// when every node of it is under that label, else "first..last".
std::string ModelGraph::segmentName(size_t begin, size_t end) const {
  auto label = [&](size_t p) {
    const auto& path = paths_[p];
    for (size_t k = 1; k <= path.size(); ++k) {
      const auto& [lo, hi] = spans_.at(join(path, k));
      if (lo >= begin && hi < end) return join(path, k);
    }
    return path.empty() ? std::string("forward") : join(path);
  };
  size_t first = SIZE_MAX, last = SIZE_MAX;
  for (size_t p = begin; p < end; ++p)
    if (compute_[p]) {
      if (first == SIZE_MAX) first = p;
      last = p;
    }
  if (first == SIZE_MAX) return "forward";
  const std::string head = label(first);
  bool all = !paths_[first].empty();
  const std::vector<std::string> prefix = splitModulePath(head);
  for (size_t p = begin; p < end && all; ++p)
    if (compute_[p])
      all = paths_[p].size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), paths_[p].begin());
  if (all) return head;
  const std::string tail = label(last);
  return tail == head ? head : head + ".." + tail;
}

std::vector<GraphSegment> ModelGraph::segments(const std::vector<size_t>& cuts) const {
  std::vector<size_t> bounds{0};
  for (size_t c : cuts) {
    if (!std::binary_search(cut_points_.begin(), cut_points_.end(), c) || c <= bounds.back())
      throw InternalError("ModelGraph::segments: not a sorted list of cut points");
    bounds.push_back(c);
  }
  bounds.push_back(nodes_.size());
  std::vector<GraphSegment> out;
  std::map<std::string, int> seen;
  // Each parameter's owner: the first segment that reads it, and the name it reads it by.
  std::unordered_map<const c10::TensorImpl*, std::pair<size_t, std::string>> owner_of;
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    GraphSegment seg;
    seg.begin = bounds[s];
    seg.end = bounds[s + 1];
    seg.name = segmentName(seg.begin, seg.end);
    if (int k = ++seen[seg.name]; k > 1) seg.name += "#" + std::to_string(k);
    auto g = std::make_shared<torch::jit::Graph>();
    Value* self = g->addInput("self");
    self->setType(graph_->inputs()[0]->type());
    Value* x = g->addInput("x");
    const Value* in = seg.begin == 0 ? graph_->inputs()[1] : live_[seg.begin][0];
    x->setType(in->type());
    std::unordered_map<const Value*, Value*> env{{graph_->inputs()[0], self}, {in, x}};
    std::function<Value*(Value*)> map = [&](Value* v) -> Value* {
      auto it = env.find(v);
      if (it != env.end()) return it->second;
      if (!isStatic(v))
        throw InternalError("ModelGraph::segments: %" + v->debugName() + " crosses a cut and is not static");
      Node* d = v->node();
      Node* c = g->appendNode(g->createClone(d, map));
      for (size_t i = 0; i < d->outputs().size(); ++i) env[d->outputs()[i]] = c->outputs()[i];
      return env.at(v);
    };
    for (size_t p = seg.begin; p < seg.end; ++p) {
      Node* d = nodes_[p];
      Node* c = g->appendNode(g->createClone(d, map));
      for (size_t i = 0; i < d->outputs().size(); ++i) env[d->outputs()[i]] = c->outputs()[i];
    }
    Value* result = seg.end == nodes_.size() ? graph_->outputs()[0] : const_cast<Value*>(live_[seg.end][0]);
    g->registerOutput(map(result));
    torch::jit::EliminateDeadCode(g);
    rewriteBatchNorms(seg, g);
    // A segment that writes its input in place (a leading ReLU(inplace=True))
    // works on a copy: on a pipeline stage the input is a leaf of autograd.
    {
      torch::jit::AliasDb db(g);
      if (db.hasWriters(x)) {
        torch::jit::WithInsertPoint guard(g->nodes().front());
        Value* copy = g->insert(c10::aten::clone, {x});
        x->replaceAllUsesAfterNodeWith(copy->node(), copy);
      }
    }
    // The parameters and buffers it reads; those an earlier segment owns
    // are read from inputs of their own (below).
    std::set<std::string> listed;
    std::set<const c10::TensorImpl*> listed_here;
    std::vector<std::pair<Node*, size_t>> tie_reads;  // GetAttr node, index in seg.tied
    std::function<void(torch::jit::Block*)> walk = [&](torch::jit::Block* b) {
      for (Node* node : b->nodes()) {
        for (torch::jit::Block* sub : node->blocks()) walk(sub);
        if (node->kind() != c10::prim::GetAttr) continue;  // (a conv's bias is an Optional[Tensor])
        std::vector<std::string> chain = attrChain(node->output(), self);
        if (chain.empty()) continue;
        GraphTensor t;
        t.name = chain.back();
        chain.pop_back();
        t.module_path = chain;
        auto m = moduleAt(root_, chain, chain.size());
        if (!m) continue;
        bool known = false;
        for (const auto& p : m->named_parameters(false))
          if (p.name == t.name) t.value = p.value, t.parameter = known = true;
        for (const auto& p : m->named_buffers(false))
          if (p.name == t.name) t.value = p.value, known = true;
        if (!known) continue;
        const c10::TensorImpl* impl = t.value.unsafeGetTensorImpl();
        if (t.parameter) {
          auto [it, fresh] = owner_of.emplace(impl, std::make_pair(s, t.fullName()));
          if (!fresh && it->second.first != s) {
            // A shared weight an earlier segment owns.
            size_t k = 0;
            while (k < seg.tied.size() && seg.tied[k].value.unsafeGetTensorImpl() != impl) ++k;
            if (k == seg.tied.size()) seg.tied.push_back({{}, it->second.second, it->second.first, t.value});
            if (std::find(seg.tied[k].names.begin(), seg.tied[k].names.end(), t.fullName()) == seg.tied[k].names.end())
              seg.tied[k].names.push_back(t.fullName());
            tie_reads.emplace_back(node, k);
            continue;
          }
        }
        if (!listed.insert(t.fullName()).second) continue;
        // One tensor read by two names (a tie inside the segment): listed once.
        if (t.parameter && !listed_here.insert(impl).second) continue;
        seg.tensors.push_back(t);
      }
    };
    walk(g->block());
    if (!seg.tied.empty()) {
      std::vector<Value*> inputs;
      for (size_t k = 0; k < seg.tied.size(); ++k) {
        inputs.push_back(g->addInput("tied_" + std::to_string(k)));
        inputs.back()->setType(c10::TensorType::get());
      }
      for (auto [node, k] : tie_reads) node->output()->replaceAllUsesWith(inputs[k]);
      torch::jit::EliminateDeadCode(g);
    }
    seg.graph = g;
    out.push_back(std::move(seg));
  }
  return out;
}

std::vector<std::vector<std::string>> ModelGraph::sharedWeights() const {
  std::vector<std::vector<std::string>> groups;
  std::unordered_map<const c10::TensorImpl*, size_t> group_of;
  for (const auto& p : root_.named_parameters(/*recurse=*/true)) {
    auto [it, fresh] = group_of.emplace(p.value.unsafeGetTensorImpl(), groups.size());
    if (fresh) groups.emplace_back();
    groups[it->second].push_back(p.name);
  }
  std::vector<std::vector<std::string>> out;
  for (auto& g : groups)
    if (g.size() > 1) out.push_back(std::move(g));
  return out;
}

}  // namespace morph
