// Traces and the cluster simulator (cluster_sim.h, docs/cluster.md).
#include "sched/cluster_sim.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "core/error.h"

namespace morph::sched {

using json = nlohmann::json;

namespace {

[[noreturn]] void bad(const std::string& where, const std::string& what) { throw InputError(where + ": " + what); }

int64_t integerField(const json& o, const char* key, const std::string& where, int64_t lo, int64_t hi,
                     const char* expected) {
  const auto it = o.find(key);
  if (it == o.end()) bad(where, std::string("missing \"") + key + "\" (expected " + expected + ")");
  if (!it->is_number_integer() && !(it->is_number_float() && std::floor(it->get<double>()) == it->get<double>()))
    bad(where + "." + key, std::string("expected ") + expected + ", got " + it->dump());
  const double v = it->get<double>();
  if (v < double(lo) || v > double(hi)) bad(where + "." + key, std::string("expected ") + expected + ", got " + it->dump());
  return int64_t(v);
}

double numberField(const json& o, const char* key, const std::string& where, const char* expected) {
  const auto it = o.find(key);
  if (it == o.end()) bad(where, std::string("missing \"") + key + "\" (expected " + expected + ")");
  if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() < 0)
    bad(where + "." + key, std::string("expected ") + expected + ", got " + it->dump());
  return it->get<double>();
}

}  // namespace

Trace traceFromJson(const std::string& text, const std::string& origin, const ProfileResolver& resolve,
                    const std::vector<SlotType>& types) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number beyond a double
    bad(origin, std::string("not JSON: ") + e.what());
  }
  if (!doc.is_object() || !doc.contains("jobs") || !doc["jobs"].is_array())
    bad(origin, "expected an object {\"jobs\": [...]}");
  const json& jobs = doc["jobs"];
  if (jobs.empty()) bad(origin + ": jobs", "expected at least one job");
  Trace trace;
  std::set<std::string> names;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const json& o = jobs[i];
    std::string where = origin + ": jobs[" + std::to_string(i) + "]";
    if (!o.is_object()) bad(where, "expected an object");
    TraceJob j;
    if (!o.contains("name") || !o["name"].is_string() || o["name"].get<std::string>().empty())
      bad(where, "expected \"name\": a non-empty string");
    j.name = o["name"].get<std::string>();
    where += " (" + j.name + ")";
    if (!names.insert(j.name).second) bad(where, "name \"" + j.name + "\" appears twice");
    j.arrival = numberField(o, "arrival", where, "seconds >= 0");
    j.priority = int(integerField(o, "priority", where, 1, 1000000, "an integer priority >= 1"));
    j.demand = int(integerField(o, "demand", where, 1, 1 << 20, "an integer worker count >= 1"));
    j.steps = integerField(o, "steps", where, 1, int64_t{1} << 50, "an integer step count >= 1");
    const bool has_table = o.contains("step_seconds");
    const bool has_files = o.contains("job") || o.contains("profile");
    if (has_table == has_files)
      bad(where, "expected either \"step_seconds\" (seconds per step by worker count) or \"job\" and \"profile\"");
    if (has_table) {
      const json& t = o["step_seconds"];
      if (!t.is_object() || t.empty())
        bad(where + ".step_seconds", "expected an object {\"1\": seconds, \"2\": seconds, ...}");
      std::map<int, double> table;
      for (const auto& [k, v] : t.items()) {
        size_t used = 0;
        int workers = 0;
        try {
          workers = std::stoi(k, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used != k.size() || workers < 1)
          bad(where + ".step_seconds", "key \"" + k + "\" is not a worker count >= 1");
        if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() <= 0)
          bad(where + ".step_seconds[\"" + k + "\"]", "expected seconds > 0, got " + v.dump());
        table[workers] = v.get<double>();
      }
      j.speed = Speed(table);
    } else {
      if (!o.contains("job") || !o["job"].is_string() || !o.contains("profile") || !o["profile"].is_string())
        bad(where, "expected both \"job\" (a job file) and \"profile\" (its calibration profile) as strings");
      if (!resolve) bad(where, "a job file and profile cannot be resolved here");
      const std::filesystem::path base = std::filesystem::path(origin).parent_path();
      auto rel = [&](const std::string& p) {
        const std::filesystem::path q(p);
        return (q.is_absolute() || base.empty() ? q : base / q).string();
      };
      j.speed = resolve(rel(o["job"].get<std::string>()), rel(o["profile"].get<std::string>()), j.demand, types);
    }
    trace.jobs.push_back(std::move(j));
  }
  return trace;
}

Trace readTrace(const std::string& path, const ProfileResolver& resolve, const std::vector<SlotType>& types) {
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot read the trace");
  std::stringstream ss;
  ss << in.rdbuf();
  return traceFromJson(ss.str(), path, resolve, types);
}

std::string traceToJson(const Trace& trace) {
  json jobs = json::array();
  for (const TraceJob& j : trace.jobs) {
    json table = json::object();
    for (const auto& [k, s] : j.speed.table()) table[std::to_string(k)] = s;
    jobs.push_back({{"name", j.name},
                    {"arrival", j.arrival},
                    {"priority", j.priority},
                    {"demand", j.demand},
                    {"steps", j.steps},
                    {"step_seconds", table}});
  }
  return json{{"jobs", jobs}}.dump(1) + "\n";
}

Trace generateTrace(const TraceGenOptions& o) {
  if (o.jobs < 1) throw InputError("--jobs: expected at least 1");
  if (!(o.per_hour > 0)) throw InputError("--per-hour: expected a rate > 0");
  if (o.max_demand < 1) throw InputError("--max-demand: expected at least 1");
  if (!(o.min_minutes > 0) || o.max_minutes < o.min_minutes)
    throw InputError("run times: expected 0 < min <= max minutes");
  // One engine, values drawn in a fixed order: the same seed gives the
  // same trace on every platform (the distributions are written out here,
  // not std::*_distribution, whose algorithms the standard leaves open).
  std::mt19937_64 rng(o.seed);
  auto uniform = [&] { return double(rng() >> 11) * 0x1.0p-53; };  // [0, 1)
  const int priorities[] = {1, 5, 10};
  std::vector<int> demands;
  for (int d = 1; d <= o.max_demand && d <= 8; d *= 2) demands.push_back(d);
  Trace t;
  double now = 0;
  for (int i = 0; i < o.jobs; ++i) {
    if (i > 0) now += -std::log(1 - uniform()) * 3600.0 / o.per_hour;  // exponential gaps
    TraceJob j;
    char name[32];
    std::snprintf(name, sizeof name, "job%02d", i);
    j.name = name;
    j.arrival = std::round(now * 1000) / 1000;
    j.priority = priorities[rng() % 3];
    j.demand = demands[rng() % demands.size()];
    const double t1 = 0.1 * std::pow(10.0, uniform());  // 0.1-1 s per step on one worker
    const double serial = o.max_serial * uniform();
    const double minutes = o.min_minutes * std::pow(o.max_minutes / o.min_minutes, uniform());
    std::map<int, double> table;
    for (int k = 1; k <= j.demand; ++k) table[k] = std::round(t1 * (serial + (1 - serial) / k) * 1e6) / 1e6;
    j.steps = std::max<int64_t>(1, std::llround(minutes * 60 / table[j.demand]));
    j.speed = Speed(table);
    t.jobs.push_back(std::move(j));
  }
  return t;
}

ClusterSimResult simulateCluster(const Trace& trace, const Policy& policy, const SimConfig& cfg) {
  if (cfg.slots < 1) throw InputError("--slots: expected at least 1");
  ClusterView shape;  // the slots and their types
  shape.slots = cfg.slots;
  shape.types = cfg.types;
  const std::vector<SlotType> types = shape.slotTypes();
  const size_t nt = types.size();
  {
    int sum = 0;
    for (const SlotType& t : types) sum += t.count;
    if (sum != cfg.slots)
      throw InputError("slot types: their counts sum to " + std::to_string(sum) + ", not the " +
                       std::to_string(cfg.slots) + " slots");
  }
  const size_t n = trace.jobs.size();
  for (size_t i = 0; i < n; ++i)
    if (trace.jobs[i].demand > cfg.slots)
      throw InputError("jobs[" + std::to_string(i) + "] (" + trace.jobs[i].name + "): demand " +
                       std::to_string(trace.jobs[i].demand) + " is above the " + std::to_string(cfg.slots) +
                       " slots");
  struct Live {
    double remaining = 0;
    int workers = 0;
    std::vector<int> held;  // slots per type, summing to workers
    double paused_until = -1;
    bool arrived = false, started = false, done = false;
  };
  std::vector<Live> live(n);
  std::vector<size_t> by_arrival(n);
  for (size_t i = 0; i < n; ++i) {
    by_arrival[i] = i;
    live[i].remaining = double(trace.jobs[i].steps);
    live[i].held.assign(nt, 0);
  }
  std::stable_sort(by_arrival.begin(), by_arrival.end(),
                   [&](size_t a, size_t b) { return trace.jobs[a].arrival < trace.jobs[b].arrival; });

  ClusterSimResult r;
  r.policy = policy.name();
  r.slots = cfg.slots;
  r.jobs.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const TraceJob& j = trace.jobs[i];
    r.jobs[i].name = j.name;
    r.jobs[i].priority = j.priority;
    r.jobs[i].demand = j.demand;
    r.jobs[i].arrival = j.arrival;
  }
  const double inf = std::numeric_limits<double>::infinity();
  auto rate = [&](size_t i) { return trace.jobs[i].speed.stepsPerSecond(live[i].held, types); };
  auto finishAt = [&](size_t i, double now) {
    const double rt = rate(i);
    return rt > 0 ? std::max(now, live[i].paused_until) + live[i].remaining / rt : inf;
  };

  const double t0 = n ? trace.jobs[by_arrival[0]].arrival : 0;
  double now = t0, slot_seconds = 0, decision_sum = 0;
  size_t next_arrival = 0, finished = 0;
  std::vector<std::vector<int>> last_row(n, std::vector<int>(nt, 0));
  while (finished < n) {
    // The next event: an arrival or the first completion.
    double t_next = next_arrival < n ? trace.jobs[by_arrival[next_arrival]].arrival : inf;
    size_t first_done = n;
    for (size_t i = 0; i < n; ++i)
      if (live[i].workers > 0) {
        const double f = finishAt(i, now);
        if (f < t_next) t_next = f, first_done = i;
      }
    MORPH_CHECK(std::isfinite(t_next), "cluster simulation: jobs wait but nothing runs or arrives");
    // Progress up to t_next.
    for (size_t i = 0; i < n; ++i)
      if (live[i].workers > 0) {
        slot_seconds += live[i].workers * (t_next - now);
        const double ran = t_next - std::max(now, live[i].paused_until);
        if (ran > 0) live[i].remaining -= rate(i) * ran;
      }
    now = t_next;
    if (first_done < n) live[first_done].remaining = 0;
    for (size_t i = 0; i < n; ++i)
      if (live[i].workers > 0 && live[i].remaining <= 1e-9 * double(trace.jobs[i].steps)) {
        live[i].done = true;
        live[i].workers = 0;
        live[i].held.assign(nt, 0);
        r.jobs[i].end = now;
        ++finished;
      }
    while (next_arrival < n && trace.jobs[by_arrival[next_arrival]].arrival <= now)
      live[by_arrival[next_arrival++]].arrived = true;

    // Decide.
    ClusterView view;
    view.now = now;
    view.slots = cfg.slots;
    view.types = cfg.types;
    std::vector<size_t> ids;
    for (size_t i = 0; i < n; ++i)
      if (live[i].arrived && !live[i].done) {
        JobState s;
        s.id = int64_t(i);
        s.priority = trace.jobs[i].priority;
        s.demand = trace.jobs[i].demand;
        s.arrival = trace.jobs[i].arrival;
        s.remaining_steps = std::max(live[i].remaining, 1e-9);
        s.allocated = live[i].workers;
        if (!cfg.types.empty()) s.held = live[i].held;
        s.speed = &trace.jobs[i].speed;
        view.jobs.push_back(s);
        ids.push_back(i);
      }
    if (!ids.empty()) {
      const auto c0 = std::chrono::steady_clock::now();
      const TypedTargets target = policy.allocateTyped(view);
      const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
      ++r.decisions;
      decision_sum += took;
      r.decision_max_s = std::max(r.decision_max_s, took);
      MORPH_CHECK_EQ(target.size(), ids.size());
      int sum = 0;
      std::vector<int> by_type(nt, 0);
      for (size_t k = 0; k < ids.size(); ++k) {
        const size_t i = ids[k];
        MORPH_CHECK_EQ(target[k].size(), nt);
        int to = 0;
        for (size_t t = 0; t < nt; ++t) {
          MORPH_CHECK(target[k][t] >= 0, std::string(policy.name()) + ": a negative target");
          to += target[k][t];
          by_type[t] += target[k][t];
        }
        MORPH_CHECK(to >= 0 && to <= trace.jobs[i].demand, std::string(policy.name()) + ": target outside [0, demand]");
        MORPH_CHECK(!(live[i].workers > 0 && to == 0), std::string(policy.name()) + ": suspended a running job");
        sum += to;
        if (target[k] == live[i].held) continue;
        if (live[i].workers > 0) {
          // A resize: no progress while the job regroups (a pause still
          // running from an earlier resize starts again; a longer start-up
          // pause is kept).
          live[i].paused_until = std::max(live[i].paused_until, now + cfg.policy.resize_seconds);
          ++r.jobs[i].resizes;
          ++r.resizes;
        } else if (!live[i].started) {
          live[i].started = true;
          r.jobs[i].start = now;
          live[i].paused_until = now + cfg.start_seconds;
        }
        live[i].workers = to;
        live[i].held = target[k];
        r.jobs[i].max_workers = std::max(r.jobs[i].max_workers, to);
      }
      MORPH_CHECK_LE(sum, cfg.slots);
      for (size_t t = 0; t < nt; ++t) MORPH_CHECK_LE(by_type[t], types[t].count);
    }
    std::vector<int> row(n, 0);
    std::vector<std::vector<int>> row_types(n);
    for (size_t i = 0; i < n; ++i) row[i] = live[i].workers, row_types[i] = live[i].held;
    if (row_types != last_row) {
      r.rows.push_back({now, row, cfg.types.empty() ? std::vector<std::vector<int>>{} : row_types});
      last_row = row_types;
    }
  }
  r.makespan_s = now - t0;
  std::vector<double> jct;
  double queue_sum = 0;
  for (const JobOutcome& j : r.jobs) {
    jct.push_back(j.jct());
    queue_sum += j.queued();
  }
  std::sort(jct.begin(), jct.end());
  if (n) {
    double s = 0;
    for (double x : jct) s += x;
    r.mean_jct_s = s / double(n);
    r.median_jct_s = n % 2 ? jct[n / 2] : (jct[n / 2 - 1] + jct[n / 2]) / 2;
    r.mean_queue_s = queue_sum / double(n);
  }
  r.utilisation = r.makespan_s > 0 ? slot_seconds / (cfg.slots * r.makespan_s) : 0;
  r.decision_mean_s = r.decisions ? decision_sum / double(r.decisions) : 0;
  return r;
}

}  // namespace morph::sched
