// The exact reduction's wires on their own (docs/performance.md, "What the
// exact reduction costs"): W processes on loopback, each with Morph's Gloo
// communicator, sum n values per call and end with the mean gradient as
// floats, as a step does:
//   exact all-reduce  Gloo's int64 SUM all-reduce, then every rank
//                     dequantises all n values (MORPH_EXACT_WIRE=allreduce);
//   exact sharded     a ring reduce-scatter of the int64 values by sends
//                     and receives, each rank dequantising its n / W,
//                     and a ring all-gather of the floats
//                     (startShardedSum; the default for large buckets);
//   float all-reduce  Gloo's float SUM all-reduce and a divide (float mode,
//                     what DDP does).
// The three are interleaved call by call (order rotating), each after a
// barrier; rank 0 prints the median and minimum milliseconds per call, the
// ratio of medians to the float all-reduce, and the bytes each rank sends
// by the algorithms' counts (ring all-reduce 2 (W-1)/W x n x size, sharded
// (W-1)/W x n x 12: 8 in the reduce-scatter, 4 in the all-gather), and checks
// that both exact wires gave the same floats.
//
//   build/bench/wire_bench [--workers 2] [--elements 669706] [--rounds 100]
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <vector>

#include "bench_cli.h"
#include "comm/communicator.h"
#include "core/sys.h"
#include "exec/fixed_point.h"

using namespace morph;

namespace {

int runRank(int rank, int W, int64_t n, int rounds, const std::string& store_path) {
  auto store = c10::make_intrusive<c10d::FileStore>(store_path, W);
  GlooOptions opts;
  opts.interface_addr = "127.0.0.1";
  std::unique_ptr<Communicator> comm = makeGlooCommunicator(store, rank, W, opts);
  const size_t N = static_cast<size_t>(n);
  // Each rank's local sum of its VNs: values as the quantiser makes them
  // (|q| < 2^48 with the default headroom), different per rank.
  std::mt19937_64 rng(static_cast<uint64_t>(rank) + 1);
  std::vector<int64_t> local(N);
  for (int64_t& v : local) v = static_cast<int64_t>(rng() >> 16) - (int64_t{1} << 47);
  const int scale = 40;
  const double B = 256.0;
  std::vector<int64_t> ex(N);
  std::vector<float> fl(N), out_ar(N), out_sh(N);
  ShardScratch scratch;
  auto barrier = [&] {
    double x = 0;
    comm->allreduceMax(&x, 1);
  };
  struct Wire {
    const char* name;
    std::function<void()> prepare, run;
    std::vector<double> ms;
  };
  std::vector<Wire> wires = {
      {"exact all-reduce + dequantize all",
       [&] { ex = local; },
       [&] {
         comm->allreduceSumAsync(ex.data(), n)->wait();
         dequantize(ex.data(), n, scale, B, out_ar.data());
       },
       {}},
      {"exact sharded",
       [&] { ex = local; },
       [&] {
         auto w = startShardedSum(*comm, ex.data(), n, 0, scratch,
                                  [&](int64_t, const int64_t* sums, int64_t len, float* out) {
                                    dequantize(sums, len, scale, B, out);
                                  });
         w->wait();
         std::memcpy(out_sh.data(), ex.data(), N * 4);
       },
       {}},
      {"float all-reduce + divide",
       [&] {
         std::transform(local.begin(), local.end(), fl.begin(),
                        [](int64_t v) { return static_cast<float>(v); });
       },
       [&] {
         comm->allreduceSumAsync(fl.data(), n)->wait();
         for (float& v : fl) v *= static_cast<float>(1.0 / B);
       },
       {}},
  };
  for (int r = 0; r < rounds + 3; ++r) {
    for (size_t k = 0; k < wires.size(); ++k) {
      Wire& w = wires[(k + static_cast<size_t>(r)) % wires.size()];
      w.prepare();
      barrier();
      const double t0 = nowSeconds();
      w.run();
      if (r >= 3) w.ms.push_back((nowSeconds() - t0) * 1e3);
    }
  }
  if (std::memcmp(out_ar.data(), out_sh.data(), N * 4) != 0) {
    std::fprintf(stderr, "rank %d: the two exact wires gave different floats\n", rank);
    return 1;
  }
  if (rank != 0) return 0;
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double fmed = median(wires[2].ms);
  const double f = static_cast<double>(W - 1) / W * static_cast<double>(n);
  const double sent[] = {2 * f * 8, f * 12, 2 * f * 4};
  std::printf("%d workers, %lld values, %d rounds (loopback)\n", W, static_cast<long long>(n),
              rounds);
  std::printf("%-40s %9s %9s %9s %12s\n", "wire", "median ms", "min ms", "/ float", "sent B/rank");
  for (size_t k = 0; k < wires.size(); ++k)
    std::printf("%-40s %9.2f %9.2f %9.2f %12.0f\n", wires[k].name, median(wires[k].ms),
                *std::min_element(wires[k].ms.begin(), wires[k].ms.end()),
                median(wires[k].ms) / fmed, sent[k]);
  std::printf(
      "exact sharded / exact all-reduce: %.2f (medians); both exact wires gave the same floats\n",
      median(wires[1].ms) / median(wires[0].ms));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int W = 2, rounds = 100;
  int64_t n = 669706;  // MLP 784-512-512-10
  CLI::App app{"the exact reduction's wires across forked processes on loopback (bench/README.md)"};
  app.add_option("--workers", W, "processes")->check(CLI::Range(2, 64));
  app.add_option("--elements", n, "values per call (default: the MLP's 669,706; at least --workers)")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 32));
  app.add_option("--rounds", rounds, "calls of each wire")->check(CLI::Range(1, 1000000));
  if (const int rc = bench::parseArgs(app, argc, argv); rc >= 0) return rc;
  if (n < W) {
    std::fprintf(stderr, "wire_bench: --elements %lld: expected at least --workers (%d)\n",
                 static_cast<long long>(n), W);
    return 2;
  }
  char dir[] = "/tmp/wire_bench.XXXXXX";
  if (!mkdtemp(dir)) return 1;
  const std::string store = std::string(dir) + "/store";
  std::vector<pid_t> kids;
  for (int r = 0; r < W; ++r) {
    const pid_t p = fork();
    if (p == 0) {
      const int rc = runRank(r, W, n, rounds, store);
      std::fflush(nullptr);
      _exit(rc);
    }
    kids.push_back(p);
  }
  int bad = 0;
  for (pid_t p : kids) {
    int st = 0;
    waitpid(p, &st, 0);
    bad += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  std::remove(store.c_str());
  rmdir(dir);
  return bad ? 1 : 0;
}
