// ResizeRequest: what `morph resize` writes under ctl/resize_target
// (docs/distributed.md, "Store keys"): the worker count the job should run
// on and, optionally, the workers to release first when it shrinks (by
// worker id: the cluster scheduler names a slow slot's worker, so that a
// move between slot types keeps the fast one; docs/cluster.md). A request
// that names none is the bare number it always was. One encoder (the
// client) and one decoder (the manager). Plain data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace morph {

struct ResizeRequest {
  int workers = 1;                // >= 1
  std::vector<int64_t> release;   // worker ids released before any other, distinct, ascending

  // "K" when no worker is named, else {"workers": K, "release": [ids]}.
  std::string encode() const;
  // MessageError (control/protocol/message.h) for anything encode could not
  // have written.
  static ResizeRequest decode(const std::string& value);
};

}  // namespace morph
