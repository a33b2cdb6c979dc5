// StoreConnection (connection.h).
#include "store/connection.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

namespace morph {

using namespace store;

namespace {

// A connected socket to host:port, or -1 (errno-style reason in `why`).
int dial(const std::string& host, int port, std::string& why) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0 || !res) {
    why = std::string("cannot resolve '") + host + "': " + gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (addrinfo* a = res; a; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
    why = std::strerror(errno);
    ::close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd >= 0) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return fd;
}

// How long a reply may take beyond the server's own wait.
constexpr std::chrono::milliseconds kReplyMargin{30000};
// Until connect_timeout, a refused or unreachable dial is retried this often.
constexpr auto kDialRetry = std::chrono::milliseconds(50);
// The handshake's frames get at least this long (a loaded server answers late).
constexpr int64_t kHandshakeFloorMs = 5000;
// The reply to a request the server holds up to `wait` (0: for ever).
int64_t waitingReplyTimeout(std::chrono::milliseconds wait) {
  return wait.count() == 0 ? 0 : (wait + kReplyMargin).count();
}

}  // namespace

StoreConnection::StoreConnection(const std::string& host, int port, const std::string& key, const std::string& role,
                                 std::chrono::milliseconds connect_timeout)
    : where_(host + ":" + std::to_string(port)) {
  const auto deadline = std::chrono::steady_clock::now() + connect_timeout;
  std::string why;
  while ((fd_ = dial(host, port, why)) < 0) {
    if (std::chrono::steady_clock::now() >= deadline) throw StoreUnreachable(where_ + ": " + why);
    std::this_thread::sleep_for(kDialRetry);
  }
  try {
    std::vector<uint8_t> buf;
    const int64_t hs_ms = std::max<int64_t>(connect_timeout.count(), kHandshakeFloorMs);
    if (!readFrame(fd_, kMaxHandshakeFrame, buf, hs_ms)) throw ProtocolError("the server closed the connection");
    const Hello hello = decodeHello(buf.data(), buf.size());
    Auth auth;
    auth.role = role;
    auth.nonce = nonce_ = randomNonce();
    auth.mac = clientProof(key, hello.nonce, role);
    writeFrame(fd_, encodeAuth(auth));
    if (!readFrame(fd_, kMaxHandshakeFrame, buf, hs_ms)) throw ProtocolError("the server closed the connection");
    const Verdict v = decodeVerdict(buf.data(), buf.size());
    if (v.status != Status::kOk) throw StoreAuthError(where_ + ": " + v.message);
    if (!macEqual(v.mac, serverProof(key, auth.nonce, role)))
      throw StoreAuthError(where_ + " could not prove that it holds the token: not this job's manager");
  } catch (const StoreAuthError&) {
    ::close(fd_);
    throw;
  } catch (const std::exception& e) {
    ::close(fd_);
    throw StoreUnreachable(where_ + ": handshake failed: " + e.what());
  }
}

StoreConnection::~StoreConnection() {
  if (fd_ >= 0) ::close(fd_);
}

Reply StoreConnection::call(const Request& r, int64_t reply_timeout_ms) {
  std::lock_guard<std::mutex> l(mu_);
  if (broken_) throw StoreError("the connection to the store at " + where_ + " was lost");
  std::vector<uint8_t> buf;
  Reply rep;
  try {
    writeFrame(fd_, encodeRequest(r));
    if (!readFrame(fd_, kMaxFrame, buf, reply_timeout_ms)) throw ProtocolError("the store closed the connection");
    rep = decodeReply(r.op, buf.data(), buf.size());
  } catch (const std::exception& e) {
    // A reply may still be in flight: this connection is out of step for good.
    broken_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    throw StoreError("the store at " + where_ + ": " + e.what());
  }
  if (rep.status != Status::kOk) throw StoreError(rep.message);
  return rep;
}

void StoreConnection::set(const std::string& key, const std::vector<uint8_t>& value) {
  Request r;
  r.op = Op::kSet;
  r.keys = {key};
  r.value = value;
  call(r, kReplyMargin.count());
}

std::vector<uint8_t> StoreConnection::compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                                 const std::vector<uint8_t>& desired) {
  Request r;
  r.op = Op::kCompareSet;
  r.keys = {key};
  r.value = expected;
  r.value2 = desired;
  return call(r, kReplyMargin.count()).value;
}

std::vector<uint8_t> StoreConnection::get(const std::string& key, std::chrono::milliseconds wait) {
  Request r;
  r.op = Op::kGet;
  r.keys = {key};
  r.timeout_ms = static_cast<uint64_t>(wait.count());
  return call(r, waitingReplyTimeout(wait)).value;
}

int64_t StoreConnection::add(const std::string& key, int64_t value) {
  Request r;
  r.op = Op::kAdd;
  r.keys = {key};
  r.delta = value;
  return call(r, kReplyMargin.count()).number;
}

bool StoreConnection::deleteKey(const std::string& key) {
  Request r;
  r.op = Op::kDelete;
  r.keys = {key};
  return call(r, kReplyMargin.count()).number != 0;
}

bool StoreConnection::check(const std::vector<std::string>& keys) {
  Request r;
  r.op = Op::kCheck;
  r.keys = keys;
  return call(r, kReplyMargin.count()).number != 0;
}

int64_t StoreConnection::numKeys() {
  Request r;
  r.op = Op::kNumKeys;
  return call(r, kReplyMargin.count()).number;
}

void StoreConnection::wait(const std::vector<std::string>& keys, std::chrono::milliseconds wait) {
  Request r;
  r.op = Op::kWait;
  r.keys = keys;
  r.timeout_ms = static_cast<uint64_t>(wait.count());
  call(r, waitingReplyTimeout(wait));
}

}  // namespace morph
