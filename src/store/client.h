// StoreClient: a c10d::Store over Morph's store protocol
// (docs/store_protocol.md), so Gloo's rendezvous (a PrefixStore over it)
// works unchanged: a StoreConnection (connection.h) behind c10d's
// interface. Calls are serialised, so one client may be shared by threads.
// Blocking calls (get, wait) wait on the server up to the timeout they are
// given (getTimeout() for get and wait(keys)).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "store/connection.h"

namespace morph {

class StoreClient : public c10d::Store {
 public:
  // Connects (retrying refused connections until connect_timeout) and
  // proves `key` for `role` ("manager", "worker", "worker/<id>", "client").
  StoreClient(const std::string& host, int port, const std::string& key, const std::string& role,
              std::chrono::milliseconds connect_timeout);
  explicit StoreClient(std::unique_ptr<StoreConnection> connection);

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  // The nonce this connection proved its key with (StoreConnection).
  const std::array<uint8_t, store::kNonceBytes>& sessionNonce() const { return conn_->sessionNonce(); }

 private:
  std::unique_ptr<StoreConnection> conn_;
};

}  // namespace morph
