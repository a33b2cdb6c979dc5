// The job's key policy: which keys of the control-plane store (keys.h) each
// role may write (docs/store_protocol.md, "Roles"). The manager writes
// every key; a client (`morph resize`, `morph slow`) only its requests; a
// worker registers, then writes only its own keys, its reports of each
// generation, Gloo's rendezvous keys of its groups, and the keys members
// share (metrics lines, the events counter, the job's first and last
// step). The store server asks it about every write and enforces it.
#pragma once

#include <string>

#include "store/key_policy.h"

namespace morph {

class JobKeyPolicy : public store::KeyPolicy {
 public:
  std::string refusal(const store::Role& role, store::Op op, const std::string& key, int64_t delta) const override;
  // workers/next_id.
  std::string registrationKey() const override;
  // Heartbeats (workers/<id>/hb) do not wake the manager: it reads them on
  // its own clock.
  bool wakes(const std::string& key) const override;
};

}  // namespace morph
