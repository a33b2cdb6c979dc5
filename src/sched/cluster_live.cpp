// The live cluster scheduler and its clients (cluster_live.h).
#include "sched/cluster_live.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <httplib.h>
#include <map>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <numeric>

#include "core/error.h"
#include "core/token_file.h"
#include "sched/policy.h"
#include "sched/step_meter.h"

namespace morph::sched {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::atomic<bool> g_stop{false};
void onStopSignal(int) { g_stop = true; }

double unixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The last complete line of a file that only grows (metrics.jsonl); ""
// when there is none yet.
std::string lastLine(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return "";
  const std::streamoff size = in.tellg();
  const std::streamoff from = std::max<std::streamoff>(0, size - 16384);
  in.seekg(from);
  std::string tail(static_cast<size_t>(size - from), '\0');
  in.read(tail.data(), size - from);
  const size_t end = tail.rfind('\n');
  if (end == std::string::npos) return "";
  const size_t prev = end == 0 ? std::string::npos : tail.rfind('\n', end - 1);
  if (prev == std::string::npos && from > 0) return "";  // longer than the tail read
  const size_t begin = prev == std::string::npos ? 0 : prev + 1;
  return tail.substr(begin, end - begin);
}

// The job's worker processes (`morph worker ...`) in the process group
// `pgid`, read from /proc. Not every process of the group: the manager's
// worker zygote (control/manager/zygote.h) is a copy of `morph run` that
// stays for the job's life, and counting it kept every shrink from ever
// looking finished while the job ran.
int workersInGroup(pid_t pgid) {
  int n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    const std::string stat = readFile(e.path().string() + "/stat");
    const size_t paren = stat.rfind(')');  // the command name may hold spaces
    if (paren == std::string::npos) continue;
    std::istringstream fields(stat.substr(paren + 1));
    std::string state;
    long ppid = 0, pgrp = 0;
    fields >> state >> ppid >> pgrp;
    if (pgrp != pgid || std::stol(name) == pgid || state == "Z") continue;
    const std::string cmd = readFile(e.path().string() + "/cmdline");  // argv, NUL-separated
    const size_t arg1 = cmd.find('\0');
    if (arg1 != std::string::npos && cmd.compare(arg1 + 1, 7, std::string("worker\0", 7)) == 0) ++n;
  }
  return n;
}

std::string newToken() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof bytes) != 1) throw std::runtime_error("no random bytes for the cluster token");
  static const char* hex = "0123456789abcdef";
  std::string t;
  for (unsigned char b : bytes) t += hex[b >> 4], t += hex[b & 15];
  return t;
}

void writeFileAtomic(const std::string& path, const std::string& text, mode_t mode) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, mode);
  if (fd < 0) throw InputError(path + ": cannot write (" + std::strerror(errno) + ")");
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) throw InputError(path + ": cannot write");
}

// Starts argv in a process group of its own, stdout to `out` (appended, or
// emptied first with `truncate_out`), stderr appended to `err`.
pid_t spawnTo(const std::vector<std::string>& args, const std::string& out, const std::string& err,
              bool truncate_out) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | (truncate_out ? O_TRUNC : O_APPEND), 0644);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (o >= 0) ::dup2(o, 1);
    if (e >= 0) ::dup2(e, 2);
    ::execvp(argv[0], argv.data());
    _exit(127);
  }
  ::setpgid(pid, pid);  // also here: no race with a kill of the group
  return pid;
}

// Starts argv in a process group of its own, stdout and stderr appended to `log`.
pid_t spawn(const std::vector<std::string>& args, const std::string& log) {
  return spawnTo(args, log, log, false);
}

// Runs argv to completion; its standard output, or nullopt when it fails.
std::optional<std::string> capture(const std::vector<std::string>& args) {
  int fds[2];
  if (::pipe(fds) != 0) return std::nullopt;
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return std::nullopt;
  if (pid == 0) {
    ::dup2(fds[1], 1);
    ::close(fds[0]);
    ::close(fds[1]);
    const int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) ::dup2(null, 2);
    ::execvp(argv[0], argv.data());
    _exit(127);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    out.append(buf, size_t(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  return out;
}

struct LiveJob {
  int64_t id = 0;
  std::string name, path, dir, log;
  std::vector<std::string> overrides;
  int priority = 1, demand = 1;
  int64_t virtual_nodes = 1;  // the most workers it can run on
  int64_t steps = 0, step_done = 0;
  std::string state = "queued";  // queued | running | done | failed | cancelled
  int target = 0;    // the worker count last asked of the job
  int held = 0;      // slots it holds: its target, or more while a shrink is under way
  int desired = 0;   // the policy's latest target, applied when it can be
  int observed = 0;  // workers of its newest committed step
  int resizes = 0;
  int port = 0;
  pid_t pid = -1;
  bool cancel = false;
  Speed speed;  // from the job's profile (morph submit --profile)
  bool has_speed = false;
  // Its committed steps as the scheduler sees them, and the speed the
  // policy last decided with (measured; step_meter.h).
  StepMeter meter;
  Speed calibrated;
  // With slot types: the type of the slot each of its workers holds, by
  // worker id (its manager gives ids in turn: a start's workers 0..K-1,
  // each later one the next), the workers a shrink or a move has asked to
  // release (until it took effect) and those a grow under way adds, the
  // policy's slots per type, and the worker id its manager gives next.
  std::map<int64_t, int> types;
  std::vector<int64_t> releasing, growing;
  std::vector<int> desired_types;
  int64_t next_worker_id = 0;
  // A move under way (SlotAction::kMove): the count it keeps, and the worker
  // it releases once a step has committed on the grown count (-1: asked).
  int move_to = 0;
  int64_t move_release = -1;
  // Slurm: the worker steps (their srun processes), the manager's address,
  // workers still to start once the port is known, and a grow waiting for
  // its new workers to register before the resize is asked.
  std::vector<pid_t> worker_steps;
  std::string host = "127.0.0.1";
  int to_launch = 0, grow_to = 0;
  // Slurm with slot types: the node (index) each worker step runs on, by
  // its srun's pid, those of the steps still to start (instead of
  // to_launch), and the worker ids whose node is known from their labels
  // (in `types` while they hold a slot; never typed again once released).
  std::map<pid_t, int> step_nodes;
  std::vector<int> launch_nodes;
  std::set<int64_t> labelled;
  double status_polled = 0;
  // A `morph resize` under way (its target), a `morph status` under way.
  pid_t resize_pid = -1, status_pid = -1;
  int resize_to = 0;
  double submitted = 0, started = 0, ended = 0;
  std::string model_hash, error;
};

json toJson(const LiveJob& j) {
  auto time = [](double t) { return t > 0 ? json(t) : json(nullptr); };
  json o = {{"id", j.id},         {"name", j.name},         {"state", j.state},         {"workers", j.held},
            {"priority", j.priority}, {"demand", j.demand}, {"submitted", time(j.submitted)},
            {"started", time(j.started)}, {"ended", time(j.ended)}, {"resizes", j.resizes},
            {"steps", j.steps},   {"step", j.step_done},    {"dir", j.dir}};
  if (!j.model_hash.empty()) o["model_hash"] = j.model_hash;
  if (!j.error.empty()) o["error"] = j.error;
  json measured = json::object();
  for (const auto& [k, sec] : j.meter.table()) measured[std::to_string(k)] = sec;
  o["step_seconds"] = measured;
  return o;
}

// Steps a worker count needs measured before the policy decides with the
// measurement instead of the job's planned (or linear) speed.
constexpr int64_t kMinMeasuredSteps = 10;

class LiveCluster {
 public:
  explicit LiveCluster(const LiveClusterOptions& o) : o_(o) {
    PolicyOptions po;
    po.resize_seconds = o.resize_seconds;
    policy_ = makePolicy(o.policy, po);
    if (o_.slurm) slurmSetup();
  }

  int run() {
    fs::create_directories(o_.out + "/jobs");
    token_ = newToken();
    writeFileAtomic(o_.out + "/token", token_ + "\n", 0600);
    http_.Post("/submit", [&](const httplib::Request& rq, httplib::Response& rs) { guarded(rq, rs, [&] { submit(rq, rs); }); });
    http_.Get("/queue", [&](const httplib::Request& rq, httplib::Response& rs) {
      guarded(rq, rs, [&] {
        std::lock_guard<std::mutex> l(mu_);
        rs.set_content(queueJson().dump(), "application/json");
      });
    });
    http_.Post("/cancel", [&](const httplib::Request& rq, httplib::Response& rs) { guarded(rq, rs, [&] { cancel(rq, rs); }); });
    const int port = o_.port == 0 ? http_.bind_to_any_port(o_.host) : (http_.bind_to_port(o_.host, o_.port) ? o_.port : -1);
    if (port <= 0)
      throw InputError("--host " + o_.host + " --port " + std::to_string(o_.port) + ": cannot listen there");
    const std::string address = o_.host + ":" + std::to_string(port);
    writeFileAtomic(o_.out + "/address", address + "\n", 0644);
    std::thread server([&] { http_.listen_after_bind(); });
    std::printf("morph: cluster on %s, %d slots, policy %s, token %s/token\n", address.c_str(), o_.slots,
                policy_->name(), o_.out.c_str());
    std::fflush(stdout);

    struct sigaction sa {};
    sa.sa_handler = onStopSignal;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    while (!g_stop) {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait_for(l, std::chrono::milliseconds(50), [&] { return dirty_ || g_stop.load(); });
      tick();
    }
    shutdown();
    http_.stop();
    server.join();
    return 0;
  }

 private:
  template <typename F>
  void guarded(const httplib::Request& rq, httplib::Response& rs, F&& f) {
    const std::string want = "Bearer " + token_;
    const std::string got = rq.get_header_value("Authorization");
    if (got.size() != want.size() || CRYPTO_memcmp(got.data(), want.data(), want.size()) != 0) {
      rs.status = 401;
      rs.set_content(json{{"error", "wrong or missing cluster token"}}.dump(), "application/json");
      return;
    }
    try {
      f();
    } catch (const std::exception& e) {
      rs.status = 400;
      rs.set_content(json{{"error", e.what()}}.dump(), "application/json");
    }
  }

  void submit(const httplib::Request& rq, httplib::Response& rs) {
    const json body = json::parse(rq.body);
    LiveJob j;
    j.path = body.at("job").get<std::string>();
    j.overrides = body.value("overrides", std::vector<std::string>{});
    j.priority = body.value("priority", 1);
    j.demand = body.value("demand", 0);
    // Validated here too: the scheduler reads the file, maybe after the
    // client did, and never queues what `morph run` would refuse.
    const std::string profile = body.value("profile", std::string());
    const JobFacts facts = o_.validate(j.path, j.overrides, profile);
    if (!facts.step_seconds.empty()) {
      j.speed = Speed(facts.step_seconds);
      j.has_speed = true;
    }
    if (j.priority < 1) throw InputError("--priority " + std::to_string(j.priority) + ": expected an integer >= 1");
    if (j.demand == 0) j.demand = int(std::min<int64_t>(facts.virtual_nodes, o_.slots));
    j.virtual_nodes = facts.virtual_nodes;
    if (j.demand < 1 || j.demand > o_.slots)
      throw InputError("--demand " + std::to_string(j.demand) + ": the cluster has " + std::to_string(o_.slots) +
                       " slots (expected 1.." + std::to_string(o_.slots) + ")");
    if (j.demand > facts.virtual_nodes)
      throw InputError("--demand " + std::to_string(j.demand) + ": " + j.path + " has " +
                       std::to_string(facts.virtual_nodes) + " VNs (batch.virtual_nodes), so at most " +
                       std::to_string(facts.virtual_nodes) + " workers");
    j.name = facts.name;
    j.steps = facts.steps;
    std::lock_guard<std::mutex> l(mu_);
    j.id = int64_t(jobs_.size());
    j.dir = o_.out + "/jobs/" + std::to_string(j.id);
    j.log = j.dir + "/log";
    j.submitted = unixNow();
    jobs_.push_back(j);
    std::printf("morph: job %lld submitted: %s, priority %d, demand %d\n", static_cast<long long>(j.id),
                j.name.c_str(), j.priority, j.demand);
    std::fflush(stdout);
    dirty_ = true;
    cv_.notify_all();
    rs.set_content(json{{"id", j.id}}.dump(), "application/json");
  }

  void cancel(const httplib::Request& rq, httplib::Response& rs) {
    const int64_t id = json::parse(rq.body).at("id").get<int64_t>();
    std::lock_guard<std::mutex> l(mu_);
    if (id < 0 || id >= int64_t(jobs_.size())) {
      rs.status = 404;
      rs.set_content(json{{"error", "no job " + std::to_string(id)}}.dump(), "application/json");
      return;
    }
    LiveJob& j = jobs_[size_t(id)];
    if (j.state == "queued") {
      j.state = "cancelled";
      j.ended = unixNow();
    } else if (j.state == "running") {
      j.cancel = true;
      ::kill(-j.pid, SIGTERM);
    } else {
      rs.status = 409;
      rs.set_content(json{{"error", "job " + std::to_string(id) + " is already " + j.state}}.dump(), "application/json");
      return;
    }
    std::printf("morph: job %lld cancelled\n", static_cast<long long>(id));
    dirty_ = true;
    cv_.notify_all();
    rs.set_content(json{{"id", id}, {"state", j.state}}.dump(), "application/json");
  }

  json queueJson() const {
    json jobs = json::array();
    for (const LiveJob& j : jobs_) {
      jobs.push_back(toJson(j));
      if (o_.types.empty()) continue;
      json by_type = json::object();  // the slots it holds of each type
      const std::vector<int> c = heldTypes(j, false);
      for (size_t t = 0; t < c.size(); ++t)
        if (c[t] > 0) by_type[o_.types[t].name] = c[t];
      jobs.back()["slot_types"] = by_type;
    }
    return json{{"slots", o_.slots}, {"policy", policy_->name()}, {"jobs", jobs}};
  }

  // One round: observe the jobs, decide on events, apply what can be.
  void tick() {
    bool changed = false;
    for (LiveJob& j : jobs_) {
      if (j.state != "running") continue;
      int status = 0;
      if (::waitpid(j.pid, &status, WNOHANG) == j.pid) {
        ::kill(-j.pid, SIGKILL);  // whatever the job left behind in its group
        finish(j, status);
        dirty_ = changed = true;
        continue;
      }
      if (j.port == 0) {
        static const std::regex re("manager on port ([0-9]+)");
        std::smatch m;
        const std::string text = readFile(j.log);
        if (std::regex_search(text, m, re)) j.port = std::stoi(m[1]);
      }
      if (resizeDone(j)) changed = dirty_ = true;
      if (o_.slurm) slurmTick(j);
      observeMetrics(j);
      // A move's second half: once a step committed on the grown count, the
      // worker on the slot it leaves is released.
      if (j.move_release >= 0 && j.resize_pid < 0 && j.target == j.move_to + 1 && j.observed == j.target) {
        const int64_t id = j.move_release;
        if (resize(j, j.move_to, {id})) {
          j.releasing = {id};
          j.move_release = -1;
          changed = true;
        }
      }
      // A shrink has taken effect once a step committed on the new count and
      // the workers that left have exited. The process table is read only
      // then: a scan of /proc every tick for every job cost its workers
      // about a tenth of a core (bench/cluster_live_vs_sim.py).
      const bool shrinking = j.held > j.target && j.resize_pid < 0 && j.grow_to == 0 && j.observed == j.target;
      if (shrinking && (o_.slurm ? int(j.worker_steps.size()) : workersInGroup(j.pid)) <= j.target) {
        setHeld(j, j.target);
        changed = true;
      }
    }
    for (auto it = helpers_.begin(); it != helpers_.end();) {  // `morph slow` helpers
      int st = 0;
      if (::waitpid(*it, &st, WNOHANG) == *it) it = helpers_.erase(it);
      else ++it;
    }
    if (dirty_) decide();
    changed |= apply();
    dirty_ = false;
    if (changed) writeFileAtomic(o_.out + "/queue.json", queueJson().dump(1) + "\n", 0644);
  }

  // The job's newest committed step (metrics.jsonl): its progress, its
  // worker count, and a sighting for its step meter.
  static void observeMetrics(LiveJob& j) {
    const std::string line = lastLine(j.dir + "/metrics.jsonl");
    if (line.empty()) return;
    try {
      const json m = json::parse(line);
      const int64_t step = m.value("step", int64_t{0});
      j.step_done = step + 1;
      j.observed = m.value("workers", 0);
      j.meter.observe(step, m.value("unix_time", 0.0), j.observed);
    } catch (const json::exception&) {
    }
  }

  void finish(LiveJob& j, int status) {
    observeMetrics(j);  // the steps committed since the last round
    // Worker steps: they end with the job (3 s at most), then SIGTERM
    // (a failed or cancelled job's), then SIGKILL.
    for (int round = 0; round < 3 && !j.worker_steps.empty(); ++round) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(round == 0 ? 3 : 5);
      for (pid_t p : j.worker_steps)
        if (round > 0) ::kill(-p, round == 1 ? SIGTERM : SIGKILL);
      for (auto it = j.worker_steps.begin(); it != j.worker_steps.end();) {
        int st = 0;
        pid_t r = 0;
        while ((r = ::waitpid(*it, &st, WNOHANG)) == 0 && std::chrono::steady_clock::now() < until)
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        if (r == *it || (r < 0 && errno == ECHILD)) it = j.worker_steps.erase(it);
        else ++it;
      }
    }
    j.worker_steps.clear();
    j.step_nodes.clear();
    j.launch_nodes.clear();
    j.labelled.clear();
    endHelper(j.resize_pid);
    endHelper(j.status_pid);
    j.ended = unixNow();
    j.held = j.target = j.desired = 0;
    j.types.clear();
    j.releasing.clear();
    j.growing.clear();
    j.move_to = 0;
    j.move_release = -1;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (j.cancel) {
      j.state = "cancelled";
    } else if (code == 0) {
      j.state = "done";
      try {
        j.model_hash = json::parse(readFile(j.dir + "/summary.json")).value("model_hash", "");
      } catch (const json::exception&) {
      }
    } else {
      j.state = "failed";
      j.error = "exit code " + std::to_string(code) + " (log: " + j.log + ")";
    }
    std::printf("morph: job %lld %s%s%s\n", static_cast<long long>(j.id), j.state.c_str(),
                j.model_hash.empty() ? "" : ", model_hash ", j.model_hash.c_str());
    std::fflush(stdout);
  }

  void decide() {
    ClusterView v;
    v.now = unixNow();
    v.slots = o_.slots;
    v.types = o_.types;
    std::vector<LiveJob*> active;
    for (LiveJob& j : jobs_) {
      if (j.state != "queued" && j.state != "running") continue;
      if (j.cancel) continue;
      JobState s;
      s.id = j.id;
      s.priority = j.priority;
      s.demand = j.demand;
      s.arrival = j.submitted;
      s.remaining_steps = double(std::max<int64_t>(1, j.steps - j.step_done));
      s.allocated = j.target;
      if (!o_.types.empty()) {  // the workers it keeps: a release asked counts as done
        s.held = heldTypes(j, true);
        s.allocated = std::accumulate(s.held.begin(), s.held.end(), 0);
      }
      s.speed = j.has_speed ? &j.speed : nullptr;
      // Measured: the job's own mean step on the counts it ran on, the
      // planner's shape elsewhere (step_meter.h). Only for a job with a
      // profile: a job without one is linear in no unit (1 step per second
      // per worker), and one measured in seconds beside it would look
      // hundreds of times faster. Not with slot types yet: a count's
      // measurement mixes its slots' types.
      const std::map<int, double> measured = j.meter.table(kMinMeasuredSteps);
      if (j.has_speed && o_.types.empty() && !measured.empty()) {
        j.calibrated = calibratedSpeed(s.speed, measured, j.demand);
        s.speed = &j.calibrated;
      }
      v.jobs.push_back(s);
      active.push_back(&j);
    }
    const TypedTargets t = policy_->allocateTyped(v);
    for (size_t k = 0; k < active.size(); ++k) {
      active[k]->desired = std::accumulate(t[k].begin(), t[k].end(), 0);
      active[k]->desired_types = t[k];
    }
  }

  // Slot types: the slots j holds of each type; `kept`: less the workers a
  // shrink or a move asked to release.
  std::vector<int> heldTypes(const LiveJob& j, bool kept) const {
    std::vector<int> c(o_.types.size(), 0);
    if (typedSlurm()) {  // its worker steps' nodes, started or to start
      for (const auto& [pid, n] : j.step_nodes) ++c[size_t(nodes_[size_t(n)].type)];
      for (int n : j.launch_nodes) ++c[size_t(nodes_[size_t(n)].type)];
      if (!kept) return c;
      for (const auto& [id, t] : j.types) {
        const bool going = id == j.move_release || std::find(j.releasing.begin(), j.releasing.end(), id) != j.releasing.end();
        if (going && c[size_t(t)] > 0) --c[size_t(t)];
      }
      return c;
    }
    for (const auto& [id, t] : j.types) {
      const bool going = id == j.move_release || std::find(j.releasing.begin(), j.releasing.end(), id) != j.releasing.end();
      if (!kept || !going) ++c[size_t(t)];
    }
    return c;
  }

  // A job's held slots change: the workers asked to release give theirs back
  // (and, should that not be enough, its highest ids).
  void setHeld(LiveJob& j, int held) {
    j.held = held;
    if (int(j.types.size()) > held) {
      for (int64_t id : j.releasing) j.types.erase(id);
      while (int(j.types.size()) > held) j.types.erase(std::prev(j.types.end()));
    }
    j.releasing.clear();
    if (j.move_to > 0 && j.move_release < 0 && held == j.move_to) {
      j.move_to = 0;
      std::printf("morph: job %lld moved: now on %s\n", static_cast<long long>(j.id), describeTypes(j).c_str());
      std::fflush(stdout);
    }
  }

  // "fast+slow" style: j's slots by type, e.g. "1 fast, 1 slow".
  std::string describeTypes(const LiveJob& j) const {
    const std::vector<int> c = heldTypes(j, false);
    std::string text;
    for (size_t t = 0; t < c.size(); ++t)
      if (c[t] > 0) text += (text.empty() ? "" : ", ") + std::to_string(c[t]) + " " + o_.types[t].name;
    return text;
  }

  // The workers j releases for slots of `release` (types): per slot, its
  // highest worker id of that type not yet chosen (ids: docs/cluster.md).
  std::vector<int64_t> workersOf(const LiveJob& j, const std::vector<int>& release) const {
    std::vector<int64_t> ids;
    for (int t : release)
      for (auto it = j.types.rbegin(); it != j.types.rend(); ++it)
        if (it->second == t && std::find(ids.begin(), ids.end(), it->first) == ids.end()) {
          ids.push_back(it->first);
          break;
        }
    std::sort(ids.begin(), ids.end());
    return ids;
  }

  // The job's resources file (docs/resources.md): one local device per
  // worker, of the types it starts on, so that `morph run --resources`
  // emulates their slowdowns.
  std::string writeJobResources(const LiveJob& j) const {
    std::string text = "# written by morph cluster: the slot types job " + std::to_string(j.id) + " started on\n";
    for (const SlotType& t : o_.types) {
      char line[256];
      std::snprintf(line, sizeof line, "[types.%s]\nmemory_mib = %.17g\nslowdown = %.17g\n", t.name.c_str(),
                    std::max(1.0, t.memory_mib), t.slowdown);
      text += line;
    }
    for (const auto& [id, t] : j.types)  // ids 0..K-1: device i is worker i's
      text += "[[devices]]\ntype = \"" + o_.types[size_t(t)].name + "\"\nhost = \"local\"\ncount = 1\n";
    const std::string path = j.dir + "/resources.toml";
    writeFileAtomic(path, text, 0644);
    return path;
  }

  // Workers that join a typed job later run at its slot's emulated speed
  // through `morph slow` (the job's resources file lists only the workers
  // it started with; the manager gives later ones the next ids in turn).
  // Gives `more` (types) the next worker ids; returns them.
  std::vector<int64_t> addWorkers(LiveJob& j, const std::vector<int>& more) {
    std::vector<int64_t> ids;
    for (int t : more) {
      ids.push_back(j.next_worker_id++);
      j.types[ids.back()] = t;
    }
    return ids;
  }

  void slowNewWorkers(LiveJob& j, const std::vector<int64_t>& ids) {
    for (int64_t id : ids) {
      const double f = o_.types[size_t(j.types.at(id))].slowdown;
      if (f == 1.0) continue;
      char factor[32];
      std::snprintf(factor, sizeof factor, "%.17g", f);
      // The worker must have registered first: retried for up to 30 s.
      helpers_.push_back(spawn({"sh", "-c", "for i in $(seq 150); do \"$@\" && exit 0; sleep 0.2; done; exit 1", "slow",
                                o_.self_exe, "slow", "--join", j.host + ":" + std::to_string(j.port), "--worker",
                                std::to_string(id), "--factor", factor, "--token-file", j.dir + "/token"},
                               o_.out + "/slow.log"));
    }
  }

  // Shrinks first; starts and grows only within the slots no job holds.
  bool apply() {
    // Every job that holds slots or may get some; cancelled ones only hold.
    std::vector<LiveJob*> live;
    std::vector<SlotState> states;
    for (LiveJob& j : jobs_) {
      const bool active = (j.state == "queued" || j.state == "running") && !j.cancel;
      if (!active && j.held == 0) continue;
      SlotState s;
      s.id = j.id;
      s.priority = j.priority;
      s.running = j.state == "running";
      s.target = j.target;
      s.held = j.held;
      s.desired = active ? j.desired : j.target;
      s.ready = active && (!s.running || (j.port > 0 && j.resize_pid < 0 && j.grow_to == 0 && j.move_to == 0));
      // Typed under Slurm: a shrink names its workers by type, so every
      // worker's label must be known first.
      if (typedSlurm() && s.running) s.ready = s.ready && j.launch_nodes.empty() && j.types.size() >= j.worker_steps.size();
      s.can_move = j.target < j.virtual_nodes && !o_.slurm;  // one worker more in between
      if (!o_.types.empty()) {
        s.held_types = heldTypes(j, false);
        s.desired_types = active ? j.desired_types : std::vector<int>{};
      }
      live.push_back(&j);
      states.push_back(s);
    }
    bool changed = false;
    for (const SlotAction& a : planSlotActions(states, o_.slots, o_.types)) {
      LiveJob* j = live[a.job];
      if (a.kind == SlotAction::kShrink) {
        const std::vector<int64_t> ids = workersOf(*j, a.release);
        if (resize(*j, a.workers, ids)) {
          j->releasing = ids;
          changed = true;
        }
      } else if (a.kind == SlotAction::kStart) {
        j->types.clear();
        j->next_worker_id = 0;
        if (typedSlurm()) {
          j->labelled.clear();
          j->launch_nodes = pickNodes(a.types);  // typed once they have registered (labels)
        } else {
          addWorkers(*j, a.types);  // ids 0..K-1, fastest first
        }
        start(*j, a.workers);
        changed = true;
      } else if (a.kind == SlotAction::kMove) {
        // One worker more on the new type's slot; the old slot's worker is
        // released once a step committed on the grown count (tick).
        const std::vector<int64_t> out = workersOf(*j, a.release);
        if (out.size() == 1 && resize(*j, a.workers + 1)) {
          j->move_to = a.workers;
          j->move_release = out[0];
          j->growing = addWorkers(*j, a.types);
          std::printf("morph: job %lld: moving worker %lld (%s) to a %s slot: worker %lld joins first\n",
                      static_cast<long long>(j->id), static_cast<long long>(out[0]),
                      o_.types[size_t(a.release[0])].name.c_str(), o_.types[size_t(a.types[0])].name.c_str(),
                      static_cast<long long>(j->growing[0]));
          std::fflush(stdout);
          slowNewWorkers(*j, j->growing);
          changed = true;
        }
      } else {
        if (o_.slurm) {
          // Worker steps first; the resize once they have registered
          // (asked earlier, the manager would start local workers).
          j->grow_to = j->desired;
          if (typedSlurm()) {
            for (int n : pickNodes(a.types)) j->launch_nodes.push_back(n);
          } else {
            j->to_launch += j->desired - int(j->worker_steps.size());
          }
          std::printf("morph: job %lld: starting %d worker step(s) to grow to %d\n", static_cast<long long>(j->id),
                      j->to_launch + int(j->launch_nodes.size()), j->desired);
          std::fflush(stdout);
          j->held = j->desired;
          slurmTick(*j);
          changed = true;
        } else if (resize(*j, a.workers)) {
          j->growing = addWorkers(*j, a.types);
          slowNewWorkers(*j, j->growing);
          changed = true;
        }
      }
    }
    return changed;
  }

  void start(LiveJob& j, int workers) {
    fs::create_directories(j.dir);
    std::vector<std::string> args{o_.self_exe, "run",   j.path,  "--workers", std::to_string(workers),
                                  "--out",     j.dir,   "--port", "0",        "--status",
                                  "off",       "--quiet"};
    if (o_.slurm) {
      j.host = manager_addr_;
      args.insert(args.end(), {"--spawn", "0", "--host", j.host});
      args.insert(args.begin(), {"srun", "--nodes=1", "--ntasks=1", "--overlap", "--nodelist=" + manager_node_,
                                 "--job-name=morph-" + std::to_string(j.id) + "-manager"});
      j.to_launch = typedSlurm() ? 0 : workers;  // typed: launch_nodes
    }
    for (const auto& s : j.overrides) args.insert(args.end(), {"--set", s});
    // Under Slurm the workers' ids are known only once they have registered:
    // each is slowed to its node's type then (`morph slow`), not by a file.
    if (!o_.types.empty() && !o_.slurm) args.insert(args.end(), {"--resources", writeJobResources(j)});
    j.pid = spawn(args, j.log);
    j.state = "running";
    j.started = unixNow();
    j.target = j.held = workers;
    std::printf("morph: job %lld started on %d workers (pid %d, %s)\n", static_cast<long long>(j.id), workers,
                int(j.pid), j.dir.c_str());
    std::fflush(stdout);
  }

  // `morph resize` against the job's manager. A shrink keeps the slots held
  // until the job's metrics show the new count; a grow holds them at once.
  // Started here, finished in a later tick (resizeDone): the scheduler never
  // waits for a `morph resize` process (it loads libtorch: seconds on a
  // busy machine) while it holds the lock the API needs. A grow's slots
  // are held from now on.
  // `release`: the workers (ids) the manager releases before any other.
  bool resize(LiveJob& j, int workers, const std::vector<int64_t>& release = {}) {
    if (j.resize_pid > 0) return false;
    std::vector<std::string> args{o_.self_exe, "resize", "--join", j.host + ":" + std::to_string(j.port), "--workers",
                                  std::to_string(workers), "--token-file", j.dir + "/token"};
    if (!release.empty()) {
      std::string ids;
      for (int64_t id : release) ids += (ids.empty() ? "" : ",") + std::to_string(id);
      args.insert(args.end(), {"--release", ids});
    }
    j.resize_pid = spawn(args, o_.out + "/resize.log");
    j.resize_to = workers;
    j.held = std::max(j.held, workers);
    return true;
  }

  // Reaps a finished `morph resize`: the new target, or the old one back.
  bool resizeDone(LiveJob& j) {
    int status = 0;
    if (j.resize_pid <= 0 || ::waitpid(j.resize_pid, &status, WNOHANG) != j.resize_pid) return false;
    j.resize_pid = -1;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::printf("morph: job %lld: resize to %d failed (%s/resize.log); retried at the next event\n",
                  static_cast<long long>(j.id), j.resize_to, o_.out.c_str());
      j.desired = j.target;
      for (int64_t id : j.growing) j.types.erase(id);  // the grow's workers never came
      j.next_worker_id -= int64_t(j.growing.size());
      j.growing.clear();
      j.releasing.clear();
      j.move_to = 0;
      j.move_release = -1;
      setHeld(j, std::max(j.target, j.observed));
      j.desired_types = heldTypes(j, false);  // no move retried before the next decision
    } else {
      std::printf("morph: job %lld resized %d -> %d workers\n", static_cast<long long>(j.id), j.target, j.resize_to);
      j.target = j.resize_to;
      j.growing.clear();
      ++j.resizes;
    }
    std::fflush(stdout);
    return true;
  }

  // Ends a helper process (resize, status) of a job that has ended.
  static void endHelper(pid_t& pid) {
    if (pid <= 0) return;
    ::kill(-pid, SIGKILL);
    int st = 0;
    ::waitpid(pid, &st, 0);
    pid = -1;
  }

  void shutdown() {
    std::lock_guard<std::mutex> l(mu_);
    for (LiveJob& j : jobs_)
      if (j.state == "running") {
        j.cancel = true;
        ::kill(-j.pid, SIGTERM);
      }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (LiveJob& j : jobs_) {
      if (j.state != "running") continue;
      int status = 0;
      while (::waitpid(j.pid, &status, WNOHANG) == 0 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      ::kill(-j.pid, SIGKILL);
      if (::waitpid(j.pid, &status, WNOHANG) == 0) ::waitpid(j.pid, &status, 0);
      finish(j, status);
    }
    writeFileAtomic(o_.out + "/queue.json", queueJson().dump(1) + "\n", 0644);
    std::printf("morph: cluster stopped\n");
  }

  // The allocation's first node runs the managers; its address is the one
  // the workers join.
  void slurmSetup() {
    if (!std::getenv("SLURM_JOB_ID") || !std::getenv("SLURM_JOB_NODELIST"))
      throw InputError("morph cluster --slurm runs inside a Slurm allocation (salloc or sbatch): SLURM_JOB_ID is not set");
    const auto nodes = capture({"scontrol", "show", "hostnames", std::getenv("SLURM_JOB_NODELIST")});
    if (!nodes || nodes->empty()) throw InputError("--slurm: `scontrol show hostnames $SLURM_JOB_NODELIST` failed");
    manager_node_ = nodes->substr(0, nodes->find('\n'));
    if (!o_.types.empty()) {
      std::vector<std::string> allocation;
      std::istringstream lines(*nodes);
      for (std::string n; std::getline(lines, n);)
        if (!n.empty()) allocation.push_back(n);
      const char* tasks = std::getenv("SLURM_TASKS_PER_NODE");
      nodes_ = slurmNodes(o_.devices, o_.types, allocation, o_.resources,
                          tasks ? slurmTasksPerNode(tasks, allocation.size()) : std::vector<int>{});
    }
    const auto node = capture({"scontrol", "-o", "show", "node", manager_node_});
    std::smatch m;
    static const std::regex addr_re("NodeAddr=([^ ]+)");
    if (!node || !std::regex_search(*node, m, addr_re))
      throw InputError("--slurm: cannot read node " + manager_node_ + "'s address (scontrol show node)");
    manager_addr_ = m[1];
  }

  // Starts pending worker steps, reaps ended ones, and asks a grow's resize
  // once its new workers have registered (`morph status`: alive).
  void slurmTick(LiveJob& j) {
    for (auto it = j.worker_steps.begin(); it != j.worker_steps.end();) {
      int st = 0;
      if (::waitpid(*it, &st, WNOHANG) == *it) {
        j.step_nodes.erase(*it);
        it = j.worker_steps.erase(it);
      } else {
        ++it;
      }
    }
    if (j.port == 0) return;
    auto launch = [&](int node) {
      const std::string log = j.dir + "/worker-" + std::to_string(j.worker_steps.size()) + "-" +
                              std::to_string(int64_t(unixNow() * 1000)) + ".log";
      std::vector<std::string> args{"srun", "--nodes=1", "--ntasks=1", "--exclusive",
                                    "--job-name=morph-" + std::to_string(j.id) + "-worker"};
      if (node >= 0) args.push_back("--nodelist=" + nodes_[size_t(node)].name);
      args.insert(args.end(), {o_.self_exe, "worker", "--join", j.host + ":" + std::to_string(j.port), "--token-file",
                               j.dir + "/token", "--connect-timeout", "120"});
      if (node >= 0) args.insert(args.end(), {"--label", nodes_[size_t(node)].name});
      j.worker_steps.push_back(spawn(args, log));
      if (node >= 0) j.step_nodes[j.worker_steps.back()] = node;
    };
    for (; j.to_launch > 0; --j.to_launch) launch(-1);
    for (int n : j.launch_nodes) {
      launch(n);
      std::printf("morph: job %lld: worker step on %s (%s)\n", static_cast<long long>(j.id),
                  nodes_[size_t(n)].name.c_str(), o_.types[size_t(nodes_[size_t(n)].type)].name.c_str());
    }
    if (!j.launch_nodes.empty()) std::fflush(stdout);
    j.launch_nodes.clear();
    // `morph status` runs as a helper too; its answer is read when it ends.
    const std::string status_file = j.dir + "/status.json";
    int st = 0;
    if (j.status_pid > 0 && ::waitpid(j.status_pid, &st, WNOHANG) == j.status_pid) {
      j.status_pid = -1;
      int alive = 0;
      try {
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
          const json status = json::parse(readFile(status_file));
          alive = status.value("alive", 0);
          if (typedSlurm()) learnLabels(j, status.value("labels", json::object()));
        }
      } catch (const json::exception&) {
      }
      if (j.grow_to > 0 && alive >= j.grow_to) {
        const int to = j.grow_to;
        j.grow_to = 0;
        resize(j, to);
      }
    }
    // Typed: polled until every worker step's worker is known, and when a
    // step ended that no shrink released (a worker that died or that the
    // job's straggler watch released: its id leaves `types`).
    const bool unlabelled = typedSlurm() && j.types.size() < j.worker_steps.size();
    const bool vanished = typedSlurm() && j.types.size() > j.worker_steps.size() && j.releasing.empty() &&
                          j.move_release < 0 && j.resize_pid < 0;
    if ((j.grow_to > 0 || unlabelled || vanished) && j.status_pid < 0 && j.resize_pid < 0 && unixNow() - j.status_polled > 0.5) {
      j.status_polled = unixNow();
      ::unlink(status_file.c_str());
      j.status_pid = spawnTo({o_.self_exe, "status", "--join", j.host + ":" + std::to_string(j.port), "--token-file",
                              j.dir + "/token"},
                             status_file, j.dir + "/status.err", true);
    }
  }

  // Typed under Slurm: each worker's type is its node's (its label: the
  // node its step was started on), learned from `morph status`; a worker
  // on a slow type is slowed to it then (`morph slow`).
  void learnLabels(LiveJob& j, const json& labels) {
    if (!labels.is_object()) return;
    // A worker listed before and no longer (the status lists live workers)
    // is gone: its slot is no longer its job's to release.
    for (auto it = j.types.begin(); it != j.types.end();) {
      const bool listed = labels.contains(std::to_string(it->first));
      const bool going = std::find(j.releasing.begin(), j.releasing.end(), it->first) != j.releasing.end();
      if (j.labelled.count(it->first) && !listed && !going) {
        std::printf("morph: job %lld: worker %lld (%s) is gone\n", static_cast<long long>(j.id),
                    static_cast<long long>(it->first), o_.types[size_t(it->second)].name.c_str());
        it = j.types.erase(it);
      } else {
        ++it;
      }
    }
    for (const auto& [key, label] : labels.items()) {
      int64_t id = -1;
      try {
        id = std::stoll(key);
      } catch (const std::exception&) {
        continue;
      }
      if (!label.is_string() || j.labelled.count(id)) continue;
      const auto n = std::find_if(nodes_.begin(), nodes_.end(),
                                  [&](const SlurmNode& x) { return x.name == label.get<std::string>(); });
      if (n == nodes_.end()) continue;
      j.labelled.insert(id);
      j.types[id] = n->type;
      j.next_worker_id = std::max(j.next_worker_id, id + 1);
      std::printf("morph: job %lld: worker %lld on %s (%s)\n", static_cast<long long>(j.id), static_cast<long long>(id),
                  n->name.c_str(), o_.types[size_t(n->type)].name.c_str());
      std::fflush(stdout);
      slowNewWorkers(j, {id});
    }
  }

  bool typedSlurm() const { return o_.slurm && !o_.types.empty(); }

  // Nodes for new worker steps on slots of `types`, each where its type has
  // the most slots free (worker steps of every job, started or to start).
  std::vector<int> pickNodes(const std::vector<int>& types) const {
    std::vector<int> used(nodes_.size(), 0), out;
    for (const LiveJob& j : jobs_) {
      for (const auto& [pid, n] : j.step_nodes) ++used[size_t(n)];
      for (int n : j.launch_nodes) ++used[size_t(n)];
    }
    for (int t : types) {
      const int n = pickNode(nodes_, used, t);
      if (n < 0) throw std::logic_error("pickNodes: slot type without a node");
      ++used[size_t(n)];
      out.push_back(n);
    }
    return out;
  }

  std::string manager_node_, manager_addr_;
  std::vector<SlurmNode> nodes_;  // typed under Slurm: the resources file's nodes
  LiveClusterOptions o_;
  std::unique_ptr<Policy> policy_;
  std::string token_;
  httplib::Server http_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool dirty_ = false;
  std::vector<LiveJob> jobs_;
  std::vector<pid_t> helpers_;  // `morph slow` processes not yet reaped
};

// --- clients ---------------------------------------------------------------

std::string clientToken(const std::string& token_file) {
  return readTokenFrom(token_file, {"missing cluster token", "", "the cluster's token is OUT/token of `morph cluster`",
                                    "pass --token-file FILE (OUT/token of `morph cluster`) or set MORPH_TOKEN"});
}

json call(const ClusterClientOptions& c, const std::string& method, const std::string& path, const json& body) {
  const size_t colon = c.cluster.rfind(':');
  int port = 0;
  try {
    if (colon != std::string::npos) port = std::stoi(c.cluster.substr(colon + 1));
  } catch (const std::exception&) {
  }
  if (colon == std::string::npos || colon == 0 || port < 1 || port > 65535)
    throw InputError("--cluster '" + c.cluster + "': expected HOST:PORT of `morph cluster` (PORT 1..65535)");
  const std::string token = clientToken(c.token_file);
  httplib::Client cli(c.cluster.substr(0, colon), port);
  cli.set_connection_timeout(5);
  cli.set_read_timeout(30);
  const httplib::Headers h{{"Authorization", "Bearer " + token}};
  auto res = method == "GET" ? cli.Get(path, h) : cli.Post(path, h, body.dump(), "application/json");
  if (!res)
    throw InputError("cannot reach the cluster at " + c.cluster + " (" + httplib::to_string(res.error()) +
                     "); is `morph cluster` running there?");
  json answer;
  try {
    answer = json::parse(res->body);
  } catch (const json::exception&) {
    throw InputError(c.cluster + " answered something that is not JSON (HTTP " + std::to_string(res->status) + ")");
  }
  if (res->status == 401)
    throw InputError("the cluster at " + c.cluster + " refused the token (wrong token; it is OUT/token of `morph cluster`)");
  if (res->status != 200) throw InputError(answer.value("error", "HTTP " + std::to_string(res->status)));
  return answer;
}

}  // namespace

namespace {

// Slot types by speed: fastest first (slowdown ascending, then the types' order).
std::vector<int> typesBySpeed(const std::vector<SlotType>& types) {
  std::vector<int> order(types.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return types[size_t(a)].slowdown < types[size_t(b)].slowdown; });
  return order;
}

// Types for `more` new slots of s within `free` (taken from it): those the
// policy asked for beyond what s holds, then any, fastest first; sorted
// fastest first. Empty when the free slots do not cover `more`.
std::vector<int> takeTypes(const SlotState& s, int more, std::vector<int>& free, const std::vector<int>& by_speed) {
  std::vector<int> left = free, out;
  for (size_t t = 0; t < left.size() && int(out.size()) < more; ++t) {
    const int have = t < s.held_types.size() ? s.held_types[t] : 0;
    const int want = t < s.desired_types.size() ? s.desired_types[t] - have : 0;
    for (int k = 0; k < want && left[t] > 0 && int(out.size()) < more; ++k, --left[t]) out.push_back(int(t));
  }
  for (int t : by_speed)
    for (; left[size_t(t)] > 0 && int(out.size()) < more; --left[size_t(t)]) out.push_back(t);
  if (int(out.size()) < more) return {};
  free = left;
  std::vector<int> rank(by_speed.size());
  for (size_t i = 0; i < by_speed.size(); ++i) rank[size_t(by_speed[i])] = int(i);
  std::stable_sort(out.begin(), out.end(), [&](int a, int b) { return rank[size_t(a)] < rank[size_t(b)]; });
  return out;
}

// Types of `fewer` slots s gives back: those it holds beyond the policy's,
// slowest first, then its slowest.
std::vector<int> releaseTypes(const SlotState& s, int fewer, const std::vector<int>& by_speed) {
  std::vector<int> have = s.held_types, out;
  for (auto t = by_speed.rbegin(); t != by_speed.rend(); ++t) {
    const size_t k = size_t(*t);
    const int keep = k < s.desired_types.size() ? s.desired_types[k] : have[k];
    for (; have[k] > keep && have[k] > 0 && int(out.size()) < fewer; --have[k]) out.push_back(*t);
  }
  for (auto t = by_speed.rbegin(); t != by_speed.rend(); ++t)
    for (size_t k = size_t(*t); have[k] > 0 && int(out.size()) < fewer; --have[k]) out.push_back(*t);
  return out;
}

}  // namespace

std::vector<SlotAction> planSlotActions(std::vector<SlotState>& jobs, int slots, const std::vector<SlotType>& types) {
  const bool typed = !types.empty();
  const std::vector<int> by_speed = typesBySpeed(types);
  std::vector<int> type_free(types.size());
  for (size_t t = 0; t < types.size(); ++t) type_free[t] = types[t].count;
  for (SlotState& s : jobs) {
    if (!typed) continue;
    s.held_types.resize(types.size(), 0);
    for (size_t t = 0; t < types.size(); ++t) type_free[t] -= s.held_types[t];
  }
  std::vector<SlotAction> out;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const SlotState& s = jobs[i];
    if (!(s.running && s.ready && s.desired > 0 && s.desired < s.target)) continue;
    if (!typed) {
      out.push_back({SlotAction::kShrink, i, s.desired, {}, {}});
    } else if (s.held == s.target) {  // not while an earlier shrink takes effect: its slots are still held
      out.push_back({SlotAction::kShrink, i, s.desired, {}, releaseTypes(s, s.target - s.desired, by_speed)});
    }
  }
  int free = slots;
  for (const SlotState& s : jobs) free -= s.held;
  std::vector<size_t> order(jobs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return jobs[a].priority != jobs[b].priority ? jobs[a].priority > jobs[b].priority : jobs[a].id < jobs[b].id;
  });
  for (size_t i : order) {
    SlotState& s = jobs[i];
    if (!s.ready) continue;
    const int more = !s.running ? s.desired : s.desired - s.held;
    const bool start = !s.running && s.desired > 0 && s.desired <= free;
    const bool grow = s.running && s.desired > s.target && more <= free;
    if (start || grow) {
      std::vector<int> picked;
      if (typed) {
        picked = takeTypes(s, more, type_free, by_speed);
        if (int(picked.size()) != more) continue;
        for (int t : picked) ++s.held_types[size_t(t)];
      }
      out.push_back({start ? SlotAction::kStart : SlotAction::kGrow, i, s.desired, picked, {}});
      free -= more;
      s.held = s.desired;
    } else if (typed && s.running && s.can_move && s.desired == s.target && s.held == s.target && free > 0 &&
               s.desired_types.size() == types.size() && s.desired_types != s.held_types) {
      // A move: onto the fastest free type it lacks, off the slowest it holds in excess.
      int to = -1, from = -1;
      for (int t : by_speed)
        if (to < 0 && s.desired_types[size_t(t)] > s.held_types[size_t(t)] && type_free[size_t(t)] > 0) to = t;
      for (int t : by_speed)
        if (s.held_types[size_t(t)] > s.desired_types[size_t(t)]) from = t;
      if (to < 0 || from < 0) continue;
      out.push_back({SlotAction::kMove, i, s.target, {to}, {from}});
      --type_free[size_t(to)];
      ++s.held_types[size_t(to)];
      --free;
      ++s.held;
    }
  }
  return out;
}

std::vector<SlurmNode> slurmNodes(const std::vector<std::pair<std::string, std::string>>& devices,
                                  const std::vector<SlotType>& types, const std::vector<std::string>& allocation,
                                  const std::string& file, const std::vector<int>& tasks) {
  std::string listed;
  for (const std::string& a : allocation) listed += (listed.empty() ? "" : ", ") + a;
  std::vector<SlurmNode> nodes;
  for (size_t d = 0; d < devices.size(); ++d) {
    const auto& [type_name, host] = devices[d];
    const std::string where = file + ": devices[" + std::to_string(d) + "] (host \"" + host + "\")";
    const auto t = std::find_if(types.begin(), types.end(), [&](const SlotType& x) { return x.name == type_name; });
    if (t == types.end()) throw InputError(where + ": type \"" + type_name + "\" is not one of the slot types");
    if (std::find(allocation.begin(), allocation.end(), host) == allocation.end())
      throw InputError(where + ": with --slurm, host must name a node of the allocation (" + listed + ")");
    const int type = int(t - types.begin());
    auto n = std::find_if(nodes.begin(), nodes.end(), [&](const SlurmNode& x) { return x.name == host; });
    if (n == nodes.end()) {
      nodes.push_back({host, type, 0});
      n = std::prev(nodes.end());
    }
    if (n->type != type)
      throw InputError(where + ": node " + host + " already has devices of type \"" + types[size_t(n->type)].name +
                       "\" (with --slurm a node's slots are all of one type)");
    ++n->slots;
  }
  for (const SlurmNode& n : nodes) {
    const size_t i = size_t(std::find(allocation.begin(), allocation.end(), n.name) - allocation.begin());
    if (i < tasks.size() && n.slots > tasks[i])
      throw InputError(file + ": node " + n.name + " has " + std::to_string(n.slots) + " devices, but the allocation " +
                       "gives it " + std::to_string(tasks[i]) + " task(s) (SLURM_TASKS_PER_NODE): one worker step " +
                       "runs per device");
  }
  return nodes;
}

std::vector<int> slurmTasksPerNode(const std::string& spec, size_t nodes) {
  static const std::regex part_re("([0-9]{1,6})(\\(x([0-9]{1,6})\\))?");
  std::vector<int> out;
  std::istringstream parts(spec);
  for (std::string part; std::getline(parts, part, ',');) {
    std::smatch m;
    if (!std::regex_match(part, m, part_re))
      throw InputError("SLURM_TASKS_PER_NODE \"" + spec + "\": expected counts like 2(x3),1");
    const int count = std::stoi(m[1]);
    const int repeat = m[3].matched ? std::stoi(m[3]) : 1;
    if (out.size() + size_t(repeat) > nodes) {
      out.clear();  // more counts than nodes
      break;
    }
    out.insert(out.end(), size_t(repeat), count);
  }
  if (out.size() != nodes)
    throw InputError("SLURM_TASKS_PER_NODE \"" + spec + "\": expected a count for each of the allocation's " +
                     std::to_string(nodes) + " nodes");
  return out;
}

int pickNode(const std::vector<SlurmNode>& nodes, const std::vector<int>& used, int type) {
  int best = -1;
  for (size_t n = 0; n < nodes.size(); ++n) {
    if (nodes[n].type != type) continue;
    const int free = nodes[n].slots - (n < used.size() ? used[n] : 0);
    if (best < 0 || free > nodes[size_t(best)].slots - (size_t(best) < used.size() ? used[size_t(best)] : 0))
      best = int(n);
  }
  return best;
}

int runCluster(const LiveClusterOptions& o) {
  if (o.slots < 1) throw InputError("--slots: expected at least 1");
  if (!o.validate) throw std::logic_error("runCluster: no job validator");
  LiveCluster c(o);  // an unknown policy is refused before anything starts
  return c.run();
}

int runSubmit(const ClusterClientOptions& c, const std::string& job_path, int priority, int demand,
              const std::vector<std::string>& overrides, const std::string& profile, const JobValidator& validate) {
  const std::string path = fs::absolute(job_path).lexically_normal().string();
  const std::string prof = profile.empty() ? "" : fs::absolute(profile).lexically_normal().string();
  validate(path, overrides, prof);  // exit 2 here, before the job is sent
  json body = {{"job", path}, {"priority", priority}, {"overrides", overrides}};
  if (!prof.empty()) body["profile"] = prof;
  if (demand > 0) body["demand"] = demand;
  const json a = call(c, "POST", "/submit", body);
  std::printf("%lld\n", static_cast<long long>(a.at("id").get<int64_t>()));
  return 0;
}

int runQueue(const ClusterClientOptions& c, bool as_json) {
  const json q = call(c, "GET", "/queue", json());
  if (as_json) {
    std::printf("%s\n", q.dump().c_str());
    return 0;
  }
  std::printf("%d slots, policy %s\n%-4s %-20s %-10s %7s %4s %6s %8s %s\n", q.at("slots").get<int>(),
              q.at("policy").get<std::string>().c_str(), "id", "name", "state", "workers", "prio", "demand", "resizes",
              "step / steps, model_hash");
  for (const json& j : q.at("jobs"))
    std::printf("%-4lld %-20s %-10s %7d %4d %6d %8d %lld / %lld %s\n", static_cast<long long>(j.at("id").get<int64_t>()),
                j.at("name").get<std::string>().c_str(), j.at("state").get<std::string>().c_str(),
                j.at("workers").get<int>(), j.at("priority").get<int>(), j.at("demand").get<int>(),
                j.at("resizes").get<int>(), static_cast<long long>(j.at("step").get<int64_t>()),
                static_cast<long long>(j.at("steps").get<int64_t>()), j.value("model_hash", "").c_str());
  return 0;
}

int runCancel(const ClusterClientOptions& c, int64_t id) {
  const json a = call(c, "POST", "/cancel", json{{"id", id}});
  std::printf("job %lld: %s\n", static_cast<long long>(id), a.value("state", "").c_str());
  return 0;
}

}  // namespace morph::sched
