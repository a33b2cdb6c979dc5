// runtimeFingerprint and its parts (fingerprint.h).
#include "control/fingerprint.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

#include <ATen/Version.h>
#include <torch/version.h>
#include <xxhash.h>

#include "core/sys.h"
#include "exec/fixed_point.h"

namespace morph {
namespace detail {

namespace {
// xxh64 over the sizes and an evenly spaced sample of a split's examples.
std::string datasetDigest(const Dataset& d) {
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  const int64_t n = d.size();
  XXH64_update(st, &n, sizeof n);
  const int64_t stride = std::max<int64_t>(1, n / 1024);
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < n; i += stride) idx.push_back(i);
  if (!idx.empty()) {
    Batch b = d.gather(idx);
    for (const torch::Tensor& t : {b.x.contiguous(), b.y.contiguous()})
      XXH64_update(st, t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size());
  }
  const uint64_t h = XXH64_digest(st);
  XXH64_freeState(st);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}
}  // namespace

std::string atenCpuCapability() {
  // at::show_config() is libtorch's exported description of its build and
  // of the level its CPU kernels run at (ATEN_CPU_CAPABILITY or the CPU).
  const std::string config = at::show_config();
  const std::string key = "CPU capability usage: ";
  const size_t at = config.find(key);
  if (at == std::string::npos) return "unknown";
  const size_t begin = at + key.size();
  return config.substr(begin, config.find('\n', begin) - begin);
}

std::string onednnCpuIsa() {
  // oneDNN is a dependency of libtorch (its convolutions); looked up at run
  // time so that a libtorch built without it still links.
  using Effective = int (*)();
  using Name = const char* (*)(int);
  const auto effective = reinterpret_cast<Effective>(dlsym(RTLD_DEFAULT, "dnnl_get_effective_cpu_isa"));
  if (!effective) return "none";
  const int isa = effective();
  if (const auto name = reinterpret_cast<Name>(dlsym(RTLD_DEFAULT, "dnnl_cpu_isa2str")))
    if (const char* s = name(isa)) return s;
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%x", isa);
  return buf;
}

json runtimeFingerprint(const DataPair* data, const ModelSpec* model) {
  const char* bucket = std::getenv("MORPH_BUCKET_BYTES");
  const char* wire = std::getenv("MORPH_EXACT_WIRE");
  json f = {{"torch", TORCH_VERSION},
            {"blas", checkBlas(false)},
            {"aten_cpu", atenCpuCapability()},
            {"onednn_isa", onednnCpuIsa()},
            {"fixed_point", kFixedPointKernel},
            {"MORPH_BUCKET_BYTES", bucket ? bucket : ""},
            {"MORPH_EXACT_WIRE", wire ? wire : ""}};
  if (data) f["data"] = datasetDigest(*data->train) + "/" + datasetDigest(*data->test);
  if (model && model->name == "torchscript") f["model_file"] = model->digest;
  return f;
}

std::vector<std::string> fingerprintDifferences(const json& reference, const json& worker) {
  std::vector<std::string> out;
  for (const auto& [key, value] : reference.items()) {
    const json got = worker.contains(key) ? worker.at(key) : json();
    if (got != value) out.push_back(key + ": manager " + value.dump() + ", worker " + got.dump());
  }
  return out;
}

}  // namespace detail
}  // namespace morph
