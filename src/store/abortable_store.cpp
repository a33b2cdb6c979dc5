#include "store/abortable_store.h"

#include <thread>

#include "store/errors.h"

namespace morph {
namespace store {

AbortableStore::AbortableStore(c10::intrusive_ptr<c10d::Store> inner, std::string abort_key,
                               std::chrono::milliseconds poll)
    : c10d::Store(inner->getTimeout()), inner_(std::move(inner)), abort_(std::move(abort_key)), poll_(poll) {}

std::vector<uint8_t> AbortableStore::get(const std::string& key) {
  waitFor({key}, timeout_);
  return inner_->get(key);
}

void AbortableStore::waitFor(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!inner_->check(keys)) {
    if (inner_->check({abort_})) throw StoreError("the wait was aborted (" + abort_ + " is set)");
    if (timeout.count() > 0 && std::chrono::steady_clock::now() > deadline)
      throw StoreError("the keys waited for did not appear within " + std::to_string(timeout.count() / 1000) + " s");
    std::this_thread::sleep_for(poll_);
  }
}

}  // namespace store
}  // namespace morph
