// What the store's client and the in-process stores throw (morph
// namespace: the control plane and the tests catch them by these names).
#pragma once

#include <stdexcept>
#include <string>

namespace morph {

// Nothing answered at HOST:PORT within the connect timeout.
class StoreUnreachable : public std::runtime_error {
 public:
  explicit StoreUnreachable(const std::string& what) : std::runtime_error(what) {}
};
// The server rejected the token (or the server failed to prove it holds it).
class StoreAuthError : public std::runtime_error {
 public:
  explicit StoreAuthError(const std::string& what) : std::runtime_error(what) {}
};
// A request failed: refused write, timeout, lost connection.
class StoreError : public std::runtime_error {
 public:
  explicit StoreError(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace morph
