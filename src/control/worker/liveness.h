// A worker's liveness: its heartbeat to the manager (and the watchdog that
// gives the job up when the manager is gone), and the watch a member keeps
// on its peers' heartbeats while it waits in a collective. Protocol:
// docs/distributed.md ("Deadlines"). Never trains; the watchdog is the only
// code of the worker that exits the process on its own.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "store/client.h"

namespace morph {

// Probes the members of generation `gen` (their workers/<id>/probe
// addresses; `me` is skipped) and returns the ids that did not answer,
// ascending (reachability.h).
std::vector<int64_t> unreachablePeers(StoreClient& store, const std::vector<int64_t>& members, int64_t me,
                                      bool refused_counts);

// Installs the handler of kManagerDeathSignal (a local worker's manager
// ended): the watchdog of every Heartbeat then gives the job up at once.
void installManagerDeathHandler();

// Sends this worker's pulse to the manager on a store connection of its own,
// and watches that the manager is still there (kManagerLostAfterS,
// liveness.cpp).
class Heartbeat {
 public:
  // Connects as this worker, waiting at most the seconds given.
  using Connect = std::function<c10::intrusive_ptr<StoreClient>(double)>;
  Heartbeat(Connect connect, double connect_timeout_s, int64_t id, double interval_s, std::string join);
  ~Heartbeat();
  // What the loss message names: the checkpoint folder ("" = none) and the
  // manager's resume command.
  void setLossNote(const std::string& ckpt_dir, const std::string& command);
  // Called with an error in hand: returns once a heartbeat gets through
  // after the call (the manager is there: the error is the worker's own),
  // else the watchdog decides in the meantime (and exits the process).
  void waitIfManagerLost() const;

 private:
  void loop();
  void watch();
  [[noreturn]] void lost(const std::string& why);
  Connect connect_;
  c10::intrusive_ptr<StoreClient> store_;
  std::string key_;
  int64_t id_;
  double interval_;
  std::string join_;
  std::atomic<double> last_ok_{0};
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::string ckpt_dir_, command_;
  std::thread thread_, watchdog_;
};

// Whether a member waiting in a collective should go on waiting: before its
// deadline, yes; after it, while every other member's heartbeat still
// moves (read every heartbeat timeout), yes — it is busy, not dead. From
// min(deadline, kProbeAfterS) of waiting on, every kProbeEveryS, it also
// probes the members (reachability.h) and reports the ones it cannot
// connect to (a partition: ReachReport under workers/<id>/reach; the
// manager decides, docs/distributed.md, "Partitions").
constexpr double kProbeAfterS = 1.0, kProbeEveryS = 1.0;
class PeerWatch {
 public:
  PeerWatch(c10::intrusive_ptr<StoreClient> store, std::vector<int64_t> peers, int64_t me, int64_t generation,
            double deadline_s, double hb_timeout_s)
      : store_(std::move(store)), peers_(std::move(peers)), me_(me), gen_(generation), deadline_(deadline_s),
        every_(hb_timeout_s) {}
  bool keepWaiting(double waited);

 private:
  void probe(bool refused_counts);

  c10::intrusive_ptr<StoreClient> store_;
  std::vector<int64_t> peers_;
  int64_t me_, gen_;
  std::vector<int64_t> reported_;  // the peers last reported unreachable
  double deadline_, every_;
  double last_check_ = 0, last_note_ = 0, last_probe_ = 0;
  std::map<int64_t, std::string> beats_;
};

}  // namespace morph
