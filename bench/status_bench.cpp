// The status page's own cost, without training: StatusServer::record() of
// one metrics line (what the training thread of an in-process run, or the
// manager, pays per step), and answering /api/series, /api/status and
// /metrics over HTTP for a run of N steps. Compare record() with a step
// (bench/status_overhead.py measures whole runs).
//   build/bench/status_bench [STEPS]
#include <httplib.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "bench_cli.h"
#include "status/status_server.h"

namespace {
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

int main(int argc, char** argv) {
  int steps = 100000;
  CLI::App app{"the status page's own cost: record() per step and answering its pages (bench/README.md)"};
  app.add_option("STEPS", steps, "steps recorded")->check(CLI::Range(1, 100000000));
  if (const int rc = morph::bench::parseArgs(app, argc, argv); rc >= 0) return rc;
  morph::StatusOptions o;
  o.job_name = "bench";
  o.steps = steps;
  morph::StatusServer server(o);
  // A metrics line as the trainer writes it (docs/job_file.md).
  nlohmann::json line = {{"step", 0},          {"loss", 0.5},          {"lr", 0.05},           {"samples_per_second", 12345.0},
                         {"workers", 2},       {"generation", 1},      {"train_accuracy", 0.8}, {"grad_norm", 0.0},
                         {"attempts", 1},      {"step_seconds", 0.01}, {"reduce_seconds", 0.001},
                         {"unix_time", 1.7e9}};
  double t0 = now();
  for (int i = 0; i < steps; ++i) {
    line["step"] = i;
    server.record(line);
  }
  const double record_s = (now() - t0) / steps;
  std::printf("record(): %.3f us per step (%d steps)\n", record_s * 1e6, steps);

  httplib::Client c("127.0.0.1", server.port());
  for (const char* path : {"/api/series?since=0", "/api/status", "/metrics", "/"}) {
    const int reps = 20;
    size_t bytes = 0;
    t0 = now();
    for (int r = 0; r < reps; ++r) {
      auto res = c.Get(path);
      if (!res || res->status != 200) {
        std::fprintf(stderr, "GET %s failed\n", path);
        return 1;
      }
      bytes = res->body.size();
    }
    std::printf("GET %-20s %8.3f ms  (%zu bytes)\n", path, (now() - t0) / reps * 1e3, bytes);
  }
  std::printf("a browser polls /api/series?since=N (new points only), /api/status once a second\n");
  return 0;
}
