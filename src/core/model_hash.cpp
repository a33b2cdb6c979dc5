#include "core/model_hash.h"

#include <xxhash.h>

#include <cstdio>
#include <map>

namespace morph {

std::string modelHash(const torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> named;
  for (const auto& p : module.named_parameters(true)) named[p.key()] = p.value();
  for (const auto& b : module.named_buffers(true)) named[b.key()] = b.value();
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  for (const auto& [name, t] : named) {
    torch::Tensor c = t.detach().contiguous();
    XXH64_update(st, c.data_ptr(), c.numel() * c.element_size());
  }
  unsigned long long h = XXH64_digest(st);
  XXH64_freeState(st);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", h);
  return buf;
}

std::string layeredHash(const std::vector<std::pair<std::string, std::string>>& layers) {
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  const char zero = 0;
  for (const auto& [name, h] : layers) {
    XXH64_update(st, name.data(), name.size());
    XXH64_update(st, &zero, 1);
    XXH64_update(st, h.data(), h.size());
  }
  unsigned long long h = XXH64_digest(st);
  XXH64_freeState(st);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", h);
  return buf;
}

}  // namespace morph
