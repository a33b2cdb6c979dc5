// AbortableStore: a c10d::Store whose waits (wait, and get, which waits for
// its key) also end once an abort key appears. A generation's process
// groups meet through one (Gloo's rendezvous waits for every member's
// address): a member that died before publishing its address would
// otherwise hold the others for the store's whole timeout. Waits poll the
// inner store every `poll` (a check of the keys and of the abort key);
// every other call goes straight to it.
#pragma once

#include <chrono>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

namespace morph {
namespace store {

class AbortableStore : public c10d::Store {
 public:
  AbortableStore(c10::intrusive_ptr<c10d::Store> inner, std::string abort_key, std::chrono::milliseconds poll);

  void set(const std::string& key, const std::vector<uint8_t>& value) override { inner_->set(key, value); }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    return inner_->compareSet(key, expected, desired);
  }
  // StoreError when the abort key appears, or the key does not within the
  // store's timeout.
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override { return inner_->add(key, value); }
  bool deleteKey(const std::string& key) override { return inner_->deleteKey(key); }
  bool check(const std::vector<std::string>& keys) override { return inner_->check(keys); }
  int64_t getNumKeys() override { return inner_->getNumKeys(); }
  void wait(const std::vector<std::string>& keys) override { waitFor(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    waitFor(keys, timeout);
  }

 private:
  void waitFor(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  c10::intrusive_ptr<c10d::Store> inner_;
  std::string abort_;
  std::chrono::milliseconds poll_;
};

}  // namespace store
}  // namespace morph
