// Communicator: the narrow seam between the executor and c10d. Collectives
// are blocking and operate on host memory; every worker calls them in the
// same order. Implementations: LocalCommunicator (one worker, no-ops) and
// GlooCommunicator (a c10d ProcessGroupGloo for one generation).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <memory>
#include <string>

#include <c10/util/intrusive_ptr.h>
#include <torch/torch.h>

namespace c10d {
class Store;
}

namespace morph {

// A collective failed or was aborted: a peer died or the control plane
// abandoned the generation. The operation did not complete.
class CommFailure : public std::runtime_error {
 public:
  explicit CommFailure(const std::string& what) : std::runtime_error(what) {}
};

// A collective in flight. wait() returns once the data is reduced in place.
class PendingWork {
 public:
  virtual ~PendingWork() = default;
  virtual void wait() = 0;
  // wait(), but a send or receive also gives up (CommFailure) once the
  // generation is aborted (GlooOptions::should_abort), by polling for
  // completion: for transfers outside the training step, where a peer that
  // died before connecting may leave a point-to-point operation pending
  // until Gloo's own timeout.
  virtual void waitAbortable() { wait(); }
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void allreduceMax(double* data, int64_t n) = 0;
  // Replaces `t` (contiguous, owned by the caller) on every rank with root's.
  virtual void broadcast(torch::Tensor& t, int root) = 0;
  // Start an all-reduce and return; `data` must stay live and untouched
  // until wait(). Every worker starts them in the same order.
  virtual std::unique_ptr<PendingWork> allreduceSumAsync(int64_t* data, int64_t n) = 0;
  virtual std::unique_ptr<PendingWork> allreduceSumAsync(float* data, int64_t n) = 0;
  // Point to point (pipeline stages): start sending `t` (contiguous) to rank
  // `peer`, or receiving into `t` from it; the work keeps `t` alive.
  // Messages with the same tag between two ranks match in order. wait()
  // blocks until the transfer is done (a dead peer: CommFailure; Gloo's
  // timeout bounds the wait). One-rank communicators have no peer.
  virtual std::unique_ptr<PendingWork> send(torch::Tensor t, int peer, int tag);
  virtual std::unique_ptr<PendingWork> recv(torch::Tensor t, int peer, int tag);
  // Payload bytes this worker has handed to all-reduces (for benchmarks).
  int64_t bytesReduced() const { return bytes_; }
  // Whether the control plane abandoned this group's generation
  // (GlooOptions::should_abort; one store round trip): for callers that wait
  // on point-to-point transfers from threads of their own.
  virtual bool aborted() const { return false; }

 protected:
  int64_t bytes_ = 0;
};

class LocalCommunicator : public Communicator {
 public:
  struct Done : PendingWork {
    void wait() override {}
  };
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void allreduceMax(double*, int64_t n) override { bytes_ += n * 8; }
  void broadcast(torch::Tensor&, int) override {}
  std::unique_ptr<PendingWork> allreduceSumAsync(int64_t*, int64_t n) override {
    bytes_ += n * 8;
    return std::make_unique<Done>();
  }
  std::unique_ptr<PendingWork> allreduceSumAsync(float*, int64_t n) override {
    bytes_ += n * 4;
    return std::make_unique<Done>();
  }
};

struct GlooOptions {
  std::string interface_addr;  // local address Gloo binds to ("" = from hostname)
  std::chrono::milliseconds timeout{60000};
  // Polled (every poll_interval) while waiting for a collective; returning
  // true abandons it with CommFailure. Lets the control plane free workers
  // blocked on a peer that died without closing its connections.
  std::function<bool()> should_abort;
  std::chrono::milliseconds poll_interval{20};
  // Asked (every poll_interval) while a collective is still waiting, with
  // the seconds it has waited; returning false gives it up with
  // CommFailure. Unset: it waits until done, aborted, or Gloo's own
  // `timeout` (then a hard ceiling). The control plane answers from the
  // members' heartbeats, so a busy member is never taken for a dead one.
  std::function<bool(double waited_s)> keep_waiting;
};

// A process group over `store` (already prefixed for the generation).
// With opts.should_abort set, forming it (connecting to every peer) is
// given up with CommFailure once the generation is aborted.
std::unique_ptr<Communicator> makeGlooCommunicator(const c10::intrusive_ptr<c10d::Store>& store,
                                                   int rank, int size, const GlooOptions& opts);

// The local address this host uses to reach host:port (for Gloo to bind to).
std::string localAddressToward(const std::string& host, int port);

}  // namespace morph
