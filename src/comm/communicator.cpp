#include "comm/communicator.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
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
      if ((!comm->should_abort_ && !comm->keep_waiting_) || p2p) {
        waitOrThrow(std::chrono::milliseconds(0));
        return;
      }
      const auto start = std::chrono::steady_clock::now();
      while (!waitOrThrow(comm->poll_)) {
        if (comm->should_abort_ && comm->should_abort_())
          throw CommFailure("collective abandoned: the generation was aborted");
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (comm->keep_waiting_ && !comm->keep_waiting_(waited))
          throw CommFailure("collective given up after " + std::to_string(static_cast<int64_t>(waited)) +
                            " s: a member it waits for stopped heart-beating");
      }
    }
    void waitAbortable() override {
      if (!p2p || !comm->should_abort_) return wait();
      // A send or receive completes only inside wait() (which cannot be
      // given a timeout without poisoning the context): a thread of its own
      // waits, and this one polls the abort flag. Given up, the thread ends
      // with Gloo's own timeout; the work and its group stay alive till then.
      auto done = std::make_shared<std::atomic<bool>>(false);
      c10::intrusive_ptr<c10d::Work> w = work;
      std::thread([w, done] {
        try {
          w->wait();
        } catch (const std::exception&) {
        }
        done->store(true);
      }).detach();
      auto next_check = std::chrono::steady_clock::now();
      while (!done->load()) {
        if (std::chrono::steady_clock::now() >= next_check) {
          if (comm->should_abort_()) throw CommFailure("transfer abandoned: the generation was aborted");
          next_check = std::chrono::steady_clock::now() + comm->poll_;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      if (std::exception_ptr ex = work->exception()) {
        try {
          std::rethrow_exception(ex);
        } catch (const std::exception& e) {
          throw CommFailure(std::string("transfer failed: ") + e.what());
        }
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
    auto w = std::make_unique<GlooWork>();
    w->comm = this;
    try {
      w->work = pg_->allreduce(ts, o);
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

  int rank_, size_;
  std::function<bool()> should_abort_;
  std::function<bool(double)> keep_waiting_;
  std::chrono::milliseconds poll_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
};

}  // namespace

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
  std::unique_lock<std::mutex> l(f->mu);
  while (!f->cv.wait_for(l, opts.poll_interval, [&] { return f->done; })) {
    l.unlock();
    const bool abort = opts.should_abort();
    l.lock();
    if (abort && !f->done) throw CommFailure("forming a group abandoned: the generation was aborted");
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
