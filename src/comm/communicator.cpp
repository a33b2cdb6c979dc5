#include "comm/communicator.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <type_traits>
#include <mutex>
#include <thread>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "core/error.h"

namespace morph {
namespace {

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                   const GlooOptions& o)
      : rank_(rank), size_(size), should_abort_(o.should_abort), keep_waiting_(o.keep_waiting),
        poll_(o.poll_interval) {
    auto opts = c10d::ProcessGroupGloo::Options::create();
    opts->timeout = o.timeout;
    opts->devices.push_back(o.interface_addr.empty()
                                ? c10d::ProcessGroupGloo::createDefaultDevice()
                                : c10d::ProcessGroupGloo::createDeviceForHostname(o.interface_addr));
    opts->threads = 1;
    pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
  }
  ~GlooCommunicator() override {
    {
      std::lock_guard<std::mutex> l(watch_mu_);
      stop_watch_ = true;
    }
    watch_cv_.notify_all();
    if (watch_.joinable()) watch_.join();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool aborted() const override { return should_abort_ && should_abort_(); }
  void allreduceMax(double* data, int64_t n) override {
    // An owned copy: if this collective is abandoned, a late write by
    // Gloo's thread lands in the copy, not in the caller's memory.
    torch::Tensor t = torch::from_blob(data, {n}, torch::kFloat64).clone();
    run(t, c10d::ReduceOp::MAX);
    std::memcpy(data, t.data_ptr<double>(), static_cast<size_t>(n) * sizeof(double));
  }
  void broadcast(torch::Tensor& t, int root) override {
    std::vector<torch::Tensor> ts{t};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    auto w = std::make_unique<GlooWork>();
    w->comm = this;
    w->work = pg_->broadcast(ts, o);
    w->wait();
    bytes_ += t.numel() * t.element_size();
  }
  std::unique_ptr<PendingWork> allreduceSumAsync(int64_t* data, int64_t n) override {
    return start(torch::from_blob(data, {n}, torch::kInt64), c10d::ReduceOp::SUM);
  }
  std::unique_ptr<PendingWork> allreduceSumAsync(float* data, int64_t n) override {
    return start(torch::from_blob(data, {n}, torch::kFloat32), c10d::ReduceOp::SUM);
  }
  std::unique_ptr<PendingWork> allreduceSumAsync(int32_t* data, int64_t n) override {
    return start(torch::from_blob(data, {n}, torch::kInt32), c10d::ReduceOp::SUM);
  }
  std::unique_ptr<PendingWork> send(torch::Tensor t, int peer, int tag) override {
    return p2p(t, [&](std::vector<torch::Tensor>& ts) { return pg_->send(ts, peer, tag); });
  }
  std::unique_ptr<PendingWork> recv(torch::Tensor t, int peer, int tag) override {
    return p2p(t, [&](std::vector<torch::Tensor>& ts) { return pg_->recv(ts, peer, tag); });
  }

 private:
  struct GlooWork : PendingWork {
    c10::intrusive_ptr<c10d::Work> work;
    const GlooCommunicator* comm;
    // Gloo's send/recv cannot be waited on with a timeout (a timed-out wait
    // poisons the whole context), so they block until done or failed.
    bool p2p = false;
    torch::Tensor keep;
    void wait() override {
      if (p2p && (comm->should_abort_ || comm->keep_waiting_)) {
        const_cast<GlooCommunicator*>(comm)->waitWatched(*work);
        return;
      }
      if (!comm->should_abort_ && !comm->keep_waiting_) {
        waitOrThrow(std::chrono::milliseconds(0));
        return;
      }
      const auto start = std::chrono::steady_clock::now();
      while (!waitOrThrow(comm->poll_)) {
        if (comm->should_abort_ && comm->should_abort_())
          throw CommFailure("collective abandoned: the generation was aborted");
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (comm->keep_waiting_ && !const_cast<GlooCommunicator*>(comm)->keepWaiting(waited))
          throw CommFailure("collective given up after " + std::to_string(static_cast<int64_t>(waited)) +
                            " s: a member it waits for stopped heart-beating");
      }
    }
    // True once complete; throws CommFailure if the collective failed. A
    // timed-out wait(timeout) throws too, so completion and failure are read
    // from the work itself, never inferred from the exception.
    bool waitOrThrow(std::chrono::milliseconds timeout) {
      try {
        if (timeout.count() == 0) {
          work->wait();
        } else {
          work->wait(timeout);
        }
      } catch (const std::exception&) {
      }
      if (!work->isCompleted()) return false;
      if (std::exception_ptr ex = work->exception()) {
        try {
          std::rethrow_exception(ex);
        } catch (const std::exception& e) {
          throw CommFailure(std::string("collective failed: ") + e.what());
        }
      }
      return true;
    }
  };
  std::unique_ptr<PendingWork> start(torch::Tensor t, c10d::ReduceOp op) {
    bytes_ += t.numel() * t.element_size();
    std::vector<torch::Tensor> ts{t};
    c10d::AllreduceOptions o;
    o.reduceOp = op;
    return post([&] { return pg_->allreduce(ts, o); });
  }
  // A collective started by `issue` (a call on pg_), as a work to wait on.
  template <class F>
  std::unique_ptr<PendingWork> post(F&& issue) {
    auto w = std::make_unique<GlooWork>();
    w->comm = this;
    try {
      w->work = issue();
    } catch (const std::exception& e) {
      throw CommFailure(std::string("collective failed to start: ") + e.what());
    }
    return w;
  }
  void run(torch::Tensor t, c10d::ReduceOp op) { start(std::move(t), op)->wait(); }
  template <class F>
  std::unique_ptr<PendingWork> p2p(torch::Tensor& t, F&& post) {
    MORPH_CHECK(t.is_contiguous(), "send/recv of a non-contiguous tensor");
    auto w = std::make_unique<GlooWork>();
    w->comm = this;
    w->p2p = true;
    w->keep = t;
    std::vector<torch::Tensor> ts{t};
    try {
      w->work = post(ts);
    } catch (const std::exception& e) {
      throw CommFailure(std::string("transfer failed to start: ") + e.what());
    }
    return w;
  }

  // keep_waiting_ may keep state of its own (the control plane's watch of
  // heartbeats): asked by one thread at a time.
  bool keepWaiting(double waited) {
    std::lock_guard<std::mutex> l(keep_mu_);
    return keep_waiting_(waited);
  }

  // A send or receive completes only inside a blocking wait(): Gloo's
  // wait(timeout) would poison the whole context when it times out. So the
  // waiting thread blocks, and the group's watchdog thread looks at every
  // wait blocked for longer than poll_: once the generation is aborted
  // (should_abort_) or keep_waiting_ gives up, it aborts them all
  // (Work::abort: the blocked wait returns false), and every later wait of
  // this group fails at once. Without it, a member whose ring neighbour
  // gave up a sharded sum (and so never sends) would wait for Gloo's own
  // timeout although the control plane had long abandoned the generation.
  void waitWatched(c10d::Work& work) {
    uint64_t id = 0;
    {
      std::lock_guard<std::mutex> l(watch_mu_);
      if (!given_up_.empty()) throw CommFailure(given_up_);
      id = next_blocked_++;
      blocked_[id] = {&work, std::chrono::steady_clock::now()};
      if (!watch_.joinable()) {
        watch_ = std::thread([this] { watch(); });
      } else if (watch_idle_) {
        watch_cv_.notify_one();
      }
    }
    bool done = false;
    std::exception_ptr error;
    try {
      done = work.wait();
    } catch (...) {
      error = std::current_exception();
    }
    std::string why;
    {
      std::lock_guard<std::mutex> l(watch_mu_);
      blocked_.erase(id);
      why = given_up_;
    }
    if (error) {
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& e) {
        throw CommFailure(std::string("transfer failed: ") + e.what());
      }
    }
    if (!done) throw CommFailure(why.empty() ? std::string("transfer aborted") : why);
  }
  void watch() {
    std::unique_lock<std::mutex> l(watch_mu_);
    while (!stop_watch_) {
      if (blocked_.empty()) {  // idle until a wait blocks (waitWatched notifies)
        watch_idle_ = true;
        watch_cv_.wait(l, [&] { return stop_watch_ || !blocked_.empty(); });
        watch_idle_ = false;
        continue;
      }
      watch_cv_.wait_for(l, poll_, [&] { return stop_watch_; });
      if (stop_watch_ || blocked_.empty() || !given_up_.empty()) continue;
      const auto now = std::chrono::steady_clock::now();
      auto oldest = now;
      for (const auto& [id, b] : blocked_) oldest = std::min(oldest, b.since);
      if (now - oldest < poll_) continue;
      const double waited = std::chrono::duration<double>(now - oldest).count();
      l.unlock();
      std::string why;
      if (should_abort_ && should_abort_()) {
        why = "transfer abandoned: the generation was aborted";
      } else if (keep_waiting_ && !keepWaiting(waited)) {
        why = "transfer given up after " + std::to_string(static_cast<int64_t>(waited)) +
              " s: a member it waits for stopped heart-beating";
      }
      l.lock();
      if (why.empty()) continue;
      given_up_ = why;
      for (auto& [id, b] : blocked_) b.work->abort();
    }
  }

  int rank_, size_;
  std::function<bool()> should_abort_;
  std::function<bool(double)> keep_waiting_;
  std::chrono::milliseconds poll_;
  std::mutex keep_mu_;
  struct Blocked {
    c10d::Work* work;
    std::chrono::steady_clock::time_point since;
  };
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  std::map<uint64_t, Blocked> blocked_;  // the sends and receives blocked in waitWatched
  uint64_t next_blocked_ = 0;
  std::string given_up_;  // set once: every wait of this group fails with it
  bool watch_idle_ = false, stop_watch_ = false;
  std::thread watch_;  // started by the first watched wait
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
};

// startShardedSum's work. Rank r's ring neighbours are r + 1 (right) and
// r - 1 (left); chunk j is values [j n / D, (j + 1) n / D). Reduce-scatter,
// step t = 0 .. D-2: send chunk r - t (at t > 0 the partial sum received
// the step before) to the right, receive chunk r - t - 1 from the left and
// add it in; then chunk r + 1 holds every rank's sum. It becomes floats,
// and the all-gather, step t: send float chunk r + 1 - t to the right,
// receive float chunk r - t from the left into its place. One flow in and
// one out per rank at any time, like Gloo's ring all-reduce (an all-to-all,
// every rank to every rank at once, was slower on shaped links). With 3 or
// more ranks each chunk travels in pieces, and a piece goes on as soon as
// it has arrived (and been added), so the link stays busy between steps;
// 2 ranks pass nothing on and send each chunk whole. The transfers
// are waited on as the pipeline's in-step ones are: a dead peer's closed
// connection fails them, and the group's watchdog aborts them once the
// generation is (a live neighbour that gave the sum up never sends).
// T: the integers summed (int64_t, or int32_t for reduce.bits = 32); the
// floats are 4 bytes either way, float i at byte 4 i of `data`.
template <class T, class ToFloat>
class ShardedSum : public PendingWork {
  using U = std::make_unsigned_t<T>;
  static constexpr auto kDtype = sizeof(T) == 8 ? torch::kInt64 : torch::kInt32;

 public:
  // Tags of the sum's transfers: two per sum (reduce-scatter, all-gather)
  // from its ordinal, above the pipeline's small fixed tags. Gloo matches
  // a receive with the first message of its tag from that peer, so two
  // sums in flight that shared tags would take each other's messages
  // whenever two ranks interleaved their transfers differently (e.g. one
  // sum's all-gather forwarding after the next sum's own chunk). The ordinals
  // wrap after 2^22 sums, long after any earlier sum completed or its
  // group was dropped.
  static constexpr int kTagBase = 1 << 24;
  static constexpr int64_t kTagWrap = int64_t{1} << 22;
  static constexpr int64_t kPieceBytes = 256 << 10;

  ShardedSum(Communicator& comm, T* data, int64_t n, int64_t keep, ShardScratch& scratch, ToFloat to_float)
      : comm_(comm), data_(data), floats_end_(n - keep), scratch_(scratch), to_float_(std::move(to_float)) {
    const int ordinal = static_cast<int>(comm.nextShardedSum() % kTagWrap);
    reduce_tag_ = kTagBase + 2 * ordinal;
    gather_tag_ = reduce_tag_ + 1;
    D_ = comm.size();
    r_ = comm.rank();
    MORPH_CHECK(n >= D_, "a sharded sum needs at least one value per rank");
    MORPH_CHECK(0 <= keep && keep <= n, "a sharded sum keeps at most all of its values as integers");
    int64_t longest = 0;
    for (int j = 0; j <= D_; ++j) begin_.push_back(static_cast<int64_t>(static_cast<__int128>(n) * j / D_));
    for (int j = 0; j < D_; ++j) longest = std::max(longest, len(j));
    // Pieces let a rank pass on what it has received while the rest still
    // arrives. Two ranks pass nothing on (each receives the other's own
    // chunk, in both rings), so there a chunk goes whole: every transfer
    // costs a message and wake-ups of Gloo's loop thread and of this one
    // (at the MLP's size, 10 pieces per chunk took 5x float mode's system
    // calls a step; docs/exact_reduction.md).
    pieces_ = D_ == 2 ? 1 : static_cast<int>(std::clamp<int64_t>(longest * 8 / kPieceBytes, 1, 16));
    // Steps alternate halves of it (int64 storage; T-sized halves).
    scratch_.recv.resize(static_cast<size_t>((2 * longest * static_cast<int64_t>(sizeof(T)) + 7) / 8));
    scratch_.floats.resize(static_cast<size_t>(len(mod(r_ + 1))));
    comm.addBytesReduced(n * static_cast<int64_t>(sizeof(T)));
    // The first step needs nothing but this rank's values.
    postReduceRecvs(0);
    for (int p = 0; p < pieces_; ++p) postReduceSend(0, p);
  }
  void advance() override {
    if (reduced_) return;
    for (int t = 0; t + 1 < D_; ++t) {
      if (t + 2 < D_) postReduceRecvs(t + 1);  // into the other half, free since step t - 1
      const int j = mod(r_ - t - 1);
      const U* in = reinterpret_cast<const U*>(recvBuf(t));
      U* acc = reinterpret_cast<U*>(data_ + begin_[static_cast<size_t>(j)]);
      for (int p = 0; p < pieces_; ++p) {
        recvs_[static_cast<size_t>(t * pieces_ + p)]->wait();
        // Unsigned: a step that overflowed the agreed bound (it is redone)
        // may carry any integers, and their sum must not be undefined.
        for (int64_t e = pieceBegin(j, p), end = pieceBegin(j, p + 1); e < end; ++e) acc[e] += in[e];
        if (t + 2 < D_) postReduceSend(t + 1, p);  // chunk j goes on
      }
    }
    for (auto& w : sends_) w->wait();
    sends_.clear();
    recvs_.clear();
    reduced_ = true;
    // The summed chunk's floats, then in their place: float i in the first
    // 4 (n - keep) bytes of `data` (every integer there is consumed and
    // sent now; the kept integers, from byte 8 (n - keep) on, stay).
    const int own = mod(r_ + 1);
    const int64_t b = begin_[static_cast<size_t>(own)], nf = floatsIn(own);
    if (nf > 0) {
      to_float_(b, data_ + b, nf, scratch_.floats.data());
      std::memcpy(reinterpret_cast<char*>(data_) + 4 * b, scratch_.floats.data(), static_cast<size_t>(nf) * 4);
    }
    // Every chunk lands in its place, so all receives can wait now.
    for (int t = 0; t + 1 < D_; ++t)
      for (torch::Tensor& part : gatherParts(mod(r_ - t))) recvs_.push_back(comm_.recv(part, mod(r_ - 1), gather_tag_));
    for (torch::Tensor& part : gatherParts(own)) sends_.push_back(comm_.send(part, mod(r_ + 1), gather_tag_));
  }
  void wait() override {
    advance();
    if (gathered_) return;
    size_t k = 0;
    for (int t = 0; t + 1 < D_; ++t)
      for (torch::Tensor& part : gatherParts(mod(r_ - t))) {
        recvs_[k++]->wait();
        // The part of chunk r - t goes on to the right, unless it is the
        // right neighbour's own (the last step's).
        if (t + 2 < D_) sends_.push_back(comm_.send(part, mod(r_ + 1), gather_tag_));
      }
    for (auto& w : sends_) w->wait();
    gathered_ = true;
  }

 private:
  int mod(int j) const { return ((j % D_) + D_) % D_; }
  int64_t len(int j) const { return begin_[static_cast<size_t>(j) + 1] - begin_[static_cast<size_t>(j)]; }
  // Piece p of chunk j: values [pieceBegin(j, p), pieceBegin(j, p + 1)) of the chunk.
  int64_t pieceBegin(int j, int p) const { return len(j) * p / pieces_; }
  T* recvBuf(int t) const {
    const size_t half = scratch_.recv.size() * 8 / sizeof(T) / 2;
    return reinterpret_cast<T*>(scratch_.recv.data()) + (t % 2) * half;
  }
  // How many of chunk j's values become floats: those before n - keep.
  int64_t floatsIn(int j) const {
    return std::clamp<int64_t>(floats_end_ - begin_[static_cast<size_t>(j)], 0, len(j));
  }
  // What the all-gather moves of chunk j, in order, empty parts left out
  // (the same on every rank): its floats in pieces, then its kept integers.
  std::vector<torch::Tensor> gatherParts(int j) const {
    std::vector<torch::Tensor> parts;
    const int64_t b = begin_[static_cast<size_t>(j)], nf = floatsIn(j);
    char* floats = reinterpret_cast<char*>(data_) + 4 * b;
    for (int p = 0; p < pieces_; ++p) {
      const int64_t lo = nf * p / pieces_, hi = nf * (p + 1) / pieces_;
      if (hi > lo) parts.push_back(torch::from_blob(floats + 4 * lo, {hi - lo}, torch::kFloat32));
    }
    if (nf < len(j)) parts.push_back(torch::from_blob(data_ + b + nf, {len(j) - nf}, kDtype));
    return parts;
  }
  void postReduceRecvs(int t) {
    const int j = mod(r_ - t - 1);
    for (int p = 0; p < pieces_; ++p)
      recvs_.push_back(comm_.recv(torch::from_blob(recvBuf(t) + pieceBegin(j, p),
                                                   {pieceBegin(j, p + 1) - pieceBegin(j, p)}, kDtype),
                                  mod(r_ - 1), reduce_tag_));
  }
  void postReduceSend(int t, int p) {
    const int s = mod(r_ - t);
    sends_.push_back(comm_.send(torch::from_blob(data_ + begin_[static_cast<size_t>(s)] + pieceBegin(s, p),
                                                 {pieceBegin(s, p + 1) - pieceBegin(s, p)}, kDtype),
                                mod(r_ + 1), reduce_tag_));
  }
  Communicator& comm_;
  T* data_;
  int64_t floats_end_;  // n - keep
  ShardScratch& scratch_;
  ToFloat to_float_;
  int D_ = 1, r_ = 0, pieces_ = 1, reduce_tag_ = 0, gather_tag_ = 0;
  std::vector<int64_t> begin_;
  std::vector<std::unique_ptr<PendingWork>> sends_, recvs_;
  bool reduced_ = false, gathered_ = false;
};

}  // namespace

std::unique_ptr<PendingWork> startShardedSum(Communicator& comm, int64_t* data, int64_t n, int64_t keep,
                                             ShardScratch& scratch, ShardToFloat to_float) {
  return std::make_unique<ShardedSum<int64_t, ShardToFloat>>(comm, data, n, keep, scratch, std::move(to_float));
}

std::unique_ptr<PendingWork> startShardedSum(Communicator& comm, int32_t* data, int64_t n, int64_t keep,
                                             ShardScratch& scratch, ShardToFloat32 to_float) {
  return std::make_unique<ShardedSum<int32_t, ShardToFloat32>>(comm, data, n, keep, scratch, std::move(to_float));
}

std::unique_ptr<PendingWork> Communicator::allreduceSumAsync(int32_t*, int64_t) {
  throw std::logic_error("allreduceSumAsync(int32): not implemented by this communicator");
}

std::unique_ptr<PendingWork> Communicator::send(torch::Tensor, int, int) {
  throw std::logic_error("send: this communicator has no peers");
}
std::unique_ptr<PendingWork> Communicator::recv(torch::Tensor, int, int) {
  throw std::logic_error("recv: this communicator has no peers");
}

std::unique_ptr<Communicator> makeGlooCommunicator(const c10::intrusive_ptr<c10d::Store>& store,
                                                   int rank, int size, const GlooOptions& opts) {
  if (!opts.should_abort || size == 1) return std::make_unique<GlooCommunicator>(store, rank, size, opts);
  // Forming the group connects to every peer. A peer that published its
  // address and then died leaves the others waiting for its connection
  // until Gloo's timeout, which nothing can interrupt. So the group is
  // formed by a thread of its own while this one polls the abort flag;
  // given up, the thread ends by Gloo's timeout and drops what it made.
  struct Forming {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::unique_ptr<Communicator> comm;
    std::exception_ptr error;
  };
  auto f = std::make_shared<Forming>();
  std::thread([f, store, rank, size, opts] {
    std::unique_ptr<Communicator> c;
    std::exception_ptr e;
    try {
      c = std::make_unique<GlooCommunicator>(store, rank, size, opts);
    } catch (...) {
      e = std::current_exception();
    }
    std::lock_guard<std::mutex> l(f->mu);
    f->comm = std::move(c);
    f->error = e;
    f->done = true;
    f->cv.notify_all();
  }).detach();
  // keep_waiting is asked too: a peer that stopped heart-beating ends the
  // wait, and the control plane probes peers it cannot reach (a partition).
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> l(f->mu);
  while (!f->cv.wait_for(l, opts.poll_interval, [&] { return f->done; })) {
    l.unlock();
    const bool abort = opts.should_abort();
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const bool give_up = !abort && opts.keep_waiting && !opts.keep_waiting(waited);
    l.lock();
    if (abort && !f->done) throw CommFailure("forming a group abandoned: the generation was aborted");
    if (give_up && !f->done) throw CommFailure("forming a group abandoned: a member stopped heart-beating");
  }
  if (f->error) std::rethrow_exception(f->error);
  return std::move(f->comm);
}

std::string localAddressToward(const std::string& host, int port) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res)
    throw InputError("cannot resolve manager host '" + host + "'");
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  std::string out;
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof local;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char buf[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &local.sin_addr, buf, sizeof buf);
      out = buf;
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  if (out.empty()) throw InputError("no route to manager " + host + ":" + std::to_string(port));
  return out;
}

}  // namespace morph
