// Table: the keys of a store and the operations on them
// (docs/store_protocol.md, "Requests"), in memory, with the waits of get
// and wait. The server keeps its keys in one; LocalStore is a c10d::Store
// over one (the manager's own view of its store, and the in-memory store
// of unit tests). Thread-safe. It never parses a value, except add's
// decimal counter.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "store/protocol.h"

namespace morph {
namespace store {

class Table {
 public:
  // `wakes(key)`: whether a write of `key` counts in writes() (null: every
  // write does).
  explicit Table(std::function<bool(const std::string&)> wakes = nullptr) : wakes_(std::move(wakes)) {}
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;

  // Applies one request. get and wait block until their keys exist or
  // their timeout_ms passes (0: as long as it takes) or stop() is called.
  Reply apply(const Request& r);
  // Writes applied so far, those of keys `wakes` refuses, add(key, 0) (a
  // read of a counter) and deletes (nobody waits for a key to vanish) left
  // out.
  int64_t writes() const;
  // Blocks until writes() differs from `seen` or `timeout` passes (or
  // stop()); returns writes().
  int64_t waitForWrite(int64_t seen, std::chrono::milliseconds timeout);
  // Removes the key `key`, or every key that starts with `prefix`, and
  // returns how many went. Not counted in writes(): nobody waits for a key
  // to vanish.
  int64_t erase(const std::string& key);
  int64_t erasePrefix(const std::string& prefix);
  // Ends every wait; every later request is answered kBad.
  void stop();

 private:
  std::function<bool(const std::string&)> wakes_;
  mutable std::mutex mu_;
  std::condition_variable changed_;  // a key was written
  std::condition_variable wrote_;    // writes_ moved
  int64_t writes_ = 0;
  bool stopping_ = false;
  std::unordered_map<std::string, std::vector<uint8_t>> kv_;
};

}  // namespace store
}  // namespace morph
