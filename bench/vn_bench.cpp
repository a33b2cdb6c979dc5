// VN overhead: samples/s of a global batch B processed as V virtual nodes by
// Morph's executor (exact and float reduction) versus a plain libtorch loop
// doing the same V micro-batches with ordinary float gradient accumulation
// (torch::nn modules, torch::optim::SGD), in the same process and run.
// Measurements are interleaved in rounds; the best round of each counts.
//
//   build/bench/vn_bench [--model cnn|mlp] [--steps 20] [--rounds 3] [--vns 1,4,16]
#include <cstdio>
#include <sstream>

#include "bench_cli.h"
#include "plain_net.h"
#include "comm/communicator.h"
#include "core/job_spec.h"
#include "core/sys.h"
#include "data/dataset.h"
#include "data/sampler.h"
#include "exec/trainer.h"

using namespace morph;

namespace {

// The plain loop: same samples, same micro-batches (gathered on the main
// thread, as a simple DataLoader-less loop would).
double plainSamplesPerSecond(const std::string& model, const Dataset& train, int64_t B, int64_t V,
                             int64_t steps) {
  torch::manual_seed(1);
  auto net = std::make_shared<bench::PlainNet>(model);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  GlobalSampler sampler(1, train.size(), B, V);
  double t0 = 0;
  for (int64_t s = 0; s < steps + 2; ++s) {
    if (s == 2) t0 = nowSeconds();  // two warm-up steps
    opt.zero_grad();
    for (int64_t v = 0; v < V; ++v) {
      Batch b = train.gather(sampler.vnIndices(s, v));
      torch::Tensor loss = torch::nn::functional::cross_entropy(
          net->forward(b.x), b.y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
      loss.backward();
    }
    for (auto& p : net->parameters()) p.mutable_grad().div_(static_cast<double>(B));
    opt.step();
  }
  return static_cast<double>(B * steps) / (nowSeconds() - t0);
}

double morphSamplesPerSecond(const std::string& model, const Dataset& train, int64_t B, int64_t V,
                             int64_t steps, const char* mode, int64_t* buffer_bytes, int64_t* model_bytes) {
  std::ostringstream toml;
  toml << "[job]\nsteps = " << steps + 2 << "\n[data]\ndataset = \"synthetic\"\n[model]\nname = \"" << model
       << "\"\n[batch]\nglobal = " << B << "\nvirtual_nodes = " << V
       << "\n[optim]\nlr = 0.05\nmomentum = 0.9\n[reduce]\nmode = \"" << mode << "\"\n";
  JobSpec job = parseJob(toml.str(), "bench");
  LocalCommunicator comm;
  VnExecutor tr(job, job.steps, train, comm);
  *buffer_bytes = tr.core().accumulator().bufferBytes();
  *model_bytes = tr.core().modelBytes();
  tr.step();
  tr.step();
  double t0 = nowSeconds();
  while (tr.core().nextStep() < job.steps) tr.step();
  return static_cast<double>(B * steps) / (nowSeconds() - t0);
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "cnn";
  int64_t steps = 20, rounds = 3, B = 256;
  std::vector<int64_t> vns = {1, 4, 16};
  CLI::App app{"VN overhead: Morph's executor against a plain libtorch loop (bench/README.md)"};
  app.add_option("--model", model, "the model")->check(CLI::IsMember({"cnn", "mlp"}));
  app.add_option("--steps", steps, "timed steps per round")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--rounds", rounds, "rounds (the best counts)")->check(CLI::Range(int64_t{1}, int64_t{1000}));
  app.add_option("--vns", vns, "VN counts, comma-separated")->delimiter(',')->check(CLI::Range(int64_t{1}, int64_t{4096}));
  app.add_option("--global", B, "global batch")->check(CLI::Range(int64_t{1}, int64_t{60000}));
  if (const int rc = bench::parseArgs(app, argc, argv); rc >= 0) return rc;
  tuneAllocator();  // as the morph binary does; the plain loop benefits too
  pinThreads(1);
  std::printf("blas: %s\n", checkBlas(true).c_str());
  DataSpec ds;
  ds.dataset = "fashion-mnist";
  ds.path = "/usr/share/datasets/fashion-mnist";
  DataPair data = loadDatasets(ds, 1);

  std::printf("model %s, global batch %lld, %lld timed steps, best of %lld rounds, 1 thread\n", model.c_str(),
              static_cast<long long>(B), static_cast<long long>(steps), static_cast<long long>(rounds));
  std::printf("%4s %12s %12s %12s %8s %8s %12s\n", "V", "plain", "exact", "float", "ex/plain", "fl/plain",
              "t_ex/t_fl");
  double one_big = 0;
  for (int64_t V : vns) {
    double plain = 0, exact = 0, flt = 0;
    int64_t buf = 0, mbytes = 0, fbuf = 0;
    for (int64_t r = 0; r < rounds; ++r) {
      plain = std::max(plain, plainSamplesPerSecond(model, *data.train, B, V, steps));
      exact = std::max(exact, morphSamplesPerSecond(model, *data.train, B, V, steps, "exact", &buf, &mbytes));
      flt = std::max(flt, morphSamplesPerSecond(model, *data.train, B, V, steps, "float", &fbuf, &mbytes));
    }
    if (V == 1) one_big = plain;
    std::printf("%4lld %12.0f %12.0f %12.0f %8.3f %8.3f %12.3f\n", static_cast<long long>(V), plain, exact, flt,
                exact / plain, flt / plain, flt / exact);
    std::fflush(stdout);
    if (V == vns.back())
      std::printf("gradient buffer %lld bytes (exact), %lld bytes (float); model parameters %lld bytes\n",
                  static_cast<long long>(buf), static_cast<long long>(fbuf), static_cast<long long>(mbytes));
  }
  if (one_big > 0) std::printf("one big batch (plain, V=1): %.0f samples/s\n", one_big);
  return 0;
}
