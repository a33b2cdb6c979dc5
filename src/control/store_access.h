// The job's store as the control plane reaches it: values read and written
// as text (whole numbers parsed strictly, line lists), and the connection
// to a manager (HOST:PORT, the job token, connectToManager). Keys:
// control/protocol/keys.h; the wire protocol: src/store
// (docs/store_protocol.md).
#pragma once

#include <csignal>
#include <cstdint>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

#include "store/client.h"

namespace morph {
namespace detail {

std::string getString(c10d::Store& s, const std::string& key);
// A whole number read from the store, parsed strictly: the value must be
// an optional '-' and digits only, in int64 range ("12abc", "", " 1" are
// refused). JobError naming the key and the value.
int64_t getInt(c10d::Store& s, const std::string& key);
int64_t parseStoreInt(const std::string& key, const std::string& value);
void setString(c10d::Store& s, const std::string& key, const std::string& value);
std::string joinLines(const std::vector<std::string>& v);
std::vector<std::string> splitLines(const std::string& s);
// "HOST:PORT" -> (host, port); throws InputError naming `flag`.
std::pair<std::string, int> parseHostPort(const std::string& s, const std::string& flag);
// The job token (docs/store_protocol.md): the first line of `token_file`
// when given, else $MORPH_TOKEN; InputError saying which is missing or empty.
std::string readToken(const std::string& token_file);
// Writes a fresh random token to `path` (mode 0600) and returns it.
std::string createTokenFile(const std::string& path);
// A store client of the manager at `join` (HOST:PORT) proving `token` for
// `role` ("worker", "worker/<id>", "client"); InputError naming the address
// when it cannot be reached within timeout_s or rejects the token.
c10::intrusive_ptr<StoreClient> connectToManager(const std::string& join, const std::string& token,
                                                 const std::string& role, double timeout_s);
// What a local worker receives when its manager dies (prctl
// PR_SET_PDEATHSIG): it then exits naming the resume command (worker/liveness.cpp).
constexpr int kManagerDeathSignal = SIGUSR2;

}  // namespace detail
}  // namespace morph
