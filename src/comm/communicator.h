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
#include <vector>

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
  // Blocks until done. On a group with GlooOptions::should_abort or
  // keep_waiting set, gives up with CommFailure once the generation is
  // aborted or keep_waiting says so (for sends and receives too: the
  // group's watchdog aborts them), however the peer behaves.
  virtual void wait() = 0;
  // A collective of several phases (a sharded exact sum): wait for all but
  // its last phase and start that one, so that the caller can advance every
  // work in flight before it waits for any. wait() advances too.
  virtual void advance() {}
};

// What a sharded exact sum (startShardedSum) turns its shard of summed
// integers into: the floats for values [begin, begin + len) of the buffer.
using ShardToFloat = std::function<void(int64_t begin, const int64_t* sums, int64_t len, float* out)>;
// The same for a sum of int32 values (reduce.bits = 32).
using ShardToFloat32 = std::function<void(int64_t begin, const int32_t* sums, int64_t len, float* out)>;

// Scratch memory of one sharded sum, owned by the caller so that it
// outlives the transfers even when the caller abandons them: a chunk
// received, and this rank's chunk as floats (each about n / size()).
struct ShardScratch {
  std::vector<int64_t> recv;
  std::vector<float> floats;
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
  // int32 (reduce.bits = 32): the sums must fit (the caller's bound); the
  // default throws (a communicator without it).
  virtual std::unique_ptr<PendingWork> allreduceSumAsync(int32_t* data, int64_t n);
  // Point to point (pipeline stages): start sending `t` (contiguous) to rank
  // `peer`, or receiving into `t` from it; the work keeps `t` alive.
  // Messages with the same tag between two ranks match in order. wait()
  // blocks until the transfer is done (a dead peer: CommFailure; an
  // aborted generation: CommFailure within a poll interval or two; Gloo's
  // timeout bounds the rest). One-rank communicators have no peer.
  virtual std::unique_ptr<PendingWork> send(torch::Tensor t, int peer, int tag);
  virtual std::unique_ptr<PendingWork> recv(torch::Tensor t, int peer, int tag);
  // Payload bytes this worker has handed to collectives (for benchmarks):
  // an all-reduce's whole buffer, a sharded sum's int64 buffer.
  int64_t bytesReduced() const { return bytes_; }
  void addBytesReduced(int64_t bytes) { bytes_ += bytes; }  // for sums built of sends and receives
  // The number of sharded sums started on this communicator before this
  // call (startShardedSum). Every rank starts them in the same order, so a
  // sum's ordinal names its transfers alike on every rank.
  int64_t nextShardedSum() { return sharded_sums_++; }
  // Whether the control plane abandoned this group's generation
  // (GlooOptions::should_abort; one store round trip): for callers that wait
  // on point-to-point transfers from threads of their own.
  virtual bool aborted() const { return false; }

 protected:
  int64_t bytes_ = 0;
  int64_t sharded_sums_ = 0;
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
  std::unique_ptr<PendingWork> allreduceSumAsync(int32_t*, int64_t n) override {
    bytes_ += n * 4;
    return std::make_unique<Done>();
  }
};

// The exact sum of data[0, n) over `comm` as a reduce-scatter then an
// all-gather, both rings of point-to-point transfers (bench/results/HISTORY.md,
// "Faster exact reduction: what was tried"): the int64 values go round the ring in chunks
// (n / size() values), each rank adding in what it receives, until each
// holds every rank's sum of one chunk; it turns that chunk into floats
// with `to_float`, and the floats go round the ring until every rank has
// all of them. Every rank turns a different chunk, so each computes
// 1 / size() of the floats, and each sends (size() - 1) / size() x n x 12
// bytes instead of the x 16 of Gloo's int64 ring all-reduce (x 8 for a
// float one). The integers are the same as an all-reduce's, in any order,
// and `to_float` is a pure function of them: the floats are bitwise the
// same on every rank and every mapping.
//
// Several sums may be in flight at once: each sum's transfers carry tags
// of their own (from its ordinal), so a message matches only the receive
// it is meant for, however a rank interleaves starting one sum with
// advancing another. Every rank starts, advances and waits for its sums
// in the same order (advance() and wait() block on the peers' part in
// that same sum).
//
// When done, the floats of values [0, n - keep) are in the first n - keep
// floats of `data`'s memory, value i at float i (those integers are then
// gone), and the last `keep` values stay integers, summed, in their place
// (a step's loss statistics and slots, which ride in its last bucket);
// needs n >= size(). The first transfer starts here; advance() runs the
// rest of the reduce-scatter. `data` and `scratch` stay live until the
// work is done or abandoned for good.
std::unique_ptr<PendingWork> startShardedSum(Communicator& comm, int64_t* data, int64_t n, int64_t keep,
                                             ShardScratch& scratch, ShardToFloat to_float);
// The same over int32 values (reduce.bits = 32): 4 bytes per value in both
// rings, (size() - 1) / size() x n x 8 bytes sent, as a float all-reduce.
// The partial sums must fit in int32 (the caller's bound; they are added
// modulo 2^32). The kept values stay int32 sums in their place.
std::unique_ptr<PendingWork> startShardedSum(Communicator& comm, int32_t* data, int64_t n, int64_t keep,
                                             ShardScratch& scratch, ShardToFloat32 to_float);


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
