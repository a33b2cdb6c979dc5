#include "store/table.h"

#include <cerrno>
#include <cstdlib>

namespace morph {
namespace store {

namespace {
bool isWrite(Op op) { return op == Op::kSet || op == Op::kAdd || op == Op::kCompareSet || op == Op::kDelete; }
}  // namespace

Reply Table::apply(const Request& req) {
  Reply rep;
  std::unique_lock<std::mutex> l(mu_);
  // add(key, 0) reads a counter (the manager's polls): not a write here;
  // nor is a delete (nobody waits for a key to vanish).
  if (isWrite(req.op) && req.op != Op::kDelete && !(req.op == Op::kAdd && req.delta == 0) &&
      (!wakes_ || wakes_(req.keys.at(0)))) {
    // Woken after this write applies: the waiter needs `mu_` too.
    ++writes_;
    wrote_.notify_all();
  }
  auto waitFor = [&](const std::vector<std::string>& keys, uint64_t timeout_ms) {
    auto all = [&] {
      if (stopping_) return true;
      for (const auto& k : keys)
        if (!kv_.count(k)) return false;
      return true;
    };
    // timeout 0 = wait as long as it takes (c10d's kNoTimeout)
    if (timeout_ms == 0) {
      changed_.wait(l, all);
    } else {
      changed_.wait_for(l, std::chrono::milliseconds(std::min<uint64_t>(timeout_ms, uint64_t{1} << 40)), all);
    }
    for (const auto& k : keys)
      if (!kv_.count(k)) return false;
    return true;
  };
  switch (req.op) {
    case Op::kSet:
      kv_[req.keys[0]] = req.value;
      changed_.notify_all();
      break;
    case Op::kGet:
      if (!waitFor(req.keys, req.timeout_ms)) {
        rep.status = Status::kTimeout;
        rep.message = "key '" + req.keys[0] + "' did not appear in time";
      } else {
        rep.value = kv_[req.keys[0]];
      }
      break;
    case Op::kAdd: {
      int64_t v = 0;
      auto it = kv_.find(req.keys[0]);
      if (it != kv_.end()) {
        const std::string s(it->second.begin(), it->second.end());
        char* end = nullptr;
        errno = 0;
        v = std::strtoll(s.c_str(), &end, 10);
        if (s.empty() || errno != 0 || *end != '\0') {
          rep.status = Status::kBad;
          rep.message = "add to '" + req.keys[0] + "', which does not hold a number";
          return rep;
        }
      }
      v = static_cast<int64_t>(static_cast<uint64_t>(v) + static_cast<uint64_t>(req.delta));
      const std::string s = std::to_string(v);
      kv_[req.keys[0]] = std::vector<uint8_t>(s.begin(), s.end());
      rep.number = v;
      changed_.notify_all();
      break;
    }
    case Op::kCompareSet: {
      // c10d's semantics: a missing key is created when `expected` is
      // empty; the reply is the value the key holds afterwards (or the
      // expected value, for a missing key that was not created).
      auto it = kv_.find(req.keys[0]);
      if (it == kv_.end()) {
        if (req.value.empty()) {
          kv_[req.keys[0]] = req.value2;
          rep.value = req.value2;
          changed_.notify_all();
        } else {
          rep.value = req.value;
        }
      } else if (it->second == req.value) {
        it->second = req.value2;
        rep.value = req.value2;
        changed_.notify_all();
      } else {
        rep.value = it->second;
      }
      break;
    }
    case Op::kCheck: {
      rep.number = 1;
      for (const auto& k : req.keys)
        if (!kv_.count(k)) rep.number = 0;
      break;
    }
    case Op::kWait:
      if (!waitFor(req.keys, req.timeout_ms)) {
        rep.status = Status::kTimeout;
        rep.message = "keys did not appear in time";
      }
      break;
    case Op::kDelete:
      rep.number = kv_.erase(req.keys[0]) ? 1 : 0;
      break;
    case Op::kNumKeys:
      rep.number = static_cast<int64_t>(kv_.size());
      break;
  }
  if (stopping_) {
    rep.status = Status::kBad;
    rep.message = "the store is shutting down";
  }
  return rep;
}

int64_t Table::writes() const {
  std::lock_guard<std::mutex> l(mu_);
  return writes_;
}

int64_t Table::waitForWrite(int64_t seen, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(mu_);
  wrote_.wait_for(l, timeout, [&] { return writes_ != seen || stopping_; });
  return writes_;
}

int64_t Table::erase(const std::string& key) {
  std::lock_guard<std::mutex> l(mu_);
  return static_cast<int64_t>(kv_.erase(key));
}

int64_t Table::erasePrefix(const std::string& prefix) {
  std::lock_guard<std::mutex> l(mu_);
  int64_t n = 0;
  for (auto it = kv_.begin(); it != kv_.end();) {
    if (it->first.compare(0, prefix.size(), prefix) == 0) {
      it = kv_.erase(it);
      ++n;
    } else {
      ++it;
    }
  }
  return n;
}

void Table::stop() {
  std::lock_guard<std::mutex> l(mu_);
  stopping_ = true;
  changed_.notify_all();
  wrote_.notify_all();
}

}  // namespace store
}  // namespace morph
