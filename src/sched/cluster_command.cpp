// `morph cluster simulate` and `morph cluster generate` (cluster_command.h).
#include "sched/cluster_command.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace morph::sched {

using json = nlohmann::json;

int runClusterSimulate(const ClusterSimulateOptions& o) {
  PolicyOptions po;
  po.resize_seconds = o.resize_seconds;
  const auto policy = makePolicy(o.policy, po);  // before reading: a wrong name is cheap to report
  int slots = o.slots;
  if (!o.types.empty()) {
    int devices = 0;
    for (const SlotType& t : o.types) devices += t.count;
    if (slots == 0) slots = devices;
    if (slots != devices)
      throw InputError("--resources " + o.resources + ": lists " + std::to_string(devices) + " devices, but --slots is " +
                       std::to_string(slots) + " (one slot per device)");
  }
  if (slots < 1) throw InputError("morph cluster simulate needs --slots N or --resources FILE");
  const Trace trace = readTrace(o.trace, o.resolve, o.types);
  SimConfig cfg;
  cfg.slots = slots;
  cfg.types = o.types;
  cfg.policy = po;
  cfg.start_seconds = o.start_seconds;
  const ClusterSimResult r = simulateCluster(trace, *policy, cfg);
  if (o.json) {
    json jobs = json::array();
    for (const JobOutcome& j : r.jobs)
      jobs.push_back({{"name", j.name}, {"priority", j.priority}, {"demand", j.demand}, {"arrival", j.arrival},
                      {"start", j.start}, {"end", j.end}, {"jct_seconds", j.jct()},
                      {"queue_seconds", j.queued()}, {"resizes", j.resizes}, {"max_workers", j.max_workers}});
    json rows = json::array();
    for (const AllocationRow& a : r.rows) {
      json row = {{"time", a.time}, {"workers", a.workers}};
      if (!a.by_type.empty()) row["by_type"] = a.by_type;
      rows.push_back(row);
    }
    json doc = {{"policy", r.policy},
                {"slots", r.slots},
                {"jobs_count", r.jobs.size()},
                {"makespan_seconds", r.makespan_s},
                {"mean_jct_seconds", r.mean_jct_s},
                {"median_jct_seconds", r.median_jct_s},
                {"mean_queue_seconds", r.mean_queue_s},
                {"utilisation", r.utilisation},
                {"resizes", r.resizes},
                {"decisions", r.decisions},
                {"decision_mean_ms", r.decision_mean_s * 1e3},
                {"decision_max_ms", r.decision_max_s * 1e3},
                {"resize_seconds", o.resize_seconds},
                {"start_seconds", o.start_seconds},
                {"jobs", jobs},
                {"allocations", rows}};
    if (!o.types.empty()) {
      json types = json::array();
      for (const SlotType& t : o.types)
        types.push_back({{"name", t.name}, {"slowdown", t.slowdown}, {"count", t.count}});
      doc["types"] = types;
    }
    std::printf("%s\n", doc.dump().c_str());
    return 0;
  }
  std::printf("policy %s, %d slots, %zu jobs, resize cost %.3g s\n", r.policy.c_str(), r.slots, r.jobs.size(),
              o.resize_seconds);
  std::string type_names;
  for (const SlotType& t : o.types)
    type_names += (type_names.empty() ? "" : "+") + t.name;
  if (!o.types.empty()) {
    std::printf("slot types        ");
    for (const SlotType& t : o.types) std::printf(" %s x%d (slowdown %g)", t.name.c_str(), t.count, t.slowdown);
    std::printf("\n");
  }
  std::printf("makespan_seconds   %.1f\n", r.makespan_s);
  std::printf("mean_jct_seconds   %.1f\n", r.mean_jct_s);
  std::printf("median_jct_seconds %.1f\n", r.median_jct_s);
  std::printf("mean_queue_seconds %.1f\n", r.mean_queue_s);
  std::printf("utilisation        %.4f\n", r.utilisation);
  std::printf("resizes            %lld\n", static_cast<long long>(r.resizes));
  std::printf("decisions          %lld (mean %.3f ms, max %.3f ms)\n", static_cast<long long>(r.decisions),
              r.decision_mean_s * 1e3, r.decision_max_s * 1e3);
  std::printf("\n%-4s %-16s %4s %6s %10s %10s %10s %10s %7s %5s\n", "#", "job", "prio", "demand", "arrival",
              "start", "end", "jct", "resizes", "max");
  for (size_t i = 0; i < r.jobs.size(); ++i) {
    const JobOutcome& j = r.jobs[i];
    std::printf("%-4zu %-16s %4d %6d %10.1f %10.1f %10.1f %10.1f %7d %5d\n", i, j.name.c_str(), j.priority, j.demand,
                j.arrival, j.start, j.end, j.jct(), j.resizes, j.max_workers);
  }
  // Allocation table: one row per decision that changed something, one
  // column per job (by #; '.' = no slots).
  // With slot types a cell is the slots per type, joined by '+' (type order).
  const int width = o.types.empty() ? 3 : int(2 * o.types.size());  // typed: one space before each cell
  auto cellOut = [&](const std::string& cell) {
    o.types.empty() ? std::printf("%3s", cell.c_str()) : std::printf(" %*s", width - 1, cell.c_str());
  };
  std::printf("\nallocations (slots per job # after each change%s; '.' none)\n%10s %5s ",
              o.types.empty() ? "" : (", as " + type_names).c_str(), "time", "used");
  for (size_t i = 0; i < r.jobs.size(); ++i) cellOut(std::to_string(i));
  std::printf("\n");
  size_t shown = 0;
  for (const AllocationRow& a : r.rows) {
    if (int(shown) == o.table_rows) break;
    ++shown;
    int used = 0;
    for (int w : a.workers) used += w;
    std::printf("%10.1f %5d ", a.time, used);
    for (size_t i = 0; i < a.workers.size(); ++i) {
      std::string cell = ".";
      if (a.workers[i] > 0 && a.by_type.empty()) cell = std::to_string(a.workers[i]);
      if (a.workers[i] > 0 && !a.by_type.empty()) {
        cell.clear();
        for (int c : a.by_type[i]) cell += (cell.empty() ? "" : "+") + std::to_string(c);
      }
      cellOut(cell);
    }
    std::printf("\n");
  }
  if (shown < r.rows.size())
    std::printf("... %zu more rows (--table-rows N, or --json for all)\n", r.rows.size() - shown);
  return 0;
}

int runClusterGenerate(const ClusterGenerateOptions& o) {
  const std::string text = traceToJson(generateTrace(o.gen));
  if (o.out.empty()) {
    std::fputs(text.c_str(), stdout);
    return 0;
  }
  const std::string tmp = o.out + ".tmp";
  {
    std::ofstream f(tmp);
    if (!(f << text)) throw InputError(o.out + ": cannot write the trace");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, o.out, ec);
  if (ec) throw InputError(o.out + ": cannot write the trace: " + ec.message());
  std::printf("wrote %s (%d jobs, %.3g per hour, seed %llu)\n", o.out.c_str(), o.gen.jobs, o.gen.per_hour,
              static_cast<unsigned long long>(o.gen.seed));
  return 0;
}

}  // namespace morph::sched
