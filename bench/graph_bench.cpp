// The graph analysis of TorchScript models (docs/models.md, "How layers are
// found"): for each file, the inlined forward's node count, the cut points
// found, the default cuts' layers, and the analysis time (ModelGraph:
// inlining, liveness and cut points; then the default cuts and the
// segments, batch norms rewritten) against the baseline every run pays
// anyway, torch::jit::load of the same file. Each measured in R rounds
// (a fresh load per round), min/median/max, one thread.
//
//   build/bench/graph_bench [--rounds 5] MODEL.pt ...
#include <algorithm>
#include <cstdio>

#include "bench_cli.h"
#include "core/sys.h"
#include "models/graph.h"

using namespace morph;

namespace {

struct Spread {
  double min, median, max;
};

Spread spread(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v.front(), v[v.size() / 2], v.back()};
}

}  // namespace

int main(int argc, char** argv) {
  int64_t rounds = 5;
  std::vector<std::string> files;
  CLI::App app{"TorchScript graph analysis: cut points and analysis time (bench/README.md)"};
  app.add_option("--rounds", rounds, "rounds per file")->check(CLI::Range(int64_t{1}, int64_t{1000}));
  app.add_option("files", files, "TorchScript module files (torch.jit.save)")->required();
  if (const int rc = bench::parseArgs(app, argc, argv); rc >= 0) return rc;
  pinThreads(1);
  for (const std::string& file : files) {
    std::vector<double> load_s, graph_s, cut_s;
    size_t nodes = 0, points = 0;
    std::vector<std::string> names;
    for (int64_t r = 0; r < rounds; ++r) {
      const double t0 = nowSeconds();
      torch::jit::Module m = torch::jit::load(file);
      const double t1 = nowSeconds();
      ModelGraph g(m, file);
      const double t2 = nowSeconds();
      std::vector<GraphSegment> segs = g.segments(g.defaultCuts());
      const double t3 = nowSeconds();
      load_s.push_back(t1 - t0);
      graph_s.push_back(t2 - t1);
      cut_s.push_back(t3 - t2);
      nodes = g.size();
      points = g.cutPoints().size();
      names.clear();
      for (const GraphSegment& s : segs) names.push_back(s.name);
    }
    std::vector<double> total(load_s.size());
    std::vector<double> ratio(load_s.size());
    for (size_t i = 0; i < total.size(); ++i) {
      total[i] = graph_s[i] + cut_s[i];
      ratio[i] = total[i] / load_s[i];
    }
    const Spread l = spread(load_s), a = spread(graph_s), c = spread(cut_s), t = spread(total), q = spread(ratio);
    std::printf("%s: %zu inlined nodes, %zu cut points, %zu layers by default:", file.c_str(), nodes, points,
                names.size());
    for (const std::string& n : names) std::printf(" %s", n.c_str());
    std::printf("\n  ms over %lld rounds (min/median/max): torch::jit::load %.1f/%.1f/%.1f; analysis %.1f/%.1f/%.1f "
                "(graph and cut points %.1f/%.1f/%.1f, default cuts and segments %.1f/%.1f/%.1f); "
                "analysis / load %.2f/%.2f/%.2f\n",
                static_cast<long long>(rounds), 1e3 * l.min, 1e3 * l.median, 1e3 * l.max, 1e3 * t.min,
                1e3 * t.median, 1e3 * t.max, 1e3 * a.min, 1e3 * a.median, 1e3 * a.max, 1e3 * c.min,
                1e3 * c.median, 1e3 * c.max, q.min, q.median, q.max);
    std::fflush(stdout);
  }
  return 0;
}
