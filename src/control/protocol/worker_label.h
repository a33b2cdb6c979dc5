// WorkerLabel: what a worker started with `morph worker --label TEXT` posts
// under workers/<id>/label before it announces its pid (docs/distributed.md,
// "Store keys"), so that whoever started it learns which id it took: the
// cluster scheduler under Slurm labels each worker step with its node and
// reads the labels back from `morph status` (docs/cluster.md). The text is
// the label as given: 1 to 64 letters, digits, '.', '_' or '-' (a Slurm
// node name fits). One encoder (the worker) and one decoder (the manager).
// Plain data.
#pragma once

#include <string>

namespace morph {

struct WorkerLabel {
  std::string text;

  // Why `text` is no label ("" when it is one): for `--label`'s exit 2 and
  // the decoder's MessageError alike.
  static std::string problem(const std::string& text);
  std::string encode() const { return text; }
  // MessageError (control/protocol/message.h) for anything encode could not
  // have written.
  static WorkerLabel decode(const std::string& value);
};

}  // namespace morph
