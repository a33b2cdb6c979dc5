#pragma once
// A tensor's shape as Python prints a tuple, for messages: "(2, 512, 7, 7)",
// "(5,)", "()".

#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>

namespace morph {

inline std::string shapeText(c10::IntArrayRef sizes) {
  std::string s;
  for (int64_t v : sizes) s += (s.empty() ? "" : ", ") + std::to_string(v);
  return "(" + s + (sizes.size() == 1 ? ",)" : ")");
}

}  // namespace morph
