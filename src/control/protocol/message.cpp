#include "control/protocol/message.h"

namespace morph {
namespace message {

const json& object(const json& j, const std::string& what) {
  if (!j.is_object()) throw MessageError(what + ": expected a JSON object");
  return j;
}

namespace {
const json& field(const json& j, const char* key, const std::string& what) {
  const auto it = object(j, what).find(key);
  if (it == j.end()) throw MessageError(what + ": missing '" + key + "'");
  return *it;
}
}  // namespace

int64_t integerValue(const json& v, const std::string& where, int64_t lo, int64_t hi) {
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) throw MessageError(where + ": " + v.dump() + " is out of range");
    x = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
  } else {
    throw MessageError(where + ": expected a whole number, not " + v.dump().substr(0, 40));
  }
  if (x < lo || x > hi)
    throw MessageError(where + ": " + std::to_string(x) + " is outside [" + std::to_string(lo) + ", " +
                       std::to_string(hi) + "]");
  return x;
}

int64_t integer(const json& j, const char* key, const std::string& what, int64_t lo, int64_t hi) {
  return integerValue(field(j, key, what), what + " '" + key + "'", lo, hi);
}

double number(const json& j, const char* key, const std::string& what) {
  const json& v = field(j, key, what);
  if (!v.is_number()) throw MessageError(what + ": '" + key + "' is not a number");
  return v.get<double>();
}

bool boolean(const json& j, const char* key, const std::string& what) {
  const json& v = field(j, key, what);
  if (!v.is_boolean()) throw MessageError(what + ": '" + key + "' is not true or false");
  return v.get<bool>();
}

std::string text(const json& j, const char* key, const std::string& what) {
  const json& v = field(j, key, what);
  if (!v.is_string()) throw MessageError(what + ": '" + key + "' is not a string");
  return v.get<std::string>();
}

std::vector<int64_t> integers(const json& j, const char* key, const std::string& what, int64_t lo, int64_t hi) {
  const json& v = field(j, key, what);
  if (!v.is_array()) throw MessageError(what + ": '" + key + "' is not a list");
  std::vector<int64_t> out;
  for (const json& x : v) out.push_back(integerValue(x, what + " '" + key + "'", lo, hi));
  return out;
}

}  // namespace message
}  // namespace morph
