// Reachability between workers (docs/distributed.md, "Partitions"): each
// worker listens on a probe port of its own, on the address it binds Gloo
// to, and its peers connect to it when a collective stalls. A peer that
// still heart-beats to the manager but cannot be connected to within the
// probe timeout is cut off from this worker (a partition), not busy: the
// kernel answers a connect however busy the worker is.
#pragma once

#include <atomic>
#include <string>
#include <thread>
#include <vector>

namespace morph {

// How long a probe waits for a peer's connect to complete.
constexpr double kProbeTimeoutS = 1.0;

class ProbeListener {
 public:
  // Listens on `addr` (an IPv4 address), port chosen by the kernel.
  // InputError when it cannot.
  explicit ProbeListener(const std::string& addr);
  ~ProbeListener();
  ProbeListener(const ProbeListener&) = delete;
  ProbeListener& operator=(const ProbeListener&) = delete;
  // "ip:port", what peers probe (workers/<id>/probe).
  const std::string& address() const { return address_; }

 private:
  int fd_ = -1;
  std::string address_;
  std::atomic<bool> stop_{false};
  std::thread thread_;  // accepts and closes (the backlog never fills)
};

// Connects to every "ip:port" of `addresses` at once and waits at most
// `timeout_s`: the indices that could not be reached (unroutable, or no
// answer in time), ascending. A refused connect counts only when
// `refused_counts`: it is an answer from the peer's host, either because
// its worker is gone (a failure, which its heartbeats tell the manager) or
// because a firewall rejects (a partition); the caller tells the two apart
// by whether the peer still heart-beats. A malformed address counts as
// unreachable.
std::vector<size_t> unreachable(const std::vector<std::string>& addresses, bool refused_counts,
                                double timeout_s = kProbeTimeoutS);

}  // namespace morph
