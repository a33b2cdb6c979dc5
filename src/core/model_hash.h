// Model hash, the oracle every distributed test compares against (equal
// hashes mean equal models). Defined per layer so that each pipeline stage
// can hash its own layers and the hashes combine without moving tensors:
//  - a layer's hash (modelHash(layer)): hex xxh64, seed 0, over every
//    parameter and buffer of the layer in sorted-name order, the tensor
//    bytes as stored (contiguous);
//  - the model's hash (layeredHash()): hex xxh64, seed 0, over, for each
//    layer in model order, its name, one zero byte and its hash's 16 hex
//    characters.
// The same for any cut, any number of workers and the single process.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

namespace morph {

std::string modelHash(const torch::nn::Module& module);

// (layer name, layer hash) in model order -> the model's hash.
std::string layeredHash(const std::vector<std::pair<std::string, std::string>>& layers);

}  // namespace morph
