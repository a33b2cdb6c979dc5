// StoreServer: a key-value store served over TCP on threads of its own
// (docs/store_protocol.md): the job's control-plane store, which the
// manager hosts, and calibration's. It owns the keys (a Table), the
// listening socket and one thread per connection. Every connection must
// prove it holds the token (or the manager's key) before it reads or
// writes; then its role and the server's KeyPolicy decide which keys it may
// write (the job's: control/protocol/job_key_policy.h). A malformed, oversized,
// unauthenticated or refused request closes or answers that one
// connection, is logged to stderr, and never stops the server. It must
// never parse a value: values are bytes.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "store/key_policy.h"
#include "store/protocol.h"
#include "store/table.h"

namespace morph {
namespace store {

struct ServerOptions {
  std::string bind_addr = "127.0.0.1";  // IPv4 address to listen on; "0.0.0.0" = every interface
  int port = 0;                         // 0 = a free port
  std::string token;                    // the job token: workers and clients prove it
  std::string manager_key;              // proves the manager role; never leaves the manager process
  // Who may write which key; null: OpenPolicy (every authenticated
  // connection writes every key).
  std::shared_ptr<const KeyPolicy> policy;
  bool log = true;                      // refusals to stderr
};

class StoreServer {
 public:
  // Binds and listens before it returns; throws std::runtime_error naming
  // the address when it cannot.
  explicit StoreServer(ServerOptions o);
  ~StoreServer();  // closes every connection and joins its threads
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const;
  // The keys. Requests applied to it directly act with the manager's role,
  // as the manager's own connection would, without the socket round trip
  // and the server thread it wakes (store/local_store.h); writes() counts
  // what the policy says wakes (heartbeats do not): the manager sleeps
  // until the count moves instead of polling the store.
  Table& table();
  // Counters for tests and benchmarks.
  int64_t refusedConnections() const;  // handshake failed, malformed or oversized frames
  int64_t deniedWrites() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace store
}  // namespace morph
