#include "exec/optimizer.h"

#include <cmath>

#include "core/error.h"

namespace morph {
namespace {

// State tensors are allocated on first use (a pipeline stage never touches
// the state of other stages' parameters) and start at zero. A state made
// while its parameter was hollow (a layer another stage held) has no
// values; once the parameter holds values again, the state is made anew
// at its size, so a checkpoint or a transfer can fill it (it was left
// empty, and a morph onto that layer failed at its first step).
torch::Tensor& lazy(std::vector<torch::Tensor>& v, size_t i, const torch::Tensor& param) {
  if (!v[i].defined() || !v[i].sizes().equals(param.sizes())) v[i] = torch::zeros_like(param);
  return v[i];
}

class Sgd : public Optimizer {
 public:
  Sgd(const OptimSpec& s, std::vector<torch::Tensor> params) : spec_(s), params_(std::move(params)) {
    if (spec_.momentum > 0.0) momentum_.resize(params_.size());  // allocated on first use
  }
  void step(double lr) override {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      torch::Tensor& p = params_[i];
      if (!p.grad().defined()) continue;  // another pipeline stage's parameter
      torch::Tensor g = p.grad();
      if (spec_.weight_decay != 0.0) g = g.add(p, spec_.weight_decay);
      if (spec_.momentum > 0.0) {
        torch::Tensor& buf = lazy(momentum_, i, params_[i]);
        // PyTorch's convention: the first step sets buf = g.
        if (steps_ == 0) buf.copy_(g); else buf.mul_(spec_.momentum).add_(g);
        g = spec_.nesterov ? g.add(buf, spec_.momentum) : buf;
      }
      p.add_(g, -lr);
    }
    ++steps_;
  }
  std::vector<std::pair<std::string, torch::Tensor>> paramState(size_t i) override {
    if (momentum_.empty()) return {};
    return {{"momentum", lazy(momentum_, i, params_[i])}};
  }
  void dropState(size_t i) override {
    if (!momentum_.empty()) momentum_[i] = torch::Tensor();
  }

 private:
  OptimSpec spec_;
  std::vector<torch::Tensor> params_, momentum_;
};

class AdamW : public Optimizer {
 public:
  AdamW(const OptimSpec& s, std::vector<torch::Tensor> params) : spec_(s), params_(std::move(params)) {
    m_.resize(params_.size());  // allocated on first use
    v_.resize(params_.size());
  }
  void step(double lr) override {
    torch::NoGradGuard no_grad;
    ++steps_;
    const double bc1 = 1.0 - std::pow(spec_.beta1, static_cast<double>(steps_));
    const double bc2 = 1.0 - std::pow(spec_.beta2, static_cast<double>(steps_));
    for (size_t i = 0; i < params_.size(); ++i) {
      torch::Tensor& p = params_[i];
      if (!p.grad().defined()) continue;  // another pipeline stage's parameter
      const torch::Tensor& g = p.grad();
      if (spec_.weight_decay != 0.0) p.mul_(1.0 - lr * spec_.weight_decay);
      torch::Tensor& m = lazy(m_, i, params_[i]);
      torch::Tensor& v = lazy(v_, i, params_[i]);
      m.mul_(spec_.beta1).add_(g, 1.0 - spec_.beta1);
      v.mul_(spec_.beta2).addcmul_(g, g, 1.0 - spec_.beta2);
      torch::Tensor denom = (v / bc2).sqrt_().add_(spec_.eps);
      p.addcdiv_(m, denom, -lr / bc1);
    }
  }
  std::vector<std::pair<std::string, torch::Tensor>> paramState(size_t i) override {
    return {{"exp_avg", lazy(m_, i, params_[i])}, {"exp_avg_sq", lazy(v_, i, params_[i])}};
  }
  void dropState(size_t i) override {
    m_[i] = torch::Tensor();
    v_[i] = torch::Tensor();
  }

 private:
  OptimSpec spec_;
  std::vector<torch::Tensor> params_, m_, v_;
};

}  // namespace

std::unique_ptr<Optimizer> makeOptimizer(const OptimSpec& spec, std::vector<torch::Tensor> params) {
  if (spec.name == "sgd") return std::make_unique<Sgd>(spec, std::move(params));
  if (spec.name == "adamw") return std::make_unique<AdamW>(spec, std::move(params));
  throw InputError("unknown optimizer '" + spec.name + "'");
}

double learningRate(const OptimSpec& s, int64_t step, int64_t total_steps) {
  if (s.warmup_steps > 0 && step < s.warmup_steps)
    return s.lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
  if (s.schedule == "cosine") {
    const double span = static_cast<double>(std::max<int64_t>(total_steps - s.warmup_steps, 1));
    const double t = std::min(1.0, static_cast<double>(step - s.warmup_steps) / span);
    return s.min_lr + 0.5 * (s.lr - s.min_lr) * (1.0 + std::cos(M_PI * t));
  }
  return s.lr;
}

double squaredNorm(const torch::Tensor& grad) {
  // Eight interleaved partial sums, combined in a fixed order: vectorisable,
  // and the same bits on every worker holding the same gradient.
  double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  torch::Tensor g = grad.contiguous();
  const float* d = g.data_ptr<float>();
  const int64_t n = g.numel();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) part[k] += static_cast<double>(d[i + k]) * d[i + k];
  for (; i < n; ++i) part[0] += static_cast<double>(d[i]) * d[i];
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

double normOfSquares(const std::vector<double>& squares) {
  double sum = 0.0;
  for (double s : squares) sum += s;
  return std::sqrt(sum);
}

void clipToNorm(const std::vector<torch::Tensor>& params, double norm, double max_norm) {
  if (max_norm <= 0.0 || norm <= max_norm) return;
  torch::NoGradGuard no_grad;
  const double coef = max_norm / (norm + 1e-6);
  for (const auto& p : params)
    if (p.grad().defined()) p.mutable_grad().mul_(coef);
}

}  // namespace morph
