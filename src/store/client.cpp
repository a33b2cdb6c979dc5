// StoreClient (client.h): c10d::Store's calls on a StoreConnection.
#include "store/client.h"

namespace morph {

StoreClient::StoreClient(const std::string& host, int port, const std::string& key, const std::string& role,
                         std::chrono::milliseconds connect_timeout)
    : conn_(std::make_unique<StoreConnection>(host, port, key, role, connect_timeout)) {}

StoreClient::StoreClient(std::unique_ptr<StoreConnection> connection) : conn_(std::move(connection)) {}

void StoreClient::set(const std::string& key, const std::vector<uint8_t>& value) { conn_->set(key, value); }

std::vector<uint8_t> StoreClient::compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                             const std::vector<uint8_t>& desired) {
  return conn_->compareSet(key, expected, desired);
}

std::vector<uint8_t> StoreClient::get(const std::string& key) { return conn_->get(key, timeout_); }

int64_t StoreClient::add(const std::string& key, int64_t value) { return conn_->add(key, value); }

bool StoreClient::deleteKey(const std::string& key) { return conn_->deleteKey(key); }

bool StoreClient::check(const std::vector<std::string>& keys) { return conn_->check(keys); }

int64_t StoreClient::getNumKeys() { return conn_->numKeys(); }

void StoreClient::wait(const std::vector<std::string>& keys) { conn_->wait(keys, timeout_); }

void StoreClient::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  conn_->wait(keys, timeout);
}

}  // namespace morph
