#include "store/local_store.h"

#include "store/errors.h"

namespace morph {
namespace store {

namespace {
Request request(Op op, std::vector<std::string> keys) {
  Request r;
  r.op = op;
  r.keys = std::move(keys);
  return r;
}
}  // namespace

Reply LocalStore::call(const Request& r) {
  Reply rep = table_.apply(r);
  if (rep.status != Status::kOk) throw StoreError(rep.message);
  return rep;
}

void LocalStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  Request r = request(Op::kSet, {key});
  r.value = value;
  call(r);
}

std::vector<uint8_t> LocalStore::compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                            const std::vector<uint8_t>& desired) {
  Request r = request(Op::kCompareSet, {key});
  r.value = expected;
  r.value2 = desired;
  return call(r).value;
}

std::vector<uint8_t> LocalStore::get(const std::string& key) {
  Request r = request(Op::kGet, {key});
  r.timeout_ms = static_cast<uint64_t>(timeout_.count());
  return call(r).value;
}

int64_t LocalStore::add(const std::string& key, int64_t value) {
  Request r = request(Op::kAdd, {key});
  r.delta = value;
  return call(r).number;
}

bool LocalStore::deleteKey(const std::string& key) { return call(request(Op::kDelete, {key})).number != 0; }

bool LocalStore::check(const std::vector<std::string>& keys) { return call(request(Op::kCheck, keys)).number != 0; }

int64_t LocalStore::getNumKeys() { return call(request(Op::kNumKeys, {})).number; }

void LocalStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void LocalStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  Request r = request(Op::kWait, keys);
  r.timeout_ms = static_cast<uint64_t>(timeout.count());
  call(r);
}

}  // namespace store
}  // namespace morph
