// Communicator: the narrow seam between the executor and c10d. Collectives
// are blocking and operate on host memory; every worker calls them in the
// same order. Implementations: LocalCommunicator (one worker, no-ops) and
// GlooCommunicator (a c10d ProcessGroupGloo for one generation).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <c10/util/intrusive_ptr.h>

namespace c10d {
class Store;
}

namespace morph {

// A collective in flight. wait() returns once the data is reduced in place.
class PendingWork {
 public:
  virtual ~PendingWork() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void allreduceSum(int64_t* data, int64_t n) = 0;
  virtual void allreduceSum(float* data, int64_t n) = 0;
  virtual void allreduceMax(double* data, int64_t n) = 0;
  virtual void barrier() = 0;
  // Start an all-reduce and return; `data` must stay live and untouched
  // until wait(). Every worker starts them in the same order.
  virtual std::unique_ptr<PendingWork> allreduceSumAsync(int64_t* data, int64_t n) = 0;
  virtual std::unique_ptr<PendingWork> allreduceSumAsync(float* data, int64_t n) = 0;
  // Payload bytes this worker has handed to all-reduces (for benchmarks).
  int64_t bytesReduced() const { return bytes_; }

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
  void allreduceSum(int64_t*, int64_t n) override { bytes_ += n * 8; }
  void allreduceSum(float*, int64_t n) override { bytes_ += n * 4; }
  void allreduceMax(double*, int64_t n) override { bytes_ += n * 8; }
  void barrier() override {}
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
};

// A process group over `store` (already prefixed for the generation).
std::unique_ptr<Communicator> makeGlooCommunicator(const c10::intrusive_ptr<c10d::Store>& store,
                                                   int rank, int size, const GlooOptions& opts);

// The local address this host uses to reach host:port (for Gloo to bind to).
std::string localAddressToward(const std::string& host, int port);

}  // namespace morph
