// models/graph.h on small hand-made TorchScript modules: cut points with a
// skip, a branch and a flatten; default cuts inside containers; model.cuts;
// segments that compute the module's forward; the batch-norm rewrite.
#include <gtest/gtest.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>

#include "core/error.h"
#include "models/graph.h"

namespace morph {
namespace {

int counter = 0;

// A module of a fresh class "__torch__.<cls>_<n>" (only a class named
// like torch.nn's containers counts as a container).
torch::jit::Module makeModule(const std::string& cls) {
  torch::jit::Module m(c10::QualifiedName("__torch__." + cls + "_" + std::to_string(counter++)));
  m.register_attribute("training", c10::BoolType::get(), true);
  return m;
}

torch::jit::Module linear(int64_t in, int64_t out) {
  auto m = makeModule("Linear");
  m.register_parameter("weight", torch::randn({out, in}), false);
  m.register_parameter("bias", torch::randn({out}), false);
  m.define("def forward(self, x):\n  return torch.addmm(self.bias, x, self.weight.t())\n");
  return m;
}

// A module of its own class calling `items` in turn (not a container).
torch::jit::Module chain(const std::vector<torch::jit::Module>& items) {
  auto m = makeModule("Chain");
  std::string code = "def forward(self, x):\n";
  for (size_t i = 0; i < items.size(); ++i) {
    m.register_module("m" + std::to_string(i), items[i]);
    code += "  x = self.m" + std::to_string(i) + ".forward(x)\n";
  }
  code += "  return x\n";
  m.define(code);
  return m;
}

// Runs the segments in order on x (evaluation of the graphs as Morph runs
// them, with per-batch-norm statistics tensors appended).
torch::Tensor runSegments(const ModelGraph& g, const std::vector<GraphSegment>& segs, torch::Tensor x) {
  torch::jit::setGraphExecutorOptimize(false);
  for (const auto& s : segs) {
    torch::jit::GraphFunction fn("seg", s.graph, nullptr);
    torch::jit::Stack st{g.root()._ivalue(), x};
    for (const auto& b : s.batch_norms) {
      st.emplace_back(torch::zeros({b.weight.size(0)}));
      st.emplace_back(torch::zeros({b.weight.size(0)}));
    }
    for (const auto& t : s.tied) st.emplace_back(t.value);  // a shared weight: the owner's tensor itself
    fn.run(st);
    x = st.back().toTensor();
  }
  return x;
}

std::vector<std::string> names(const std::vector<GraphSegment>& segs) {
  std::vector<std::string> out;
  for (const auto& s : segs) out.push_back(s.name);
  return out;
}

// root: a -> block (x + lin2(relu(lin1(x))), a skip) -> [b(y) + c(y)] (a branch)
torch::jit::Module skipAndBranch() {
  torch::manual_seed(1);
  auto block = makeModule("Block");
  block.register_module("lin1", linear(4, 4));
  block.register_module("lin2", linear(4, 4));
  block.define("def forward(self, x):\n  return x + self.lin2.forward(torch.relu(self.lin1.forward(x)))\n");
  auto root = makeModule("Root");
  root.register_module("a", linear(3, 4));
  root.register_module("block", block);
  root.register_module("b", linear(4, 2));
  root.register_module("c", linear(4, 2));
  root.define("def forward(self, x):\n  y = self.block.forward(self.a.forward(x))\n  return self.b.forward(y) + self.c.forward(y)\n");
  return root;
}

TEST(ModelGraph, SkipAndBranchCutPoints) {
  auto root = skipAndBranch();
  ModelGraph g(root, "m.pt");
  // Before block and before the branch: one tensor live. Inside the block
  // (the skip keeps x live) and between b and c (y and b's output): not.
  const auto cuts = g.cutsAt({"block", "b"});
  ASSERT_EQ(cuts.size(), 2u);
  EXPECT_EQ(g.cutPoints().size(), 2u);
  for (const char* bad : {"block.lin2", "c"}) {
    try {
      g.cutsAt({bad});
      FAIL() << bad << " accepted as a cut";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("is not a cut point"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("m.pt"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(g.cutsAt({"nothing"}), InputError);
  EXPECT_THROW(g.cutsAt({"a"}), InputError);  // where forward starts
  // Loose top-level children stay together by default.
  EXPECT_TRUE(g.defaultCuts().empty());
  const auto segs = g.segments(cuts);
  // The last ends in the module's own code (the sum of the branches).
  EXPECT_EQ(names(segs), (std::vector<std::string>{"a", "block", "b..forward"}));
  // Each segment lists what it reads, under its module path.
  std::vector<std::string> block_tensors;
  for (const auto& t : segs[1].tensors) block_tensors.push_back(t.fullName());
  std::sort(block_tensors.begin(), block_tensors.end());
  EXPECT_EQ(block_tensors, (std::vector<std::string>{"block.lin1.bias", "block.lin1.weight", "block.lin2.bias",
                                                     "block.lin2.weight"}));
  const torch::Tensor x = torch::randn({5, 3});
  const torch::Tensor whole = root.forward({x}).toTensor();
  EXPECT_TRUE(torch::equal(runSegments(g, segs, x), whole));
  EXPECT_TRUE(torch::equal(runSegments(g, g.segments({}), x), whole));
}

TEST(ModelGraph, ContainersAreCutBetweenElementsAndFlattenStaysWithTheHead) {
  torch::manual_seed(2);
  auto block = [] {
    auto b = makeModule("Block");
    b.register_module("lin", linear(6, 6));
    b.define("def forward(self, x):\n  return x + self.lin.forward(x)\n");
    return b;
  };
  auto body = chain({block(), block()});
  auto root = makeModule("Net");
  root.register_module("stem", linear(6, 6));
  root.register_module("body", body);
  root.register_module("head", linear(12, 3));
  // The flatten is the module's own code, between children.
  root.define(
      "def forward(self, x):\n  x = self.body.forward(self.stem.forward(x))\n  x = x.reshape([x.size(0) // 2, 12])\n"
      "  return self.head.forward(x)\n");
  ModelGraph g(root, "net.pt");
  const auto segs = g.segments(g.defaultCuts());
  // body's class is not one of torch.nn's containers: the default keeps the
  // loose top-level children together.
  EXPECT_EQ(names(segs), (std::vector<std::string>{"stem..head"}));
  // model.cuts can still cut between its elements, and after the flatten.
  const auto fine = g.segments(g.cutsAt({"body.m1", "head", "body"}));
  EXPECT_EQ(names(fine), (std::vector<std::string>{"stem", "body.m0", "body.m1..forward", "head"}));
  const torch::Tensor x = torch::randn({4, 6});
  EXPECT_TRUE(torch::equal(runSegments(g, fine, x), root.forward({x}).toTensor()));
}

TEST(ModelGraph, DefaultCutsDescendIntoTorchContainers) {
  torch::manual_seed(3);
  // A root whose class is torch.nn's Sequential: every element is a layer;
  // an inner Sequential is cut between its elements too.
  auto relu = makeModule("ReLU");
  relu.define("def forward(self, x):\n  return torch.relu(x)\n");
  torch::jit::Module inner(c10::QualifiedName("__torch__.torch.nn.modules.container.___torch_mangle_7.Sequential"));
  inner.register_attribute("training", c10::BoolType::get(), true);
  inner.register_module("0", linear(5, 5));
  inner.register_module("1", relu);
  inner.define("def forward(self, x):\n  x = getattr(self, '0').forward(x)\n  return getattr(self, '1').forward(x)\n");
  torch::jit::Module root(c10::QualifiedName("__torch__.torch.nn.modules.container.Sequential"));
  root.register_attribute("training", c10::BoolType::get(), true);
  root.register_module("0", linear(4, 5));
  root.register_module("1", inner);
  root.register_module("2", linear(5, 2));
  root.define(
      "def forward(self, x):\n  x = getattr(self, '0').forward(x)\n  x = getattr(self, '1').forward(x)\n"
      "  return getattr(self, '2').forward(x)\n");
  ModelGraph g(root, "seq.pt");
  const auto segs = g.segments(g.defaultCuts());
  EXPECT_EQ(names(segs), (std::vector<std::string>{"0", "1.0", "1.1", "2"}));
  const torch::Tensor x = torch::randn({3, 4});
  EXPECT_TRUE(torch::equal(runSegments(g, segs, x), root.forward({x}).toTensor()));
}

TEST(ModelGraph, BatchNormAtDepthKeepsTheVnStatistics) {
  torch::manual_seed(4);
  auto bn = makeModule("BN");
  bn.register_parameter("weight", torch::rand({3}) + 0.5, false);
  bn.register_parameter("bias", torch::randn({3}), false);
  bn.register_buffer("running_mean", torch::zeros({3}));
  bn.register_buffer("running_var", torch::ones({3}));
  bn.define(
      "def forward(self, x):\n  return torch.batch_norm(x, self.weight, self.bias, self.running_mean, "
      "self.running_var, self.training, 0.25, 1e-5, False)\n");
  auto block = makeModule("Block");
  block.register_module("bn", bn);
  block.define("def forward(self, x):\n  return torch.relu(self.bn.forward(x))\n");
  auto root = makeModule("Net");
  root.register_module("block", block);
  root.define("def forward(self, x):\n  return self.block.forward(x)\n");
  ModelGraph g(root, "bn.pt");
  auto segs = g.segments({});
  ASSERT_EQ(segs.size(), 1u);
  ASSERT_EQ(segs[0].batch_norms.size(), 1u);
  const GraphBatchNorm& b = segs[0].batch_norms[0];
  EXPECT_EQ(b.module_path, (std::vector<std::string>{"block", "bn"}));
  EXPECT_DOUBLE_EQ(b.momentum, 0.25);
  const torch::Tensor x = torch::randn({6, 3, 2, 2});
  torch::jit::setGraphExecutorOptimize(false);
  torch::jit::GraphFunction fn("seg", segs[0].graph, nullptr);
  const torch::Tensor mean = torch::zeros({3}), var = torch::zeros({3});
  root.train(true);
  torch::jit::Stack st{root._ivalue(), x, mean, var};
  fn.run(st);
  // The VN's own statistics, normalised with them; the running statistics
  // are untouched (the executor updates them once per step).
  EXPECT_TRUE(torch::allclose(mean, x.mean({0, 2, 3}), 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(var, x.var({0, 2, 3}, /*unbiased=*/true), 1e-5, 1e-6));
  EXPECT_TRUE(torch::equal(b.running_mean, torch::zeros({3})));
  EXPECT_TRUE(torch::equal(b.running_var, torch::ones({3})));
  const torch::Tensor want = torch::relu(torch::batch_norm(x, b.weight, b.bias, {}, {}, true, 0.0, 1e-5, false));
  EXPECT_TRUE(torch::allclose(st.back().toTensor(), want, 1e-6, 1e-6));
  // In evaluation, the running statistics.
  root.train(false);
  torch::jit::Stack ev{root._ivalue(), x, mean, var};
  fn.run(ev);
  EXPECT_TRUE(torch::allclose(
      ev.back().toTensor(),
      torch::relu(torch::batch_norm(x, b.weight, b.bias, b.running_mean, b.running_var, false, 0.0, 1e-5, false))));
}

TEST(ModelGraph, RefusesForwardsOfSeveralInputsAndBatchNormsWithoutRunningStatistics) {
  auto two = makeModule("Two");
  two.register_module("a", linear(2, 2));
  two.define("def forward(self, x, y):\n  return self.a.forward(x) + y\n");
  try {
    ModelGraph g(two, "two.pt");
    FAIL() << "two inputs accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("two.pt: forward takes 2 inputs"), std::string::npos) << e.what();
  }
  auto bn = makeModule("BN");
  bn.register_parameter("weight", torch::ones({3}), false);
  bn.register_parameter("bias", torch::zeros({3}), false);
  bn.define(
      "def forward(self, x):\n  return torch.batch_norm(x, self.weight, self.bias, None, None, True, 0.1, 1e-5, "
      "False)\n");
  auto root = makeModule("Net");
  root.register_module("norm", bn);
  root.define("def forward(self, x):\n  return self.norm.forward(x)\n");
  ModelGraph g(root, "nostats.pt");
  try {
    g.segments({});
    FAIL() << "a batch norm without running statistics accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("nostats.pt: batch norm called in 'norm' has no running statistics"),
              std::string::npos)
        << e.what();
  }
}

// A weight shared between layers (a head tied to the embedding, as GPT-2
// does): found by tensor identity, owned by the first layer that reads it,
// read by the others from an input of their own, so that each use's
// gradient arrives on a leaf of its own and their sum is the weight's.
TEST(ModelGraph, TiedWeightIsOwnedByItsFirstReaderAndAnInputOfTheOthers) {
  torch::manual_seed(5);
  const torch::Tensor w = torch::randn({5, 4}).requires_grad_(true);
  auto emb = makeModule("Emb");
  emb.register_parameter("weight", w, false);
  emb.define("def forward(self, x):\n  return torch.matmul(x, self.weight)\n");
  auto head = makeModule("Head");
  head.register_parameter("weight", w, false);  // the same tensor
  head.define("def forward(self, x):\n  return torch.matmul(x, self.weight.t())\n");
  torch::jit::Module root(c10::QualifiedName("__torch__.torch.nn.modules.container.___torch_mangle_9.Sequential"));
  root.register_attribute("training", c10::BoolType::get(), true);
  root.register_module("0", emb);
  root.register_module("1", linear(4, 4));
  root.register_module("2", head);
  root.define(
      "def forward(self, x):\n  x = getattr(self, '0').forward(x)\n  x = getattr(self, '1').forward(x)\n"
      "  return getattr(self, '2').forward(x)\n");
  ModelGraph g(root, "tied.pt");
  EXPECT_EQ(g.sharedWeights(), (std::vector<std::vector<std::string>>{{"0.weight", "2.weight"}}));
  const auto segs = g.segments(g.defaultCuts());
  ASSERT_EQ(names(segs), (std::vector<std::string>{"0", "1", "2"}));
  ASSERT_EQ(segs[0].tensors.size(), 1u);
  EXPECT_EQ(segs[0].tensors[0].fullName(), "0.weight");
  EXPECT_TRUE(segs[0].tied.empty());
  EXPECT_TRUE(segs[2].tensors.empty());  // 2.weight is not the head's own
  ASSERT_EQ(segs[2].tied.size(), 1u);
  EXPECT_EQ(segs[2].tied[0].names, (std::vector<std::string>{"2.weight"}));
  EXPECT_EQ(segs[2].tied[0].owner, "0.weight");
  EXPECT_EQ(segs[2].tied[0].owner_segment, 0u);
  EXPECT_TRUE(segs[2].tied[0].value.is_same(w));
  EXPECT_EQ(segs[2].graph->inputs().size(), 3u);  // self, x, the tied weight
  const torch::Tensor x = torch::randn({3, 5});
  const torch::Tensor whole = root.forward({x}).toTensor();
  EXPECT_TRUE(torch::equal(runSegments(g, segs, x), whole));
  // Gradients: the owner's use on w, the head's on a leaf of its own on
  // w's storage; their sum is w's gradient through the whole forward.
  const torch::Tensor want = torch::autograd::grad({whole.square().sum()}, {w})[0];
  const torch::Tensor alias = w.detach().requires_grad_(true);
  torch::Tensor y = x;
  for (const auto& s : segs) {
    torch::jit::GraphFunction fn("seg", s.graph, nullptr);
    torch::jit::Stack st{root._ivalue(), y};
    if (!s.tied.empty()) st.emplace_back(alias);
    fn.run(st);
    y = st.back().toTensor();
  }
  const auto got = torch::autograd::grad({y.square().sum()}, {w, alias});
  EXPECT_TRUE(got[0].defined() && got[1].defined());
  EXPECT_GT(got[1].abs().sum().item<double>(), 0.0);
  EXPECT_TRUE(torch::allclose(got[0] + got[1], want, 1e-5, 1e-6));
  // In one layer, the weight is read by both names and listed once.
  const auto one = g.segments({});
  ASSERT_EQ(one.size(), 1u);
  EXPECT_TRUE(one[0].tied.empty());
  size_t reads = 0;
  for (const auto& t : one[0].tensors) reads += t.value.is_same(w);
  EXPECT_EQ(reads, 1u);
  EXPECT_TRUE(torch::equal(runSegments(g, one, x), whole));
  // A module without shared weights has none.
  EXPECT_TRUE(ModelGraph(skipAndBranch(), "m.pt").sharedWeights().empty());
}

}  // namespace
}  // namespace morph
