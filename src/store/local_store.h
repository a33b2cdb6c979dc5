// LocalStore: a c10d::Store over a Table in this process, with no socket
// and no role (every key may be written): the manager's own view of the
// store it hosts (StoreServer::table(): it reads the store many times a
// second without waking a server thread), and the in-memory store of unit
// tests. A failed request (a get or wait that timed out) throws StoreError.
// "*table" must outlive the store.
#pragma once

#include <chrono>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "store/table.h"

namespace morph {
namespace store {

class LocalStore : public c10d::Store {
 public:
  explicit LocalStore(Table& table, std::chrono::milliseconds timeout = kDefaultTimeout)
      : c10d::Store(timeout), table_(table) {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  Table& table() { return table_; }

 private:
  Reply call(const Request& r);
  Table& table_;
};

}  // namespace store
}  // namespace morph
