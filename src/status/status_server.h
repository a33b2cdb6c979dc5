// StatusServer: a job's HTTP status endpoint (docs/status_page.md). It owns
// a copy of the job's per-step metrics (a few numbers per step), the
// latest status record (what `morph status` prints) and an HTTP server
// thread serving
//   /             the live page (embedded: index.html and uPlot)
//   /api/status   JSON: the status record, the latest step, the checkpoint age
//   /api/series   JSON columns of the per-step metrics (?since=N: from point N)
//   /metrics      Prometheus text exposition format 0.0.4
// It never touches training state: the manager (or the in-process runner)
// hands it copies through record() and setStatus(), which only take a lock
// and append. No libtorch here.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace httplib {
class Server;
}

namespace morph {

struct StatusOptions {
  std::string host = "127.0.0.1";  // a non-loopback address requires `token`
  int port = 0;                     // 0: a free port
  // Requests must carry it (`Authorization: Bearer TOKEN` or ?token=TOKEN)
  // when non-empty; required for a non-loopback bind.
  std::string token;
  std::string job_name;
  int64_t steps = 0;           // planned steps (0: unknown yet)
  std::string checkpoint_dir;  // scanned for step-<n> folders ("" = none)
  bool finished = false;       // `morph view`: a run that has ended
};

class StatusServer {
 public:
  // Binds and starts serving. InputError naming ADDR:PORT when the address
  // cannot be bound (port in use, no such address) or is not loopback and
  // no token is given.
  explicit StatusServer(StatusOptions opts);
  ~StatusServer();  // stops serving and joins the thread
  StatusServer(const StatusServer&) = delete;
  StatusServer& operator=(const StatusServer&) = delete;

  int port() const { return port_; }
  std::string url() const;  // http://HOST:PORT/

  // One metrics.jsonl line (a committed step; docs/job_file.md).
  void record(const nlohmann::json& line);
  // The manager's status record (`morph status`).
  void setStatus(const nlohmann::json& status);
  void setSteps(int64_t steps);
  void setFinished(const nlohmann::json& summary);  // summary.json of an ended run

  // What the endpoints answer (also for tests and the bench).
  nlohmann::json statusJson() const;
  nlohmann::json seriesJson(size_t since) const;
  std::string prometheusText() const;

 private:
  struct Point {
    int64_t step;
    double loss, lr, samples_per_second, step_seconds, reduce_seconds, unix_time;
    int32_t workers, generation;
    double test_accuracy, test_loss;  // NaN without an evaluation
    double reduced_bytes;             // all-reduce payload of the step (NaN: not in the line)
  };
  // Newest step-<n> checkpoint under checkpoint_dir: (n, age in seconds), or (-1, 0).
  std::pair<int64_t, double> newestCheckpoint() const;
  bool authorized(const std::string& header, const std::string& query_token) const;

  StatusOptions opts_;
  int port_ = 0;
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  mutable std::mutex mu_;  // guards everything below
  std::vector<Point> points_;
  nlohmann::json status_ = nlohmann::json::object();
  nlohmann::json summary_;  // null while running
  size_t last_eval_ = SIZE_MAX;  // index into points_ of the latest evaluation
  int64_t checkpoint_errors_ = 0;
  double reduced_bytes_total_ = 0;  // sum of the points' reduced_bytes
};

// "ADDR:PORT" of --status (ADDR may be empty: loopback). InputError naming
// the flag when malformed.
StatusOptions parseStatusAddress(const std::string& spec);

// The status page of `morph run`: `spec` is --status ("ADDR:PORT", "off"
// for none); `base` carries the job's name, steps, checkpoint folder and
// token. Prints the page's address. InputError as the constructor.
std::unique_ptr<StatusServer> startStatusPage(const std::string& spec, StatusOptions base);

// `morph view DIR`: serves the page for a finished run from DIR's
// metrics.jsonl and summary.json until interrupted (SIGINT/SIGTERM).
// Returns the exit code (2 for a missing folder or files, printed).
int runView(const std::string& dir, const std::string& status);

// The embedded web assets (generated at build time from src/status/web).
struct WebAsset {
  const char* path;  // "/index.html"
  const char* content_type;
  const unsigned char* data;
  size_t size;
};
const WebAsset* findWebAsset(const std::string& path);

}  // namespace morph
