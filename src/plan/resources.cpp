#include "plan/resources.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <toml++/toml.h>

#include "core/error.h"
#include "plan/profile.h"

namespace morph {

namespace {

[[noreturn]] void fail(const std::string& origin, const std::string& key, const std::string& what) {
  throw InputError(origin + ": key '" + key + "': " + what);
}

void onlyKeys(const toml::table& t, const std::set<std::string>& allowed, const std::string& origin,
              const std::string& prefix) {
  for (const auto& [k, v] : t)
    if (!allowed.count(std::string(k.str())))
      fail(origin, prefix + std::string(k.str()), "unknown key (expected one of the documented keys, docs/resources.md)");
}

}  // namespace

Resources parseResources(const std::string& text, const std::string& origin) {
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << origin << ":" << e.source().begin.line << ": not TOML: " << e.description();
    throw InputError(os.str());
  }
  Resources r;
  r.file = origin;
  onlyKeys(root, {"types", "devices", "network", "hosts"}, origin, "");
  if (const toml::node* hosts = root.get("hosts")) {
    const toml::table* t = hosts->as_table();
    if (!t) fail(origin, "hosts", "expected a table");
    onlyKeys(*t, {"one_machine"}, origin, "hosts.");
    if (const toml::node* one = t->get("one_machine")) {
      if (!one->is_boolean()) fail(origin, "hosts.one_machine", "expected true or false");
      r.one_machine = one->as_boolean()->get();
    }
  }
  if (const toml::node* net = root.get("network")) {
    const toml::table* t = net->as_table();
    if (!t) fail(origin, "network", "expected a table");
    onlyKeys(*t, {"between_hosts_gbps", "between_hosts_latency_us"}, origin, "network.");
    auto number = [&](const char* key, double lo, double hi) {
      const toml::node* n = t->get(key);
      if (!n) return 0.0;
      double v = 0;
      if (n->is_integer()) v = static_cast<double>(n->as_integer()->get());
      else if (n->is_floating_point()) v = n->as_floating_point()->get();
      else fail(origin, std::string("network.") + key, "expected a number");
      if (!(v >= lo && v <= hi))
        fail(origin, std::string("network.") + key,
             "expected " + std::to_string(lo).substr(0, 5) + " to " + std::to_string(static_cast<int64_t>(hi)) +
                 ", got " + std::to_string(v));
      return v;
    };
    r.between_hosts_bytes_per_s = number("between_hosts_gbps", 0.001, 1e6) * 1e9 / 8.0;
    r.between_hosts_latency_s = number("between_hosts_latency_us", 0, 1e7) * 1e-6;
  }
  const toml::table* types = root["types"].as_table();
  if (!types || types->empty()) fail(origin, "types", "missing; expected [types.NAME] tables");
  for (const auto& [k, v] : *types) {
    const std::string name(k.str()), key = "types." + name;
    const toml::table* t = v.as_table();
    if (!t) fail(origin, key, "expected a table");
    onlyKeys(*t, {"memory_mib", "slowdown", "profile"}, origin, key + ".");
    DeviceType d;
    d.name = name;
    const toml::node* mem = t->get("memory_mib");
    if (!mem) fail(origin, key + ".memory_mib", "missing; expected the device's memory in MiB");
    double mib = 0;
    if (mem->is_integer()) mib = static_cast<double>(mem->as_integer()->get());
    else if (mem->is_floating_point()) mib = mem->as_floating_point()->get();
    else fail(origin, key + ".memory_mib", "expected a number of MiB");
    if (!(mib >= 1 && mib <= 1e9)) fail(origin, key + ".memory_mib", "expected 1 to 1e9 MiB");
    d.memory_bytes = static_cast<int64_t>(mib * 1048576.0);
    if (const toml::node* s = t->get("slowdown")) {
      if (s->is_integer()) d.slowdown = static_cast<double>(s->as_integer()->get());
      else if (s->is_floating_point()) d.slowdown = s->as_floating_point()->get();
      else fail(origin, key + ".slowdown", "expected a number >= 1");
      if (!(d.slowdown >= 1.0 && d.slowdown <= 1000.0))
        fail(origin, key + ".slowdown", "expected a number from 1 (full speed) to 1000, got " + std::to_string(d.slowdown));
    }
    if (const toml::node* pr = t->get("profile")) {
      if (!pr->is_string() || pr->as_string()->get().empty())
        fail(origin, key + ".profile", "expected the path of a profile (morph calibrate --out) made on this type");
      const std::filesystem::path path(pr->as_string()->get());
      d.profile = path.is_absolute() ? path.string() : (std::filesystem::path(origin).parent_path() / path).string();
    }
    r.types[name] = d;
  }
  const toml::array* devices = root["devices"].as_array();
  if (!devices || devices->empty()) fail(origin, "devices", "missing; expected [[devices]] entries");
  // Explicit slots first, then counted devices fill the free slots in order.
  std::map<int64_t, Device> pinned;
  std::vector<Device> counted;
  for (size_t i = 0; i < devices->size(); ++i) {
    const std::string key = "devices[" + std::to_string(i) + "]";
    const toml::table* t = (*devices)[i].as_table();
    if (!t) fail(origin, key, "expected a table");
    onlyKeys(*t, {"type", "host", "count", "workers"}, origin, key + ".");
    Device d;
    const toml::node* type = t->get("type");
    if (!type || !type->is_string()) fail(origin, key + ".type", "missing; expected a type name");
    d.type = type->as_string()->get();
    if (!r.types.count(d.type)) {
      std::string known;
      for (const auto& [n, _] : r.types) known += (known.empty() ? "" : ", ") + n;
      fail(origin, key + ".type", "unknown type '" + d.type + "' (the file's: " + known + ")");
    }
    if (const toml::node* h = t->get("host")) {
      if (!h->is_string() || h->as_string()->get().empty()) fail(origin, key + ".host", "expected \"local\" or an address");
      d.host = h->as_string()->get();
    }
    const toml::node* count = t->get("count");
    const toml::node* slots = t->get("workers");
    if (count && slots) fail(origin, key, "give either count or workers, not both");
    if (slots) {
      const toml::array* a = slots->as_array();
      if (!a || a->empty()) fail(origin, key + ".workers", "expected a list of worker slots");
      for (const auto& s : *a) {
        if (!s.is_integer() || s.as_integer()->get() < 0 || s.as_integer()->get() >= 4096)
          fail(origin, key + ".workers", "expected worker slots 0..4095");
        const int64_t slot = s.as_integer()->get();
        if (pinned.count(slot)) fail(origin, key + ".workers", "worker slot " + std::to_string(slot) + " is listed twice");
        pinned[slot] = d;
      }
    } else {
      int64_t n = 1;
      if (count) {
        if (!count->is_integer() || count->as_integer()->get() < 1 || count->as_integer()->get() > 4096)
          fail(origin, key + ".count", "expected an integer 1..4096");
        n = count->as_integer()->get();
      }
      for (int64_t c = 0; c < n; ++c) counted.push_back(d);
    }
  }
  const size_t total = pinned.size() + counted.size();
  size_t next = 0;
  for (size_t slot = 0; slot < total; ++slot) {
    if (auto it = pinned.find(static_cast<int64_t>(slot)); it != pinned.end()) r.devices.push_back(it->second);
    else if (next < counted.size()) r.devices.push_back(counted[next++]);
  }
  if (r.devices.size() != total || (!pinned.empty() && pinned.rbegin()->first >= static_cast<int64_t>(total)))
    fail(origin, "devices", "worker slots must be 0.." + std::to_string(total - 1) + " without gaps");
  return r;
}

Resources readResources(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot read the resources file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parseResources(ss.str(), path);
}

DeviceVnSeconds deviceVnSeconds(const Resources& res, const JobSpec& job) {
  std::set<std::string> used, unprofiled;
  for (const Device& d : res.devices) {
    used.insert(d.type);
    if (res.types.at(d.type).profile.empty()) unprofiled.insert(d.type);
  }
  DeviceVnSeconds out;
  std::map<std::string, double> per_type;
  for (const std::string& name : used) per_type[name] = res.types.at(name).slowdown;
  if (unprofiled.size() < used.size()) {
    if (!unprofiled.empty()) {
      out.note = "types." + *unprofiled.begin() + " has no profile, so the types' profiles are not compared: "
                 "VN shares by slowdown alone";
    } else {
      for (const std::string& name : used) {
        const DeviceType& t = res.types.at(name);
        const Profile p = readProfile(t.profile);
        std::string diff;
        for (const std::string& d : fingerprintDifferences(p.fingerprint, jobFingerprint(job, p.fingerprint.layers)))
          if (d.rfind("host.", 0) != 0) diff += (diff.empty() ? "" : "; ") + d;
        if (!diff.empty())
          fail(res.file, "types." + name + ".profile", t.profile + " is a profile of another job (" + diff + ")");
        double c = 0;
        for (const LayerCost& l : p.layers) c += l.forward_s + l.backward_s;
        if (!(c > 0)) fail(res.file, "types." + name + ".profile", t.profile + " has no compute times");
        per_type[name] *= c;
      }
    }
  }
  for (const Device& d : res.devices) out.seconds.push_back(per_type.at(d.type));
  return out;
}

}  // namespace morph
