#include "core/error.h"
#include "data/sampler.h"
#include "models/model.h"

namespace morph {

VnBatchNorm::VnBatchNorm(int64_t channels, double momentum, double eps)
    : channels_(channels), momentum_(momentum), eps_(eps) {
  weight_ = register_parameter("weight", torch::ones({channels}));
  bias_ = register_parameter("bias", torch::zeros({channels}));
  running_mean_ = register_buffer("running_mean", torch::zeros({channels}));
  running_var_ = register_buffer("running_var", torch::ones({channels}));
}

VnBatchNorm::VnBatchNorm(torch::Tensor weight, torch::Tensor bias, torch::Tensor running_mean,
                         torch::Tensor running_var, double momentum, double eps, torch::Tensor mean, torch::Tensor var)
    : channels_(weight.size(0)), momentum_(momentum), eps_(eps) {
  weight_ = register_parameter("weight", weight);
  bias_ = register_parameter("bias", bias);
  running_mean_ = register_buffer("running_mean", running_mean);
  running_var_ = register_buffer("running_var", running_var);
  last_mean_ = std::move(mean);
  last_var_ = std::move(var);
}

torch::Tensor VnBatchNorm::forward(const torch::Tensor& x) {
  if (!is_training())
    return torch::batch_norm(x, weight_, bias_, running_mean_, running_var_, false, 0.0, eps_, false);
  // Training mode without running statistics: normalises with the VN's own
  // batch statistics and has no side effect. The kernel hands back the batch
  // mean and 1/sqrt(biased var + eps), from which we recover the statistics
  // instead of making another pass over x.
  auto [y, mean, invstd] = at::native_batch_norm(x, weight_, bias_, {}, {}, true, 0.0, eps_);
  {
    torch::NoGradGuard no_grad;
    const int64_t n = x.numel() / channels_;
    const double unbias = static_cast<double>(n) / static_cast<double>(std::max<int64_t>(n - 1, 1));
    last_mean_ = mean.detach().clone();
    last_var_ = (invstd.detach().pow(-2) - eps_).clamp_min_(0.0).mul_(unbias);
  }
  return y;
}

void VnBatchNorm::commitRunningStats(const torch::Tensor& mean, const torch::Tensor& var) {
  torch::NoGradGuard no_grad;
  running_mean_.mul_(1.0 - momentum_).add_(mean, momentum_);
  running_var_.mul_(1.0 - momentum_).add_(var, momentum_);
}

void LayerList::add(const std::string& name, std::shared_ptr<Layer> layer) {
  names_.push_back(name);
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& p : layer->parameters()) shapes.push_back(p.sizes().vec());
  shapes_.push_back(std::move(shapes));
  hollow_.push_back(0);
  // A module name cannot hold a dot ("layer1.0", a TorchScript model's).
  std::string key = name;
  std::replace(key.begin(), key.end(), '.', '_');
  layers_.push_back(register_module(key, std::move(layer)));
}

void LayerList::hollow(size_t i) {
  torch::NoGradGuard no_grad;
  for (auto& p : layers_[i]->parameters()) p.set_data(torch::empty({0}, p.options()));
  for (auto& b : layers_[i]->buffers()) b.set_data(torch::empty({0}, b.options()));
  hollow_[i] = 1;
}

std::vector<std::vector<int64_t>> LayerList::parameterShapes() const {
  std::vector<std::vector<int64_t>> out;
  for (const auto& layer : shapes_) out.insert(out.end(), layer.begin(), layer.end());
  return out;
}

torch::Tensor LayerList::forwardRange(torch::Tensor x, size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) x = layers_[i]->forward(x);
  return x;
}

torch::Tensor LayerList::forwardRange(torch::Tensor x, size_t begin, size_t end, uint64_t vn_seed) {
  for (size_t i = begin; i < end; ++i) {
    torch::manual_seed(mixSeed(vn_seed, i, 0x1a7e));
    x = layers_[i]->forward(x);
  }
  return x;
}

std::vector<VnBatchNorm*> LayerList::batchNorms() {
  std::vector<VnBatchNorm*> out;
  for (const auto& m : modules(/*include_self=*/false))
    if (auto* bn = dynamic_cast<VnBatchNorm*>(m.get())) out.push_back(bn);
  return out;
}

namespace {

// Dropout drawing from the default generator, which the executor reseeds
// from (seed, step, vn, layer) before each layer, so recomputation and any
// stage cut see the same mask.
torch::Tensor vnDropout(const torch::Tensor& x, double p, bool training) {
  if (!training || p == 0.0) return x;
  torch::Tensor mask = torch::empty_like(x).bernoulli_(1.0 - p);
  return x * mask * (1.0 / (1.0 - p));
}

class Flatten : public Layer {
 public:
  torch::Tensor forward(const torch::Tensor& x) override { return x.flatten(1); }
};

// Linear, then optionally ReLU and dropout.
class Dense : public Layer {
 public:
  Dense(int64_t in, int64_t out, bool relu, double p) : relu_(relu), p_(p) {
    fc_ = register_module("fc", torch::nn::Linear(in, out));
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    torch::Tensor y = fc_->forward(x);
    if (relu_) y = vnDropout(torch::relu(y), p_, is_training());
    return y;
  }

 private:
  torch::nn::Linear fc_{nullptr};
  bool relu_;
  double p_;
};

// conv3x3 -> batch norm -> ReLU -> 2x2 max pool. (b,Cin,H,W) -> (b,Cout,H/2,W/2)
class ConvBlock : public Layer {
 public:
  ConvBlock(int64_t in, int64_t out) {
    conv_ = register_module(
        "conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1).bias(false)));
    bn_ = register_module("bn", std::make_shared<VnBatchNorm>(out));
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    return torch::max_pool2d(torch::relu(bn_->forward(conv_->forward(x))), 2);
  }

 private:
  torch::nn::Conv2d conv_{nullptr};
  std::shared_ptr<VnBatchNorm> bn_;
};

// gpt-mini: token + position embedding. (b, T) int64 -> (b, T, C)
class Embed : public Layer {
 public:
  Embed(int64_t vocab, int64_t seq_len, int64_t dim, double p) : p_(p) {
    token_ = register_parameter("token", torch::randn({vocab, dim}) * 0.02);
    position_ = register_parameter("position", torch::randn({seq_len, dim}) * 0.02);
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    torch::Tensor y = torch::embedding(token_, x) + position_.narrow(0, 0, x.size(1));
    return vnDropout(y, p_, is_training());
  }
  const torch::Tensor& tokenWeight() const { return token_; }

 private:
  torch::Tensor token_, position_;
  double p_;
};

// Pre-norm transformer block: causal self-attention, then a 4x MLP, each
// added to the residual stream. (b, T, C) -> (b, T, C)
class Block : public Layer {
 public:
  Block(int64_t dim, int64_t heads, double p) : heads_(heads), p_(p) {
    ln1_ = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
    qkv_ = register_module("qkv", torch::nn::Linear(dim, 3 * dim));
    proj_ = register_module("proj", torch::nn::Linear(dim, dim));
    ln2_ = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
    fc1_ = register_module("fc1", torch::nn::Linear(dim, 4 * dim));
    fc2_ = register_module("fc2", torch::nn::Linear(4 * dim, dim));
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2), d = c / heads_;
    auto qkv = qkv_->forward(ln1_->forward(x)).chunk(3, -1);
    auto split = [&](const torch::Tensor& z) { return z.view({b, t, heads_, d}).transpose(1, 2); };
    torch::Tensor q = split(qkv[0]), k = split(qkv[1]), v = split(qkv[2]);  // (b, H, T, D)
    torch::Tensor att = q.matmul(k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(d)));
    torch::Tensor future = torch::ones({t, t}, torch::kBool).triu(1);
    att = torch::softmax(att.masked_fill(future, -INFINITY), -1);
    torch::Tensor y = att.matmul(v).transpose(1, 2).contiguous().view({b, t, c});
    torch::Tensor h = x + vnDropout(proj_->forward(y), p_, is_training());
    return h + vnDropout(fc2_->forward(torch::gelu(fc1_->forward(ln2_->forward(h)))), p_, is_training());
  }

 private:
  int64_t heads_;
  double p_;
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr}, fc1_{nullptr}, fc2_{nullptr};
};

class FinalNorm : public Layer {
 public:
  explicit FinalNorm(int64_t dim) {
    ln_ = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
  }
  torch::Tensor forward(const torch::Tensor& x) override { return ln_->forward(x); }

 private:
  torch::nn::LayerNorm ln_{nullptr};
};

// Output head tied to the token embedding: logits = x E^T, (b, T, C) ->
// (b, T, vocab). It owns no parameter: it reads the embedding's weight
// through an alias (same storage, a leaf of its own), whose gradient the
// executor adds into the embedding's. In a pipeline the embedding and the
// head sit on different stages, each with a copy of the weight, and the two
// partial gradients are summed exactly across them.
class TiedHead : public Layer {
 public:
  explicit TiedHead(std::shared_ptr<Embed> embed)
      : embed_(std::move(embed)), alias_(embed_->tokenWeight().detach().requires_grad_(true)) {}
  torch::Tensor forward(const torch::Tensor& x) override { return x.matmul(alias_.t()); }
  std::vector<std::pair<torch::Tensor, torch::Tensor>> tiedLeaves() override {
    return {{alias_, embed_->tokenWeight()}};
  }

 private:
  std::shared_ptr<Embed> embed_;  // not registered: the weight belongs to "embed"
  torch::Tensor alias_;
};

}  // namespace

std::shared_ptr<LayerList> buildModel(const ModelSpec& spec, uint64_t seed, const std::vector<char>* held) {
  // Parameter initialisation draws from the default generator, reseeded
  // before each layer from (job seed, layer index): a layer's initial
  // weights do not depend on the layers before it, so a pipeline stage can
  // build exactly its own layers and the model is the same for any cut.
  auto m = std::make_shared<LayerList>();
  auto add = [&](const std::string& name, auto make) {
    torch::manual_seed(mixSeed(seed, 0x1A17, m->size()));
    auto layer = make();
    m->add(name, layer);
    if (held && (m->size() > held->size() || !(*held)[m->size() - 1])) m->hollow(m->size() - 1);
    return layer;
  };
  // One sample's shape is spec.input, (C, H, W) for images (docs/job_file.md).
  int64_t in = 1;
  for (int64_t v : spec.input) in *= v;
  const int64_t classes = spec.classes;
  if (spec.name == "mlp") {
    add("flatten", [] { return std::make_shared<Flatten>(); });
    int64_t prev = in;
    for (size_t i = 0; i < spec.hidden.size(); ++i) {
      add("fc" + std::to_string(i + 1), [&] { return std::make_shared<Dense>(prev, spec.hidden[i], true, spec.dropout); });
      prev = spec.hidden[i];
    }
    add("head", [&] { return std::make_shared<Dense>(prev, classes, false, 0.0); });
  } else if (spec.name == "cnn") {
    add("conv1", [&] { return std::make_shared<ConvBlock>(spec.input[0], spec.channels[0]); });
    add("conv2", [&] { return std::make_shared<ConvBlock>(spec.channels[0], spec.channels[1]); });
    add("flatten", [] { return std::make_shared<Flatten>(); });
    add("fc", [&] { return std::make_shared<Dense>(spec.channels[1] * (spec.input[1] / 4) * (spec.input[2] / 4), spec.fc, true, spec.dropout); });
    add("head", [&] { return std::make_shared<Dense>(spec.fc, classes, false, 0.0); });
  } else if (spec.name == "gpt-mini") {
    const int64_t vocab = 256;  // bytes
    auto embed = add("embed", [&] { return std::make_shared<Embed>(vocab, spec.seq_len, spec.dim, spec.dropout); });
    for (int64_t i = 0; i < spec.layers; ++i)
      add("block" + std::to_string(i + 1), [&] { return std::make_shared<Block>(spec.dim, spec.heads, spec.dropout); });
    add("norm", [&] { return std::make_shared<FinalNorm>(spec.dim); });
    add("head", [&] { return std::make_shared<TiedHead>(embed); });
  } else if (spec.name == "torchscript") {
    return buildTorchScriptModel(spec, held);
  } else {
    throw InputError("unknown model '" + spec.name + "'");
  }
  return m;
}

}  // namespace morph
