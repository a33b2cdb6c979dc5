#include "plan/profile.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <torch/version.h>

#include "core/error.h"
#include "core/parse_number.h"
#include "core/job_spec.h"
#include "core/sys.h"

namespace morph {

using json = nlohmann::json;

LinearFit fitLine(std::vector<std::pair<double, double>> samples) {
  // Least squares on the relative error (weights 1/y^2): a 64-byte
  // all-reduce matters as much as a 25 MB one, so neither end may be off by
  // a factor for the other's sake.
  LinearFit f;
  f.samples = samples;
  if (samples.empty()) return f;
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (auto [x, y] : samples) {
    const double w = y > 0 ? 1.0 / (y * y) : 1.0;
    sw += w, sx += w * x, sy += w * y, sxx += w * x * x, sxy += w * x * y;
  }
  const double den = sw * sxx - sx * sx;
  double b = den > 0 ? (sw * sxy - sx * sy) / den : 0.0;
  if (b < 0) b = 0;  // noise on a flat curve: time does not fall with size
  double a = (sy - b * sx) / sw;
  if (a < 0) {  // a negative intercept: refit through the origin
    a = 0;
    b = sxx > 0 ? std::max(0.0, sxy / sxx) : 0.0;
  }
  f.latency_s = a;
  f.seconds_per_byte = b;
  return f;
}

double Profile::allreduceSeconds(const std::map<int, LinearFit>& fits, double bytes, int group) const {
  if (group <= 1 || fits.empty()) return 0.0;
  if (auto it = fits.find(group); it != fits.end()) return it->second.at(bytes);
  // Ring all-reduce: 2(g-1) steps each paying a latency, and every rank
  // sends and receives 2(g-1)/g of the buffer. Fitted on the smallest group
  // measured (g0): latency per step a0 / (2(g0-1)), bandwidth term
  // b0 / (2(g0-1)/g0).
  const auto& [g0, f] = *fits.begin();
  const double g = group, h = g0;
  const double step_latency = f.latency_s / (2.0 * (h - 1.0));
  const double per_byte = f.seconds_per_byte / (2.0 * (h - 1.0) / h);
  return 2.0 * (g - 1.0) * step_latency + 2.0 * (g - 1.0) / g * bytes * per_byte;
}

double HostContention::factor(int processes) const {
  if (processes <= 1 || factors.empty()) return 1.0;
  auto it = factors.upper_bound(processes);  // the first count above
  if (it == factors.begin()) return 1.0;
  return std::prev(it)->second;
}

double HostContention::busyFactor(int processes) const {
  const double f = factor(processes);
  if (processes <= 1 || busy_factors.empty()) return f;
  auto it = busy_factors.upper_bound(processes);
  if (it == busy_factors.begin()) return f;
  return std::max(f, std::prev(it)->second);
}

double Profile::dataParallelFactor(int on_host, int in_plan) const {
  if (host_contention.measured()) return host_contention.busyFactor(on_host);
  return computeFactor(on_host, in_plan);
}

double Profile::computeFactor(int on_host, int in_plan) const {
  if (host_contention.measured()) return host_contention.factor(on_host);
  return in_plan < 2 ? 1.0 : compute_contention;
}

int64_t Profile::totalParams() const {
  int64_t n = 0;
  for (const LayerCost& l : layers) n += l.params;
  return n;
}

namespace {

std::string readLine(const std::string& path, const std::string& prefix) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(prefix, 0) == 0) {
      const size_t colon = line.find(':');
      std::string v = colon == std::string::npos ? line : line.substr(colon + 1);
      const size_t b = v.find_first_not_of(" \t");
      return b == std::string::npos ? "" : v.substr(b);
    }
  return "";
}

std::string modelText(const ModelSpec& m) {
  std::ostringstream os;
  os << m.name;
  auto list = [&](const char* k, const std::vector<int64_t>& v) {
    if (v.empty()) return;
    os << ' ' << k << '=';
    for (size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
  };
  list("hidden", m.hidden);
  list("channels", m.channels);
  if (m.fc) os << " fc=" << m.fc;
  if (m.layers) os << " layers=" << m.layers << " dim=" << m.dim << " heads=" << m.heads;
  if (m.seq_len) os << " seq_len=" << m.seq_len;
  if (m.input != std::vector<int64_t>{1, 28, 28}) list("input", m.input);
  if (m.classes != 10) os << " classes=" << m.classes;
  os << " dropout=" << m.dropout;
  return os.str();
}

json fitJson(const LinearFit& f) {
  json s = json::array();
  for (auto [x, y] : f.samples) s.push_back({x, y});
  return {{"latency_s", f.latency_s}, {"seconds_per_byte", f.seconds_per_byte}, {"samples", s}};
}

json fitsJson(const std::map<int, LinearFit>& m) {
  json o = json::object();
  for (const auto& [g, f] : m) o[std::to_string(g)] = fitJson(f);
  return o;
}

// Typed access that names the file and the key path on every failure.
class Reader {
 public:
  explicit Reader(std::string origin) : origin_(std::move(origin)) {}
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw InputError(origin_ + ": key '" + key + "': " + what);
  }
  const json& at(const json& o, const std::string& k, const std::string& path) const {
    if (!o.is_object() || !o.contains(k)) fail(path + k, "missing");
    return o.at(k);
  }
  double num(const json& o, const std::string& k, const std::string& path) const {
    const json& v = at(o, k, path);
    if (!v.is_number()) fail(path + k, "expected a number");
    const double d = v.get<double>();
    if (!std::isfinite(d) || d < 0) fail(path + k, "expected a finite number >= 0");
    return d;
  }
  int64_t integer(const json& o, const std::string& k, const std::string& path) const {
    const json& v = at(o, k, path);
    if (!v.is_number_integer()) fail(path + k, "expected an integer");
    return v.get<int64_t>();
  }
  std::string str(const json& o, const std::string& k, const std::string& path) const {
    const json& v = at(o, k, path);
    if (!v.is_string()) fail(path + k, "expected a string");
    return v.get<std::string>();
  }
  LinearFit fit(const json& o, const std::string& path) const {
    LinearFit f;
    f.latency_s = num(o, "latency_s", path);
    f.seconds_per_byte = num(o, "seconds_per_byte", path);
    const json& s = at(o, "samples", path);
    if (!s.is_array()) fail(path + "samples", "expected a list of [bytes, seconds]");
    for (const json& p : s) {
      if (!p.is_array() || p.size() != 2 || !p[0].is_number() || !p[1].is_number())
        fail(path + "samples", "expected a list of [bytes, seconds]");
      f.samples.push_back({p[0].get<double>(), p[1].get<double>()});
    }
    return f;
  }
  std::map<int, LinearFit> fits(const json& o, const std::string& k, const std::string& path) const {
    const json& m = at(o, k, path);
    if (!m.is_object() || m.empty()) fail(path + k, "expected an object of group size -> fit");
    std::map<int, LinearFit> out;
    for (auto it = m.begin(); it != m.end(); ++it) {
      const auto parsed = parseInt64(it.key());
      if (!parsed) fail(path + k + "." + it.key(), "expected a group size");
      if (*parsed < 2 || *parsed > (1 << 20)) fail(path + k + "." + it.key(), "expected a group size in [2, 1048576]");
      const int g = static_cast<int>(*parsed);
      out[g] = fit(it.value(), path + k + "." + it.key() + ".");
    }
    return out;
  }

 private:
  std::string origin_;
};

}  // namespace

Fingerprint jobFingerprint(const JobSpec& job, const std::vector<std::string>& layer_names) {
  Fingerprint f;
  f.model = modelText(job.model);
  f.layers = layer_names;
  f.dataset = job.data.dataset + (job.data.seq_len ? " seq_len=" + std::to_string(job.data.seq_len) : "");
  f.vn_size = job.vnSize();
  // The 32-bit exact format costs another wire (Profile::reduceSeconds).
  f.reduce_mode = job.reduce_mode == ReduceMode::kExact && job.reduce_bits == 32 ? "exact32"
                                                                                   : toString(job.reduce_mode);
  f.optimizer = job.optim.name == "adamw" ? "adamw" : job.optim.momentum > 0 ? "sgd-momentum" : "sgd";
  f.threads = job.threads;
  f.cpu = readLine("/proc/cpuinfo", "model name");
  if (f.cpu.empty()) f.cpu = "unknown";
  f.blas = checkBlas(false);
  f.torch = TORCH_VERSION;
  return f;
}

std::vector<std::string> fingerprintDifferences(const Fingerprint& p, const Fingerprint& j) {
  std::vector<std::string> d;
  auto cmp = [&](const char* key, const std::string& a, const std::string& b) {
    if (a != b) d.push_back(std::string(key) + ": profile '" + a + "', job '" + b + "'");
  };
  cmp("model", p.model, j.model);
  cmp("dataset", p.dataset, j.dataset);
  if (p.vn_size != j.vn_size)
    d.push_back("vn_size: profile " + std::to_string(p.vn_size) + ", job " + std::to_string(j.vn_size));
  cmp("reduce_mode", p.reduce_mode, j.reduce_mode);
  cmp("optimizer", p.optimizer, j.optimizer);
  if (p.threads != j.threads)
    d.push_back("threads: profile " + std::to_string(p.threads) + ", job " + std::to_string(j.threads));
  if (p.layers != j.layers) {
    auto join = [](const std::vector<std::string>& v) {
      std::string s;
      for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
      return s;
    };
    cmp("layers", join(p.layers), join(j.layers));
  }
  cmp("host.cpu", p.cpu, j.cpu);
  cmp("host.blas", p.blas, j.blas);
  cmp("host.torch", p.torch, j.torch);
  return d;
}

namespace {
json fingerprintJson(const Fingerprint& f) {
  return {{"model", f.model},
          {"layers", f.layers},
          {"dataset", f.dataset},
          {"vn_size", f.vn_size},
          {"reduce_mode", f.reduce_mode},
          {"optimizer", f.optimizer},
          {"threads", f.threads},
          {"host", {{"cpu", f.cpu}, {"blas", f.blas}, {"torch", f.torch}}}};
}
}  // namespace

std::string fingerprintDigest(const Fingerprint& f) {
  // FNV-1a over the canonical JSON text: a file name, not a security check.
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : fingerprintJson(f).dump()) h = (h ^ c) * 1099511628211ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string profileToJson(const Profile& p) {
  json layers = json::array();
  for (const LayerCost& l : p.layers)
    layers.push_back({{"name", l.name},
                      {"forward_s", l.forward_s},
                      {"forward_nograd_s", l.forward_nograd_s},
                      {"backward_s", l.backward_s},
                      {"recompute_s", l.recompute_s},
                      {"output_bytes", l.output_bytes},
                      {"params", l.params},
                      {"param_bytes", l.param_bytes},
                      {"buffer_bytes", l.buffer_bytes},
                      {"optimizer_bytes", l.optimizer_bytes},
                      {"activation_bytes", l.activation_bytes},
                      {"tied_params", l.tied_params},
                      {"tied_owner", l.tied_owner},
                      {"bn_values", l.bn_values}});
  json j = {{"format", "morph-profile"},
            {"version", Profile::kVersion},
            {"fingerprint", fingerprintJson(p.fingerprint)},
            {"created_unix", p.created_unix},
            {"calibration_seconds", p.calibration_seconds},
            {"runtime_bytes", p.runtime_bytes},
            {"input_bytes", p.input_bytes},
            {"layers", layers},
            {"p2p", fitJson(p.p2p)},
            {"allreduce",
             {{"exact", fitsJson(p.allreduce_exact)},
              {"float", fitsJson(p.allreduce_float)},
              {"max", fitsJson(p.allreduce_max)}}},
            {"optimizer_s_per_param", p.optimizer_s_per_param},
            {"quantize_s_per_value", p.quantize_s_per_value},
            {"step_overhead_s", p.step_overhead_s},
            {"compute_contention", p.compute_contention},
            {"host_cores", p.host_cores}};
  if (p.host_contention.measured()) {
    json factors = json::object();
    for (const auto& [n, f] : p.host_contention.factors) factors[std::to_string(n)] = f;
    j["host_contention"] = {{"factors", factors},
                            {"pipeline_step_s", p.host_contention.pipeline_step_s},
                            {"measured_on", p.host_contention.measured_on}};
    if (!p.host_contention.busy_factors.empty()) {
      json busy = json::object();
      for (const auto& [n, f] : p.host_contention.busy_factors) busy[std::to_string(n)] = f;
      j["host_contention"]["busy_factors"] = busy;
    }
  }
  return j.dump(2) + "\n";
}

Profile profileFromJson(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    throw InputError(origin + ": not a profile (not JSON: " + e.what() + ")");
  }
  Reader r(origin);
  if (!j.is_object()) throw InputError(origin + ": not a profile (expected a JSON object)");
  if (r.str(j, "format", "") != "morph-profile")
    r.fail("format", "expected \"morph-profile\" (is this a profile written by morph calibrate?)");
  const int64_t version = r.integer(j, "version", "");
  if (version != Profile::kVersion)
    r.fail("version", "profile version " + std::to_string(version) + ", this morph reads version " +
                          std::to_string(Profile::kVersion) + " (calibrate again)");
  Profile p;
  const json& f = r.at(j, "fingerprint", "");
  p.fingerprint.model = r.str(f, "model", "fingerprint.");
  p.fingerprint.dataset = r.str(f, "dataset", "fingerprint.");
  p.fingerprint.vn_size = r.integer(f, "vn_size", "fingerprint.");
  p.fingerprint.reduce_mode = r.str(f, "reduce_mode", "fingerprint.");
  p.fingerprint.optimizer = r.str(f, "optimizer", "fingerprint.");
  p.fingerprint.threads = static_cast<int>(r.integer(f, "threads", "fingerprint."));
  const json& names = r.at(f, "layers", "fingerprint.");
  if (!names.is_array()) r.fail("fingerprint.layers", "expected a list of layer names");
  for (const json& n : names) {
    if (!n.is_string()) r.fail("fingerprint.layers", "expected a list of layer names");
    p.fingerprint.layers.push_back(n.get<std::string>());
  }
  const json& host = r.at(f, "host", "fingerprint.");
  p.fingerprint.cpu = r.str(host, "cpu", "fingerprint.host.");
  p.fingerprint.blas = r.str(host, "blas", "fingerprint.host.");
  p.fingerprint.torch = r.str(host, "torch", "fingerprint.host.");
  p.created_unix = r.num(j, "created_unix", "");
  p.calibration_seconds = r.num(j, "calibration_seconds", "");
  p.runtime_bytes = r.integer(j, "runtime_bytes", "");
  p.input_bytes = r.integer(j, "input_bytes", "");
  const json& layers = r.at(j, "layers", "");
  if (!layers.is_array() || layers.empty()) r.fail("layers", "expected a non-empty list of layers");
  if (layers.size() != p.fingerprint.layers.size())
    r.fail("layers", std::to_string(layers.size()) + " layers, the fingerprint names " +
                         std::to_string(p.fingerprint.layers.size()));
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string path = "layers[" + std::to_string(i) + "].";
    const json& l = layers[i];
    LayerCost c;
    c.name = r.str(l, "name", path);
    if (c.name != p.fingerprint.layers[i])
      r.fail(path + "name", "'" + c.name + "', the fingerprint says '" + p.fingerprint.layers[i] + "'");
    c.forward_s = r.num(l, "forward_s", path);
    c.forward_nograd_s = r.num(l, "forward_nograd_s", path);
    c.backward_s = r.num(l, "backward_s", path);
    c.recompute_s = r.num(l, "recompute_s", path);
    c.output_bytes = r.integer(l, "output_bytes", path);
    c.params = r.integer(l, "params", path);
    c.param_bytes = r.integer(l, "param_bytes", path);
    c.buffer_bytes = r.integer(l, "buffer_bytes", path);
    c.optimizer_bytes = r.integer(l, "optimizer_bytes", path);
    c.activation_bytes = r.integer(l, "activation_bytes", path);
    c.tied_params = r.integer(l, "tied_params", path);
    c.tied_owner = static_cast<int>(r.integer(l, "tied_owner", path));
    c.bn_values = r.integer(l, "bn_values", path);
    for (int64_t v : {c.output_bytes, c.params, c.param_bytes, c.buffer_bytes, c.optimizer_bytes,
                      c.activation_bytes, c.tied_params, c.bn_values})
      if (v < 0) r.fail(path.substr(0, path.size() - 1), "sizes must be >= 0");
    if (c.tied_owner < -1 || c.tied_owner >= static_cast<int>(layers.size()) ||
        (c.tied_params > 0) != (c.tied_owner >= 0) || c.tied_owner == static_cast<int>(i))
      r.fail(path + "tied_owner", "expected -1 or another layer's index (with tied_params > 0)");
    p.layers.push_back(c);
  }
  p.p2p = r.fit(r.at(j, "p2p", ""), "p2p.");
  const json& ar = r.at(j, "allreduce", "");
  p.allreduce_exact = r.fits(ar, "exact", "allreduce.");
  p.allreduce_float = r.fits(ar, "float", "allreduce.");
  p.allreduce_max = r.fits(ar, "max", "allreduce.");
  p.optimizer_s_per_param = r.num(j, "optimizer_s_per_param", "");
  p.quantize_s_per_value = r.num(j, "quantize_s_per_value", "");
  p.step_overhead_s = r.num(j, "step_overhead_s", "");
  p.compute_contention = r.num(j, "compute_contention", "");
  if (p.compute_contention < 1.0) r.fail("compute_contention", "expected a factor >= 1");
  p.host_cores = static_cast<int>(r.integer(j, "host_cores", ""));
  if (p.host_cores < 1) r.fail("host_cores", "expected >= 1");
  // Optional (profiles written before it keep the older model).
  if (j.contains("host_contention")) {
    const json& h = j.at("host_contention");
    // host_contention.NAME: worker processes (at least `min_count`) -> factor >= 1.
    auto factorsOf = [&](const json& table, const std::string& name, int64_t min_count) {
      const std::string where = "host_contention." + name;
      if (!table.is_object()) r.fail(where, "expected an object of worker processes -> factor");
      std::map<int, double> out;
      for (auto it = table.begin(); it != table.end(); ++it) {
        const std::string key = where + "." + it.key();
        const auto n = parseInt64(it.key());
        if (!n || *n < min_count || *n > (1 << 20))
          r.fail(key, "expected a count of processes in [" + std::to_string(min_count) + ", 1048576]");
        const double f = r.num(table, it.key(), where + ".");
        if (f < 1.0) r.fail(key, "expected a factor >= 1");
        if (*n == 1 && f != 1.0) r.fail(key, "one process is the reference: expected 1");
        out[static_cast<int>(*n)] = f;
      }
      return out;
    };
    const json& factors = r.at(h, "factors", "host_contention.");
    if (factors.is_object() && factors.empty())
      r.fail("host_contention.factors", "expected an object of worker processes -> factor");
    p.host_contention.factors = factorsOf(factors, "factors", 1);
    if (h.contains("busy_factors"))  // optional: profiles written before it have none
      p.host_contention.busy_factors = factorsOf(h.at("busy_factors"), "busy_factors", 2);
    p.host_contention.pipeline_step_s = r.num(h, "pipeline_step_s", "host_contention.");
    p.host_contention.measured_on = r.str(h, "measured_on", "host_contention.");
  }
  return p;
}

Profile readProfile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot read the profile");
  std::stringstream ss;
  ss << in.rdbuf();
  return profileFromJson(ss.str(), path);
}

void writeProfile(const Profile& p, const std::string& path) {
  const std::filesystem::path target(path);
  if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path());
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << profileToJson(p);
    out.flush();
    if (!out) throw InputError(path + ": cannot write the profile");
  }
  std::filesystem::rename(tmp, target);
}

void checkProfileMatches(const Profile& p, const Fingerprint& job, const std::string& origin) {
  const auto diff = fingerprintDifferences(p.fingerprint, job);
  if (diff.empty()) return;
  std::string msg = origin + ": profile made for a different job or machine (";
  for (size_t i = 0; i < diff.size(); ++i) msg += (i ? "; " : "") + diff[i];
  throw InputError(msg + "); calibrate again: morph calibrate JOB.toml --out " + origin);
}

DeviceCosts deviceCostsOf(const Profile& p, const std::string& origin) {
  DeviceCosts d;
  d.origin = origin;
  d.optimizer_s_per_param = p.optimizer_s_per_param;
  for (const LayerCost& c : p.layers) d.layers.push_back({c.forward_s, c.forward_nograd_s, c.backward_s, c.recompute_s});
  return d;
}

}  // namespace morph
