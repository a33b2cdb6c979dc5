#include "control/protocol/generation_want.h"

#include <cmath>

#include "control/protocol/message.h"

namespace morph {

using json = nlohmann::json;
using namespace message;

namespace {
const char* const kWant = "gen/want";
}  // namespace

double GenerationWant::slowdownOf(int64_t id) const {
  const auto it = slowdown.find(id);
  return it == slowdown.end() ? 1.0 : it->second;
}

std::string GenerationWant::encode() const {
  if (slowdown.empty()) return std::to_string(generation);
  json s = json::object();
  for (const auto& [id, f] : slowdown) s[std::to_string(id)] = f;
  return json({{"generation", generation}, {"slowdown", s}}).dump();
}

GenerationWant GenerationWant::decode(const std::string& value) {
  GenerationWant w;
  // The bare number, as every job that was never slowed reads it each step.
  if (!value.empty() && value.size() <= 18 && value.find_first_not_of("0123456789") == std::string::npos) {
    w.generation = std::stoll(value);
    return w;
  }
  const json j = json::parse(value, nullptr, false);
  if (!j.is_object()) throw MessageError(std::string(kWant) + ": expected a generation number or a JSON object, not '" +
                                         value.substr(0, 40) + "'");
  w.generation = integer(j, "generation", kWant, 0);
  if (!j.contains("slowdown")) throw MessageError(std::string(kWant) + ": missing 'slowdown'");
  for (const auto& [k, v] : object(j.at("slowdown"), std::string(kWant) + " 'slowdown'").items()) {
    const int64_t id = integerValue(json::parse(k, nullptr, false), std::string(kWant) + " 'slowdown' id", 0);
    if (std::to_string(id) != k) throw MessageError(std::string(kWant) + " 'slowdown': '" + k + "' is not a worker id");
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 1.0 || v.get<double>() > 1000.0)
      throw MessageError(std::string(kWant) + " 'slowdown' of worker " + k + ": expected 1 to 1000, not " +
                         v.dump().substr(0, 40));
    w.slowdown[id] = v.get<double>();
  }
  return w;
}

}  // namespace morph
