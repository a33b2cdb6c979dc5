// Control-plane store round trips: c10d's TCPStore (what Morph used before
// issue 14) against Morph's authenticated store, both on loopback in this
// process. Prints median microseconds per operation and the ratio
// (Morph / TCPStore), and the cost of a new connection (TCPStore: connect;
// Morph: connect + HMAC challenge-response), which every joining worker
// pays twice.
//   build/bench/store_bench [ITERATIONS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "bench_cli.h"
#include "store/client.h"
#include "store/server.h"

namespace {

double medianMicros(int n, const std::function<void()>& f) {
  std::vector<double> t;
  t.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const auto a = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Figures {
  double set, get, check, add, connect;
};

Figures measure(c10d::Store& s, int n, const std::function<void()>& connect) {
  const std::vector<uint8_t> v(64, 1);  // a metrics line is a few hundred bytes; keys are short
  s.set("bench/k", v);
  Figures f{};
  f.set = medianMicros(n, [&] { s.set("bench/k", v); });
  f.get = medianMicros(n, [&] { (void)s.get("bench/k"); });
  f.check = medianMicros(n, [&] { (void)s.check({"bench/k"}); });
  f.add = medianMicros(n, [&] { (void)s.add("bench/n", 1); });
  f.connect = medianMicros(std::max(20, n / 50), connect);
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  int n = 5000;
  CLI::App app{"control-plane store round trips: c10d's TCPStore against Morph's store (bench/README.md)"};
  app.add_option("ITERATIONS", n, "calls of each operation")->check(CLI::Range(1, 100000000));
  if (const int rc = morph::bench::parseArgs(app, argc, argv); rc >= 0) return rc;

  c10d::TCPStoreOptions so;
  so.port = 0;
  so.isServer = true;
  so.waitWorkers = false;
  auto tcp_server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  const uint16_t tcp_port = tcp_server->getPort();
  c10d::TCPStoreOptions co;
  co.port = tcp_port;
  co.isServer = false;
  auto tcp = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", co);
  const Figures a = measure(*tcp, n, [&] { c10d::TCPStore c("127.0.0.1", co); });

  morph::store::ServerOptions mo;
  mo.token = morph::store::randomToken();
  mo.manager_key = morph::store::randomToken();
  morph::store::StoreServer server(mo);
  auto morph_client = c10::make_intrusive<morph::StoreClient>("127.0.0.1", server.port(), mo.manager_key, "manager",
                                                              std::chrono::seconds(5));
  const Figures b = measure(*morph_client, n, [&] {
    morph::StoreClient c("127.0.0.1", server.port(), mo.token, "client", std::chrono::seconds(5));
  });

  std::printf("store round trips on loopback, median of %d (microseconds)\n", n);
  std::printf("%-10s %12s %12s %8s\n", "operation", "TCPStore", "Morph", "ratio");
  auto row = [](const char* name, double x, double y) { std::printf("%-10s %12.1f %12.1f %8.2f\n", name, x, y, y / x); };
  row("set", a.set, b.set);
  row("get", a.get, b.get);
  row("check", a.check, b.check);
  row("add", a.add, b.add);
  row("connect", a.connect, b.connect);
  return 0;
}
