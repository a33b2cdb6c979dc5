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
  layers_.push_back(register_module(name, std::move(layer)));
}

torch::Tensor LayerList::forwardRange(torch::Tensor x, size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) x = layers_[i]->forward(x);
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
// from (seed, step, vn) before each VN, so recomputation sees the same mask.
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

}  // namespace

std::shared_ptr<LayerList> buildModel(const ModelSpec& spec, uint64_t seed) {
  // Parameter initialisation draws from the default generator: seed it from
  // the job so that every worker builds the same initial model.
  torch::manual_seed(mixSeed(seed, 0x1A17));
  auto m = std::make_shared<LayerList>();
  const int64_t in = 28 * 28, classes = 10;
  if (spec.name == "mlp") {
    m->add("flatten", std::make_shared<Flatten>());
    int64_t prev = in;
    for (size_t i = 0; i < spec.hidden.size(); ++i) {
      m->add("fc" + std::to_string(i + 1), std::make_shared<Dense>(prev, spec.hidden[i], true, spec.dropout));
      prev = spec.hidden[i];
    }
    m->add("head", std::make_shared<Dense>(prev, classes, false, 0.0));
  } else if (spec.name == "cnn") {
    m->add("conv1", std::make_shared<ConvBlock>(1, spec.channels[0]));
    m->add("conv2", std::make_shared<ConvBlock>(spec.channels[0], spec.channels[1]));
    m->add("flatten", std::make_shared<Flatten>());
    m->add("fc", std::make_shared<Dense>(spec.channels[1] * 7 * 7, spec.fc, true, spec.dropout));
    m->add("head", std::make_shared<Dense>(spec.fc, classes, false, 0.0));
  } else {
    throw InputError("unknown model '" + spec.name + "'");
  }
  return m;
}

}  // namespace morph
