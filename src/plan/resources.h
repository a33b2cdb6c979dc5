// Resources file: the devices a job may run on (docs/resources.md). Device
// types have a memory cap and, on machines without such devices, a
// slowdown factor that Morph emulates (a worker idles (f - 1) x its measured
// compute after each VN). Devices are listed in worker order: worker slot i
// (the i-th worker of `morph run`, or world rank i) is device i.
//
//   [types.fast]                 [[devices]]
//   memory_mib = 4096            type = "fast"
//   slowdown = 1.0               host = "local"     # or an address
//                                count = 1          # or: workers = [0, 2]
//   [network]                    # optional: the link between hosts
//   between_hosts_gbps = 56      between_hosts_latency_us = 5
//   [hosts]                      # optional: hosts emulated on this machine
//   one_machine = true
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace morph {

struct DeviceType {
  std::string name;
  int64_t memory_bytes = 0;
  double slowdown = 1.0;  // >= 1
  // Optional: a calibration profile measured on a device of this type (a
  // path, relative to the resources file's folder when not absolute); the
  // planner and the simulator then charge such a device that profile's
  // per-layer compute costs, times slowdown (docs/resources.md).
  std::string profile;
};

struct Device {
  std::string type;
  std::string host = "local";
};

struct Resources {
  std::string file;  // for messages
  std::map<std::string, DeviceType> types;
  std::vector<Device> devices;  // by worker slot
  // [network]: a pipeline message between two hosts also takes
  // bytes / between_hosts_bytes_per_s (0: no extra) + between_hosts_latency_s.
  double between_hosts_bytes_per_s = 0;
  double between_hosts_latency_s = 0;
  // [hosts] one_machine: the hosts are emulated on this machine (network
  // namespaces); their workers share its cores (SimOptions::hosts_share_cores).
  bool one_machine = false;
  const DeviceType& typeOf(size_t slot) const { return types.at(devices.at(slot).type); }
};

struct JobSpec;

// Per worker slot, the seconds one VN of `job` takes on its device, in a
// unit common to the file's devices (docs/wsp.md, "VN shares by device
// speed"): its type's slowdown, times the whole-model forward and backward
// of one VN in its type's profile when every type in use names one. A
// profile must be of this job (any host), else InputError naming
// types.NAME.profile. `note`: why profiles were left out (only some types
// name one), else empty.
struct DeviceVnSeconds {
  std::vector<double> seconds;
  std::string note;
};
DeviceVnSeconds deviceVnSeconds(const Resources& res, const JobSpec& job);

// InputError naming the file and the key: not TOML, an unknown key, a type
// without memory_mib, a slowdown below 1, a device of an unknown type, a
// worker slot listed twice or left out.
Resources readResources(const std::string& path);
Resources parseResources(const std::string& toml_text, const std::string& origin);

}  // namespace morph
