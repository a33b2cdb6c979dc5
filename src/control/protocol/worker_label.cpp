#include "control/protocol/worker_label.h"

#include <cctype>

#include "control/protocol/message.h"

namespace morph {

namespace {
constexpr size_t kMaxLabel = 64;
}  // namespace

std::string WorkerLabel::problem(const std::string& text) {
  if (text.empty() || text.size() > kMaxLabel)
    return "expected 1 to " + std::to_string(kMaxLabel) + " characters, not " + std::to_string(text.size());
  for (const char c : text)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-')
      return "expected letters, digits, '.', '_' or '-' only (a Slurm node name fits)";
  return "";
}

WorkerLabel WorkerLabel::decode(const std::string& value) {
  const std::string why = problem(value);
  if (!why.empty()) throw MessageError("workers/<id>/label '" + value.substr(0, 40) + "': " + why);
  return WorkerLabel{value};
}

}  // namespace morph
