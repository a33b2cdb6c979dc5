// The graph analysis of a TorchScript model (docs/models.md, "How layers
// are found"): the one place that reads a module's inlined forward graph.
//
// ModelGraph inlines `forward` and finds its cut points: positions in the
// top-level node list where exactly one activation tensor is live (values
// that only read the module, such as constants and attribute reads, do not
// count: each segment reads them again). segments() cuts the graph at
// chosen cut points into graphs of their own, (self, x) -> y, which a
// GraphFunction runs on the module object; every segment lists the
// parameters and buffers it reads, so that a layer can own them.
#pragma once

#include <torch/csrc/jit/ir/ir.h>
#include <torch/script.h>

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace morph {

// A parameter or buffer a segment reads: the module path to its owner and
// its name there ({"layer1", "0", "conv1"}, "weight").
struct GraphTensor {
  std::vector<std::string> module_path;
  std::string name;
  torch::Tensor value;
  bool parameter = false;
  std::string fullName() const;  // "layer1.0.conv1.weight", as in state_dict()
};

// A batch norm of the segment (nn.BatchNorm1d/2d/3d at any depth, or
// F.batch_norm on such a module's buffers), rewritten to
// morph::vn_batch_norm: in training, it normalises with the VN's own
// statistics and writes them into the segment graph's inputs 2 + 2k (mean)
// and 3 + 2k (unbiased variance) instead of updating the running statistics.
struct GraphBatchNorm {
  std::vector<std::string> module_path;
  torch::Tensor weight, bias, running_mean, running_var;  // the module's own
  double momentum = 0.1, eps = 1e-5;
};

// A parameter the segment reads that an earlier segment owns: a weight
// shared between layers (a head tied to the embedding), found by tensor
// identity. The segment reads it from its graph input
// 2 + 2 * batch_norms.size() + k (k its index in `tied`), not from the
// module, so that the layer can give it a leaf of its own (Layer::tiedLeaves).
struct GraphTie {
  std::vector<std::string> names;  // the names this segment reads it by ("head.weight")
  std::string owner;               // its name in the segment that owns it ("embed.weight")
  size_t owner_segment = 0;
  torch::Tensor value;             // the module's tensor (the owner's)
};

struct GraphSegment {
  std::string name;  // "layer1.0", "conv1..maxpool" (docs/models.md)
  size_t begin = 0, end = 0;  // top-level node positions [begin, end)
  std::shared_ptr<torch::jit::Graph> graph;  // (self, x) -> y
  std::vector<GraphTensor> tensors;  // in first-read order; a tensor read by two names once
  std::vector<GraphBatchNorm> batch_norms;
  std::vector<GraphTie> tied;        // parameters an earlier segment owns
};

class ModelGraph {
 public:
  // InputError naming `file` for a forward that does not take one tensor
  // and return one.
  ModelGraph(torch::jit::Module root, std::string file);

  // Positions p (cut before top-level node p) with one live tensor and
  // computation on both sides.
  const std::vector<size_t>& cutPoints() const { return cut_points_; }
  // The default cuts (docs/models.md): between the elements of containers
  // (nn.Sequential, nn.ModuleList, nn.ModuleDict, the module itself when it
  // is one), where they are cut points; consecutive top-level children
  // that are not in a container, and code of the module's own forward,
  // stay together.
  std::vector<size_t> defaultCuts() const;
  // model.cuts: a cut before the first computation of each module path
  // ("layer2", "layer3.1"). InputError naming the path when it runs no
  // computation or is not a cut point (saying what else is live there).
  std::vector<size_t> cutsAt(const std::vector<std::string>& paths) const;
  // The segments between `cuts` (sorted, each a cut point). A parameter
  // read by several segments belongs to the first (listed in its `tensors`
  // under the name it reads it by first) and is `tied` in the others.
  std::vector<GraphSegment> segments(const std::vector<size_t>& cuts) const;
  // Shared-weight discovery: the parameters that are one tensor under
  // several state_dict() names ({"embed.weight", "head.weight"}), each
  // group in the module's parameter order; empty when none is shared.
  std::vector<std::vector<std::string>> sharedWeights() const;

  const torch::jit::Module& root() const { return root_; }
  size_t size() const { return nodes_.size(); }
  // The module path of top-level node p's computation (from the inliner's
  // call stack): {} for the module's own forward.
  const std::vector<std::string>& pathOf(size_t p) const { return paths_[p]; }

 private:
  void inlineAll();
  bool isStatic(const torch::jit::Value* v) const;
  void rewriteBatchNorms(GraphSegment& seg, const std::shared_ptr<torch::jit::Graph>& g) const;
  std::string segmentName(size_t begin, size_t end) const;
  std::string liveAt(size_t p) const;  // the values live at p, for messages

  torch::jit::Module root_;
  std::string file_;
  std::shared_ptr<torch::jit::Graph> graph_;
  std::unordered_map<const torch::jit::Node*, std::vector<std::string>> where_;  // node -> module path
  std::vector<torch::jit::Node*> nodes_;             // top level, in order
  std::vector<char> compute_;                        // per node: not static
  std::vector<std::vector<std::string>> paths_;      // per node
  std::vector<std::vector<std::string>> units_;      // per node (containers descended)
  std::vector<char> boxed_;                          // per node: its unit is a container's element
  std::vector<std::vector<const torch::jit::Value*>> live_;  // per position 0..n
  std::vector<size_t> cut_points_;
  std::unordered_set<const torch::jit::Value*> statics_;
  std::map<std::string, std::pair<size_t, size_t>> spans_;  // module path -> first, last node computing in it
};

}  // namespace morph
