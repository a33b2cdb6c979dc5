// Who may write which key of a store (docs/store_protocol.md, "Roles"). The
// server authenticates a connection's role and asks its KeyPolicy about
// every write; it knows no key of its own. Morph's job policy is
// control/protocol/job_key_policy.h; calibration's two processes use
// OpenPolicy.
#pragma once

#include <cstdint>
#include <string>

#include "store/protocol.h"

namespace morph {
namespace store {

// Who a connection is, once authenticated.
struct Role {
  enum Kind { kManager, kWorker, kClient } kind = kClient;
  int64_t worker = -1;  // a worker's id once it registered (registrationKey) or claimed one ("worker/<id>")
};

class KeyPolicy {
 public:
  virtual ~KeyPolicy() = default;
  // "" when `role` may apply the write `op` (set, add, compareSet, delete)
  // to `key` (`delta`: an add's), else why not (sent to the writer and
  // logged).
  virtual std::string refusal(const Role& role, Op op, const std::string& key, int64_t delta) const = 0;
  // The counter an unregistered worker connection adds 1 to in order to
  // register: it is worker (the new value - 1) from then on, and its
  // further connections prove that id's key (workerKey). "": no
  // registration.
  virtual std::string registrationKey() const { return ""; }
  // Whether a write of `key` counts in StoreServer::writes() (what the
  // manager sleeps on): false for keys it reads on a clock of its own.
  virtual bool wakes(const std::string& /*key*/) const { return true; }
};

// Every authenticated connection writes every key.
class OpenPolicy : public KeyPolicy {
 public:
  std::string refusal(const Role&, Op, const std::string&, int64_t) const override { return ""; }
};

}  // namespace store
}  // namespace morph
