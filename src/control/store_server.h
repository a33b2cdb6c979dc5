// StoreServer: the job's control-plane key-value store, served by the
// manager on threads of its own (docs/store_protocol.md). It owns the keys,
// the listening socket and one thread per connection. Every connection must
// prove it holds the job token (or the manager's key) before it reads or
// writes; then its role decides which keys it may write (docs/
// control_plane.md). A malformed, oversized, unauthenticated or refused
// request closes or answers that one connection, is logged to stderr, and
// never stops the server. It must never parse a value: values are bytes.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "control/store_protocol.h"

namespace morph {
namespace store {

enum class KeyPolicy {
  kJob,   // roles: manager writes anything, a worker its own keys, a client ctl/*
  kOpen,  // every authenticated connection writes anything (calibration's two processes)
};

struct ServerOptions {
  std::string bind_addr = "127.0.0.1";  // IPv4 address to listen on; "0.0.0.0" = every interface
  int port = 0;                         // 0 = a free port
  std::string token;                    // the job token: workers and clients prove it
  std::string manager_key;              // proves the manager role; never leaves the manager process
  KeyPolicy policy = KeyPolicy::kJob;
  bool log = true;                      // refusals to stderr
};

// Who a connection is, once authenticated.
struct Role {
  enum Kind { kManager, kWorker, kClient } kind = kClient;
  int64_t worker = -1;  // a worker's id once it registered (workers/next_id) or claimed one ("worker/<id>")
};

// Whether `role` may apply a write (set, add, compareSet, delete) to `key`
// under the job policy; "" if so, else the reason. `op`/`delta` tell a
// worker's registration (add 1 to workers/next_id) from other writes.
std::string jobPolicyRefusal(const Role& role, Op op, const std::string& key, int64_t delta);

class StoreServer {
 public:
  // Binds and listens before it returns; throws std::runtime_error naming
  // the address when it cannot.
  explicit StoreServer(ServerOptions o);
  ~StoreServer();  // closes every connection and joins its threads
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const;
  // Writes applied so far, heartbeats ("workers/<id>/hb") and add(key, 0)
  // (a read of a counter) left out: the
  // manager sleeps until the count moves instead of polling the store.
  int64_t writes() const;
  // Blocks until writes() differs from `seen` or `timeout` passes; returns
  // writes().
  int64_t waitForWrite(int64_t seen, std::chrono::milliseconds timeout);
  // Applies `r` in this process with the manager's role, as the manager's
  // own connection would, without the socket round trip and the server
  // thread it wakes (the manager reads the store many times a second).
  Reply localCall(const Request& r);
  // Remove the key `key`, or every key that starts with `prefix`, and return
  // how many went: the manager's cleanup of steps it read, past generations
  // and departed workers (docs/distributed.md, "Store keys"). Not counted
  // in writes(): nobody waits for a key to vanish.
  int64_t erase(const std::string& key);
  int64_t erasePrefix(const std::string& prefix);
  // Counters for tests and benchmarks.
  int64_t refusedConnections() const;  // handshake failed, malformed or oversized frames
  int64_t deniedWrites() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace store
}  // namespace morph
