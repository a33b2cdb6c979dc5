// The per-step kernels of the exact reduction on one worker, against what
// float mode does instead, and the conversions a float64 carrier of the
// fixed-point sums would add (docs/performance.md, "What the exact reduction
// costs"). Kernels are interleaved round by round; prints the median and the
// minimum milliseconds per call.
//
//   build/bench/reduce_bench [--elements 669706] [--rounds 200]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench_cli.h"
#include "core/sys.h"
#include "exec/fixed_point.h"

using namespace morph;

int main(int argc, char** argv) {
  int64_t n = 669706;  // MLP 784-512-512-10
  int rounds = 200;
  CLI::App app{"the exact reduction's kernels on one worker against float mode's (bench/README.md)"};
  app.add_option("--elements", n, "values per buffer (default: the MLP's 669,706)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 32));
  app.add_option("--rounds", rounds, "interleaved rounds")->check(CLI::Range(1, 1000000));
  if (const int rc = bench::parseArgs(app, argc, argv); rc >= 0) return rc;
  const size_t N = static_cast<size_t>(n);
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1e-3f);
  std::vector<float> g(N), facc(N), out(N);
  for (float& v : g) v = dist(rng);
  float gmax = 0;
  for (float v : g) gmax = std::max(gmax, std::fabs(v));
  const int scale = scaleFor(gmax, 3);
  std::vector<int64_t> acc(N, 0);
  std::vector<double> carrier(N);
  volatile double sink = 0;

  struct Kernel {
    std::string name;
    std::function<void()> run;
    std::vector<double> ms;
  };
  std::vector<Kernel> ks = {
      {"float add (float mode, per VN)", [&] { for (size_t i = 0; i < N; ++i) facc[i] += g[i]; }, {}},
      {"quantizeAdd (exact, per VN)", [&] { sink = quantizeAdd(g.data(), n, scale, acc.data()).max_abs; }, {}},
      {"quantizeAddScalar (no AVX2)", [&] { sink = quantizeAddScalar(g.data(), n, scale, acc.data()).max_abs; }, {}},
      {"quantizeStore (exact, first VN)", [&] { sink = quantizeStore(g.data(), n, scale, acc.data()).max_abs; }, {}},
      {"float copy (float, first VN)", [&] { std::memcpy(facc.data(), g.data(), N * sizeof(float)); }, {}},
      {"zero float buffer (per step)", [&] { std::fill(facc.begin(), facc.end(), 0.0f); }, {}},
      {"zero int64 buffer (per step)", [&] { std::fill(acc.begin(), acc.end(), int64_t{0}); }, {}},
      {"float read / B (per step)", [&] { for (size_t i = 0; i < N; ++i) out[i] = facc[i] * (1.0f / 256); }, {}},
      {"dequantize (per step)", [&] { dequantize(acc.data(), n, scale, 256.0, out.data()); }, {}},
      // The bound the carrier needs: an OR of the magnitudes (x ^ x >> 63 is
      // |x| - 1 for negative x) bounds every |x| by a power of two.
      {"int64 -> float64 + bound (carrier)",
       [&] {
         uint64_t m = 0;
         for (size_t i = 0; i < N; ++i) {
           carrier[i] = static_cast<double>(acc[i]);
           m |= static_cast<uint64_t>(acc[i] ^ (acc[i] >> 63));
         }
         sink = static_cast<double>(m);
       },
       {}},
      {"float64 -> int64 (carrier)", [&] { for (size_t i = 0; i < N; ++i) acc[i] = static_cast<int64_t>(carrier[i]); }, {}},
  };
  for (int r = 0; r < rounds + 5; ++r)
    for (size_t k = 0; k < ks.size(); ++k) {
      Kernel& kn = ks[(k + static_cast<size_t>(r)) % ks.size()];
      if (kn.name.find("quantize") != std::string::npos) std::fill(acc.begin(), acc.end(), int64_t{0});
      const double t0 = nowSeconds();
      kn.run();
      const double t = nowSeconds() - t0;
      if (r >= 5) kn.ms.push_back(t * 1e3);
    }
  std::printf("%lld elements, %d rounds (interleaved), one thread\n", static_cast<long long>(n), rounds);
  std::printf("%-36s %10s %8s\n", "kernel", "median ms", "min ms");
  for (Kernel& k : ks) {
    std::sort(k.ms.begin(), k.ms.end());
    std::printf("%-36s %10.3f %8.3f\n", k.name.c_str(), k.ms[k.ms.size() / 2], k.ms.front());
  }
  return sink == 12345.0 ? 1 : 0;
}
