#include "status/status_server.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <openssl/crypto.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/error.h"

namespace morph {
namespace {

// The HTTP server's loop is waited for at most this long, looked at this often.
constexpr auto kListenStartWait = std::chrono::seconds(5);
constexpr auto kListenStartPoll = std::chrono::milliseconds(1);

using json = nlohmann::json;

double unixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

bool isLoopback(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr a{};
  return inet_pton(AF_INET, host.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

double num(const json& line, const char* key, double def = NAN) {
  auto it = line.find(key);
  return it != line.end() && it->is_number() ? it->get<double>() : def;
}

// Prometheus sample value: Go's float syntax, NaN and +Inf spelled out.
std::string promValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// A label value: backslash, double quote and newline escaped.
std::string promLabel(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\', out += c;
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

}  // namespace

StatusOptions parseStatusAddress(const std::string& spec) {
  StatusOptions o;
  const size_t colon = spec.rfind(':');
  if (colon == std::string::npos)
    throw InputError("--status '" + spec + "': expected ADDR:PORT, e.g. --status 127.0.0.1:8080 (or :8080)");
  if (colon > 0) o.host = spec.substr(0, colon);
  if (o.host.size() > 2 && o.host.front() == '[' && o.host.back() == ']') o.host = o.host.substr(1, o.host.size() - 2);
  const std::string port = spec.substr(colon + 1);
  char* end = nullptr;
  const long p = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || p < 0 || p > 65535)
    throw InputError("--status '" + spec + "': port '" + port + "' is not a number in [0, 65535]");
  o.port = static_cast<int>(p);
  return o;
}

StatusServer::StatusServer(StatusOptions opts) : opts_(std::move(opts)), http_(std::make_unique<httplib::Server>()) {
  const std::string where = opts_.host + ":" + std::to_string(opts_.port);
  if (!isLoopback(opts_.host) && opts_.token.empty())
    throw InputError("--status " + where + ": a status page on a non-loopback address needs the job token");
  httplib::Server& s = *http_;
  // Two threads: a browser or two and a Prometheus scraper; never more
  // cores than that taken from training.
  s.new_task_queue = [] { return new httplib::ThreadPool(2); };
  s.set_keep_alive_max_count(100);
  // httplib's default also sets SO_REUSEPORT, with which a second job
  // could bind the same port and share its connections: only SO_REUSEADDR.
  s.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (authorized(req.get_header_value("Authorization"), req.get_param_value("token")))
      return httplib::Server::HandlerResponse::Unhandled;
    res.status = 401;
    res.set_content("the job token is required (Authorization: Bearer TOKEN)\n", "text/plain");
    return httplib::Server::HandlerResponse::Handled;
  });
  s.Get("/api/status", [this](const httplib::Request&, httplib::Response& res) {
    res.set_header("Cache-Control", "no-store");
    res.set_content(statusJson().dump(), "application/json");
  });
  s.Get("/api/series", [this](const httplib::Request& req, httplib::Response& res) {
    size_t since = 0;
    if (req.has_param("since")) since = std::strtoull(req.get_param_value("since").c_str(), nullptr, 10);
    res.set_header("Cache-Control", "no-store");
    res.set_content(seriesJson(since).dump(), "application/json");
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(prometheusText(), "text/plain; version=0.0.4; charset=utf-8");
  });
  s.Get("/.*", [](const httplib::Request& req, httplib::Response& res) {
    const WebAsset* a = findWebAsset(req.path == "/" ? "/index.html" : req.path);
    if (!a) {
      res.status = 404;
      res.set_content("not found\n", "text/plain");
      return;
    }
    res.set_content(reinterpret_cast<const char*>(a->data), a->size, a->content_type);
  });
  if (opts_.port == 0) {
    port_ = s.bind_to_any_port(opts_.host);
    if (port_ <= 0) throw InputError("--status " + where + ": cannot bind the status page to " + opts_.host);
  } else {
    if (!s.bind_to_port(opts_.host, opts_.port))
      throw InputError("--status " + where + ": cannot listen on port " + std::to_string(opts_.port) + " of " +
                       opts_.host + " (in use, or no such address); pick another with --status ADDR:PORT");
    port_ = opts_.port;
  }
  thread_ = std::thread([this] { http_->listen_after_bind(); });
  // httplib's stop() does nothing until the loop runs: wait for it, so the
  // destructor never joins a thread that goes on listening.
  const auto started_by = std::chrono::steady_clock::now() + kListenStartWait;
  while (!http_->is_running() && std::chrono::steady_clock::now() < started_by)
    std::this_thread::sleep_for(kListenStartPoll);
}

StatusServer::~StatusServer() {
  http_->stop();
  if (thread_.joinable()) thread_.join();
}

std::string StatusServer::url() const {
  const bool v6 = opts_.host.find(':') != std::string::npos;
  return "http://" + (v6 ? "[" + opts_.host + "]" : opts_.host) + ":" + std::to_string(port_) + "/";
}

bool StatusServer::authorized(const std::string& header, const std::string& query_token) const {
  if (opts_.token.empty()) return true;
  // In constant time, as the store compares its proofs: how long a wrong
  // token takes to refuse says nothing about how much of it was right.
  auto same = [](const std::string& a, const std::string& b) {
    return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
  };
  const bool by_header = same(header, "Bearer " + opts_.token);
  const bool by_query = same(query_token, opts_.token);
  return by_header || by_query;
}

void StatusServer::record(const json& line) {
  Point p;
  p.step = line.value("step", int64_t(-1));
  p.loss = num(line, "loss");
  p.lr = num(line, "lr");
  p.samples_per_second = num(line, "samples_per_second");
  p.step_seconds = num(line, "step_seconds");
  p.reduce_seconds = num(line, "reduce_seconds");
  p.unix_time = num(line, "unix_time", unixNow());
  p.workers = static_cast<int32_t>(num(line, "workers", 0));
  p.generation = static_cast<int32_t>(num(line, "generation", 0));
  p.test_accuracy = num(line, "test_accuracy");
  p.test_loss = num(line, "test_loss");
  p.reduced_bytes = num(line, "reduced_bytes");
  const bool error = line.contains("checkpoint_error");
  std::lock_guard<std::mutex> lock(mu_);
  if (!std::isnan(p.test_accuracy) || !std::isnan(p.test_loss)) last_eval_ = points_.size();
  points_.push_back(p);
  checkpoint_errors_ += error;
  if (!std::isnan(p.reduced_bytes)) reduced_bytes_total_ += p.reduced_bytes;
}

void StatusServer::setStatus(const json& status) {
  std::lock_guard<std::mutex> lock(mu_);
  status_ = status;
}

void StatusServer::setSteps(int64_t steps) {
  std::lock_guard<std::mutex> lock(mu_);
  opts_.steps = steps;
}

void StatusServer::setFinished(const json& summary) {
  std::lock_guard<std::mutex> lock(mu_);
  summary_ = summary;
  opts_.finished = true;
}

std::pair<int64_t, double> StatusServer::newestCheckpoint() const {
  namespace fs = std::filesystem;
  if (opts_.checkpoint_dir.empty()) return {-1, 0.0};
  std::error_code ec;
  int64_t best = -1;
  fs::file_time_type when{};
  for (const auto& e : fs::directory_iterator(opts_.checkpoint_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) != 0 || name.find('.') != std::string::npos) continue;  // not a temporary
    char* end = nullptr;
    const long long n = std::strtoll(name.c_str() + 5, &end, 10);
    if (*end != '\0' || n <= best) continue;
    std::error_code tec;
    const auto t = fs::last_write_time(e.path(), tec);
    if (tec) continue;
    best = n, when = t;
  }
  if (best < 0) return {-1, 0.0};
  const double age = std::chrono::duration<double>(fs::file_time_type::clock::now() - when).count();
  return {best, std::max(0.0, age)};
}

json StatusServer::statusJson() const {
  const auto [ck_step, ck_age] = newestCheckpoint();
  std::lock_guard<std::mutex> lock(mu_);
  json s = status_;
  s["job"] = opts_.job_name;
  if (!s.contains("steps") || s["steps"].get<int64_t>() <= 0) s["steps"] = opts_.steps;
  s["finished"] = opts_.finished;
  s["steps_committed"] = points_.empty() ? 0 : points_.back().step + 1;
  if (!points_.empty()) {
    const Point& p = points_.back();
    s["loss"] = p.loss;
    s["lr"] = p.lr;
    if (!s.contains("samples_per_second")) s["samples_per_second"] = p.samples_per_second;
    if (!s.contains("generation")) s["generation"] = p.generation;
    if (!s.contains("workers")) s["workers"] = p.workers;
    s["step_seconds"] = p.step_seconds;
    s["updated_unix_time"] = p.unix_time;
    if (!std::isnan(p.reduced_bytes)) s["reduced_bytes"] = p.reduced_bytes;
  }
  s["reduced_bytes_total"] = reduced_bytes_total_;
  if (last_eval_ != SIZE_MAX) {
    const Point& e = points_[last_eval_];
    s["test_accuracy"] = e.test_accuracy;
    s["test_loss"] = e.test_loss;
    s["test_step"] = e.step + 1;
  }
  s["checkpoint"] = ck_step < 0 ? json(nullptr) : json({{"step", ck_step}, {"age_seconds", ck_age}});
  s["checkpoint_errors"] = checkpoint_errors_;
  if (!summary_.is_null()) s["summary"] = summary_;
  return s;
}

json StatusServer::seriesJson(size_t since) const {
  // Copy under the lock, format outside it: record() (the training thread
  // of an in-process run) never waits for a large answer being built.
  std::vector<Point> points;
  size_t total;
  {
    std::lock_guard<std::mutex> lock(mu_);
    total = points_.size();
    if (since < total) points.assign(points_.begin() + static_cast<std::ptrdiff_t>(since), points_.end());
  }
  json step = json::array(), loss = json::array(), sps = json::array(), workers = json::array(),
       gen = json::array(), acc = json::array(), tloss = json::array(), secs = json::array(),
       when = json::array();
  for (const Point& p : points) {
    step.push_back(p.step + 1);  // steps done after this one
    loss.push_back(p.loss);
    sps.push_back(p.samples_per_second);
    workers.push_back(p.workers);
    gen.push_back(p.generation);
    acc.push_back(std::isnan(p.test_accuracy) ? json(nullptr) : json(p.test_accuracy));  // null: no evaluation
    tloss.push_back(std::isnan(p.test_loss) ? json(nullptr) : json(p.test_loss));
    secs.push_back(p.step_seconds);
    when.push_back(p.unix_time);
  }
  return {{"from", since},       {"count", total}, {"step", step},     {"loss", loss},
          {"samples_per_second", sps}, {"workers", workers}, {"generation", gen}, {"test_accuracy", acc},
          {"test_loss", tloss}, {"step_seconds", secs},   {"unix_time", when}};
}

std::string StatusServer::prometheusText() const {
  const json s = statusJson();
  std::string out;
  const std::string job = "job_name=\"" + promLabel(opts_.job_name) + "\"";
  auto metric = [&](const char* name, const char* type, const char* help, double v, const std::string& labels = "") {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    out += std::string(name) + "{" + job + labels + "} " + promValue(v) + "\n";
  };
  auto get = [&](const char* k) { return s.contains(k) && s[k].is_number() ? s[k].get<double>() : NAN; };
  metric("morph_steps_committed", "gauge", "Optimiser steps committed.", get("steps_committed"));
  metric("morph_steps_planned", "gauge", "Optimiser steps the job runs.", get("steps"));
  metric("morph_loss", "gauge", "Training loss of the latest committed step.", get("loss"));
  metric("morph_learning_rate", "gauge", "Learning rate of the latest committed step.", get("lr"));
  metric("morph_samples_per_second", "gauge", "Training throughput of the latest step.", get("samples_per_second"));
  metric("morph_step_seconds", "gauge", "Wall time of the latest step.", get("step_seconds"));
  metric("morph_test_accuracy", "gauge", "Test accuracy of the latest evaluation.", get("test_accuracy"));
  metric("morph_test_loss", "gauge", "Test loss of the latest evaluation.", get("test_loss"));
  metric("morph_reduced_bytes_per_step", "gauge",
         "All-reduce payload bytes of the reporting worker (rank 0) in the latest step.", get("reduced_bytes"));
  metric("morph_reduced_bytes_total", "counter",
         "All-reduce payload bytes of the reporting worker (rank 0), summed over the steps recorded.",
         get("reduced_bytes_total"));
  metric("morph_workers", "gauge", "Workers in the current generation.", get("workers"));
  metric("morph_generation", "gauge", "Current generation (membership and plan).", get("generation"));
  std::map<std::string, int64_t> causes = {{"join", 0}, {"leave", 0}, {"failure", 0}, {"request", 0}};
  if (s.contains("resizes") && s["resizes"].is_array())
    for (const json& r : s["resizes"]) causes[r.value("cause", std::string("request"))]++;
  out += "# HELP morph_resizes_total Membership changes, by cause.\n# TYPE morph_resizes_total counter\n";
  for (const auto& [cause, n] : causes)
    out += "morph_resizes_total{" + job + ",cause=\"" + promLabel(cause) + "\"} " + std::to_string(n) + "\n";
  const bool ck = s["checkpoint"].is_object();
  metric("morph_checkpoint_age_seconds", "gauge", "Seconds since the newest checkpoint was published.",
         ck ? s["checkpoint"]["age_seconds"].get<double>() : NAN);
  metric("morph_checkpoint_step", "gauge", "Steps committed in the newest checkpoint.",
         ck ? s["checkpoint"]["step"].get<double>() : NAN);
  metric("morph_checkpoint_errors_total", "counter", "Checkpoint writes reported failed.", get("checkpoint_errors"));
  metric("morph_finished", "gauge", "1 when the run has ended.", s["finished"].get<bool>() ? 1.0 : 0.0);
  return out;
}

std::unique_ptr<StatusServer> startStatusPage(const std::string& spec, StatusOptions base) {
  if (spec == "off") return nullptr;
  const StatusOptions where = parseStatusAddress(spec);
  base.host = where.host;
  base.port = where.port;
  // On loopback the page is open to this machine's users, as the job's
  // outputs are; elsewhere it asks for the job token.
  if (isLoopback(base.host)) base.token.clear();
  auto server = std::make_unique<StatusServer>(std::move(base));
  std::printf("morph: status page on %s\n", server->url().c_str());
  std::fflush(stdout);
  return server;
}

int runView(const std::string& dir, const std::string& status) {
  namespace fs = std::filesystem;
  try {
    const fs::path metrics = fs::path(dir) / "metrics.jsonl", summary = fs::path(dir) / "summary.json";
    if (!fs::is_regular_file(metrics))
      throw InputError(dir + ": no metrics.jsonl here (expected the --out folder of a run, e.g. runs/NAME)");
    StatusOptions o = parseStatusAddress(status.empty() ? "127.0.0.1:0" : status);
    json sum;
    if (fs::is_regular_file(summary)) {
      std::ifstream in(summary);
      sum = json::parse(in, nullptr, false);
      if (sum.is_discarded()) throw InputError(summary.string() + ": not valid JSON");
    }
    o.job_name = fs::path(dir).lexically_normal().filename().string();
    if (o.job_name.empty()) o.job_name = fs::absolute(dir).parent_path().filename().string();
    if (fs::is_directory(fs::path(dir) / "checkpoints")) o.checkpoint_dir = (fs::path(dir) / "checkpoints").string();
    // The server thread inherits this mask, so the signals reach sigwait below.
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, nullptr);
    StatusServer server(o);
    std::ifstream in(metrics);
    std::string line;
    int64_t n = 0, lineno = 0;
    while (std::getline(in, line)) {
      ++lineno;
      if (line.empty()) continue;
      json j = json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("step"))
        throw InputError(metrics.string() + ":" + std::to_string(lineno) + ": not a metrics line");
      server.record(j);
      ++n;
    }
    if (!sum.is_null()) {
      json st = {{"resizes", sum.value("resizes", json::array())}};
      for (const char* k : {"workers", "stages", "steps", "vn_shares"})
        if (sum.contains(k)) st[k] = sum[k];
      server.setStatus(st);
      server.setFinished(sum);
    }
    if (sum.contains("steps")) server.setSteps(sum["steps"].get<int64_t>());
    std::printf("morph: status page of %s (%lld steps) on %s (Ctrl-C ends)\n", dir.c_str(),
                static_cast<long long>(n), server.url().c_str());
    std::fflush(stdout);
    int sig = 0;
    sigwait(&stop, &sig);
    return 0;
  } catch (const InputError& e) {
    std::fprintf(stderr, "morph: %s\n", e.what());
    return 2;
  }
}

}  // namespace morph
