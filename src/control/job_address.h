// The job's address and token, and store values as text, in plain C++ with
// no libtorch (the client commands run without it): HOST:PORT, the job
// token (docs/store_protocol.md), line lists, whole numbers parsed
// strictly, and a StoreConnection to a manager. store_access.h adds the
// same over a c10d::Store.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "store/connection.h"

namespace morph {
namespace detail {

// A whole number read from the store, parsed strictly: the value must be
// an optional '-' and digits only, in int64 range ("12abc", "", " 1" are
// refused). JobError naming the key and the value.
int64_t parseStoreInt(const std::string& key, const std::string& value);
std::string joinLines(const std::vector<std::string>& v);
std::vector<std::string> splitLines(const std::string& s);
// A store value as text.
std::string text(const std::vector<uint8_t>& bytes);
// "HOST:PORT" -> (host, port); throws InputError naming `flag`.
std::pair<std::string, int> parseHostPort(const std::string& s, const std::string& flag);
// The job token (docs/store_protocol.md): the first line of `token_file`
// when given, else $MORPH_TOKEN; InputError saying which is missing or empty.
std::string readToken(const std::string& token_file);
// Writes a fresh random token to `path` (mode 0600) and returns it.
std::string createTokenFile(const std::string& path);
// A connection to the store of the manager at `join` (HOST:PORT) proving
// `token` for `role` ("worker", "worker/<id>", "client"); InputError naming
// the address when it cannot be reached within timeout_s or rejects the
// token.
std::unique_ptr<StoreConnection> dialManager(const std::string& join, const std::string& token,
                                             const std::string& role, double timeout_s);

}  // namespace detail
}  // namespace morph
