// GenerationWant: what every member reads under gen/want before each step
// (docs/distributed.md, "Store keys"): the generation the manager wants (a
// member of an older one regroups after the current step) and the `morph
// slow` factors in effect, by worker id. So a slowdown rides on the read a
// member makes anyway: no connection, thread or poll of its own, and a job
// never slowed reads the bare number it always did. One encoder (the
// manager) and one decoder (the worker). Plain data.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace morph {

struct GenerationWant {
  int64_t generation = 0;
  // `morph slow` factors (1 < F <= 1000) by worker id; absent: 1.
  std::map<int64_t, double> slowdown;

  double slowdownOf(int64_t id) const;
  // "G" when no worker is slowed, else the JSON object
  // {"generation": G, "slowdown": {"<id>": F, ...}}.
  std::string encode() const;
  // MessageError (control/protocol/message.h) for anything encode could not
  // have written.
  static GenerationWant decode(const std::string& value);
};

}  // namespace morph
