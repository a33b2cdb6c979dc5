// Model hash: hex xxh64 over every parameter and buffer of a module, in
// canonical (sorted name) order, the tensor bytes as stored. Equal hashes mean
// equal models; this is the oracle every distributed test compares against.
#pragma once

#include <string>

namespace torch::nn {
class Module;
}

namespace morph {

std::string modelHash(const torch::nn::Module& module);

}  // namespace morph
