// What must be the same on every worker of an exact job besides the job
// file (docs/distributed.md): the manager refuses a worker whose
// fingerprint differs.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/job_spec.h"
#include "data/dataset.h"

namespace morph {
namespace detail {

using json = nlohmann::json;

// The levels at which libtorch's own CPU kernels ("AVX2", "AVX512",
// "NO AVX"; ATEN_CPU_CAPABILITY pins it) and oneDNN's ("cpu_isa_avx2",
// ...; ONEDNN_MAX_CPU_ISA caps it) run: a VN's bits depend on both.
std::string atenCpuCapability();
std::string onednnCpuIsa();

// What must be the same on every worker of an exact job besides the job
// file: libtorch and BLAS (its core type included), the CPU kernel levels
// above, the fixed-point kernel, the MORPH_* settings that
// change collectives, and (`data`, when given) a digest of the data this
// worker loaded (sizes and 1024 evenly spaced samples of each split), and
// (`model`, a TorchScript model) the digest of the module file it read.
json runtimeFingerprint(const DataPair* data, const ModelSpec* model = nullptr);
// "key: manager 'a', worker 'b'" per differing key (keys missing on one side
// included); empty when they agree on every key `reference` has.
std::vector<std::string> fingerprintDifferences(const json& reference, const json& worker);

}  // namespace detail
}  // namespace morph
