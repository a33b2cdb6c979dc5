// StoreConnection: one authenticated TCP connection to a store server
// (docs/store_protocol.md) and its requests, in plain C++ with no libtorch:
// the client commands (`morph status`, `slow`, `resize`) use it directly,
// so they run without loading libtorch; StoreClient (client.h) wraps it as
// a c10d::Store for everything else. Calls are serialised, so one
// connection may be shared by threads.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "store/errors.h"
#include "store/protocol.h"

namespace morph {

class StoreConnection {
 public:
  // Connects (retrying refused connections until connect_timeout) and
  // proves `key` for `role` ("manager", "worker", "worker/<id>", "client").
  // StoreUnreachable, StoreAuthError.
  StoreConnection(const std::string& host, int port, const std::string& key, const std::string& role,
                  std::chrono::milliseconds connect_timeout);
  ~StoreConnection();
  StoreConnection(const StoreConnection&) = delete;
  StoreConnection& operator=(const StoreConnection&) = delete;

  // The store's operations (StoreError when a request fails). get() and
  // wait() wait on the server up to `wait` for keys that are not there yet.
  void set(const std::string& key, const std::vector<uint8_t>& value);
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired);
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds wait);
  int64_t add(const std::string& key, int64_t value);
  bool deleteKey(const std::string& key);
  bool check(const std::vector<std::string>& keys);
  int64_t numKeys();
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds wait);

  // The nonce this connection proved its key with: a worker that registers
  // on it derives the key of its further connections from it
  // (store::workerKey).
  const std::array<uint8_t, store::kNonceBytes>& sessionNonce() const { return nonce_; }

 private:
  // reply_timeout_ms: how long to wait for the reply (0: for ever).
  store::Reply call(const store::Request& r, int64_t reply_timeout_ms);

  std::string where_;  // host:port, for messages
  int fd_ = -1;
  std::array<uint8_t, store::kNonceBytes> nonce_{};
  bool broken_ = false;  // a call failed mid-way: the connection is out of step
  std::mutex mu_;
};

}  // namespace morph
