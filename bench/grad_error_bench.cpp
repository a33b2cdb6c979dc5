// The gradient error of each reduction format against float64 (issue 31):
// per step, the same VNs' float32 gradients summed four ways: in float64
// (the reference), in float32 one VN after the other (float mode on one
// worker), and by Morph's GradAccumulator in exact mode with the 64-bit and
// the 32-bit format (reduce.bits), with its own scale rule (each segment's
// scale from the previous step's largest value, reduce.headroom_bits, a
// step that overflows redone with the new scales). The model trains on the
// float64 sum (SGD, momentum 0.9), so every format sees the gradients of one
// real training run on Fashion-MNIST.
//
// Per format and step: the largest relative error over tensors, as
// ||sum - ref||_2 / ||ref||_2 and as max |sum - ref| / max |ref|; printed
// per step (--every) and as min / median / max over the steps.
//
//   build/bench/grad_error_bench [--model mlp|cnn] [--steps 100] [--global 256] [--vns 8] [--headroom 3]
//        [--every 10]
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "bench_cli.h"
#include "plain_net.h"
#include "core/sys.h"
#include "data/dataset.h"
#include "data/sampler.h"
#include "exec/grad_accumulator.h"

using namespace morph;

namespace {

struct Errors {
  double l2 = 0, max = 0;  // the largest over tensors this step
};

// The two relative errors of `got` against `ref` (n values), folded into `e`.
void compare(const float* got, const double* ref, int64_t n, Errors& e) {
  double d2 = 0, r2 = 0, dmax = 0, rmax = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(got[i]) - ref[i];
    d2 += d * d;
    r2 += ref[i] * ref[i];
    dmax = std::max(dmax, std::fabs(d));
    rmax = std::max(rmax, std::fabs(ref[i]));
  }
  if (r2 > 0) e.l2 = std::max(e.l2, std::sqrt(d2 / r2));
  if (rmax > 0) e.max = std::max(e.max, dmax / rmax);
}

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "mlp";
  int64_t steps = 100, B = 256, V = 8, every = 10;
  int headroom = 3;
  CLI::App app{"Gradient error of float, exact 64-bit and exact 32-bit sums against float64 (bench/README.md)"};
  app.add_option("--model", model, "the model")->check(CLI::IsMember({"cnn", "mlp"}));
  app.add_option("--steps", steps, "training steps")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--global", B, "global batch")->check(CLI::Range(int64_t{1}, int64_t{60000}));
  app.add_option("--vns", V, "virtual nodes per step")->check(CLI::Range(int64_t{1}, int64_t{4096}));
  app.add_option("--headroom", headroom, "reduce.headroom_bits")->check(CLI::Range(0, 20));
  app.add_option("--every", every, "print every N-th step (0: none)")->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  if (const int rc = bench::parseArgs(app, argc, argv); rc >= 0) return rc;
  if (B % V != 0) {
    std::fprintf(stderr, "--global %lld is not a multiple of --vns %lld\n", static_cast<long long>(B),
                 static_cast<long long>(V));
    return 2;
  }
  pinThreads(1);
  DataSpec ds;
  ds.dataset = "fashion-mnist";
  ds.path = "/usr/share/datasets/fashion-mnist";
  DataPair data = loadDatasets(ds, 1);
  torch::manual_seed(1);
  auto net = std::make_shared<bench::PlainNet>(model);
  std::vector<torch::Tensor> params = net->parameters();
  std::vector<int64_t> sizes;
  for (const auto& p : params) sizes.push_back(p.numel());
  torch::optim::SGD opt(params, torch::optim::SGDOptions(0.05).momentum(0.9));
  GlobalSampler sampler(1, data.train->size(), B, V);
  GradAccumulator ex64(sizes, ReduceMode::kExact, headroom, 64, V), ex32(sizes, ReduceMode::kExact, headroom, 32, V);
  const char* names[] = {"float", "exact64", "exact32"};
  std::vector<double> l2[3], mx[3];
  int64_t redone[3] = {0, 0, 0};
  std::printf("model %s, global batch %lld in %lld VNs, %lld steps, headroom %d bits; relative error against "
              "float64, the largest over %zu tensors\n",
              model.c_str(), static_cast<long long>(B), static_cast<long long>(V), static_cast<long long>(steps),
              headroom, params.size());
  if (every > 0) std::printf("%6s %-8s %12s %12s\n", "step", "format", "l2", "max");
  for (int64_t s = 0; s < steps; ++s) {
    // Every VN's float32 gradient (the loss summed over its samples).
    std::vector<std::vector<torch::Tensor>> g(static_cast<size_t>(V));
    for (int64_t v = 0; v < V; ++v) {
      opt.zero_grad();
      Batch b = data.train->gather(sampler.vnIndices(s, v));
      torch::nn::functional::cross_entropy(net->forward(b.x), b.y,
                                           torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
          .backward();
      for (const auto& p : params) g[static_cast<size_t>(v)].push_back(p.grad().detach().clone().contiguous());
    }
    Errors e[3];
    std::vector<torch::Tensor> ref_grads;
    for (size_t t = 0; t < params.size(); ++t) {
      const int64_t n = sizes[t];
      std::vector<double> ref(static_cast<size_t>(n), 0.0);
      std::vector<float> fl(static_cast<size_t>(n), 0.0f);
      for (int64_t v = 0; v < V; ++v) {
        const float* x = g[static_cast<size_t>(v)][t].data_ptr<float>();
        for (int64_t i = 0; i < n; ++i) {
          ref[static_cast<size_t>(i)] += x[i];
          fl[static_cast<size_t>(i)] += x[i];
        }
      }
      compare(fl.data(), ref.data(), n, e[0]);
      ref_grads.push_back(torch::from_blob(ref.data(), {n}, torch::kFloat64).clone());
    }
    // The exact formats: a step whose sums overflow is redone with the new scales.
    GradAccumulator* acc[] = {&ex64, &ex32};
    for (int k = 0; k < 2; ++k) {
      GradAccumulator& a = *acc[k];
      while (true) {
        a.beginStep();
        for (int64_t v = 0; v < V; ++v)
          for (size_t t = 0; t < params.size(); ++t) a.add(t, g[static_cast<size_t>(v)][t].data_ptr<float>());
        const std::vector<double> f = a.flagsAndMax();
        a.updateScales(f);
        if (!GradAccumulator::overflowOf(f)) break;
        ++redone[k + 1];
      }
      for (size_t t = 0; t < params.size(); ++t) {
        std::vector<float> out(static_cast<size_t>(sizes[t]));
        a.read(t, 1.0, out.data());
        compare(out.data(), ref_grads[t].data_ptr<double>(), sizes[t], e[k + 1]);
      }
    }
    for (int k = 0; k < 3; ++k) {
      l2[k].push_back(e[k].l2);
      mx[k].push_back(e[k].max);
      if (every > 0 && s % every == 0)
        std::printf("%6lld %-8s %12.3e %12.3e\n", static_cast<long long>(s), names[k], e[k].l2, e[k].max);
    }
    // Train on the float64 sum (the mean over the global batch).
    for (size_t t = 0; t < params.size(); ++t)
      params[t].mutable_grad().copy_(ref_grads[t].div(static_cast<double>(B)).view_as(params[t]).to(torch::kFloat32));
    opt.step();
  }
  std::printf("\n| format | l2 min | l2 median | l2 max | max min | max median | max max | steps redone |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (int k = 0; k < 3; ++k)
    std::printf("| %s | %.2e | %.2e | %.2e | %.2e | %.2e | %.2e | %lld |\n", names[k], quantile(l2[k], 0),
                quantile(l2[k], 0.5), quantile(l2[k], 1), quantile(mx[k], 0), quantile(mx[k], 0.5), quantile(mx[k], 1),
                static_cast<long long>(redone[k]));
  return 0;
}
