// The job's store as the control plane reaches it, through c10d::Store:
// values read and written as text (whole numbers parsed strictly), and the
// connection to a manager (connectToManager); the libtorch-free half (HOST:PORT,
// the job token, line lists) is job_address.h. Keys:
// control/protocol/keys.h; the wire protocol: src/store
// (docs/store_protocol.md).
#pragma once

#include <csignal>
#include <cstdint>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

#include "control/job_address.h"
#include "store/client.h"

namespace morph {
namespace detail {

std::string getString(c10d::Store& s, const std::string& key);
// A whole number read from the store, parsed strictly (parseStoreInt).
int64_t getInt(c10d::Store& s, const std::string& key);
void setString(c10d::Store& s, const std::string& key, const std::string& value);
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
