#pragma once
// Module paths as TorchScript and state_dict() spell them ("layer1.0.conv1").

#include <string>
#include <vector>

namespace morph {

// "a.b.c" -> {"a", "b", "c"}; "" -> {""}.
inline std::vector<std::string> splitModulePath(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t dot = s.find('.', start);
    out.push_back(s.substr(start, dot - start));
    if (dot == std::string::npos) return out;
    start = dot + 1;
  }
}

}  // namespace morph
