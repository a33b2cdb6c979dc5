// Prefetcher: gathers the inputs of upcoming VNs on a background thread so
// that the executor's compute does not wait for data. Requests are served in
// order; results are keyed by (step, vn).
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "data/dataset.h"
#include "data/sampler.h"

namespace morph {

class Prefetcher {
 public:
  // `data` and `sampler` must outlive the prefetcher.
  Prefetcher(const Dataset& data, const GlobalSampler& sampler)
      : data_(data), sampler_(sampler), thread_([this] { loop(); }) {}
  ~Prefetcher() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Starts gathering (step, vn) unless it is already queued or ready.
  void request(int64_t step, int64_t vn) {
    std::lock_guard<std::mutex> l(mu_);
    Key k{step, vn};
    if (ready_.count(k) || pending_.count(k)) return;
    queue_.push_back(k);
    pending_[k] = true;
    cv_.notify_all();
  }
  // The batch of (step, vn), gathering it if nobody asked for it yet.
  Batch take(int64_t step, int64_t vn) {
    request(step, vn);
    std::unique_lock<std::mutex> l(mu_);
    Key k{step, vn};
    cv_.wait(l, [&] { return ready_.count(k) > 0 || error_; });
    if (error_) std::rethrow_exception(error_);
    Batch b = std::move(ready_[k]);
    ready_.erase(k);
    return b;
  }

 private:
  using Key = std::pair<int64_t, int64_t>;
  void loop() {
    std::unique_lock<std::mutex> l(mu_);
    while (true) {
      cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      Key k = queue_.front();
      queue_.pop_front();
      l.unlock();
      Batch b;
      std::exception_ptr err;
      try {
        b = data_.gather(sampler_.vnIndices(k.first, k.second));
      } catch (...) {
        err = std::current_exception();
      }
      l.lock();
      pending_.erase(k);
      if (err) error_ = err; else ready_[k] = std::move(b);
      cv_.notify_all();
    }
  }

  const Dataset& data_;
  const GlobalSampler& sampler_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Key> queue_;
  std::map<Key, bool> pending_;
  std::map<Key, Batch> ready_;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it uses
};

}  // namespace morph
