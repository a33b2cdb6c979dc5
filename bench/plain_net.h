// The plain libtorch networks the C++ benches compare Morph against
// (torch::nn modules): vs_ddp.py's MLP (784-512-512-10) and a CNN of two
// conv + batch-norm blocks, as Morph's built-in `mlp` and `cnn`.
#pragma once

#include <string>
#include <torch/torch.h>

namespace morph::bench {

struct PlainNet : torch::nn::Module {
  explicit PlainNet(const std::string& model) {
    if (model == "cnn") {
      seq = register_module(
          "seq", torch::nn::Sequential(
                     torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3).padding(1).bias(false)),
                     torch::nn::BatchNorm2d(32), torch::nn::ReLU(), torch::nn::MaxPool2d(2),
                     torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).padding(1).bias(false)),
                     torch::nn::BatchNorm2d(64), torch::nn::ReLU(), torch::nn::MaxPool2d(2),
                     torch::nn::Flatten(), torch::nn::Linear(64 * 7 * 7, 128), torch::nn::ReLU(),
                     torch::nn::Linear(128, 10)));
    } else {
      seq = register_module("seq", torch::nn::Sequential(torch::nn::Flatten(), torch::nn::Linear(784, 512),
                                                         torch::nn::ReLU(), torch::nn::Linear(512, 512),
                                                         torch::nn::ReLU(), torch::nn::Linear(512, 10)));
    }
  }
  torch::Tensor forward(const torch::Tensor& x) { return seq->forward(x); }
  torch::nn::Sequential seq{nullptr};
};

}  // namespace morph::bench
