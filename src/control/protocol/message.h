// What the typed messages between the manager and its workers share
// (generation_plan.h, member_report.h): the error a decoder throws and the
// checked readers of JSON fields they are written with. A decoder takes
// untrusted JSON: it checks every field's presence, type and range and
// throws MessageError naming the message and the field, never anything
// else. docs/distributed.md, "Store keys", gives each message's fields.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"

namespace morph {

// A message that does not decode (JobError: a worker or manager that reads
// one cannot go on with the job; exit 3 with this text).
class MessageError : public JobError {
 public:
  explicit MessageError(const std::string& what) : JobError(what) {}
};

namespace message {

using json = nlohmann::json;

// The object `j`, or MessageError("<what>: expected a JSON object").
const json& object(const json& j, const std::string& what);
// Field `key` of object `j` (MessageError "<what>: missing '<key>'" or of
// the wrong type). Integers must be whole JSON numbers within [lo, hi].
int64_t integer(const json& j, const char* key, const std::string& what, int64_t lo = INT64_MIN,
                int64_t hi = INT64_MAX);
double number(const json& j, const char* key, const std::string& what);
bool boolean(const json& j, const char* key, const std::string& what);
std::string text(const json& j, const char* key, const std::string& what);
std::vector<int64_t> integers(const json& j, const char* key, const std::string& what, int64_t lo = INT64_MIN,
                              int64_t hi = INT64_MAX);
// A JSON value as a whole number within [lo, hi] (`where` names it).
int64_t integerValue(const json& v, const std::string& where, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX);

}  // namespace message
}  // namespace morph
